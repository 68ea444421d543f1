// The CPU FFI handler symbols (registered by ffi/module.cc under the contract's names).
#ifndef MXJAX_CPU_HANDLERS_H_
#define MXJAX_CPU_HANDLERS_H_

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxQuantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxQuantize2xCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxDequantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxFakeQuantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockQuantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxRhtQuantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockQuantize2xCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockDequantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxBlockFakeQuantizeCpu);

#endif  // MXJAX_CPU_HANDLERS_H_
