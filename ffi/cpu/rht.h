// The random Hadamard transform (RHT) of NVFP4's wgrad operands, in the exact order that
// mxjax/_src/hadamard.py defines: each run of n rows (n a power of two) has its signs
// applied, then log2(n) butterfly stages (h = 1, 2, ..., n / 2: rows i and i + h, i's bit
// h clear, become their sum and difference), then the factor c = f32(1 / sqrt(n)); every
// step in f32, a subnormal result flushed to zero (its sign kept), as XLA's CPU does.
// rht_kernels.cc is compiled once per SIMD level (its function goes into that level's
// BlockKernels table); the handlers are mxjax_rht_quantize (block_ffi.cc) and
// mxjax_rht_amax (amax_ffi.cc).
#ifndef MXJAX_CPU_RHT_H_
#define MXJAX_CPU_RHT_H_

#include <cstdint>

#include "mxjax/codec.h"  // MXJAX_ISA_NS

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// Rows [0, rows) of x (bf16 or f32: cpu::DType dtype; row stride ld, `cols` columns),
// whole runs of n, transformed into out (f32 [rows, cols]) where out is not null; signs:
// n sign masks (0 or 0x80000000). Returns the largest f32 bits of a finite result's
// magnitude (tensor_amax's rule; 0 for none).
uint32_t rht(const void* x, int32_t dtype, int64_t ld, int64_t cols, const uint32_t* signs,
         int32_t n, float c, int64_t rows, float* out);

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CPU_RHT_H_
