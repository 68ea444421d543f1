// AVX-512 quantize_2x of one bf16 / block-32 tile (up to 32 rows of a row-major [m, k], the
// columns of up to 16 whole blocks), in two passes over its rows, as simd256_2x.h. The first
// finds the rowwise scales (simd512.h's amax16, scales16) and the column strips' amax from
// the same loads. The second loads each row once and encodes it twice (encode32), with its
// rowwise blocks' scales and with its strips' column scales: |x|, the signs and the rounding
// bits depend on x alone, and the compiler merges the two encodes' common subexpressions.
// Host only; bit-exact with quantize.h's templates, which do what this leaves (kernels.cc:
// the strips tile_2x returns, the ragged ends). kernels.cc's level_tile_2x takes it for FP8
// (FP4 / FP6 measured faster with simd256_2x.h's tile on a Zen 4).
#ifndef MXJAX_CPU_SIMD512_2X_H_
#define MXJAX_CPU_SIMD512_2X_H_

#include "simd512.h"

#if defined(MXJAX_HAVE_SIMD512)

#include <immintrin.h>

#include <cstdint>

#include "mxjax/quantize.h"
#include "stream.h"
#include "tile_2x.h"
#include "tile_ahead.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd512 {

using cpu::kTileBlocks;
using cpu::kTileRows;
using cpu::Tile2xOut;
using cpu::TileAheadOf;

// tile_2x's second pass, with the first's rowwise Scale biases (bias[r][j]: block j of row r,
// see block_biases) and scalar-path blocks (slow[r], bit j), and the strips' Scales cs. Per
// storage group of rows and kPackBlocks<F> blocks: each row's blocks encoded with both
// scales, its rowwise codes stored at once, the strips' codes once the group's rows are done;
// the same lines of the tiles `ahead` fetched.
template <class F, class T>
void encode_tile_2x(const uint16_t* x, int64_t ld, int rows, int nblk, int32_t mode,
                    const int32_t (*bias)[kTileBlocks], const uint16_t* slow, const Scale* cs,
                    // copies: the byte stores may alias a reference's
                    const Tile2xOut o, const TileAheadOf<T> ahead) {
  constexpr int G = F::group_codes;
  constexpr int P = kPackBlocks<F>;
  constexpr int64_t bs = block_storage<F>(32);
  alignas(64) uint8_t stage[G][kTileBlocks * bs];
  for (int r = 0; r < rows; r += G) {
    const int live = rows - r < G ? rows - r : G;
    uint8_t* rout[G];
    for (int i = 0; i < live; ++i) {
      rout[i] = o.row_stream ? stage[i] : o.row_data + (r + i) * o.row_ld;
    }
    uint8_t* cout = o.col_data + r / G * F::group_bytes * o.col_ld;
    // Blocks [j, j + nb) (nb <= P); always inlined, so that nb == P unrolls.
    auto chunk = [&](int j, int nb) __attribute__((always_inline)) {
      __m512i cc[P][G];  // strip j + q's codes of row r + i
      for (int i = 0; i < G; ++i) {
        if (i >= live) {  // zero padding of the last storage group
          for (int q = 0; q < P; ++q) cc[q][i] = _mm512_setzero_si512();
          continue;
        }
        const uint16_t* xr = x + (r + i) * ld + 32 * j;
        for (int q = 0; q < nb; ++q) cpu::fetch_ahead(ahead, r + i, 32 * (j + q));
        __m512i rc[P];
        constexpr int16_t kNormal = 1 << F::man_bits;
        __m512i lowest = _mm512_set1_epi16(kNormal);  // encode32_normal's min r
        auto encode = [&](bool normal) __attribute__((always_inline)) {
          for (int q = 0; q < P; ++q) {
            const int b = q < nb ? q : 0;  // past nb: any block (not stored)
            const __m512i v = _mm512_loadu_si512(xr + 32 * b);
            const Scale s{_mm512_set1_epi32(bias[r + i][j + b])};
            if (normal) {
              __m512i lr, lc;
              rc[q] = encode32_normal<F>(v, s, &lr);
              cc[q][i] = encode32_normal<F>(v, cs[j + b], &lc);
              const __m512i ax = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
              lowest = _mm512_mask_min_epi16(lowest, _mm512_test_epi16_mask(ax, ax), lowest,
                                             _mm512_min_epi16(lr, lc));
            } else {
              rc[q] = encode32<F>(v, s);
              cc[q][i] = encode32<F>(v, cs[j + b]);
            }
          }
        };
        // FP8: encode32_normal, whose codes are all right but in rare chunks (one test for
        // the chunk's vectors); encode32 for those and other formats.
        encode(F::bits == 8);
        if (F::bits == 8 && _mm512_cmplt_epi16_mask(lowest, _mm512_set1_epi16(kNormal))) {
          encode(false);
        }
        store_blocks<F>(rc, nb, rout[i] + bs * j);
      }
      for (int q = 0; q < nb; ++q) {
        store_strip_codes<F>(cc[q], cout + 32 * (j + q), o.col_ld, o.col_stream);
      }
    };
    int j = 0;
    for (; j + P <= nblk; j += P) chunk(j, P);
    if (j < nblk) chunk(j, nblk - j);
    for (int i = 0; i < live; ++i) {
      for (unsigned s = slow[r + i]; s; s &= s - 1) {
        const int b = __builtin_ctz(s);
        simd256::scalar_block<F>(x + (r + i) * ld + 32 * b, mode, rout[i] + bs * b,
                                 o.row_scales + (r + i) * o.scale_ld + b);
      }
      if (o.row_stream) stream_copy(o.row_data + (r + i) * o.row_ld, stage[i], nblk * bs);
    }
  }
}

// tile_2x's first pass over rows [0, rows): each row's scale bytes (to o), Scale biases
// (bias[r]) and scalar-path blocks (slow[r], bit j), the column strips' amax (amax[j], u16
// lanes). Always inlined, so that the common nblk == kTileBlocks unrolls.
template <class F>
__attribute__((always_inline)) inline void scan_rows(const uint16_t* x, int64_t ld, int rows,
                                                     int nblk, int32_t mode, const Tile2xOut& o,
                                                     int32_t (*bias)[kTileBlocks],
                                                     uint16_t* slow, __m512i* amax) {
  for (int j = 0; j < nblk; ++j) amax[j] = _mm512_setzero_si512();
  for (int r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * ld;
    __m512i k;
    __mmask16 s;
    const __m512i byte = scales16<F>(amax16(xr, nblk, amax), mode, &k, &s);
    store_scale_bytes(byte, nblk, o.row_scales + r * o.scale_ld);
    _mm512_store_si512(bias[r], block_biases<F>(k));
    slow[r] = uint16_t(s);  // blocks past nblk: amax 0, never slow
  }
}

// Both quantizations of blocks [0, nblk) (nblk <= kTileBlocks, all full) of `rows` (<=
// kTileRows) rows `ld` apart at x, to o, fetching the tiles `ahead` in the second pass (where
// memory would idle otherwise: from the first, the FP8 tile ran 12-15% slower out of cache
// on a Zen 4 once its encodes got faster). Returns a bit per column strip that the scalar
// path must do (its scale bytes and data undefined); the rowwise blocks are all done.
template <class F, class T>
uint32_t tile_2x(const uint16_t* x, int64_t ld, int rows, int nblk, int32_t mode,
                 const Tile2xOut& o, const TileAheadOf<T>& ahead) {
  alignas(64) int32_t bias[kTileRows][kTileBlocks];
  uint16_t slow[kTileRows];
  __m512i amax[kTileBlocks];
  if (nblk == kTileBlocks) {
    scan_rows<F>(x, ld, rows, kTileBlocks, mode, o, bias, slow, amax);
  } else {
    scan_rows<F>(x, ld, rows, nblk, mode, o, bias, slow, amax);
  }
  Scale cs[kTileBlocks];
  uint32_t slow_strips = 0;
  for (int j = 0; j < nblk; ++j) {
    if (!strip_scales<F>(amax[j], mode, o.col_scales + 32 * j, &cs[j], o.col_stream)) {
      slow_strips |= 1u << j;
    }
  }
  // Keeps the per-block broadcasts loads from bias (see simd256::row_groups).
  asm("" : "+m"(bias));
  encode_tile_2x<F>(x, ld, rows, nblk, mode, bias, slow, cs, o, ahead);
  return slow_strips;
}

}  // namespace simd512
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_HAVE_SIMD512
#endif  // MXJAX_CPU_SIMD512_2X_H_
