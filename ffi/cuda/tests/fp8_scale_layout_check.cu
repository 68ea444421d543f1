// Host check of fp8_block_scales.h (no GPU): what one thread of each relayout kernel of
// gemm_fp8_block.cu reads, run for every output offset, against the layouts written out
// from the cuBLAS docs ("Scaling factors layouts" of the 128-element 1D and 128x128 2D
// block scaling): VEC128_32F keeps the operand's rows contiguous (buffer [L][rows]),
// BLK128x128_32F keeps K-blocks contiguous with columns padded to a multiple of 4
// (buffer [tile rows][roundup(L, 4)]). Built and run by tests/test_fp8_block_gemm.py.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/fp8_block_scales.h"

using namespace mxjax::cuda;

static int failures = 0;

static void fail(const char* what, int64_t rows, int64_t cols, int64_t o) {
  if (++failures <= 20) {
    std::printf("FAIL %s rows=%lld cols=%lld offset=%lld\n", what, (long long)rows,
                (long long)cols, (long long)o);
  }
}

// Compact scales [rows][cols] with distinct values (index + 1; 0 marks padding).
static std::vector<uint32_t> compact(int64_t rows, int64_t cols) {
  std::vector<uint32_t> s(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) s[i] = uint32_t(i + 1);
  return s;
}

static void check_vec128(int64_t rows, int64_t cols) {
  const auto in = compact(rows, cols);
  // The docs' layout: an L x rows matrix (rows index contiguous), one column per K block.
  std::vector<uint32_t> want(rows * cols);
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) want[c * rows + r] = in[r * cols + c];
  }
  if (vec128_elements(rows, cols) != int64_t(want.size())) fail("vec128 size", rows, cols, -1);
  for (int64_t o = 0; o < vec128_elements(rows, cols); ++o) {
    const int64_t s = vec128_source(o, rows, cols);
    if (s < 0 || s >= rows * cols || in[s] != want[o]) fail("vec128 source", rows, cols, o);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (want[vec128_offset(r, c, rows)] != in[r * cols + c]) fail("vec128 offset", rows, cols, r);
    }
  }
}

static void check_blk128(int64_t rows, int64_t cols) {
  const auto in = compact(rows, cols);
  const int64_t l4 = (cols + 3) / 4 * 4;
  std::vector<uint32_t> want(rows * l4, 0);  // tile rows x L4, K blocks contiguous
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < cols; ++c) want[t * l4 + c] = in[t * cols + c];
  }
  if (blk128_elements(rows, cols) != int64_t(want.size())) fail("blk128 size", rows, cols, -1);
  for (int64_t o = 0; o < blk128_elements(rows, cols); ++o) {
    const int64_t s = blk128_source(o, cols);
    const uint32_t got = s < 0 ? 0u : (s < rows * cols ? in[s] : 0xFFFFFFFFu);
    if (got != want[o]) fail("blk128 source", rows, cols, o);
  }
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < cols; ++c) {
      if (want[blk128_offset(t, c, cols)] != in[t * cols + c]) fail("blk128 offset", rows, cols, t);
    }
  }
}

int main() {
  int cases = 0;
  for (int64_t rows : {1, 2, 4, 8, 12, 64, 72, 200}) {
    for (int64_t cols : {1, 2, 3, 4, 5, 7, 8, 9, 64}) {
      check_vec128(rows, cols);
      check_blk128(rows, cols);
      ++cases;
    }
  }
  // Block counts: ceil(K / 128).
  if (fp8_blocks(1) != 1 || fp8_blocks(128) != 1 || fp8_blocks(129) != 2 || fp8_blocks(0) != 0) {
    fail("fp8_blocks", 0, 0, -1);
  }
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("fp8 scale layouts: %d shapes, all passed\n", cases);
  return 0;
}
