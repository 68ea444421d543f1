// f32 and f16 inputs for the bf16 fast paths: x narrowed to bf16 rounded to odd (its upper
// 16 bits, the lowest one set where any bit below them is), RO(x).
//
// Why the bf16 paths' bits are then x's own (kernels.cc redoes the other blocks from x):
// - RO never leaves x's binade and keeps it above, at or below any value with at most 7
//   fraction bits, so a block's amax gives the same scale byte (its exponent, and RCEIL's
//   comparison with max_sig); RO(x) is 0, NaN or Inf exactly where x is.
// - A block whose byte is at least min_byte (simd256_encode.h) has each element rounded
//   once, to a grid of spacing at least 2^(exp(x) - 3) (element fraction bits <= 3), whose
//   midpoints are even multiples of RO's spacing 2^(exp(x) - 7). An RO(x) that is not x is an
//   odd multiple strictly between the same two multiples of 2^(exp(x) - 6) as x, so it
//   rounds as x does (the classic round-to-odd argument, with 4 bits to spare).
// - An x below 2^-126 (f32 subnormal) with such a byte is below half the element's smallest
//   subnormal after scaling, and so is RO(x): both encode to a signed zero.
// - NaN / Inf blocks and blocks with smaller bytes are what kernels.cc redoes from x.
#ifndef MXJAX_CPU_BF16_ODD_H_
#define MXJAX_CPU_BF16_ODD_H_

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "mxjax/quantize.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// RO of one f32 (bits b).
inline uint16_t bf16_odd(uint32_t b) { return uint16_t((b >> 16) | ((b & 0xFFFFu) != 0)); }

#if defined(__AVX2__)
// RO of 8 f32 (bits) in u32 lanes.
inline __m256i bf16_odd8(__m256i b) {
  const __m256i sticky = _mm256_min_epu32(_mm256_and_si256(b, _mm256_set1_epi32(0xFFFF)),
                                          _mm256_set1_epi32(1));
  return _mm256_or_si256(_mm256_srli_epi32(b, 16), sticky);
}

// 8 inputs at x as f32 bits.
template <class In>
inline __m256i load8_f32(const typename In::T* x) {
  if constexpr (sizeof(typename In::T) == 4) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  } else {  // F16: exact in f32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
    return _mm256_castps_si256(_mm256_cvtph_ps(h));
  }
}
#endif

// n inputs (F32 or F16) at x -> their RO bf16 bits at out.
template <class In>
inline void to_bf16_odd(const typename In::T* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = bf16_odd8(load8_f32<In>(x + i)), hi = bf16_odd8(load8_f32<In>(x + i + 8));
    // packus: [lo 0-3, hi 0-3 | lo 4-7, hi 4-7] as u16; the permute puts them in order
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
  }
#endif
  for (; i < n; ++i) out[i] = bf16_odd(In::widen(x[i]));
}

// `rows` rows of `cols` inputs, rows `ld` apart at x -> RO bf16 rows `cols` apart at out.
template <class In>
inline void tile_to_bf16_odd(const typename In::T* x, int64_t ld, int rows, int64_t cols,
                             uint16_t* out) {
  for (int r = 0; r < rows; ++r) to_bf16_odd<In>(x + r * ld, cols, out + r * cols);
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CPU_BF16_ODD_H_
