// XLA FFI handler (platform "CUDA"): mxjax_block_dequantize, with the operands and attributes
// of the CPU handler (ffi/cpu/block_ffi.cc): codes (uint8 or an 8-bit format's float8 type,
// packed along the quantized axis as mxjax_block_quantize writes them), scales,
// tensor_scale (uint32[1]) -> out (f32 of the unpacked shape): code * d (divided by the
// tensor scale where apply_tensor_scale and there is one), NaN where the scale is NaN. The
// kernels: block_dequantize.cuh.
#include "cuda/block_dequantize.cuh"
#include "cuda/block_handlers.h"
#include "cuda/block_launch.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error BlockDequantize(cudaStream_t stream, ffi::AnyBuffer codes, ffi::AnyBuffer scales,
                           ffi::AnyBuffer ts, ffi::Result<ffi::AnyBuffer> out, int32_t format,
                           int32_t scale, int32_t mode, int64_t block_rows, int64_t block_cols,
                           int64_t axis, bool apply_tensor_scale) {
  if (out->element_type() != ffi::DataType::F32) return cpu::invalid("out must be float32");
  BlockView v;
  int64_t packed_axis;
  if (auto e = block_view(out->dimensions(), format, scale, mode, block_rows, block_cols, axis, v,
                          packed_axis);
      !e.success()) {
    return e;
  }
  if (auto e = check_block_codes("codes", codes, out->dimensions(), packed_axis, format);
      !e.success()) {
    return e;
  }
  if (auto e = check_block_scales(scales, v); !e.success()) return e;
  if (auto e = check_tensor_scale(ts); !e.success()) return e;
  if (out->element_count() == 0) return ffi::Error::Success();
  const auto* c = static_cast<const uint8_t*>(codes.untyped_data());
  const auto* t = static_cast<const uint32_t*>(ts.untyped_data());
  auto* o = static_cast<uint32_t*>(out->untyped_data());
  with_format(format, [&](auto f) {
    using F = decltype(f);
    if (v.pack_rows) {
      using K = DequantizeCols<F>;
      const auto a = K::make(v, c, scales.untyped_data(), t, apply_tensor_scale, o);
      dequantize_blocks_kernel<K><<<grid_of(a.regions), K::kThreads, 0, stream>>>(a);
    } else {
      using K = DequantizeRows<F>;
      const auto a = K::make(v, c, scales.untyped_data(), t, apply_tensor_scale, o);
      dequantize_blocks_kernel<K><<<grid_of(a.regions), K::kThreads, 0, stream>>>(a);
    }
  });
  return launch_status("block dequantize");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockDequantizeCuda, mxjax::cuda::BlockDequantize,
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
                                  .Attr<bool>("apply_tensor_scale"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
