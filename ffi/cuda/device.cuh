// Shared pieces of the CUDA handlers: the codec of ffi/include (one copy for CPU and GPU),
// format / dtype dispatch, packed-code stores and loads, launch and error helpers.
//
// Numerics: the kernels use codec.h's integer / f32-add path only. It needs IEEE f32 on
// the device: round-to-nearest-even adds and multiplies with subnormals, i.e. the nvcc
// defaults (-ftz=false -prec-div=true); never build these files with --use_fast_math.
// Contracting a multiply and an add into an FMA cannot change a result here: the only
// product that feeds an add (x * 2^-e in encode_element) is exact whenever it is not
// far below the element grid's quantum.
#ifndef MXJAX_CUDA_DEVICE_CUH_
#define MXJAX_CUDA_DEVICE_CUH_

// Host instances of the codec's inline functions compiled here get their own namespace.
#ifndef MXJAX_ISA_NS
#define MXJAX_ISA_NS nvcc
#endif

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "mxjax/codec.h"
#include "mxjax/quantize.h"
#ifndef MXJAX_CUDA_KERNELS_ONLY  // tests/bench_kernels.cu: the kernels without XLA's headers
#include "xla/ffi/api/ffi.h"
#endif

// The kernels (__global__) and their launches compile under nvcc except in the host checks
// (tests/host_check.cu, block_host_check.cu define MXJAX_HOST_CHECK), which run the same
// __host__ __device__ bodies on the CPU.
#if defined(__CUDACC__) && !defined(MXJAX_HOST_CHECK)
#define MXJAX_CUDA_DEVICE 1
#else
#define MXJAX_CUDA_DEVICE 0
#endif

namespace mxjax::cuda {

using mxjax::BF16;
using mxjax::F16;
using mxjax::F32;

constexpr int kThreads = 256;  // threads per block of the elementwise kernels

MXJAX_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#ifndef MXJAX_CUDA_KERNELS_ONLY
namespace ffi = xla::ffi;

// Calls fn(F{}, T{}) for an element format id and a high-precision type (BF16 / F16 / F32).
template <class Fn>
void dispatch(int32_t format, ffi::DataType dtype, Fn&& fn) {
  auto with_dtype = [&](auto f) {
    switch (dtype) {
      case ffi::DataType::BF16: return fn(f, BF16{});
      case ffi::DataType::F16: return fn(f, F16{});
      default: return fn(f, F32{});
    }
  };
  return with_format(format, with_dtype);
}

#endif  // MXJAX_CUDA_KERNELS_ONLY

// Storage bytes of `codes` consecutive codes along the quantized axis (codes a multiple of
// the format's group). Code i of a run sits at bit i * F::bits of the little-endian byte
// stream, for every format (FP6: c0 | c1 << 6 | ...; FP4: low nibble first).
template <class F>
MXJAX_HD constexpr int packed_bytes(int codes) { return codes * F::bits / 8; }

template <class F>
MXJAX_HD uint64_t pack_codes(const uint32_t* codes, int count) {  // count * bits <= 64
  uint64_t w = 0;
  for (int i = 0; i < count; ++i) w |= uint64_t(codes[i]) << (i * F::bits);
  return w;
}

template <class F>
MXJAX_HD uint32_t unpack_code(uint64_t w, int i) {
  return uint32_t(w >> (i * F::bits)) & ((1u << F::bits) - 1);
}

// Writes the low `nbytes` (<= 8) bytes of w at p[0], p[stride], ...; bytes whose position
// pos + k is >= limit are dropped. One wide store when contiguous, complete and aligned.
MXJAX_HD void store_bytes(uint8_t* p, int64_t stride, int64_t pos, int64_t limit, uint64_t w,
                          int nbytes) {
#ifdef __CUDA_ARCH__
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (stride == 1 && pos + nbytes <= limit && (a & (nbytes - 1)) == 0) {
    if (nbytes == 8) { *reinterpret_cast<uint64_t*>(p) = w; return; }
    if (nbytes == 4) { *reinterpret_cast<uint32_t*>(p) = uint32_t(w); return; }
    if (nbytes == 2) { *reinterpret_cast<uint16_t*>(p) = uint16_t(w); return; }
  }
#endif
  for (int k = 0; k < nbytes; ++k) {
    if (pos + k < limit) p[k * stride] = uint8_t(w >> (8 * k));
  }
}

// Reads `nbytes` (<= 8) bytes as in store_bytes; bytes at positions >= limit read as 0.
MXJAX_HD uint64_t load_bytes(const uint8_t* p, int64_t stride, int64_t pos, int64_t limit,
                             int nbytes) {
#ifdef __CUDA_ARCH__
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (stride == 1 && pos + nbytes <= limit && (a & (nbytes - 1)) == 0) {
    if (nbytes == 8) return *reinterpret_cast<const uint64_t*>(p);
    if (nbytes == 4) return *reinterpret_cast<const uint32_t*>(p);
    if (nbytes == 2) return *reinterpret_cast<const uint16_t*>(p);
  }
#endif
  uint64_t w = 0;
  for (int k = 0; k < nbytes; ++k) {
    if (pos + k < limit) w |= uint64_t(p[k * stride]) << (8 * k);
  }
  return w;
}

// Elements per 16-byte vector of the high-precision type In.
template <class In>
constexpr int kVec = int(16 / sizeof(typename In::T));

// Loads V consecutive elements of type T (f32 bits out) from x[i..i+V), elements at or past
// `limit` as +0. One 16-byte load on the device when `vec` (the caller checked alignment)
// and complete.
template <class In, int V>
MXJAX_HD void load_widened(const typename In::T* x, int64_t i, int64_t limit, bool vec,
                           uint32_t (&out)[V]) {
  using T = typename In::T;
  static_assert(V * sizeof(T) == 16, "one 16-byte vector");
#ifdef __CUDA_ARCH__
  if (vec && i + V <= limit) {
    union { uint4 v; T t[V]; } u;
    u.v = __ldg(reinterpret_cast<const uint4*>(x + i));
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = In::widen(u.t[k]);
    return;
  }
#endif
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = i + k < limit ? In::widen(x[i + k]) : 0u;
}

MXJAX_HD bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Calls fn(std::integral_constant<int, B>{}) for a block size of 16, 32 or 64.
template <class Fn>
void with_block(int block, Fn&& fn) {
  switch (block) {
    case 16: return fn(std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    default: return fn(std::integral_constant<int, 64>{});
  }
}

// ---------------------------------------------------------------------------------------
// Launch shape: grid-stride kernels get at most `waves` full waves of resident blocks.

// Streaming multiprocessors of the current device (cached per device; 132 on an H100 SXM).
inline int sm_count() {
  static std::atomic<int> counts[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  int n = counts[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
      n = 132;
    }
    counts[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Grid of kThreads-thread blocks for `items` work items of one thread each, a grid-stride
// loop doing the rest: enough blocks for every SM to hold `per_sm` of them, fewer when the
// items run out (never 0).
inline unsigned grid_for(int64_t items, int per_sm = 8) {
  const int64_t want = cdiv(items, kThreads), cap = int64_t(sm_count()) * per_sm;
  return unsigned(want < 1 ? 1 : (want < cap ? want : cap));
}

// ---------------------------------------------------------------------------------------
// Variants. tests/bench_kernels.cu times the alternatives against each other and against a
// device-to-device copy; the handlers use the defaults below (ffi/cuda/PERF_NOTES.md).

// How an element is encoded. kCodec: codec.h's encode_element (x * 2^-e rounded once in
// f32, then the integer / f32-add rounding to the element grid), on the host and the device.
// kCvt: on devices of compute capability 8.9 and up, FP8 pairs by the hardware's
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 of x * 2^-e (the same f32 product); FP4 / FP6 (no such
// instruction before sm_100), older devices and host code use kCodec. bench_kernels.cu
// proved the instruction equal to codec.h on every finite f32 on an H200 (2026-11-27): the
// default, 0.87-0.97 of a copy against kCodec's 0.83.
enum class Enc { kCodec, kCvt };
constexpr Enc kEncDefault = Enc::kCvt;

// Threads that share one block of a rowwise quantize: 4 for 16-bit FP8 inputs with the
// hardware cvt (0.97 of a copy on the H200), else 1 (FP4 / FP6: 0.83 at 1, 0.58 at 4).
template <class F, class In>
constexpr int kRowLanesDefault =
    F::bits == 8 && kEncDefault == Enc::kCvt && sizeof(typename In::T) == 2 ? 4 : 1;
// Threads per block of a rowwise fake_quantize (1: 0.48-0.59 of a copy; 4: 0.42).
constexpr int kFakeRowLanesDefault = 1;
// Threads per block of rows (quantize, fake_quantize) for the requested L: 1 where B / L
// elements would not fill whole 16-byte loads or whole code words.
template <class In, int B, int L>
constexpr int row_lanes() {
  constexpr int S = B / L;
  return (L >= 1 && B % L == 0 && S * sizeof(typename In::T) % 16 == 0 && S % 2 == 0 &&
          L <= 32) ? L : 1;
}
// Which input types the fast kernels are compiled for: bf16 and f32. f16 inputs (rare) run
// the slow paths of the same ops, same bytes: the MX quantize / fake_quantize's element-by-
// element rows and one-column tiles, the block formats' generic kernel (block_launch.cuh).
// Each fast kernel is compiled per input type (and format, block, output): f16's took
// ~36 s of the MX units' compile CPU, and more of the block units' (ffi/cuda/README.md).
template <class In>
constexpr bool fast_input() {
  return !std::is_same_v<In, F16>;
}

// Which (input, output) pairs the MX fake_quantize's fast kernels are compiled for: fast
// inputs to bf16 or f32 (a model's own dtype, or f32 master weights to bf16). An f16 output
// (rare from a bf16 / f32 input) runs the same slow paths as f16 inputs, same bytes.
template <class In, class Out>
constexpr bool fast_fake_quantize() {
  return fast_input<In>() && !std::is_same_v<Out, F16>;
}

// Bytes of input a thread of a columnwise quantize / fake_quantize keeps in registers
// (block rows x columns x sizeof(T)): 256 = 32 rows x 4 bf16 (8-byte loads).
constexpr int kColTileBytesDefault = 256;
// Codes (bytes) per storage row of a columnwise dequantize tile (8 rows x this many
// columns): 4 (0.41 of a copy on the H200; 16: 0.18-0.32).
constexpr int kDeqColBytesDefault = 4;

// Columns of a B-row register tile of In holding kTileBytes (at least 1).
template <class In, int B, int kTileBytes>
MXJAX_HD constexpr int tile_cols() {
  return kTileBytes / (B * int(sizeof(typename In::T))) > 0
             ? kTileBytes / (B * int(sizeof(typename In::T))) : 1;
}

// ---------------------------------------------------------------------------------------
// Raw loads and stores. A run of V elements of In is held as raw_words<In, V>() 32-bit words
// (little-endian, element i at byte i * sizeof(T); a single 16-bit element zero-extended).

template <class In, int V>
MXJAX_HD constexpr int raw_words() {
  return V * int(sizeof(typename In::T)) >= 4 ? V * int(sizeof(typename In::T)) / 4 : 1;
}

// The largest power of two (<= 16) that divides `bytes`.
MXJAX_HD constexpr int align_of(int bytes) {
  return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
}

// Loads the V elements at p (aligned to V * sizeof(T), a power of two) with the widest
// loads that allows.
template <class In, int V>
MXJAX_HD void load_raw(const typename In::T* p, uint32_t (&w)[raw_words<In, V>()]) {
  constexpr int kBytes = V * int(sizeof(typename In::T));
#ifdef __CUDA_ARCH__
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (kBytes == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (kBytes == 4) {
    w[0] = __ldg(reinterpret_cast<const unsigned*>(p));
  } else {
    w[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
  }
#else
  w[0] = 0;
  std::memcpy(w, p, kBytes);
#endif
}

// Loads kBytes bytes at p (aligned to kAlign, a power of two) into the little-endian words w
// (the bytes of a last partial word past kBytes are 0).
template <int kBytes, int kAlign>
MXJAX_HD void load_bytes_raw(const uint8_t* p, uint32_t* w) {
#ifdef __CUDA_ARCH__
  constexpr int A = align_of(kBytes) < kAlign ? align_of(kBytes) : kAlign;
  if constexpr (A >= 4) {
#pragma unroll
    for (int i = 0; i < kBytes / A; ++i) {
      if constexpr (A == 16) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      } else if constexpr (A == 8) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
      } else {
        w[i] = __ldg(reinterpret_cast<const unsigned*>(p) + i);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < (kBytes + 3) / 4; ++i) w[i] = 0;
#pragma unroll
    for (int i = 0; i < kBytes; ++i) w[i / 4] |= uint32_t(__ldg(p + i)) << (8 * (i % 4));
  }
#else
  for (int i = 0; i < (kBytes + 3) / 4; ++i) w[i] = 0;
  std::memcpy(w, p, kBytes);
#endif
}

// Stores the low kBytes bytes of w at p, which is aligned to kAlign (a power of two), with
// the widest stores that both allow.
template <int kBytes, int kAlign>
MXJAX_HD void store_raw(uint8_t* p, const uint32_t* w) {
#ifdef __CUDA_ARCH__
  constexpr int A = align_of(kBytes) < kAlign ? align_of(kBytes) : kAlign;
#pragma unroll
  for (int i = 0; i < kBytes / A; ++i) {
    if constexpr (A == 16) {
      reinterpret_cast<uint4*>(p)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    } else if constexpr (A == 8) {
      reinterpret_cast<uint2*>(p)[i] = make_uint2(w[2 * i], w[2 * i + 1]);
    } else if constexpr (A == 4) {
      reinterpret_cast<uint32_t*>(p)[i] = w[i];
    } else if constexpr (A == 2) {
      reinterpret_cast<uint16_t*>(p)[i] = uint16_t(w[i / 2] >> (16 * (i % 2)));
    } else {
      p[i] = uint8_t(w[i / 4] >> (8 * (i % 4)));
    }
  }
#else
  std::memcpy(p, w, kBytes);
#endif
}

// ---------------------------------------------------------------------------------------
// Raw elements -> f32 bits, amax.

// f32 bits of a 16-bit element h of In (exact). f16 on the device: the hardware's exact
// widening (it may give another NaN than codec.h, which nothing reads: a NaN makes its
// block's scale NaN, whose codes are 0 and whose values are the quiet NaN).
template <class In>
MXJAX_HD uint32_t widen16(uint32_t h) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<In, F16>) return __float_as_uint(__half2float(__ushort_as_half(uint16_t(h))));
#endif
  return In::widen(typename In::T(h));
}

// f32 bits of element i of a run of V elements held in raw words.
template <class In, int V>
MXJAX_HD uint32_t raw_elem(const uint32_t* w, int i) {
  if constexpr (sizeof(typename In::T) == 4) {
    return w[i];
  } else if constexpr (V == 1) {
    return widen16<In>(w[0]);
  } else if constexpr (std::is_same_v<In, BF16>) {
    return i % 2 ? w[i / 2] & 0xFFFF0000u : w[i / 2] << 16;
  } else {
    return widen16<In>(i % 2 ? w[i / 2] >> 16 : w[i / 2] & 0xFFFFu);
  }
}

// Per-half unsigned max of two pairs of 16-bit lanes.
MXJAX_HD uint32_t vmax_u16x2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __vmaxu2(a, b);
#else
  return umax(a & 0xFFFFu, b & 0xFFFFu) | (umax(a >> 16, b >> 16) << 16);
#endif
}

// Running max of |element| over raw words: for 16-bit types both halves at once (the
// magnitude bits of bf16 / f16, like f32's, order as the magnitudes, NaN above Inf).
template <class In>
MXJAX_HD uint32_t raw_abs_max(uint32_t acc, uint32_t w) {
  if constexpr (sizeof(typename In::T) == 4) return umax(acc, w & kF32Abs);
  return vmax_u16x2(acc, w & 0x7FFF7FFFu);
}

// f32 bits of the amax that raw_abs_max accumulated (its lanes folded for 16-bit types).
template <class In>
MXJAX_HD uint32_t raw_amax_f32(uint32_t acc) {
  if constexpr (sizeof(typename In::T) == 4) return acc;
  return In::widen(typename In::T(umax(acc & 0xFFFFu, acc >> 16)));
}

#if MXJAX_CUDA_DEVICE
// The max of v over aligned groups of `width` lanes (a power of two <= 32), in every lane
// (the host checks emulate it between phases).
__device__ __forceinline__ uint32_t group_max(uint32_t v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v = umax(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return v;
}
#endif

// ---------------------------------------------------------------------------------------
// Block scales and element codes.

// A block's E8M0 byte with what the encoders and decoders need of it.
struct BlockScale {
  uint32_t byte;
  float inv;      // 2^-e (0 for a NaN / Inf block)
  float scale;    // 2^e (0 for a NaN / Inf block)
  uint32_t keep;  // all ones, or 0 for a NaN / Inf block (its codes are 0)
};

template <class F>
MXJAX_HD BlockScale block_scale(uint32_t amax, int32_t mode) {
  const uint8_t s = e8m0_from_amax<F>(amax, mode);
  const bool nan = s == kE8M0NaN;
  return {s, as_float(nan ? 0u : inv_scale_bits(s)), as_float(nan ? 0u : scale_bits(s)),
          nan ? 0u : ~0u};
}

// The scale of a stored byte (dequantize).
MXJAX_HD BlockScale stored_scale(uint8_t s) {
  const bool nan = s == kE8M0NaN;
  return {s, as_float(nan ? 0u : inv_scale_bits(s)), as_float(nan ? 0u : scale_bits(s)),
          nan ? 0u : ~0u};
}

// Codes of two elements (f32 bits x0, x1 of blocks with scales s0, s1): c0 | c1 << F::bits.
template <class F, Enc E>
MXJAX_HD uint32_t encode2(uint32_t x0, uint32_t x1, const BlockScale& s0, const BlockScale& s1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890  // the FP8 cvt: sm_89 and up
  if constexpr (E == Enc::kCvt && F::bits == 8) {
    const float v0 = __uint_as_float(x0) * s0.inv, v1 = __uint_as_float(x1) * s1.inv;
    unsigned short r;
    if constexpr (F::id == kE4M3) {
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(v0), "f"(v1));
    } else {
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(v0), "f"(v1));
    }
    return uint32_t(r) & ((s0.keep & 0xFFu) | (s1.keep & 0xFF00u));
  }
#endif
  return (encode_element<F>(x0, s0.inv) & s0.keep) |
         ((encode_element<F>(x1, s1.inv) & s1.keep) << F::bits);
}

// ORs the low `nbits` bits of c into the little-endian bit stream w at bit `pos` (both known
// at compile time after unrolling; w zeroed by the caller).
template <int N>
MXJAX_HD void put_bits(uint32_t (&w)[N], int pos, uint32_t c, int nbits) {
  const int word = pos / 32, off = pos % 32;
  w[word] |= c << off;
  if (off + nbits > 32) w[word + 1] |= c >> (32 - off);
}

// Packed codes of a run of V (even) elements of one block along the quantized axis: code i
// at bit i * F::bits of out.
template <class F, class In, Enc E, int V>
MXJAX_HD void encode_run(const uint32_t* w, const BlockScale& s,
                         uint32_t (&out)[(V * F::bits + 31) / 32]) {
  static_assert(V % 2 == 0, "pairs");
#pragma unroll
  for (int i = 0; i < (V * F::bits + 31) / 32; ++i) out[i] = 0;
#pragma unroll
  for (int i = 0; i < V; i += 2) {
    put_bits(out, i * F::bits,
             encode2<F, E>(raw_elem<In, V>(w, i), raw_elem<In, V>(w, i + 1), s, s), 2 * F::bits);
  }
}

// Codes of one row of a column tile: V elements (columns c, scales s[c]), one code per byte.
template <class F, class In, Enc E, int V>
MXJAX_HD void encode_cols(const uint32_t* w, const BlockScale* s, uint32_t (&out)[(V + 3) / 4]) {
#pragma unroll
  for (int i = 0; i < (V + 3) / 4; ++i) out[i] = 0;
  if constexpr (V == 1) {
    out[0] = encode2<F, E>(raw_elem<In, 1>(w, 0), 0, s[0], s[0]) & ((1u << F::bits) - 1);
  } else {
#pragma unroll
    for (int c = 0; c < V; c += 2) {
      const uint32_t c2 = encode2<F, E>(raw_elem<In, V>(w, c), raw_elem<In, V>(w, c + 1), s[c],
                                        s[c + 1]);
      put_bits(out, 8 * c, (c2 & ((1u << F::bits) - 1)) | (c2 >> F::bits) << 8, 16);
    }
  }
}

// Storage row k (< F::group_bytes) of a group of F::group_codes rows of column codes (one
// code per byte, bytewise: the columns never mix).
template <class F>
MXJAX_HD uint32_t pack_rows(const uint32_t* r, int k) {
  if constexpr (F::bits == 8) {
    return r[0];
  } else if constexpr (F::bits == 4) {
    return r[0] | r[1] << 4;
  } else {  // c0 | c1 << 6 | c2 << 12 | c3 << 18 in three bytes
    if (k == 0) return r[0] | ((r[1] << 6) & 0xC0C0C0C0u);
    if (k == 1) return ((r[1] >> 2) & 0x0F0F0F0Fu) | ((r[2] << 4) & 0xF0F0F0F0u);
    return ((r[2] >> 4) & 0x03030303u) | r[3] << 2;
  }
}

// Inverse of pack_rows: the column codes (one per byte) of row i (< F::group_codes) of a
// group from its storage rows d.
template <class F>
MXJAX_HD uint32_t unpack_rows(const uint32_t* d, int i) {
  if constexpr (F::bits == 8) {
    return d[0];
  } else if constexpr (F::bits == 4) {
    return i == 0 ? d[0] & 0x0F0F0F0Fu : (d[0] >> 4) & 0x0F0F0F0Fu;
  } else {
    if (i == 0) return d[0] & 0x3F3F3F3Fu;
    if (i == 1) return ((d[0] >> 6) & 0x03030303u) | ((d[1] << 2) & 0x3C3C3C3Cu);
    if (i == 2) return ((d[1] >> 4) & 0x0F0F0F0Fu) | ((d[2] << 4) & 0x30303030u);
    return (d[2] >> 2) & 0x3F3F3F3Fu;
  }
}

// ---------------------------------------------------------------------------------------
// Decoded values and high-precision outputs.

// f32 bits of decode(code) * 2^e (dequantize_element), or the quiet NaN of a NaN scale.
template <class F>
MXJAX_HD uint32_t scaled_value(uint32_t code, const BlockScale& s) {
  return s.keep ? dequantize_element<F>(code, s.scale) : kF32QNaN;
}

// Output element i of a run of V values (f32 bits) narrowed to Out, packed little-endian
// into raw words of Out.
template <class Out, int V>
MXJAX_HD void put_out(uint32_t (&w)[raw_words<Out, V>()], int i, uint32_t bits) {
  if constexpr (sizeof(typename Out::T) == 4) {
    w[i] = bits;
  } else if constexpr (V == 1) {
    w[0] = Out::narrow(bits);
  } else if (i % 2 == 0) {
    w[i / 2] = Out::narrow(bits);
  } else {
    w[i / 2] |= uint32_t(Out::narrow(bits)) << 16;
  }
}

// ---------------------------------------------------------------------------------------
// Column blocks held in registers: w[r] = row r of B rows x V columns (raw words of In; rows
// from `valid` on are zeros). A column's block is whole in one thread.

// The V columns' scales (f32 bits of each column's amax through block_scale).
template <class F, class In, int B, int V>
MXJAX_HD void col_scales(const uint32_t (&w)[B][raw_words<In, V>()], int32_t mode,
                         BlockScale (&s)[V]) {
  constexpr int N = raw_words<In, V>();
  uint32_t acc[N] = {};
#pragma unroll
  for (int r = 0; r < B; ++r) {
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = raw_abs_max<In>(acc[k], w[r][k]);
  }
#pragma unroll
  for (int c = 0; c < V; ++c) {
    uint32_t m;
    if constexpr (sizeof(typename In::T) == 4) {
      m = acc[c];
    } else {
      m = In::widen(typename In::T(c % 2 ? acc[c / 2] >> 16 : acc[c / 2] & 0xFFFFu));
    }
    s[c] = block_scale<F>(m, mode);
  }
}

// Quantizes the V column blocks: their V scale bytes to scales[0..V), their codes to the
// storage rows data[k * ld] (k < the block's storage rows that hold rows < valid). scales and
// data are aligned to V bytes (ld % V == 0).
template <class F, class In, int B, int V, Enc E>
MXJAX_HD void store_col_blocks(const uint32_t (&w)[B][raw_words<In, V>()], int valid,
                               int32_t mode, int64_t ld, uint8_t* scales, uint8_t* data) {
  constexpr int kCodeWords = (V + 3) / 4;  // one row's column codes, one per byte
  BlockScale s[V];
  col_scales<F, In, B, V>(w, mode, s);
  uint32_t sb[kCodeWords] = {};
#pragma unroll
  for (int c = 0; c < V; ++c) sb[c / 4] |= s[c].byte << (8 * (c % 4));
  store_raw<V, align_of(V)>(scales, sb);
#pragma unroll
  for (int q = 0; q < B / F::group_codes; ++q) {
    if (q * F::group_codes >= valid) break;
    uint32_t codes[F::group_codes][kCodeWords];
#pragma unroll
    for (int i = 0; i < F::group_codes; ++i) {
      encode_cols<F, In, E, V>(w[q * F::group_codes + i], s, codes[i]);
    }
#pragma unroll
    for (int k = 0; k < F::group_bytes; ++k) {
      uint32_t rows[F::group_codes], packed[kCodeWords];
#pragma unroll
      for (int cw = 0; cw < kCodeWords; ++cw) {
#pragma unroll
        for (int i = 0; i < F::group_codes; ++i) rows[i] = codes[i][cw];
        packed[cw] = pack_rows<F>(rows, k);
      }
      store_raw<V, align_of(V)>(data + (q * F::group_bytes + k) * ld, packed);
    }
  }
}

// 32-bit quotient where both operands fit (a few instructions instead of a 64-bit division).
MXJAX_HD int64_t div_fast(int64_t a, int64_t b) {
  if (((a | b) >> 32) == 0) return int64_t(uint32_t(a) / uint32_t(b));
  return a / b;
}

#ifndef MXJAX_CUDA_KERNELS_ONLY
// The launch error, if any, of the kernels just enqueued, as an ffi::Error.
inline ffi::Error launch_status(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("mxjax: CUDA ") + what + " launch failed: " +
                              cudaGetErrorString(err));
}
#endif  // MXJAX_CUDA_KERNELS_ONLY

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_DEVICE_CUH_
