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

// Kernels for one SIMD level; each runs work units [begin, end) of its problem.
struct Kernels {
  const char* simd;
  void (*quantize)(const QuantizeProblem&, int64_t begin, int64_t end);
  void (*quantize_2x)(const Quantize2xProblem&, int64_t begin, int64_t end);
  void (*dequantize)(const DequantizeProblem&, int64_t begin, int64_t end);
  void (*fake_quantize)(const FakeQuantizeProblem&, int64_t begin, int64_t end);
};

const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();

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
