// The CPU kernels for one SIMD level. CMake compiles this file once per level with
// -DMXJAX_ISA_NS=<level> and that level's -m flags; the templates of quantize.h land in
// a namespace of that name, and kernels_<level>() returns the table.
#include "kernels.h"

#include <cstring>
#include <type_traits>

#include "mxjax/quantize.h"
#include "simd256.h"
#include "simd512.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

using cpu::ceil_div;
using cpu::kUnitCols;

// Calls fn(F{}, In{}) with the element format and the high-precision type of the ids.
template <class Fn>
void dispatch(int32_t format, int32_t dtype, Fn&& fn) {
  auto with_dtype = [&](auto f) {
    switch (dtype) {
      case cpu::kBF16: return fn(f, BF16{});
      case cpu::kF16: return fn(f, F16{});
      default: return fn(f, F32{});
    }
  };
  return with_format(format, with_dtype);
}

// A tile of a strided axis: outer index o, block row j, columns [c0, c1).
struct Tile {
  int64_t o, j, c0, c1;
};

Tile tile_of(int64_t u, int64_t nb, int64_t inner) {
  int64_t ncc = ceil_div(inner, kUnitCols);
  int64_t cc = u % ncc;
  int64_t oj = u / ncc;
  return {oj / nb, oj % nb, cc * kUnitCols, min64(inner, (cc + 1) * kUnitCols)};
}

#if defined(MXJAX_HAVE_SIMD512)
#define MXJAX_HAVE_SIMD_ROWS 1
namespace simd = simd512;
#elif defined(MXJAX_HAVE_SIMD256)
#define MXJAX_HAVE_SIMD_ROWS 1
namespace simd = simd256;
#endif

// Rowwise blocks [b0, b1) of one contiguous row of n inputs (as quantize_row): the SIMD
// level's bf16 / block-32 path where there is one, quantize_row for the rest.
template <class F, class In>
void row_span(const typename In::T* x, int64_t n, int64_t b0, int64_t b1, int block,
              int32_t mode, uint8_t* data, uint8_t* scales) {
#ifdef MXJAX_HAVE_SIMD_ROWS
  if constexpr (std::is_same_v<In, BF16>) {
    if (block == 32) b0 = simd::row_blocks<F>(x, n, b0, b1, mode, data, scales);
  }
#endif
  if (b0 < b1) quantize_row<F, In>(x, n, b0, b1, block, mode, data, scales);
}

// One column tile (as quantize_cols): the SIMD level's bf16 / block-32 / FP8 strips where
// there are some, quantize_cols otherwise.
template <class F, class In>
void col_tile(const typename In::T* x, int64_t ld, int rows, int64_t c0, int64_t c1, int block,
              int32_t mode, uint8_t* data, uint8_t* scales) {
#ifdef MXJAX_HAVE_SIMD_ROWS
  if constexpr (std::is_same_v<In, BF16> && F::bits == 8) {
    if (block == 32) return simd::quantize_cols_bf16<F>(x, ld, rows, c0, c1, mode, data, scales);
  }
#endif
  quantize_cols<F, In>(x, ld, rows, c0, c1, block, mode, data, scales);
}

#ifdef MXJAX_HAVE_SIMD_ROWS
constexpr int kSubCols = 128;  // columns of a quantize_2x sub-tile copied to L1
constexpr int kPrefetchCols = 2 * kSubCols;  // prefetch distance in the tile's rows

// quantize_2x of one tile of 32 full rows of bf16 (`ld` apart) and columns [c0, c1), a
// multiple of kSubCols, block 32, FP8: each [32, kSubCols] sub-tile is copied to a
// contiguous buffer (rows `ld` apart alias in L1), encoded rowwise from there, then
// columnwise from there. `row_data` / `row_scales` point at the tile's first row
// (`row_ld` / `nbk` apart), `col_data` / `col_scales` at its block row.
template <class F>
void tile_2x_bf16(const uint16_t* x, int64_t ld, int64_t c0, int64_t c1, int32_t mode,
                  uint8_t* row_data, int64_t row_ld, uint8_t* row_scales, int64_t nbk,
                  uint8_t* col_data, uint8_t* col_scales) {
  alignas(64) uint16_t buf[32][kSubCols];
  alignas(64) uint8_t codes[32][kSubCols];  // column codes, written out row by row
  for (int64_t c = c0; c < c1; c += kSubCols) {
    // 32 rows are 32 streams, more than the hardware prefetchers follow: fetch ahead.
    const int64_t ahead = c + kPrefetchCols < c1 ? c + kPrefetchCols : c1;  // within the row
    for (int r = 0; r < 32 && ahead + kSubCols <= c1; ++r) {
      for (int b = 0; b < kSubCols * 2; b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(x + r * ld + ahead) + b);
        if (b < kSubCols) __builtin_prefetch(col_data + r * ld + ahead + b, 1);
        if (b < kSubCols * F::bits / 8) __builtin_prefetch(row_data + r * row_ld + ahead + b, 1);
      }
    }
    for (int r = 0; r < 32; ++r) {
      simd::copy_row(x + r * ld + c, buf[r], kSubCols);
      simd::row_group<F>(buf[r], kSubCols / 32, mode, row_data + r * row_ld + c,
                         row_scales + r * nbk + c / 32);
    }
    uint32_t scalar = 0;  // strips that need the scalar path, done after the copy-out
    for (int s = 0; s < kSubCols / simd::kStripCols; ++s) {
      const int cs = s * simd::kStripCols;
      if (!simd::col_strip<F>(&buf[0][cs], kSubCols, 32, mode, &codes[0][cs], kSubCols,
                              col_scales + c + cs)) {
        scalar |= 1u << s;
      }
    }
    for (int r = 0; r < 32; ++r) std::memcpy(col_data + r * ld + c, codes[r], sizeof(codes[r]));
    for (int s = 0; scalar >> s; ++s) {
      const int64_t cs = c + s * simd::kStripCols;
      if ((scalar >> s) & 1) {
        quantize_cols<F, BF16>(x, ld, 32, cs, cs + simd::kStripCols, 32, mode, col_data,
                               col_scales);
      }
    }
  }
}
#endif

void quantize(const cpu::QuantizeProblem& p, int64_t begin, int64_t end) {
  dispatch(p.format, p.dtype, [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    using T = typename In::T;
    const T* x = static_cast<const T*>(p.x);
    const int64_t nb = ceil_div(p.n, p.block);
    const int64_t storage = ceil_div(p.n, F::group_codes) * F::group_bytes;
    const int block = int(p.block);
    if (p.inner == 1) {  // units are blocks of rows
      for (int64_t u = begin; u < end;) {
        int64_t row = u / nb;
        int64_t b1 = min64(nb, u % nb + (end - u));
        row_span<F, In>(x + row * p.n, p.n, u % nb, b1, block, p.mode, p.data + row * storage,
                        p.scales + row * nb);
        u += b1 - u % nb;
      }
      return;
    }
    for (int64_t u = begin; u < end; ++u) {
      Tile t = tile_of(u, nb, p.inner);
      int rows = int(min64(p.block, p.n - t.j * p.block));
      col_tile<F, In>(x + (t.o * p.n + t.j * p.block) * p.inner, p.inner, rows, t.c0, t.c1,
                      block, p.mode,
                      p.data + (t.o * storage + t.j * block_storage<F>(block)) * p.inner,
                      p.scales + (t.o * nb + t.j) * p.inner);
    }
  });
}

void quantize_2x(const cpu::Quantize2xProblem& p, int64_t begin, int64_t end) {
  dispatch(p.format, p.dtype, [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    using T = typename In::T;
    const T* x = static_cast<const T*>(p.x);
    const int block = int(p.block);
    const int64_t nbm = ceil_div(p.m, p.block), nbk = ceil_div(p.k, p.block);
    const int64_t sm = ceil_div(p.m, F::group_codes) * F::group_bytes;
    const int64_t sk = ceil_div(p.k, F::group_codes) * F::group_bytes;
    for (int64_t u = begin; u < end; ++u) {
      // Both quantizations of one [block, kUnitCols] tile while it is in L1.
      Tile t = tile_of(u, nbm, p.k);
      int rows = int(min64(p.block, p.m - t.j * p.block));
      int64_t r0 = t.o * p.m + t.j * p.block;  // first row of the tile in [batch * m, k]
      uint8_t* cdata = p.col_data + (t.o * sm + t.j * block_storage<F>(block)) * p.k;
      uint8_t* cscales = p.col_scales + (t.o * nbm + t.j) * p.k;
#ifdef MXJAX_HAVE_SIMD_ROWS
      if constexpr (std::is_same_v<In, BF16> && F::bits == 8) {
        if (block == 32 && rows == 32 && (t.c1 - t.c0) % kSubCols == 0) {
          tile_2x_bf16<F>(x + r0 * p.k, p.k, t.c0, t.c1, p.mode, p.row_data + r0 * sk, sk,
                          p.row_scales + r0 * nbk, nbk, cdata, cscales);
          continue;
        }
      }
#endif
      col_tile<F, In>(x + r0 * p.k, p.k, rows, t.c0, t.c1, block, p.mode, cdata, cscales);
      for (int r = 0; r < rows; ++r) {
        row_span<F, In>(x + (r0 + r) * p.k, p.k, t.c0 / block, ceil_div(t.c1, block), block,
                        p.mode, p.row_data + (r0 + r) * sk, p.row_scales + (r0 + r) * nbk);
      }
    }
  });
}

void dequantize(const cpu::DequantizeProblem& p, int64_t begin, int64_t end) {
  dispatch(p.format, p.dtype, [&](auto f, auto out_type) {
    using F = decltype(f);
    using Out = decltype(out_type);
    using T = typename Out::T;
    T* out = static_cast<T*>(p.out);
    const int64_t nb = ceil_div(p.n, p.block);
    const int64_t storage = ceil_div(p.n, F::group_codes) * F::group_bytes;
    const int block = int(p.block);
    if (p.inner == 1) {
      for (int64_t u = begin; u < end;) {
        int64_t row = u / nb;
        int64_t b1 = min64(nb, u % nb + (end - u));
        dequantize_row<F, Out>(p.data + row * storage, p.scales + row * nb, p.n, u % nb, b1,
                               block, out + row * p.n);
        u += b1 - u % nb;
      }
      return;
    }
    for (int64_t u = begin; u < end; ++u) {
      Tile t = tile_of(u, nb, p.inner);
      int rows = int(min64(p.block, p.n - t.j * p.block));
      dequantize_cols<F, Out>(p.data + (t.o * storage + t.j * block_storage<F>(block)) * p.inner,
                              p.scales + (t.o * nb + t.j) * p.inner, p.inner, rows, t.c0, t.c1,
                              out + (t.o * p.n + t.j * p.block) * p.inner);
    }
  });
}

}  // namespace
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#define MXJAX_STR2(x) #x
#define MXJAX_STR(x) MXJAX_STR2(x)
#define MXJAX_CAT2(a, b) a##b
#define MXJAX_CAT(a, b) MXJAX_CAT2(a, b)

const mxjax::cpu::Kernels& mxjax::cpu::MXJAX_CAT(kernels_, MXJAX_ISA_NS)() {
  static const Kernels table = {MXJAX_STR(MXJAX_ISA_NS), &mxjax::quantize, &mxjax::quantize_2x,
                                &mxjax::dequantize};
  return table;
}
