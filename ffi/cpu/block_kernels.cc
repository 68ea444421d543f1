// The block-scaled kernels (NVFP4, FP8 blocks, 2-D MX, stochastic rounding) for one SIMD
// level: CMake compiles this file once per level, like kernels.cc, and the element loops
// below are written for the compiler to vectorize at that level's width (one codec,
// ffi/include/mxjax/block_codec.h, no per-ISA code).
//
// A work unit is a run of whole tiles of one tile row: its block amaxes are reduced, each
// tile's scale is made once (scalar), then every element is encoded (and, for
// fake_quantize, decoded) with its tile's multiplier: one f32 multiply where the block's
// scales allow it (block_codec.h's fast path), the exact Sig arithmetic otherwise.
#include <cstdint>
#include <type_traits>

#include "kernels.h"
#include "mxjax/block_codec.h"
#include "mxjax/quantize.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

using cpu::BlockProblem;
using cpu::ceil_div;

// At most this many tiles per unit (b x 1 tiles, kUnitCols columns).
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

// Index of the first scale of a span's tile row.
int64_t scale_index(const BlockProblem& p, const Span& s) {
  const int64_t nc = ceil_div(p.cols, p.tile_cols);
  return (s.b * ceil_div(p.rows, p.tile_rows) + s.tile_row) * nc + s.c0 / p.tile_cols;
}

Sig tensor_scale_sig(uint32_t bits) { return bits ? sig_of_bits(bits) : Sig{0x800000u, -23}; }

// Codes (or, kFake, their decoded f32 values) of the n elements of x from c on, under
// their tiles' scales: element c's (kPerElement: b x 1 tiles) or one (index 0) for all.
// kFast: the f32 path (block_codec.h), else the Sig path. Restrict-qualified parameters
// let the compiler vectorize without alias checks.
template <class F, class In, bool kSR, bool kFake, bool kFast, bool kPerElement>
__attribute__((noinline)) void code_run(
    int64_t n, const typename In::T* __restrict x, const uint32_t* __restrict rand,
    uint8_t* __restrict codes, float* __restrict out, const float* __restrict mf,
    const uint32_t* __restrict msig, const int32_t* __restrict mexp, const float* __restrict df,
    const uint32_t* __restrict dsig, const int32_t* __restrict dexp,
    const uint32_t* __restrict special) {
  for (int64_t c = 0; c < n; ++c) {
    const int64_t j = kPerElement ? c : 0;
    const uint32_t bits = In::widen(x[c]);
    uint32_t r = 0;
    if constexpr (kSR) r = rand[c];
    uint32_t code;
    if constexpr (kFast) {
      code = block_encode_f32<F, kSR>(bits, mf[j], r);
    } else {
      code = block_encode<F, kSR>(bits, Sig{msig[j], mexp[j]}, r);
    }
    const uint32_t keep = special[j] - 1u;  // 0 in a NaN / Inf block (a mask, not a select:
    code &= keep;                           // the loop then vectorizes at every level)
    if constexpr (kFake) {
      uint32_t v;
      if constexpr (kFast) {
        v = as_bits(as_float(grid_value_bits<F>(code)) * df[j]);
      } else {
        v = block_decode<F>(code, Sig{dsig[j], dexp[j]}, Sig{0, 0});
      }
      out[c] = as_float((v & keep) | (kF32QNaN & ~keep));
    } else {
      codes[c] = uint8_t(code);
    }
  }
}

// Quantize (kFake: dequantize in registers, f32 out, no tensor scale applied) the units
// [begin, end) of p, elements F from In, stochastic rounding when kSR; tiles kTC columns
// wide (16, 32: narrow tiles, whose scales are spread over the columns; 0: p.tile_cols).
template <class F, class In, bool kSR, bool kFake, int kTC>
void quantize_units(const BlockProblem& p, int64_t begin, int64_t end) {
  using T = typename In::T;
  const T* x = static_cast<const T*>(p.x);
  const Sig s_enc = tensor_scale_sig(p.tensor_scale);
  const int64_t tc = kTC ? kTC : p.tile_cols;
  uint32_t amax[kMaxUnitTiles], msig[kMaxUnitTiles], dsig[kMaxUnitTiles];
  int32_t mexp[kMaxUnitTiles], dexp[kMaxUnitTiles];  // Sigs as two arrays (no 8-byte stores
                                                     // of two 4-byte halves)
  float mf[kMaxUnitTiles], df[kMaxUnitTiles];
  uint32_t special[kMaxUnitTiles];
  bool fast[kMaxUnitTiles];
  float mfe[cpu::kUnitCols], dfe[cpu::kUnitCols];  // per column, where tiles are spread
  uint32_t spe[cpu::kUnitCols];
  for (int64_t u = begin; u < end; ++u) {
    const Span s = span_of(p, u);
    const int64_t width = s.c1 - s.c0, tiles = ceil_div(width, tc);
    for (int64_t j = 0; j < tiles; ++j) amax[j] = 0;
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const T* __restrict row = x + (s.b * p.rows + r) * p.cols + s.c0;
      if (tc == 1) {
        for (int64_t c = 0; c < width; ++c) {
          amax[c] = umax(amax[c], In::widen(row[c]) & kF32Abs);
        }
        continue;
      }
      for (int64_t j = 0; j < tiles; ++j) {
        const T* __restrict tile = row + j * tc;
        const int64_t n = j * tc + tc <= width ? tc : width - j * tc;
        uint32_t a = 0;
        for (int64_t c = 0; c < n; ++c) a = umax(a, In::widen(tile[c]) & kF32Abs);
        amax[j] = umax(amax[j], a);
      }
    }
    const int64_t si = scale_index(p, s);
    bool all_fast = true;
    auto scale_of = [&](uint32_t a) {
      switch (p.scale) {
        case kScaleE8M0: return block_scale<F, kScaleE8M0>(a, p.mode, s_enc);
        case kScaleE4M3: return block_scale<F, kScaleE4M3>(a, p.mode, s_enc);
        case kScaleFP32: return block_scale<F, kScaleFP32>(a, p.mode, s_enc);
        default: return block_scale<F, kScaleFP32Pow2>(a, p.mode, s_enc);
      }
    };
    for (int64_t j = 0; j < tiles; ++j) {
      const BlockScale bs = scale_of(amax[j]);
      msig[j] = bs.m.sig, mexp[j] = bs.m.exp, dsig[j] = bs.d.sig, dexp[j] = bs.d.exp;
      mf[j] = f32_value(bs.m), df[j] = f32_value(bs.d);
      special[j] = bs.special;
      fast[j] = normal_f32(bs.m) && (!kFake || fast_decode<F>(bs.d, Sig{0, 0}));
      all_fast = all_fast && fast[j];
      if (kFake) continue;
      if (p.scale >= kScaleFP32) {
        static_cast<uint32_t*>(p.scales)[si + j] = bs.stored;
      } else {
        static_cast<uint8_t*>(p.scales)[si + j] = uint8_t(bs.stored);
      }
    }
    // Narrow tiles (16, 32) whose scales all take the f32 path: spread the scales over the
    // columns, so that whole rows run as one vector loop (a tile's codes are too few).
    const bool spread = kTC > 1 && all_fast;
    for (int64_t j = 0; spread && j < tiles; ++j) {
      for (int64_t k = 0; k < kTC; ++k) {  // a broadcast store; past width: unused
        mfe[j * kTC + k] = mf[j], dfe[j * kTC + k] = df[j], spe[j * kTC + k] = special[j];
      }
    }
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const int64_t first = (s.b * p.rows + r) * p.cols + s.c0;
      const T* xr = x + first;
      const uint32_t* rr = kSR ? p.rand + first : nullptr;
      uint8_t* cr = kFake ? nullptr : p.codes + first;
      float* orow = kFake ? p.out + first : nullptr;
      if (spread) {
        code_run<F, In, kSR, kFake, true, true>(width, xr, rr, cr, orow, mfe, msig, mexp, dfe,
                                                dsig, dexp, spe);
        continue;
      }
      if (tc == 1) {
        if (all_fast) {
          code_run<F, In, kSR, kFake, true, true>(width, xr, rr, cr, orow, mf, msig, mexp, df,
                                                  dsig, dexp, special);
        } else {
          code_run<F, In, kSR, kFake, false, true>(width, xr, rr, cr, orow, mf, msig, mexp, df,
                                                   dsig, dexp, special);
        }
        continue;
      }
      for (int64_t j = 0; j < tiles; ++j) {
        const int64_t c = j * tc, n = c + tc <= width ? tc : width - c;
        const uint32_t* rc = kSR ? rr + c : nullptr;
        uint8_t* cc = kFake ? nullptr : cr + c;
        float* oc = kFake ? orow + c : nullptr;
        if (fast[j]) {
          code_run<F, In, kSR, kFake, true, false>(n, xr + c, rc, cc, oc, mf + j, msig + j,
                                                   mexp + j, df + j, dsig + j, dexp + j,
                                                   special + j);
        } else {
          code_run<F, In, kSR, kFake, false, false>(n, xr + c, rc, cc, oc, mf + j, msig + j,
                                                    mexp + j, df + j, dsig + j, dexp + j,
                                                    special + j);
        }
      }
    }
  }
}

// f32 values of n codes from c on under their tiles' decode scales (kPerElement as in
// code_run), divided by the tensor scale ts where it is nonzero (tsf: its f32, else 1).
template <class F, bool kFast, bool kPerElement>
__attribute__((noinline)) void decode_run(
    int64_t n, const uint8_t* __restrict codes, float* __restrict out, const float* __restrict df,
    const uint32_t* __restrict dsig, const int32_t* __restrict dexp,
    const uint32_t* __restrict nan, float tsf, Sig ts) {
  for (int64_t c = 0; c < n; ++c) {
    const int64_t j = kPerElement ? c : 0;
    uint32_t v;
    if constexpr (kFast) {
      v = as_bits(as_float(grid_value_bits<F>(codes[c])) * df[j] / tsf);
    } else {
      v = block_decode<F>(codes[c], Sig{dsig[j], dexp[j]}, ts);
    }
    const uint32_t keep = nan[j] - 1u;  // as in code_run
    out[c] = as_float((v & keep) | (kF32QNaN & ~keep));
  }
}

// f32 values of the codes and scales of the units [begin, end) of p.
template <class F>
void dequantize_units(const BlockProblem& p, int64_t begin, int64_t end) {
  const Sig ts =
      p.apply_tensor_scale && p.tensor_scale ? sig_of_bits(p.tensor_scale) : Sig{0, 0};
  const float tsf = ts.sig ? f32_value(ts) : 1.0f;
  const int64_t tc = p.tile_cols;
  uint32_t dsig[kMaxUnitTiles];
  int32_t dexp[kMaxUnitTiles];
  float df[kMaxUnitTiles];
  uint32_t nan[kMaxUnitTiles], nane[cpu::kUnitCols];
  bool fast[kMaxUnitTiles];
  float dfe[cpu::kUnitCols];
  for (int64_t u = begin; u < end; ++u) {
    const Span s = span_of(p, u);
    const int64_t width = s.c1 - s.c0, tiles = ceil_div(width, tc);
    const int64_t si = scale_index(p, s);
    bool all_fast = true;
    for (int64_t j = 0; j < tiles; ++j) {
      const uint32_t stored = p.scale >= kScaleFP32
                                  ? static_cast<const uint32_t*>(p.in_scales)[si + j]
                                  : static_cast<const uint8_t*>(p.in_scales)[si + j];
      bool is_nan;
      const Sig d = stored_scale_value(stored, p.scale, is_nan);
      nan[j] = is_nan;
      dsig[j] = d.sig, dexp[j] = d.exp, df[j] = f32_value(d);
      fast[j] = fast_decode<F>(d, ts);
      all_fast = all_fast && fast[j];
    }
    const bool spread = (tc == 16 || tc == 32) && all_fast;  // as in quantize_units
    for (int64_t j = 0; spread && j < tiles; ++j) {
      for (int64_t k = 0; k < tc; ++k) dfe[j * tc + k] = df[j], nane[j * tc + k] = nan[j];
    }
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const int64_t first = (s.b * p.rows + r) * p.cols + s.c0;
      const uint8_t* __restrict codes = p.in_codes + first;
      float* __restrict out = p.out + first;
      if (spread) {
        decode_run<F, true, true>(width, codes, out, dfe, dsig, dexp, nane, tsf, ts);
        continue;
      }
      if (tc == 1) {
        if (all_fast) {
          decode_run<F, true, true>(width, codes, out, df, dsig, dexp, nan, tsf, ts);
        } else {
          decode_run<F, false, true>(width, codes, out, df, dsig, dexp, nan, tsf, ts);
        }
        continue;
      }
      for (int64_t j = 0; j < tiles; ++j) {
        const int64_t c = j * tc, n = min64(width, c + tc) - c;
        if (fast[j]) {
          decode_run<F, true, false>(n, codes + c, out + c, df + j, dsig + j, dexp + j, nan + j,
                                     tsf, ts);
        } else {
          decode_run<F, false, false>(n, codes + c, out + c, df + j, dsig + j, dexp + j, nan + j,
                                      tsf, ts);
        }
      }
    }
  }
}

template <bool kFake>
void quantize_dispatch(const BlockProblem& p, int64_t begin, int64_t end) {
  with_format(p.format, [&](auto f) {
    using F = decltype(f);
    auto run = [&](auto in) {
      using In = decltype(in);
      auto width = [&](auto sr) {
        constexpr bool kSR = decltype(sr)::value;
        switch (p.tile_cols) {
          case 16: return quantize_units<F, In, kSR, kFake, 16>(p, begin, end);
          case 32: return quantize_units<F, In, kSR, kFake, 32>(p, begin, end);
          default: return quantize_units<F, In, kSR, kFake, 0>(p, begin, end);
        }
      };
      if (p.rand) {
        width(std::true_type{});
      } else {
        width(std::false_type{});
      }
    };
    switch (p.dtype) {
      case cpu::kBF16: return run(BF16{});
      case cpu::kF16: return run(F16{});
      default: return run(F32{});
    }
  });
}

void quantize(const BlockProblem& p, int64_t begin, int64_t end) {
  quantize_dispatch<false>(p, begin, end);
}

void fake_quantize(const BlockProblem& p, int64_t begin, int64_t end) {
  quantize_dispatch<true>(p, begin, end);
}

// A band of b rows at a time: each unit quantizes its band's columns, then the band's rows
// while they are in cache (one pass over x in memory).
void quantize_2x(const cpu::BlockPair& p, int64_t begin, int64_t end) {
  const int64_t ncc = ceil_div(p.col.cols, cpu::unit_cols(p.col));
  for (int64_t u = begin; u < end; ++u) {
    quantize(p.col, u, u + 1);
    const Span s = span_of(p.col, u);
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const int64_t row_unit = (s.b * p.row.rows + r) * ncc + u % ncc;
      quantize(p.row, row_unit, row_unit + 1);
    }
  }
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
                                     &mxjax::fake_quantize, &mxjax::quantize_2x};
  return table;
}
