// The nanobind extension mxjax._mxjax_ffi: FFI handler capsules and build facts.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "cpu/amax_ffi.h"
#include "cpu/handlers.h"
#include "cpu/kernels.h"
#ifdef MXJAX_WITH_CUDA
#include "cuda/handlers.h"  // MxjaxQuantizeCuda, MxjaxQuantize2xCuda, MxjaxDequantizeCuda
#include "cuda/block_handlers.h"  // the block formats' and mxjax_tensor_amax
#endif

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_mxjax_ffi, m) {
  m.doc() = "mxjax XLA FFI kernels (MX quantize / dequantize).";

  m.def("registrations", []() {
    nb::dict d;
    d["mxjax_quantize"] = capsule(MxjaxQuantizeCpu);
    d["mxjax_quantize_2x"] = capsule(MxjaxQuantize2xCpu);
    d["mxjax_dequantize"] = capsule(MxjaxDequantizeCpu);
    d["mxjax_fake_quantize"] = capsule(MxjaxFakeQuantizeCpu);
    d["mxjax_block_quantize"] = capsule(MxjaxBlockQuantizeCpu);
    d["mxjax_block_quantize_2x"] = capsule(MxjaxBlockQuantize2xCpu);
    d["mxjax_block_dequantize"] = capsule(MxjaxBlockDequantizeCpu);
    d["mxjax_block_fake_quantize"] = capsule(MxjaxBlockFakeQuantizeCpu);
    d["mxjax_tensor_amax"] = capsule(MxjaxTensorAmaxCpu);
    d["mxjax_rht_quantize"] = capsule(MxjaxRhtQuantizeCpu);
    d["mxjax_rht_amax"] = capsule(MxjaxRhtAmaxCpu);
    return d;
  }, "{target name: capsule} of the CPU (platform \"cpu\") handlers.");

  m.def("cuda_registrations", []() {
    nb::dict d;
#ifdef MXJAX_WITH_CUDA
    d["mxjax_quantize"] = capsule(MxjaxQuantizeCuda);
    d["mxjax_quantize_2x"] = capsule(MxjaxQuantize2xCuda);
    d["mxjax_dequantize"] = capsule(MxjaxDequantizeCuda);
    d["mxjax_fake_quantize"] = capsule(MxjaxFakeQuantizeCuda);
    // [cuda engineer] CUDA-only targets (ffi/cuda/handlers.h).
    d["mxjax_swizzle_scales"] = capsule(MxjaxSwizzleScalesCuda);
    d["mxjax_mx_gemm"] = capsule(MxjaxMxGemmCuda);
    d["mxjax_fp8_block_gemm"] = capsule(MxjaxFp8BlockGemmCuda);
    // The block formats, under the CPU targets' names (cuda/block_handlers.h).
    d["mxjax_block_quantize"] = capsule(MxjaxBlockQuantizeCuda);
    d["mxjax_block_quantize_2x"] = capsule(MxjaxBlockQuantize2xCuda);
    d["mxjax_block_dequantize"] = capsule(MxjaxBlockDequantizeCuda);
    d["mxjax_block_fake_quantize"] = capsule(MxjaxBlockFakeQuantizeCuda);
    d["mxjax_tensor_amax"] = capsule(MxjaxTensorAmaxCuda);
#endif
    return d;
  }, "{target name: capsule} of the CUDA (platform \"CUDA\") handlers; empty without CUDA.");

  m.def("runnable_simd", []() {
    const char* names[3];
    nb::list levels;
    for (int i = 0, n = mxjax::cpu::runnable_simd(names); i < n; ++i) levels.append(names[i]);
    return levels;
  }, "The CPU kernel levels this build and CPU run under the MXJAX_SIMD cap, narrowest first.");

  m.def("set_simd", [](const std::string& level) { return mxjax::cpu::set_simd(level.c_str()); },
        nb::arg("level"),
        "Makes `level` the CPU kernel level of the calls that start after this; False (and no "
        "change) where this build and CPU do not run it under the MXJAX_SIMD cap.");

  m.def("build_info", []() {
    nb::dict d;
    d["cpu"] = true;
#ifdef MXJAX_WITH_CUDA
    d["cuda"] = true;
#else
    d["cuda"] = false;
#endif
    d["simd"] = mxjax::cpu::kernels().simd;
    nb::list levels;
    levels.append("scalar");
#ifdef MXJAX_HAVE_X86_LEVELS
    levels.append("avx2");
    levels.append("avx512");
#endif
    d["simd_compiled"] = levels;
#ifdef MXJAX_SANITIZE
    d["sanitize"] = true;
#else
    d["sanitize"] = false;
#endif
    d["compiler"] = __VERSION__;
    return d;
  }, "Facts about this build: cpu, cuda, simd (level in use), simd_compiled, sanitize.");
}
