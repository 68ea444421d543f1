// Times the MX CUDA kernels' variants against a device-to-device copy measured in the same
// run, checks each variant's bytes against the pre-change kernels (tests/reference_kernels.cuh,
// verified equal to the CPU kernels on an H100) on the same data, and proves the hardware
// FP8 conversion that Enc::kCvt uses equal to codec.h on every f32 bit pattern. Needs no
// JAX (the kernels are compiled without the FFI handlers):
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMXJAX_CUDA_KERNELS_ONLY \
//     -Iffi -Iffi/include ffi/cuda/tests/bench_kernels.cu -o /tmp/bench_kernels
//   /tmp/bench_kernels [M K [reps]]      (default 32768 16384 20: a 1 GiB bf16 input)
//
// Prints one table: op, format, variant, ms (median), GB/s (bytes read + written / time),
// fraction of the copy's GB/s, and "ok" / "DIFF n" (bytes that differ from the reference).
// Block 32, RCEIL, bf16 input (and output) unless the op says otherwise.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/dequantize_kernels.cuh"
#include "cuda/fake_quantize_kernels.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/tests/reference_kernels.cuh"

namespace mxjax::cuda {
namespace {

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                   \
                   cudaGetErrorString(err_));                                             \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

int reps = 20;
double copy_gbs = 0;
int bad_rows = 0;

// Median ms of `reps` runs of fn (after 3 warm-ups), each timed with events.
double time_ms(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  CHECK(cudaGetLastError());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a));
    fn();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

__global__ void count_diff_kernel(const uint8_t* a, const uint8_t* b, int64_t n,
                                  unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    local += a[i] != b[i];
  }
  if (local) atomicAdd(count, local);
}

// Bytes of a and b (device) that differ.
unsigned long long count_diff(const void* a, const void* b, int64_t n) {
  unsigned long long* d;
  CHECK(cudaMalloc(&d, sizeof(*d)));
  CHECK(cudaMemset(d, 0, sizeof(*d)));
  count_diff_kernel<<<grid_for(n), kThreads>>>(static_cast<const uint8_t*>(a),
                                               static_cast<const uint8_t*>(b), n, d);
  unsigned long long h;
  CHECK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  return h;
}

void row(const char* op, const char* fmt, const std::string& variant, double ms, double bytes,
         long long diff) {
  const double gbs = bytes / ms / 1e6;
  if (diff > 0) ++bad_rows;  // -1: a reference row
  std::printf("%-22s %-5s %-26s %8.3f %8.0f %6.2f  %s\n", op, fmt, variant.c_str(), ms, gbs,
              gbs / copy_gbs, diff == 0 ? "ok" : diff < 0 ? "ref" : ("DIFF " + std::to_string(diff)).c_str());
  std::fflush(stdout);
}

// Random non-zero bf16 / f32 values: random signs and mantissas, exponents spread over
// 2^-20 .. 2^20 (so blocks have varied scales and some element subnormals).
__global__ void fill_kernel(uint16_t* bf16, float* f32, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    const uint32_t block_exp = (uint32_t(i / 32) * 0x9E3779B1u >> 27);  // per block: 0..31
    const uint32_t exp = 127 - 20 + block_exp + (h >> 28) % 8 - 4;
    const uint32_t bits = (h & 0x80000000u) | (exp << 23) | (h & 0x7FFFFFu);
    if (bf16) bf16[i] = uint16_t(bits >> 16) | ((bits >> 16) & 0x7F ? 0 : 1);
    if (f32) f32[i] = __uint_as_float(bits | 1);
  }
}

// Every finite f32 bit pattern: Enc::kCvt's code (the cvt instruction) == codec.h's.
template <class F>
__global__ void prove_cvt_kernel(unsigned long long* bad, uint32_t* first) {
  const BlockScale one{127, 1.0f, 1.0f, ~0u};
  unsigned long long local = 0;
  for (uint64_t u = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < (1ull << 32);
       u += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t x = uint32_t(u);
    if ((x & kF32Abs) >= kF32Inf) continue;
    const uint32_t hw = encode2<F, Enc::kCvt>(x, x, one, one) & 0xFFu;
    const uint32_t sw = encode_magnitude<F>(x & kF32Abs) | ((x >> 31) << 7);
    if (hw != sw) {
      ++local;
      atomicMin(first, x);
    }
  }
  if (local) atomicAdd(bad, local);
}

template <class F>
void prove_cvt(const char* name) {
  unsigned long long* bad;
  uint32_t* first;
  CHECK(cudaMalloc(&bad, 8));
  CHECK(cudaMalloc(&first, 4));
  CHECK(cudaMemset(bad, 0, 8));
  CHECK(cudaMemset(first, 0xFF, 4));
  prove_cvt_kernel<F><<<sm_count() * 8, kThreads>>>(bad, first);
  unsigned long long h;
  uint32_t f;
  CHECK(cudaMemcpy(&h, bad, 8, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&f, first, 4, cudaMemcpyDeviceToHost));
  std::printf("proof: cvt.rn.satfinite.%sx2.f32 == codec.h encode on all finite f32: %s",
              name, h == 0 ? "yes\n" : "NO, ");
  if (h) std::printf("%llu differ, first 0x%08x\n", h, f);
  if (h) ++bad_rows;
  CHECK(cudaFree(bad));
  CHECK(cudaFree(first));
}

struct Buffers {
  int64_t m, k;
  uint16_t* x;   // [m, k] bf16
  float* xf;     // [m, k] f32
  uint8_t *d1, *s1, *d2, *s2, *d3, *s3, *d4, *s4;  // data / scales (ref, test, 2x col ...)
  uint16_t *o1, *o2;  // bf16 outputs (ref, test)
};

template <class T>
T* dev(int64_t bytes) {
  void* p;
  CHECK(cudaMalloc(&p, size_t(bytes)));
  CHECK(cudaMemset(p, 0, size_t(bytes)));
  return static_cast<T*>(p);
}

// ---- quantize (rows: axis -1; cols: axis 0), dequantize, fake_quantize, quantize_2x ----

template <class F>
void bench_format(const Buffers& b, const char* fmt) {
  constexpr int B = 32;
  const int64_t m = b.m, k = b.k, n_el = m * k;
  const int64_t data_bytes = n_el * F::bits / 8, scale_bytes = n_el / B;
  const double q_bytes = 2.0 * n_el + data_bytes + scale_bytes;  // read bf16, write data+scales
  const cudaStream_t st = 0;
  auto qdiff = [&](uint8_t* d, uint8_t* s, uint8_t* rd, uint8_t* rs) {
    return (long long)(count_diff(d, rd, data_bytes) + count_diff(s, rs, scale_bytes));
  };
  auto clear = [&](uint8_t* d, uint8_t* s) {
    CHECK(cudaMemset(d, 0xAB, data_bytes));
    CHECK(cudaMemset(s, 0xAB, scale_bytes));
  };
  using In = BF16;
  // Rows.
  {
    const QuantizeArgs<In> a{b.x, m, k, 1, kRceil, b.d2, b.s2};
    auto ref = [&] { ref::launch_quantize<F, In>(b.x, m, k, 1, B, kRceil, b.d1, b.s1, st); };
    row("quantize rows", fmt, "before (ref)", time_ms(ref), q_bytes, -1);
    auto v = [&](const char* name, auto launch) {
      clear(b.d2, b.s2);
      const double ms = time_ms([&] { launch(a); });
      row("quantize rows", fmt, name, ms, q_bytes, qdiff(b.d2, b.s2, b.d1, b.s1));
    };
    v("default", [&](auto& a) { launch_quantize<F, In>(a, B, st); });
    v("L=1 codec", [&](auto& a) { launch_quantize<F, In, 1, 256, Enc::kCodec>(a, B, st); });
    v("L=2 codec", [&](auto& a) { launch_quantize<F, In, 2, 256, Enc::kCodec>(a, B, st); });
    v("L=4 codec", [&](auto& a) { launch_quantize<F, In, 4, 256, Enc::kCodec>(a, B, st); });
    if constexpr (F::bits == 8) {
      v("L=1 cvt", [&](auto& a) { launch_quantize<F, In, 1, 256, Enc::kCvt>(a, B, st); });
      v("L=4 cvt", [&](auto& a) { launch_quantize<F, In, 4, 256, Enc::kCvt>(a, B, st); });
    }
  }
  // Columns (axis 0: outer 1, n = m, inner = k).
  {
    const QuantizeArgs<In> a{b.x, 1, m, k, kRceil, b.d2, b.s2};
    auto ref = [&] { ref::launch_quantize<F, In>(b.x, 1, m, k, B, kRceil, b.d1, b.s1, st); };
    row("quantize cols", fmt, "before (ref)", time_ms(ref), q_bytes, -1);
    auto v = [&](const char* name, auto launch) {
      clear(b.d2, b.s2);
      const double ms = time_ms([&] { launch(a); });
      row("quantize cols", fmt, name, ms, q_bytes, qdiff(b.d2, b.s2, b.d1, b.s1));
    };
    v("default", [&](auto& a) { launch_quantize<F, In>(a, B, st); });
    v("tile 128B codec", [&](auto& a) { launch_quantize<F, In, 1, 128, Enc::kCodec>(a, B, st); });
    v("tile 256B codec", [&](auto& a) { launch_quantize<F, In, 1, 256, Enc::kCodec>(a, B, st); });
    v("tile 512B codec", [&](auto& a) { launch_quantize<F, In, 1, 512, Enc::kCodec>(a, B, st); });
    if constexpr (F::bits == 8) {
      v("tile 256B cvt", [&](auto& a) { launch_quantize<F, In, 1, 256, Enc::kCvt>(a, B, st); });
    }
  }
  // quantize_2x: reference = the pre-change rows and cols kernels.
  {
    ref::launch_quantize<F, In>(b.x, m, k, 1, B, kRceil, b.d1, b.s1, st);
    ref::launch_quantize<F, In>(b.x, 1, m, k, B, kRceil, b.d3, b.s3, st);
    const double bytes2 = 2.0 * n_el + 2.0 * (data_bytes + scale_bytes);
    auto v = [&](const char* name, auto launch) {
      clear(b.d2, b.s2);
      clear(b.d4, b.s4);
      const double ms = time_ms(launch);
      row("quantize_2x", fmt, name, ms, bytes2,
          qdiff(b.d2, b.s2, b.d1, b.s1) + qdiff(b.d4, b.s4, b.d3, b.s3));
    };
    v("rows + cols kernels (default)", [&] {
      launch_quantize<F, In>(QuantizeArgs<In>{b.x, m, k, 1, kRceil, b.d2, b.s2}, B, st);
      launch_quantize<F, In>(QuantizeArgs<In>{b.x, 1, m, k, kRceil, b.d4, b.s4}, B, st);
    });
  }
  // dequantize to bf16 (of the reference rows / cols codes in d1 / d3).
  {
    const double dbytes = data_bytes + scale_bytes + 2.0 * n_el;
    auto vd = [&](const char* op, const char* name, auto launch) {
      CHECK(cudaMemset(b.o2, 0xAB, 2 * n_el));
      const double ms = time_ms(launch);
      row(op, fmt, name, ms, dbytes, count_diff(b.o2, b.o1, 2 * n_el));
    };
    const DequantizeArgs<F, BF16> rr{b.d1, b.s1, m, k, 1, B, b.o1};
    const DequantizeArgs<F, BF16> rc{b.d3, b.s3, 1, m, k, B, b.o1};
    auto generic = [&](const DequantizeArgs<F, BF16>& a) {
      dequantize_generic_kernel<<<unsigned(std::min<int64_t>(cdiv(a.outer * a.chunks() * a.inner,
                                                                  kThreads), 1 << 20)),
                                  kThreads, 0, st>>>(a);
    };
    row("dequantize rows", fmt, "before (ref)", time_ms([&] { generic(rr); }), dbytes, -1);
    DequantizeArgs<F, BF16> a = rr;
    a.out = b.o2;
    vd("dequantize rows", "chunks (default)", [&] { launch_dequantize<F, BF16>(a, B, st); });
    row("dequantize cols", fmt, "before (ref)", time_ms([&] { generic(rc); }), dbytes, -1);
    a = rc;
    a.out = b.o2;
    vd("dequantize cols", "default", [&] { launch_dequantize<F, BF16>(a, B, st); });
    vd("dequantize cols", "8 x 4 tiles", [&] { launch_dequantize<F, BF16, 4>(a, B, st); });
    vd("dequantize cols", "8 x 16 tiles", [&] { launch_dequantize<F, BF16, 16>(a, B, st); });
  }
  // fake_quantize bf16 -> bf16: reference = before-quantize + before-dequantize (two kernels).
  {
    const double fbytes = 4.0 * n_el;
    for (int cols = 0; cols < 2; ++cols) {
      const char* op = cols ? "fake_quantize cols" : "fake_quantize rows";
      const int64_t outer = cols ? 1 : m, n = cols ? m : k, inner = cols ? k : 1;
      auto two = [&] {
        ref::launch_quantize<F, In>(b.x, outer, n, inner, B, kRceil, b.d1, b.s1, st);
        const DequantizeArgs<F, BF16> d{b.d1, b.s1, outer, n, inner, B, b.o1};
        dequantize_generic_kernel<<<unsigned(std::min<int64_t>(
                                        cdiv(outer * d.chunks() * inner, kThreads), 1 << 20)),
                                    kThreads, 0, st>>>(d);
      };
      row(op, fmt, "2 kernels before (ref)", time_ms(two), fbytes, -1);
      const FakeArgs<In, BF16> a{b.x, outer, n, inner, kRceil, b.o2};
      auto v = [&](const char* name, auto launch) {
        CHECK(cudaMemset(b.o2, 0xAB, 2 * n_el));
        const double ms = time_ms(launch);
        row(op, fmt, name, ms, fbytes, count_diff(b.o2, b.o1, 2 * n_el));
      };
      if (!cols) {
        v("default", [&] { launch_fake_quantize<F, In, BF16>(a, B, st); });
        v("L=1 codec", [&] { launch_fake_quantize<F, In, BF16, 1, 256, Enc::kCodec>(a, B, st); });
        v("L=4 codec", [&] { launch_fake_quantize<F, In, BF16, 4, 256, Enc::kCodec>(a, B, st); });
        if constexpr (F::bits == 8) {
          v("L=1 cvt", [&] { launch_fake_quantize<F, In, BF16, 1, 256, Enc::kCvt>(a, B, st); });
        }
      } else {
        v("default", [&] { launch_fake_quantize<F, In, BF16>(a, B, st); });
        v("tile 128B codec", [&] { launch_fake_quantize<F, In, BF16, 1, 128, Enc::kCodec>(a, B, st); });
        v("tile 256B codec", [&] { launch_fake_quantize<F, In, BF16, 1, 256, Enc::kCodec>(a, B, st); });
        v("tile 512B codec", [&] { launch_fake_quantize<F, In, BF16, 1, 512, Enc::kCodec>(a, B, st); });
        if constexpr (F::bits == 8) {
          v("tile 256B cvt", [&] { launch_fake_quantize<F, In, BF16, 1, 256, Enc::kCvt>(a, B, st); });
        }
      }
    }
  }
}

// f32 input, e4m3 rows and columns (4 bytes read per element).
void bench_f32(const Buffers& b) {
  using F = E4M3;
  constexpr int B = 32;
  const int64_t m = b.m / 2, k = b.k, n_el = m * k;  // the f32 buffer holds m * k / 2 * 2
  const double q_bytes = 4.0 * n_el + n_el + n_el / B;
  for (int cols = 0; cols < 2; ++cols) {
    const char* op = cols ? "quantize cols f32" : "quantize rows f32";
    const int64_t outer = cols ? 1 : m, n = cols ? m : k, inner = cols ? k : 1;
    auto ref = [&] { ref::launch_quantize<F, F32>(reinterpret_cast<const uint32_t*>(b.xf), outer, n, inner, B, kRceil, b.d1, b.s1, 0); };
    row(op, "e4m3", "before (ref)", time_ms(ref), q_bytes, -1);
    const QuantizeArgs<F32> a{reinterpret_cast<const uint32_t*>(b.xf), outer, n, inner, kRceil, b.d2, b.s2};
    CHECK(cudaMemset(b.d2, 0xAB, n_el));
    const double ms = time_ms([&] { launch_quantize<F, F32>(a, B, 0); });
    row(op, "e4m3", "default", ms, q_bytes,
        (long long)(count_diff(b.d2, b.d1, n_el) + count_diff(b.s2, b.s1, n_el / B)));
  }
}

}  // namespace
}  // namespace mxjax::cuda

int main(int argc, char** argv) {
  using namespace mxjax;
  using namespace mxjax::cuda;
  const int64_t m = argc > 2 ? std::atoll(argv[1]) : 32768, k = argc > 2 ? std::atoll(argv[2]) : 16384;
  if (argc > 3) reps = std::atoi(argv[3]);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; x: %lld x %lld bf16 (%.2f GiB), block 32, RCEIL, median of %d\n",
              prop.name, prop.multiProcessorCount, (long long)m, (long long)k,
              m * k * 2.0 / (1 << 30), reps);
  Buffers b{m, k};
  const int64_t n_el = m * k;
  b.x = dev<uint16_t>(2 * n_el);
  b.xf = dev<float>(2 * n_el);  // m / 2 x k f32
  for (uint8_t** p : {&b.d1, &b.d2, &b.d3, &b.d4}) *p = dev<uint8_t>(n_el);
  for (uint8_t** p : {&b.s1, &b.s2, &b.s3, &b.s4}) *p = dev<uint8_t>(n_el / 16);
  b.o1 = dev<uint16_t>(2 * n_el);
  b.o2 = dev<uint16_t>(2 * n_el);
  fill_kernel<<<grid_for(n_el), kThreads>>>(b.x, nullptr, n_el, 1234u);
  fill_kernel<<<grid_for(n_el / 2), kThreads>>>(nullptr, b.xf, n_el / 2, 99u);
  CHECK(cudaDeviceSynchronize());

  prove_cvt<E4M3>("e4m3");
  prove_cvt<E5M2>("e5m2");

  // The copy: cudaMemcpyAsync D2D of the bf16 input (read + written bytes).
  const double copy_ms = time_ms([&] {
    CHECK(cudaMemcpyAsync(b.o2, b.x, 2 * n_el, cudaMemcpyDeviceToDevice, 0));
  });
  copy_gbs = 4.0 * n_el / copy_ms / 1e6;
  std::printf("\n%-22s %-5s %-26s %8s %8s %6s  %s\n", "op", "fmt", "variant", "ms", "GB/s",
              "/copy", "bytes");
  row("copy (cudaMemcpy D2D)", "-", "-", copy_ms, 4.0 * n_el, 0);
  bench_format<E4M3>(b, "e4m3");
  bench_format<E5M2>(b, "e5m2");
  bench_format<E2M1>(b, "e2m1");
  bench_format<E3M2>(b, "e3m2");
  bench_f32(b);
  std::printf(bad_rows ? "\nbench_kernels: %d rows DIFFER from the reference\n"
                       : "\nbench_kernels: all variants equal the reference\n", bad_rows);
  return bad_rows != 0;
}
