// The per-tensor amax for one SIMD level (CMake compiles this file once per level, like
// kernels.cc): a max reduction the compiler vectorizes at that level's width. 16-bit
// inputs reduce in 16-bit lanes: a bf16 or f16 magnitude orders as its value (bits as an
// unsigned integer), and only the largest is widened to f32 bits.
#include <cstdint>

#include "amax.h"
#include "kernels.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

// max over n 16-bit values of their magnitude (h & 0x7FFF) where it is below `inf` (the
// format's Inf), else 0. Finite-only as an AND with a mask, not a select: a select
// feeding the max is a conditional reduction, which GCC leaves scalar.
uint16_t amax16(const uint16_t* __restrict h, int64_t n, uint16_t inf) {
  uint16_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t a = uint16_t(h[i] & 0x7FFFu);
    const uint16_t v = a & uint16_t(-uint16_t(a < inf));
    m = v > m ? v : m;
  }
  return m;
}

}  // namespace

uint32_t tensor_amax(const void* x, int32_t dtype, int64_t begin, int64_t end) {
  const int64_t n = end - begin;
  if (n <= 0) return 0;
  if (dtype == cpu::kBF16) {
    return uint32_t(amax16(static_cast<const uint16_t*>(x) + begin, n, 0x7F80u)) << 16;
  }
  if (dtype == cpu::kF16) {
    return f16_to_f32(amax16(static_cast<const uint16_t*>(x) + begin, n, 0x7C00u));
  }
  const uint32_t* __restrict b = static_cast<const uint32_t*>(x) + begin;
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = b[i] & kF32Abs;
    m = umax(m, a & (0u - uint32_t(a < kF32Inf)));  // as in amax16
  }
  return m;
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax
