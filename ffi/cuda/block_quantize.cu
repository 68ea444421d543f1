// XLA FFI handler (platform "CUDA"): mxjax_block_quantize, with the operands and attributes
// of the CPU handler (ffi/cpu/block_ffi.cc): x (bf16 / f16 / f32), rand (uint32 of x's shape
// under stochastic rounding, else (1,)), tensor_scale (uint32[1], f32 bits, 0: none) ->
// codes (uint8, packed along the quantized axis: 1-D blocks `axis`, 2-D tiles the last;
// 8-bit formats may take their float8 type) and scales (uint8 E8M0 / E4M3 bytes, or uint32
// f32 bits, one per block). Attributes: format, scale, scale_mode, block_rows, block_cols,
// axis, stochastic_rounding.
#include "cuda/block_handlers.h"
#include "cuda/block_launch.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error BlockQuantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer rand,
                         ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> codes,
                         ffi::Result<ffi::AnyBuffer> scales, int32_t format, int32_t scale,
                         int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis,
                         bool stochastic_rounding) {
  if (!cpu::high_precision(x.element_type())) {
    return cpu::invalid("block quantize needs a bf16, f16 or f32 input");
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
  if (auto e = check_block_codes("codes", *codes, x.dimensions(), packed_axis, format);
      !e.success()) {
    return e;
  }
  if (auto e = check_block_scales(*scales, v); !e.success()) return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  const auto* bits = stochastic_rounding ? static_cast<const uint32_t*>(rand.untyped_data())
                                         : nullptr;
  ffi::Error err = ffi::Error::Success();
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    err = launch_block_quantize<F, In, false>(
        stream, v, static_cast<const typename In::T*>(x.untyped_data()), bits,
        static_cast<const uint32_t*>(ts.untyped_data()),
        static_cast<uint8_t*>(codes->untyped_data()), scales->untyped_data(), nullptr);
  });
  if (!err.success()) return err;
  return launch_status("block quantize");
}

}  // namespace

ffi::Error launch_block_quantize_rn(cudaStream_t stream, int32_t format, ffi::DataType dtype,
                                    const BlockView& v, const void* x, const uint32_t* ts,
                                    uint8_t* codes, void* scales) {
  ffi::Error err = ffi::Error::Success();
  dispatch(format, dtype, [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    err = launch_block_quantize<F, In, false, false>(
        stream, v, static_cast<const typename In::T*>(x), nullptr, ts, codes, scales, nullptr);
  });
  return err;
}

}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockQuantizeCuda, mxjax::cuda::BlockQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_rows")
                                  .Attr<int64_t>("block_cols")
                                  .Attr<int64_t>("axis")
                                  .Attr<bool>("stochastic_rounding"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
