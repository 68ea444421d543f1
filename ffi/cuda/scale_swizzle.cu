// The 128x4 scale swizzle (scale_swizzle.h) as a kernel, and as the CUDA-only FFI target
// mxjax_swizzle_scales: scales [..., cols] (e8m0; leading dims are the rows) -> out
// [swizzled_bytes(rows, cols)] of the same dtype. The GEMM calls the kernel directly; the
// target exists so that the layout can be tested (and used by other GEMM backends).
#include "cuda/device.cuh"
#include "cuda/handlers.h"
#include "cuda/scale_swizzle.h"

namespace mxjax::cuda {
namespace {

// One thread per output byte (coalesced stores); padding bytes are 0.
__global__ void swizzle_scales_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t cols,
                                      uint8_t* __restrict__ out) {
  const int64_t total = swizzled_bytes(rows, cols);
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total;
       o += int64_t(gridDim.x) * blockDim.x) {
    int64_t r, c;
    swizzled_position(o, cols, r, c);
    out[o] = (r < rows && c < cols) ? in[r * cols + c] : uint8_t(0);
  }
}

ffi::Error SwizzleScales(cudaStream_t stream, ffi::AnyBuffer scales,
                         ffi::Result<ffi::AnyBuffer> out) {
  auto dims = scales.dimensions();
  if (dims.size() < 1 || ffi::ByteWidth(scales.element_type()) != 1) {
    return ffi::Error::InvalidArgument("mxjax: swizzle_scales needs 1-byte scales of rank >= 1");
  }
  const int64_t cols = dims.back(), rows = cols == 0 ? 0 : scales.element_count() / cols;
  if (out->element_type() != scales.element_type() || out->dimensions().size() != 1 ||
      out->dimensions()[0] != swizzled_bytes(rows, cols)) {
    return ffi::Error::InvalidArgument(
        "mxjax: swizzle_scales output must be 1-D of swizzled_bytes(rows, cols), same dtype");
  }
  if (out->element_count() == 0) return ffi::Error::Success();
  swizzle_scales(static_cast<const uint8_t*>(scales.untyped_data()), rows, cols,
                 static_cast<uint8_t*>(out->untyped_data()), stream);
  return launch_status("swizzle_scales");
}

}  // namespace

void swizzle_scales(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                    cudaStream_t stream) {
  swizzle_scales_kernel<<<grid_for(swizzled_bytes(rows, cols)), kThreads, 0, stream>>>(
      in, rows, cols, out);
}

}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxSwizzleScalesCuda, mxjax::cuda::SwizzleScales,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});
