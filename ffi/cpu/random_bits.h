// Stochastic rounding's random bits: a hash of each element's global index, as
// mxjax/_src/stochastic.py defines them, made by the block kernels as they round (from a
// counter: block_kernels.cc's sr_bits). random_bits_kernels.cc is compiled once per SIMD
// level.
#ifndef MXJAX_CPU_RANDOM_BITS_H_
#define MXJAX_CPU_RANDOM_BITS_H_

#include <cstdint>

#include "mxjax/codec.h"  // MXJAX_ISA_NS

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// out[j] = mix(mix((first + j * step) * 0x9E3779B9 ^ seed0) ^ seed1) for j in [0, n), all
// arithmetic modulo 2^32; mix is lowbias32 (xor-shift-multiply).
void random_bits(uint32_t seed0, uint32_t seed1, uint32_t first, uint32_t step, int64_t n,
                 uint32_t* out);

// bits[j] = the bits of index bits[j] (as random_bits's), in place, for j in [0, n): for
// indices that runs of a few elements each make.
void random_bits_of(uint32_t seed0, uint32_t seed1, int64_t n, uint32_t* bits);

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CPU_RANDOM_BITS_H_
