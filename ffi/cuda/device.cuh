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

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "mxjax/codec.h"
#include "mxjax/quantize.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cuda {

namespace ffi = xla::ffi;
using mxjax::BF16;
using mxjax::F16;
using mxjax::F32;

constexpr int kThreads = 256;  // threads per block of the elementwise kernels

MXJAX_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// Grid size for `threads` threads of kThreads-sized blocks (a grid-stride loop covers the rest).
inline unsigned grid_for(int64_t threads) {
  int64_t blocks = cdiv(threads, kThreads);
  return unsigned(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
}

MXJAX_HD bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The launch error, if any, of the kernels just enqueued, as an ffi::Error.
inline ffi::Error launch_status(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("mxjax: CUDA ") + what + " launch failed: " +
                              cudaGetErrorString(err));
}

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_DEVICE_CUH_
