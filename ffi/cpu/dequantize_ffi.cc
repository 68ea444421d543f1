// XLA FFI handler (platform "cpu"): mxjax_dequantize.
#include <cstdint>

#include "checks.h"
#include "handlers.h"
#include "kernels.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {
namespace {

ffi::Future Dequantize(ffi::ThreadPool pool, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                       ffi::Result<ffi::AnyBuffer> out, int32_t format, int64_t block,
                       int64_t axis) {
  if (ffi::Error e = check_attrs(format, 0, block); !e.success()) return ready_future(e);
  auto dtype = high_precision(out->element_type());
  if (!dtype) return ready_future(invalid("dequantize produces bf16, f16 or f32 only"));
  auto dims = out->dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return ready_future(invalid("dequantize axis " + std::to_string(axis) + " out of range"));
  }
  FormatInfo info = *format_info(format);
  DequantizeProblem p{static_cast<const uint8_t*>(data.untyped_data()),
                      static_cast<const uint8_t*>(scales.untyped_data()),
                      *dtype, format, block, 0, 0, 0, out->untyped_data(),
                      int64_t(out->size_bytes()) >= kStreamMinBytes};
  view3(dims, axis, p.outer, p.n, p.inner);
  if (ffi::Error e = check_buffer("data", data, info.storage, dims, axis, info.storage_length(p.n));
      !e.success()) {
    return ready_future(e);
  }
  if (ffi::Error e = check_buffer("scales", scales, ffi::DataType::F8E8M0FNU, dims, axis,
                                  ceil_div(p.n, block));
      !e.success()) {
    return ready_future(e);
  }
  if (out->element_count() == 0) return ready_future();
  const Kernels& k = kernels();
  int64_t u = units(p);
  return parallel_for(pool, u, p.outer * p.n * p.inner / u,
                      [&k, p](int64_t b, int64_t e) { k.dequantize(p, b, e); });
}

}  // namespace
}  // namespace mxjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxDequantizeCpu, mxjax::cpu::Dequantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"));
