// Stochastic rounding's random bits for one SIMD level (CMake compiles this file once per
// level, like kernels.cc): an integer hash the compiler vectorizes at that level's width.
#include <cstdint>

#include "random_bits.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

inline uint32_t mix(uint32_t h) {  // lowbias32, as stochastic.py's _mix
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  return h ^ (h >> 16);
}

}  // namespace

void random_bits(uint32_t seed0, uint32_t seed1, uint32_t first, uint32_t step, int64_t n,
                 uint32_t* __restrict out) {
  // (first + j * step) * golden as a running sum (modulo 2^32): an add an element, where a
  // multiply of the index would take two.
  uint32_t h = first * 0x9E3779B9u;
  const uint32_t dh = step * 0x9E3779B9u;
  for (int64_t j = 0; j < n; ++j, h += dh) out[j] = mix(mix(h ^ seed0) ^ seed1);
}

void random_bits_of(uint32_t seed0, uint32_t seed1, int64_t n, uint32_t* __restrict bits) {
  for (int64_t j = 0; j < n; ++j) bits[j] = mix(mix(bits[j] * 0x9E3779B9u ^ seed0) ^ seed1);
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax
