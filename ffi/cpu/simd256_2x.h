// AVX2 quantize_2x of one bf16 / block-32 tile (up to 32 rows of a row-major [m, k], the
// columns of up to 16 whole blocks), in two passes over its rows. The first finds the rowwise
// scales (simd256.h's groups) and the column strips' amax from the same loads. The second
// loads each row once and encodes it twice, with its rowwise blocks' scales and with its
// strips' column scales: |x| and the signs are found once (and |x| plus the rounding biases,
// which depend on x alone: the compiler merges the two encodes' common subexpressions).
// Host only; bit-exact with quantize.h's templates, which do what this leaves (kernels.cc:
// the strips tile_2x returns, the ragged ends).
#ifndef MXJAX_CPU_SIMD256_2X_H_
#define MXJAX_CPU_SIMD256_2X_H_

#include "simd256_cols.h"

#if defined(MXJAX_HAVE_SIMD256)

#include <immintrin.h>

#include <cstdint>

#include "mxjax/quantize.h"
#include "stream.h"
#include "tile_2x.h"
#include "tile_ahead.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd256 {

using cpu::kTileBlocks;
using cpu::kTileRows;
using cpu::Tile2xOut;
using cpu::TileAheadOf;

// The codes of the 32 bf16 at x (a rowwise block, a row of a column strip) for the block's
// Scale rs (*rc) and for the strip's column Scales cs (*cc), as block_codes makes them.
template <class F, bool kSaturate>
inline void codes_2x(const uint16_t* x, const Scale& rs, const StripScale& cs, __m256i* rc,
                     __m256i* cc) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  const __m256i ax0 = _mm256_and_si256(x0, set16(0x7FFF));
  const __m256i ax1 = _mm256_and_si256(x1, set16(0x7FFF));
  __m256i r, c;
  if constexpr (F::bits == 8) {
    // One branch for both: a lane below either normal is below the larger one.
    const __m256i below = below_normal(ax0, ax1, _mm256_max_epu16(rs.normal, cs.lo.normal),
                                       _mm256_max_epu16(rs.normal, cs.hi.normal));
    r = encode32<F, kSaturate>(ax0, ax1, rs, rs, below);
    c = encode32<F, kSaturate>(ax0, ax1, cs.lo, cs.hi, below);
  } else {
    r = encode32<F, kSaturate>(ax0, ax1, rs);
    c = encode32<F, kSaturate>(ax0, ax1, cs.lo, cs.hi);
  }
  const __m256i sign = sign_bytes<F>(x0, x1);
  *rc = _mm256_or_si256(r, sign);
  *cc = _mm256_or_si256(c, sign);
}

// tile_2x's second pass (kSaturate: see encode16), with the first's rowwise groups (g[r][i]:
// blocks 8i.. of row r) and column Scales cs; kFull: a whole tile (kTileRows rows,
// kTileBlocks blocks). Per storage group of rows (F::group_codes) and block (FP4: pair of
// blocks, one rowwise store), each row's codes are stored rowwise at once and the group's
// column codes after its last row; the same lines of the tiles `ahead` fetched.
template <class F, bool kSaturate, bool kFull, class T>
void encode_tile_2x(const uint16_t* x, int64_t ld, int rows, int nblk, int32_t mode,
                    const Group (*g)[kTileBlocks / 8], const StripScale* cs, const Tile2xOut& o,
                    const TileAheadOf<T>& ahead) {
  constexpr int G = F::group_codes;
  constexpr int kStep = F::bits == 4 ? 2 : 1;
  constexpr int64_t bs = block_storage<F>(32);
  if (kFull) rows = kTileRows, nblk = kTileBlocks;
  // Local copies of o: the byte stores below may alias it (GCC would reload it every block).
  uint8_t* const row_data = o.row_data;
  uint8_t* const row_scales = o.row_scales;
  uint8_t* const col_data = o.col_data;
  const int64_t row_ld = o.row_ld, scale_ld = o.scale_ld, col_ld = o.col_ld;
  const bool row_stream = o.row_stream, col_stream = o.col_stream;
  alignas(64) uint8_t stage[G][kTileBlocks * bs];
  for (int r = 0; r < rows; r += G) {
    const int live = kFull || rows - r >= G ? G : rows - r;
    uint8_t* rout[G];
    for (int i = 0; i < G; ++i) {  // rows past the tile: none stored there
      rout[i] = row_stream || i >= live ? stage[i] : row_data + (r + i) * row_ld;
    }
    uint8_t* const cout = col_data + r / G * F::group_bytes * col_ld;
    for (int j = 0; j < nblk; j += kStep) {
      const int pair = kStep == 2 && j + 1 < nblk;
      __m256i cc[kStep][G];
      for (int i = 0; i < G; ++i) {
        if (i < live) {
          const uint16_t* xr = x + (r + i) * ld + 32 * j;
          for (int q = 0; q <= pair; ++q) cpu::fetch_ahead(ahead, r + i, 32 * (j + q));
          const GroupScales& gs = g[r + i][j / 8].scales;
          __m256i rc[kStep];
          for (int q = 0; q <= pair; ++q) {
            codes_2x<F, kSaturate>(xr + 32 * q, block_scale<F>(gs, j % 8 + q), cs[j + q], &rc[q],
                                   &cc[q][i]);
          }
          if (pair) {
            store_codes2<F>(rc[0], rc[kStep - 1], rout[i] + bs * j, false);
          } else {
            store_codes<F>(rc[0], rout[i] + bs * j, j + 1 < nblk);
          }
        } else {
          for (int q = 0; q < kStep; ++q) cc[q][i] = _mm256_setzero_si256();
        }
      }
      for (int q = 0; q <= pair; ++q) {
        store_strip_codes<F>(cc[q], cout + 32 * (j + q), col_ld, col_stream);
      }
    }
    for (int i = 0; i < live; ++i) {
      const uint16_t* xr = x + (r + i) * ld;
      for (int b = 0; b < nblk; b += 8) {
        for (int slow = g[r + i][b / 8].slow; slow; slow &= slow - 1) {
          const int j = b + __builtin_ctz(unsigned(slow));
          scalar_block<F>(xr + 32 * j, mode, rout[i] + bs * j, row_scales + (r + i) * scale_ld + j);
        }
      }
      if (row_stream) stream_copy(row_data + (r + i) * row_ld, stage[i], nblk * bs);
    }
  }
}

// Both quantizations of blocks [0, nblk) (nblk <= kTileBlocks, all full) of `rows` (<=
// kTileRows) rows `ld` apart at x, to o, fetching the tiles `ahead` in the second pass.
// Returns a bit per column strip that the scalar path must do (its scale bytes and data
// undefined); the rowwise blocks are all done.
template <class F, class T>
uint32_t tile_2x(const uint16_t* x, int64_t ld, int rows, int nblk, int32_t mode,
                 const Tile2xOut& o, const TileAheadOf<T>& ahead) {
  Group g[kTileRows][kTileBlocks / 8];
  Vec amax[kTileBlocks];
  for (int j = 0; j < nblk; ++j) amax[j] = Vec{};
  for (int r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * ld;
    for (int b = 0; b < nblk; b += 8) {
      prepare_group<F>(xr + 32 * b, nblk - b < 8 ? nblk - b : 8, mode,
                       o.row_scales + r * o.scale_ld + b, &g[r][b / 8], amax + b);
    }
  }
  StripScale cs[kTileBlocks];
  uint32_t slow = 0;
  for (int j = 0; j < nblk; ++j) {
    if (!strip_scales<F>(amax[j], mode, o.col_scales + 32 * j, &cs[j], o.col_stream)) {
      slow |= 1u << j;
    }
  }
  // Keeps the per-block broadcasts loads from g (see row_chunk).
  asm("" : "+m"(g));
  const bool full = rows == kTileRows && nblk == kTileBlocks;
  if (mode == kRceil) {
    (full ? encode_tile_2x<F, false, true, T> : encode_tile_2x<F, false, false, T>)(
        x, ld, rows, nblk, mode, g, cs, o, ahead);
  } else {
    (full ? encode_tile_2x<F, true, true, T> : encode_tile_2x<F, true, false, T>)(
        x, ld, rows, nblk, mode, g, cs, o, ahead);
  }
  return slow;
}

}  // namespace simd256
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_HAVE_SIMD256
#endif  // MXJAX_CPU_SIMD256_2X_H_
