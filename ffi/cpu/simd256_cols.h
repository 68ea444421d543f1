// AVX2 column strips of a column tile (bf16, block 32): 32 columns (two vectors of bf16, the
// columns of one rowwise block) each, every format. A tile is done in three passes over its
// rows (kernels.cc, col_strips_bf16): strip_amax, strip_scales, strip_encode; simd256_2x.h's
// quantize_2x tile uses the last two's parts. Host only; bit-exact with quantize.h's
// quantize_cols, which does the strips these do not (strip_scales says which).
#ifndef MXJAX_CPU_SIMD256_COLS_H_
#define MXJAX_CPU_SIMD256_COLS_H_

#include "simd256.h"

#if defined(MXJAX_HAVE_SIMD256)

#include <immintrin.h>

#include <cstdint>

#include "stream.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd256 {

constexpr int kStripCols = 32;

// The Scales of a strip's columns 0-15 (lo) and 16-31 (hi).
struct StripScale {
  Scale lo, hi;
};

// amax (u16 lanes) of a strip, updated with the 32 bf16 at x.
inline Vec strip_amax(Vec amax, const uint16_t* x) {
  const __m256i abs = set16(0x7FFF);
  const __m256i* p = reinterpret_cast<const __m256i*>(x);
  return {_mm256_max_epu16(amax.lo, _mm256_and_si256(_mm256_loadu_si256(p), abs)),
          _mm256_max_epu16(amax.hi, _mm256_and_si256(_mm256_loadu_si256(p + 1), abs))};
}

// The scale bytes of 16 columns from their amax (u16 lanes), in u16 lanes; sets their Scale
// (see encode16) and *slow (nonzero where a column needs the scalar path).
template <class F>
inline __m256i strip_half_scales(__m256i amax, int32_t mode, Scale* scale, int* slow) {
  __m256i elo, ehi;
  int slo, shi;
  auto f32 = [](__m128i a) { return _mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16); };
  const __m256i blo = scales8<F>(f32(_mm256_castsi256_si128(amax)), mode, &elo, &slo);
  const __m256i bhi = scales8<F>(f32(_mm256_extracti128_si256(amax, 1)), mode, &ehi, &shi);
  *scale = scale_of<F>(_mm256_permute4x64_epi64(_mm256_packs_epi32(elo, ehi), 0xD8));
  *slow = slo | shi;
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(blo, bhi), 0xD8);
}

// Stores the strip's 32 scale bytes (`stream`: with a streaming store) and sets its Scales;
// false where a block needs the scalar path.
template <class F>
inline bool strip_scales(Vec amax, int32_t mode, uint8_t* scales, StripScale* scale, bool stream) {
  int slo, shi;
  const __m256i blo = strip_half_scales<F>(amax.lo, mode, &scale->lo, &slo);
  const __m256i bhi = strip_half_scales<F>(amax.hi, mode, &scale->hi, &shi);
  store_vector(scales, _mm256_permute4x64_epi64(_mm256_packus_epi16(blo, bhi), 0xD8), stream);
  return (slo | shi) == 0;
}

// Stores a strip's codes of one storage group of rows (c[i]: row i's, bytes in block_codes'
// order) in F's group_bytes storage rows `dld` apart at out (`stream`: with streaming stores,
// out 32-byte aligned): combined across rows with byte-wise shifts (16-bit shifts, and a mask
// of the bits that crossed into the neighbouring byte), then put in column order.
template <class F>
inline void store_strip_codes(const __m256i* c, uint8_t* out, int64_t dld, bool stream) {
  auto store = [stream](__m256i v, uint8_t* o) {
    store_vector(o, _mm256_permute4x64_epi64(v, 0xD8), stream);
  };
  auto bytes = [](int m) { return _mm256_set1_epi8(int8_t(m)); };
  if constexpr (F::bits == 8) {
    store(c[0], out);
  } else if constexpr (F::bits == 4) {  // codes < 16: nothing crosses
    store(_mm256_or_si256(c[0], _mm256_slli_epi16(c[1], 4)), out);
  } else {  // c0 | c1 << 6 | c2 << 12 | c3 << 18 in three bytes (codes < 64)
    store(_mm256_or_si256(c[0], _mm256_and_si256(_mm256_slli_epi16(c[1], 6), bytes(0xC0))), out);
    store(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c[1], 2), bytes(0x0F)),
                          _mm256_and_si256(_mm256_slli_epi16(c[2], 4), bytes(0xF0))),
          out + dld);
    store(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c[2], 4), bytes(0x03)),
                          _mm256_slli_epi16(c[3], 2)),
          out + 2 * dld);
  }
}

// The strip's codes for one storage group of rows (F::group_codes rows `ld` apart at x, the
// rows from `rows` on are zero padding), with its Scales, stored as store_strip_codes does.
template <class F>
inline void strip_encode(const uint16_t* x, int64_t ld, int rows, const StripScale& s,
                         uint8_t* out, int64_t dld, bool stream) {
  __m256i c[F::group_codes];
  for (int i = 0; i < F::group_codes; ++i) {
    c[i] = i < rows ? block_codes<F, true>(x + i * ld, s.lo, s.hi) : _mm256_setzero_si256();
  }
  store_strip_codes<F>(c, out, dld, stream);
}

}  // namespace simd256
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_HAVE_SIMD256
#endif  // MXJAX_CPU_SIMD256_COLS_H_
