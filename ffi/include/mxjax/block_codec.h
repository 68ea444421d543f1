// Block-scaled formats (mxjax/block_format.py): the per-block scale rules (E8M0, unsigned
// E4M3 with an FP32 tensor scale, FP32, power-of-two FP32) and the element rounding
// (nearest even, or stochastic from given bits), as mxjax/reference.py's block_quantize
// and block_dequantize state them, bit for bit.
//
// A nonzero magnitude is a Sig: sig * 2^exp with sig in [2^23, 2^24). The f32 products
// and quotients the rules name are rounded to 24 bits, nearest even, with an unbounded
// exponent: each is one f32 multiply or divide of the two significands as values in
// [1, 2), whose result is normal, so no FTZ / DAZ setting can change it.
#ifndef MXJAX_BLOCK_CODEC_H_
#define MXJAX_BLOCK_CODEC_H_

#include <cstdint>

#include "mxjax/codec.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// Ids shared with mxjax/block_format.py (ScaleFormat.ffi_id).
enum ScaleKind : int32_t { kScaleE8M0 = 0, kScaleE4M3 = 1, kScaleFP32 = 2, kScaleFP32Pow2 = 3 };

struct Sig {
  uint32_t sig;  // 0, or in [2^23, 2^24)
  int32_t exp;
};

// The Sig of a finite f32 magnitude (bits, sign clear); {0, 0} for zero.
MXJAX_HD Sig sig_of_bits(uint32_t mag) {
  uint32_t ef = mag >> 23, man = mag & 0x7FFFFFu;
  uint32_t sub = as_bits(float(man));  // a subnormal's significand as an exact f32 normal
  Sig out{ef != 0 ? man | 0x800000u : (sub & 0x7FFFFFu) | 0x800000u,
          ef != 0 ? int32_t(ef) - 150 : int32_t(sub >> 23) - 127 - 23 - 149};
  return mag == 0 ? Sig{0, 0} : out;
}

// A small positive integer times 2^exp (its significand normalized).
MXJAX_HD Sig sig_of_int(uint32_t v, int32_t exp) {
  if (v == 0) return {0, 0};
  int shift = 23 - floor_log2_u32(v);
  return {v << shift, exp - shift};
}

MXJAX_HD float unit(uint32_t sig) { return as_float(0x3F800000u | (sig & 0x7FFFFFu)); }

// a * b, rounded to 24 bits.
MXJAX_HD Sig mul24(Sig a, Sig b) {
  uint32_t r = as_bits(unit(a.sig) * unit(b.sig));  // in [1, 4)
  Sig out{(r & 0x7FFFFFu) | 0x800000u, int32_t(r >> 23) - 127 + a.exp + b.exp + 23};
  return (a.sig == 0 || b.sig == 0) ? Sig{0, 0} : out;
}

// a / b (b nonzero), rounded to 24 bits.
MXJAX_HD Sig div24(Sig a, Sig b) {
  uint32_t q = as_bits(unit(a.sig) / unit(b.sig));  // in (0.5, 2)
  Sig out{(q & 0x7FFFFFu) | 0x800000u, int32_t(q >> 23) - 127 - 23 + a.exp - b.exp};
  return a.sig == 0 ? Sig{0, 0} : out;
}

// The magnitude code of a Sig on a float grid with `man_bits` mantissa bits and smallest
// normal exponent `emin` (subnormals included, no top: callers saturate), nearest even.
MXJAX_HD uint32_t round_to_grid(Sig v, int32_t emin, int32_t man_bits) {
  int32_t ev = imax(23 + v.exp, emin);
  int32_t shift = ev - man_bits - v.exp;  // >= 0 for man_bits <= 23
  uint32_t right = uint32_t(shift < 0 ? 0 : shift > 31 ? 31 : shift);
  uint32_t kept = v.sig >> right;
  uint32_t rem = v.sig - (kept << right);
  uint32_t half = 1u << ((right > 0 ? right : 1) - 1);
  uint32_t up = uint32_t(right > 0) & (uint32_t(rem > half) | (uint32_t(rem == half) & kept));
  uint32_t code = (uint32_t(ev - emin) << man_bits) + kept + up;
  return v.sig == 0 ? 0 : code;
}

// round_to_grid rounding up with probability rem / quantum: iff rand < rem * 2^32 / quantum.
MXJAX_HD uint32_t round_to_grid_sr(Sig v, int32_t emin, int32_t man_bits, uint32_t rand) {
  int32_t ev = imax(23 + v.exp, emin);
  int32_t shift = ev - man_bits - v.exp;  // >= 20 for element formats
  uint32_t right = uint32_t(shift > 31 ? 31 : shift);
  uint32_t kept = shift > 31 ? 0 : v.sig >> right;
  uint32_t rem = v.sig - (kept << right);
  uint32_t t = shift <= 31   ? rem << (32 - right)
               : shift == 32 ? rem
                             : rem >> (shift - 32 > 31 ? 31 : shift - 32);
  uint32_t code = (uint32_t(ev - emin) << man_bits) + kept + uint32_t(rand < t);
  return v.sig == 0 ? 0 : code;
}

// ---------------------------------------------------------------------------------------
// The fast path: where a block's multiplier (and decode scale) are normal f32s whose
// products with the block's values stay normal, one f32 multiply gives the rules' 24-bit
// rounding; a product below 2^-126 gives code 0 either way (every element format's
// quantum is far larger). The kernels check that per block (normal_f32 / fast_decode)
// and run the Sig functions otherwise.

// x * y rounded to f32 by itself. On the device a plain multiply may be contracted with a
// later add into one FMA (nvcc's default -fmad=true; block_encode_f32's product feeds
// encode_magnitude's add), which would round once instead of twice; __fmul_rn never is.
MXJAX_HD float mul_rn(float x, float y) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

// Whether a Sig is zero or a normal f32.
MXJAX_HD bool normal_f32(Sig v) { return v.sig == 0 || (v.exp + 23 >= -126 && v.exp + 23 <= 127); }

MXJAX_HD float f32_value(Sig v) {
  return v.sig == 0 ? 0.0f : as_float((uint32_t(v.exp + 23 + 127) << 23) | (v.sig & 0x7FFFFFu));
}

// The code of f32 bits x times the normal f32 m (as block_encode); kSat: |x| * m is
// clamped to 2^(emax + 2) first (past max, so the code saturates either way), so the f32
// add of encode_magnitude cannot overflow where a large multiplier (a given tensor scale)
// makes the product huge or Inf.
template <class F, bool kStochastic, bool kSat = false>
MXJAX_HD uint32_t block_encode_f32(uint32_t x, float m, uint32_t rand) {
  uint32_t v = as_bits(mul_rn(as_float(x & kF32Abs), m));
  if (kSat) v = umin(v, uint32_t(F::emax + 2 + 127) << 23);
  uint32_t mag;
  if (kStochastic) {
    Sig s{v < 0x00800000u ? 0u : (v & 0x7FFFFFu) | 0x800000u, int32_t(v >> 23) - 150};
    mag = round_to_grid_sr(s, F::emin, F::man_bits, rand);
  } else {
    mag = encode_magnitude<F>(v);
  }
  return umin(mag, F::max_code) | ((x >> 31) << (F::bits - 1));
}

// block_encode_f32 for any product (see kSat).
template <class F, bool kStochastic>
MXJAX_HD uint32_t block_encode_f32_sat(uint32_t x, float m, uint32_t rand) {
  return block_encode_f32<F, kStochastic, true>(x, m, rand);
}

// f32 bits of an element code's value, the grid continued past max (no NaN / Inf codes).
template <class F>
MXJAX_HD uint32_t grid_value_bits(uint32_t code) {
  uint32_t mag = code & F::mag_mask;
  uint32_t ef = mag >> F::man_bits, man = mag & ((1u << F::man_bits) - 1);
  uint32_t normal = ((ef + 127 - F::bias) << 23) | (man << (23 - F::man_bits));
  uint32_t sub = as_bits(float(man) * as_float(pow2_bits(F::emin - F::man_bits)));
  return (ef != 0 ? normal : sub) | ((code >> (F::bits - 1)) << 31);
}

// Whether every nonzero code times d (divided by ts, nonzero) is a normal f32 product of
// normal f32s, so block_decode's value is one f32 multiply (and divide). With ts, the
// product must not overflow either (its quotient may be finite), and ts must be a normal
// f32 even where d is zero (the divide then keeps the sign of a zero).
template <class F>
MXJAX_HD bool fast_decode(Sig d, Sig ts) {
  if (!normal_f32(ts)) return false;
  if (d.sig == 0) return true;
  int32_t low = d.exp + 23 + F::emin - F::man_bits;  // exponent of the smallest product
  // Every code (past max too) is below 2^(e + 1), e: the top exponent field's exponent, and
  // d below 2^(d.exp + 24): every product, rounded, is at most 2^high.
  const int32_t high = d.exp + 24 + ((1 << F::exp_bits) - 1 - F::bias) + 1;
  if (ts.sig != 0) low -= ts.exp + 23 + 1;
  return normal_f32(d) && low >= -126 && (ts.sig == 0 || high <= 127);
}

// f32 bits of a Sig: nearest even with subnormals, Inf past FLT_MAX.
MXJAX_HD uint32_t f32_of(Sig v) { return umin(round_to_grid(v, -126, 23), kF32Inf); }

// The Sig of an unsigned E4M3 code (no NaN).
MXJAX_HD Sig e4m3_value(uint32_t code) {
  uint32_t ef = code >> 3, man = code & 7u;
  return sig_of_int(ef > 0 ? man | 8u : man, int32_t(ef > 1 ? ef : 1) - 10);
}

// The Sig of a positive constant exact in f32.
MXJAX_HD Sig sig_const(float v) { return sig_of_bits(as_bits(v)); }

// A block's scale: what its elements are multiplied by (m), what it stores (a scale byte
// or f32 bits) and what its codes decode with (d). `special`: the block holds NaN / Inf
// (codes 0, the stored scale NaN).
struct BlockScale {
  Sig m, d;
  uint32_t stored;
  bool special;
};

// The scale of a block whose largest magnitude has f32 bits `amax` (sign clear), for
// elements F and scale kind `kind`; `s_enc` is the tensor scale (1 without one).
template <class F, int32_t kind>
MXJAX_HD BlockScale block_scale(uint32_t amax, int32_t mode, Sig s_enc) {
  constexpr float kElemMax = float(F::max_sig) / float(1u << (23 - F::emax));  // exact
  BlockScale s{};
  s.special = amax >= kF32Inf;
  if (s.special) amax = 0;
  const Sig a = sig_of_bits(amax);
  if (kind == kScaleE8M0) {
    uint8_t byte = e8m0_from_amax<F>(amax, mode);
    s.m = {0x800000u, kE8M0Bias - int32_t(byte) - 23};
    s.d = {0x800000u, int32_t(byte) - kE8M0Bias - 23};
    s.stored = s.special ? kE8M0NaN : byte;
  } else if (kind == kScaleE4M3) {
    Sig t = mul24(div24(a, sig_const(kElemMax)), s_enc);
    uint32_t code = umin(round_to_grid(t, -6, 3), 0x7Eu);
    s.d = e4m3_value(code);
    s.m = s.d.sig == 0 ? Sig{0, 0} : div24(s_enc, s.d);
    s.stored = s.special ? 0x7Fu : code;
  } else {
    Sig m = amax == 0 ? Sig{0x800000u, -23} : div24(sig_const(kElemMax), a);
    if (kind == kScaleFP32Pow2) {
      m = {0x800000u, m.exp < 104 ? m.exp : 104};
    } else if (m.exp > 104) {
      m = {0xFFFFFFu, 104};  // FLT_MAX
    }
    s.m = m;
    uint32_t inv = f32_of(div24(sig_const(1.0f), m));
    s.d = sig_of_bits(inv);
    s.stored = s.special ? kF32QNaN : inv;
  }
  return s;
}

// block_scale<F, kScaleE4M3>'s common case in f32 arithmetic, branch-free (for vector
// loops over blocks): the scale byte `code` (before a NaN / Inf block's 0x7F), m and d as
// f32 values (0 for code 0) of a block with finite amax bits `amax` under the tensor scale
// s (the f32 value of s_enc, nonzero). Returns whether they equal block_scale's, bit for
// bit: q = amax / elem_max and t = q * s are single f32 operations, rounded as div24 and
// mul24 round wherever the result is normal; q is checked (normal, or amax 0); a t below
// 2^-126 is below E4M3's half quantum 2^-10 both ways (code 0), and a t past FLT_MAX
// saturates both ways (t is clamped to 512 before encode_magnitude, past 448); m = s / d
// is checked (normal, or code 0: m = 0, as block_scale's). d, an E4M3 value, is exact.
template <class F>
MXJAX_HD bool e4m3_block_scale_f32(uint32_t amax, float s, uint32_t& code, float& m, float& d) {
  constexpr float kElemMax = float(F::max_sig) / float(1u << (23 - F::emax));  // exact
  const uint32_t q = as_bits(as_float(amax) / kElemMax);
  const uint32_t t = as_bits(as_float(q) * s);
  code = encode_magnitude<E4M3>(umin(t, 0x44000000u));  // 0x44000000: 512
  d = as_float(grid_value_bits<E4M3>(code));
  const uint32_t mb = as_bits(s / d);
  m = code == 0 ? 0.0f : as_float(mb);
  // bitwise, not short-circuit: a branch would keep GCC from vectorizing the caller's loop
  return (uint32_t(amax == 0) | uint32_t(q >= 0x00800000u)) &
         (uint32_t(code == 0) | (uint32_t(mb >= 0x00800000u) & uint32_t(mb < kF32Inf)));
}

// The code of one element (f32 bits x) under a block's multiplier m: nearest even, or
// stochastic from `rand` when kStochastic; saturated to +-max, sign kept.
template <class F, bool kStochastic>
MXJAX_HD uint32_t block_encode(uint32_t x, Sig m, uint32_t rand) {
  Sig v = mul24(sig_of_bits(x & kF32Abs), m);
  uint32_t mag = kStochastic ? round_to_grid_sr(v, F::emin, F::man_bits, rand)
                             : round_to_grid(v, F::emin, F::man_bits);
  return umin(mag, F::max_code) | ((x >> 31) << (F::bits - 1));
}

// The Sig of an element code's magnitude (codes past max decode as the grid continues).
template <class F>
MXJAX_HD Sig block_element_value(uint32_t code) {
  uint32_t mag = code & F::mag_mask;
  uint32_t ef = mag >> F::man_bits, man = mag & ((1u << F::man_bits) - 1);
  return sig_of_int(ef > 0 ? man | (1u << F::man_bits) : man,
                    int32_t(ef > 1 ? ef : 1) - F::bias - F::man_bits);
}

// f32 bits of code * d (divided by the tensor scale when `ts` is nonzero), sign kept.
template <class F>
MXJAX_HD uint32_t block_decode(uint32_t code, Sig d, Sig ts) {
  Sig v = mul24(block_element_value<F>(code), d);
  if (ts.sig != 0) v = div24(v, ts);
  return f32_of(v) | ((code >> (F::bits - 1)) << 31);
}

// What a stored scale decodes with, and whether it is NaN.
MXJAX_HD Sig stored_scale_value(uint32_t stored, int32_t kind, bool& nan) {
  if (kind == kScaleE8M0) {
    nan = stored == kE8M0NaN;
    return {0x800000u, int32_t(stored) - kE8M0Bias - 23};
  }
  if (kind == kScaleE4M3) {
    nan = stored == 0x7Fu;
    return e4m3_value(stored);
  }
  nan = (stored & kF32Abs) > kF32Inf;
  return sig_of_bits(stored & kF32Abs);
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_BLOCK_CODEC_H_
