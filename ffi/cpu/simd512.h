// AVX-512 (F + BW) fast paths for bf16 inputs, block 32: rowwise chunks of up to 64 blocks
// and 32-column strips of a column tile (simd512_2x.h's quantize_2x tile shares their
// encoders and packers). Host only; included by kernels.cc in the TU built with -mavx512bw.
// Bit-exact with the templates of quantize.h, which handle everything these do not (other
// blocks, NaN / Inf blocks, blocks with tiny scales). f32 / f16 inputs reach them narrowed to
// bf16 (kernels.cc, bf16_odd.h).
//
// Elements are encoded in 16-bit integer lanes straight from the bf16 bits: x * 2^-e only
// moves the exponent, so v's exponent is exp(x) - e and its significand is x's; with
// k = bias - scale byte, v's biased exponent in the element format is eb = exp(x) + k.
// Where eb >= 1 (the element's normal range) the code is an integer rounding of v's bits;
// below, v * 2^(man - emin) is made by an add to the bf16 exponent and rounded by the float
// -> int conversion (encode32; FP4's three values there by two compares). Blocks with scale
// bytes below min_byte (and NaN / Inf blocks) go to the scalar path.
#ifndef MXJAX_CPU_SIMD512_H_
#define MXJAX_CPU_SIMD512_H_

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MXJAX_HAVE_SIMD512 1

#include <immintrin.h>

#include "gcc_diagnostics.h"

MXJAX_UNINITIALIZED_WARNINGS_OFF

#include <cstdint>
#include <cstring>

#include "mxjax/quantize.h"
#include "simd256_cols.h"
#include "stream.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd512 {

// The smallest scale byte encode32 takes (k = bias - byte <= -(man + 1)): a zero or
// bf16-subnormal x then has v < 2^(emin - man - 1) (code 0) in both of its paths, and x is a
// normal bf16 wherever v is an element normal.
template <class F>
constexpr int32_t min_byte() {
  return F::bias + F::man_bits + 1;
}

// k (= bias - scale byte) for an all-zero block: any k <= -(man + 1) makes zero codes.
constexpr int32_t kZeroBlockK = -128;

// What encode32 needs of the scales of a vector's lanes (k = bias - scale byte per lane):
// (k << 7) + 2^(6 - man) - 1 in u16 lanes (k << 7 moves |x|'s exponent to v's; the rest is
// the rounding bias of encode32).
struct Scale {
  __m512i bias;
};

template <class F>
constexpr int16_t kRoundBias = (1 << (6 - F::man_bits)) - 1;

template <class F>
inline Scale scale_of(__m512i k16) {
  return {_mm512_add_epi16(_mm512_slli_epi16(k16, 7), _mm512_set1_epi16(kRoundBias<F>))};
}

// Magnitude codes (u16 lanes) with the sign bits of the bf16 x: code | (sign & signbit).
template <class F>
inline __m512i with_sign(__m512i code, __m512i x) {
  const __m512i sign = _mm512_srli_epi16(x, 15 - (F::bits - 1));
  return _mm512_ternarylogic_epi32(code, sign, _mm512_set1_epi16(int16_t(1u << (F::bits - 1))),
                                   0xF8);
}

// 32 bf16 (bits) -> 32 magnitude|sign codes in u16 lanes, for the scales s. m = |x| + (k << 7)
// is v's bits in a bf16-like layout whose exponent field is eb = exp(x) + k (-253 <= eb <=
// 253, so m fits an int16). Lanes in the element's normal range (eb >= 1, m >= 128) have
// code = RNE(m >> c) (c = 7 - man), which carries into the exponent by itself:
// (m + 2^(c - 1) - 1 + odd) >> c, where odd is bit c of m, that of |x|. Element subnormals
// (eb <= 0) have code = RNE(v * 2^(man - emin)): w = m + (man + 126) << 7 is that value as a
// bf16 (exact where eb >= -man; lower eb round to 0 anyway, and a w that went negative gives
// 0 through the unsigned saturation), rounded to an integer by the f32 -> int conversion
// (round to nearest even).
template <class F>
inline __m512i encode32(__m512i x, const Scale& s) {
  constexpr int c = 7 - F::man_bits;
  const __m512i ax = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
  const __m512i mr = _mm512_add_epi16(ax, s.bias);  // m + 2^(c - 1) - 1
  const __mmask32 normal = _mm512_cmpge_epi16_mask(mr, _mm512_set1_epi16(128 + kRoundBias<F>));
  const __mmask32 odd = _mm512_test_epi16_mask(ax, _mm512_set1_epi16(1 << c));
  const __m512i r = _mm512_srli_epi16(_mm512_mask_add_epi16(mr, odd, mr, _mm512_set1_epi16(1)), c);
  const __m512i max_code = _mm512_set1_epi16(int16_t(F::max_code));
  __m512i code;
  if constexpr (F::man_bits == 1) {
    // Element subnormals are codes 0, 1 and 2 (the smallest normal): RNE(2^eb (1 + f / 128))
    // (f: |x|'s fraction, m's low 7 bits) is >= 1 where m > -128 (eb = -1, past the tie at
    // f = 0), 2 where m >= 64 (eb = 0, f >= 64; the tie goes to the even 2).
    const __mmask32 ge1 = _mm512_cmpgt_epi16_mask(mr, _mm512_set1_epi16(-128 + kRoundBias<F>));
    const __mmask32 ge2 = _mm512_cmpge_epi16_mask(mr, _mm512_set1_epi16(64 + kRoundBias<F>));
    const __m512i sub = _mm512_mask_mov_epi16(_mm512_maskz_mov_epi16(ge1, _mm512_set1_epi16(1)),
                                              ge2, _mm512_set1_epi16(2));
    code = _mm512_mask_min_epu16(sub, normal, r, max_code);
  } else if (F::bits != 8 || (~normal & _mm512_test_epi16_mask(ax, ax))) {
    // Branch-free where element subnormals are common (FP6: ~every other vector).
    const __m512i w =
        _mm512_add_epi16(mr, _mm512_set1_epi16(((F::man_bits + 126) << 7) - kRoundBias<F>));
    const __m512i z = _mm512_setzero_si512();
    const __m512i lo = _mm512_cvtps_epi32(_mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w)));
    const __m512i hi = _mm512_cvtps_epi32(_mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w)));
    code = _mm512_mask_min_epu16(_mm512_packus_epi32(lo, hi), normal, r, max_code);
  } else {
    code = _mm512_maskz_min_epu16(normal, r, max_code);
  }
  return with_sign<F>(code, x);
}

// encode32 for vectors whose nonzero lanes are all element normals (m >= 128): FP8's common
// case, without encode32's test for the others. *r gets RNE(m >> c) before the clamp (an
// arithmetic shift): at least 2^man (the smallest normal's code) exactly where the code is
// right, in element normals and in the subnormals that round up to 2^man (m > 127 - 2^(c-1)).
// The caller tests the min of *r over the nonzero lanes of several vectors at once and
// redoes them with encode32 where it is below 2^man.
template <class F>
inline __m512i encode32_normal(__m512i x, const Scale& s, __m512i* r) {
  constexpr int c = 7 - F::man_bits;
  const __m512i ax = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
  const __mmask32 odd = _mm512_test_epi16_mask(ax, _mm512_set1_epi16(1 << c));
  // |x| + odd (shared by a vector's encodes) + the Scale's bias
  const __m512i ao = _mm512_mask_add_epi16(ax, odd, ax, _mm512_set1_epi16(1));
  *r = _mm512_srai_epi16(_mm512_add_epi16(ao, s.bias), c);
  const __m512i code = _mm512_maskz_min_epi16(_mm512_test_epi16_mask(ax, ax), *r,
                                              _mm512_set1_epi16(int16_t(F::max_code)));
  return with_sign<F>(code, x);
}

// Scale bytes of 16 blocks from their amax (f32 bits, u32 lanes). Returns the bytes in u32
// lanes; *k gets bias - byte (kZeroBlockK for zero blocks); *slow marks the blocks that the
// scalar path must do (NaN / Inf, or nonzero with byte < min_byte).
template <class F>
inline __m512i scales16(__m512i a, int32_t mode, __m512i* k, __mmask16* slow) {
  const __m512i exp = _mm512_srli_epi32(a, 23);
  __m512i e = _mm512_sub_epi32(exp, _mm512_set1_epi32(127 + F::emax));
  if (mode == kRceil) {
    __m512i norm = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)),
                                   _mm512_set1_epi32(0x800000));
    __mmask16 up = _mm512_cmpgt_epu32_mask(norm, _mm512_set1_epi32(int32_t(F::max_sig)));
    e = _mm512_mask_add_epi32(e, up, e, _mm512_set1_epi32(1));
  }
  e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(a, _mm512_setzero_si512());
  __m512i byte = _mm512_maskz_add_epi32(~zero, e, _mm512_set1_epi32(127));
  const __mmask16 nan = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(int32_t(kF32Inf)));
  byte = _mm512_mask_mov_epi32(byte, nan, _mm512_set1_epi32(0xFF));
  const __m512i lowest = _mm512_set1_epi32(min_byte<F>());
  const __mmask16 tiny = _mm512_cmplt_epi32_mask(byte, lowest) |
                         _mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512());
  *slow = nan | (tiny & ~zero);
  *k = _mm512_mask_mov_epi32(_mm512_sub_epi32(_mm512_set1_epi32(F::bias), byte), zero,
                             _mm512_set1_epi32(kZeroBlockK));
  return byte;
}

// Scale::bias of 16 blocks (k: bias - scale byte, i32 lanes) in both u16 halves of u32 lane
// b, for broadcasting block b's.
template <class F>
inline __m512i block_biases(__m512i k) {
  const __m512i b16 = _mm512_add_epi32(_mm512_slli_epi32(k, 7), _mm512_set1_epi32(kRoundBias<F>));
  return _mm512_or_si512(_mm512_slli_epi32(b16, 16),
                         _mm512_and_si512(b16, _mm512_set1_epi32(0xFFFF)));
}

// The low bytes of u32 lanes [0, live) of v (scale bytes) to out: one plain store where all 16
// are (see kPackBlocks).
inline void store_scale_bytes(__m512i v, int live, uint8_t* out) {
  if (live == 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(v));
  } else {
    _mm512_mask_cvtepi32_storeu_epi8(out, __mmask16((1u << live) - 1), v);
  }
}

// Blocks of F packed together (store_blocks): whole 64-byte lines (3 for FP6), so that
// row_out's staging buffer is read back from stores that hold each line whole (a load that
// spans several smaller stores in flight waits for them to retire).
template <class F>
constexpr int kPackBlocks = F::bits == 4 ? 4 : F::bits == 6 ? 8 : 2;

// Stores the codes (u16 lanes) of kPackBlocks<F> consecutive blocks, of which the first
// `live` are written, in F's packed storage at out.
template <class F>
inline void store_blocks(const __m512i* c, int live, uint8_t* out) {
  constexpr int kLines = F::bits == 6 ? 3 : 1;
  __m512i v[kLines];
  if constexpr (F::bits == 8) {  // lane q: [block 0 bytes 8q.., block 1 bytes 8q..]
    v[0] = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                    _mm512_packus_epi16(c[0], c[1]));
  } else if constexpr (F::bits == 4) {
    // dword = c0 + 16 c1 (a multiply-add), then dwords -> bytes: dword j of lane q holds
    // block j's bytes 4q..4q + 3
    const __m512i nib = _mm512_set1_epi32(1 | 16 << 16);
    __m512i d[4];
    for (int i = 0; i < 4; ++i) d[i] = _mm512_madd_epi16(c[i], nib);
    v[0] = _mm512_packus_epi16(_mm512_packus_epi32(d[0], d[1]), _mm512_packus_epi32(d[2], d[3]));
    v[0] = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), v[0]);
  } else {
    // For each pair of blocks: p = c0 + 64 c1 (12 bits, u32 lanes), the lanes regrouped so
    // that each 128-bit lane holds 8 consecutive p of one block, then p + 4096 p' (24 bits:
    // one 3-byte group per u32), its 3 bytes to the front: 12 bytes in u32 lanes 0-2 of each
    // 128-bit lane. Then the pairs' 12 x 16 valid u32 into 3 lines.
    const __m512i pick = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
    __m512i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m512i p0 = _mm512_madd_epi16(c[2 * i], _mm512_set1_epi32(1 | 64 << 16));
      const __m512i p1 = _mm512_madd_epi16(c[2 * i + 1], _mm512_set1_epi32(1 | 64 << 16));
      __m512i g = _mm512_packus_epi32(_mm512_shuffle_i64x2(p0, p1, 0x88),
                                      _mm512_shuffle_i64x2(p0, p1, 0xDD));
      g = _mm512_madd_epi16(g, _mm512_set1_epi32(1 | 4096 << 16));
      q[i] = _mm512_shuffle_epi8(g, pick);
    }
    // valid u32 k of a pair (k < 12) is u32 k + k / 3 of q; 16 + j: u32 j of the second source
    v[0] = _mm512_permutex2var_epi32(
        q[0], _mm512_setr_epi32(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20), q[1]);
    v[1] = _mm512_permutex2var_epi32(
        q[1], _mm512_setr_epi32(5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20, 21, 22, 24, 25), q[2]);
    v[2] = _mm512_permutex2var_epi32(
        q[2], _mm512_setr_epi32(10, 12, 13, 14, 16, 17, 18, 20, 21, 22, 24, 25, 26, 28, 29, 30),
        q[3]);
  }
  constexpr int kBlockBytes = int(block_storage<F>(32));
  if (live == kPackBlocks<F>) {
    for (int i = 0; i < kLines; ++i) _mm512_storeu_si512(out + 64 * i, v[i]);
  } else {  // a ragged end of a row: rare
    alignas(64) uint8_t lines[64 * kLines];
    for (int i = 0; i < kLines; ++i) _mm512_store_si512(lines + 64 * i, v[i]);
    std::memcpy(out, lines, size_t(kBlockBytes * live));
  }
}

// Per-block max of |x| for nblk (<= 16) blocks of 32 bf16 at x: f32 bits, u32 lane b. With
// col_amax (simd512_2x.h), also updates the column strips' amax col_amax[b] with the |x| of
// block b. Always inlined: out of line (GCC 12, once the f32 / f16 paths call row_chunk
// too) the quantize_2x tile ran 13% slower on a Zen 4.
__attribute__((always_inline)) inline __m512i amax16(const uint16_t* x, int nblk,
                                                     __m512i* col_amax) {
  const __m512i abs = _mm512_set1_epi16(0x7FFF);
  __m512i a[16];
  for (int i = 0; i < 16; ++i) {
    a[i] = i < nblk ? _mm512_and_si512(_mm512_loadu_si512(x + 32 * i), abs)
                    : _mm512_setzero_si512();
    if (col_amax && i < nblk) col_amax[i] = _mm512_max_epu16(col_amax[i], a[i]);
  }
  __m512i b[8], c4[4], d[2];
  for (int i = 0; i < 8; ++i) {
    b[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(a[2 * i], a[2 * i + 1], 0x44),
                            _mm512_shuffle_i64x2(a[2 * i], a[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // quarter q of c4[i] = block 4i + q
    c4[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_i64x2(b[2 * i], b[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // dwords of quarter q: [q, q, 4 + q, 4 + q] (+ 8i)
    d[i] = _mm512_max_epu16(_mm512_unpacklo_epi64(c4[2 * i], c4[2 * i + 1]),
                            _mm512_unpackhi_epi64(c4[2 * i], c4[2 * i + 1]));
  }
  __m512 d0 = _mm512_castsi512_ps(d[0]), d1 = _mm512_castsi512_ps(d[1]);
  __m512i e = _mm512_max_epu16(_mm512_castps_si512(_mm512_shuffle_ps(d0, d1, 0x88)),
                               _mm512_castps_si512(_mm512_shuffle_ps(d0, d1, 0xDD)));
  // dword 4q + j holds block 4j + q (two u16 partials)
  e = _mm512_max_epu16(e, _mm512_srli_epi32(e, 16));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  e = _mm512_permutexvar_epi32(idx, e);
  return _mm512_slli_epi32(e, 16);
}

// Blocks of a row_chunk: its scales are all found before its first encode, so that the
// latency of one group's amax -> scale chain overlaps the others' work.
constexpr int kChunkBlocks = 64;

// Blocks [0, nblk) (nblk <= kChunkBlocks, all full) of a row of bf16 at x: the scales in
// groups of up to 16, the SIMD encode of every block, then the scalar path for the blocks
// that need it.
template <class F>
inline void row_chunk(const uint16_t* x, int nblk, int32_t mode, uint8_t* data,
                      uint8_t* scales) {
  alignas(64) int32_t bias[kChunkBlocks];  // block j's Scale::bias (see block_biases)
  uint64_t slow = 0;                       // bit j: block j
  for (int g = 0; g < nblk; g += 16) {
    const int live = nblk - g < 16 ? nblk - g : 16;
    __m512i k;
    __mmask16 s;
    const __m512i byte = scales16<F>(amax16(x + 32 * g, live, nullptr), mode, &k, &s);
    store_scale_bytes(byte, live, scales + g);
    _mm512_store_si512(bias + g, block_biases<F>(k));
    slow |= uint64_t(s) << g;
  }
  constexpr int P = kPackBlocks<F>;
  constexpr int64_t bs = block_storage<F>(32);
  // blocks [i, i + live) of one store_blocks
  auto encode_chunk = [&](int i, int live) __attribute__((always_inline)) {
    __m512i c[P];
    for (int j = 0; j < P; ++j) {
      const int b = j < live ? i + j : i;  // past live: any block (not stored)
      c[j] = encode32<F>(_mm512_loadu_si512(x + 32 * b), {_mm512_set1_epi32(bias[b])});
    }
    store_blocks<F>(c, live, data + bs * i);
  };
  int i = 0;
  for (; i + P <= nblk; i += P) encode_chunk(i, P);
  if (i < nblk) encode_chunk(i, nblk - i);
  for (; slow; slow &= slow - 1) {
    const int j = __builtin_ctzll(slow);
    simd256::scalar_block<F>(x + 32 * j, mode, data + bs * j, scales + j);
  }
}

// Rowwise blocks [b0, b1) of a row of n bf16: the full ones in chunks of kChunkBlocks;
// returns the first block not done (the caller finishes [that, b1) with quantize_row).
template <class F>
inline int64_t row_blocks(const uint16_t* x, int64_t n, int64_t b0, int64_t b1, int32_t mode,
                          uint8_t* data, uint8_t* scales) {
  const int64_t full = n / 32;
  const int64_t end = b1 < full ? b1 : full;
  constexpr int64_t bs = block_storage<F>(32);
  for (int64_t b = b0; b < end; b += kChunkBlocks) {
    const int nblk = int(end - b < kChunkBlocks ? end - b : kChunkBlocks);
    row_chunk<F>(x + 32 * b, nblk, mode, data + bs * b, scales + b);
  }
  return b0 > end ? b0 : end;
}

// Column strips of a column tile, 32 columns (one vector of bf16) each. A tile is
// done in three passes over its rows (kernels.cc, col_strips_bf16): strip_amax, strip_scales,
// strip_encode.
using Vec = __m512i;
using StripScale = Scale;
constexpr int kStripCols = 32;

// amax (u16 lanes) of a strip, updated with the 32 bf16 at x.
inline Vec strip_amax(Vec amax, const uint16_t* x) {
  return _mm512_max_epu16(amax, _mm512_and_si512(_mm512_loadu_si512(x), _mm512_set1_epi16(0x7FFF)));
}

// Stores the strip's 32 scale bytes (`stream`: with streaming stores) and sets its Scale
// (see encode32); false where a block needs the scalar path.
template <class F>
inline bool strip_scales(Vec amax, int32_t mode, uint8_t* scales, Scale* scale, bool stream) {
  __m512i klo, khi;
  __mmask16 slo, shi;
  __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(amax)), 16);
  __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(amax, 1)), 16);
  __m512i blo = scales16<F>(lo, mode, &klo, &slo);
  __m512i bhi = scales16<F>(hi, mode, &khi, &shi);
  store_vector(scales, _mm512_cvtepi32_epi8(blo), stream);
  store_vector(scales + 16, _mm512_cvtepi32_epi8(bhi), stream);
  *scale = scale_of<F>(_mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(klo)),
                                          _mm512_cvtepi32_epi16(khi), 1));
  return (slo | shi) == 0;
}

// Stores the codes (u16 lanes) of a strip's storage group of rows (c[i]: row i of the group)
// in F's group_bytes storage rows `dld` apart at out (`stream`: with streaming stores, out
// 32-byte aligned).
template <class F>
inline void store_strip_codes(const __m512i* c, uint8_t* out, int64_t dld, bool stream) {
  auto store = [stream](__m512i v, uint8_t* o) {  // low byte of each u16 lane
    store_vector(o, _mm512_cvtepi16_epi8(v), stream);
  };
  if constexpr (F::bits == 8) {
    store(c[0], out);
  } else if constexpr (F::bits == 4) {
    store(_mm512_or_si512(c[0], _mm512_slli_epi16(c[1], 4)), out);
  } else {  // c0 | c1 << 6 | c2 << 12 | c3 << 18 in three bytes
    store(_mm512_or_si512(c[0], _mm512_slli_epi16(c[1], 6)), out);
    store(_mm512_or_si512(_mm512_srli_epi16(c[1], 2), _mm512_slli_epi16(c[2], 4)), out + dld);
    store(_mm512_or_si512(_mm512_srli_epi16(c[2], 4), _mm512_slli_epi16(c[3], 2)), out + 2 * dld);
  }
}

// The strip's codes for one storage group of rows (F::group_codes rows `ld` apart at x, the
// rows from `rows` on are zero padding), with its Scale, stored as store_strip_codes does.
template <class F>
inline void strip_encode(const uint16_t* x, int64_t ld, int rows, const Scale& s, uint8_t* out,
                         int64_t dld, bool stream) {
  __m512i c[F::group_codes];
  for (int i = 0; i < F::group_codes; ++i) {
    c[i] = i < rows ? encode32<F>(_mm512_loadu_si512(x + i * ld), s) : _mm512_setzero_si512();
  }
  store_strip_codes<F>(c, out, dld, stream);
}

}  // namespace simd512
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

MXJAX_UNINITIALIZED_WARNINGS_ON

#endif  // __AVX512F__ && __AVX512BW__
#endif  // MXJAX_CPU_SIMD512_H_
