// XLA FFI handler (platform "CUDA"): mxjax_fake_quantize, dequantize(quantize(x)) in one
// pass: x [outer, n, inner] (bf16 / f16 / f32) -> out of the same shape (bf16 / f16 / f32),
// the values of dequantize(quantize(x along n)) without the MX data reaching memory. Same
// attributes and buffers as the CPU handler (ffi/cpu/fake_quantize_ffi.cc).
//
// The kernels: fake_quantize_kernels.cuh.
#ifndef MXJAX_FAKE_QUANTIZE_CU_
#define MXJAX_FAKE_QUANTIZE_CU_
#include "cpu/checks.h"
#include "cuda/handlers.h"
#include "cuda/fake_quantize_kernels.cuh"

namespace mxjax::cuda {
namespace {

// Calls fn(Out{}) for a high-precision output dtype.
template <class Fn>
void with_out_dtype(ffi::DataType dtype, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::BF16: return fn(BF16{});
    case ffi::DataType::F16: return fn(F16{});
    default: return fn(F32{});
  }
}

}  // namespace
}  // namespace mxjax::cuda

namespace mxjax::cuda {

// The launches of one input dtype (every format, output dtype and block size). The library
// build compiles bf16's and f32's in translation units of their own (fake_quantize_{bf16,
// f32}.cu define MXJAX_FAKE_QUANTIZE_INPUT), so nvcc's work spreads over the cores; f16's
// (only the slow kernels: fast_input) and, in a build without MXJAX_CUDA_SPLIT_UNITS, all
// of them are instantiated here.
template <class In>
void fake_quantize_input(int32_t format, ffi::DataType out_type, const void* x, int64_t outer,
                         int64_t n, int64_t inner, int32_t mode, void* out, int block,
                         cudaStream_t stream) {
  with_format(format, [&](auto f) {
    with_out_dtype(out_type, [&](auto o) {
      using F = decltype(f);
      using Out = decltype(o);
      launch_fake_quantize<F, In, Out>(
          FakeArgs<In, Out>{static_cast<const typename In::T*>(x), outer, n, inner, mode,
                            static_cast<typename Out::T*>(out)},
          block, stream);
    });
  });
}

#if defined(MXJAX_CUDA_SPLIT_UNITS) && !defined(MXJAX_FAKE_QUANTIZE_INPUT)
#define MXJAX_FQ_DECLARE(T)                                                                  \
  extern template void fake_quantize_input<T>(int32_t, ffi::DataType, const void*, int64_t, \
                                              int64_t, int64_t, int32_t, void*, int,        \
                                              cudaStream_t);
MXJAX_FQ_DECLARE(BF16)
MXJAX_FQ_DECLARE(F32)
#undef MXJAX_FQ_DECLARE
#endif

#ifdef MXJAX_FAKE_QUANTIZE_INPUT
template void fake_quantize_input<MXJAX_FAKE_QUANTIZE_INPUT>(
    int32_t, ffi::DataType, const void*, int64_t, int64_t, int64_t, int32_t, void*, int,
    cudaStream_t);
#endif

#ifndef MXJAX_FAKE_QUANTIZE_INPUT
namespace {

ffi::Error FakeQuantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                        int32_t format, int32_t mode, int64_t block, int64_t axis) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return e;
  if (!high_precision(x.element_type())) {
    return invalid("fake_quantize needs a bf16, f16 or f32 input");
  }
  if (!high_precision(out->element_type())) {
    return invalid("fake_quantize produces bf16, f16 or f32 only");
  }
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return invalid("fake_quantize axis " + std::to_string(axis) + " out of range");
  }
  if (ffi::Error e = check_buffer("out", *out, out->element_type(), dims, axis, dims[axis]);
      !e.success()) {
    return e;
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  auto run = [&](auto in) {
    fake_quantize_input<decltype(in)>(format, out->element_type(), x.untyped_data(), outer, n,
                                      inner, mode, out->untyped_data(), int(block), stream);
  };
  switch (x.element_type()) {
    case ffi::DataType::BF16: run(BF16{}); break;
    case ffi::DataType::F16: run(F16{}); break;
    default: run(F32{});
  }
  return launch_status("fake_quantize");
}

}  // namespace
#endif
}  // namespace mxjax::cuda

#ifndef MXJAX_FAKE_QUANTIZE_INPUT
XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxFakeQuantizeCuda, mxjax::cuda::FakeQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
#endif  // MXJAX_FAKE_QUANTIZE_INPUT
#endif  // MXJAX_FAKE_QUANTIZE_CU_
