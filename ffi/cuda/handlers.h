// The CUDA FFI handler symbols (platform "CUDA"), registered by ffi/module.cc when the module
// is built with MXJAX_WITH_CUDA. The first four share target names, attributes and buffer
// layouts with the CPU handlers (cpu/handlers.h).
#ifndef MXJAX_CUDA_HANDLERS_H_
#define MXJAX_CUDA_HANDLERS_H_

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxQuantizeCuda);    // mxjax_quantize
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxQuantize2xCuda);  // mxjax_quantize_2x
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxDequantizeCuda);  // mxjax_dequantize
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxFakeQuantizeCuda);  // mxjax_fake_quantize
// CUDA only (no CPU twin):
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxSwizzleScalesCuda);  // mxjax_swizzle_scales
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxMxGemmCuda);         // mxjax_mx_gemm (Blackwell)
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxFp8BlockGemmCuda);   // mxjax_fp8_block_gemm (Hopper)

#endif  // MXJAX_CUDA_HANDLERS_H_
