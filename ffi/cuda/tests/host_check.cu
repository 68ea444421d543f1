// Host-side check of the CUDA kernels' per-thread code, no GPU needed: every kernel body is a
// __host__ __device__ function, so this program runs each launch's threads one after another
// on the CPU (shuffle reductions and shared-memory staging emulated in plain loops) and
// compares the bytes with the CPU kernels of ffi/include/mxjax/quantize.h, for every format,
// input dtype, block size and scale mode, on odd shapes and special values; it also checks
// the 128x4 scale swizzle against its definition. What it cannot see: warp shuffles, the
// 16-byte vector paths, __syncthreads, launch configuration (the GPU oracle tests do).
//
//   J=$(python -c "import jax; print(jax.ffi.include_dir())")
//   nvcc -std=c++17 -Iffi -Iffi/include -isystem $J -diag-suppress 940,2473 \
//     ffi/cuda/tests/host_check.cu -o /tmp/host_check && /tmp/host_check
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/dequantize.cu"
#include "cuda/quantize.cu"
#include "cuda/quantize_2x.cu"
#include "cuda/scale_swizzle.h"

namespace mxjax::cuda {
namespace {

int failures = 0;

void expect_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                  const char* what, int fmt, int dtype, int block, int mode, int64_t a, int64_t b,
                  int64_t c) {
  if (got == want) return;
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  if (++failures <= 20) {
    std::printf("FAIL %s fmt=%d dtype=%d block=%d mode=%d shape=(%lld,%lld,%lld) byte %zu: "
                "got %02x want %02x\n", what, fmt, dtype, block, mode, (long long)a, (long long)b,
                (long long)c, i, got[i], want[i]);
  }
}

// Random f32 bit patterns by blocks: mixed magnitudes, zeros, -0, subnormals, and now and
// then Inf / NaN, narrowed to the input type.
template <class In>
std::vector<typename In::T> inputs(int64_t count, std::mt19937& rng) {
  std::vector<typename In::T> x(count);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> kind(0, 99), shift(-30, 30);
  std::uniform_int_distribution<uint32_t> any;
  int block_shift = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (i % 16 == 0) block_shift = shift(rng);
    int k = kind(rng);
    uint32_t b = as_bits(std::ldexp(normal(rng), block_shift));
    if (k < 5) b = 0;
    else if (k < 8) b = 0x80000000u;
    else if (k < 12) b = any(rng) & 0x807FFFFFu;  // f32 subnormal
    else if (k < 13) b = (any(rng) & 0x80000000u) | kF32Inf;
    else if (k < 14) b = kF32QNaN | (any(rng) & 0x80000000u);
    else if (k < 16) b = any(rng);
    x[i] = In::narrow(b);
  }
  return x;
}

template <class F, class In>
void check_quantize(int64_t outer, int64_t n, int64_t inner, int block, int mode,
                    std::mt19937& rng) {
  auto x = inputs<In>(outer * n * inner, rng);
  const int64_t nb = cdiv(n, block), storage = cdiv(n, F::group_codes) * F::group_bytes;
  std::vector<uint8_t> data(outer * storage * inner, 0xAB), scales(outer * nb * inner, 0xAB);
  std::vector<uint8_t> want_data = data, want_scales = scales;
  QuantizeArgs<F, In> a{x.data(), outer, n, inner, block, mode, false, data.data(),
                        scales.data()};
  if (inner == 1) {
    for (int64_t b = 0; b < outer * nb; ++b) {  // one block's lanes, then its shuffle reduction
      std::vector<std::array<uint32_t, kVec<In>>> u(a.lanes());
      uint32_t amax = 0;
      for (int q = 0; q < a.lanes(); ++q) {
        uint32_t(&uq)[kVec<In>] = *reinterpret_cast<uint32_t(*)[kVec<In>]>(u[q].data());
        amax = umax(amax, rows_load(a, b * a.lanes() + q, uq));
      }
      for (int q = 0; q < a.lanes(); ++q) {
        rows_store(a, b * a.lanes() + q, *reinterpret_cast<uint32_t(*)[kVec<In>]>(u[q].data()),
                   amax);
      }
    }
    for (int64_t r = 0; r < outer; ++r) {
      quantize_row<F, In>(x.data() + r * n, n, 0, nb, block, mode,
                          want_data.data() + r * storage, want_scales.data() + r * nb);
    }
  } else {
    for (int64_t t = 0; t < outer * nb * inner; ++t) quantize_col_block(a, t);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < nb; ++j) {
        quantize_cols<F, In>(x.data() + (o * n + j * block) * inner, inner,
                             int(min64(block, n - j * block)), 0, inner, block, mode,
                             want_data.data() + (o * storage + j * block_storage<F>(block)) * inner,
                             want_scales.data() + (o * nb + j) * inner);
      }
    }
  }
  expect_equal(scales, want_scales, "quantize scales", F::id, sizeof(typename In::T), block, mode,
               outer, n, inner);
  expect_equal(data, want_data, "quantize data", F::id, sizeof(typename In::T), block, mode,
               outer, n, inner);

  // Dequantize what the CPU made, to each output type of In's width.
  std::vector<typename In::T> out(outer * n * inner), want_out(outer * n * inner);
  DequantizeArgs<F, In> d{want_data.data(), want_scales.data(), outer, n, inner, block,
                          out.data()};
  for (int64_t t = 0; t < outer * d.chunks() * inner; ++t) dequantize_chunk(d, t);
  for (int64_t o = 0; o < outer; ++o) {
    if (inner == 1) {
      dequantize_row<F, In>(want_data.data() + o * storage, want_scales.data() + o * nb, n, 0, nb,
                            block, want_out.data() + o * n);
      continue;
    }
    for (int64_t j = 0; j < nb; ++j) {
      dequantize_cols<F, In>(want_data.data() + (o * storage + j * block_storage<F>(block)) * inner,
                             want_scales.data() + (o * nb + j) * inner, inner,
                             int(min64(block, n - j * block)), 0, inner,
                             want_out.data() + (o * n + j * block) * inner);
    }
  }
  auto bytes = [](const std::vector<typename In::T>& v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(typename In::T));
  };
  expect_equal(bytes(out), bytes(want_out), "dequantize", F::id, sizeof(typename In::T), block,
               mode, outer, n, inner);
}

template <class F, class In>
void check_quantize_2x(int64_t batch, int64_t m, int64_t k, int block, int mode,
                       std::mt19937& rng) {
  auto x = inputs<In>(batch * m * k, rng);
  const int64_t rs = cdiv(k, F::group_codes) * F::group_bytes;
  const int64_t cs = cdiv(m, F::group_codes) * F::group_bytes;
  std::vector<uint8_t> rd(batch * m * rs, 0xAB), rsc(batch * m * cdiv(k, block), 0xAB);
  std::vector<uint8_t> cd(batch * cs * k, 0xAB), csc(batch * cdiv(m, block) * k, 0xAB);
  Problem2x p{batch, m, k, block, mode, false, rd.data(), rsc.data(), cd.data(), csc.data()};
  std::vector<uint32_t> tile(kTile * kLd);
  for (int64_t id = 0; id < tile_count(p); ++id) {
    TileOrigin o = tile_origin(p, id);
    for (int c = 0; c < kTile * kTile / kVec<In>; ++c) stage_vector<In>(x.data(), p, o, c, tile.data());
    for (int t = 0; t < 2 * kTile * (kTile / block); ++t) run_task<F>(p, o, t, tile.data());
  }
  // The 1x kernels (checked above against the CPU) along K and along M give the reference.
  std::vector<uint8_t> wrd(rd.size(), 0xAB), wrsc(rsc.size(), 0xAB);
  std::vector<uint8_t> wcd(cd.size(), 0xAB), wcsc(csc.size(), 0xAB);
  for (int64_t b = 0; b < batch; ++b) {
    const typename In::T* xb = x.data() + b * m * k;
    for (int64_t r = 0; r < m; ++r) {
      quantize_row<F, In>(xb + r * k, k, 0, cdiv(k, block), block, mode,
                          wrd.data() + (b * m + r) * rs, wrsc.data() + (b * m + r) * cdiv(k, block));
    }
    for (int64_t j = 0; j < cdiv(m, block); ++j) {
      quantize_cols<F, In>(xb + j * block * k, k, int(min64(block, m - j * block)), 0, k, block,
                           mode, wcd.data() + (b * cs + j * block_storage<F>(block)) * k,
                           wcsc.data() + (b * cdiv(m, block) + j) * k);
    }
  }
  const int w = sizeof(typename In::T);
  expect_equal(rsc, wrsc, "2x row scales", F::id, w, block, mode, batch, m, k);
  expect_equal(rd, wrd, "2x row data", F::id, w, block, mode, batch, m, k);
  expect_equal(csc, wcsc, "2x col scales", F::id, w, block, mode, batch, m, k);
  expect_equal(cd, wcd, "2x col data", F::id, w, block, mode, batch, m, k);
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

template <class Fn>
void each_case(Fn&& fn) {
  for (int fmt = 0; fmt < 5; ++fmt) {
    for (auto dt : {ffi::DataType::BF16, ffi::DataType::F16, ffi::DataType::F32}) {
      for (int block : {16, 32, 64}) {
        for (int mode : {0, 1}) {
          dispatch(fmt, dt, [&](auto f, auto in) { fn(f, in, block, mode); });
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
  each_case([&](auto f, auto in, int block, int mode) {
    using F = decltype(f);
    using In = decltype(in);
    for (int64_t n : {1, 5, 16, 33, 64, 100}) {
      check_quantize<F, In>(3, n, 1, block, mode, rng);
      check_quantize<F, In>(2, n, 7, block, mode, rng);
    }
    for (int64_t m : {1, 17, 70}) {
      for (int64_t k : {3, 64, 130}) check_quantize_2x<F, In>(2, m, k, block, mode, rng);
    }
  });
  std::printf(failures ? "host_check: %d FAILURES\n" : "host_check: all passed\n", failures);
  return failures != 0;
}
