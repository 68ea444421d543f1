// AVX-512 (F + BW) dequantize, block 32, to bf16 / f16 / f32 (every format): rowwise blocks, one
// 32-lane vector per block. Host only; included by kernels.cc in the TU built with
// -mavx512bw. Bit-exact with the templates of quantize.h, which do the blocks these leave
// (NaN / out-of-range scales, NaN / Inf codes: as simd256_dequantize.h).
//
// Codes go to u16 lanes; the bf16 bits of decode(code) come from one 32-entry word
// permute (_mm512_permutexvar_epi16) of a table, decode(code) * 2^e by an add of e << 7 to
// the exponent field of the nonzero lanes (every value is a normal bf16 in the blocks done
// here: dequantize_in_range).
#ifndef MXJAX_CPU_SIMD512_DEQUANTIZE_H_
#define MXJAX_CPU_SIMD512_DEQUANTIZE_H_

#include <type_traits>

#include "gcc_diagnostics.h"
#include "simd256_dequantize.h"
#include "simd512.h"
#include "stream.h"

#ifdef MXJAX_HAVE_SIMD512

MXJAX_UNINITIALIZED_WARNINGS_OFF

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd512 {

inline __m512i set16(int v) { return _mm512_set1_epi16(int16_t(v)); }

// bf16 bits of decode(i) for i < 32 read as a code of F (FP4: all 16 codes, sign included;
// FP6: the 32 magnitudes; FP8: magnitudes 0-31, the rest decoded by integer ops).
template <class F>
struct Table32 {
  alignas(64) uint16_t bits[32] = {};
  constexpr Table32() {
    for (int i = 0; i < 32 && i < (1 << F::bits); ++i) bits[i] = simd256::decoded_bf16<F>(i);
  }
};

// The 32 codes of one block in F's storage at src -> u16 lanes (code i in lane i, clean).
template <class F>
inline __m512i load_codes(const uint8_t* src) {
  if constexpr (F::bits == 8) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  } else {
    static constexpr simd256::CodeLayout<F> kLayout{};
    auto window = [&](int at) {  // 16 bytes at src + at, in both lanes of a 256-bit half
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at));
      return _mm256_broadcastsi128_si256(b);
    };
    __m512i b = _mm512_inserti64x4(_mm512_castsi256_si512(window(0)), window(simd256::kHalf<F>),
                                   1);
    b = _mm512_shuffle_epi8(b, _mm512_load_si512(kLayout.bytes));
    return _mm512_srli_epi16(_mm512_mullo_epi16(b, _mm512_load_si512(kLayout.mul)),
                             16 - F::bits);
  }
}

// 32 codes (u16 lanes) -> bf16 bits of decode(code) * 2^e, e7 = e << 7 per lane (every
// value normal, no NaN / Inf code).
template <class F>
inline __m512i decode32(__m512i c, __m512i e7) {
  static constexpr Table32<F> kTable{};
  const __m512i table = _mm512_load_si512(kTable.bits);
  __m512i v;
  if constexpr (F::bits == 8) {
    // magnitudes >= 32 are normal: mag's bits moved to the bf16 fields, exponent rebiased
    constexpr int c7 = 7 - F::man_bits;
    v = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(c, c7), set16(F::mag_mask << c7)),
                         set16((127 - F::bias) << 7));
    v = _mm512_mask_permutexvar_epi16(v, _mm512_testn_epi16_mask(c, set16(0x60)), c, table);
  } else {
    v = _mm512_permutexvar_epi16(c, table);  // the index's low 5 bits: FP4 code, FP6 magnitude
  }
  v = _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(c, set16(F::mag_mask)), v, e7);
  // v | (sign & 0x8000)
  return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(c, 16 - F::bits), set16(0x8000), 0xF8);
}

// 32 bf16 (u16 lanes) -> out as bf16, f16 or f32 bits (f16 as simd256::store16 makes it);
// `stream`: with streaming stores (out 64-byte aligned).
template <class Out>
inline void store32(__m512i v, typename Out::T* out, bool stream) {
  const __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16);
  const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16);
  if constexpr (std::is_same_v<Out, F16>) {
    constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i l = _mm512_cvtps_ph(_mm512_castsi512_ps(lo), kRne);
    const __m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(hi), kRne);
    store_vector(out, _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1), stream);
  } else if constexpr (sizeof(typename Out::T) == 2) {
    store_vector(out, v, stream);
  } else {  // f32 bits: bf16 bits << 16
    store_vector(out, lo, stream);
    store_vector(out + 16, hi, stream);
  }
}

// Which of the nblk (<= 32) blocks with scale bytes at s the scalar path must do (NaN or
// out-of-range scale): bit i for block i.
template <class F>
inline uint32_t scalar_blocks(const uint8_t* s, int nblk) {
  const __mmask32 live = nblk < 32 ? (1u << nblk) - 1 : ~0u;
  // (a masked load only for the last round of a row: they are slow across cache lines)
  const __m256i bytes = nblk == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s))
                                   : _mm256_maskz_loadu_epi8(live, s);
  const __m512i b = _mm512_cvtepu8_epi16(bytes);
  const int lo = kE8M0Bias + F::man_bits - F::emin - 126, hi = kE8M0Bias + 127 - F::emax;
  static_assert(simd256::dequantize_in_range<F>(lo) && !simd256::dequantize_in_range<F>(lo - 1));
  static_assert(simd256::dequantize_in_range<F>(hi) && !simd256::dequantize_in_range<F>(hi + 1));
  return live & ~(_mm512_cmpge_epu16_mask(b, set16(lo)) & _mm512_cmple_epu16_mask(b, set16(hi)));
}

// Dequantizes rowwise blocks [b0, b1) of a row (as simd256::dequantize_row_blocks, `stream`
// included).
template <class F, class Out>
inline int64_t dequantize_row_blocks(const uint8_t* data, const uint8_t* scales, int64_t n,
                                     int64_t b0, int64_t b1, typename Out::T* out, bool stream) {
  static_assert(sizeof(typename Out::T) == 2 || sizeof(typename Out::T) == 4);
  constexpr int64_t bs = block_storage<F>(32);
  const int64_t end = b1 < n / 32 ? b1 : n / 32;
  for (int64_t r = b0; r < end; r += 32) {
    const int nblk = int(min64(32, end - r));
    uint32_t scalar = scalar_blocks<F>(scales + r, nblk);
    for (int i = 0; i < nblk; ++i) {
      const int64_t b = r + i;
      const __m512i c = load_codes<F>(data + b * bs);
      if constexpr (F::has_special) {  // NaN / Inf codes: magnitude above max_code
        const __mmask32 special = _mm512_cmpgt_epu16_mask(
            _mm512_and_si512(c, set16(F::mag_mask)), set16(F::max_code));
        scalar |= uint32_t(special != 0) << i;
      }
      store32<Out>(decode32<F>(c, set16((int(scales[b]) - kE8M0Bias) * 128)), out + b * 32,
                   stream);
    }
    if (stream && scalar != 0) stream_fence();  // the scalar path rewrites streamed lines
    for (; scalar != 0; scalar &= scalar - 1) {
      const int64_t b = r + __builtin_ctz(scalar);
      dequantize_row<F, Out>(data, scales, n, b, b + 1, 32, out);
    }
  }
  return b0 > end ? b0 : end;
}

// simd256::col_tile's strips at AVX-512: 32 columns.
struct ColStrip512 {
  static constexpr int kCols = 32;
  using Vec = __m512i;
  static Vec e7(const uint8_t* s) {
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    return _mm512_slli_epi16(_mm512_sub_epi16(b, set16(kE8M0Bias)), 7);
  }
  // As simd256::load_col_group, for 32 columns.
  template <class F>
  static void load_group(const uint8_t* data, int64_t ld, Vec* codes) {
    auto row = [&](int i) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i * ld));
      return _mm512_cvtepu8_epi16(b);
    };
    if constexpr (F::bits == 8) {
      codes[0] = row(0);
    } else if constexpr (F::bits == 4) {
      const __m512i b = row(0);
      codes[0] = _mm512_and_si512(b, set16(15));
      codes[1] = _mm512_srli_epi16(b, 4);
    } else {  // w = b0 | b1 << 8 | b2 << 16 holds 4 codes of 6 bits; A | (B & C): 0xF8
      const __m512i b0 = row(0), b1 = row(1), b2 = row(2);
      codes[0] = _mm512_and_si512(b0, set16(63));
      codes[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b0, 6), _mm512_slli_epi16(b1, 2),
                                           set16(0x3C), 0xF8);
      codes[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b1, 4), _mm512_slli_epi16(b2, 4),
                                           set16(0x30), 0xF8);
      codes[3] = _mm512_srli_epi16(b2, 2);
    }
  }
  template <class F>
  static bool special(Vec c) {  // magnitude above max_code
    return _mm512_cmpgt_epu16_mask(_mm512_and_si512(c, set16(F::mag_mask)), set16(F::max_code));
  }
  template <class F, class Out>
  static void decode_store(Vec c, Vec e7, typename Out::T* out, bool stream) {
    store32<Out>(decode32<F>(c, e7), out, stream);
  }
};

template <class F, class Out>
inline void dequantize_col_tile(const uint8_t* data, const uint8_t* scales, int64_t ld,
                                int rows, int64_t c0, int64_t c1, typename Out::T* out,
                                bool stream) {
  simd256::col_tile<ColStrip512, F, Out>(data, scales, ld, rows, c0, c1, out, stream);
}

}  // namespace simd512
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

MXJAX_UNINITIALIZED_WARNINGS_ON

#endif  // MXJAX_HAVE_SIMD512
#endif  // MXJAX_CPU_SIMD512_DEQUANTIZE_H_
