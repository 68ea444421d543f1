// XLA FFI handlers (platform "cpu") of the block-scaled formats: mxjax_block_quantize,
// mxjax_block_quantize_2x, mxjax_block_dequantize and mxjax_block_fake_quantize
// (mxjax/_src/ops.py calls them), and mxjax_rht_quantize: block quantize of x's RHT
// (rht.h), with the attribute `signs`. Inputs are bf16 or f32: ops widens f16 to f32 first
// (exact), so the kernels are compiled for two input types.
//
// Attributes: format (element id), scale (ScaleKind), scale_mode, block_rows, block_cols
// ((1, b): 1-D blocks along `axis`; (b, b): 2-D tiles over the last two axes), axis.
// Operands besides the data: `rand`, under stochastic rounding (attribute
// stochastic_rounding) either uint32 bits of x's shape (attribute `strides` empty) or
// uint32[3] (seed0, seed1, base) with `strides` one per dim of x: the kernel makes
// stochastic.py's random_bits of each element's index base + sum_d i_d * strides[d]
// itself; else any uint32 (nearest even); `tensor_scale`, uint32[1] of f32 bits (0: none).
// quantize_2x takes (1, b) blocks with b dividing 512, along the last axis (rows) and the
// one before (columns), with no stochastic rounding. dequantize writes f32, bf16 or f16
// (its result's type; rounded to nearest even from the f32 value).
//
// Codes are packed along the quantized axis (1-D blocks: `axis`; 2-D tiles: the last
// axis) as MX data is: FP4 two per byte, low nibble first; FP6 four in three bytes; FP8
// one per byte; that axis holds ceil(n / group) * group_bytes bytes (padding codes 0).
// Their dtype is uint8 (8-bit formats: or their float8 type). Quantize along a strided
// axis (a dim after it longer than 1) needs blocks of whole groups where there are
// several blocks along it: units write whole bytes.
#include <cstdint>
#include <string>
#include <vector>

#include "checks.h"
#include "handlers.h"
#include "kernels.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {
namespace {

constexpr int32_t kScaleFP32 = 2;  // scale ids from 2 on are f32 bits (uint32)

// Fills p's shape fields from x's dims; an error for bad attributes.
ffi::Error block_view(ffi::AnyBuffer::Dimensions dims, int32_t format, int32_t scale,
                      int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis,
                      BlockProblem& p) {
  if (!format_info(format)) return invalid("unknown format id " + std::to_string(format));
  if (scale < 0 || scale > 3) return invalid("unknown scale format id " + std::to_string(scale));
  if (mode != 0 && mode != 1) return invalid("unknown scale_mode id " + std::to_string(mode));
  if (block_cols < 1 || block_cols > kUnitCols * 64 ||
      (block_rows != 1 && block_rows != block_cols)) {
    return invalid("block must be (1, b) or (b, b) with 1 <= b <= 32768");
  }
  const int64_t rank = dims.size();
  p.format = format, p.scale = scale, p.mode = mode;
  if (block_rows > 1) {
    if (rank < 2) return invalid("2-D blocks need an input of rank >= 2");
    p.batch = 1;
    for (int64_t i = 0; i < rank - 2; ++i) p.batch *= dims[i];
    p.rows = dims[rank - 2], p.cols = dims[rank - 1];
    p.tile_rows = p.tile_cols = block_cols;
    p.pack_rows = false;
    return ffi::Error::Success();
  }
  if (axis < 0 || axis >= rank) return invalid("axis " + std::to_string(axis) + " out of range");
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  p.batch = outer;
  if (inner == 1) {
    p.rows = 1, p.cols = n, p.tile_rows = 1, p.tile_cols = block_cols;
  } else {
    p.rows = n, p.cols = inner, p.tile_rows = block_cols, p.tile_cols = 1;
  }
  p.pack_rows = inner != 1;
  return ffi::Error::Success();
}

// The axis codes are packed along, for x of rank `rank`.
int64_t packed_axis(const BlockProblem& p, int64_t rank, int64_t axis) {
  return p.tile_rows > 1 && p.tile_cols > 1 ? rank - 1 : axis;
}

// `codes` has x's dims (`dims`) with dims[axis] its packed length, and dtype uint8 (or the
// float8 storage type of an 8-bit format).
ffi::Error check_codes(const char* name, const ffi::AnyBuffer& codes,
                       ffi::AnyBuffer::Dimensions dims, int64_t axis, int32_t format) {
  const FormatInfo info = *format_info(format);
  const auto type = codes.element_type();
  if (type != ffi::DataType::U8 && type != info.storage) {
    return invalid(std::string(name) + " must be uint8" +
                   (info.group_codes == 1 ? " (or the format's float8 type)" : ""));
  }
  return check_buffer(name, codes, type, dims, axis, info.storage_length(dims[axis]));
}

int64_t scale_count(const BlockProblem& p) {
  return p.batch * ceil_div(p.rows, p.tile_rows) * ceil_div(p.cols, p.tile_cols);
}

ffi::Error check_scales(const ffi::AnyBuffer& scales, const BlockProblem& p) {
  auto type = p.scale >= kScaleFP32 ? ffi::DataType::U32 : ffi::DataType::U8;
  if (scales.element_type() != type) return invalid("scales have the wrong dtype");
  if (int64_t(scales.element_count()) != scale_count(p)) {
    return invalid("scales have the wrong size");
  }
  return ffi::Error::Success();
}

ffi::Error read_tensor_scale(const ffi::AnyBuffer& ts, BlockProblem& p) {
  if (ts.element_type() != ffi::DataType::U32 || ts.element_count() != 1) {
    return invalid("tensor_scale must be uint32[1] (f32 bits)");
  }
  p.tensor_scale = *static_cast<const uint32_t*>(ts.untyped_data());
  return ffi::Error::Success();
}

// p.counter from rand (uint32[3]: seed0, seed1, base) and the index strides of x's `dims`:
// dims of length 1 dropped, neighbours merged where the index runs on from one to the next.
ffi::Error read_counter(const ffi::AnyBuffer& rand, ffi::AnyBuffer::Dimensions dims,
                        ffi::Span<const int64_t> strides, SRCounter& k) {
  if (rand.element_type() != ffi::DataType::U32 || rand.element_count() != 3 ||
      strides.size() != dims.size()) {
    return invalid("stochastic rounding by index needs rand uint32[3] (seed0, seed1, base) "
                   "and one stride per dim of x");
  }
  const uint32_t* r = static_cast<const uint32_t*>(rand.untyped_data());
  k.seed0 = r[0], k.seed1 = r[1], k.base = r[2], k.rank = 0;
  for (size_t d = 0; d < dims.size(); ++d) {
    const uint32_t stride = uint32_t(strides[d]);  // modulo 2^32
    if (dims[d] == 1) continue;
    if (k.rank && k.strides[k.rank - 1] == uint32_t(dims[d]) * stride) {
      k.dims[k.rank - 1] *= dims[d], k.strides[k.rank - 1] = stride;
      continue;
    }
    if (k.rank == kMaxCounterRank) {
      return invalid("stochastic rounding by index takes at most " +
                     std::to_string(kMaxCounterRank) + " dims that do not merge");
    }
    k.dims[k.rank] = dims[d], k.strides[k.rank] = stride, ++k.rank;
  }
  if (k.rank == 0) k.dims[0] = 1, k.strides[0] = 0, k.rank = 1;
  return ffi::Error::Success();
}

// Fills p's input, view, stochastic rounding (rand and strides: none for quantize_2x) and
// tensor scale for `op` of x; an error for bad ones.
ffi::Error input_view(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer* rand,
                      ffi::Span<const int64_t> strides, const ffi::AnyBuffer& ts,
                      int32_t format, int32_t scale, int32_t mode, int64_t block_rows,
                      int64_t block_cols, int64_t axis, bool stochastic_rounding,
                      BlockProblem& p) {
  auto dtype = high_precision(x.element_type());
  if (!dtype || *dtype == kF16) {  // f16 inputs come widened to f32 (mxjax._src.ops)
    return invalid(std::string(op) + " needs a bf16 or f32 input");
  }
  p.x = x.untyped_data(), p.dtype = *dtype;
  if (auto e = block_view(x.dimensions(), format, scale, mode, block_rows, block_cols, axis, p);
      !e.success()) {
    return e;
  }
  if (rand && stochastic_rounding && strides.size() != 0) {
    if (auto e = read_counter(*rand, x.dimensions(), strides, p.counter); !e.success()) return e;
  } else if (rand && (rand->element_type() != ffi::DataType::U32 ||
                      (stochastic_rounding && rand->element_count() != x.element_count()))) {
    return invalid("rand must be uint32 of x's shape under stochastic rounding");
  } else if (rand && stochastic_rounding) {
    p.rand = static_cast<const uint32_t*>(rand->untyped_data());
  }
  return read_tensor_scale(ts, p);
}

// 1-D blocks along the last axis, each row whole tiles and packing groups: the rows end to
// end as one (units as wide as any, however short the rows).
void join_rows(BlockProblem& p) {
  if (p.tile_rows == 1 && p.rows == 1 && !p.pack_rows && p.cols % p.tile_cols == 0 &&
      p.cols % format_info(p.format)->group_codes == 0) {
    p.cols *= p.batch, p.batch = 1;
  }
}

// Points `codes` (packed along `axis` of x's dims) and `scales` at the outputs, or an error
// (also where units would share bytes of codes packed along the rows).
ffi::Error output_view(ffi::Result<ffi::AnyBuffer>& codes, ffi::Result<ffi::AnyBuffer>& scales,
                       ffi::AnyBuffer::Dimensions dims, int64_t axis, BlockProblem& p) {
  if (auto e = check_codes("codes", *codes, dims, axis, p.format); !e.success()) return e;
  const int group = format_info(p.format)->group_codes;
  if (p.pack_rows && p.tile_rows % group != 0 && p.rows > p.tile_rows) {
    return invalid("quantize along a strided axis packs " + std::to_string(group) +
                   " codes per group: blocks along it must hold whole groups");
  }
  if (auto e = check_scales(*scales, p); !e.success()) return e;
  p.codes = static_cast<uint8_t*>(codes->untyped_data());
  p.scales = scales->untyped_data();
  return ffi::Error::Success();
}

// Runs p's units in chunks, the chunks handed out last units first where `reversed`: a
// quantize follows the tensor amax's pass over x in order, whose end is the part of x
// still in the last-level cache.
template <class Run>
ffi::Future run_units(ffi::ThreadPool& pool, const BlockProblem& p, Run run,
                      bool reversed = false) {
  const int64_t u = units(p);
  if (u == 0) return ready_future();
  if (!reversed) return parallel_for(pool, u, p.batch * p.rows * p.cols / u, run);
  return parallel_for(pool, u, p.batch * p.rows * p.cols / u,
                      [u, run](int64_t b, int64_t e) { run(u - e, u - b); });
}

ffi::Future BlockQuantize(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer rand,
                          ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> codes,
                          ffi::Result<ffi::AnyBuffer> scales, int32_t format, int32_t scale,
                          int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis,
                          bool stochastic_rounding, ffi::Span<const int64_t> strides) {
  BlockProblem p{};
  if (auto e = input_view("block quantize", x, &rand, strides, ts, format, scale, mode,
                          block_rows, block_cols, axis, stochastic_rounding, p);
      !e.success()) {
    return ready_future(e);
  }
  if (auto e = output_view(codes, scales, x.dimensions(),
                           packed_axis(p, x.dimensions().size(), axis), p);
      !e.success()) {
    return ready_future(e);
  }
  join_rows(p);
  p.stream = int64_t(x.size_bytes()) >= kStreamMinBytes;
  const BlockKernels& k = *kernels().block;
  return run_units(pool, p, [&k, p](int64_t b, int64_t e) { k.quantize(p, b, e); },
                   p.tensor_scale != 0);
}

// quantize of the RHT of x along `axis` (rht.h; 1-D blocks of whole runs, the axis a whole
// number of runs and not the last): each band of a tile row is transformed into an f32
// buffer and quantized from there, so x is read once and no f32 copy of it is written.
ffi::Future RhtQuantize(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer rand,
                        ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> codes,
                        ffi::Result<ffi::AnyBuffer> scales, int32_t format, int32_t scale,
                        int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis,
                        bool stochastic_rounding, ffi::Span<const float> signs,
                        ffi::Span<const int64_t> strides) {
  BlockProblem p{};
  if (auto e = input_view("rht quantize", x, &rand, strides, ts, format, scale, mode,
                          block_rows, block_cols, axis, stochastic_rounding, p);
      !e.success()) {
    return ready_future(e);
  }
  std::vector<uint32_t> masks;
  float c;
  if (auto e = rht_signs(signs, masks, c); !e.success()) return ready_future(e);
  const int64_t n = int64_t(masks.size());
  if (block_rows != 1 || block_cols % n != 0 || !p.pack_rows || p.rows % n != 0) {
    return ready_future(invalid(
        "rht quantize takes 1-D blocks of whole runs along an axis of whole runs, with a "
        "dimension longer than 1 after it"));
  }
  if (auto e = output_view(codes, scales, x.dimensions(), axis, p); !e.success()) {
    return ready_future(e);
  }
  const FormatInfo info = *format_info(format);
  if (p.tile_rows % info.group_codes != 0) {
    return ready_future(invalid("rht quantize needs blocks of whole packing groups"));
  }
  const int64_t nr = ceil_div(p.rows, p.tile_rows), bands = p.batch * nr;
  const int64_t in_bytes = dtype_bytes(p.dtype);
  const int64_t scale_bytes = p.scale >= kScaleFP32 ? 4 : 1;
  const BlockKernels& k = *kernels().block;
  return parallel_for(pool, bands, p.tile_rows * p.cols,
                      [&k, p, masks, c, nr, info, in_bytes, scale_bytes](int64_t b, int64_t e) {
    std::vector<float> rows(p.tile_rows * p.cols);
    for (int64_t u = b; u < e; ++u) {
      const int64_t bi = u / nr, r0 = u % nr * p.tile_rows;
      const int64_t height = p.rows - r0 < p.tile_rows ? p.rows - r0 : p.tile_rows;
      k.rht(static_cast<const char*>(p.x) + (bi * p.rows + r0) * p.cols * in_bytes, p.dtype,
            p.cols, p.cols, masks.data(), int32_t(masks.size()), c, height, rows.data());
      BlockProblem band = p;  // one tile row of f32 rows (the last one may be short)
      band.x = rows.data(), band.dtype = kF32, band.batch = 1, band.rows = height;
      band.stream = false;
      band.codes = p.codes + (bi * ceil_div(p.rows, info.group_codes) + r0 / info.group_codes) *
                                 info.group_bytes * p.cols;
      band.scales = static_cast<char*>(p.scales) + u * p.cols * scale_bytes;
      band.rand = p.rand ? p.rand + (bi * p.rows + r0) * p.cols : nullptr;
      band.counter_first = (bi * p.rows + r0) * p.cols;
      k.quantize(band, 0, units(band));
    }
  });
}

ffi::Future BlockQuantize2x(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer ts,
                            ffi::Result<ffi::AnyBuffer> row_codes,
                            ffi::Result<ffi::AnyBuffer> row_scales,
                            ffi::Result<ffi::AnyBuffer> col_codes,
                            ffi::Result<ffi::AnyBuffer> col_scales, int32_t format, int32_t scale,
                            int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis) {
  auto dims = x.dimensions();
  const int64_t rank = dims.size();
  if (rank < 2) return ready_future(invalid("block quantize_2x needs an input of rank >= 2"));
  if (block_rows != 1 || kUnitCols % block_cols != 0) {
    return ready_future(invalid("block quantize_2x takes 1-D blocks of a size dividing 512"));
  }
  BlockPair pair{};
  BlockProblem& row = pair.row;
  if (auto e = input_view("block quantize_2x", x, nullptr, {}, ts, format, scale, mode, 1,
                          block_cols, rank - 1, false, row);
      !e.success()) {
    return ready_future(e);
  }
  row.batch = 1;  // [batch, m, k] in 1 x b tiles
  for (int64_t i = 0; i < rank - 2; ++i) row.batch *= dims[i];
  row.rows = dims[rank - 2];
  row.stream = int64_t(x.size_bytes()) >= kStreamMinBytes;
  BlockProblem& col = pair.col;
  col = row;
  col.tile_rows = block_cols, col.tile_cols = 1, col.pack_rows = true;
  if (auto e = output_view(row_codes, row_scales, dims, rank - 1, row); !e.success()) {
    return ready_future(e);
  }
  if (auto e = output_view(col_codes, col_scales, dims, rank - 2, col); !e.success()) {
    return ready_future(e);
  }
  const BlockKernels& k = *kernels().block;
  const int64_t u = units(col);
  if (u == 0) return ready_future();
  const bool reversed = row.tensor_scale != 0;  // as in run_units
  return parallel_for(pool, u, 2 * col.batch * col.rows * col.cols / u,
                      [&k, pair, u, reversed](int64_t b, int64_t e) {
                        reversed ? k.quantize_2x(pair, u - e, u - b) : k.quantize_2x(pair, b, e);
                      });
}

ffi::Future BlockFakeQuantize(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer rand,
                              ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> out, int32_t format,
                              int32_t scale, int32_t mode, int64_t block_rows, int64_t block_cols,
                              int64_t axis, bool stochastic_rounding,
                              ffi::Span<const int64_t> strides) {
  BlockProblem p{};
  if (auto e = input_view("block fake_quantize", x, &rand, strides, ts, format, scale, mode,
                          block_rows, block_cols, axis, stochastic_rounding, p);
      !e.success()) {
    return ready_future(e);
  }
  if (out->element_type() != ffi::DataType::F32 || out->element_count() != x.element_count()) {
    return ready_future(invalid("out must be float32 of x's shape"));
  }
  join_rows(p);
  p.out = static_cast<float*>(out->untyped_data());
  const BlockKernels& k = *kernels().block;
  return run_units(pool, p, [&k, p](int64_t b, int64_t e) { k.fake_quantize(p, b, e); },
                   p.tensor_scale != 0);
}

ffi::Future BlockDequantize(ffi::ThreadPool pool, ffi::AnyBuffer codes, ffi::AnyBuffer scales,
                            ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> out, int32_t format,
                            int32_t scale, int32_t mode, int64_t block_rows, int64_t block_cols,
                            int64_t axis, bool apply_tensor_scale) {
  BlockProblem p{};
  auto out_dtype = high_precision(out->element_type());
  if (!out_dtype) return ready_future(invalid("out must be float32, bfloat16 or float16"));
  auto dims = out->dimensions();  // x's
  if (auto e = block_view(dims, format, scale, mode, block_rows, block_cols, axis, p);
      !e.success()) {
    return ready_future(e);
  }
  if (auto e = check_codes("codes", codes, dims, packed_axis(p, dims.size(), axis), format);
      !e.success()) {
    return ready_future(e);
  }
  if (auto e = check_scales(scales, p); !e.success()) return ready_future(e);
  if (auto e = read_tensor_scale(ts, p); !e.success()) return ready_future(e);
  p.in_codes = static_cast<const uint8_t*>(codes.untyped_data());
  p.in_scales = scales.untyped_data();
  p.apply_tensor_scale = apply_tensor_scale;
  p.out_dtype = *out_dtype;
  if (p.out_dtype == kF32) {
    p.out = static_cast<float*>(out->untyped_data());
  } else {
    p.out16 = static_cast<uint16_t*>(out->untyped_data());
  }
  const BlockKernels& k = *kernels().block;
  return run_units(pool, p, [&k, p](int64_t b, int64_t e) { k.dequantize(p, b, e); });
}

}  // namespace
}  // namespace mxjax::cpu

#define MXJAX_BLOCK_ATTRS                  \
  .Attr<int32_t>("format")                 \
      .Attr<int32_t>("scale")              \
      .Attr<int32_t>("scale_mode")         \
      .Attr<int64_t>("block_rows")         \
      .Attr<int64_t>("block_cols")         \
      .Attr<int64_t>("axis")

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockQuantizeCpu, mxjax::cpu::BlockQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>() MXJAX_BLOCK_ATTRS
                                  .Attr<bool>("stochastic_rounding")
                                  .Attr<xla::ffi::Span<const int64_t>>("strides"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxRhtQuantizeCpu, mxjax::cpu::RhtQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>() MXJAX_BLOCK_ATTRS
                                  .Attr<bool>("stochastic_rounding")
                                  .Attr<xla::ffi::Span<const float>>("signs")
                                  .Attr<xla::ffi::Span<const int64_t>>("strides"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockQuantize2xCpu, mxjax::cpu::BlockQuantize2x,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>() MXJAX_BLOCK_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockFakeQuantizeCpu, mxjax::cpu::BlockFakeQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>() MXJAX_BLOCK_ATTRS
                                  .Attr<bool>("stochastic_rounding")
                                  .Attr<xla::ffi::Span<const int64_t>>("strides"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockDequantizeCpu, mxjax::cpu::BlockDequantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>() MXJAX_BLOCK_ATTRS
                                  .Attr<bool>("apply_tensor_scale"));
