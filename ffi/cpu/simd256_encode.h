// AVX2 element encoders for bf16 inputs (16 lanes of 16 bits) and the scale bytes of 8 blocks
// from their amax: the parts of simd256.h's rowwise and columnwise quantize that compute.
// Bit-exact with quantize.h's templates for the blocks they take (scales8 marks the others).
//
// Elements are encoded from the bf16 bits: with e the block's exponent and k = bias - (e +
// 127), v = |x| * 2^-e has the bits of |x| with its exponent field lowered by e, and the
// element's biased exponent of v is exp(x) + k. `normal` below is the bf16 bits of 2^(emin +
// e), the smallest |x| that is an element normal; it is a normal bf16 for every byte the
// encoders take (min_byte).
#ifndef MXJAX_CPU_SIMD256_ENCODE_H_
#define MXJAX_CPU_SIMD256_ENCODE_H_

#if defined(__AVX2__)

#include <immintrin.h>

#include <cstdint>

#include "mxjax/quantize.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd256 {

inline __m256i set16(int v) { return _mm256_set1_epi16(int16_t(v)); }
inline __m256i set32(int32_t v) { return _mm256_set1_epi32(v); }

// Whether F's codes come from sub_index16's index and byte tables (FP4, FP6 E3M2; the others
// round with encode16_normal / encode16, E2M3's subnormals having too many rounding
// intervals for the tables).
template <class F>
constexpr bool table_codes() {
  return F::man_bits <= 2 && F::bits <= 6;
}

// The smallest scale byte this file's encoders take (k = bias - byte <= -(man + 1)): x is a
// normal bf16 wherever v is an element normal, a zero or bf16-subnormal x encodes to 0 in
// encode16 (its w is at most 2^(k + man - 1) * (2 - 2^-7) < 1/2), and where table_codes, the
// lowest binade sub_index16 counts in, 2^(emin + e - man - 1), is a normal bf16.
template <class F>
constexpr int32_t min_byte() {
  return F::bias + F::man_bits + 1;
}

// A 16-entry byte table in both 128-bit lanes (for _mm256_shuffle_epi8 with indices < 16).
inline __m256i byte_table(const uint8_t (&t)[16]) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}

// What the encoders need of the scales of a vector's lanes (u16 lanes):
struct Scale {
  __m256i normal;  // bf16 bits of 2^(emin + e)
  __m256i offset;  // normal_codes16: normal - 128 - (2^(6 - man) - 1)
  __m256i base;    // sub_index16: normal - sub_index_below
  __m256i sub;     // encode16: (k + man + 126) << 7
};

// sub_index16's base below normal: the index counts steps of 32 from the bottom of the
// binade 2^(emin + e - man - 1), less the rounding bias 31.
template <class F>
constexpr int sub_index_below() {
  return 128 * (F::man_bits + 1) + 31;
}

// Scale's fields for scale bytes `byte` in 16-bit lanes (or in both halves of 32-bit ones):
// normal = (byte + 1 - bias) << 7, the exponent field of 2^(emin + e) being byte + 1 - bias;
// the others from it, and sub = (bias + man + 126 - byte) << 7.
template <class F>
inline void set_fields(__m256i byte, Scale* s) {
  const __m256i b7 = _mm256_slli_epi16(byte, 7);
  const int normal = (1 - F::bias) * 128;
  s->normal = _mm256_add_epi16(b7, set16(normal));
  s->offset = _mm256_add_epi16(b7, set16(normal - 128 - ((1 << (6 - F::man_bits)) - 1)));
  s->base = _mm256_add_epi16(b7, set16(normal - sub_index_below<F>()));
  s->sub = _mm256_sub_epi16(set16((F::bias + F::man_bits + 126) * 128), b7);
}

// The Scale of 16 lanes from their scale bytes (i16 lanes).
template <class F>
inline Scale scale_of(__m256i byte16) {
  Scale s;
  set_fields<F>(byte16, &s);
  return s;
}

// 16 |x| (bf16 bits ax) -> 16 magnitude codes in u16 lanes, for the scales s. With j =
// max(0, exponent(v) - emin), code = (j << man) + RNE(v * 2^(man - emin - j)), the second
// term in [0, 2^(man + 1)] (j = 0: the element subnormals; j > 0: the normals, whose rounding
// may carry into the exponent). v * 2^(man - emin - j) is x with its exponent lowered by j
// (j << 7 = ax - normal, whole binades, where ax >= normal) and raised by k + man + 126 (an
// add to the bf16 bits): exact as an f32 where its exponent field stays positive (below, the
// code is 0, and so is the conversion of the tiny, negative or NaN f32 the add makes there,
// through the unsigned saturation of the pack), rounded to an integer by the float -> int
// conversion (round to nearest even). kSaturate: clamp to max_code (RCEIL scales never need
// it: their v <= max).
template <class F, bool kSaturate>
inline __m256i encode16(__m256i ax, const Scale& s) {
  constexpr int c = 7 - F::man_bits;
  const __m256i j7 = _mm256_and_si256(_mm256_subs_epu16(ax, s.normal), set16(0xFF80));
  const __m256i w = _mm256_sub_epi16(_mm256_add_epi16(ax, s.sub), j7);
  const __m256i z = _mm256_setzero_si256();
  const __m256i lo = _mm256_cvtps_epi32(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w)));
  const __m256i hi = _mm256_cvtps_epi32(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w)));
  const __m256i code = _mm256_add_epi16(_mm256_packus_epi32(lo, hi), _mm256_srli_epi16(j7, c));
  return kSaturate ? _mm256_min_epu16(code, set16(F::max_code)) : code;
}

// The normals' codes of 16 |x| (bf16 bits ax) in u16 lanes: m = ax - normal + 128 is v's
// bits in a bf16-like layout with the element's exponent field, rounded to nearest even by
// integer adds and a shift (the carry goes into the exponent). Exact where ax >= normal;
// below, a code no larger than the element's (zero lanes: 0). Not saturated.
template <class F>
inline __m256i normal_codes16(__m256i ax, const Scale& s) {
  constexpr int c = 7 - F::man_bits;
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(ax, c), set16(1));
  // ax + odd is x's alone (shared by the encodes of one x with different scales)
  return _mm256_srli_epi16(_mm256_subs_epu16(_mm256_add_epi16(ax, odd), s.offset), c);
}

// encode16 where no lane of ax is in (0, normal) (FP8's common case: no element subnormals).
template <class F, bool kSaturate>
inline __m256i encode16_normal(__m256i ax, const Scale& s) {
  const __m256i code = normal_codes16<F>(ax, s);
  return kSaturate ? _mm256_min_epu16(code, set16(F::max_code)) : code;
}

// The index of 16 |x| (bf16 bits ax) among the rounding intervals of the element values
// below 2^(emin + e) (FP4: all of them), i16 lanes (table_codes): (ax + t - base) >> 5, in
// steps of 32 bits of |x| (a half of the finest grid spacing there, so the element's
// rounding boundaries fall on whole steps), t = bit 6 of ax the rounding bias of ties (the
// ties that round up are those whose grid point below has an odd code, where bit 6 is set).
// Negative below the lowest interval (code 0 there).
template <class F>
inline __m256i sub_index16(__m256i ax, const Scale& s) {
  const __m256i tie = _mm256_and_si256(_mm256_srli_epi16(ax, 6), set16(1));
  return _mm256_srai_epi16(_mm256_sub_epi16(_mm256_add_epi16(ax, tie), s.base), 5);
}

// The codes of the element subnormals (and of values that round to 2^(emin + e)) from
// sub_index16's indices, bytes in the order of _mm256_packs_epi16(i0, i1) (i8 saturated;
// negative indices give 0); no larger than the element's code elsewhere (E3M2: at most 4
// there). FP4: every code (no normal path), by a 32-entry table: the second half's lookup
// from index 16, and the max of the two halves' (the entries rise with the index).
template <class F>
inline __m256i sub_codes32(__m256i i0, __m256i i1) {
  const __m256i index = _mm256_packs_epi16(i0, i1);
  if constexpr (F::bits == 4) {
    static constexpr uint8_t kLo[16] = {0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5};
    static constexpr uint8_t kHi[16] = {6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
    return _mm256_max_epu8(
        _mm256_shuffle_epi8(byte_table(kLo), index),
        _mm256_shuffle_epi8(byte_table(kHi), _mm256_subs_epi8(index, _mm256_set1_epi8(16))));
  } else {
    static_assert(F::man_bits == 2);
    static constexpr uint8_t kCodes[16] = {0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 4};
    return _mm256_shuffle_epi8(byte_table(kCodes), index);
  }
}

// Nonzero where a lane of ax (either vector) is in (0, normal): encode16_normal does not do it.
inline __m256i below_normal(__m256i ax0, __m256i ax1, __m256i normal) {
  const __m256i one = set16(1);
  const __m256i low = _mm256_min_epu16(_mm256_sub_epi16(ax0, one), _mm256_sub_epi16(ax1, one));
  return _mm256_subs_epu16(_mm256_sub_epi16(normal, one), low);
}

// below_normal where the lanes of ax0 and ax1 have their own thresholds normal0, normal1:
// min(ax, normal - ax) (saturating) is nonzero exactly there.
inline __m256i below_normal(__m256i ax0, __m256i ax1, __m256i normal0, __m256i normal1) {
  return _mm256_or_si256(_mm256_min_epu16(ax0, _mm256_subs_epu16(normal0, ax0)),
                         _mm256_min_epu16(ax1, _mm256_subs_epu16(normal1, ax1)));
}

// The magnitude codes of two vectors of 16 lanes (ax0 with the scales s0, ax1 with s1), bytes
// in the order of _mm256_packus_epi16(c0, c1): FP4 by sub_codes32; FP6 E3M2 the max of
// normal_codes16's and sub_codes32's; FP8 by encode16_normal where `below` (below_normal) is
// zero (a predictable branch); else (and E2M3) encode16. The compiler drops `below` where F
// does not use it.
template <class F, bool kSaturate>
inline __m256i encode32(__m256i ax0, __m256i ax1, const Scale& s0, const Scale& s1,
                        __m256i below) {
  if constexpr (table_codes<F>()) {
    __m256i code = sub_codes32<F>(sub_index16<F>(ax0, s0), sub_index16<F>(ax1, s1));
    if constexpr (F::bits == 6) {
      // the normal path's codes are below 2^8 (v < 2^(emax + 1))
      code = _mm256_max_epu8(code, _mm256_packus_epi16(normal_codes16<F>(ax0, s0),
                                                       normal_codes16<F>(ax1, s1)));
      if (kSaturate) code = _mm256_min_epu8(code, _mm256_set1_epi8(int8_t(F::max_code)));
    }
    return code;
  } else {
    __m256i c0, c1;
    if (F::bits == 8 && __builtin_expect(_mm256_testz_si256(below, below), 1)) {
      c0 = encode16_normal<F, kSaturate>(ax0, s0);
      c1 = encode16_normal<F, kSaturate>(ax1, s1);
    } else {
      c0 = encode16<F, kSaturate>(ax0, s0);
      c1 = encode16<F, kSaturate>(ax1, s1);
    }
    return _mm256_packus_epi16(c0, c1);
  }
}

// encode32 for one block (one scale for both vectors).
template <class F, bool kSaturate>
inline __m256i encode32(__m256i ax0, __m256i ax1, const Scale& s) {
  return encode32<F, kSaturate>(ax0, ax1, s, s, below_normal(ax0, ax1, s.normal));
}

// encode32 for 32 columns of a row (columns 0-15 with the scales s0, 16-31 with s1).
template <class F, bool kSaturate>
inline __m256i encode32(__m256i ax0, __m256i ax1, const Scale& s0, const Scale& s1) {
  return encode32<F, kSaturate>(ax0, ax1, s0, s1, below_normal(ax0, ax1, s0.normal, s1.normal));
}

// Scale bytes of 8 blocks from their amax (f32 bits, u32 lanes), in i32 lanes: exponent
// field - emax (+1 for RCEIL where the significand is above max's: adding 2^24 - 1 - max_sig
// carries into the exponent field exactly then); at most 253 for a finite amax, below
// min_byte for the tiny ones, negative for zero blocks (a saturating pack stores their 0).
// *enc gets the bytes the encoders use, max(byte, min_byte) (zero blocks: any byte the
// encoders take encodes zeros as zero). Returns in *slow a bit per block that the scalar
// path must do (NaN / Inf, or nonzero with byte < min_byte), whose bytes are undefined.
template <class F>
inline __m256i scales8(__m256i a, int32_t mode, __m256i* enc, int* slow) {
  const int32_t round = (mode == kRceil ? 0xFFFFFF - int32_t(F::max_sig) : 0) - (F::emax << 23);
  const __m256i byte = _mm256_srai_epi32(_mm256_add_epi32(a, set32(round)), 23);
  const __m256i zero = _mm256_cmpeq_epi32(a, _mm256_setzero_si256());
  const __m256i nan = _mm256_cmpgt_epi32(a, set32(int32_t(kF32Inf) - 1));  // a < 2^31
  const __m256i tiny = _mm256_sub_epi32(byte, set32(min_byte<F>()));  // sign bit
  *slow = _mm256_movemask_ps(
      _mm256_castsi256_ps(_mm256_or_si256(nan, _mm256_andnot_si256(zero, tiny))));
  *enc = _mm256_max_epi32(byte, set32(min_byte<F>()));
  return byte;
}

}  // namespace simd256
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // __AVX2__
#endif  // MXJAX_CPU_SIMD256_ENCODE_H_
