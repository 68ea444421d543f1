// CPU kernel entry points: plain problem descriptions split into work units, and a table
// of kernels compiled once per SIMD level (kernels.cc) with runtime dispatch (dispatch.cc).
#ifndef MXJAX_CPU_KERNELS_H_
#define MXJAX_CPU_KERNELS_H_

#include <cstdint>

namespace mxjax::cpu {

enum DType : int32_t { kBF16 = 0, kF16 = 1, kF32 = 2 };

inline int64_t dtype_bytes(int32_t dtype) { return dtype == kF32 ? 4 : 2; }

// Columns of one work unit along a strided quantized axis (a multiple of every block).
constexpr int64_t kUnitCols = 512;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes in a vector register at the SIMD level this file is compiled for (the kernels'
// GCC vector extensions are lowered to it).
#if defined(__AVX512BW__)
constexpr int kVecBytes = 64;
#elif defined(__AVX2__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

// Inputs of at least this many bytes get their outputs written with streaming stores
// (stream.h): larger than the last-level cache, so the outputs would be evicted before
// their consumer runs anyway, and the stores would pay a read of each line.
constexpr int64_t kStreamMinBytes = int64_t{32} << 20;

// x viewed as [outer, n, inner], quantized along n. Work units: with inner == 1 one block
// of one row each; otherwise one (outer, block row, kUnitCols columns) tile each.
struct QuantizeProblem {
  const void* x;
  int32_t dtype, format, mode;
  int64_t block, outer, n, inner;
  uint8_t* data;    // [outer, storage(n), inner]
  uint8_t* scales;  // [outer, ceil(n / block), inner]
  bool stream;      // write data and scales with streaming stores where they are aligned
};

// x viewed as [batch, m, k]: rowwise along k and columnwise along m in one pass. Work
// units: one (batch, block row, kUnitCols columns) tile each.
struct Quantize2xProblem {
  const void* x;
  int32_t dtype, format, mode;
  int64_t block, batch, m, k;
  uint8_t* row_data;    // [batch, m, storage(k)]
  uint8_t* row_scales;  // [batch, m, ceil(k / block)]
  uint8_t* col_data;    // [batch, storage(m), k]
  uint8_t* col_scales;  // [batch, ceil(m / block), k]
  bool stream;          // as in QuantizeProblem
};

// out viewed as [outer, n, inner]; units as for QuantizeProblem.
struct DequantizeProblem {
  const uint8_t* data;
  const uint8_t* scales;
  int32_t dtype, format;
  int64_t block, outer, n, inner;
  void* out;
  bool stream;  // write out with streaming stores where whole aligned lines allow
};

// x viewed as [outer, n, inner] -> out (same shape, out_dtype): the values of
// dequantize(quantize(x along n)) without the MX data reaching memory. Units as for
// QuantizeProblem.
struct FakeQuantizeProblem {
  const void* x;
  int32_t dtype, format, mode;
  int64_t block, outer, n, inner;
  void* out;
  int32_t out_dtype;
  bool stream;  // as in DequantizeProblem
};

// Stochastic rounding's bits made inside a block kernel (no array of them): those of
// stochastic.py's random_bits for each element's global index, base + sum_d i_d *
// strides[d] (modulo 2^32) over x's dims (merged where they are contiguous in the index).
constexpr int kMaxCounterRank = 8;
struct SRCounter {
  uint32_t seed0, seed1, base;
  int32_t rank;  // 0: no counter
  int64_t dims[kMaxCounterRank];
  uint32_t strides[kMaxCounterRank];
};

// A block-scaled format (mxjax/block_format.py; ids of ffi/include/mxjax/block_codec.h):
// x viewed as [batch, rows, cols] in tiles of tile_rows x tile_cols. 1-D blocks of b along
// the last axis are [outer, 1, n] in 1 x b tiles; along a strided axis [outer, n, inner] in
// b x 1 tiles; 2-D blocks [..., R, C] in b x b tiles. Work units: one (batch, tile row,
// run of whole tiles about kUnitCols columns wide) each.
//
// Codes are packed along the quantized axis as MX data is (FP4 two per byte, low nibble
// first; FP6 four in three bytes, code i at bit 6i of the little-endian group; FP8 one per
// byte; padding codes 0): along the rows where pack_rows (1-D blocks along a strided axis:
// [batch, storage(rows), cols]), else along the columns ([batch, rows, storage(cols)]).
// A unit's first column (and, where pack_rows, its first row, unless one tile row covers
// all rows) starts a packing group, so units never share a byte.
struct BlockProblem {
  int32_t format, scale, mode;
  int64_t tile_rows, tile_cols, batch, rows, cols;
  bool pack_rows;         // codes packed along the rows (else along the columns)
  bool stream;            // quantize: codes with streaming stores where a path can
  uint32_t tensor_scale;  // f32 bits of the FP32 tensor scale; 0 where there is none
  const void* x;          // quantize / fake_quantize: bf16, f16 or f32 (dtype)
  int32_t dtype;
  const uint32_t* rand;   // stochastic-rounding bits of x's shape, or nullptr
  SRCounter counter;      // or stochastic rounding's bits made by the kernel (rank > 0);
                          // neither: nearest even
  int64_t counter_first;  // the counter's row-major index of element 0 (an RHT band's)
  uint8_t* codes;         // quantize: packed codes (see above)
  void* scales;           // quantize: [batch, ceil(rows/tr), ceil(cols/tc)], u8 or f32 bits
  const uint8_t* in_codes;  // dequantize: as codes
  const void* in_scales;    // dequantize: as scales
  bool apply_tensor_scale;  // dequantize: divide by the tensor scale
  float* out;               // dequantize / fake_quantize (no tensor scale applied): f32
  int32_t out_dtype = kF32;  // dequantize: out's (f32) or out16's (bf16, f16; RNE) type
  uint16_t* out16;
};

// Columns of a BlockProblem's work unit: whole tiles, about kUnitCols, a multiple of 4 (so
// of every packing group); at most kUnitCols tiles.
inline int64_t unit_cols(const BlockProblem& p) {
  int64_t tiles = p.tile_cols < kUnitCols ? kUnitCols / p.tile_cols : 1;
  while (p.tile_cols * tiles % 4 != 0) ++tiles;
  return p.tile_cols * tiles;
}
inline int64_t units(const BlockProblem& p) {
  return p.batch * ceil_div(p.rows, p.tile_rows) * ceil_div(p.cols, unit_cols(p));
}

inline int64_t units(int64_t block, int64_t outer, int64_t n, int64_t inner) {
  int64_t nb = ceil_div(n, block);
  return inner == 1 ? outer * nb : outer * nb * ceil_div(inner, kUnitCols);
}
inline int64_t units(const QuantizeProblem& p) { return units(p.block, p.outer, p.n, p.inner); }
inline int64_t units(const DequantizeProblem& p) { return units(p.block, p.outer, p.n, p.inner); }
inline int64_t units(const FakeQuantizeProblem& p) {
  return units(p.block, p.outer, p.n, p.inner);
}
inline int64_t units(const Quantize2xProblem& p) {
  return p.batch * ceil_div(p.m, p.block) * ceil_div(p.k, kUnitCols);
}

// Rowwise (1 x b tiles) and columnwise (b x 1) quantizations of one [batch, m, k] input
// (the same x, dtype, format, scale, tensor scale; no stochastic rounding), with equal
// unit_cols. Work units: col's.
struct BlockPair {
  BlockProblem row, col;
};

// The block-scaled kernels of one SIMD level (block_kernels.cc).
struct BlockKernels {
  void (*quantize)(const BlockProblem&, int64_t begin, int64_t end);
  void (*dequantize)(const BlockProblem&, int64_t begin, int64_t end);
  void (*fake_quantize)(const BlockProblem&, int64_t begin, int64_t end);
  void (*quantize_2x)(const BlockPair&, int64_t begin, int64_t end);
  // max over elements [begin, end) of x (dtype) of the f32 bits of |x| over finite ones
  // (amax_kernels.cc; NaN / Inf count as 0; 0 for an empty range)
  uint32_t (*tensor_amax)(const void* x, int32_t dtype, int64_t begin, int64_t end);
  // the RHT of whole runs of n rows of x (bf16 or f32) into f32 rows, and their amax
  // (rht_kernels.cc, rht.h)
  uint32_t (*rht)(const void* x, int32_t dtype, int64_t ld, int64_t cols, const uint32_t* signs,
              int32_t n, float c, int64_t rows, float* out);
};

// Kernels for one SIMD level; each runs work units [begin, end) of its problem.
struct Kernels {
  const char* simd;
  void (*quantize)(const QuantizeProblem&, int64_t begin, int64_t end);
  void (*quantize_2x)(const Quantize2xProblem&, int64_t begin, int64_t end);
  void (*dequantize)(const DequantizeProblem&, int64_t begin, int64_t end);
  void (*fake_quantize)(const FakeQuantizeProblem&, int64_t begin, int64_t end);
  const BlockKernels* block;
};

const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const BlockKernels& block_kernels_scalar();
const BlockKernels& block_kernels_avx2();
const BlockKernels& block_kernels_avx512();

// The level in use: the best this CPU runs (MXJAX_SIMD=scalar|avx2|avx512 caps it) until
// set_simd() picks another.
const Kernels& kernels();

// Writes the names of the levels this build and CPU run under the MXJAX_SIMD cap (at most
// 3, narrowest first) to levels; returns how many.
int runnable_simd(const char** levels);

// Makes the named level the one in use for the calls that start after it; false (and no
// change) where the level is not runnable. Calls already dispatched may run at either level.
bool set_simd(const char* name);

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_KERNELS_H_
