// The CUDA FFI handler symbols of the block-scaled formats (platform "CUDA"), registered by
// ffi/module.cc under the CPU targets' names (ffi/cpu/block_ffi.cc), plus the tensor amax.
#ifndef MXJAX_CUDA_BLOCK_HANDLERS_H_
#define MXJAX_CUDA_BLOCK_HANDLERS_H_

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockQuantizeCuda);      // mxjax_block_quantize
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockQuantize2xCuda);    // mxjax_block_quantize_2x
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockDequantizeCuda);    // mxjax_block_dequantize
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockFakeQuantizeCuda);  // mxjax_block_fake_quantize
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxTensorAmaxCuda);         // mxjax_tensor_amax

#endif  // MXJAX_CUDA_BLOCK_HANDLERS_H_
