// Shared pieces of the CUDA kernels of the block-scaled formats (NVFP4, FP8 blocks, 2-D MX,
// stochastic rounding): the problem view, a tile's scale (ffi/include/mxjax/block_codec.h,
// the CPU kernels' codec), 8-element segments (loads, encode / decode, packed stores).
//
// Every function here but the warp reduction is __host__ __device__: tests/block_host_check.cu
// runs the kernels' threads on the CPU. Numerics: as device.cuh (IEEE f32, no fast math); the one f32
// product that feeds an add (block_encode_f32) is block_codec.h's mul_rn, never an FMA.
#ifndef MXJAX_CUDA_BLOCK_DEVICE_CUH_
#define MXJAX_CUDA_BLOCK_DEVICE_CUH_

#include <cstdint>

#include "cuda/device.cuh"
#include "mxjax/block_codec.h"

namespace mxjax::cuda {

// Elements per segment: 8 codes are whole packing groups of every format (F::bits bytes).
constexpr int kSeg = 8;

// x viewed as [batch, rows, cols] (cols contiguous) in tiles of tr x tc, as the CPU's
// cpu::BlockProblem: 1-D blocks along the last axis are [outer, 1, n] in 1 x b tiles, along
// a strided axis [outer, n, inner] in b x 1 tiles (codes packed along rows: pack_rows),
// 2-D blocks [..., R, C] in b x b tiles. Codes are packed along cols unless pack_rows.
struct BlockView {
  int64_t batch, rows, cols, tr, tc;
  bool pack_rows;
  int32_t scale, mode;
  MXJAX_HD int64_t ntr() const { return cdiv(rows, tr); }
  MXJAX_HD int64_t ntc() const { return cdiv(cols, tc); }
  MXJAX_HD int64_t tiles() const { return batch * ntr() * ntc(); }
};

// ---------------------------------------------------------------------------------------
// A tile's scale

// What a tile's elements are encoded with (m) and decoded with (d); `fast`: the f32 path of
// block_codec.h gives the same bits (the CPU kernels' per-tile choice); `special`: the tile
// holds NaN / Inf (codes 0, values NaN).
struct TileScale {
  Sig m, d;
  bool fast, special;
};

// The Sig of the tensor (encode) scale of f32 bits `ts` (1 without one: ts == 0).
MXJAX_HD Sig encode_scale_sig(uint32_t ts) { return ts ? sig_of_bits(ts) : Sig{0x800000u, -23}; }

// block_scale for a runtime scale kind.
template <class F>
MXJAX_HD ::mxjax::BlockScale block_scale_of(uint32_t amax, int32_t kind, int32_t mode, Sig s_enc) {
  switch (kind) {
    case kScaleE8M0: return ::mxjax::block_scale<F, kScaleE8M0>(amax, mode, s_enc);
    case kScaleE4M3: return ::mxjax::block_scale<F, kScaleE4M3>(amax, mode, s_enc);
    case kScaleFP32: return ::mxjax::block_scale<F, kScaleFP32>(amax, mode, s_enc);
    default: return ::mxjax::block_scale<F, kScaleFP32Pow2>(amax, mode, s_enc);
  }
}

// The TileScale of block_codec.h's BlockScale; kDecode: its codes are decoded too (fake_quantize).
template <class F, bool kDecode>
MXJAX_HD TileScale tile_scale(const ::mxjax::BlockScale& bs) {
  return {bs.m, bs.d, normal_f32(bs.m) && (!kDecode || fast_decode<F>(bs.d, Sig{0, 0})),
          bs.special};
}

// TileScales in shared memory: 2 words (m, the flags in sig's free top bits), 4 with d.
template <bool kDecode>
struct PackedScale {
  static constexpr int kWords = kDecode ? 4 : 2;
  MXJAX_HD static void put(uint32_t* s, const TileScale& t) {
    s[0] = t.m.sig | uint32_t(t.fast) << 24 | uint32_t(t.special) << 25;
    s[1] = uint32_t(t.m.exp);
    if (kDecode) s[2] = t.d.sig, s[3] = uint32_t(t.d.exp);
  }
  MXJAX_HD static TileScale get(const uint32_t* s) {
    TileScale t{{s[0] & 0xFFFFFFu, int32_t(s[1])}, {0, 0}, ((s[0] >> 24) & 1u) != 0,
                ((s[0] >> 25) & 1u) != 0};
    if (kDecode) t.d = {s[2], int32_t(s[3])};
    return t;
  }
};

// Stores a tile's stored scale at scales[i] (u8 for E8M0 / E4M3, u32 f32 bits otherwise).
MXJAX_HD void store_scale(void* scales, int64_t i, int32_t kind, uint32_t stored) {
  if (kind >= kScaleFP32) {
    static_cast<uint32_t*>(scales)[i] = stored;
  } else {
    static_cast<uint8_t*>(scales)[i] = uint8_t(stored);
  }
}

MXJAX_HD uint32_t load_scale(const void* scales, int64_t i, int32_t kind) {
  return kind >= kScaleFP32 ? static_cast<const uint32_t*>(scales)[i]
                            : static_cast<const uint8_t*>(scales)[i];
}

// ---------------------------------------------------------------------------------------
// Segments: 8 consecutive elements of a row, kept as loaded (16-bit inputs two to a word)

template <class In>
struct Raw {
  static constexpr int kWords = kSeg * int(sizeof(typename In::T)) / 4;
  uint32_t w[kWords];
  MXJAX_HD uint32_t bits(int i) const {  // f32 bits of element i
    if constexpr (sizeof(typename In::T) == 2) {
      return In::widen(uint16_t(w[i >> 1] >> (16 * (i & 1))));
    } else {
      return w[i];
    }
  }
  MXJAX_HD uint32_t amax() const {
    uint32_t a = 0;
#pragma unroll
    for (int i = 0; i < kSeg; ++i) a = umax(a, bits(i) & kF32Abs);
    return a;
  }
};

// Loads the 8 elements p[0..8) into r; elements at or past `avail` (<= 0: all) as +0. One
// or two 16-byte loads on the device where `vec` (p 16-byte aligned) and all 8 are there.
template <class In>
MXJAX_HD void load_raw(const typename In::T* p, int64_t avail, bool vec, Raw<In>& r) {
#ifdef __CUDA_ARCH__
  if (vec && avail >= kSeg) {
#pragma unroll
    for (int h = 0; h < Raw<In>::kWords / 4; ++h) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + h);
      r.w[4 * h] = u.x, r.w[4 * h + 1] = u.y, r.w[4 * h + 2] = u.z, r.w[4 * h + 3] = u.w;
    }
    return;
  }
#endif
  constexpr int kPer = 4 / int(sizeof(typename In::T));  // elements per word
#pragma unroll
  for (int i = 0; i < Raw<In>::kWords; ++i) r.w[i] = 0;
#pragma unroll
  for (int i = 0; i < kSeg; ++i) {
    if (i < avail) r.w[i / kPer] |= uint32_t(p[i]) << (32 / kPer * (i % kPer));
  }
}

// Stores 8 f32 values (bits) at p[0..8), those at or past `avail` dropped; two 16-byte
// stores on the device where `vec` (p 16-byte aligned) and all 8 fit.
MXJAX_HD void store_f32x8(uint32_t* p, int64_t avail, bool vec, const uint32_t (&v)[kSeg]) {
#ifdef __CUDA_ARCH__
  if (vec && avail >= kSeg) {
    reinterpret_cast<uint4*>(p)[0] = make_uint4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<uint4*>(p)[1] = make_uint4(v[4], v[5], v[6], v[7]);
    return;
  }
#endif
#pragma unroll
  for (int i = 0; i < kSeg; ++i) {
    if (i < avail) p[i] = v[i];
  }
}

// Stores the low n (4, 6 or 8) bytes of w at p[0..n), those at or past `avail` dropped: one
// 8- or 4-byte store, or three 2-byte stores (n = 6), on the device where aligned and whole.
template <int n>
MXJAX_HD void store_n(uint8_t* p, int64_t avail, uint64_t w) {
#ifdef __CUDA_ARCH__
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (avail >= n) {
    if (n == 6 && (a & 1) == 0) {
      uint16_t* q = reinterpret_cast<uint16_t*>(p);
      q[0] = uint16_t(w), q[1] = uint16_t(w >> 16), q[2] = uint16_t(w >> 32);
      return;
    }
    if (n == 8 && (a & 7) == 0) { *reinterpret_cast<uint64_t*>(p) = w; return; }
    if (n == 4 && (a & 3) == 0) { *reinterpret_cast<uint32_t*>(p) = uint32_t(w); return; }
  }
#endif
#pragma unroll
  for (int k = 0; k < n; ++k) {
    if (k < avail) p[k] = uint8_t(w >> (8 * k));
  }
}

// Loads n bytes as store_n stores them; bytes at or past `avail` read as 0.
template <int n>
MXJAX_HD uint64_t load_n(const uint8_t* p, int64_t avail) {
#ifdef __CUDA_ARCH__
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (avail >= n) {
    if (n == 6 && (a & 1) == 0) {
      const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
      return uint64_t(q[0]) | uint64_t(q[1]) << 16 | uint64_t(q[2]) << 32;
    }
    if (n == 8 && (a & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
    if (n == 4 && (a & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
  }
#endif
  uint64_t w = 0;
#pragma unroll
  for (int k = 0; k < n; ++k) {
    if (k < avail) w |= uint64_t(p[k]) << (8 * k);
  }
  return w;
}

// The F::bits bytes of 8 packed codes (a segment's storage).
template <class F>
MXJAX_HD void store_codes(uint8_t* p, int64_t avail, uint64_t w) { store_n<F::bits>(p, avail, w); }
template <class F>
MXJAX_HD uint64_t load_codes(const uint8_t* p, int64_t avail) { return load_n<F::bits>(p, avail); }

// Byte k of each of 8 words, as one word (byte i from w[i]): the 8 columns' packed codes
// of a b x 1 tile row, turned into the k-th storage row of 8 columns.
MXJAX_HD uint64_t byte_row(const uint64_t (&w)[kSeg], int k) {
  uint64_t out = 0;
#pragma unroll
  for (int i = 0; i < kSeg; ++i) out |= ((w[i] >> (8 * k)) & 0xFFu) << (8 * i);
  return out;
}

// ---------------------------------------------------------------------------------------
// Encode / decode

// The 8 codes of a segment under its tile's scale, packed (code i at bit i * F::bits).
// Elements' f32 bits x(i); stochastic rounding reads rand.w[i].
template <class F, bool kSR, class X>
MXJAX_HD uint64_t encode_segment(const X& x, const Raw<F32>& rand, const TileScale& s) {
  uint64_t w = 0;
  if (s.special) return 0;
  if (s.fast) {
    const float mf = f32_value(s.m);
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      w |= uint64_t(block_encode_f32<F, kSR>(x(i), mf, kSR ? rand.w[i] : 0u)) << (i * F::bits);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      w |= uint64_t(block_encode<F, kSR>(x(i), s.m, kSR ? rand.w[i] : 0u)) << (i * F::bits);
    }
  }
  return w;
}

// f32 bits of a code under its tile's scale (as encoded: no tensor scale); NaN where the
// tile is special.
template <class F>
MXJAX_HD uint32_t decode_code(uint32_t code, const TileScale& s) {
  const uint32_t v = s.fast ? as_bits(mul_rn(as_float(grid_value_bits<F>(code)), f32_value(s.d)))
                            : block_decode<F>(code, s.d, Sig{0, 0});
  return s.special ? kF32QNaN : v;
}

// The same for the 8 packed codes w of a segment (one branch for the 8).
template <class F>
MXJAX_HD void decode_segment(uint64_t w, const TileScale& s, uint32_t (&out)[kSeg]) {
  if (s.fast) {
    const float df = f32_value(s.d);
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      out[i] = as_bits(mul_rn(as_float(grid_value_bits<F>(unpack_code<F>(w, i))), df));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSeg; ++i) out[i] = block_decode<F>(unpack_code<F>(w, i), s.d, Sig{0, 0});
  }
#pragma unroll
  for (int i = 0; i < kSeg; ++i) out[i] = s.special ? kF32QNaN : out[i];
}

// What a stored scale decodes with: d, whether it is NaN, and whether the f32 path holds
// (the CPU's fast_decode, with the tensor scale ts: Sig{0, 0} where none is applied).
struct StoredScale {
  Sig d;
  float df;
  bool nan, fast;
};

template <class F>
MXJAX_HD StoredScale stored_scale(uint32_t stored, int32_t kind, Sig ts) {
  StoredScale s;
  s.d = stored_scale_value(stored, kind, s.nan);
  s.df = f32_value(s.d);
  s.fast = fast_decode<F>(s.d, ts);
  return s;
}

// f32 bits of one code under a stored scale, divided by the tensor scale ts (its f32 tsf;
// ts.sig == 0, tsf == 1 where none is applied), as the CPU's decode_run.
template <class F>
MXJAX_HD uint32_t decode_stored(uint32_t code, const StoredScale& s, Sig ts, float tsf) {
  uint32_t v;
  if (s.fast) {
    v = as_bits(mul_rn(as_float(grid_value_bits<F>(code)), s.df) / tsf);
  } else {
    v = block_decode<F>(code, s.d, ts);
  }
  return s.nan ? kF32QNaN : v;
}

// a / d for a divisor d fixed per launch: a shift where d is a power of two.
struct Divisor {
  int64_t d;
  int shift;  // log2(d), or -1
  Divisor(int64_t v = 1) : d(v), shift(-1) {
    if (v > 0 && (v & (v - 1)) == 0) {
      shift = 0;
      while ((int64_t{1} << shift) < v) ++shift;
    }
  }
  MXJAX_HD int64_t div(int64_t a) const { return shift >= 0 ? a >> shift : a / d; }
};

inline bool pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_BLOCK_DEVICE_CUH_
