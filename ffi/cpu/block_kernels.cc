// The block-scaled kernels (NVFP4, FP8 blocks, 2-D MX, stochastic rounding) for one SIMD
// level: CMake compiles this file once per level, like kernels.cc, and the element loops
// below are written for the compiler to vectorize at that level's width (one codec,
// ffi/include/mxjax/block_codec.h, no per-ISA code).
//
// A work unit is a run of whole tiles of one tile row: its block amaxes are reduced, each
// tile's scale is made once (scalar), then every element is encoded (and, for
// fake_quantize, decoded) with its tile's multiplier.
#include <cstdint>

#include "gcc_diagnostics.h"
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

// Quantize (kFake: dequantize in registers, f32 out, no tensor scale applied) the units
// [begin, end) of p, elements F from In, stochastic rounding when kSR.
template <class F, class In, bool kSR, bool kFake>
void quantize_units(const BlockProblem& p, int64_t begin, int64_t end) {
  using T = typename In::T;
  const T* x = static_cast<const T*>(p.x);
  const Sig s_enc = tensor_scale_sig(p.tensor_scale);
  const int64_t tc = p.tile_cols;
  uint32_t amax[kMaxUnitTiles], msig[kMaxUnitTiles], dsig[kMaxUnitTiles];
  int32_t mexp[kMaxUnitTiles], dexp[kMaxUnitTiles];
  bool special[kMaxUnitTiles];
  for (int64_t u = begin; u < end; ++u) {
    const Span s = span_of(p, u);
    const int64_t width = s.c1 - s.c0, tiles = ceil_div(width, tc);
    for (int64_t j = 0; j < tiles; ++j) amax[j] = 0;
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const T* row = x + (s.b * p.rows + r) * p.cols + s.c0;
      if (tc == 1) {
        for (int64_t c = 0; c < width; ++c) amax[c] = umax(amax[c], In::widen(row[c]) & kF32Abs);
        continue;
      }
      for (int64_t j = 0; j < tiles; ++j) {
        uint32_t a = 0;
        for (int64_t c = j * tc, c1 = min64(width, c + tc); c < c1; ++c) {
          a = umax(a, In::widen(row[c]) & kF32Abs);
        }
        amax[j] = umax(amax[j], a);
      }
    }
    const int64_t si = scale_index(p, s);
    for (int64_t j = 0; j < tiles; ++j) {
      const BlockScale bs = block_scale<F>(amax[j], p.scale, p.mode, s_enc);
      msig[j] = bs.m.sig, mexp[j] = bs.m.exp, dsig[j] = bs.d.sig, dexp[j] = bs.d.exp;
      special[j] = bs.special;
      if (kFake) continue;
      if (p.scale >= kScaleFP32) {
        static_cast<uint32_t*>(p.scales)[si + j] = bs.stored;
      } else {
        static_cast<uint8_t*>(p.scales)[si + j] = uint8_t(bs.stored);
      }
    }
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const int64_t first = (s.b * p.rows + r) * p.cols + s.c0;
      const T* row = x + first;
      const uint32_t* rand = kSR ? p.rand + first : nullptr;
      // One element of tile j at column c of the run.
      auto element = [&](int64_t c, uint32_t ms, int32_t me, bool sp, uint32_t ds, int32_t de) {
        uint32_t code = block_encode<F, kSR>(In::widen(row[c]), Sig{ms, me}, kSR ? rand[c] : 0);
        code = sp ? 0 : code;
        if (kFake) {
          p.out[first + c] = as_float(sp ? kF32QNaN : block_decode<F>(code, Sig{ds, de}, Sig{0, 0}));
        } else {
          p.codes[first + c] = uint8_t(code);
        }
      };
      if (tc == 1) {
        for (int64_t c = 0; c < width; ++c) element(c, msig[c], mexp[c], special[c], dsig[c], dexp[c]);
        continue;
      }
      for (int64_t j = 0; j < tiles; ++j) {
        const uint32_t ms = msig[j], ds = dsig[j];
        const int32_t me = mexp[j], de = dexp[j];
        const bool sp = special[j];
        for (int64_t c = j * tc, c1 = min64(width, c + tc); c < c1; ++c) element(c, ms, me, sp, ds, de);
      }
    }
  }
}

// f32 values of the codes and scales of the units [begin, end) of p.
template <class F>
void dequantize_units(const BlockProblem& p, int64_t begin, int64_t end) {
  const Sig ts = p.apply_tensor_scale && p.tensor_scale ? sig_of_bits(p.tensor_scale) : Sig{0, 0};
  const int64_t tc = p.tile_cols;
  uint32_t dsig[kMaxUnitTiles];
  int32_t dexp[kMaxUnitTiles];
  bool nan[kMaxUnitTiles];
  for (int64_t u = begin; u < end; ++u) {
    const Span s = span_of(p, u);
    const int64_t width = s.c1 - s.c0, tiles = ceil_div(width, tc);
    const int64_t si = scale_index(p, s);
    for (int64_t j = 0; j < tiles; ++j) {
      const uint32_t stored = p.scale >= kScaleFP32 ? static_cast<const uint32_t*>(p.in_scales)[si + j]
                                                    : static_cast<const uint8_t*>(p.in_scales)[si + j];
      const Sig d = stored_scale_value(stored, p.scale, nan[j]);
      dsig[j] = d.sig, dexp[j] = d.exp;
    }
    for (int64_t r = s.r0; r < s.r1; ++r) {
      const int64_t first = (s.b * p.rows + r) * p.cols + s.c0;
      const uint8_t* codes = p.in_codes + first;
      float* out = p.out + first;
      auto element = [&](int64_t c, uint32_t ds, int32_t de, bool na) {
        out[c] = as_float(na ? kF32QNaN : block_decode<F>(codes[c], Sig{ds, de}, ts));
      };
      if (tc == 1) {
        for (int64_t c = 0; c < width; ++c) element(c, dsig[c], dexp[c], nan[c]);
        continue;
      }
      for (int64_t j = 0; j < tiles; ++j) {
        const uint32_t ds = dsig[j];
        const int32_t de = dexp[j];
        const bool na = nan[j];
        for (int64_t c = j * tc, c1 = min64(width, c + tc); c < c1; ++c) element(c, ds, de, na);
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
      if (p.rand) {
        quantize_units<F, In, true, kFake>(p, begin, end);
      } else {
        quantize_units<F, In, false, kFake>(p, begin, end);
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
                                     &mxjax::fake_quantize};
  return table;
}
