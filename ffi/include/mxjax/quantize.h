// MX block kernels (host): quantize / dequantize rows (blocks contiguous along the
// quantized axis) and column tiles (the quantized axis strided, vectorized across the
// contiguous axis). Templates over the element format F (codec.h) and the high-precision
// type; written as fixed-width lane loops so that the compiler vectorizes them for
// whatever ISA the including translation unit targets.
//
// Callers must run with MXCSR's FTZ / DAZ clear (x * 2^-e of a subnormal x, 2^-127).
#ifndef MXJAX_QUANTIZE_H_
#define MXJAX_QUANTIZE_H_

#include <cstdint>

#include "mxjax/codec.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// High-precision types: storage type T and exact conversions to / from f32 bits.
struct BF16 {
  using T = uint16_t;
  static MXJAX_HD uint32_t widen(T h) { return bf16_to_f32(h); }
  static MXJAX_HD T narrow(uint32_t b) { return f32_to_bf16(b); }
};
struct F16 {
  using T = uint16_t;
  static MXJAX_HD uint32_t widen(T h) { return f16_to_f32(h); }
  static MXJAX_HD T narrow(uint32_t b) { return f32_to_f16(b); }
};
struct F32 {
  using T = uint32_t;
  static MXJAX_HD uint32_t widen(T b) { return b; }
  static MXJAX_HD T narrow(uint32_t b) { return b; }
};

constexpr int kLanes = 16;     // lane width of the vector loops
constexpr int kMaxBlock = 64;  // largest supported block size
constexpr int kTileCols = 64;  // columns a column tile keeps in registers / L1

// Storage entries holding one block of `block` codes along the quantized axis.
template <class F>
constexpr int64_t block_storage(int64_t block) {
  return block / F::group_codes * F::group_bytes;
}

// Packs `groups` groups of codes (codes[i * cstride]) into storage (out[i * ostride]).
template <class F>
inline void pack_group(const uint8_t* codes, int64_t cstride, uint8_t* out, int64_t ostride) {
  if constexpr (F::bits == 8) {
    out[0] = codes[0];
  } else if constexpr (F::bits == 6) {
    uint32_t w = codes[0] | codes[cstride] << 6 | codes[2 * cstride] << 12 |
                 uint32_t(codes[3 * cstride]) << 18;
    out[0] = uint8_t(w);
    out[ostride] = uint8_t(w >> 8);
    out[2 * ostride] = uint8_t(w >> 16);
  } else {
    out[0] = uint8_t(codes[0] | codes[cstride] << 4);
  }
}

// Inverse of pack_group.
template <class F>
inline void unpack_group(const uint8_t* data, int64_t dstride, uint8_t* codes, int64_t cstride) {
  if constexpr (F::bits == 8) {
    codes[0] = data[0];
  } else if constexpr (F::bits == 6) {
    uint32_t w = data[0] | data[dstride] << 8 | uint32_t(data[2 * dstride]) << 16;
    for (int k = 0; k < 4; ++k) codes[k * cstride] = uint8_t((w >> (6 * k)) & 63u);
  } else {
    codes[0] = data[0] & 15u;
    codes[cstride] = data[0] >> 4;
  }
}

// One full block of B contiguous inputs -> unpacked codes; returns the scale byte.
template <class F, class In, int B>
inline uint8_t quantize_block(const typename In::T* __restrict x, int32_t mode,
                              uint8_t* __restrict codes) {
  uint32_t w[B];
  uint32_t amax = 0;
  for (int i = 0; i < B; ++i) {
    w[i] = In::widen(x[i]);
    amax = umax(amax, w[i] & kF32Abs);
  }
  uint8_t s = e8m0_from_amax<F>(amax, mode);
  float inv = as_float(s == kE8M0NaN ? 0u : inv_scale_bits(s));
  uint8_t keep = s == kE8M0NaN ? 0 : 0xFF;  // NaN / Inf blocks: all codes 0
  for (int i = 0; i < B; ++i) codes[i] = uint8_t(encode_element<F>(w[i], inv)) & keep;
  return s;
}

template <class F, class In>
inline uint8_t quantize_block(const typename In::T* x, int block, int32_t mode,
                              uint8_t* codes) {
  switch (block) {
    case 16: return quantize_block<F, In, 16>(x, mode, codes);
    case 32: return quantize_block<F, In, 32>(x, mode, codes);
    default: return quantize_block<F, In, 64>(x, mode, codes);
  }
}

// Quantizes blocks [b0, b1) of one contiguous row of n inputs. `data` / `scales` point at
// the row's storage (block b at data + b * block_storage) and scales.
template <class F, class In>
void quantize_row(const typename In::T* x, int64_t n, int64_t b0, int64_t b1, int block,
                  int32_t mode, uint8_t* data, uint8_t* scales) {
  using T = typename In::T;
  for (int64_t b = b0; b < b1; ++b) {
    int64_t start = b * block;
    int valid = int(min64(block, n - start));
    const T* src = x + start;
    T pad[kMaxBlock];
    if (valid < block) {
      for (int i = 0; i < block; ++i) pad[i] = i < valid ? src[i] : T(0);
      src = pad;
    }
    uint8_t* out = data + b * block_storage<F>(block);
    if constexpr (F::bits == 8) {
      if (valid == block) {
        scales[b] = quantize_block<F, In>(src, block, mode, out);
        continue;
      }
    }
    uint8_t codes[kMaxBlock] = {};  // zeroed: GCC cannot see quantize_block fill `block`
    scales[b] = quantize_block<F, In>(src, block, mode, codes);
    int groups = (valid + F::group_codes - 1) / F::group_codes;
    for (int g = 0; g < groups; ++g) {
      pack_group<F>(codes + g * F::group_codes, 1, out + g * F::group_bytes, 1);
    }
  }
}

// Quantizes one block-row tile along a strided axis: `rows` (<= block) inputs per column,
// rows `ld` apart, columns [c0, c1). `data` points at the tile's first storage row (rows
// `ld` apart), `scales` at its scale row.
template <class F, class In>
void quantize_cols(const typename In::T* x, int64_t ld, int rows, int64_t c0, int64_t c1,
                   int block, int32_t mode, uint8_t* data, uint8_t* scales) {
  constexpr int W = kTileCols;
  for (int64_t cb = c0; cb < c1; cb += W) {
    const int w = int(min64(W, c1 - cb));
    const typename In::T* xc = x + cb;
    uint32_t amax[W] = {};
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < w; ++c) {
        amax[c] = umax(amax[c], In::widen(xc[r * ld + c]) & kF32Abs);
      }
    }
    float inv[W];
    uint8_t keep[W];  // 0 for NaN / Inf blocks, whose codes are all 0
    for (int c = 0; c < w; ++c) {
      uint8_t s = e8m0_from_amax<F>(amax[c], mode);
      scales[cb + c] = s;
      keep[c] = s == kE8M0NaN ? 0 : 0xFF;
      inv[c] = as_float(s == kE8M0NaN ? 0u : inv_scale_bits(s));
    }
    if constexpr (F::bits == 8) {
      for (int r = 0; r < rows; ++r) {
        uint8_t* out = data + r * ld + cb;
        for (int c = 0; c < w; ++c) {
          out[c] = uint8_t(encode_element<F>(In::widen(xc[r * ld + c]), inv[c])) & keep[c];
        }
      }
    } else {
      uint8_t codes[kMaxBlock][W];
      const int groups = (rows + F::group_codes - 1) / F::group_codes;
      for (int r = 0; r < groups * F::group_codes; ++r) {
        for (int c = 0; c < w; ++c) {
          codes[r][c] = r < rows
              ? uint8_t(encode_element<F>(In::widen(xc[r * ld + c]), inv[c])) & keep[c] : 0;
        }
      }
      for (int g = 0; g < groups; ++g) {
        for (int c = 0; c < w; ++c) {
          pack_group<F>(&codes[g * F::group_codes][c], W, data + g * F::group_bytes * ld + cb + c,
                        ld);
        }
      }
    }
  }
}

// A decoded element (f32 bits `d`) times 2^e, rounded once to f32; NaN stays NaN.
MXJAX_HD uint32_t scale_decoded(uint32_t d, float scale) {
  uint32_t p = as_bits(as_float(d) * scale);
  return (d & kF32Abs) > kF32Inf ? d : p;
}

// decode(code) * 2^e rounded once to f32 (bits); NaN codes stay NaN.
template <class F>
MXJAX_HD uint32_t dequantize_element(uint32_t code, float scale) {
  return scale_decoded(decode_element<F>(code), scale);
}

// f32 bits of decode(code) for every code of F, built once (host code): the CPU
// dequantize loops look codes up instead of decoding each one.
template <class F>
struct DecodeTable {
  uint32_t bits[1u << F::bits];
  DecodeTable() {
    for (uint32_t c = 0; c < (1u << F::bits); ++c) bits[c] = decode_element<F>(c);
  }
};

template <class F>
const uint32_t* decode_table() {
  static const DecodeTable<F> table;
  return table.bits;
}

// Dequantizes blocks [b0, b1) of one row of n outputs (layout as in quantize_row).
template <class F, class Out>
void dequantize_row(const uint8_t* data, const uint8_t* scales, int64_t n, int64_t b0,
                    int64_t b1, int block, typename Out::T* out) {
  using T = typename Out::T;
  const uint32_t* decoded = decode_table<F>();
  for (int64_t b = b0; b < b1; ++b) {
    int64_t start = b * block;
    int valid = int(min64(block, n - start));
    const uint8_t* src = data + b * block_storage<F>(block);
    uint8_t codes[kMaxBlock];
    if constexpr (F::bits != 8) {
      int groups = (valid + F::group_codes - 1) / F::group_codes;
      for (int g = 0; g < groups; ++g) {
        unpack_group<F>(src + g * F::group_bytes, 1, codes + g * F::group_codes, 1);
      }
      src = codes;
    }
    T buf[kMaxBlock];
    T* dst = valid == block ? out + start : buf;
    uint8_t s = scales[b];
    if (s == kE8M0NaN) {
      for (int i = 0; i < valid; ++i) dst[i] = Out::narrow(kF32QNaN);
    } else {
      float scale = as_float(scale_bits(s));
      for (int i = 0; i < valid; ++i) dst[i] = Out::narrow(scale_decoded(decoded[src[i]], scale));
    }
    if (dst == buf) {
      for (int i = 0; i < valid; ++i) out[start + i] = buf[i];
    }
  }
}

// Dequantizes one block-row tile along a strided axis (layout as in quantize_cols).
template <class F, class Out>
void dequantize_cols(const uint8_t* data, const uint8_t* scales, int64_t ld, int rows,
                     int64_t c0, int64_t c1, typename Out::T* out) {
  constexpr int W = kTileCols;
  const uint32_t* decoded = decode_table<F>();
  for (int64_t cb = c0; cb < c1; cb += W) {
    const int w = int(min64(W, c1 - cb));
    float scale[W];
    uint32_t nan[W];
    for (int c = 0; c < w; ++c) {
      uint8_t s = scales[cb + c];
      nan[c] = s == kE8M0NaN;
      scale[c] = as_float(s == kE8M0NaN ? 0u : scale_bits(s));
    }
    uint8_t codes[kMaxBlock][W];
    const uint8_t* src = data + cb;
    int64_t sld = ld;
    if constexpr (F::bits != 8) {
      const int groups = (rows + F::group_codes - 1) / F::group_codes;
      for (int g = 0; g < groups; ++g) {
        for (int c = 0; c < w; ++c) {
          unpack_group<F>(data + g * F::group_bytes * ld + cb + c, ld,
                          &codes[g * F::group_codes][c], W);
        }
      }
      src = &codes[0][0];
      sld = W;
    }
    for (int r = 0; r < rows; ++r) {
      typename Out::T* o = out + r * ld + cb;
      for (int c = 0; c < w; ++c) {
        uint32_t v = scale_decoded(decoded[src[r * sld + c]], scale[c]);
        o[c] = Out::narrow(nan[c] ? kF32QNaN : v);
      }
    }
  }
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_QUANTIZE_H_
