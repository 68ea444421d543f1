// XLA FFI handlers (platform "CUDA"): mxjax_quantize and mxjax_quantize_2x. Same attributes
// and buffers as the CPU handlers (see the team contract): x [outer, n, inner] (bf16 / f16 /
// f32) quantized along n -> data [outer, storage(n), inner] (f8 or packed u8) and scales
// [outer, ceil(n/B), inner] (e8m0 bytes). quantize_2x of x [batch, M, K] is the rows kernel
// along K, then the columns kernel along M: 0.43-0.51 of a copy on an H200, where one kernel
// reading x once for both reached 0.16-0.30 (ffi/cuda/PERF_NOTES.md).
// The kernels: quantize_kernels.cuh.
#include "cpu/checks.h"
#include "cuda/handlers.h"
#include "cuda/quantize_kernels.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error Quantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                    ffi::Result<ffi::AnyBuffer> scales, int32_t format, int32_t mode,
                    int64_t block, int64_t axis) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return e;
  if (!high_precision(x.element_type())) return invalid("quantize needs a bf16, f16 or f32 input");
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return invalid("quantize axis " + std::to_string(axis) + " out of range");
  }
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  FormatInfo info = *format_info(format);
  if (ffi::Error e = check_buffer("data", *data, info.storage, dims, axis, info.storage_length(n));
      !e.success()) {
    return e;
  }
  if (ffi::Error e = check_buffer("scales", *scales, ffi::DataType::F8E8M0FNU, dims, axis,
                                  cdiv(n, block));
      !e.success()) {
    return e;
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  auto* d = static_cast<uint8_t*>(data->untyped_data());
  auto* s = static_cast<uint8_t*>(scales->untyped_data());
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    using T = typename In::T;
    launch_quantize<F, In>(
        QuantizeArgs<In>{static_cast<const T*>(x.untyped_data()), outer, n, inner, mode, d, s},
        int(block), stream);
  });
  return launch_status("quantize");
}

ffi::Error Quantize2x(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> row_data,
                      ffi::Result<ffi::AnyBuffer> row_scales, ffi::Result<ffi::AnyBuffer> col_data,
                      ffi::Result<ffi::AnyBuffer> col_scales, int32_t format, int32_t mode,
                      int64_t block) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  int64_t batch, m, k;
  if (ffi::Error e = check_quantize_2x(x, *row_data, *row_scales, *col_data, *col_scales, format,
                                       mode, block, batch, m, k);
      !e.success()) {
    return e;
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  auto bytes = [](ffi::Result<ffi::AnyBuffer>& b) {
    return static_cast<uint8_t*>(b->untyped_data());
  };
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    const auto* xp = static_cast<const typename In::T*>(x.untyped_data());
    launch_quantize<F, In>(
        QuantizeArgs<In>{xp, batch * m, k, 1, mode, bytes(row_data), bytes(row_scales)},
        int(block), stream);
    launch_quantize<F, In>(
        QuantizeArgs<In>{xp, batch, m, k, mode, bytes(col_data), bytes(col_scales)},
        int(block), stream);
  });
  return launch_status("quantize_2x");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxQuantizeCuda, mxjax::cuda::Quantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxQuantize2xCuda, mxjax::cuda::Quantize2x,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
