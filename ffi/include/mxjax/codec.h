// MX element codecs and the E8M0 shared exponent, one template over format traits.
//
// Everything here works on f32 bit patterns (uint32_t) and compiles for the host and,
// under nvcc, for the device (MXJAX_HD). The numerics follow /shared/DESIGN.md: shared
// exponent from amax (FLOOR / RCEIL, clamped to [-127, 127], NaN/Inf -> 0xFF), elements
// rounded to nearest even on the element grid with its subnormals, saturated to +-max,
// sign kept.
#ifndef MXJAX_CODEC_H_
#define MXJAX_CODEC_H_

#include <cstdint>
#include <cstring>

#ifndef MXJAX_HD  // (the CUDA host checks define it without forced inlining: faster builds)
#ifdef __CUDACC__
#define MXJAX_HD __host__ __device__ __forceinline__
#else
#define MXJAX_HD inline __attribute__((always_inline))
#endif
#endif

// Code compiled for several ISAs (ffi/cpu/kernels.cc) gets one inline namespace per ISA,
// so that the linker never merges, say, an AVX-512 instance into the baseline path.
#ifndef MXJAX_ISA_NS
#define MXJAX_ISA_NS generic
#endif

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// Ids shared with mxjax/formats.py (ElementFormat.ffi_id, ScaleMode.ffi_id).
enum FormatId : int32_t { kE4M3 = 0, kE5M2 = 1, kE3M2 = 2, kE2M3 = 3, kE2M1 = 4 };
enum ScaleMode : int32_t { kRceil = 0, kFloor = 1 };

constexpr uint32_t kF32Abs = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QNaN = 0x7FC00000u;
constexpr uint8_t kE8M0NaN = 0xFF;
constexpr int kE8M0Bias = 127;

MXJAX_HD float as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

MXJAX_HD uint32_t as_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

MXJAX_HD int floor_log2_u32(uint32_t v) {  // v > 0
#ifdef __CUDA_ARCH__
  return 31 - __clz(v);
#else
  return 31 - __builtin_clz(v);
#endif
}

MXJAX_HD int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }
MXJAX_HD uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }
MXJAX_HD uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }
MXJAX_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// An element format: 1 sign bit, kExpBits exponent bits, kManBits mantissa bits.
// kMaxCode is the magnitude code of the largest finite value; codes above it (e4m3:
// 0x7F, e5m2: 0x7C..0x7F) are Inf / NaN, which quantize never produces.
template <int kId, int kExpBits, int kManBits, int kBias, uint32_t kMaxCode, bool kHasInf>
struct Format {
  static constexpr int id = kId;
  static constexpr int exp_bits = kExpBits;
  static constexpr int man_bits = kManBits;
  static constexpr int bias = kBias;
  static constexpr int bits = 1 + kExpBits + kManBits;
  static constexpr int emin = 1 - kBias;
  static constexpr int emax = int(kMaxCode >> kManBits) - kBias;
  static constexpr uint32_t max_code = kMaxCode;
  static constexpr uint32_t mag_mask = (1u << (bits - 1)) - 1;
  static constexpr bool has_special = kMaxCode != mag_mask;
  static constexpr bool has_inf = kHasInf;
  // Significand of max aligned to 24 bits (hidden bit at bit 23), for RCEIL.
  static constexpr uint32_t max_sig =
      ((1u << kManBits) | (kMaxCode & ((1u << kManBits) - 1))) << (23 - kManBits);
  // Storage packing along the quantized axis: `codes` codes in `bytes` bytes.
  static constexpr int group_codes = bits == 8 ? 1 : bits == 6 ? 4 : 2;
  static constexpr int group_bytes = group_codes * bits / 8;
};

using E4M3 = Format<kE4M3, 4, 3, 7, 0x7E, false>;
using E5M2 = Format<kE5M2, 5, 2, 15, 0x7B, true>;
using E3M2 = Format<kE3M2, 3, 2, 3, 0x1F, false>;
using E2M3 = Format<kE2M3, 2, 3, 1, 0x1F, false>;
using E2M1 = Format<kE2M1, 2, 1, 1, 0x07, false>;

// Calls fn(F{}) with the format type of a FormatId (host code: the backends' dispatch).
template <class Fn>
decltype(auto) with_format(int32_t format, Fn&& fn) {
  switch (format) {
    case kE4M3: return fn(E4M3{});
    case kE5M2: return fn(E5M2{});
    case kE3M2: return fn(E3M2{});
    case kE2M3: return fn(E2M3{});
    default: return fn(E2M1{});
  }
}

// ---------------------------------------------------------------------------------------
// E8M0 shared exponent

// Scale byte (e + 127, or 0xFF) of a block whose max |x| has f32 bits `amax` (sign clear).
template <class F>
MXJAX_HD uint8_t e8m0_from_amax(uint32_t amax, int32_t mode) {
  if (amax >= kF32Inf) return kE8M0NaN;
  if (amax == 0) return 0;  // e = -127
  uint32_t exp = amax >> 23;
  uint32_t man = amax & 0x7FFFFFu;
  int32_t log2;
  uint32_t norm;  // significand with its leading one at bit 23
  if (exp != 0) {
    log2 = int32_t(exp) - 127;
    norm = man | 0x800000u;
  } else {
    int fl = floor_log2_u32(man);
    log2 = fl - 149;
    norm = man << (23 - fl);
  }
  int32_t e = log2 - F::emax;
  if (mode == kRceil && norm > F::max_sig) e += 1;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return uint8_t(e + kE8M0Bias);
}

// f32 bits of 2^k for k in [-127, 127] (2^-127 is an f32 subnormal).
MXJAX_HD uint32_t pow2_bits(int32_t k) {
  return k >= -126 ? uint32_t(k + 127) << 23 : 0x00400000u;
}

// f32 bits of 1 / 2^e for a finite scale byte (byte <= 254).
MXJAX_HD uint32_t inv_scale_bits(uint8_t byte) { return pow2_bits(kE8M0Bias - int32_t(byte)); }

// f32 bits of 2^e for a finite scale byte.
MXJAX_HD uint32_t scale_bits(uint8_t byte) { return pow2_bits(int32_t(byte) - kE8M0Bias); }

// ---------------------------------------------------------------------------------------
// Elements

// Magnitude code of |v| (f32 bits, finite, sign clear): RNE to the element grid, with
// subnormals, saturated to max. Adding C = 2^(ev - man_bits + 23), whose ulp is the grid
// quantum at v's exponent ev, rounds v to the grid in one f32 add (v < C, and f32 adds
// round to nearest even); the bit pattern above C counts quanta. Flushing a subnormal v
// to zero does not matter: such a v rounds to zero anyway.
template <class F>
MXJAX_HD uint32_t encode_magnitude(uint32_t v) {
  int32_t ev = imax(int32_t(v >> 23) - 127, F::emin);
  uint32_t c = uint32_t(ev + 127 + 23 - F::man_bits) << 23;
  uint32_t quanta = as_bits(as_float(v) + as_float(c)) - c;
  uint32_t code = (uint32_t(ev - F::emin) << F::man_bits) + quanta;
  return umin(code, F::max_code);
}

// Full code of an f32 value x (bits) scaled by inv_scale (f32 value 2^-e).
template <class F>
MXJAX_HD uint32_t encode_element(uint32_t x, float inv_scale) {
  uint32_t v = as_bits(as_float(x & kF32Abs) * inv_scale);
  return encode_magnitude<F>(v) | ((x >> 31) << (F::bits - 1));
}

// f32 bits of the value of an element code (exact; NaN codes -> signed quiet NaN).
template <class F>
MXJAX_HD uint32_t decode_element(uint32_t code) {
  uint32_t sign = (code >> (F::bits - 1)) << 31;
  uint32_t mag = code & F::mag_mask;
  uint32_t ef = mag >> F::man_bits;
  uint32_t man = mag & ((1u << F::man_bits) - 1);
  uint32_t normal = ((ef + 127 - F::bias) << 23) | (man << (23 - F::man_bits));
  // Subnormal: man * 2^(emin - man_bits), an exact f32 normal (or zero).
  uint32_t sub = as_bits(float(man) * as_float(pow2_bits(F::emin - F::man_bits)));
  uint32_t out = ef != 0 ? normal : sub;
  if (F::has_special && mag > F::max_code) {
    out = (F::has_inf && man == 0) ? kF32Inf : kF32QNaN;
  }
  return out | sign;
}

// ---------------------------------------------------------------------------------------
// f32 <-> bf16 / f16 bit conversions (exact widening; RNE narrowing, subnormals kept,
// overflow -> Inf, NaN -> quiet NaN of the same sign).

MXJAX_HD uint32_t bf16_to_f32(uint16_t h) { return uint32_t(h) << 16; }

MXJAX_HD uint32_t f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  uint32_t normal = ((e + 112) << 23) | (m << 13);
  uint32_t special = kF32Inf | (m << 13);
  uint32_t sub = as_bits(float(m) * 0x1p-24f);  // an f32 normal
  return sign | (e == 0 ? sub : (e == 31 ? special : normal));
}

MXJAX_HD uint16_t f32_to_bf16(uint32_t b) {
  uint32_t mag = b & kF32Abs;
  uint32_t sign = (b >> 16) & 0x8000u;
  uint32_t r = (mag + 0x7FFFu + ((mag >> 16) & 1u)) >> 16;
  return uint16_t(sign | (mag > kF32Inf ? 0x7FC0u : r));
}

MXJAX_HD uint16_t f32_to_f16(uint32_t b) {
  uint32_t mag = b & kF32Abs;
  uint32_t sign = (b >> 16) & 0x8000u;
  uint32_t normal = ((mag + 0xFFFu + ((mag >> 13) & 1u)) >> 13) - (112u << 10);
  // Subnormal f16: 0.5 has ulp 2^-24, the f16 subnormal quantum.
  uint32_t sub = as_bits(as_float(mag) + 0.5f) - 0x3F000000u;
  uint32_t r = mag >= 0x38800000u ? umin(normal, 0x7C00u) : sub;
  return uint16_t(sign | (mag > kF32Inf ? 0x7E00u : r));
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CODEC_H_
