// AVX2 fast paths for bf16 inputs, block 32: quantize in rowwise groups of up to 8 blocks
// and in 16-column strips of a column tile (every format); simd256_dequantize.h has the
// dequantize. Host only; included by kernels.cc in the TUs built with -mavx2 and -mavx512bw
// (which quantizes with simd512.h, and uses the byte packers here). Bit-exact with the
// templates of quantize.h, which handle what these do not (other dtypes / blocks, NaN / Inf
// blocks, blocks with tiny scales); the encoding (encode16) is simd512.h's.
#ifndef MXJAX_CPU_SIMD256_H_
#define MXJAX_CPU_SIMD256_H_

#if defined(__AVX2__)
#define MXJAX_HAVE_SIMD256 1

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "mxjax/quantize.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd256 {

// k (= bias - scale byte) for an all-zero block: drives every code to zero (sign kept).
constexpr int16_t kZeroBlockK = -256;

inline __m256i set16(int v) { return _mm256_set1_epi16(int16_t(v)); }
inline __m256i set32(int32_t v) { return _mm256_set1_epi32(v); }

// A 16-entry byte table in both 128-bit lanes (for _mm256_shuffle_epi8 with indices < 16).
inline __m256i byte_table(const uint8_t (&t)[16]) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}

// What encode16 needs of the scales of a vector's lanes (k = bias - scale byte per lane):
// `normal` = the bf16 bits of 2^(emin + e), the smallest |x| that is an element normal (u16
// lanes), and `sub_lo` / `sub_hi` = 2^(k + man + 126) = 2^(man - emin - e) in f32 lanes in
// the order of _mm256_unpacklo / hi_epi16 (lanes 0-3 and 8-11 / 4-7 and 12-15).
struct Scale {
  __m256i normal;
  __m256 sub_lo, sub_hi;
};

// 2^(k + man + 126) as f32 for k in i32 lanes (clamped to a normal f32 for zero blocks).
template <class F>
inline __m256 subnormal_mul(__m256i k) {
  const __m256i e = _mm256_max_epi32(_mm256_add_epi32(k, set32(F::man_bits + 253)), set32(1));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}

// bf16 bits of 2^(emin + e) = 2^(-126 - k) for k in 16-bit lanes (or the low half of 32-bit
// ones): exponent field 1 - k. Zero blocks (kZeroBlockK) get 0x8080, above every finite |x|.
inline __m256i normal_bits(__m256i k) { return _mm256_slli_epi16(_mm256_sub_epi16(set16(1), k), 7); }

template <class F>
inline Scale scale_of(__m256i k16) {
  return {normal_bits(k16),
          subnormal_mul<F>(_mm256_srai_epi32(_mm256_unpacklo_epi16(k16, k16), 16)),
          subnormal_mul<F>(_mm256_srai_epi32(_mm256_unpackhi_epi16(k16, k16), 16))};
}

// 16 |x| (bf16 bits ax) -> 16 magnitude codes in u16 lanes, for the scales s. With v = |x| *
// 2^-e and j = max(0, exponent(v) - emin), code = (j << man) + RNE(v * 2^(man - emin - j)),
// the second term in [0, 2^(man + 1)] (j = 0: the element subnormals, the rest: the normals,
// whose rounding may carry into the exponent). v * 2^(man - emin - j) is x with its exponent
// lowered by j (j << 7 = ax - normal, in whole binades, where ax >= normal), times
// 2^(k + man + 126): exact in f32 (underflow only where the code is 0 anyway), rounded to an
// integer by the float -> int conversion (round to nearest even). kSaturate: clamp to
// max_code (RCEIL scales never need it: their v <= max).
template <class F, bool kSaturate>
inline __m256i encode16(__m256i ax, const Scale& s) {
  constexpr int c = 7 - F::man_bits;
  const __m256i j7 = _mm256_and_si256(_mm256_subs_epu16(ax, s.normal), set16(0xFF80));
  const __m256i xj = _mm256_sub_epi16(ax, j7);
  const __m256i z = _mm256_setzero_si256();
  const __m256i lo = _mm256_cvtps_epi32(
      _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, xj)), s.sub_lo));
  const __m256i hi = _mm256_cvtps_epi32(
      _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, xj)), s.sub_hi));
  const __m256i code = _mm256_add_epi16(_mm256_packs_epi32(lo, hi), _mm256_srli_epi16(j7, c));
  return kSaturate ? _mm256_min_epu16(code, set16(F::max_code)) : code;
}

// encode16 where no lane of ax is in (0, normal) (FP8's common case: no element subnormals),
// from normal_bias = normal - 128 - (2^(c - 1) - 1) with c = 7 - man: v's bits in a bf16-like
// layout with the element's exponent field, m = ax - normal + 128, rounded to nearest even
// by integer adds and a shift (the carry goes into the exponent); zero lanes saturate to 0.
template <class F, bool kSaturate>
inline __m256i encode16_normal(__m256i ax, __m256i normal_bias) {
  constexpr int c = 7 - F::man_bits;
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(ax, c), set16(1));
  const __m256i code =
      _mm256_srli_epi16(_mm256_add_epi16(_mm256_subs_epu16(ax, normal_bias), odd), c);
  return kSaturate ? _mm256_min_epu16(code, set16(F::max_code)) : code;
}

template <class F>
inline __m256i normal_bias(__m256i normal) {
  return _mm256_sub_epi16(normal, set16(128 + (1 << (6 - F::man_bits)) - 1));
}

// Nonzero where a lane of ax (either vector) is in (0, normal): encode16_normal does not do it.
inline __m256i below_normal(__m256i ax0, __m256i ax1, __m256i normal) {
  const __m256i one = set16(1);
  const __m256i low = _mm256_min_epu16(_mm256_sub_epi16(ax0, one), _mm256_sub_epi16(ax1, one));
  return _mm256_subs_epu16(_mm256_sub_epi16(normal, one), low);
}

// The magnitude codes of 16 lanes ax: encode16, or for FP8, encode16_normal where it can.
template <class F, bool kSaturate>
inline __m256i encode16_any(__m256i ax, const Scale& s) {
  if constexpr (F::bits == 8) {
    const __m256i below = below_normal(ax, ax, s.normal);
    if (_mm256_testz_si256(below, below)) {
      return encode16_normal<F, kSaturate>(ax, normal_bias<F>(s.normal));
    }
  }
  return encode16<F, kSaturate>(ax, s);
}

// The sign of x (bf16 bits) at F's sign bit of a code in u16 lanes.
template <class F>
inline __m256i sign16(__m256i x) {
  return _mm256_and_si256(_mm256_srli_epi16(x, 15 - (F::bits - 1)), set16(1 << (F::bits - 1)));
}

// The smallest scale byte the SIMD encoders take: they need a normal bf16 x wherever v is
// an element normal (byte > bias), and 2^(k + man + 126) to be a finite f32.
template <class F>
constexpr int32_t min_simd_byte() {
  return F::bias + (F::man_bits > 2 ? F::man_bits - 1 : 1);
}

// Scale bytes of 8 blocks from their amax (f32 bits, u32 lanes). Returns the bytes in u32
// lanes; *k gets bias - byte (kZeroBlockK for zero blocks); returns in *slow a bit per
// block that the scalar path must do (NaN / Inf, or nonzero with byte < min_simd_byte).
template <class F>
inline __m256i scales8(__m256i a, int32_t mode, __m256i* k, int* slow) {
  const __m256i exp = _mm256_srli_epi32(a, 23);
  __m256i e = _mm256_sub_epi32(exp, set32(127 + F::emax));
  if (mode == kRceil) {
    const __m256i norm = _mm256_or_si256(_mm256_and_si256(a, set32(0x7FFFFF)), set32(0x800000));
    e = _mm256_sub_epi32(e, _mm256_cmpgt_epi32(norm, set32(int32_t(F::max_sig))));  // +1
  }
  e = _mm256_min_epi32(_mm256_max_epi32(e, set32(-127)), set32(127));
  const __m256i zero = _mm256_cmpeq_epi32(a, _mm256_setzero_si256());
  const __m256i nan = _mm256_cmpgt_epi32(a, set32(int32_t(kF32Inf) - 1));  // a < 2^31
  __m256i byte = _mm256_andnot_si256(zero, _mm256_add_epi32(e, set32(127)));
  byte = _mm256_or_si256(byte, _mm256_and_si256(nan, set32(0xFF)));
  const __m256i tiny = _mm256_or_si256(_mm256_cmpgt_epi32(set32(min_simd_byte<F>()), byte),
                                       _mm256_cmpeq_epi32(exp, _mm256_setzero_si256()));
  *slow = _mm256_movemask_ps(_mm256_castsi256_ps(
      _mm256_or_si256(nan, _mm256_andnot_si256(zero, tiny))));
  *k = _mm256_blendv_epi8(_mm256_sub_epi32(set32(F::bias), byte), set32(kZeroBlockK), zero);
  return byte;
}

// Stores the 32 codes of one block (bytes, in order) in F's packed storage. `spill`: FP6
// may write 4 bytes past it (fewer stores; the next block's storage, rewritten after).
template <class F>
inline void store_block(__m256i codes, uint8_t* out, bool spill = false) {
  if constexpr (F::bits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), codes);
  } else if constexpr (F::bits == 4) {
    // u16 lane = c0 | c1 << 8 -> byte c0 + 16 c1 (a multiply-add)
    __m256i t = _mm256_maddubs_epi16(codes, set16(1 | 16 << 8));
    t = _mm256_permute4x64_epi64(_mm256_packus_epi16(t, t), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(t));
  } else {
    // u32 lane = c0 | c1 << 8 | c2 << 16 | c3 << 24 -> 24 bits c0 | c1 << 6 | c2 << 12 | c3 << 18,
    // as c + 64 c' in u16 lanes, then p + 4096 p' in u32 lanes (multiply-adds)
    __m256i w = _mm256_maddubs_epi16(codes, set16(1 | 64 << 8));
    w = _mm256_madd_epi16(w, set32(1 | 4096 << 16));
    const __m256i pick = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                          0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    w = _mm256_shuffle_epi8(w, pick);  // 12 bytes per 128-bit lane
    const __m128i hi = _mm256_extracti128_si256(w, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(w));
    if (spill) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 12), hi);  // overwrites bytes 12..15
      return;
    }
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 12), hi);
    const int32_t tail = _mm_extract_epi32(hi, 2);
    std::memcpy(out + 20, &tail, 4);
  }
}

// Per-block max of |x| for nblk (<= 8) blocks of 32 bf16 at x: f32 bits, u32 lane b. The
// reduction transposes in 128-bit lanes (cross-lane shuffles are slow on AVX2 CPUs that
// split 256-bit ops) and joins the two lanes once, at the end.
inline __m256i amax8(const uint16_t* x, int nblk) {
  const __m256i abs = set16(0x7FFF);
  __m256i a[8];
  for (int i = 0; i < 8; ++i) {
    if (i < nblk) {
      const __m256i* p = reinterpret_cast<const __m256i*>(x + 32 * i);
      a[i] = _mm256_max_epu16(_mm256_and_si256(_mm256_loadu_si256(p), abs),
                              _mm256_and_si256(_mm256_loadu_si256(p + 1), abs));
    } else {
      a[i] = _mm256_setzero_si256();
    }
  }
  __m256i b[4], c[2];
  for (int i = 0; i < 4; ++i) {  // words: blocks 2i, 2i + 1, 2i, 2i + 1, ...
    b[i] = _mm256_max_epu16(_mm256_unpacklo_epi16(a[2 * i], a[2 * i + 1]),
                            _mm256_unpackhi_epi16(a[2 * i], a[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {  // words: blocks 4i .. 4i + 3, twice
    c[i] = _mm256_max_epu16(_mm256_unpacklo_epi32(b[2 * i], b[2 * i + 1]),
                            _mm256_unpackhi_epi32(b[2 * i], b[2 * i + 1]));
  }
  // words: blocks 0 .. 7, the max over one 128-bit lane of each
  const __m256i d = _mm256_max_epu16(_mm256_unpacklo_epi64(c[0], c[1]),
                                     _mm256_unpackhi_epi64(c[0], c[1]));
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
  return _mm256_slli_epi32(_mm256_cvtepu16_epi32(m), 16);
}

// The 32 codes of the block at x (bf16) with their signs, as bytes in order, for the scale s.
template <class F, bool kSaturate>
inline __m256i block_codes(const uint16_t* x, const Scale& s) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  const __m256i a0 = _mm256_and_si256(x0, set16(0x7FFF));
  const __m256i a1 = _mm256_and_si256(x1, set16(0x7FFF));
  bool normal_only = false;  // FP8: a predictable branch (few element subnormals)
  if constexpr (F::bits == 8) {
    const __m256i below = below_normal(a0, a1, s.normal);
    normal_only = _mm256_testz_si256(below, below);
  }
  __m256i c0, c1;
  if (normal_only) {
    const __m256i nb = normal_bias<F>(s.normal);
    c0 = encode16_normal<F, kSaturate>(a0, nb);
    c1 = encode16_normal<F, kSaturate>(a1, nb);
  } else {
    c0 = encode16<F, kSaturate>(a0, s);
    c1 = encode16<F, kSaturate>(a1, s);
  }
  // Signed saturation keeps each x's sign in bit 7 of its byte; moved to F's sign bit.
  __m256i sign = _mm256_and_si256(_mm256_packs_epi16(x0, x1), _mm256_set1_epi8(int8_t(0x80)));
  if constexpr (F::bits != 8) sign = _mm256_srli_epi16(sign, 8 - F::bits);
  return _mm256_permute4x64_epi64(_mm256_or_si256(_mm256_packus_epi16(c0, c1), sign), 0xD8);
}

// The low bytes of 8 u32 lanes to out.
inline void store_bytes8(__m256i v, uint8_t* out) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1);
  const __m256i b = _mm256_shuffle_epi8(v, pick);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out),
                   _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

// Blocks [0, nblk) (nblk <= 8, all full) of 32 contiguous bf16 each (kSaturate: see encode16).
template <class F, bool kSaturate>
inline void row_group(const uint16_t* x, int nblk, int32_t mode, uint8_t* data,
                      uint8_t* scales) {
  __m256i k;
  int slow;
  const __m256i byte = scales8<F>(amax8(x, nblk), mode, &k, &slow);
  // The Scale of block i: normal[i] in both u16 halves of every u32 lane, sub[i] in every lane.
  alignas(32) int32_t normal[8];
  alignas(32) float sub[8];
  const __m256i n = _mm256_and_si256(normal_bits(k), set32(0xFFFF));
  _mm256_store_si256(reinterpret_cast<__m256i*>(normal), _mm256_or_si256(n, _mm256_slli_epi32(n, 16)));
  _mm256_store_ps(sub, subnormal_mul<F>(k));
  if (nblk == 8) {
    store_bytes8(byte, scales);
  } else {
    alignas(32) int32_t bytes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), byte);
    for (int i = 0; i < nblk; ++i) scales[i] = uint8_t(bytes[i]);
  }
  constexpr int64_t bs = block_storage<F>(32);
  for (int i = 0; i < nblk; ++i) {
    if ((slow >> i) & 1) {  // rewrites the block's scale and every byte of its storage
      uint8_t codes[32];
      scales[i] = quantize_block<F, BF16, 32>(x + 32 * i, mode, codes);
      for (int g = 0; g < 32 / F::group_codes; ++g) {
        pack_group<F>(codes + g * F::group_codes, 1, data + bs * i + g * F::group_bytes, 1);
      }
      continue;
    }
    const __m256 sc = _mm256_set1_ps(sub[i]);
    store_block<F>(block_codes<F, kSaturate>(x + 32 * i, {set32(normal[i]), sc, sc}),
                   data + bs * i, i + 1 < nblk);
  }
}

// Rowwise blocks [b0, b1) of a row of n bf16: the full ones in groups of 8; returns the
// first block not done (the caller finishes [that, b1) with quantize_row).
template <class F>
inline int64_t row_blocks(const uint16_t* x, int64_t n, int64_t b0, int64_t b1, int32_t mode,
                          uint8_t* data, uint8_t* scales) {
  const int64_t full = n / 32;
  const int64_t end = b1 < full ? b1 : full;
  constexpr int64_t bs = block_storage<F>(32);
  for (int64_t b = b0; b < end; b += 8) {
    const int nblk = int(end - b < 8 ? end - b : 8);
    if (mode == kRceil) {
      row_group<F, false>(x + 32 * b, nblk, mode, data + bs * b, scales + b);
    } else {
      row_group<F, true>(x + 32 * b, nblk, mode, data + bs * b, scales + b);
    }
  }
  return b0 > end ? b0 : end;
}

// Column strips of a column tile, 16 columns (one vector of bf16) each. A tile is
// done in three passes over its rows (kernels.cc, col_tile_bf16): strip_amax, strip_scales,
// strip_encode.
using Vec = __m256i;
constexpr int kStripCols = 16;

// amax (u16 lanes) of a strip, updated with the 16 bf16 at x.
inline Vec strip_amax(Vec amax, const uint16_t* x) {
  return _mm256_max_epu16(
      amax, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), set16(0x7FFF)));
}

// 16 bytes to out (`stream`: a streaming store, out 16-byte aligned).
inline void store16(__m128i v, uint8_t* out, bool stream) {
  __m128i* dst = reinterpret_cast<__m128i*>(out);
  if (stream) {
    _mm_stream_si128(dst, v);
  } else {
    _mm_storeu_si128(dst, v);
  }
}

// Stores the strip's 16 scale bytes (`stream`: with a streaming store) and sets its Scale
// (see encode16); false where a block needs the scalar path.
template <class F>
inline bool strip_scales(Vec amax, int32_t mode, uint8_t* scales, Scale* scale, bool stream) {
  __m256i klo, khi;
  int slo, shi;
  const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(amax)), 16);
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(amax, 1)), 16);
  const __m256i blo = scales8<F>(lo, mode, &klo, &slo);
  const __m256i bhi = scales8<F>(hi, mode, &khi, &shi);
  const __m256i b16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(blo, bhi), 0xD8);
  const __m256i b8 = _mm256_permute4x64_epi64(_mm256_packus_epi16(b16, b16), 0x08);
  store16(_mm256_castsi256_si128(b8), scales, stream);
  *scale = scale_of<F>(_mm256_permute4x64_epi64(_mm256_packs_epi32(klo, khi), 0xD8));
  return (slo | shi) == 0;
}

// 16 u16 lanes (values < 256 after the mask) -> 16 bytes at out (as store16).
inline void store_bytes16(__m256i v, uint8_t* out, bool stream) {
  v = _mm256_and_si256(v, set16(0xFF));
  store16(_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi16(v, v), 0x08)), out,
          stream);
}

// The strip's codes for one storage group of rows (F::group_codes rows `ld` apart at x, the
// rows from `rows` on are zero padding), with its Scale, stored in F's group_bytes storage
// rows `dld` apart at out (`stream`: with streaming stores, out 16-byte aligned).
template <class F>
inline void strip_encode(const uint16_t* x, int64_t ld, int rows, const Scale& s, uint8_t* out,
                         int64_t dld, bool stream) {
  __m256i c[F::group_codes];
  for (int i = 0; i < F::group_codes; ++i) {
    if (i < rows) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i * ld));
      c[i] = _mm256_or_si256(encode16_any<F, true>(_mm256_and_si256(v, set16(0x7FFF)), s),
                             sign16<F>(v));
    } else {
      c[i] = _mm256_setzero_si256();
    }
  }
  if constexpr (F::bits == 8) {
    store_bytes16(c[0], out, stream);
  } else if constexpr (F::bits == 4) {
    store_bytes16(_mm256_or_si256(c[0], _mm256_slli_epi16(c[1], 4)), out, stream);
  } else {  // c0 | c1 << 6 | c2 << 12 | c3 << 18 in three bytes
    store_bytes16(_mm256_or_si256(c[0], _mm256_slli_epi16(c[1], 6)), out, stream);
    store_bytes16(_mm256_or_si256(_mm256_srli_epi16(c[1], 2), _mm256_slli_epi16(c[2], 4)),
                  out + dld, stream);
    store_bytes16(_mm256_or_si256(_mm256_srli_epi16(c[2], 4), _mm256_slli_epi16(c[3], 2)),
                  out + 2 * dld, stream);
  }
}


}  // namespace simd256
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // __AVX2__
#endif  // MXJAX_CPU_SIMD256_H_
