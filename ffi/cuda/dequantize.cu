// XLA FFI handler (platform "CUDA"): mxjax_dequantize. data [outer, storage(n), inner] and
// scales [outer, ceil(n/B), inner] -> out [outer, n, inner] (bf16 / f16 / f32): each value is
// decode(code) * 2^e rounded once to f32, then to the output type; a 0xFF scale gives NaN.
// The kernels: dequantize_kernels.cuh.
#include "cpu/checks.h"
#include "cuda/handlers.h"
#include "cuda/dequantize_kernels.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error Dequantize(cudaStream_t stream, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                      ffi::Result<ffi::AnyBuffer> out, int32_t format, int64_t block,
                      int64_t axis) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, 0, block); !e.success()) return e;
  if (!high_precision(out->element_type())) {
    return invalid("dequantize produces bf16, f16 or f32 only");
  }
  auto dims = out->dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return invalid("dequantize axis " + std::to_string(axis) + " out of range");
  }
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  FormatInfo info = *format_info(format);
  if (ffi::Error e = check_buffer("data", data, info.storage, dims, axis, info.storage_length(n));
      !e.success()) {
    return e;
  }
  if (ffi::Error e = check_buffer("scales", scales, ffi::DataType::F8E8M0FNU, dims, axis,
                                  cdiv(n, block));
      !e.success()) {
    return e;
  }
  if (out->element_count() == 0) return ffi::Error::Success();
  const auto* d = static_cast<const uint8_t*>(data.untyped_data());
  const auto* s = static_cast<const uint8_t*>(scales.untyped_data());
  dispatch(format, out->element_type(), [&](auto f, auto o) {
    using F = decltype(f);
    using Out = decltype(o);
    launch_dequantize<F, Out>(DequantizeArgs<F, Out>{d, s, outer, n, inner, int(block),
                              static_cast<typename Out::T*>(out->untyped_data())},
                              int(block), stream);
  });
  return launch_status("dequantize");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxDequantizeCuda, mxjax::cuda::Dequantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
