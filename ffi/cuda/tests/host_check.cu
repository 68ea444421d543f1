// Host-side check of the CUDA kernels' per-thread code, no GPU needed: every kernel body is a
// __host__ __device__ function, so this program runs each launch's threads one after another
// on the CPU (shuffle reductions emulated: the L lanes of a block load, their amax is reduced,
// then each stores) and compares the bytes with the CPU kernels of
// ffi/include/mxjax/quantize.h, for every format, input / output dtype, block size, scale
// mode and kernel variant (rows: 1, 2 or 4 lanes per block; column tiles of 1..16 columns;
// quantize_2x is these rows and columns kernels, one launch each), on odd shapes, every bf16 bit
// pattern and special values (Inf / NaN / -0 / subnormals / extreme scales); it also checks
// the 128x4 scale swizzle against its definition. What it cannot see: warp shuffles, the
// 16-byte vector instructions, __syncthreads, launch configuration, and the device-only
// instructions of Enc::kCvt and of f16 widening (the GPU checks do: gpu_check.py,
// bench_kernels.cu).
//
//   nvcc -std=c++17 -O0 -x c++ -DMXJAX_HD=inline -Iffi -Iffi/include \
//     ffi/cuda/tests/host_check.cu -o /tmp/host_check && /tmp/host_check
// (as tests/test_cuda_host_check.py: -x c++ compiles it with the host compiler alone, and
// MXJAX_HD=inline spares it the forced inlining; plain nvcc builds it too, slower)
// The kernels' bodies only (no __global__ kernels, launches, handlers or XLA headers).
#define MXJAX_HOST_CHECK 1
#define MXJAX_CUDA_KERNELS_ONLY 1

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/dequantize_kernels.cuh"
#include "cuda/fake_quantize_kernels.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/scale_swizzle.h"

namespace mxjax::cuda {
namespace {

int failures = 0, checks = 0;

template <class V>
std::vector<uint8_t> bytes(const std::vector<V>& v) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(p, p + v.size() * sizeof(V));
}

void expect_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                  const std::string& what, int fmt, int block, int mode, int64_t a, int64_t b,
                  int64_t c) {
  ++checks;
  if (got == want) return;
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  if (++failures <= 30 || std::getenv("HOST_CHECK_ALL")) {
    std::printf("FAIL %s fmt=%d block=%d mode=%d shape=(%lld,%lld,%lld) byte %zu: got %02x want "
                "%02x\n", what.c_str(), fmt, block, mode, (long long)a, (long long)b,
                (long long)c, i, got[i], want[i]);
  }
}

// Random f32 bit patterns in runs of 16 sharing a magnitude (sometimes extreme: all
// subnormal, near the f32 max, around the element's subnormals), with zeros, -0, f32
// subnormals, Inf and NaN mixed in; narrowed to the input type.
template <class In>
std::vector<typename In::T> inputs(int64_t count, std::mt19937& rng) {
  std::vector<typename In::T> x(count);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> kind(0, 99), shift(-30, 30), extreme(0, 9);
  std::uniform_int_distribution<uint32_t> any;
  int block_shift = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (i % 16 == 0) {
      block_shift = shift(rng);
      switch (extreme(rng)) {
        case 0: block_shift = -140; break;  // f32 subnormals (e clamped at -127)
        case 1: block_shift = 120; break;   // near the f32 max
        case 2: block_shift = -128; break;
        default: break;
      }
    }
    int k = kind(rng);
    uint32_t b = as_bits(std::ldexp(normal(rng), block_shift));
    if (k < 5) b = 0;
    else if (k < 8) b = 0x80000000u;
    else if (k < 11) b = any(rng) & 0x807FFFFFu;  // f32 subnormal
    else if (k < 12) b = (any(rng) & 0x80000000u) | kF32Inf;
    else if (k < 13) b = kF32QNaN | (any(rng) & 0x80000000u);
    else if (k < 15) b = any(rng);
    else if (k < 20) b = as_bits(std::ldexp(normal(rng), block_shift - 12));  // element subnormals
    x[i] = In::narrow(b);
  }
  return x;
}

// All 65,536 bf16 bit patterns in the input type (f16 / f32: their nearest values).
template <class In>
std::vector<typename In::T> every_bf16() {
  std::vector<typename In::T> x(1 << 16);
  for (uint32_t h = 0; h < (1u << 16); ++h) x[h] = In::narrow(h << 16);
  return x;
}

// ---- CPU references (quantize.h) ----

template <class F, class In>
void cpu_quantize(const std::vector<typename In::T>& x, int64_t outer, int64_t n, int64_t inner,
                  int block, int mode, std::vector<uint8_t>& data, std::vector<uint8_t>& scales) {
  const int64_t nb = cdiv(n, block), storage = cdiv(n, F::group_codes) * F::group_bytes;
  data.assign(outer * storage * inner, 0xAB);
  scales.assign(outer * nb * inner, 0xAB);
  for (int64_t o = 0; o < outer; ++o) {
    if (inner == 1) {
      quantize_row<F, In>(x.data() + o * n, n, 0, nb, block, mode, data.data() + o * storage,
                          scales.data() + o * nb);
      continue;
    }
    for (int64_t j = 0; j < nb; ++j) {
      quantize_cols<F, In>(x.data() + (o * n + j * block) * inner, inner,
                           int(min64(block, n - j * block)), 0, inner, block, mode,
                           data.data() + (o * storage + j * block_storage<F>(block)) * inner,
                           scales.data() + (o * nb + j) * inner);
    }
  }
}

template <class F, class Out>
std::vector<typename Out::T> cpu_dequantize(const std::vector<uint8_t>& data,
                                            const std::vector<uint8_t>& scales, int64_t outer,
                                            int64_t n, int64_t inner, int block) {
  const int64_t nb = cdiv(n, block), storage = cdiv(n, F::group_codes) * F::group_bytes;
  std::vector<typename Out::T> out(outer * n * inner);
  for (int64_t o = 0; o < outer; ++o) {
    if (inner == 1) {
      dequantize_row<F, Out>(data.data() + o * storage, scales.data() + o * nb, n, 0, nb, block,
                             out.data() + o * n);
      continue;
    }
    for (int64_t j = 0; j < nb; ++j) {
      dequantize_cols<F, Out>(data.data() + (o * storage + j * block_storage<F>(block)) * inner,
                              scales.data() + (o * nb + j) * inner, inner,
                              int(min64(block, n - j * block)), 0, inner,
                              out.data() + (o * n + j * block) * inner);
    }
  }
  return out;
}

// ---- quantize ----

// Rows, n % B == 0, L lanes per block.
template <class F, class In, int B, int L, Enc E>
void run_rows(const QuantizeArgs<In>& a) {
  using P = RowPlan<F, In, B, L>;
  const int64_t segs = a.outer * a.n / P::S;
  for (int64_t b = 0; b < segs / L; ++b) {
    std::array<std::array<uint32_t, P::kInWords>, L> w;
    uint32_t amax = 0;
    for (int q = 0; q < L; ++q) {
      amax = umax(amax, rows_load<F, In, B, L>(
                            a, b * L + q, segs,
                            *reinterpret_cast<uint32_t(*)[P::kInWords]>(w[q].data())));
    }
    for (int q = 0; q < L; ++q) {
      rows_store<F, In, B, L, E>(a, b * L + q,
                                 *reinterpret_cast<uint32_t(*)[P::kInWords]>(w[q].data()), amax);
    }
  }
}

template <class F, class In, int B, int V, Enc E>
void run_cols(const QuantizeArgs<In>& a) {
  for (int64_t t = 0; t < a.outer * cdiv(a.n, B) * (a.inner / V); ++t) cols_tile<F, In, B, V, E>(a, t);
}

template <class F, class In, int B>
void check_quantize(const std::vector<typename In::T>& x, int64_t outer, int64_t n,
                    int64_t inner, int mode) {
  std::vector<uint8_t> want_d, want_s;
  cpu_quantize<F, In>(x, outer, n, inner, B, mode, want_d, want_s);
  auto run = [&](const char* what, auto fn) {
    std::vector<uint8_t> d(want_d.size(), 0xAB), s(want_s.size(), 0xAB);
    QuantizeArgs<In> a{x.data(), outer, n, inner, mode, d.data(), s.data()};
    fn(a);
    const std::string tag = std::string("quantize ") + what + " in=" +
                            std::to_string(sizeof(typename In::T));
    expect_equal(s, want_s, tag + " scales", F::id, B, mode, outer, n, inner);
    expect_equal(d, want_d, tag + " data", F::id, B, mode, outer, n, inner);
  };
  if (inner == 1) {
    if (n % B == 0) {
      run("rows L=1", [](auto& a) { run_rows<F, In, B, row_lanes<In, B, 1>(), Enc::kCodec>(a); });
      run("rows L=2", [](auto& a) { run_rows<F, In, B, row_lanes<In, B, 2>(), Enc::kCodec>(a); });
      run("rows L=4 cvt", [](auto& a) { run_rows<F, In, B, row_lanes<In, B, 4>(), Enc::kCvt>(a); });
    }
    run("rows generic", [](auto& a) {
      for (int64_t i = 0; i < a.outer * cdiv(a.n, B); ++i) rows_generic_block<F, In>(a, B, i);
    });
    return;
  }
  run("cols V=1", [](auto& a) { run_cols<F, In, B, 1, Enc::kCodec>(a); });
  constexpr int V2 = tile_cols<In, B, 128>(), V4 = tile_cols<In, B, 256>(), V8 = tile_cols<In, B, 512>();
  if (inner % V2 == 0) run("cols 128B", [](auto& a) { run_cols<F, In, B, V2, Enc::kCodec>(a); });
  if (inner % V4 == 0) run("cols 256B", [](auto& a) { run_cols<F, In, B, V4, Enc::kCodec>(a); });
  if (inner % V8 == 0) run("cols 512B cvt", [](auto& a) { run_cols<F, In, B, V8, Enc::kCvt>(a); });
}

// ---- dequantize ----

template <class F, class Out, int B>
void check_dequantize(const std::vector<uint8_t>& data, const std::vector<uint8_t>& scales,
                      int64_t outer, int64_t n, int64_t inner, int mode) {
  const auto want = bytes(cpu_dequantize<F, Out>(data, scales, outer, n, inner, B));
  auto run = [&](const char* what, auto fn) {
    std::vector<typename Out::T> out(outer * n * inner, typename Out::T(0xABAB));
    DequantizeArgs<F, Out> a{data.data(), scales.data(), outer, n, inner, B, out.data()};
    fn(a);
    expect_equal(bytes(out), want, std::string("dequantize ") + what + " out=" +
                 std::to_string(sizeof(typename Out::T)), F::id, B, mode, outer, n, inner);
  };
  if (inner == 1) {
    if (n % B == 0) {
      run("rows", [](auto& a) {
        for (int64_t t = 0; t < a.outer * a.n / DeqRowPlan<F, Out, B>::C; ++t) {
          deq_rows_chunk<F, Out, B>(a, t);
        }
      });
    }
    run("generic", [](auto& a) {
      for (int64_t t = 0; t < a.outer * a.chunks(); ++t) dequantize_chunk(a, t);
    });
    return;
  }
  auto cols = [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    if (inner % V != 0) return;
    run(V == 1 ? "cols V=1" : V == 4 ? "cols V=4" : "cols V=16", [](auto& a) {
      for (int64_t t = 0; t < a.outer * cdiv(a.n, 8) * (a.inner / V); ++t) {
        deq_cols_tile<F, Out, B, V>(a, t);
      }
    });
  };
  cols(std::integral_constant<int, 1>{});
  cols(std::integral_constant<int, 4>{});
  cols(std::integral_constant<int, 16>{});
}

// ---- fake_quantize ----

template <class F, class In, class Out, int B>
void check_fake_quantize(const std::vector<typename In::T>& x, int64_t outer, int64_t n,
                         int64_t inner, int mode) {
  std::vector<uint8_t> d, s;
  cpu_quantize<F, In>(x, outer, n, inner, B, mode, d, s);
  const auto want = bytes(cpu_dequantize<F, Out>(d, s, outer, n, inner, B));
  auto run = [&](const char* what, auto fn) {
    std::vector<typename Out::T> out(outer * n * inner, typename Out::T(0xABAB));
    FakeArgs<In, Out> a{x.data(), outer, n, inner, mode, out.data()};
    fn(a);
    expect_equal(bytes(out), want, std::string("fake_quantize ") + what + " in=" +
                 std::to_string(sizeof(typename In::T)) + " out=" +
                 std::to_string(sizeof(typename Out::T)), F::id, B, mode, outer, n, inner);
  };
  auto rows = [&](auto lc, auto ec) {
    constexpr int L = row_lanes<In, B, decltype(lc)::value>();
    constexpr Enc E = decltype(ec)::value;
    run(L == 1 ? "rows L=1" : L == 2 ? "rows L=2" : "rows L=4", [](auto& a) {
      using P = FqRowPlan<In, Out, B, L>;
      const int64_t segs = a.outer * a.n / P::S;
      for (int64_t b = 0; b < segs / L; ++b) {
        uint32_t w[L][P::kInWords];
        uint32_t amax = 0;
        for (int q = 0; q < L; ++q) amax = umax(amax, fq_rows_load<In, Out, B, L>(a, b * L + q, segs, w[q]));
        for (int q = 0; q < L; ++q) fq_rows_store<F, In, Out, B, L, E>(a, b * L + q, w[q], amax);
      }
    });
  };
  if (inner == 1) {
    if (n % B == 0) {
      rows(std::integral_constant<int, 1>{}, std::integral_constant<Enc, Enc::kCodec>{});
      rows(std::integral_constant<int, 4>{}, std::integral_constant<Enc, Enc::kCvt>{});
    }
    run("rows generic", [](auto& a) {
      for (int64_t i = 0; i < a.outer * cdiv(a.n, B); ++i) fq_rows_generic_block<F, In, Out>(a, B, i);
    });
    return;
  }
  auto cols = [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    if (inner % V != 0) return;
    run("cols", [](auto& a) {
      for (int64_t t = 0; t < a.outer * cdiv(a.n, B) * (a.inner / V); ++t) {
        fq_cols_tile<F, In, Out, B, V, Enc::kCodec>(a, t);
      }
    });
  };
  cols(std::integral_constant<int, 1>{});
  cols(std::integral_constant<int, tile_cols<In, B, 256>()>{});
}

void check_swizzle() {
  for (int64_t rows : {1, 127, 128, 129, 300}) {
    for (int64_t cols : {1, 3, 4, 5, 9}) {
      const int64_t rp = swizzled_rows(rows), cp = swizzled_cols(cols);
      std::vector<int> seen(swizzled_bytes(rows, cols), 0);
      for (int64_t r = 0; r < rp; ++r) {
        for (int64_t c = 0; c < cp; ++c) {
          // Definition: padded [rp/128, 4, 32, cp/4, 4] permuted to (0, 3, 2, 1, 4), flattened.
          const int64_t want = ((((r / 128) * (cp / 4) + c / 4) * 32 + r % 32) * 4 + r % 128 / 32) * 4 + c % 4;
          const int64_t off = swizzled_offset(r, c, cols);
          int64_t r2, c2;
          swizzled_position(off, cols, r2, c2);
          if (off != want || r2 != r || c2 != c) {
            if (++failures <= 20) std::printf("FAIL swizzle rows=%lld cols=%lld (%lld, %lld)\n",
                                              (long long)rows, (long long)cols, (long long)r,
                                              (long long)c);
          }
          seen[off]++;
        }
      }
      for (int s : seen) failures += s != 1;
    }
  }
}

// Calls fn(In{}) for input dtype i: bf16, f16, f32.
template <class Fn>
void with_input(int i, Fn&& fn) {
  switch (i) {
    case 0: return fn(BF16{});
    case 1: return fn(F16{});
    default: return fn(F32{});
  }
}

template <class Fn>
void each_case(Fn&& fn) {
  for (int fmt = 0; fmt < 5; ++fmt) {
    for (int dt = 0; dt < 3; ++dt) {
      for (int block : {16, 32, 64}) {
        for (int mode : {0, 1}) {
          with_format(fmt, [&](auto f) {
            with_input(dt, [&](auto in) {
              with_block(block, [&](auto bc) { fn(f, in, bc, mode); });
            });
          });
        }
      }
    }
  }
}

}  // namespace
}  // namespace mxjax::cuda

int main() {
  using namespace mxjax::cuda;
  std::mt19937 rng(1234);
  check_swizzle();
  each_case([&](auto f, auto in, auto bc, int mode) {
    using F = decltype(f);
    using In = decltype(in);
    constexpr int B = decltype(bc)::value;
    // [outer, n, inner]: rows (inner 1) with n a multiple of B or not; columns with inner a
    // multiple of every tile width or odd.
    const int64_t shapes[][3] = {{3, B, 1}, {2, 4 * B, 1}, {3, 5, 1}, {2, B + 17, 1},
                                 {2, 33, 7}, {1, 2 * B + 5, 32}, {2, B, 16}, {1, 70, 48}};
    for (const auto& sh : shapes) {
      const auto x = inputs<In>(sh[0] * sh[1] * sh[2], rng);
      check_quantize<F, In, B>(x, sh[0], sh[1], sh[2], mode);
      std::vector<uint8_t> d, s;
      cpu_quantize<F, In>(x, sh[0], sh[1], sh[2], B, mode, d, s);
      check_dequantize<F, BF16, B>(d, s, sh[0], sh[1], sh[2], mode);
      check_dequantize<F, F16, B>(d, s, sh[0], sh[1], sh[2], mode);
      check_dequantize<F, F32, B>(d, s, sh[0], sh[1], sh[2], mode);
      check_fake_quantize<F, In, BF16, B>(x, sh[0], sh[1], sh[2], mode);
      check_fake_quantize<F, In, F16, B>(x, sh[0], sh[1], sh[2], mode);
      check_fake_quantize<F, In, F32, B>(x, sh[0], sh[1], sh[2], mode);
    }
    // Every bf16 bit pattern, along rows and along columns.
    const auto all = every_bf16<In>();
    check_quantize<F, In, B>(all, 1024, 64, 1, mode);
    check_quantize<F, In, B>(all, 1, 64, 1024, mode);
    check_fake_quantize<F, In, BF16, B>(all, 1024, 64, 1, mode);
    check_fake_quantize<F, In, F32, B>(all, 1, 64, 1024, mode);
  });
  std::printf(failures ? "host_check: %d FAILURES of %d checks\n" : "host_check: all passed (%d checks)\n",
              failures ? failures : checks, checks);
  return failures != 0;
}
