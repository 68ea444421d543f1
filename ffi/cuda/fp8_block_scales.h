// FP32 block scales of FP8 GEMM operands: mxjax's compact layout and the layouts cuBLASLt's
// Hopper block-scaled FP8 GEMM reads (cuBLAS docs, cuBLASLt "128-element 1D and 128x128
// 2D Block Scaling For FP8 Data Types", section "Scaling factors layouts").
//
// An operand X [rows, K] (rows: M or N; K contiguous) quantized along K has L = ceil(K/128)
// block columns. mxjax stores its f32 decode scales compactly, row-major:
//   1x128 blocks    s[rows, L]          s(r, c) covers X[r, 128c : 128c + 128]
//   128x128 tiles   s[ceil(rows/128), L] s(t, c) covers X[128t : 128t + 128, 128c : ...]
// cuBLASLt wants (its operand's outer dimension M or N playing "rows"):
//   VEC128_32F      "M-major" (N-major for B): the rows index is contiguous, shape rows x L:
//                   s(r, c) at c * rows + r. Needs rows % 4 == 0 (16-byte aligned columns).
//   BLK128x128_32F  "K-major, stride between consecutive columns a multiple of 4": shape
//                   L4 x ceil(rows/128) with L4 = roundup(L, 4): s(t, c) at t * L4 + c;
//                   entries c >= L are padding (never read for the product; mxjax writes 0).
// Both need 16-byte aligned start addresses. So VEC128 is the transpose of the compact
// layout (identical when L == 1) and BLK128x128 is the compact layout with rows padded to
// a multiple of 4 (identical when L % 4 == 0). TransformerEngine's Float8BlockQuantizer
// writes the same shapes ([L, roundup(rows, 4)] for 1x128, [ceil(rows/128), L4] for 128x128).
#ifndef MXJAX_CUDA_FP8_BLOCK_SCALES_H_
#define MXJAX_CUDA_FP8_BLOCK_SCALES_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "mxjax/codec.h"  // MXJAX_HD

namespace mxjax::cuda {

constexpr int64_t kFp8Block = 128;  // elements per block along K (and rows of a 2-D tile)

MXJAX_HD int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }
MXJAX_HD int64_t blk128_ld(int64_t cols) { return (cols + 3) / 4 * 4; }

// Offsets of compact scale (r, c) of a [rows, cols] scale matrix in cuBLASLt's layouts.
MXJAX_HD int64_t vec128_offset(int64_t r, int64_t c, int64_t rows) { return c * rows + r; }
MXJAX_HD int64_t blk128_offset(int64_t r, int64_t c, int64_t cols) {
  return r * blk128_ld(cols) + c;
}

// Elements of the cuBLASLt scale buffers.
MXJAX_HD int64_t vec128_elements(int64_t rows, int64_t cols) { return rows * cols; }
MXJAX_HD int64_t blk128_elements(int64_t rows, int64_t cols) { return rows * blk128_ld(cols); }

// The compact index (r * cols + c) stored at offset o of the cuBLASLt buffer, or -1 for
// padding: what one thread of the relayout kernels reads.
MXJAX_HD int64_t vec128_source(int64_t o, int64_t rows, int64_t cols) {
  return o % rows * cols + o / rows;
}
MXJAX_HD int64_t blk128_source(int64_t o, int64_t cols) {
  const int64_t r = o / blk128_ld(cols), c = o % blk128_ld(cols);
  return c < cols ? r * cols + c : -1;
}

// Enqueue out = cuBLASLt layout of the compact in[rows, cols] on `stream` (f32 values
// moved as 32-bit words). For VEC128 rows is M or N; for BLK128x128 it is the tile rows.
void relayout_vec128(const uint32_t* in, int64_t rows, int64_t cols, uint32_t* out,
                     cudaStream_t stream);
void relayout_blk128(const uint32_t* in, int64_t rows, int64_t cols, uint32_t* out,
                     cudaStream_t stream);

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_FP8_BLOCK_SCALES_H_
