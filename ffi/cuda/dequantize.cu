// XLA FFI handler (platform "CUDA"): mxjax_dequantize. data [outer, storage(n), inner] and
// scales [outer, ceil(n/B), inner] -> out [outer, n, inner] (bf16 / f16 / f32): each value is
// decode(code) * 2^e rounded once to f32, then to the output type; a 0xFF scale gives NaN.
#include "cpu/checks.h"
#include "cuda/device.cuh"
#include "cuda/handlers.h"

namespace mxjax::cuda {
namespace {

constexpr int kChunk = 8;  // codes per thread: a whole number of packing groups of any format

// Where a launch reads and writes: data [outer, storage, inner], scales [outer, nb, inner]
// -> out [outer, n, inner].
template <class F, class Out>
struct DequantizeArgs {
  const uint8_t* data;
  const uint8_t* scales;
  int64_t outer, n, inner;
  int block;
  typename Out::T* out;
  MXJAX_HD int64_t chunks() const { return cdiv(n, kChunk); }
};

// Stores the kChunk values v at out[0], out[stride], ...; positions pos + i >= limit are
// dropped. On the device, 16-byte stores when contiguous, complete and aligned.
template <class Out>
MXJAX_HD void store_values(typename Out::T* out, int64_t stride, int64_t pos, int64_t limit,
                           const typename Out::T (&v)[kChunk]) {
  using T = typename Out::T;
#ifdef __CUDA_ARCH__
  constexpr int kPerVec = 16 / sizeof(T);
  if (stride == 1 && pos + kChunk <= limit && aligned16(out)) {
#pragma unroll
    for (int h = 0; h < kChunk; h += kPerVec) {
      union { uint4 u; T t[kPerVec]; } w;
#pragma unroll
      for (int i = 0; i < kPerVec; ++i) w.t[i] = v[h + i];
      *reinterpret_cast<uint4*>(out + h) = w.u;
    }
    return;
  }
#endif
  for (int i = 0; i < kChunk; ++i) {
    if (pos + i < limit) out[i * stride] = v[i];
  }
}

// Thread t = (outer, chunk of 8 elements along n, inner index). Chunks never straddle blocks
// (every block size is a multiple of 8); neighbouring threads touch neighbouring inner
// indices, or (inner == 1) neighbouring chunks.
template <class F, class Out>
MXJAX_HD void dequantize_chunk(const DequantizeArgs<F, Out>& a, int64_t t) {
  const int64_t i = t % a.inner, oc = t / a.inner, c = oc % a.chunks(), o = oc / a.chunks();
  const int64_t m0 = c * kChunk, nb = cdiv(a.n, a.block);
  const int64_t storage = cdiv(a.n, F::group_codes) * F::group_bytes;
  const int64_t pos = c * F::bits;  // kChunk codes take F::bits bytes
  const uint64_t w =
      load_bytes(a.data + (o * storage + pos) * a.inner + i, a.inner, pos, storage, F::bits);
  const uint8_t s = a.scales[(o * nb + m0 / a.block) * a.inner + i];
  const float scale = as_float(s == kE8M0NaN ? 0u : scale_bits(s));
  typename Out::T v[kChunk];
  for (int k = 0; k < kChunk; ++k) {
    const uint32_t bits = dequantize_element<F>(unpack_code<F>(w, k), scale);
    v[k] = Out::narrow(s == kE8M0NaN ? kF32QNaN : bits);
  }
  store_values<Out>(a.out + (o * a.n + m0) * a.inner + i, a.inner, m0, a.n, v);
}

template <class F, class Out>
__global__ void dequantize_kernel(DequantizeArgs<F, Out> a) {
  const int64_t total = a.outer * a.chunks() * a.inner;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    dequantize_chunk(a, t);
  }
}

ffi::Error Dequantize(cudaStream_t stream, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                      ffi::Result<ffi::AnyBuffer> out, int32_t format, int64_t block,
                      int64_t axis) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, 0, block); !e.success()) return e;
  if (!high_precision(out->element_type())) {
    return invalid("dequantize produces bf16, f16 or f32 only");
  }
  auto dims = out->dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return invalid("dequantize axis " + std::to_string(axis) + " out of range");
  }
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  FormatInfo info = *format_info(format);
  if (ffi::Error e = check_buffer("data", data, info.storage, dims, axis, info.storage_length(n));
      !e.success()) {
    return e;
  }
  if (ffi::Error e = check_buffer("scales", scales, ffi::DataType::F8E8M0FNU, dims, axis,
                                  cdiv(n, block));
      !e.success()) {
    return e;
  }
  if (out->element_count() == 0) return ffi::Error::Success();
  const auto* d = static_cast<const uint8_t*>(data.untyped_data());
  const auto* s = static_cast<const uint8_t*>(scales.untyped_data());
  dispatch(format, out->element_type(), [&](auto f, auto o) {
    using F = decltype(f);
    using Out = decltype(o);
    DequantizeArgs<F, Out> a{d, s, outer, n, inner, int(block),
                             static_cast<typename Out::T*>(out->untyped_data())};
    dequantize_kernel<<<grid_for(outer * a.chunks() * inner), kThreads, 0, stream>>>(a);
  });
  return launch_status("dequantize");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxDequantizeCuda, mxjax::cuda::Dequantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
