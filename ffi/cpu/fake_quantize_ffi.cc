// XLA FFI handler (platform "cpu"): mxjax_fake_quantize, dequantize(quantize(x)) in one pass.
#include <cstdint>
#include <string>

#include "checks.h"
#include "handlers.h"
#include "kernels.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {
namespace {

ffi::Future FakeQuantize(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                         int32_t format, int32_t mode, int64_t block, int64_t axis) {
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return ready_future(e);
  auto dtype = high_precision(x.element_type());
  if (!dtype) return ready_future(invalid("fake_quantize needs a bf16, f16 or f32 input"));
  auto out_dtype = high_precision(out->element_type());
  if (!out_dtype) return ready_future(invalid("fake_quantize produces bf16, f16 or f32 only"));
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return ready_future(invalid("fake_quantize axis " + std::to_string(axis) + " out of range"));
  }
  if (ffi::Error e = check_buffer("out", *out, out->element_type(), dims, axis, dims[axis]);
      !e.success()) {
    return ready_future(e);
  }
  if (x.element_count() == 0) return ready_future();
  FakeQuantizeProblem p{x.untyped_data(), *dtype, format, mode, block, 0, 0, 0,
                        out->untyped_data(), *out_dtype,
                        int64_t(out->size_bytes()) >= kStreamMinBytes};
  view3(dims, axis, p.outer, p.n, p.inner);
  const Kernels& k = kernels();
  int64_t u = units(p);
  return parallel_for(pool, u, p.outer * p.n * p.inner / u,
                      [&k, p](int64_t b, int64_t e) { k.fake_quantize(p, b, e); });
}

}  // namespace
}  // namespace mxjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxFakeQuantizeCpu, mxjax::cpu::FakeQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"));
