// The handler symbols of mxjax_tensor_amax and mxjax_rht_amax (platform "cpu"; amax_ffi.cc).
#ifndef MXJAX_CPU_AMAX_FFI_H_
#define MXJAX_CPU_AMAX_FFI_H_

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxTensorAmaxCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MxjaxRhtAmaxCpu);

#endif  // MXJAX_CPU_AMAX_FFI_H_
