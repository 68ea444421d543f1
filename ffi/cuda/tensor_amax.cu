// XLA FFI handler (platform "CUDA"): mxjax_tensor_amax. x (bf16 / f16 / f32, any shape) ->
// uint32[1]: the largest f32 bits of |x| over x's finite elements (NaN / Inf count as 0; 0
// for an empty or all-zero x), as mxjax.reference.tensor_scale's amax; the same contract
// as the CPU target. The output is zeroed on the stream, then tensor_amax.cuh's kernel
// reduces x into it.
#include <string>

#include "cpu/checks.h"
#include "cuda/block_handlers.h"
#include "cuda/tensor_amax.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error TensorAmax(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  if (!cpu::high_precision(x.element_type())) {
    return cpu::invalid("tensor_amax needs a bf16, f16 or f32 input");
  }
  if (out->element_type() != ffi::DataType::U32 || out->element_count() != 1) {
    return cpu::invalid("tensor_amax's output must be uint32[1]");
  }
  auto* o = static_cast<uint32_t*>(out->untyped_data());
  if (cudaError_t e = cudaMemsetAsync(o, 0, sizeof(uint32_t), stream); e != cudaSuccess) {
    return ffi::Error::Internal(std::string("mxjax: CUDA tensor_amax memset failed: ") +
                                cudaGetErrorString(e));
  }
  const int64_t n = x.element_count();
  if (n == 0) return ffi::Error::Success();
  auto launch = [&](auto in) {
    using In = decltype(in);
    AmaxArgs<In> a{static_cast<const typename In::T*>(x.untyped_data()), n, false};
    a.vec = aligned16(a.x);
    tensor_amax_kernel<In><<<amax_grid(n), kThreads, 0, stream>>>(a, o);
  };
  switch (x.element_type()) {
    case ffi::DataType::BF16: launch(BF16{}); break;
    case ffi::DataType::F16: launch(F16{}); break;
    default: launch(F32{}); break;
  }
  return launch_status("tensor_amax");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxTensorAmaxCuda, mxjax::cuda::TensorAmax,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});
