// AVX2 dequantize, block 32, to bf16 / f16 / f32 (every format): rowwise blocks and column
// tiles.
// Host only; included by kernels.cc in the TUs built with -mavx2 and -mavx512bw. Bit-exact
// with the templates of quantize.h, which do the blocks these leave (see below).
#ifndef MXJAX_CPU_SIMD256_DEQUANTIZE_H_
#define MXJAX_CPU_SIMD256_DEQUANTIZE_H_

#include <type_traits>

#include "simd256.h"
#include "stream.h"

#ifdef MXJAX_HAVE_SIMD256

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd256 {

// Element values have at most 4 significant bits, so decode(code) * 2^e is a
// bf16 whenever it is a normal number: its bits are those of decode(code) with e added to
// the exponent field. Blocks where some value could leave the normal range (by their scale
// byte), NaN scales and NaN / Inf codes go to the scalar path. decode(code): FP8 by integer
// ops (decode16), FP6 and FP4 by byte-shuffle table lookups (decode_fp6_block,
// decode_fp4_block).

// bf16 bits of decode(code) for a code of F that is no NaN / Inf (exact: element values have
// at most 4 significant bits; subnormals m * 2^(emin - man) normalized).
template <class F>
constexpr uint16_t decoded_bf16(int code) {
  const int mag = code & int(F::mag_mask), ef = mag >> F::man_bits;
  const int m = mag & ((1 << F::man_bits) - 1);
  int bits = 0;
  if (ef != 0) {
    bits = (ef + 127 - F::bias) << 7 | m << (7 - F::man_bits);
  } else if (m != 0) {
    int p = 0;  // floor(log2(m))
    while ((m >> (p + 1)) != 0) ++p;
    bits = (F::emin - F::man_bits + p + 127) << 7 | ((m << (7 - p)) & 0x7F);
  }
  return uint16_t(((code >> (F::bits - 1)) & 1) << 15 | bits);
}

// bf16 bits of the element subnormals m * 2^(emin - man) (m < 2^man), lo and hi bytes.
template <class F>
struct SubnormalTable {
  uint8_t lo[16] = {}, hi[16] = {};
  constexpr SubnormalTable() {
    for (int m = 1; m < (1 << F::man_bits); ++m) {
      lo[m] = uint8_t(decoded_bf16<F>(m));
      hi[m] = uint8_t(decoded_bf16<F>(m) >> 8);
    }
  }
};

// 16 codes (u16 lanes) -> bf16 bits of decode(code) * 2^e, e7 = e << 7 (every value normal).
template <class F>
inline __m256i decode16(__m256i c, __m256i e7) {
  static constexpr SubnormalTable<F> kSub{};
  const __m256i mag = _mm256_and_si256(c, set16(F::mag_mask));
  const __m256i normal = _mm256_add_epi16(_mm256_slli_epi16(mag, 7 - F::man_bits),
                                          set16((127 - F::bias) << 7));
  const __m256i sub = _mm256_or_si256(
      _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(kSub.lo))), mag),
      _mm256_slli_epi16(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(kSub.hi))), mag), 8));
  const __m256i is_sub = _mm256_cmpgt_epi16(set16(1 << F::man_bits), mag);
  const __m256i zero = _mm256_cmpeq_epi16(mag, _mm256_setzero_si256());
  __m256i v = _mm256_blendv_epi8(normal, sub, is_sub);
  v = _mm256_andnot_si256(zero, _mm256_add_epi16(v, e7));
  return _mm256_or_si256(v, _mm256_slli_epi16(_mm256_srli_epi16(c, F::bits - 1), 15));
}

// bf16 bits of decode(code) for the 16 FP4 codes (sign included).
struct Fp4Table {
  uint16_t bits[16] = {};
  constexpr Fp4Table() {
    for (int c = 0; c < 16; ++c) bits[c] = decoded_bf16<E2M1>(c);
  }
};

// FP4 block of 32 codes at src, scale 2^e (e7 = e << 7 in u16 lanes, every value normal) ->
// bf16 bits of elements 0-15 (*lo) and 16-31 (*hi). A table of decode(code) * 2^e (the
// exponent field moved by e but for the zeros) is looked up by the codes, its low and high
// bytes apart (_mm256_shuffle_epi8 indexes 16 bytes).
inline void decode_fp4_block(const uint8_t* src, __m256i e7, __m256i* lo, __m256i* hi) {
  static constexpr Fp4Table kTable{};
  const __m256i nonzero = _mm256_setr_epi16(0, -1, -1, -1, -1, -1, -1, -1, 0, -1, -1, -1, -1,
                                            -1, -1, -1);
  __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable.bits));
  t = _mm256_add_epi16(t, _mm256_and_si256(e7, nonzero));
  // 128-bit lane h: low bytes of entries 8h .. 8h + 7, then their high bytes
  t = _mm256_shuffle_epi8(t, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13,
                                              15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11,
                                              13, 15));
  const __m256i table_lo = _mm256_permute4x64_epi64(t, 0x88);  // entries 0-15, both lanes
  const __m256i table_hi = _mm256_permute4x64_epi64(t, 0xDD);
  // Code bytes: lane 0 codes 0-7, 16-23 (storage bytes 0-3, 8-11), lane 1 codes 8-15, 24-31.
  const __m256i b = _mm256_permutevar8x32_epi32(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))),
      _mm256_setr_epi32(0, 2, 0, 0, 1, 3, 1, 1));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i codes = _mm256_unpacklo_epi8(_mm256_and_si256(b, nibble),
                                             _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble));
  const __m256i vlo = _mm256_shuffle_epi8(table_lo, codes);
  const __m256i vhi = _mm256_shuffle_epi8(table_hi, codes);
  *lo = _mm256_unpacklo_epi8(vlo, vhi);
  *hi = _mm256_unpackhi_epi8(vlo, vhi);
}

// Byte tables of the bf16 bits of decode(m) for the 32 FP6 magnitudes m, for
// _mm256_shuffle_epi8 (16 entries): low bytes of m < 16 (lo0), and the xor of those of m and
// m + 16 (lo_x); the same for the high bytes. Lookups of m in lo0 and of m - 16 in lo_x
// (which gives 0 where m < 16: the index is negative) xor to the low byte of any m < 32.
template <class F>
struct Fp6Tables {
  uint8_t lo0[16] = {}, lo_x[16] = {}, hi0[16] = {}, hi_x[16] = {};
  constexpr Fp6Tables() {
    for (int m = 0; m < 16; ++m) {
      const int a = decoded_bf16<F>(m), b = decoded_bf16<F>(m + 16);
      lo0[m] = uint8_t(a);
      lo_x[m] = uint8_t(a ^ b);
      hi0[m] = uint8_t(a >> 8);
      hi_x[m] = uint8_t((a ^ b) >> 8);
    }
  }
};

// Where the packed codes of one FP6 / FP4 block lie (decode_fp6_block here, and
// simd512::load_codes): codes 0-15 are read from the 16 storage bytes at byte 0, codes
// 16-31 from those at byte kHalf<F> (FP6: 8, the last 16 of its 24), in both 128-bit lanes;
// u16 lane i gets the two bytes holding code i's first bit (bytes[2i], bytes[2i + 1]: a byte
// shuffle; 0x80: none), whose product with mul[i] (2^(16 - bits - bit offset)) has the code
// in its top bits.
template <class F>
constexpr int kHalf = F::bits == 6 ? 8 : 0;

template <class F>
struct CodeLayout {
  alignas(64) int8_t bytes[64] = {};
  alignas(64) uint16_t mul[32] = {};
  constexpr CodeLayout() {
    for (int i = 0; i < 32; ++i) {
      const int bit = F::bits * i, byte = bit / 8 - (i >= 16 ? kHalf<F> : 0);
      bytes[2 * i] = int8_t(byte);
      bytes[2 * i + 1] = int8_t(byte + 1 < 16 ? byte + 1 : 0x80);
      mul[i] = uint16_t(1 << (16 - F::bits - bit % 8));
    }
  }
};

// FP6 block of 32 codes at src (24 bytes), scale 2^e (e7 = e << 7 in u16 lanes, every value
// normal) -> bf16 bits of elements 0-15 (*lo) and 16-31 (*hi): the codes as bytes, in the
// order that _mm256_unpack*_epi8 turns back into element order (lane h: codes 8h .. 8h + 7,
// then 16 + 8h ..), looked up in Fp6Tables; e << 7 added to the nonzero magnitudes.
template <class F>
inline void decode_fp6_block(const uint8_t* src, __m256i e7, __m256i* lo, __m256i* hi) {
  static constexpr CodeLayout<F> kLayout{};
  static constexpr Fp6Tables<F> kTables{};
  __m256i w[2];  // codes 16i .. 16i + 15 in u16 lanes
  for (int i = 0; i < 2; ++i) {
    const __m256i b = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kHalf<F> * i)));
    w[i] = _mm256_shuffle_epi8(
        b, _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.bytes + 32 * i)));
    const __m256i mul = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.mul + 16 * i));
    w[i] = _mm256_srli_epi16(_mm256_mullo_epi16(w[i], mul), 16 - F::bits);
  }
  const __m256i codes = _mm256_packus_epi16(w[0], w[1]);
  const __m256i mag = _mm256_and_si256(codes, _mm256_set1_epi8(0x1F));
  const __m256i mag_hi = _mm256_sub_epi8(mag, _mm256_set1_epi8(16));
  const __m256i vlo = _mm256_xor_si256(_mm256_shuffle_epi8(byte_table(kTables.lo0), mag),
                                       _mm256_shuffle_epi8(byte_table(kTables.lo_x), mag_hi));
  __m256i vhi = _mm256_xor_si256(_mm256_shuffle_epi8(byte_table(kTables.hi0), mag),
                                 _mm256_shuffle_epi8(byte_table(kTables.hi_x), mag_hi));
  // sign: code bit 5 -> bit 7 of the high byte
  vhi = _mm256_or_si256(vhi, _mm256_and_si256(_mm256_slli_epi16(codes, 2),
                                              _mm256_set1_epi8(int8_t(0x80))));
  const __m256i v[2] = {_mm256_unpacklo_epi8(vlo, vhi), _mm256_unpackhi_epi8(vlo, vhi)};
  __m256i out[2];
  for (int i = 0; i < 2; ++i) {  // + e7 where the magnitude is nonzero (positive as int16)
    out[i] = _mm256_add_epi16(v[i], _mm256_sign_epi16(e7, _mm256_and_si256(v[i], set16(0x7FFF))));
  }
  *lo = out[0];
  *hi = out[1];
}

// Whether every value of a block with scale byte s is a normal bf16 (and s is not NaN).
template <class F>
constexpr bool dequantize_in_range(int s) {
  const int e = s - kE8M0Bias;
  return s != kE8M0NaN && e >= F::man_bits - F::emin - 126 && e <= 127 - F::emax;
}

// 16 bf16 (u16 lanes) -> out as bf16, f16 or f32 bits; `stream`: with streaming stores (out
// 32-byte aligned). f16: through f32 and F16C's conversion (RNE, f16's subnormals and
// overflow to Inf), as dequantize_row rounds the f32 value.
template <class Out>
inline void store16(__m256i v, typename Out::T* out, bool stream = false) {
  const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16);
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16);
  if constexpr (std::is_same_v<Out, F16>) {
    constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    store_vector(out, _mm256_set_m128i(_mm256_cvtps_ph(_mm256_castsi256_ps(hi), kRne),
                                       _mm256_cvtps_ph(_mm256_castsi256_ps(lo), kRne)),
                 stream);
  } else if constexpr (sizeof(typename Out::T) == 2) {
    store_vector(out, v, stream);
  } else {  // f32 bits: bf16 bits << 16
    store_vector(out, lo, stream);
    store_vector(out + 8, hi, stream);
  }
}

// Codes of 16 columns for the rows of storage group g (rows g * group_codes ...) of a column
// tile: codes[k] gets row g * group_codes + k (u16 lanes).
template <class F>
inline void load_col_group(const uint8_t* data, int64_t ld, __m256i* codes) {
  auto row = [&](int i) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + i * ld)));
  };
  if constexpr (F::bits == 8) {
    codes[0] = row(0);
  } else if constexpr (F::bits == 4) {
    const __m256i b = row(0);
    codes[0] = _mm256_and_si256(b, set16(15));
    codes[1] = _mm256_srli_epi16(b, 4);
  } else {  // w = b0 | b1 << 8 | b2 << 16 holds 4 codes of 6 bits
    const __m256i b0 = row(0), b1 = row(1), b2 = row(2);
    codes[0] = _mm256_and_si256(b0, set16(63));
    codes[1] = _mm256_or_si256(_mm256_srli_epi16(b0, 6),
                               _mm256_slli_epi16(_mm256_and_si256(b1, set16(15)), 2));
    codes[2] = _mm256_or_si256(_mm256_srli_epi16(b1, 4),
                               _mm256_slli_epi16(_mm256_and_si256(b2, set16(3)), 4));
    codes[3] = _mm256_srli_epi16(b2, 2);
  }
}

// What col_tile needs of a vector width: strips of kCols columns (u16 lanes), e7 (scale
// e << 7 per lane) from their scale bytes, the codes of a storage group (load_col_group),
// whether a vector of codes holds a NaN / Inf code, and the decode + store of one row
// (`stream`: with a streaming store).
struct ColStrip256 {
  static constexpr int kCols = 16;
  using Vec = __m256i;
  static Vec e7(const uint8_t* s) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    return _mm256_slli_epi16(_mm256_sub_epi16(b, set16(kE8M0Bias)), 7);
  }
  template <class F>
  static void load_group(const uint8_t* data, int64_t ld, Vec* codes) {
    load_col_group<F>(data, ld, codes);
  }
  template <class F>
  static bool special(Vec c) {  // magnitude above max_code
    const __m256i mag = _mm256_and_si256(c, set16(F::mag_mask));
    return !_mm256_testz_si256(_mm256_cmpgt_epi16(mag, set16(F::max_code)), set16(-1));
  }
  template <class F, class Out>
  static void decode_store(Vec c, Vec e7, typename Out::T* out, bool stream) {
    store16<Out>(decode16<F>(c, e7), out, stream);
  }
};

// Dequantizes columns [c0, c1) of a column tile (layout as in dequantize_cols: `rows` <= 32
// outputs per column, storage and outputs `ld` apart), c1 - c0 <= kMaxTileCols: strips of
// S::kCols columns row by row (rows `ld` apart alias in L1, so each output row is written in
// one go), then the scalar path for strips with a NaN / out-of-range scale or a NaN / Inf
// code and for the columns past the last strip. `stream`: the strips' rows go out with
// streaming stores (out and ld aligned to whole lines; 1.3-1.9x faster out of cache on a
// Zen 4, two threads).
constexpr int kMaxTileCols = 512;

template <class S, class F, class Out>
inline void col_tile(const uint8_t* data, const uint8_t* scales, int64_t ld, int rows,
                     int64_t c0, int64_t c1, typename Out::T* out, bool stream) {
  constexpr int W = S::kCols;
  const int strips = int((c1 - c0) / W);
  typename S::Vec e7[kMaxTileCols / W];
  uint32_t scalar[kMaxTileCols / W / 32 + 1] = {};
  for (int j = 0; j < strips; ++j) {
    const uint8_t* s = scales + c0 + W * j;
    bool ok = true;
    for (int c = 0; c < W; ++c) ok &= dequantize_in_range<F>(s[c]);
    if (!ok) scalar[j / 32] |= 1u << (j % 32);
    e7[j] = S::e7(s);
  }
  const int groups = (rows + F::group_codes - 1) / F::group_codes;
  for (int g = 0; g < groups; ++g) {
    for (int j = 0; j < strips; ++j) {
      const int64_t c = c0 + W * j;
      typename S::Vec codes[F::group_codes];
      S::template load_group<F>(data + g * F::group_bytes * ld + c, ld, codes);
      if constexpr (F::has_special) {
        if (S::template special<F>(codes[0])) scalar[j / 32] |= 1u << (j % 32);
      }
      for (int k = 0; k < F::group_codes && g * F::group_codes + k < rows; ++k) {
        S::template decode_store<F, Out>(codes[k], e7[j], out + (g * F::group_codes + k) * ld + c,
                                         stream);
      }
    }
  }
  const int64_t done = c0 + int64_t(W) * strips;
  bool rewrites = done < c1;  // the scalar path below may rewrite streamed lines
  for (uint32_t s : scalar) rewrites |= s != 0;
  if (stream && rewrites) stream_fence();
  for (int j = 0; j < strips; ++j) {
    if ((scalar[j / 32] >> (j % 32)) & 1) {
      dequantize_cols<F, Out>(data, scales, ld, rows, c0 + W * j, c0 + W * (j + 1), out);
    }
  }
  if (done < c1) dequantize_cols<F, Out>(data, scales, ld, rows, done, c1, out);
}

template <class F, class Out>
inline void dequantize_col_tile(const uint8_t* data, const uint8_t* scales, int64_t ld,
                                int rows, int64_t c0, int64_t c1, typename Out::T* out,
                                bool stream) {
  col_tile<ColStrip256, F, Out>(data, scales, ld, rows, c0, c1, out, stream);
}

// Dequantizes rowwise blocks [b0, b1) of a row of n outputs (bf16 / f32 bits) at out: the
// full blocks here, in rounds of 32 (those the scalar path must do are redone with
// dequantize_row after each round, out of the hot loop). `stream`: whole blocks go out with
// streaming stores (out 64-byte aligned: each block is whole lines). Returns the first
// block not done (the caller finishes [that, b1)).
template <class F, class Out>
inline int64_t dequantize_row_blocks(const uint8_t* data, const uint8_t* scales, int64_t n,
                                     int64_t b0, int64_t b1, typename Out::T* out, bool stream) {
  static_assert(sizeof(typename Out::T) == 2 || sizeof(typename Out::T) == 4);
  constexpr int64_t bs = block_storage<F>(32);
  const int64_t end = b1 < n / 32 ? b1 : n / 32;
  for (int64_t r = b0; r < end; r += 32) {
    const int nblk = int(min64(32, end - r));
    uint32_t scalar = 0;
    for (int i = 0; i < nblk; ++i) {
      const int64_t b = r + i;
      const uint8_t* src = data + b * bs;
      typename Out::T* dst = out + b * 32;
      const __m256i e7 = set16((int(scales[b]) - kE8M0Bias) * 128);
      scalar |= uint32_t(!dequantize_in_range<F>(scales[b])) << i;
      __m256i lo, hi;
      if constexpr (F::bits == 4) {
        decode_fp4_block(src, e7, &lo, &hi);
      } else if constexpr (F::bits == 6) {
        decode_fp6_block<F>(src, e7, &lo, &hi);
      } else {
        const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        if constexpr (F::has_special) {  // NaN / Inf codes: magnitude above max_code
          const __m256i mag = _mm256_and_si256(codes, _mm256_set1_epi8(int8_t(F::mag_mask)));
          scalar |= uint32_t(!_mm256_testz_si256(
                        _mm256_cmpeq_epi8(
                            _mm256_max_epu8(mag, _mm256_set1_epi8(int8_t(F::max_code + 1))), mag),
                        _mm256_set1_epi8(-1)))
                    << i;
        }
        lo = decode16<F>(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(codes)), e7);
        hi = decode16<F>(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(codes, 1)), e7);
      }
      store16<Out>(lo, dst, stream);
      store16<Out>(hi, dst + 16, stream);
    }
    if (stream && scalar != 0) stream_fence();  // the scalar path rewrites streamed lines
    for (; scalar != 0; scalar &= scalar - 1) {
      const int64_t b = r + __builtin_ctz(scalar);
      dequantize_row<F, Out>(data, scales, n, b, b + 1, 32, out);
    }
  }
  return b0 > end ? b0 : end;
}

}  // namespace simd256
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_HAVE_SIMD256
#endif  // MXJAX_CPU_SIMD256_DEQUANTIZE_H_
