// XLA FFI handler (platform "cpu") mxjax_tensor_amax: x (bf16, f16 or f32, any shape) ->
// uint32[1], the largest f32 bits of |x| over x's finite elements (NaN / Inf count as 0; 0
// for an empty or all-zero x): the amax of mxjax/reference.py's tensor_scale. Runs on
// XLA's thread pool at the SIMD level in use; each chunk folds its max into the result
// with an atomic max (the result is zeroed first, and read only once every chunk is done).
#include <cstdint>
#include <vector>

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

// mxjax_rht_amax: the tensor amax of x's RHT (rht.h) along `axis` (a whole number of runs,
// not the last), without an f32 copy of it: each run is reduced as it is transformed.
ffi::Future RhtAmax(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                    int64_t axis, ffi::Span<const float> signs) {
  auto dtype = high_precision(x.element_type());
  if (!dtype || *dtype == kF16) return ready_future(invalid("rht amax needs a bf16 or f32 input"));
  if (out->element_type() != ffi::DataType::U32 || out->element_count() != 1) {
    return ready_future(invalid("rht amax's result must be uint32[1]"));
  }
  std::vector<uint32_t> masks;
  float c;
  if (auto e = rht_signs(signs, masks, c); !e.success()) return ready_future(e);
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) return ready_future(invalid("axis out of range"));
  int64_t outer, len, inner;
  view3(dims, axis, outer, len, inner);
  const int64_t n = int64_t(masks.size());
  if (len % n != 0 || inner == 1) {
    return ready_future(invalid("rht amax takes an axis of whole runs with a dimension longer "
                                "than 1 after it"));
  }
  uint32_t* result = static_cast<uint32_t*>(out->untyped_data());
  *result = 0;
  const char* data = static_cast<const char*>(x.untyped_data());
  const int64_t runs = outer * len / n, in_bytes = dtype_bytes(*dtype);
  const int32_t dt = *dtype;
  const BlockKernels& k = *kernels().block;
  return parallel_for(pool, runs, n * inner, [=, &k](int64_t b, int64_t e) {
    atomic_max(result, k.rht(data + b * n * inner * in_bytes, dt, inner, inner, masks.data(),
                             int32_t(n), c, (e - b) * n, nullptr));
  });
}

}  // namespace
}  // namespace mxjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxRhtAmaxCpu, mxjax::cpu::RhtAmax,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("axis")
                                  .Attr<xla::ffi::Span<const float>>("signs"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxTensorAmaxCpu, mxjax::cpu::TensorAmax,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
