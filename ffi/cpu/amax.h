// The per-tensor amax (mxjax_tensor_amax): the largest finite magnitude of a tensor as f32
// bits, the amax of NVFP4's FP32 tensor scale (mxjax/reference.py's tensor_scale).
// amax_kernels.cc is compiled once per SIMD level (its function goes into that level's
// BlockKernels table); amax_ffi.cc is the handler (amax_ffi.h).
#ifndef MXJAX_CPU_AMAX_H_
#define MXJAX_CPU_AMAX_H_

#include <cstdint>

#include "mxjax/codec.h"  // MXJAX_ISA_NS

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// max over elements [begin, end) of x (cpu::DType dtype) of the f32 bits of |x|, over the
// finite ones (NaN / Inf count as 0); 0 for an empty range.
uint32_t tensor_amax(const void* x, int32_t dtype, int64_t begin, int64_t end);

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CPU_AMAX_H_
