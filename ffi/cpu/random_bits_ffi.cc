// XLA FFI handler (platform "cpu") mxjax_random_bits: seed (uint32[2]), base (uint32[1]),
// like (any array) -> uint32 of like's shape: element i's bits are those of the index
// base + sum_d i_d * strides[d] (modulo 2^32; `strides`: an int64 attribute per dim), as
// mxjax/_src/stochastic.py's random_bits. `like` is read for its shape only (a shard's,
// on a mesh, where base is the shard's first index). Rows along the last dim run on XLA's
// thread pool at the SIMD level in use.
#include <cstdint>
#include <vector>

#include "checks.h"
#include "handlers.h"
#include "kernels.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {
namespace {

ffi::Future RandomBits(ffi::ThreadPool pool, ffi::AnyBuffer seed, ffi::AnyBuffer base,
                       ffi::AnyBuffer like, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Span<const int64_t> strides) {
  if (seed.element_type() != ffi::DataType::U32 || seed.element_count() != 2 ||
      base.element_type() != ffi::DataType::U32 || base.element_count() != 1) {
    return ready_future(invalid("random bits need a uint32[2] seed and a uint32[1] base"));
  }
  auto dims = like.dimensions();
  const int64_t rank = dims.size();
  if (out->element_type() != ffi::DataType::U32 || out->dimensions().size() != dims.size() ||
      int64_t(strides.size()) != rank) {
    return ready_future(invalid("random bits: the result must be uint32 of like's shape, "
                                "with one stride per dim"));
  }
  const int64_t n = int64_t(like.element_count());
  if (n == 0) return ready_future();
  const uint32_t* s = static_cast<const uint32_t*>(seed.untyped_data());
  const uint32_t seed0 = s[0], seed1 = s[1];
  const uint32_t first = *static_cast<const uint32_t*>(base.untyped_data());
  const int64_t cols = rank ? dims[rank - 1] : 1;
  const uint32_t step = rank ? uint32_t(strides[rank - 1]) : 0;
  std::vector<int64_t> outer(dims.begin(), dims.end() - (rank ? 1 : 0));
  std::vector<uint32_t> outer_strides(strides.begin(), strides.end() - (rank ? 1 : 0));
  uint32_t* bits = static_cast<uint32_t*>(out->untyped_data());
  auto run = kernels().block->random_bits;
  return parallel_for(pool, n / cols, cols, [=](int64_t begin, int64_t end) {
    // The outer indices of row `begin` (an odometer from there on) and its first index.
    const int64_t depth = int64_t(outer.size());
    std::vector<int64_t> at(depth);
    uint32_t index = first;
    for (int64_t d = depth - 1, r = begin; d >= 0; --d) {
      at[d] = r % outer[d];
      r /= outer[d];
      index += uint32_t(at[d]) * outer_strides[d];
    }
    for (int64_t row = begin; row < end; ++row) {
      run(seed0, seed1, index, step, cols, bits + row * cols);
      for (int64_t d = depth - 1; d >= 0; --d) {  // the next row
        index += outer_strides[d];
        if (++at[d] < outer[d]) break;
        index -= uint32_t(outer[d]) * outer_strides[d];
        at[d] = 0;
      }
    }
  });
}

}  // namespace
}  // namespace mxjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxRandomBitsCpu, mxjax::cpu::RandomBits,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<xla::ffi::Span<const int64_t>>("strides"));
