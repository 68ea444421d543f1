// XLA FFI handlers (platform "cpu"): mxjax_quantize and mxjax_quantize_2x.
#include <cstdint>

#include "checks.h"
#include "handlers.h"
#include "kernels.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {
namespace {

ffi::Future Quantize(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                     ffi::Result<ffi::AnyBuffer> scales, int32_t format, int32_t mode,
                     int64_t block, int64_t axis) {
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return ready_future(e);
  auto dtype = high_precision(x.element_type());
  if (!dtype) return ready_future(invalid("quantize needs a bf16, f16 or f32 input"));
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return ready_future(invalid("quantize axis " + std::to_string(axis) + " out of range"));
  }
  FormatInfo info = *format_info(format);
  QuantizeProblem p{x.untyped_data(), *dtype, format, mode, block, 0, 0, 0,
                    static_cast<uint8_t*>(data->untyped_data()),
                    static_cast<uint8_t*>(scales->untyped_data()),
                    int64_t(x.size_bytes()) >= kStreamMinBytes};
  view3(dims, axis, p.outer, p.n, p.inner);
  if (ffi::Error e = check_buffer("data", *data, info.storage, dims, axis, info.storage_length(p.n));
      !e.success()) {
    return ready_future(e);
  }
  if (ffi::Error e = check_buffer("scales", *scales, ffi::DataType::F8E8M0FNU, dims, axis,
                                  ceil_div(p.n, block));
      !e.success()) {
    return ready_future(e);
  }
  if (x.element_count() == 0) return ready_future();
  const Kernels& k = kernels();
  int64_t u = units(p);
  return parallel_for(pool, u, p.outer * p.n * p.inner / u,
                      [&k, p](int64_t b, int64_t e) { k.quantize(p, b, e); });
}

ffi::Future Quantize2x(ffi::ThreadPool pool, ffi::AnyBuffer x,
                       ffi::Result<ffi::AnyBuffer> row_data, ffi::Result<ffi::AnyBuffer> row_scales,
                       ffi::Result<ffi::AnyBuffer> col_data, ffi::Result<ffi::AnyBuffer> col_scales,
                       int32_t format, int32_t mode, int64_t block) {
  int64_t batch, m, k;
  if (ffi::Error e = check_quantize_2x(x, *row_data, *row_scales, *col_data, *col_scales, format,
                                       mode, block, batch, m, k);
      !e.success()) {
    return ready_future(e);
  }
  auto dtype = high_precision(x.element_type());
  if (x.element_count() == 0) return ready_future();
  Quantize2xProblem p{x.untyped_data(), *dtype, format, mode, block, batch, m, k,
                      static_cast<uint8_t*>(row_data->untyped_data()),
                      static_cast<uint8_t*>(row_scales->untyped_data()),
                      static_cast<uint8_t*>(col_data->untyped_data()),
                      static_cast<uint8_t*>(col_scales->untyped_data()),
                      int64_t(x.size_bytes()) >= kStreamMinBytes};
  const Kernels& kern = kernels();
  int64_t u = units(p);
  return parallel_for(pool, u, batch * m * k / u,
                      [&kern, p](int64_t b, int64_t e) { kern.quantize_2x(p, b, e); });
}

}  // namespace
}  // namespace mxjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxQuantizeCpu, mxjax::cpu::Quantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxQuantize2xCpu, mxjax::cpu::Quantize2x,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size"));
