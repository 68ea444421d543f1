// The CPU kernels for one SIMD level. CMake compiles this file once per level with
// -DMXJAX_ISA_NS=<level> and that level's -m flags; the templates of quantize.h land in
// a namespace of that name, and kernels_<level>() returns the table.
#include "kernels.h"

#include <type_traits>
#include <vector>

#include "bf16_odd.h"
#include "gcc_diagnostics.h"
#include "mxjax/quantize.h"
#include "simd256.h"
#include "simd256_2x.h"
#include "simd256_cols.h"
#include "simd256_dequantize.h"
#include "simd512.h"
#include "simd512_2x.h"
#include "simd512_dequantize.h"
#include "stream.h"
#include "tile_2x.h"
#include "tile_ahead.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

using cpu::ceil_div;
using cpu::kUnitCols;

// Calls fn(F{}, In{}) with the element format and the high-precision type of the ids;
// returns what fn returns.
template <class Fn>
decltype(auto) dispatch(int32_t format, int32_t dtype, Fn&& fn) {
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

// The tiles of work units u + 1 and u + 2 (< end) of x ([outer, n, inner] of T, in tiles of
// block 32 (kTileRows) rows), for u's tile to fetch (see TileAheadOf).
template <class T>
cpu::TileAheadOf<T> tiles_ahead(const void* x, int64_t n, int64_t inner, int64_t u,
                                int64_t end) {
  constexpr int64_t rows = cpu::kTileRows;
  auto whole = [&](int64_t v) -> const T* {
    if (v >= end) return nullptr;
    const Tile t = tile_of(v, ceil_div(n, rows), inner);
    if (t.c1 - t.c0 < kUnitCols || (t.j + 1) * rows > n) return nullptr;
    return static_cast<const T*>(x) + (t.o * n + t.j * rows) * inner + t.c0;
  };
  return {whole(u + 1), whole(u + 2), inner};
}

#if defined(MXJAX_HAVE_SIMD512)
#define MXJAX_HAVE_SIMD_ROWS 1
namespace simd = simd512;
#elif defined(MXJAX_HAVE_SIMD256)
#define MXJAX_HAVE_SIMD_ROWS 1
namespace simd = simd256;
#endif

#ifdef MXJAX_HAVE_SIMD_ROWS
// Whether a block that the bf16 paths quantized from RO(x) (bf16_odd.h) must be redone from
// x: its scale byte is below min_byte or NaN.
template <class F>
bool redo_from_x(uint8_t scale) {
  static_assert(simd::min_byte<F>() == simd256::min_byte<F>());  // level_tile_2x takes both
  return scale < simd::min_byte<F>() || scale == kE8M0NaN;
}

// Rowwise blocks [b0, b1) of a row of n f32 / f16 inputs, the full ones by the bf16 path in
// runs of up to 64 blocks narrowed to RO bf16 in L1, then scalar_block for those that
// redo_from_x; returns the first block not done (as simd::row_blocks).
template <class F, class In>
int64_t row_blocks_via_bf16(const typename In::T* x, int64_t n, int64_t b0, int64_t b1,
                            int32_t mode, uint8_t* data, uint8_t* scales) {
  constexpr int64_t kRun = 64;
  constexpr int64_t bs = block_storage<F>(32);
  alignas(64) uint16_t xb[kRun * 32];
  const int64_t end = min64(b1, n / 32);
  for (int64_t b = b0; b < end; b += kRun) {
    const int64_t e = min64(end, b + kRun);
    to_bf16_odd<In>(x + 32 * b, 32 * (e - b), xb);
    simd::row_blocks<F>(xb, 32 * (e - b), 0, e - b, mode, data + bs * b, scales + b);
    for (int64_t j = b; j < e; ++j) {
      if (redo_from_x<F>(scales[j])) {
        simd256::scalar_block<F, In>(x + 32 * j, mode, data + bs * j, scales + j);
      }
    }
  }
  return b0 > end ? b0 : end;
}
#endif

// Rowwise blocks [b0, b1) of one contiguous row of n inputs (as quantize_row): the SIMD
// level's bf16 / block-32 path where there is one (f32 / f16 through row_blocks_via_bf16),
// quantize_row for the rest.
template <class F, class In>
void row_span(const typename In::T* x, int64_t n, int64_t b0, int64_t b1, int block,
              int32_t mode, uint8_t* data, uint8_t* scales) {
#ifdef MXJAX_HAVE_SIMD_ROWS
  if (block == 32) {
    if constexpr (std::is_same_v<In, BF16>) {
      b0 = simd::row_blocks<F>(x, n, b0, b1, mode, data, scales);
    } else {
      b0 = row_blocks_via_bf16<F, In>(x, n, b0, b1, mode, data, scales);
    }
  }
#endif
  if (b0 < b1) quantize_row<F, In>(x, n, b0, b1, block, mode, data, scales);
}

// row_span, with `stream`: through a staging buffer in L1, whose whole lines go out with
// streaming stores (stream.h). Staging rounds are aligned to kStage blocks of the row.
template <class F, class In>
void row_out(const typename In::T* x, int64_t n, int64_t b0, int64_t b1, int block,
             int32_t mode, uint8_t* data, uint8_t* scales, bool stream) {
  if (!stream) return row_span<F, In>(x, n, b0, b1, block, mode, data, scales);
  constexpr int64_t kStage = 64;
  alignas(64) uint8_t sdata[kStage * block_storage<F>(kMaxBlock)];
  alignas(64) uint8_t sscales[kStage];
  const int64_t bs = block_storage<F>(block);
  const int64_t storage = ceil_div(n, F::group_codes) * F::group_bytes;
  for (int64_t b = b0; b < b1;) {
    const int64_t e = min64(b1, (b / kStage + 1) * kStage);
    row_span<F, In>(x + b * block, n - b * block, 0, e - b, block, mode, sdata, sscales);
    stream_copy(data + b * bs, sdata, min64(e * bs, storage) - b * bs);
    stream_copy(scales + b, sscales, e - b);
    b = e;
  }
}

#ifdef MXJAX_HAVE_SIMD_ROWS
// Columnwise quantize of the whole 32-column strips of a bf16 / block-32 tile: `strips`
// strips of `rows` rows `xld` apart at x; data at the strips' first storage row (storage
// rows `ld` apart), scales at their scale row. In passes over whole rows (the rows of a wide
// x alias in L1; row by row, every line is used whole): column amax, scales, encode.
// `stream`: data and scales go out with streaming stores (whole lines: see col_stream). The
// encode pass fetches the tiles `ahead` (of x's inputs: bf16, or the f32 / f16 that x was
// narrowed from) block by block. Returns a bit per strip that the scalar path must do (its
// data and scales undefined).
template <class F, class T>
uint64_t col_strips_bf16(const uint16_t* x, int64_t xld, int rows, int strips, int32_t mode,
                         uint8_t* data, int64_t ld, uint8_t* scales, bool stream,
                         const cpu::TileAheadOf<T>& ahead) {
  constexpr int W = simd::kStripCols;
  static_assert(kUnitCols / W <= 64);
  simd::Vec amax[kUnitCols / W];
  simd::StripScale scale[kUnitCols / W];
  for (int j = 0; j < strips; ++j) amax[j] = simd::Vec{};
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < strips; ++j) amax[j] = simd::strip_amax(amax[j], x + r * xld + j * W);
  }
  uint64_t scalar = 0;
  for (int j = 0; j < strips; ++j) {
    if (!simd::strip_scales<F>(amax[j], mode, scales + j * W, &scale[j], stream)) {
      scalar |= 1ull << j;
    }
  }
  for (int r = 0; r < rows; r += F::group_codes) {
    uint8_t* out = data + r / F::group_codes * F::group_bytes * ld;
    for (int j = 0; j < strips; ++j) {
      static_assert(W * sizeof(uint16_t) == 64);  // a strip's row: one line
      for (int i = 0; i < F::group_codes && r + i < rows; ++i) {
        cpu::fetch_ahead(ahead, r + i, j * W);
      }
      simd::strip_encode<F>(x + r * xld + j * W, xld, rows - r, scale[j], out + j * W, ld,
                            stream);
    }
  }
  return scalar;
}
#endif

#ifdef MXJAX_HAVE_SIMD_ROWS
// The fused quantize_2x tile this level uses for F (arguments as simd256::tile_2x): at
// AVX-512 simd512_2x.h's for FP8, and simd256_2x.h's (built with AVX-512VL) for FP4 / FP6,
// which was faster on a Zen 4 (512-bit ops in two halves) in and out of cache: one thread,
// 2048 x 8192 bf16 with streaming stores, Gelem/s 256-bit / 512-bit tile: e2m1 3.2-3.5 /
// 2.4-2.6, e3m2 3.0 / 1.6, e2m3 2.8 / 2.4, e4m3 2.3-2.6 / 2.6.
template <class F, class T>
uint32_t level_tile_2x(const uint16_t* x, int64_t ld, int rows, int nblk, int32_t mode,
                       const cpu::Tile2xOut& o, const cpu::TileAheadOf<T>& ahead) {
#ifdef MXJAX_HAVE_SIMD512
  if constexpr (F::bits == 8) return simd512::tile_2x<F>(x, ld, rows, nblk, mode, o, ahead);
#endif
  return simd256::tile_2x<F>(x, ld, rows, nblk, mode, o, ahead);
}

// quantize_2x of a block-32 tile: rows [0, rows) (<= 32) of x, rows k apart, columns
// [c0, c1) (c1 - c0 <= kUnitCols); row_data / row_scales at the tile's first row (rows sk and
// nbk apart), col_data / col_scales at its first storage row (columns k apart); the tiles
// `ahead` fetched. level_tile_2x on x's whole blocks (f32 / f16: on RO(x), bf16_odd.h,
// then scalar_block for the rowwise blocks that redo_from_x), then quantize.h's templates
// for the strips it returns and the ragged ends (a last block shorter than 32, columns past
// the last whole block).
template <class F, class In>
void tile_2x_simd(const typename In::T* x, int64_t k, int rows, int64_t c0, int64_t c1,
                  int32_t mode, uint8_t* row_data, int64_t sk, uint8_t* row_scales, int64_t nbk,
                  uint8_t* col_data, uint8_t* col_scales, bool row_stream, bool col_stream,
                  const cpu::TileAheadOf<typename In::T>& ahead) {
  static_assert(kUnitCols == 32 * cpu::kTileBlocks);
  const int64_t b0 = c0 / 32, b1 = ceil_div(c1, 32), full = min64(b1, k / 32);
  const int nblk = int(full - b0);
  const cpu::Tile2xOut out{row_data + b0 * block_storage<F>(32), sk, row_scales + b0, nbk,
                            row_stream, col_data + c0, col_scales + c0, k, col_stream};
  uint32_t slow;
  MXJAX_UNINITIALIZED_WARNINGS_OFF  // quantize.h's zeroed codes (see gcc_diagnostics.h)
  if constexpr (std::is_same_v<In, BF16>) {
    slow = level_tile_2x<F>(x + c0, k, rows, nblk, mode, out, ahead);
  } else {
    alignas(64) uint16_t xb[cpu::kTileRows * kUnitCols];
    tile_to_bf16_odd<In>(x + c0, k, rows, 32 * int64_t(nblk), xb);
    slow = level_tile_2x<F>(xb, 32 * int64_t(nblk), rows, nblk, mode, out, ahead);
    bool fenced = !row_stream;  // the rows' streamed bytes, before scalar_block rewrites them
    for (int r = 0; r < rows; ++r) {
      for (int64_t j = b0; j < full; ++j) {
        if (!redo_from_x<F>(row_scales[r * nbk + j])) continue;
        if (!fenced) stream_fence(), fenced = true;
        simd256::scalar_block<F, In>(x + r * k + 32 * j, mode,
                                     row_data + r * sk + j * block_storage<F>(32),
                                     row_scales + r * nbk + j);
      }
    }
  }
  for (int r = 0; full < b1 && r < rows; ++r) {
    quantize_row<F, In>(x + r * k, k, full, b1, 32, mode, row_data + r * sk,
                        row_scales + r * nbk);
  }
  MXJAX_UNINITIALIZED_WARNINGS_ON
  if (col_stream && slow) stream_fence();  // the scalar path below rewrites streamed bytes
  for (; slow; slow &= slow - 1) {
    const int64_t c = c0 + 32 * __builtin_ctz(slow);
    quantize_cols<F, In>(x, k, rows, c, c + 32, 32, mode, col_data, col_scales);
  }
  const int64_t done = c0 + 32 * int64_t(nblk);
  if (done < c1) quantize_cols<F, In>(x, k, rows, done, c1, 32, mode, col_data, col_scales);
}
#endif

// One column tile (as quantize_cols): the SIMD level's bf16 / block-32 path where there is
// one (fetching the tiles `ahead`), quantize_cols otherwise.
template <class F, class In>
void col_tile(const typename In::T* x, int64_t ld, int rows, int64_t c0, int64_t c1, int block,
              int32_t mode, uint8_t* data, uint8_t* scales, bool stream,
              const cpu::TileAheadOf<typename In::T>& ahead) {
#ifdef MXJAX_HAVE_SIMD_ROWS
  if (block == 32) {
    constexpr int W = simd::kStripCols;
    const int strips = int((c1 - c0) / W);
    uint64_t scalar;
    if constexpr (std::is_same_v<In, BF16>) {
      scalar = col_strips_bf16<F>(x + c0, ld, rows, strips, mode, data + c0, ld, scales + c0,
                                  stream, ahead);
    } else {  // from RO(x) (bf16_odd.h): the strips it marks are those redo_from_x
      alignas(64) uint16_t xb[cpu::kTileRows * kUnitCols];
      tile_to_bf16_odd<In>(x + c0, ld, rows, int64_t(strips) * W, xb);
      scalar = col_strips_bf16<F>(xb, int64_t(strips) * W, rows, strips, mode, data + c0, ld,
                                  scales + c0, stream, ahead);
    }
    if (stream && scalar) stream_fence();  // the scalar path below rewrites streamed bytes
    for (; scalar; scalar &= scalar - 1) {
      const int64_t c = c0 + W * __builtin_ctzll(scalar);
      quantize_cols<F, In>(x, ld, rows, c, c + W, 32, mode, data, scales);
    }
    c0 += int64_t(strips) * W;
  }
#else
  (void)stream, (void)ahead;
#endif
  if (c0 < c1) quantize_cols<F, In>(x, ld, rows, c0, c1, block, mode, data, scales);
}

// Whether a column tile's strips may stream (col_strips_bf16): they then cover whole aligned
// lines, as tiles start at multiples of kUnitCols and storage rows are `ld` bytes.
bool col_stream(bool stream, int64_t ld, const uint8_t* data, const uint8_t* scales) {
  auto aligned = [](const uint8_t* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
  return stream && ld % 64 == 0 && aligned(data) && aligned(scales);
}

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
        row_out<F, In>(x + row * p.n, p.n, u % nb, b1, block, p.mode, p.data + row * storage,
                       p.scales + row * nb, p.stream);
        u += b1 - u % nb;
      }
      return;
    }
    const bool stream = col_stream(p.stream, p.inner, p.data, p.scales);
    const bool tiles = block == cpu::kTileRows;
    for (int64_t u = begin; u < end; ++u) {
      Tile t = tile_of(u, nb, p.inner);
      int rows = int(min64(p.block, p.n - t.j * p.block));
      col_tile<F, In>(x + (t.o * p.n + t.j * p.block) * p.inner, p.inner, rows, t.c0, t.c1,
                      block, p.mode,
                      p.data + (t.o * storage + t.j * block_storage<F>(block)) * p.inner,
                      p.scales + (t.o * nb + t.j) * p.inner, stream,
                      tiles ? tiles_ahead<T>(p.x, p.n, p.inner, u, end)
                            : cpu::TileAheadOf<T>{});
    }
  });
  if (p.stream) stream_fence();
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
    const bool stream = col_stream(p.stream, p.k, p.col_data, p.col_scales);
    for (int64_t u = begin; u < end; ++u) {
      // Both quantizations of one [block, kUnitCols] tile while it is in L1.
      Tile t = tile_of(u, nbm, p.k);
      int rows = int(min64(p.block, p.m - t.j * p.block));
      int64_t r0 = t.o * p.m + t.j * p.block;  // first row of the tile in [batch * m, k]
      uint8_t* cdata = p.col_data + (t.o * sm + t.j * block_storage<F>(block)) * p.k;
      uint8_t* cscales = p.col_scales + (t.o * nbm + t.j) * p.k;
#ifdef MXJAX_HAVE_SIMD_ROWS
      if (block == 32) {
        tile_2x_simd<F, In>(x + r0 * p.k, p.k, rows, t.c0, t.c1, p.mode, p.row_data + r0 * sk,
                            sk, p.row_scales + r0 * nbk, nbk, cdata, cscales, p.stream, stream,
                            tiles_ahead<T>(p.x, p.m, p.k, u, end));
        continue;
      }
#endif
      const int64_t b0 = t.c0 / block, b1 = ceil_div(t.c1, block);
      for (int r = 0; r < rows; ++r) {
        row_out<F, In>(x + (r0 + r) * p.k, p.k, b0, b1, block, p.mode, p.row_data + (r0 + r) * sk,
                       p.row_scales + (r0 + r) * nbk, p.stream);
      }
      col_tile<F, In>(x + r0 * p.k, p.k, rows, t.c0, t.c1, block, p.mode, cdata, cscales, stream,
                      {});
    }
  });
  if (p.stream) stream_fence();
}

// Dequantizes units [begin, end) of p; returns whether it wrote with streaming stores (to
// be fenced before anything reads them).
bool dequantize_units(const cpu::DequantizeProblem& p, int64_t begin, int64_t end) {
  return dispatch(p.format, p.dtype, [&](auto f, auto out_type) -> bool {
    using F = decltype(f);
    using Out = decltype(out_type);
    using T = typename Out::T;
    T* out = static_cast<T*>(p.out);
    const int64_t nb = ceil_div(p.n, p.block);
    const int64_t storage = ceil_div(p.n, F::group_codes) * F::group_bytes;
    const int block = int(p.block);
    // With p.stream, rows whose blocks are whole 64-byte lines (aligned) are written with
    // streaming stores (stream.h).
    const bool stream = p.stream;
    if (p.inner == 1) {
      for (int64_t u = begin; u < end;) {
        int64_t row = u / nb;
        int64_t b1 = min64(nb, u % nb + (end - u));
        int64_t b0 = u % nb;
#ifdef MXJAX_HAVE_SIMD_ROWS
        if (block == 32) {
          T* o = out + row * p.n;
          const bool aligned = reinterpret_cast<uintptr_t>(o) % 64 == 0;
          b0 = simd::dequantize_row_blocks<F, Out>(p.data + row * storage, p.scales + row * nb,
                                                   p.n, b0, b1, o, stream && aligned);
        }
#endif
        if (b0 < b1) {
          dequantize_row<F, Out>(p.data + row * storage, p.scales + row * nb, p.n, b0, b1, block,
                                 out + row * p.n);
        }
        u += b1 - u % nb;
      }
      return stream;
    }
    // Columnwise: the SIMD tiles stream whole lines where rows `inner` apart stay aligned.
    const bool stream_cols = stream && reinterpret_cast<uintptr_t>(out) % 64 == 0 &&
                            p.inner * int64_t(sizeof(T)) % 64 == 0;
    for (int64_t u = begin; u < end; ++u) {
      Tile t = tile_of(u, nb, p.inner);
      int rows = int(min64(p.block, p.n - t.j * p.block));
      const uint8_t* dt = p.data + (t.o * storage + t.j * block_storage<F>(block)) * p.inner;
      const uint8_t* st = p.scales + (t.o * nb + t.j) * p.inner;
      T* ot = out + (t.o * p.n + t.j * p.block) * p.inner;
#ifdef MXJAX_HAVE_SIMD_ROWS
      static_assert(kUnitCols <= simd256::kMaxTileCols);
      if (block == 32) {
        simd::dequantize_col_tile<F, Out>(dt, st, p.inner, rows, t.c0, t.c1, ot, stream_cols);
        continue;
      }
#endif
      dequantize_cols<F, Out>(dt, st, p.inner, rows, t.c0, t.c1, ot);
    }
    return stream_cols;
  });
}

void dequantize(const cpu::DequantizeProblem& p, int64_t begin, int64_t end) {
  if (dequantize_units(p, begin, end)) stream_fence();
}

// fake_quantize in runs of units: each run is quantized (quantize above, no streaming) into
// a scratch buffer of this thread, then dequantized from there while it is in L1 / L2. A
// rowwise run is at most kRowRun blocks of one row; a columnwise run the rest of a block row
// within [begin, end), its data rows `inner` apart in the scratch as in the output. The
// scratch stays for the next call up to kKeptScratch bytes (columns up to ~127k for FP8).
void fake_quantize(const cpu::FakeQuantizeProblem& p, int64_t begin, int64_t end) {
  constexpr int64_t kRowRun = 64;
  constexpr size_t kKeptScratch = size_t{4} << 20;
  const int64_t nb = ceil_div(p.n, p.block);
  const int64_t bs = with_format(p.format, [&](auto f) {
    return block_storage<decltype(f)>(p.block);
  });
  const int64_t xs = cpu::dtype_bytes(p.dtype), os = cpu::dtype_bytes(p.out_dtype);
  const auto* x = static_cast<const uint8_t*>(p.x);
  auto* out = static_cast<uint8_t*>(p.out);
  const int64_t run_cols = p.inner == 1 ? kRowRun : p.inner;  // scales per run, at most
  static thread_local std::vector<uint8_t> scratch;
  if (int64_t(scratch.size()) < (bs + 1) * run_cols) scratch.resize((bs + 1) * run_cols);
  uint8_t* data = scratch.data();
  uint8_t* scales = data + bs * run_cols;
  bool streamed = false;
  for (int64_t u = begin; u < end;) {
    int64_t first, n, inner, u0, u1;  // the run: units [u0, u1) of a [1, n, inner] problem
    if (p.inner == 1) {
      const int64_t row = u / nb, b0 = u % nb;
      const int64_t b1 = min64(min64(nb, b0 + (end - u)), b0 + kRowRun);
      first = row * p.n + b0 * p.block;
      n = min64(b1 * p.block, p.n) - b0 * p.block, inner = 1, u0 = 0, u1 = b1 - b0;
    } else {
      const int64_t ncc = ceil_div(p.inner, kUnitCols);
      const Tile t = tile_of(u, nb, p.inner);
      first = (t.o * p.n + t.j * p.block) * p.inner;
      n = min64(p.block, p.n - t.j * p.block), inner = p.inner;
      u0 = u % ncc, u1 = min64(ncc, u0 + (end - u));
    }
    const cpu::QuantizeProblem q{x + first * xs, p.dtype, p.format, p.mode, p.block, 1, n,
                                 inner, data, scales, false};
    quantize(q, u0, u1);
    const cpu::DequantizeProblem d{data, scales, p.out_dtype, p.format, p.block, 1, n, inner,
                                   out + first * os, p.stream};
    streamed |= dequantize_units(d, u0, u1);
    u += u1 - u0;
  }
  if (streamed) stream_fence();
  if (scratch.size() > kKeptScratch) std::vector<uint8_t>().swap(scratch);
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
                                &mxjax::dequantize, &mxjax::fake_quantize,
                                &MXJAX_CAT(block_kernels_, MXJAX_ISA_NS)()};
  return table;
}
