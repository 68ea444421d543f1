// The block-scaled kernels (NVFP4, FP8 blocks, 2-D MX, stochastic rounding) for one SIMD
// level: CMake compiles this file once per level, like kernels.cc. One codec,
// ffi/include/mxjax/block_codec.h; the element loops are written for the compiler to
// vectorize at the level's width.
//
// Work units (runs of whole tiles of one tile row) go in batches of consecutive ones: their
// block amaxes (amax_tiles.h), then all their scales in one loop (E4M3 and FP32: f32
// arithmetic where block_codec.h's checks prove it exact, else block by block through
// Sig), then each unit's codes: every element encoded with its tile's multiplier (one f32
// multiply where the scales allow, the exact Sig arithmetic otherwise) and written into its
// packing group (kernels.h's layout) in the same loop; fake_quantize decodes in registers
// instead. Dequantize reads the packed codes group by group the same way.
//
// AVX-512 only (MXJAX_FP4_THRESHOLDS): FP4 codes of bf16 under byte scales come from
// per-scale-byte thresholds in 16-bit lanes, and their values (dequantize) from per-byte
// tables, both made by the codec (see there).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512BW__)
#include <immintrin.h>  // _mm_stream_si128, _mm_sfence
#endif

#include "amax.h"
#include "amax_tiles.h"
#include "kernels.h"
#include "random_bits.h"
#include "rht.h"
#include "mxjax/block_codec.h"
#include "mxjax/quantize.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

using cpu::BlockProblem;
using cpu::ceil_div;
using std::size_t;

// At most this many tiles per unit (cpu::unit_cols).
constexpr int64_t kMaxUnitTiles = cpu::kUnitCols;

struct Span {
  int64_t tile_row, r0, r1, c0, c1;  // rows [r0, r1), columns [c0, c1) of batch entry b
  int64_t b;
};

Span span_of(const BlockProblem& p, int64_t u) {
  const int64_t w = cpu::unit_cols(p), ncc = ceil_div(p.cols, w);
  const int64_t nr = ceil_div(p.rows, p.tile_rows);
  const int64_t cc = u % ncc, bi = u / ncc, i = bi % nr;
  return {i, i * p.tile_rows, min64(p.rows, (i + 1) * p.tile_rows), cc * w,
          min64(p.cols, (cc + 1) * w), bi / nr};
}

// Byte offset of the packed codes of element (b, r, c): row r of the codes where they are
// packed along the columns, c's column of byte row `r / group * group_bytes + i` where
// they are packed along the rows (i = 0 there).
template <class F>
int64_t packed_offset(const BlockProblem& p, int64_t b, int64_t r, int64_t c) {
  constexpr int kG = F::group_codes, kB = F::group_bytes;
  if (p.pack_rows) return (b * ceil_div(p.rows, kG) * kB + r / kG * kB) * p.cols + c;
  return (b * p.rows + r) * (ceil_div(p.cols, kG) * kB) + c / kG * kB;
}

// Runs along x's last dim shorter than this (narrow arrays) get their indices written
// first, then hashed in one loop: random_bits's setup would cost more than a short run.
constexpr int64_t kShortRun = 64;

// Stochastic rounding's bits of x's elements [start, start + n) (row-major): p.rand's, or
// made from p.counter into buf (n entries) one run along x's last dim at a time.
const uint32_t* sr_bits(const BlockProblem& p, int64_t start, int64_t n, uint32_t* buf) {
  if (p.rand) return p.rand + start;
  start += p.counter_first;
  const cpu::SRCounter& k = p.counter;
  const int last = k.rank - 1;
  const int64_t len = k.dims[last], total = n;
  const uint32_t step = k.strides[last];
  int64_t c = start % len, row = start / len, at[cpu::kMaxCounterRank];
  uint32_t first = k.base;  // the index of the run's element 0
  for (int d = last - 1; d >= 0; --d) {
    at[d] = row % k.dims[d], row /= k.dims[d];
    first += uint32_t(at[d]) * k.strides[d];
  }
  uint32_t offsets[kShortRun];  // short runs: element j's index less the run's first
  const bool short_runs = len < kShortRun;
  for (int64_t j = 0; short_runs && j < len; ++j) offsets[j] = uint32_t(j) * step;
  for (uint32_t* out = buf; n > 0; c = 0) {
    const int64_t m = min64(n, len - c);
    if (short_runs) {
      for (int64_t j = 0; j < m; ++j) out[j] = first + offsets[c + j];
    } else {
      random_bits(k.seed0, k.seed1, first + uint32_t(c) * step, step, m, out);
    }
    out += m, n -= m;
    for (int d = last - 1; d >= 0; --d) {  // the next run (an odometer over the other dims)
      first += k.strides[d];
      if (++at[d] < k.dims[d]) break;
      first -= uint32_t(k.dims[d]) * k.strides[d];
      at[d] = 0;
    }
  }
  if (short_runs) random_bits_of(k.seed0, k.seed1, total, buf);
  return buf;
}

// A batch of units' tiles: amax, multiplier m and decode scale d (as Sigs and f32 values),
// whether the block holds NaN / Inf (1), the stored scale, and whether its elements take
// the f32 path.
struct Tiles {
  uint32_t amax[kMaxUnitTiles], msig[kMaxUnitTiles], dsig[kMaxUnitTiles];
  int32_t mexp[kMaxUnitTiles], dexp[kMaxUnitTiles];  // Sigs as two arrays (no 8-byte stores
                                                     // of two 4-byte halves)
  float mf[kMaxUnitTiles], df[kMaxUnitTiles];
  uint32_t special[kMaxUnitTiles], stored[kMaxUnitTiles];
  bool fast[kMaxUnitTiles];
};

// E4M3 scales of n blocks (amax: f32 bits) under the tensor scale s (f32) in f32
// arithmetic (e4m3_block_scale_f32): mf, df, special (1: NaN / Inf) and the scale bytes
// (as uint32: the loop's lanes are then all 32 bits wide, 16 to a 64-byte vector, not 64
// as bytes would make them). Returns whether all of them are exact (else the caller
// redoes them).
template <class F>
__attribute__((noinline)) bool e4m3_scales(int64_t n, float s, const uint32_t* __restrict amax,
                                           float* __restrict mf, float* __restrict df,
                                           uint32_t* __restrict special,
                                           uint32_t* __restrict codes) {
  uint32_t ok = 1;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t sp = amax[j] >= kF32Inf;
    uint32_t code;
    float m, d;
    ok &= uint32_t(e4m3_block_scale_f32<F>(amax[j] & (sp - 1u), s, code, m, d));
    mf[j] = m, df[j] = d, special[j] = sp;
    codes[j] = code | (0x7Fu & (0u - sp));  // NaN / Inf: 0x7F (code 0 there)
  }
  return ok;
}

// FP32 (kPow2: FP32_POW2) scales of n blocks in f32 arithmetic, as e4m3_scales (kFake:
// checked for decoding too): q = elem_max / amax is one f32 divide, normal for any finite
// nonzero amax (Inf past FLT_MAX, clamped as block_scale clamps m), so it is div24's (and
// its exponent block_scale's power of two); 1 / m is one divide too, checked normal (a
// subnormal quotient would round twice in block_scale).
template <class F, bool kPow2, bool kFake>
__attribute__((noinline)) bool fp32_scales(int64_t n, const uint32_t* __restrict amax,
                                           float* __restrict mf, float* __restrict df,
                                           uint32_t* __restrict special,
                                           uint32_t* __restrict stored) {
  constexpr float kElemMax = float(F::max_sig) / float(1u << (23 - F::emax));  // exact
  uint32_t ok = 1;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t sp = amax[j] >= kF32Inf, a = amax[j] & (sp - 1u);
    const uint32_t q = as_bits(kElemMax / as_float(a));  // Inf where a is 0 or tiny
    uint32_t m = kPow2 ? umin(q & kF32Inf, 0x7F000000u) : umin(q, 0x7F7FFFFFu);
    m = a == 0 ? 0x3F800000u : m;
    const uint32_t inv = as_bits(1.0f / as_float(m));
    uint32_t good = uint32_t(inv >= 0x00800000u);
    if (kFake) good &= uint32_t(int32_t(inv >> 23) - 127 + F::emin - F::man_bits >= -126);
    mf[j] = as_float(m), df[j] = as_float(inv), special[j] = sp;
    stored[j] = sp ? kF32QNaN : inv;
    ok &= good;
  }
  return ok;
}

// The scales of tiles [0, n) of t from t.amax (their stored values in t.stored). Returns
// whether every tile takes the f32 path.
template <class F, bool kFake>
bool make_scales(const BlockProblem& p, Tiles& t, int64_t n, Sig s_enc) {
  if (p.scale == kScaleE4M3 &&  // one vector loop where its f32 arithmetic is exact
      e4m3_scales<F>(n, as_float(p.tensor_scale ? p.tensor_scale : 0x3F800000u), t.amax, t.mf,
                     t.df, t.special, t.stored)) {
    for (int64_t j = 0; j < n; ++j) t.fast[j] = true;
    return true;  // (a d of E4M3 always decodes on the f32 path: fast_decode)
  }
  if ((p.scale == kScaleFP32 &&
       fp32_scales<F, false, kFake>(n, t.amax, t.mf, t.df, t.special, t.stored)) ||
      (p.scale == kScaleFP32Pow2 &&
       fp32_scales<F, true, kFake>(n, t.amax, t.mf, t.df, t.special, t.stored))) {
    for (int64_t j = 0; j < n; ++j) t.fast[j] = true;
    return true;
  }
  auto scale_of = [&](uint32_t a) {
    switch (p.scale) {
      case kScaleE8M0: return block_scale<F, kScaleE8M0>(a, p.mode, s_enc);
      case kScaleE4M3: return block_scale<F, kScaleE4M3>(a, p.mode, s_enc);
      case kScaleFP32: return block_scale<F, kScaleFP32>(a, p.mode, s_enc);
      default: return block_scale<F, kScaleFP32Pow2>(a, p.mode, s_enc);
    }
  };
  bool all_fast = true;
  for (int64_t j = 0; j < n; ++j) {
    const BlockScale bs = scale_of(t.amax[j]);
    t.msig[j] = bs.m.sig, t.mexp[j] = bs.m.exp, t.dsig[j] = bs.d.sig, t.dexp[j] = bs.d.exp;
    t.mf[j] = f32_value(bs.m), t.df[j] = f32_value(bs.d);
    t.special[j] = bs.special;
    t.fast[j] = normal_f32(bs.m) && (!kFake || fast_decode<F>(bs.d, Sig{0, 0}));
    all_fast = all_fast && t.fast[j];
    t.stored[j] = bs.stored;
  }
  return all_fast;
}

// The code of element bits x under tile j of (mf, msig, mexp): the f32 path where kFast.
template <class F, bool kSR, bool kFast>
MXJAX_HD uint32_t code_of(uint32_t x, uint32_t r, float mf, uint32_t msig, int32_t mexp) {
  if constexpr (kFast) {
    return block_encode_f32_sat<F, kSR>(x, mf, r);
  } else {
    return block_encode<F, kSR>(x, Sig{msig, mexp}, r);
  }
}

// The value of a code under decode scale j (tsf / ts: the tensor scale, see unpack_run).
template <class F, bool kFast>
MXJAX_HD uint32_t value_of(uint32_t code, float df, uint32_t dsig, int32_t dexp, float tsf,
                           Sig ts) {
  if constexpr (kFast) {
    return as_bits(as_float(grid_value_bits<F>(code)) * df / tsf);
  } else {
    return block_decode<F>(code, Sig{dsig, dexp}, ts);
  }
}

// Packed codes of the first `groups` whole groups of a run of a row (x and rand from its
// first element, a group's first; group g at out + g * group_bytes), under tile j = g
// (kPerGroup) or 0. Restrict-qualified parameters let the compiler vectorize without
// alias checks; the special mask is an AND, not a select, for the same reason.
template <class F, class In, bool kSR, bool kFast, bool kPerGroup>
__attribute__((noinline)) void pack_run(int64_t groups, const typename In::T* __restrict x,
                                        const uint32_t* __restrict rand, uint8_t* __restrict out,
                                        const float* __restrict mf,
                                        const uint32_t* __restrict msig,
                                        const int32_t* __restrict mexp,
                                        const uint32_t* __restrict special) {
  constexpr int kG = F::group_codes;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t j = kPerGroup ? g : 0;
    uint32_t word = 0;
    if constexpr (kG == 2 && sizeof(typename In::T) == 2) {  // a pair of 16-bit inputs: one
      uint32_t pair;                                        // 32-bit load, no shuffles
      std::memcpy(&pair, x + 2 * g, 4);
      const uint32_t r0 = kSR ? rand[2 * g] : 0, r1 = kSR ? rand[2 * g + 1] : 0;
      word = code_of<F, kSR, kFast>(In::widen(uint16_t(pair)), r0, mf[j], msig[j], mexp[j]) |
             code_of<F, kSR, kFast>(In::widen(uint16_t(pair >> 16)), r1, mf[j], msig[j],
                                    mexp[j])
                 << F::bits;
    } else {
      for (int k = 0; k < kG; ++k) {
        uint32_t r = 0;
        if constexpr (kSR) r = rand[g * kG + k];
        word |= code_of<F, kSR, kFast>(In::widen(x[g * kG + k]), r, mf[j], msig[j], mexp[j])
                << (F::bits * k);
      }
    }
    word &= special[j] - 1u;  // 0 in a NaN / Inf block
    for (int i = 0; i < F::group_bytes; ++i) out[g * F::group_bytes + i] = uint8_t(word >> (8 * i));
  }
}

// Packed codes of a row's elements [begin, end) (begin starts a group; x, rand and out
// point at the row's first element / byte), element c under tile j0 + c / tc of t: any
// tile width, one element at a time (ragged ends, tiles that split packing groups).
template <class F, class In, bool kSR>
void pack_scalar(int64_t begin, int64_t end, int64_t tc, const typename In::T* x,
                 const uint32_t* rand, uint8_t* out, const Tiles& t, int64_t j0) {
  constexpr int kG = F::group_codes;
  for (int64_t g = begin / kG; g * kG < end; ++g) {
    uint32_t word = 0;
    for (int k = 0; k < kG && g * kG + k < end; ++k) {
      const int64_t c = g * kG + k, j = j0 + c / tc;
      const uint32_t bits = In::widen(x[c]), r = kSR ? rand[c] : 0;
      const uint32_t code = t.fast[j] ? code_of<F, kSR, true>(bits, r, t.mf[j], 0, 0)
                                      : code_of<F, kSR, false>(bits, r, 0, t.msig[j], t.mexp[j]);
      word |= (code & (t.special[j] - 1u)) << (F::bits * k);
    }
    for (int i = 0; i < F::group_bytes; ++i) out[g * F::group_bytes + i] = uint8_t(word >> (8 * i));
  }
}

// Packed codes of group_codes rows (x0.., rand r0..; `rows` of them real, the others
// padding codes 0, their pointers any real row's) into group_bytes byte rows (o0..), n
// columns, column c under tile c (b x 1 tiles).
template <class F, class In, bool kSR, bool kFast>
__attribute__((noinline)) void pack_rows_run(
    int64_t n, int rows, const typename In::T* __restrict x0, const typename In::T* __restrict x1,
    const typename In::T* __restrict x2, const typename In::T* __restrict x3,
    const uint32_t* __restrict r0, const uint32_t* __restrict r1, const uint32_t* __restrict r2,
    const uint32_t* __restrict r3, uint8_t* __restrict o0, uint8_t* __restrict o1,
    uint8_t* __restrict o2, const float* __restrict mf, const uint32_t* __restrict msig,
    const int32_t* __restrict mexp, const uint32_t* __restrict special) {
  constexpr int kG = F::group_codes;
  const uint32_t k1 = rows > 1 ? ~0u : 0u, k2 = rows > 2 ? ~0u : 0u, k3 = rows > 3 ? ~0u : 0u;
  for (int64_t c = 0; c < n; ++c) {
    auto code = [&](const typename In::T* __restrict x, const uint32_t* __restrict r) {
      return code_of<F, kSR, kFast>(In::widen(x[c]), kSR ? r[c] : 0, mf[c], msig[c], mexp[c]);
    };
    uint32_t word = code(x0, r0);
    if constexpr (kG > 1) word |= (code(x1, r1) & k1) << F::bits;
    if constexpr (kG > 2) {
      word |= (code(x2, r2) & k2) << (2 * F::bits);
      word |= (code(x3, r3) & k3) << (3 * F::bits);
    }
    word &= special[c] - 1u;
    o0[c] = uint8_t(word);
    if constexpr (F::group_bytes > 1) o1[c] = uint8_t(word >> 8);
    if constexpr (F::group_bytes > 2) o2[c] = uint8_t(word >> 16);
  }
}

// fake_quantize: the decoded f32 values (no tensor scale applied) of the codes of the n
// elements of x from c on, under their tiles' scales: element c's (kPerElement) or one
// (index 0) for all; kFast: the f32 path, else the Sig path.
template <class F, class In, bool kSR, bool kFast, bool kPerElement>
__attribute__((noinline)) void fake_run(
    int64_t n, const typename In::T* __restrict x, const uint32_t* __restrict rand,
    float* __restrict out, const float* __restrict mf, const uint32_t* __restrict msig,
    const int32_t* __restrict mexp, const float* __restrict df, const uint32_t* __restrict dsig,
    const int32_t* __restrict dexp, const uint32_t* __restrict special) {
  for (int64_t c = 0; c < n; ++c) {
    const int64_t j = kPerElement ? c : 0;
    uint32_t r = 0;
    if constexpr (kSR) r = rand[c];
    const uint32_t code = code_of<F, kSR, kFast>(In::widen(x[c]), r, mf[j], msig[j], mexp[j]);
    uint32_t v;
    if constexpr (kFast) {
      v = as_bits(as_float(grid_value_bits<F>(code)) * df[j]);
    } else {
      v = block_decode<F>(code, Sig{dsig[j], dexp[j]}, Sig{0, 0});
    }
    const uint32_t keep = special[j] - 1u;  // 0 in a NaN / Inf block
    out[c] = as_float((v & keep) | (kF32QNaN & ~keep));
  }
}

// FP4 codes from bf16 by thresholds (AVX-512BW: 16-bit lanes, variable word permutes). A
// tile's code of |x| is monotone in |x|, so it is the number of the tile's 7 thresholds
// T[k] (the least bf16 magnitude whose code is at least k) that |x| reaches: found by a
// binary search over T in 16-bit lanes, 32 elements a vector, instead of an f32 multiply
// and rounding per element. The thresholds come from the codec itself (block_encode_f32
// at the candidates), so the codes are its codes. They depend on the tile's multiplier
// only: for byte scales (E4M3 under one tensor scale, E8M0) on the scale byte, so each
// chunk of work makes a byte's row once.
#if defined(__AVX512BW__)
#define MXJAX_FP4_THRESHOLDS 1

// A tile's row: [0] the sign's keep mask (8; 0 in a NaN / Inf block), [k] T[k], k = 1..7.
// Rows by scale byte, made as they are needed, valid for one problem (its F, scale kind and
// tensor scale).
struct ThresholdRows {
  uint16_t row[256][8];
  bool ready[256] = {};
  bool all = false;  // every row a fast tile can use is made
};
#endif

#ifdef MXJAX_FP4_THRESHOLDS

// The row of a tile whose elements take the f32 path with multiplier m; `special`: a NaN /
// Inf block (no threshold is reached, the sign is dropped).
template <class F>
void threshold_row(float m, bool special, uint16_t* row) {
  row[0] = special ? 0 : 8;
  auto code = [m](uint32_t a) { return block_encode_f32_sat<F, false>(a << 16, m, 0); };
  for (uint32_t k = 1; k < 8; ++k) {
    // A start near T[k]: the grid's midpoint below code k over m, truncated to bf16.
    const float mid = 0.5f * (as_float(grid_value_bits<F>(k - 1)) + as_float(grid_value_bits<F>(k)));
    uint32_t t = umin(as_bits(mid / m) >> 16, 0x7F80u);  // m 0: Inf, no finite x reaches
    while (t > 0 && code(t - 1) >= k) --t;
    while (t < 0x7F80u && code(t) < k) ++t;
    row[k] = uint16_t(special ? 0xFFFFu : t);
  }
}

// The rows of every scale byte whose tiles can take the f32 path (the others' tiles never
// reach the thresholds): E4M3 under p's tensor scale s, m = s / d as e4m3_block_scale_f32
// makes it (code 0: m 0); E8M0, m = 2^(127 - byte); NaN bytes special.
template <class F>
void all_threshold_rows(const BlockProblem& p, ThresholdRows& rows) {
  if (p.scale == kScaleE4M3) {
    const float s = as_float(p.tensor_scale ? p.tensor_scale : 0x3F800000u);
    for (uint32_t b = 0; b < 0x7F; ++b) {
      threshold_row<F>(b == 0 ? 0.0f : s / as_float(grid_value_bits<E4M3>(b)), false, rows.row[b]);
    }
    threshold_row<F>(0.0f, true, rows.row[0x7F]);
  } else {
    for (uint32_t b = 0; b <= 253; ++b) threshold_row<F>(as_float((254u - b) << 23), false, rows.row[b]);
    threshold_row<F>(0.0f, true, rows.row[kE8M0NaN]);
  }
  rows.all = true;
}

// Chunks of at least this many tiles make all their rows first (all_threshold_rows).
constexpr int64_t kEagerTiles = 32768;

typedef uint16_t ThrV __attribute__((vector_size(64)));
typedef uint16_t ThrH __attribute__((vector_size(16)));
typedef uint16_t ThrQ __attribute__((vector_size(32)));
typedef uint32_t ThrW __attribute__((vector_size(64)));
typedef uint8_t ThrB __attribute__((vector_size(16)));

// The FP4 codes (one a lane, the sign in bit 3) of 32 bf16 x in tiles of kTC lanes by
// thresholds: the first tile's row ra, the second's rb (kTC 32: ra twice).
template <int kTC>
__attribute__((always_inline)) inline ThrV fp4_threshold_codes(const uint16_t* x,
                                                               const uint16_t* ra_row,
                                                               const uint16_t* rb_row) {
  ThrV off;  // each lane's tile's first word in the vector of rows
  for (int l = 0; l < 32; ++l) off[l] = uint16_t(l / kTC * 8);
  ThrV xv;
  std::memcpy(&xv, x, 64);
  ThrH ra, rb;
  std::memcpy(&ra, ra_row, 16);
  std::memcpy(&rb, rb_row, 16);
  const ThrQ rab = __builtin_shufflevector(ra, rb, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                           13, 14, 15);
  const ThrV tt = __builtin_shufflevector(rab, rab, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                          13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                          12, 13, 14, 15);
  const ThrV a = xv & 0x7FFF;
  ThrV c = off;  // + the code found so far: T[c + 4], then T[c + 2], T[c + 1]
  c = a >= __builtin_shuffle(tt, off + 4) ? c + 4 : c;
  c = a >= __builtin_shuffle(tt, c + 2) ? c + 2 : c;
  c = a >= __builtin_shuffle(tt, c + 1) ? c + 1 : c;
  return (c & 7) | ((xv >> 12) & __builtin_shuffle(tt, off));  // sign: bit 3
}

// Packed FP4 codes of `vecs` runs of 32 bf16 x (32 / kTC tiles each, tile j's row that of
// its scale byte bytes[j] in `rows`) into 16 bytes each; kStream: streaming stores (out
// 16-byte aligned; stream.h's reason).
template <int kTC, bool kStream>
__attribute__((noinline)) void fp4_threshold_run(int64_t vecs, const uint16_t* __restrict x,
                                                 const uint8_t* __restrict bytes,
                                                 const ThresholdRows& rows,
                                                 uint8_t* __restrict out) {
#pragma GCC unroll 4
  for (int64_t v = 0; v < vecs; ++v) {
    const ThrV code = fp4_threshold_codes<kTC>(x + 32 * v, rows.row[bytes[32 / kTC * v]],
                                               rows.row[bytes[32 / kTC * v + (kTC == 16)]]);
    ThrW w;  // two codes a 32-bit lane: low nibble first
    std::memcpy(&w, &code, 64);
    w |= w >> 12;
    const ThrB packed = __builtin_convertvector(w, ThrB);
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16 * v), __m128i(packed));
    } else {
      std::memcpy(out + 16 * v, &packed, 16);
    }
  }
}

// fp4_threshold_run, streaming where asked and out allows.
template <int kTC>
void fp4_threshold_runs(bool stream, int64_t vecs, const uint16_t* x, const uint8_t* bytes,
                        const ThresholdRows& rows, uint8_t* out) {
  if (stream && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    fp4_threshold_run<kTC, true>(vecs, x, bytes, rows, out);
  } else {
    fp4_threshold_run<kTC, false>(vecs, x, bytes, rows, out);
  }
}

// Dequantize's twin: a tile's 16 FP4 codes decode to 16 f32 values (a row, made by the
// codec: block_decode or its f32 path, NaN in a NaN block), the same for every tile of a
// scale byte; each code then picks its value with one 32-bit permute.
struct ValueRows {
  uint32_t row[256][16];
  bool ready[256] = {};
};

typedef uint32_t ValW __attribute__((vector_size(64)));
typedef uint8_t ValB __attribute__((vector_size(16)));

// f32 values of `vecs` runs of 32 packed FP4 codes (16 bytes each; 32 / kTC tiles, their
// rows at `rows`, 16 values a tile) into 32 floats each.
template <int kTC>
__attribute__((noinline)) void fp4_value_run(int64_t vecs, const uint8_t* __restrict in,
                                             const uint32_t* __restrict rows,
                                             float* __restrict out) {
#pragma GCC unroll 2
  for (int64_t v = 0; v < vecs; ++v) {
    ValB b;
    std::memcpy(&b, in + 16 * v, 16);
    const ValW w = __builtin_convertvector(b, ValW), lo = w & 15, hi = w >> 4;
    const ValW c0 = __builtin_shufflevector(lo, hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21,
                                            6, 22, 7, 23);
    const ValW c1 = __builtin_shufflevector(lo, hi, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13,
                                            29, 14, 30, 15, 31);
    ValW r0, r1;
    std::memcpy(&r0, rows + 32 / kTC * 16 * v, 64);
    std::memcpy(&r1, rows + 32 / kTC * 16 * v + (kTC == 16 ? 16 : 0), 64);
    const ValW o0 = __builtin_shuffle(r0, c0), o1 = __builtin_shuffle(r1, c1);
    std::memcpy(out + 32 * v, &o0, 64);
    std::memcpy(out + 32 * v + 16, &o1, 64);
  }
}

// The values of every scale byte whose tiles decode on the f32 path, no tensor scale
// applied (fake_quantize): d = the byte's E4M3 value or 2^(byte - 127); NaN bytes NaN.
template <class F>
void all_value_rows(const BlockProblem& p, ValueRows& rows) {
  const bool e4m3 = p.scale == kScaleE4M3;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool nan = e4m3 ? b == 0x7F : b == kE8M0NaN;
    const float d = e4m3 ? as_float(grid_value_bits<E4M3>(b & 0x7F)) : as_float(b << 23);
    for (uint32_t c = 0; c < 16; ++c) {
      rows.row[b][c] = nan ? kF32QNaN : value_of<F, true>(c, d, 0, 0, 1.0f, Sig{0, 0});
    }
  }
}

// fake_quantize of `vecs` runs of 32 bf16 x: their codes by thresholds (as
// fp4_threshold_run), their values by the rows of values (as fp4_value_run), f32 out.
template <int kTC>
__attribute__((noinline)) void fp4_fake_run(int64_t vecs, const uint16_t* __restrict x,
                                            const uint8_t* __restrict bytes,
                                            const ThresholdRows& thresholds,
                                            const ValueRows& values, float* __restrict out) {
#pragma GCC unroll 2
  for (int64_t v = 0; v < vecs; ++v) {
    const uint8_t ba = bytes[32 / kTC * v], bb = bytes[32 / kTC * v + (kTC == 16)];
    const ThrV code = fp4_threshold_codes<kTC>(x + 32 * v, thresholds.row[ba],
                                               thresholds.row[bb]);
    const ThrQ lo = __builtin_shufflevector(code, code, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                            12, 13, 14, 15);
    const ThrQ hi = __builtin_shufflevector(code, code, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                                            26, 27, 28, 29, 30, 31);
    ValW va, vb;
    std::memcpy(&va, values.row[ba], 64);
    std::memcpy(&vb, values.row[bb], 64);
    const ValW o0 = __builtin_shuffle(va, __builtin_convertvector(lo, ValW));
    const ValW o1 = __builtin_shuffle(vb, __builtin_convertvector(hi, ValW));
    std::memcpy(out + 32 * v, &o0, 64);
    std::memcpy(out + 32 * v + 16, &o1, 64);
  }
}
#endif

// What the calls of one chunk of work share (quantize_2x's many calls: the row and column
// problems' byte scales decode alike).
struct Shared {
#ifdef MXJAX_FP4_THRESHOLDS
  ThresholdRows thresholds;
  ValueRows values;  // dequantize
#endif
};

// Walks units from one on, their spans and first scales' indices, without dividing.
struct UnitIter {
  const BlockProblem& p;
  int64_t w, ncc, nr, nc, cc, i, b;
  UnitIter(const BlockProblem& prob, int64_t u) : p(prob) {
    w = cpu::unit_cols(p), ncc = ceil_div(p.cols, w), nr = ceil_div(p.rows, p.tile_rows);
    nc = ceil_div(p.cols, p.tile_cols);
    cc = u % ncc;
    const int64_t bi = u / ncc;
    i = bi % nr, b = bi / nr;
  }
  Span span() const {
    Span s;
    fill(s);
    return s;
  }
  void fill(Span& s) const {  // field by field (a whole-struct copy stalls on forwarding)
    s.tile_row = i, s.r0 = i * p.tile_rows, s.r1 = min64(p.rows, (i + 1) * p.tile_rows);
    s.c0 = cc * w, s.c1 = min64(p.cols, (cc + 1) * w), s.b = b;
  }
  int64_t scale_index() const { return (b * nr + i) * nc + cc * (w / p.tile_cols); }
  void next() {
    if (++cc == ncc) {
      cc = 0;
      if (++i == nr) i = 0, ++b;
    }
  }
};

// Units whose tiles' scales are made in one loop (E4M3's chain of divides then overlaps).
constexpr int kMaxBatch = 8;

// Quantize (kFake: fake_quantize, f32 out, no tensor scale applied) the units [begin, end)
// of p, elements F from In, stochastic rounding when kSR; tiles kTC columns wide (16, 32:
// narrow tiles, whose amaxes reduce in registers; 0: p.tile_cols). Units go in batches of
// consecutive ones: amaxes, then all their scales, then each unit's codes.
template <class F, class In, bool kSR, bool kFake, int kTC>
void quantize_units(const BlockProblem& p, int64_t begin, int64_t end, Shared& shared) {
  using T = typename In::T;
  constexpr int kG = F::group_codes, kB = F::group_bytes;
  const T* x = static_cast<const T*>(p.x);
  const Sig s_enc = p.tensor_scale ? sig_of_bits(p.tensor_scale) : Sig{0x800000u, -23};
  const int64_t tc = kTC ? kTC : p.tile_cols;
  const bool scales32 = p.scale >= kScaleFP32;
  Tiles t;
  float mfg[cpu::kUnitCols], dfe[cpu::kUnitCols];  // per group / column, where tiles are spread
  uint32_t spg[cpu::kUnitCols];
  Span spans[kMaxBatch];
  int64_t first[kMaxBatch + 1], sidx[kMaxBatch];
  // Counter bits of a unit's rows (pack_rows: group_codes of them at a time).
  std::vector<uint32_t> bits(kSR && !p.rand ? kG * cpu::unit_cols(p) : 0);
  UnitIter it(p, begin);
#ifdef MXJAX_FP4_THRESHOLDS
  constexpr bool kThresholds = std::is_same_v<F, E2M1> && std::is_same_v<In, BF16> && !kSR &&
                               (kTC == 16 || kTC == 32);
  const bool thresholds = kThresholds && (p.scale == kScaleE4M3 || p.scale == kScaleE8M0);
  ThresholdRows& cache = shared.thresholds;
  // Large chunks make every byte's row first (about 50K cycles) rather than look each tile's
  // up (about 1.4 cycles a tile).
  const bool eager = thresholds && !cache.all &&
                     (end - begin) * (cpu::unit_cols(p) / tc) >=
                         kEagerTiles;
  if (eager) {
    all_threshold_rows<F>(p, cache);
    if (kFake) all_value_rows<F>(p, shared.values);
  }

#endif
  for (int64_t u = begin; u < end;) {
    int nb = 0;
    first[0] = 0;
    for (; u < end && nb < kMaxBatch; ++u, ++nb, it.next()) {
      Span& s = spans[nb];
      it.fill(s);
      const int64_t tiles = ceil_div(s.c1 - s.c0, tc);
      if (nb > 0 && first[nb] + tiles > kMaxUnitTiles) break;
      sidx[nb] = it.scale_index(), first[nb + 1] = first[nb] + tiles;
      bool whole = false;  // a whole unit of narrow tiles: reduced in registers
      if constexpr (kTC > 1) {
        whole = s.c1 - s.c0 == cpu::kUnitCols;
        if (whole) {
          unit_tile_amax<In, kTC>(x + (s.b * p.rows + s.r0) * p.cols + s.c0, p.cols,
                                  s.r1 - s.r0, t.amax + first[nb]);
        }
      }
      if (!whole) {
        tile_amax<In, kTC>(x + (s.b * p.rows + s.r0) * p.cols + s.c0, p.cols, s.r1 - s.r0,
                           s.c1 - s.c0, tc, t.amax + first[nb]);
      }
    }
    const bool batch_fast = make_scales<F, kFake>(p, t, first[nb], s_enc);
#ifdef MXJAX_FP4_THRESHOLDS
    // Rows of whole units end to end (1-D blocks, rows a multiple of kUnitCols): one run
    // of thresholds over the batch.
    bool run = kThresholds && !kFake && thresholds && batch_fast && p.tile_rows == 1;
    for (int k = 0; run && k < nb; ++k) {
      const Span& s = spans[k];
      run = s.c1 - s.c0 == cpu::kUnitCols &&
            (k == 0 || ((s.b * p.rows + s.r0) * p.cols + s.c0 ==
                            (spans[k - 1].b * p.rows + spans[k - 1].r0) * p.cols +
                                spans[k - 1].c1 &&
                        sidx[k] == sidx[k - 1] + first[k] - first[k - 1]));
    }
    if (run) {
      uint8_t* scales = static_cast<uint8_t*>(p.scales) + sidx[0];
      for (int64_t j = 0; j < first[nb]; ++j) scales[j] = uint8_t(t.stored[j]);
      for (int64_t j = 0; !cache.all && j < first[nb]; ++j) {
        if (!cache.ready[scales[j]]) {
          threshold_row<F>(t.mf[j], t.special[j] != 0, cache.row[scales[j]]);
          cache.ready[scales[j]] = true;
        }
      }
      const Span& s = spans[0];
      fp4_threshold_runs<kTC>(p.stream, nb * (cpu::kUnitCols / 32),
                             reinterpret_cast<const uint16_t*>(x + (s.b * p.rows + s.r0) * p.cols + s.c0),
                             scales, cache, p.codes + packed_offset<F>(p, s.b, s.r0, s.c0));
      continue;
    }
#endif
    for (int k = 0; k < nb; ++k) {
      const Span& s = spans[k];
      const int64_t width = s.c1 - s.c0, tiles = first[k + 1] - first[k], j0 = first[k];
      if (!kFake) {  // the unit's scales
        if (scales32) {
          uint32_t* out = static_cast<uint32_t*>(p.scales) + sidx[k];
          for (int64_t j = 0; j < tiles; ++j) out[j] = t.stored[j0 + j];
        } else {
          uint8_t* out = static_cast<uint8_t*>(p.scales) + sidx[k];
          for (int64_t j = 0; j < tiles; ++j) out[j] = uint8_t(t.stored[j0 + j]);
        }
      }
      bool all_fast = batch_fast;
      for (int64_t j = 0; !batch_fast && j < tiles; ++j) all_fast = all_fast && t.fast[j0 + j];
      const float* mf = t.mf + j0;
      const float* df = t.df + j0;
      const uint32_t* msig = t.msig + j0;
      const int32_t* mexp = t.mexp + j0;
      const uint32_t* dsig = t.dsig + j0;
      const int32_t* dexp = t.dexp + j0;
      const uint32_t* special = t.special + j0;
      const bool* fast = t.fast + j0;
      // Tiles no wider than a unit, whose scales all take the f32 path: spread the scales
      // over the groups (fake_quantize: the columns), so that whole rows run as one loop.
      const int64_t per = kFake ? 1 : kG;  // elements per spread entry
      const bool spread = all_fast && tc > 1 && tc <= 32 && tc % per == 0 && width <= cpu::kUnitCols;
#ifdef MXJAX_FP4_THRESHOLDS
      const bool by_thresholds = thresholds && spread && width == cpu::kUnitCols;
      if (kFake && by_thresholds) {  // codes by thresholds, values by rows of values
        uint8_t bytes[cpu::kUnitCols / 16];
        for (int64_t j = 0; j < tiles; ++j) {
          const uint32_t b = bytes[j] = uint8_t(t.stored[j0 + j]);
          if (cache.all || cache.ready[b]) continue;
          threshold_row<F>(mf[j], special[j] != 0, cache.row[b]);
          for (uint32_t c = 0; c < 16; ++c) {
            shared.values.row[b][c] =
                special[j] ? kF32QNaN : value_of<F, true>(c, df[j], 0, 0, 1.0f, Sig{0, 0});
          }
          cache.ready[b] = true;
        }
        for (int64_t r = s.r0; r < s.r1; ++r) {
          const int64_t start = (s.b * p.rows + r) * p.cols + s.c0;
          fp4_fake_run<kTC>(width / 32, reinterpret_cast<const uint16_t*>(x + start), bytes,
                            cache, shared.values, p.out + start);
        }
        continue;
      }
      if (!kFake && by_thresholds) {  // the unit's scale bytes pick its tiles' rows
        const uint8_t* bytes = static_cast<const uint8_t*>(p.scales) + sidx[k];
        for (int64_t j = 0; !cache.all && j < tiles; ++j) {
          if (!cache.ready[bytes[j]]) {
            threshold_row<F>(mf[j], special[j] != 0, cache.row[bytes[j]]);
            cache.ready[bytes[j]] = true;
          }
        }
        for (int64_t r = s.r0; r < s.r1; ++r) {
          const int64_t start = (s.b * p.rows + r) * p.cols + s.c0;
          fp4_threshold_runs<kTC>(p.stream, width / 32,
                                  reinterpret_cast<const uint16_t*>(x + start), bytes, cache,
                                  p.codes + packed_offset<F>(p, s.b, r, s.c0));
        }
        continue;
      }
#endif
      for (int64_t j = 0; spread && j < tiles; ++j) {
        for (int64_t e = 0; e < tc / per; ++e) {  // a broadcast store; past width: unused
          mfg[j * (tc / per) + e] = mf[j], spg[j * (tc / per) + e] = special[j];
          if (kFake) dfe[j * tc + e] = df[j];
        }
      }
      if constexpr (kFake) {
        for (int64_t r = s.r0; r < s.r1; ++r) {
          const int64_t start = (s.b * p.rows + r) * p.cols + s.c0;
          const T* xr = x + start;
          const uint32_t* rr = kSR ? sr_bits(p, start, width, bits.data()) : nullptr;
          float* o = p.out + start;
          if (spread) {
            fake_run<F, In, kSR, true, true>(width, xr, rr, o, mfg, msig, mexp, dfe, dsig, dexp,
                                             spg);
          } else if (tc == 1) {
            if (all_fast) {
              fake_run<F, In, kSR, true, true>(width, xr, rr, o, mf, msig, mexp, df, dsig, dexp,
                                               special);
            } else {
              fake_run<F, In, kSR, false, true>(width, xr, rr, o, mf, msig, mexp, df, dsig,
                                                dexp, special);
            }
          } else {
            for (int64_t j = 0; j < tiles; ++j) {
              const int64_t c = j * tc, n = min64(tc, width - c);
              const uint32_t* rc = kSR ? rr + c : nullptr;
              if (fast[j]) {
                fake_run<F, In, kSR, true, false>(n, xr + c, rc, o + c, mf + j, msig + j,
                                                  mexp + j, df + j, dsig + j, dexp + j,
                                                  special + j);
              } else {
                fake_run<F, In, kSR, false, false>(n, xr + c, rc, o + c, mf + j, msig + j,
                                                   mexp + j, df + j, dsig + j, dexp + j,
                                                   special + j);
              }
            }
          }
        }
        continue;
      }
      if (p.pack_rows) {  // b x 1 tiles: group_codes rows into group_bytes byte rows
        for (int64_t r = s.r0; r < s.r1; r += kG) {
          const int rows = int(min64(kG, s.r1 - r));
          const T* xs[4];
          const uint32_t* rs[4] = {nullptr, nullptr, nullptr, nullptr};
          for (int e = 0; e < 4; ++e) {
            const int64_t start = (s.b * p.rows + r + (e < rows ? e : 0)) * p.cols + s.c0;
            xs[e] = x + start;
            if (kSR) {
              rs[e] = e < rows ? sr_bits(p, start, width, bits.data() + e * width) : rs[0];
            }
          }
          uint8_t* o = p.codes + packed_offset<F>(p, s.b, r, s.c0);
          uint8_t* o1 = kB > 1 ? o + p.cols : o;
          uint8_t* o2 = kB > 2 ? o + 2 * p.cols : o;
          if (all_fast) {
            pack_rows_run<F, In, kSR, true>(width, rows, xs[0], xs[1], xs[2], xs[3], rs[0],
                                            rs[1], rs[2], rs[3], o, o1, o2, mf, msig, mexp,
                                            special);
          } else {
            pack_rows_run<F, In, kSR, false>(width, rows, xs[0], xs[1], xs[2], xs[3], rs[0],
                                             rs[1], rs[2], rs[3], o, o1, o2, mf, msig, mexp,
                                             special);
          }
        }
        continue;
      }
      for (int64_t r = s.r0; r < s.r1; ++r) {  // packed along the row
        const int64_t start = (s.b * p.rows + r) * p.cols + s.c0;
        const T* xr = x + start;
        const uint32_t* rr = kSR ? sr_bits(p, start, width, bits.data()) : nullptr;
        uint8_t* o = p.codes + packed_offset<F>(p, s.b, r, s.c0);
        if (spread || (tc == 1 && kG == 1)) {  // tile j = group g
          const int64_t full = width / kG;
          if (spread || all_fast) {
            pack_run<F, In, kSR, true, true>(full, xr, rr, o, spread ? mfg : mf, msig, mexp,
                                             spread ? spg : special);
          } else {
            pack_run<F, In, kSR, false, true>(full, xr, rr, o, mf, msig, mexp, special);
          }
          if (full * kG < width) {
            pack_scalar<F, In, kSR>(full * kG, width, tc, xr, rr, o, t, j0);
          }
        } else if (tc % kG == 0) {  // tile by tile, each of whole groups (bar a ragged end)
          for (int64_t j = 0; j < tiles; ++j) {
            const int64_t c = j * tc, n = min64(tc, width - c), full = n / kG;
            const uint32_t* rc = kSR ? rr + c : nullptr;
            uint8_t* oc = o + c / kG * kB;
            if (fast[j]) {
              pack_run<F, In, kSR, true, false>(full, xr + c, rc, oc, mf + j, msig + j,
                                                mexp + j, special + j);
            } else {
              pack_run<F, In, kSR, false, false>(full, xr + c, rc, oc, mf + j, msig + j,
                                                 mexp + j, special + j);
            }
            if (full * kG < n) {
              pack_scalar<F, In, kSR>(c + full * kG, c + n, tc, xr, rr, o, t, j0);
            }
          }
        } else {  // tiles that split packing groups
          pack_scalar<F, In, kSR>(0, width, tc, xr, rr, o, t, j0);
        }
      }
    }
  }
}

// A unit's decode scales: d as a Sig and an f32, NaN (1), and whether it decodes on the f32
// path.
struct DecodeTiles {
  uint32_t dsig[kMaxUnitTiles], nan[kMaxUnitTiles];
  int32_t dexp[kMaxUnitTiles];
  float df[kMaxUnitTiles];
  bool fast[kMaxUnitTiles];
};

// f32 values of the first `groups` whole groups of packed codes (group g at in + g *
// group_bytes; its values at out + g * group_codes) under decode scale j = g (kPerGroup) or
// 0, divided by the tensor scale ts where it is nonzero (tsf: its f32, else 1).
template <class F, bool kFast, bool kPerGroup>
__attribute__((noinline)) void unpack_run(int64_t groups, const uint8_t* __restrict in,
                                          float* __restrict out, const float* __restrict df,
                                          const uint32_t* __restrict dsig,
                                          const int32_t* __restrict dexp,
                                          const uint32_t* __restrict nan, float tsf, Sig ts) {
  constexpr int kG = F::group_codes;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t j = kPerGroup ? g : 0;
    uint32_t word = 0;
    for (int i = 0; i < F::group_bytes; ++i) word |= uint32_t(in[g * F::group_bytes + i]) << (8 * i);
    const uint32_t keep = nan[j] - 1u;  // as in pack_run
    for (int k = 0; k < kG; ++k) {
      const uint32_t code = (word >> (F::bits * k)) & ((1u << F::bits) - 1);
      const uint32_t v = value_of<F, kFast>(code, df[j], dsig[j], dexp[j], tsf, ts);
      out[g * kG + k] = as_float((v & keep) | (kF32QNaN & ~keep));
    }
  }
}

// f32 values of one row of codes packed along the rows (the row's group_bytes byte rows
// i0.., its codes at bit `shift` of their words), n columns, column c under scale c.
template <class F, bool kFast>
__attribute__((noinline)) void unpack_rows_run(
    int64_t n, const uint8_t* __restrict i0, const uint8_t* __restrict i1,
    const uint8_t* __restrict i2, uint32_t shift, float* __restrict out,
    const float* __restrict df, const uint32_t* __restrict dsig, const int32_t* __restrict dexp,
    const uint32_t* __restrict nan, float tsf, Sig ts) {
  for (int64_t c = 0; c < n; ++c) {
    uint32_t word = i0[c];
    if constexpr (F::group_bytes > 1) word |= uint32_t(i1[c]) << 8;
    if constexpr (F::group_bytes > 2) word |= uint32_t(i2[c]) << 16;
    const uint32_t code = (word >> shift) & ((1u << F::bits) - 1);
    const uint32_t v = value_of<F, kFast>(code, df[c], dsig[c], dexp[c], tsf, ts);
    const uint32_t keep = nan[c] - 1u;
    out[c] = as_float((v & keep) | (kF32QNaN & ~keep));
  }
}

// f32 values of a row's elements [begin, end) (in and out at the row's first byte /
// element), element c under tile c / tc: any tile width, one element at a time.
template <class F>
void unpack_scalar(int64_t begin, int64_t end, int64_t tc, const uint8_t* in, float* out,
                   const DecodeTiles& t, float tsf, Sig ts) {
  constexpr int kG = F::group_codes;
  for (int64_t c = begin; c < end; ++c) {
    const int64_t g = c / kG, j = c / tc;
    uint32_t word = 0;
    for (int i = 0; i < F::group_bytes; ++i) word |= uint32_t(in[g * F::group_bytes + i]) << (8 * i);
    const uint32_t code = (word >> (F::bits * (c % kG))) & ((1u << F::bits) - 1);
    const uint32_t v = t.fast[j] ? value_of<F, true>(code, t.df[j], 0, 0, tsf, ts)
                                 : value_of<F, false>(code, 0, t.dsig[j], t.dexp[j], tsf, ts);
    out[c] = t.nan[j] ? as_float(kF32QNaN) : as_float(v);
  }
}

// f32 values of the packed codes and scales of the units [begin, end) of p.
template <class F>
void dequantize_units(const BlockProblem& p, int64_t begin, int64_t end) {
  constexpr int kG = F::group_codes, kB = F::group_bytes;
#ifdef MXJAX_FP4_THRESHOLDS
  Shared shared;
  ValueRows& cache = shared.values;
  uint32_t urows[cpu::kUnitCols / 16 + 1][16];
  const bool by_values = std::is_same_v<F, E2M1> && !p.pack_rows &&
                         (p.scale == kScaleE4M3 || p.scale == kScaleE8M0) &&
                         (p.tile_cols == 16 || p.tile_cols == 32);
#endif
  const Sig ts =
      p.apply_tensor_scale && p.tensor_scale ? sig_of_bits(p.tensor_scale) : Sig{0, 0};
  const float tsf = ts.sig ? as_float(p.tensor_scale) : 1.0f;  // exact (f32_value: normals only)
  const int64_t tc = p.tile_cols;
  const bool narrow = tc == 16 || tc == 32;
  DecodeTiles t;
  uint32_t nang[cpu::kUnitCols];
  float dfg[cpu::kUnitCols];
  // A 16-bit output: each row's f32 values go to `row` first, then narrowed (RNE) in place.
  const bool out16 = p.out_dtype != cpu::kF32;
  std::vector<float> row(out16 ? cpu::unit_cols(p) : 0);
  auto out_at = [&](int64_t off) { return out16 ? row.data() : p.out + off; };
  auto narrowed = [&](int64_t off, int64_t width) {
    if (!out16) return;
    uint16_t* __restrict o = p.out16 + off;
    const float* __restrict v = row.data();
    if (p.out_dtype == cpu::kBF16) {
      for (int64_t c = 0; c < width; ++c) o[c] = f32_to_bf16(as_bits(v[c]));
    } else {
      for (int64_t c = 0; c < width; ++c) o[c] = f32_to_f16(as_bits(v[c]));
    }
  };
  UnitIter it(p, begin);
  for (int64_t u = begin; u < end; ++u, it.next()) {
    const Span s = it.span();
    const int64_t width = s.c1 - s.c0, tiles = ceil_div(width, tc);
    const int64_t si = it.scale_index();
    // Tile j's decode scale, NaN flag and path (t's entries j).
    auto decode_scale = [&](int64_t j) {
      const uint32_t stored = p.scale >= kScaleFP32
                                  ? static_cast<const uint32_t*>(p.in_scales)[si + j]
                                  : static_cast<const uint8_t*>(p.in_scales)[si + j];
      bool is_nan;
      const Sig d = stored_scale_value(stored, p.scale, is_nan);
      t.nan[j] = is_nan;
      t.dsig[j] = d.sig, t.dexp[j] = d.exp, t.df[j] = f32_value(d);
      t.fast[j] = fast_decode<F>(d, ts);
      return t.fast[j];
    };
#ifdef MXJAX_FP4_THRESHOLDS
    if (by_values && width == cpu::kUnitCols) {  // the unit's rows of values, in tile order
      for (int64_t j = 0; j < tiles; ++j) {
        const uint32_t byte = static_cast<const uint8_t*>(p.in_scales)[si + j];
        if (!cache.ready[byte]) {
          decode_scale(j);
          for (uint32_t c = 0; c < 16; ++c) {
            cache.row[byte][c] =
                t.nan[j]    ? kF32QNaN
                : t.fast[j] ? value_of<F, true>(c, t.df[j], 0, 0, tsf, ts)
                            : value_of<F, false>(c, 0, t.dsig[j], t.dexp[j], tsf, ts);
          }
          cache.ready[byte] = true;
        }
        std::memcpy(urows[j], cache.row[byte], 64);
      }
      for (int64_t r = s.r0; r < s.r1; ++r) {
        const int64_t off = (s.b * p.rows + r) * p.cols + s.c0;
        if (p.tile_cols == 16) {
          fp4_value_run<16>(width / 32, p.in_codes + packed_offset<F>(p, s.b, r, s.c0),
                            urows[0], out_at(off));
        } else {
          fp4_value_run<32>(width / 32, p.in_codes + packed_offset<F>(p, s.b, r, s.c0),
                            urows[0], out_at(off));
        }
        narrowed(off, width);
      }
      continue;
    }
#endif
    bool all_fast = true;
    for (int64_t j = 0; j < tiles; ++j) all_fast = decode_scale(j) && all_fast;
    if (p.pack_rows) {
      for (int64_t r = s.r0; r < s.r1; ++r) {
        const uint8_t* in = p.in_codes + packed_offset<F>(p, s.b, r, s.c0);
        const uint8_t* in1 = kB > 1 ? in + p.cols : in;
        const uint8_t* in2 = kB > 2 ? in + 2 * p.cols : in;
        const uint32_t shift = uint32_t(F::bits * (r % kG));
        const int64_t off = (s.b * p.rows + r) * p.cols + s.c0;
        float* out = out_at(off);
        if (all_fast) {
          unpack_rows_run<F, true>(width, in, in1, in2, shift, out, t.df, t.dsig, t.dexp, t.nan,
                                   tsf, ts);
        } else {
          unpack_rows_run<F, false>(width, in, in1, in2, shift, out, t.df, t.dsig, t.dexp, t.nan,
                                    tsf, ts);
        }
        narrowed(off, width);
      }
      continue;
    }
    const bool spread = narrow && all_fast;  // as in quantize_units
    for (int64_t j = 0; spread && j < tiles; ++j) {
      for (int64_t k = 0; k < tc / kG; ++k) dfg[j * (tc / kG) + k] = t.df[j], nang[j * (tc / kG) + k] = t.nan[j];
    }
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const uint8_t* in = p.in_codes + packed_offset<F>(p, s.b, r, s.c0);
      const int64_t off = (s.b * p.rows + r) * p.cols + s.c0;
      float* out = out_at(off);
      if (spread || (tc == 1 && kG == 1)) {
        const int64_t full = width / kG;
        const float* df = spread ? dfg : t.df;
        const uint32_t* nan = spread ? nang : t.nan;
        if (spread || all_fast) {
          unpack_run<F, true, true>(full, in, out, df, t.dsig, t.dexp, nan, tsf, ts);
        } else {
          unpack_run<F, false, true>(full, in, out, df, t.dsig, t.dexp, nan, tsf, ts);
        }
        if (full * kG < width) unpack_scalar<F>(full * kG, width, tc, in, out, t, tsf, ts);
      } else if (tc % kG == 0) {
        for (int64_t j = 0; j < tiles; ++j) {
          const int64_t c = j * tc, n = min64(tc, width - c), full = n / kG;
          if (t.fast[j]) {
            unpack_run<F, true, false>(full, in + c / kG * kB, out + c, t.df + j, t.dsig + j,
                                       t.dexp + j, t.nan + j, tsf, ts);
          } else {
            unpack_run<F, false, false>(full, in + c / kG * kB, out + c, t.df + j, t.dsig + j,
                                        t.dexp + j, t.nan + j, tsf, ts);
          }
          if (full * kG < n) unpack_scalar<F>(c + full * kG, c + n, tc, in, out, t, tsf, ts);
        }
      } else {
        unpack_scalar<F>(0, width, tc, in, out, t, tsf, ts);
      }
      narrowed(off, width);
    }
  }
}

template <bool kFake>
void quantize_dispatch(const BlockProblem& p, int64_t begin, int64_t end, Shared& shared) {
  with_format(p.format, [&](auto f) {
    using F = decltype(f);
    auto run = [&](auto in) {
      using In = decltype(in);
      auto width = [&](auto sr) {
        constexpr bool kSR = decltype(sr)::value;
        switch (p.tile_cols) {
          case 16: return quantize_units<F, In, kSR, kFake, 16>(p, begin, end, shared);
          case 32: return quantize_units<F, In, kSR, kFake, 32>(p, begin, end, shared);
          default: return quantize_units<F, In, kSR, kFake, 0>(p, begin, end, shared);
        }
      };
      if (p.rand || p.counter.rank) {
        width(std::true_type{});
      } else {
        width(std::false_type{});
      }
    };
    if (p.dtype == cpu::kBF16) return run(BF16{});  // f16 comes widened to f32
    return run(F32{});
  });
}

// Orders a chunk's streaming stores before its completion is signalled.
void stream_fence(const BlockProblem& p) {
#ifdef MXJAX_FP4_THRESHOLDS
  if (p.stream) _mm_sfence();
#endif
}

void quantize(const BlockProblem& p, int64_t begin, int64_t end) {
  Shared shared;
  quantize_dispatch<false>(p, begin, end, shared);
  stream_fence(p);
}

void fake_quantize(const BlockProblem& p, int64_t begin, int64_t end) {
  Shared shared;
  quantize_dispatch<true>(p, begin, end, shared);
}

// A band of b rows at a time: each unit quantizes its band's columns, then the band's rows
// while they are in cache (one pass over x in memory).
void quantize_2x(const cpu::BlockPair& p, int64_t begin, int64_t end) {
  const int64_t ncc = ceil_div(p.col.cols, cpu::unit_cols(p.col));
  Shared shared;
  for (int64_t u = begin; u < end; ++u) {
    quantize_dispatch<false>(p.col, u, u + 1, shared);
    const Span s = span_of(p.col, u);
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const int64_t row_unit = (s.b * p.row.rows + r) * ncc + u % ncc;
      quantize_dispatch<false>(p.row, row_unit, row_unit + 1, shared);
    }
  }
  stream_fence(p.row);
}

void dequantize(const BlockProblem& p, int64_t begin, int64_t end) {
  with_format(p.format, [&](auto f) { dequantize_units<decltype(f)>(p, begin, end); });
}

}  // namespace
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#define MXJAX_CAT2(a, b) a##b
#define MXJAX_CAT(a, b) MXJAX_CAT2(a, b)

const mxjax::cpu::BlockKernels& mxjax::cpu::MXJAX_CAT(block_kernels_, MXJAX_ISA_NS)() {
  static const BlockKernels table = {&mxjax::quantize, &mxjax::dequantize,
                                     &mxjax::fake_quantize, &mxjax::quantize_2x,
                                     &mxjax::tensor_amax, &mxjax::rht};
  return table;
}
