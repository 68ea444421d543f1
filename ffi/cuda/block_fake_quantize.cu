// XLA FFI handler (platform "CUDA"): mxjax_block_fake_quantize, with the operands and
// attributes of the CPU handler (ffi/cpu/block_ffi.cc): x, rand, tensor_scale as for
// mxjax_block_quantize -> out (f32 of x's shape): dequantize(quantize(x)) without the tensor
// scale applied, the codes never reaching memory.
#include "cuda/block_handlers.h"
#include "cuda/block_launch.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error BlockFakeQuantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer rand,
                             ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> out, int32_t format,
                             int32_t scale, int32_t mode, int64_t block_rows, int64_t block_cols,
                             int64_t axis, bool stochastic_rounding) {
  if (!cpu::high_precision(x.element_type())) {
    return cpu::invalid("block fake_quantize needs a bf16, f16 or f32 input");
  }
  BlockView v;
  int64_t packed_axis;
  if (auto e = block_view(x.dimensions(), format, scale, mode, block_rows, block_cols, axis, v,
                          packed_axis);
      !e.success()) {
    return e;
  }
  if (rand.element_type() != ffi::DataType::U32 ||
      (stochastic_rounding && rand.element_count() != x.element_count())) {
    return cpu::invalid("rand must be uint32 of x's shape under stochastic rounding");
  }
  if (auto e = check_tensor_scale(ts); !e.success()) return e;
  if (out->element_type() != ffi::DataType::F32 || out->element_count() != x.element_count()) {
    return cpu::invalid("out must be float32 of x's shape");
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  const auto* bits = stochastic_rounding ? static_cast<const uint32_t*>(rand.untyped_data())
                                         : nullptr;
  ffi::Error err = ffi::Error::Success();
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    err = launch_block_quantize<F, In, true>(
        stream, v, static_cast<const typename In::T*>(x.untyped_data()), bits,
        static_cast<const uint32_t*>(ts.untyped_data()), nullptr, nullptr,
        static_cast<uint32_t*>(out->untyped_data()));
  });
  if (!err.success()) return err;
  return launch_status("block fake_quantize");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockFakeQuantizeCuda, mxjax::cuda::BlockFakeQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_rows")
                                  .Attr<int64_t>("block_cols")
                                  .Attr<int64_t>("axis")
                                  .Attr<bool>("stochastic_rounding"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
