// AVX2 fast paths for bf16 inputs, block 32: quantize in rowwise groups of up to 8 blocks
// (every format) with simd256_encode.h's encoders, and the block codes and packers that
// simd256_cols.h's column strips and simd256_2x.h's quantize_2x tile share;
// simd256_dequantize.h has the dequantize. Host only; included by kernels.cc in the TUs built
// with -mavx2 and -mavx512bw (which quantizes with simd512.h, and uses the byte packers here).
// Bit-exact with the templates of quantize.h, which handle what these do not (other blocks,
// NaN / Inf blocks, blocks with tiny scales). f32 / f16 inputs reach them narrowed to bf16
// (kernels.cc, bf16_odd.h).
#ifndef MXJAX_CPU_SIMD256_H_
#define MXJAX_CPU_SIMD256_H_

#if defined(__AVX2__)
#define MXJAX_HAVE_SIMD256 1

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "mxjax/quantize.h"
#include "simd256_encode.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace simd256 {

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

// A column strip's amax (or any 32 u16 lanes of a strip): columns 0-15 in lo, 16-31 in hi.
struct Vec {
  __m256i lo, hi;
};

// Per-block max of |x| for nblk (<= 8) blocks of 32 bf16 at x: f32 bits, u32 lane b. The
// reduction transposes in 128-bit lanes (cross-lane shuffles are slow on AVX2 CPUs that
// split 256-bit ops) and joins the two lanes once, at the end. With col_amax, also updates
// the column strips' amax col_amax[b] with the |x| of block b.
__attribute__((always_inline)) inline __m256i amax8(const uint16_t* x, int nblk,
                                                   Vec* col_amax) {
  const __m256i abs = set16(0x7FFF);
  __m256i a[8];
  for (int i = 0; i < 8; ++i) {
    if (i < nblk) {
      const __m256i* p = reinterpret_cast<const __m256i*>(x + 32 * i);
      const __m256i lo = _mm256_and_si256(_mm256_loadu_si256(p), abs);
      const __m256i hi = _mm256_and_si256(_mm256_loadu_si256(p + 1), abs);
      if (col_amax) {
        col_amax[i].lo = _mm256_max_epu16(col_amax[i].lo, lo);
        col_amax[i].hi = _mm256_max_epu16(col_amax[i].hi, hi);
      }
      a[i] = _mm256_max_epu16(lo, hi);
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

// The signs of two vectors of 16 bf16 (x0, x1) at F's sign bit of bytes in the order of
// _mm256_packus_epi16(x0, x1): signed saturation keeps each x's sign in bit 7 of its byte.
template <class F>
inline __m256i sign_bytes(__m256i x0, __m256i x1) {
  const __m256i sign =
      _mm256_and_si256(_mm256_packs_epi16(x0, x1), _mm256_set1_epi8(int8_t(0x80)));
  return F::bits == 8 ? sign : _mm256_srli_epi16(sign, 8 - F::bits);
}

// The 32 codes of the 32 bf16 at x with their signs, for the scales s (one Scale: a block;
// two: columns 0-15 and 16-31 of a strip, see encode32): bytes in the order of
// _mm256_packus_epi16 of its halves (elements 0-7, 16-23 | 8-15, 24-31).
template <class F, bool kSaturate, class... S>
inline __m256i block_codes(const uint16_t* x, const S&... s) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  const __m256i codes = encode32<F, kSaturate>(_mm256_and_si256(x0, set16(0x7FFF)),
                                               _mm256_and_si256(x1, set16(0x7FFF)), s...);
  return _mm256_or_si256(codes, sign_bytes<F>(x0, x1));
}

// Stores one block's codes (bytes in block_codes' order) in F's packed storage (`spill`: see
// store_block).
template <class F>
inline void store_codes(__m256i codes, uint8_t* out, bool spill) {
  if constexpr (F::bits == 4) {
    // u16 lane = c0 | c1 << 8 -> byte c0 + 16 c1 (a multiply-add); the dwords of the 128-bit
    // lanes' low halves are bytes 0-7, 16-23 | 8-15, 24-31 of the block
    __m256i t = _mm256_maddubs_epi16(codes, set16(1 | 16 << 8));
    t = _mm256_packus_epi16(t, t);
    t = _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(t));
  } else {
    store_block<F>(_mm256_permute4x64_epi64(codes, 0xD8), out, spill);
  }
}

// Stores two consecutive blocks' codes (as store_codes; for FP4, one pack and one permute).
template <class F>
inline void store_codes2(__m256i codes0, __m256i codes1, uint8_t* out, bool spill) {
  if constexpr (F::bits == 4) {
    const __m256i pairs = set16(1 | 16 << 8);
    const __m256i t = _mm256_packus_epi16(_mm256_maddubs_epi16(codes0, pairs),
                                          _mm256_maddubs_epi16(codes1, pairs));
    // dwords: block 0 bytes 0-3, 8-11, block 1 bytes 0-3, 8-11 | 4-7, 12-15, 4-7, 12-15
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  } else {
    store_codes<F>(codes0, out, true);
    store_codes<F>(codes1, out + block_storage<F>(32), spill);
  }
}

// 8 i32 lanes, saturated to bytes, to out.
inline void store_bytes8(__m256i v, uint8_t* out) {
  v = _mm256_packus_epi32(v, v);
  v = _mm256_packus_epi16(v, v);  // dword 0 of each 128-bit lane: lanes 0-3 | 4-7
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out),
                   _mm_unpacklo_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

// The Scales of 8 blocks, for broadcasting block i's: Scale's u16 fields in both halves of
// u32 lane i.
struct GroupScales {
  alignas(32) int32_t normal[8], offset[8], base[8], sub[8];
};

// From the encoders' scale bytes (i32 lanes).
template <class F>
inline void set_group_scales(__m256i byte, GroupScales* g) {
  Scale s;
  set_fields<F>(_mm256_or_si256(byte, _mm256_slli_epi32(byte, 16)), &s);
  auto store = [](int32_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); };
  if constexpr (table_codes<F>()) {
    if constexpr (F::bits == 6) store(g->offset, s.offset);
    store(g->base, s.base);
  } else {
    store(g->normal, s.normal);
    if constexpr (F::bits == 8) store(g->offset, s.offset);
    store(g->sub, s.sub);
  }
}

// Block i's Scale, broadcast from g: only the fields F's encoders read (see encode32).
template <class F>
inline Scale block_scale(const GroupScales& g, int i) {
  Scale s;
  if constexpr (table_codes<F>()) {
    if constexpr (F::bits == 6) s.offset = set32(g.offset[i]);
    s.base = set32(g.base[i]);
  } else {
    s.normal = set32(g.normal[i]);
    if constexpr (F::bits == 8) s.offset = set32(g.offset[i]);
    s.sub = set32(g.sub[i]);
  }
  return s;
}

// A group of up to 8 blocks with its scales computed: their Scales, and a bit per block
// that the scalar path must do.
struct Group {
  GroupScales scales;
  int slow;
};

// Computes the scales of blocks [0, nblk) (nblk <= 8, all full) of 32 bf16 at x, and stores
// their scale bytes (col_amax: see amax8).
template <class F>
__attribute__((always_inline)) inline void prepare_group(const uint16_t* x, int nblk,
                                                         int32_t mode, uint8_t* scales,
                                                         Group* g, Vec* col_amax) {
  __m256i enc;
  const __m256i byte = scales8<F>(amax8(x, nblk, col_amax), mode, &enc, &g->slow);
  set_group_scales<F>(enc, &g->scales);
  if (nblk == 8) {
    store_bytes8(byte, scales);
  } else {
    uint8_t bytes[8];
    store_bytes8(byte, bytes);
    for (int i = 0; i < nblk; ++i) scales[i] = bytes[i];
  }
}

// One block of 32 inputs (bf16 unless In says otherwise) at x by quantize.h's template: its
// scale byte and every byte of its storage at data (rewrites what a SIMD encode left there).
template <class F, class In = BF16>
inline void scalar_block(const typename In::T* x, int32_t mode, uint8_t* data, uint8_t* scale) {
  uint8_t codes[32];
  *scale = quantize_block<F, In, 32>(x, mode, codes);
  for (int j = 0; j < 32 / F::group_codes; ++j) {
    pack_group<F>(codes + j * F::group_codes, 1, data + j * F::group_bytes, 1);
  }
}

// Encodes the blocks of a prepared group (kSaturate: see encode16); the scalar path does
// its slow blocks, scale bytes included.
template <class F, bool kSaturate>
__attribute__((always_inline)) inline void encode_group(const uint16_t* x, int nblk,
                                                        int32_t mode, const Group& g,
                                                        uint8_t* data, uint8_t* scales) {
  constexpr int64_t bs = block_storage<F>(32);
  if (nblk == 8 && g.slow == 0) {  // the common case, unrolled
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
      store_codes2<F>(block_codes<F, kSaturate>(x + 32 * i, block_scale<F>(g.scales, i)),
                      block_codes<F, kSaturate>(x + 32 * i + 32, block_scale<F>(g.scales, i + 1)),
                      data + bs * i, i < 6);
    }
    return;
  }
  for (int i = 0; i < nblk; ++i) {
    if ((g.slow >> i) & 1) {
      scalar_block<F>(x + 32 * i, mode, data + bs * i, scales + i);
      continue;
    }
    store_codes<F>(block_codes<F, kSaturate>(x + 32 * i, block_scale<F>(g.scales, i)),
                   data + bs * i, i + 1 < nblk);
  }
}

// Blocks [b0, end) (all full) of a row of bf16 in groups of 8, each group's scales computed
// while the group before it is encoded (its amax pass and scale arithmetic would otherwise
// wait for the encoding to drain).
template <class F, bool kSaturate>
inline void row_groups(const uint16_t* x, int64_t b0, int64_t end, int32_t mode, uint8_t* data,
                       uint8_t* scales) {
  constexpr int64_t bs = block_storage<F>(32);
  Group g[2];
  int64_t b = b0;
  if (b + 8 <= end) prepare_group<F>(x + 32 * b, 8, mode, scales + b, &g[0], nullptr);
  for (int cur = 0; b + 8 <= end; b += 8, cur ^= 1) {
    if (b + 16 <= end) {
      prepare_group<F>(x + 32 * (b + 8), 8, mode, scales + b + 8, &g[cur ^ 1], nullptr);
    }
    // Keeps the per-block broadcasts loads from g (GCC otherwise extracts them from the
    // registers it stored, two shuffles each).
    asm("" : "+m"(g[cur]));
    encode_group<F, kSaturate>(x + 32 * b, 8, mode, g[cur], data + bs * b, scales + b);
  }
  if (b < end) {
    const int nblk = int(end - b);
    prepare_group<F>(x + 32 * b, nblk, mode, scales + b, &g[0], nullptr);
    asm("" : "+m"(g[0]));
    encode_group<F, kSaturate>(x + 32 * b, nblk, mode, g[0], data + bs * b, scales + b);
  }
}

// Rowwise blocks [b0, b1) of a row of n bf16: the full ones in groups of 8; returns the
// first block not done (the caller finishes [that, b1) with quantize_row).
template <class F>
inline int64_t row_blocks(const uint16_t* x, int64_t n, int64_t b0, int64_t b1, int32_t mode,
                          uint8_t* data, uint8_t* scales) {
  const int64_t full = n / 32;
  const int64_t end = b1 < full ? b1 : full;
  if (mode == kRceil) {
    row_groups<F, false>(x, b0, end, mode, data, scales);
  } else {
    row_groups<F, true>(x, b0, end, mode, data, scales);
  }
  return b0 > end ? b0 : end;
}

}  // namespace simd256
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // __AVX2__
#endif  // MXJAX_CPU_SIMD256_H_
