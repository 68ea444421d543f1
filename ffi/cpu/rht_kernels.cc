// The RHT (rht.h) for one SIMD level (CMake compiles this file once per level, like
// kernels.cc). The butterfly runs down the columns, a vector of columns at a time: runs of
// 16 (NVFP4's) hold their 16 rows in registers through the four stages; other runs stage
// a chunk of their rows in an L1-sized buffer, one vectorized loop per step. On x86 the
// hardware flushes subnormals (MXCSR's FTZ and DAZ, set for the call); elsewhere each
// result is flushed in code (the general path only).
#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "mxcsr.h"
#include "rht.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

constexpr int64_t kChunkFloats = 4096;  // the general path: a run's rows x columns, 16 KiB

// Where there is an MXCSR the hardware flushes inside a cpu::FlushScope<true> as rht.h
// says (x86 detects a tiny result after rounding, as the flush of the IEEE result does),
// at no cost per element.
#ifdef MXJAX_HAVE_MXCSR
constexpr bool kHardwareFlush = true;
#else
constexpr bool kHardwareFlush = false;
#endif

// v, or a zero of v's sign where v is subnormal (by the hardware where it flushes).
inline float flushed(float v) {
  if constexpr (kHardwareFlush) return v;
  const uint32_t u = as_bits(v);
  return as_float(u & ((u & kF32Inf) ? 0xFFFFFFFFu : 0x80000000u));
}

// max(m, the f32 bits of |v|) where v is finite (tensor_amax's rule).
inline uint32_t finite_max(uint32_t m, float v) {
  const uint32_t a = as_bits(v) & kF32Abs;
  return a < kF32Inf && a > m ? a : m;
}

// The general path: any n, w columns (n * w <= kChunkFloats) of one run, staged in t
// ([n, w]) and copied to o (row stride ld_out) where o is given; returns finite_max over
// them.
template <class T>
uint32_t run_staged(const T* x, int64_t ld, int64_t w, const uint32_t* signs, int32_t n,
                    float c, float* o, int64_t ld_out, float* __restrict t) {
  constexpr int kShift = sizeof(T) == 2 ? 16 : 0;
  for (int32_t i = 0; i < n; ++i) {
    const T* __restrict xi = x + i * ld;
    for (int64_t k = 0; k < w; ++k) {
      t[i * w + k] = flushed(as_float((uint32_t(xi[k]) << kShift) ^ signs[i]));
    }
  }
  for (int32_t h = 1; h < n; h *= 2) {
    for (int32_t i = 0; i < n; ++i) {
      if (i & h) continue;
      float* __restrict a = t + i * w;
      float* __restrict b = t + (i + h) * w;
      for (int64_t k = 0; k < w; ++k) {
        const float sum = a[k] + b[k], diff = a[k] - b[k];
        a[k] = flushed(sum), b[k] = flushed(diff);
      }
    }
  }
  uint32_t m = 0;
  for (int32_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < w; ++k) {
      const float v = flushed(t[i * w + k] * c);
      m = finite_max(m, v);
      if (o) o[i * ld_out + k] = v;
    }
  }
  return m;
}

// The fast path of runs of 16 (NVFP4's) where the hardware flushes: kW columns at a time,
// the run's 16 rows in registers through the four stages.
constexpr int kW = cpu::kVecBytes / 4;
typedef float VF __attribute__((vector_size(kW * 4)));
typedef uint32_t VU __attribute__((vector_size(kW * 4)));
typedef uint16_t VH __attribute__((vector_size(kW * 2)));

template <class T>
VU load_bits(const T* p) {
  if constexpr (sizeof(T) == 2) {
    VH h;
    std::memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, VU) << 16;
  } else {
    VU u;
    std::memcpy(&u, p, sizeof u);
    return u;
  }
}

template <class T>
uint32_t run16(const T* x, int64_t ld, const uint32_t* signs, float c, float* o,
               int64_t ld_out) {
  VF v[16];  // in registers: every loop fully unrolled
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) v[i] = (VF)(load_bits(x + i * ld) ^ signs[i]);
#pragma GCC unroll 4
  for (int h = 1; h < 16; h *= 2) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i & h) continue;
      const VF a = v[i], b = v[i + h];
      v[i] = a + b, v[i + h] = a - b;
    }
  }
  VU m = {};
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    v[i] *= c;
    const VU a = (VU)v[i] & kF32Abs;
    m = a < kF32Inf && a > m ? a : m;
    if (o) std::memcpy(o + i * ld_out, &v[i], sizeof v[i]);
  }
  uint32_t best = 0;
  for (int k = 0; k < kW; ++k) best = m[k] > best ? m[k] : best;
  return best;
}

template <class T>
uint32_t rht_of(const T* x, int64_t ld, int64_t cols, const uint32_t* signs, int32_t n,
                float c, int64_t rows, float* out) {
  const int64_t w_max = kChunkFloats / n > 16 ? kChunkFloats / n : 16;
  alignas(64) float t[kChunkFloats];
  cpu::FlushScope<true> flush;
  uint32_t m = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += n) {
    const T* xr = x + r0 * ld;
    float* o = out ? out + r0 * cols : nullptr;
    int64_t c0 = 0;
    if (kHardwareFlush && n == 16) {
      for (; c0 + kW <= cols; c0 += kW) {
        const uint32_t a = run16(xr + c0, ld, signs, c, o ? o + c0 : nullptr, cols);
        m = a > m ? a : m;
      }
    }
    for (; c0 < cols; c0 += w_max) {
      const int64_t w = cols - c0 < w_max ? cols - c0 : w_max;
      const uint32_t a = run_staged(xr + c0, ld, w, signs, n, c, o ? o + c0 : nullptr, cols, t);
      m = a > m ? a : m;
    }
  }
  return m;
}

}  // namespace

uint32_t rht(const void* x, int32_t dtype, int64_t ld, int64_t cols, const uint32_t* signs,
             int32_t n, float c, int64_t rows, float* out) {
  if (dtype == cpu::kF32) {
    return rht_of(static_cast<const uint32_t*>(x), ld, cols, signs, n, c, rows, out);
  }
  return rht_of(static_cast<const uint16_t*>(x), ld, cols, signs, n, c, rows, out);  // bf16
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax
