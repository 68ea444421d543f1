// E8M0 block scales in the layout Blackwell block-scaled GEMMs read (cuBLASLt
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, the "128x4" tiled layout): a compact
// [rows, cols] scale matrix (rows: M or N, cols: K / 32) is padded with zero bytes to
// [roundup(rows, 128), roundup(cols, 4)] and cut into 128 x 4 tiles; tiles are stored
// row-tile major, each as 512 contiguous bytes in which scale (r, c) of the tile sits at
// (r % 32) * 16 + (r / 32) * 4 + c.
#ifndef MXJAX_CUDA_SCALE_SWIZZLE_H_
#define MXJAX_CUDA_SCALE_SWIZZLE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "mxjax/codec.h"  // MXJAX_HD

namespace mxjax::cuda {

constexpr int64_t kSwizzleRows = 128, kSwizzleCols = 4, kSwizzleTileBytes = 512;

MXJAX_HD int64_t swizzled_rows(int64_t rows) { return (rows + 127) / 128 * 128; }
MXJAX_HD int64_t swizzled_cols(int64_t cols) { return (cols + 3) / 4 * 4; }
MXJAX_HD int64_t swizzled_bytes(int64_t rows, int64_t cols) {
  return swizzled_rows(rows) * swizzled_cols(cols);
}

// Byte offset of scale (r, c) in the swizzled layout of a matrix with `cols` scale columns.
MXJAX_HD int64_t swizzled_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t tile = r / 128 * (swizzled_cols(cols) / 4) + c / 4;
  return tile * kSwizzleTileBytes + (r % 32) * 16 + (r % 128) / 32 * 4 + c % 4;
}

// Inverse of swizzled_offset: the (r, c) stored at byte `offset`.
MXJAX_HD void swizzled_position(int64_t offset, int64_t cols, int64_t& r, int64_t& c) {
  const int64_t tile = offset / kSwizzleTileBytes, w = offset % kSwizzleTileBytes;
  const int64_t col_tiles = swizzled_cols(cols) / 4;
  r = tile / col_tiles * 128 + (w % 16) / 4 * 32 + w / 16;
  c = tile % col_tiles * 4 + w % 4;
}

// Enqueues out[swizzled_bytes(rows, cols)] = swizzle(in[rows, cols]) on `stream`.
void swizzle_scales(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                    cudaStream_t stream);

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_SCALE_SWIZZLE_H_
