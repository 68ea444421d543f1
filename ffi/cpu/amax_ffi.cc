// XLA FFI handler (platform "cpu") mxjax_tensor_amax: x (bf16, f16 or f32, any shape) ->
// uint32[1], the largest f32 bits of |x| over x's finite elements (NaN / Inf count as 0; 0
// for an empty or all-zero x): the amax of mxjax/reference.py's tensor_scale. Runs on
// XLA's thread pool at the SIMD level in use; each chunk folds its max into the result
// with an atomic max (the result is zeroed first, and read only once every chunk is done).
#include <cstdint>

#include "amax_ffi.h"
#include "checks.h"
#include "kernels.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {
namespace {

constexpr int64_t kUnitElems = 1 << 14;  // elements per work unit

void atomic_max(uint32_t* dst, uint32_t v) {
  uint32_t cur = __atomic_load_n(dst, __ATOMIC_RELAXED);
  while (v > cur &&
         !__atomic_compare_exchange_n(dst, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

ffi::Future TensorAmax(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  auto dtype = high_precision(x.element_type());
  if (!dtype) return ready_future(invalid("tensor amax needs a bf16, f16 or f32 input"));
  if (out->element_type() != ffi::DataType::U32 || out->element_count() != 1) {
    return ready_future(invalid("tensor amax's result must be uint32[1]"));
  }
  uint32_t* result = static_cast<uint32_t*>(out->untyped_data());
  *result = 0;
  const int64_t n = int64_t(x.element_count());
  const void* data = x.untyped_data();
  const int32_t dt = *dtype;
  auto amax = kernels().block->tensor_amax;
  return parallel_for(pool, ceil_div(n, kUnitElems), kUnitElems,
                      [=](int64_t b, int64_t e) {
                        atomic_max(result, amax(data, dt, b * kUnitElems,
                                                e * kUnitElems < n ? e * kUnitElems : n));
                      });
}

}  // namespace
}  // namespace mxjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxTensorAmaxCpu, mxjax::cpu::TensorAmax,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
