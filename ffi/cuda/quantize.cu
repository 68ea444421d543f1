// XLA FFI handler (platform "CUDA"): mxjax_quantize. Same attributes and buffers as the CPU
// handler (see the team contract): x [outer, n, inner] (bf16 / f16 / f32) quantized along n
// -> data [outer, storage(n), inner] (f8 or packed u8) and scales [outer, ceil(n/B), inner]
// (e8m0 bytes).
#include "cpu/checks.h"
#include "cuda/device.cuh"
#include "cuda/handlers.h"

namespace mxjax::cuda {
namespace {

// Where a launch reads and writes: x [outer, n, inner] -> data [outer, storage, inner],
// scales [outer, nb, inner].
template <class F, class In>
struct QuantizeArgs {
  const typename In::T* x;
  int64_t outer, n, inner;
  int block;
  int32_t mode;
  bool vec;  // inner == 1, x 16-byte aligned and n a multiple of kVec<In>
  uint8_t* data;
  uint8_t* scales;
  MXJAX_HD int64_t nb() const { return cdiv(n, block); }
  MXJAX_HD int64_t storage() const { return cdiv(n, F::group_codes) * F::group_bytes; }
  MXJAX_HD int lanes() const { return block / kVec<In>; }  // threads per block, inner == 1
};

// inner == 1, thread t: loads its kVec inputs of block t / lanes (f32 bits into u) and
// returns their amax. Blocks past the end read as zeros.
template <class F, class In>
MXJAX_HD uint32_t rows_load(const QuantizeArgs<F, In>& a, int64_t t, uint32_t (&u)[kVec<In>]) {
  const int64_t b = t / a.lanes();
  const bool live = b < a.outer * a.nb();
  const int64_t row = live ? b / a.nb() : 0;
  const int64_t start = (live ? b % a.nb() : 0) * a.block + t % a.lanes() * kVec<In>;
  load_widened<In, kVec<In>>(a.x + row * a.n, start, live ? a.n : 0, a.vec, u);
  uint32_t amax = 0;
  for (int k = 0; k < kVec<In>; ++k) amax = umax(amax, u[k] & kF32Abs);
  return amax;
}

// inner == 1, thread t of a live block: encodes and stores its kVec codes given the block's
// amax; its first thread stores the scale.
template <class F, class In>
MXJAX_HD void rows_store(const QuantizeArgs<F, In>& a, int64_t t, const uint32_t (&u)[kVec<In>],
                         uint32_t amax) {
  constexpr int V = kVec<In>;
  const int64_t b = t / a.lanes(), row = b / a.nb(), j = b % a.nb();
  const int q = int(t % a.lanes());
  const uint8_t s = e8m0_from_amax<F>(amax, a.mode);
  const float inv = as_float(s == kE8M0NaN ? 0u : inv_scale_bits(s));
  uint32_t codes[V];
  for (int k = 0; k < V; ++k) codes[k] = s == kE8M0NaN ? 0u : encode_element<F>(u[k], inv);
  const int64_t pos = (j * a.block + q * V) * F::bits / 8;
  store_bytes(a.data + row * a.storage() + pos, 1, pos, a.storage(), pack_codes<F>(codes, V),
              packed_bytes<F>(V));
  if (q == 0) a.scales[row * a.nb() + j] = s;
}

// inner == 1: each thread loads one 16-byte vector; the lanes of a block (2..16 threads of
// one warp) reduce amax with shuffles, then each stores its own codes.
template <class F, class In>
__global__ void quantize_rows_kernel(QuantizeArgs<F, In> a) {
  const int64_t blocks = a.outer * a.nb();
  // Whole warps iterate together, so every lane reaches the shuffles.
  const int64_t total = cdiv(blocks * a.lanes(), 32) * 32;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u[kVec<In>];
    uint32_t amax = rows_load(a, t, u);
    for (int off = a.lanes() / 2; off > 0; off /= 2) {
      amax = umax(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    if (t / a.lanes() < blocks) rows_store(a, t, u, amax);
  }
}

// inner > 1, thread t = (outer, block, inner index): neighbouring threads read and write
// neighbouring inner indices (coalesced). Two passes over the block: amax, then codes, 8
// at a time (F::bits storage bytes along n, `inner` apart).
template <class F, class In>
MXJAX_HD void quantize_col_block(const QuantizeArgs<F, In>& a, int64_t t) {
  const int64_t i = t % a.inner, oj = t / a.inner, j = oj % a.nb(), o = oj / a.nb();
  const int64_t m0 = j * a.block, storage = a.storage();
  const int valid = int(min64(a.block, a.n - m0));
  const typename In::T* col = a.x + (o * a.n + m0) * a.inner + i;  // element k: col[k * inner]
  uint32_t amax = 0;
  for (int k = 0; k < valid; ++k) amax = umax(amax, In::widen(col[k * a.inner]) & kF32Abs);
  const uint8_t s = e8m0_from_amax<F>(amax, a.mode);
  a.scales[oj * a.inner + i] = s;
  const float inv = as_float(s == kE8M0NaN ? 0u : inv_scale_bits(s));
  uint8_t* out = a.data + o * storage * a.inner + i;
  for (int g = 0; g < valid; g += 8) {
    uint32_t codes[8];
    for (int k = 0; k < 8; ++k) {
      codes[k] = (s == kE8M0NaN || g + k >= valid)
                     ? 0u : encode_element<F>(In::widen(col[(g + k) * a.inner]), inv);
    }
    const int64_t pos = (m0 + g) * F::bits / 8;
    store_bytes(out + pos * a.inner, a.inner, pos, storage, pack_codes<F>(codes, 8), F::bits);
  }
}

template <class F, class In>
__global__ void quantize_cols_kernel(QuantizeArgs<F, In> a) {
  const int64_t total = a.outer * a.nb() * a.inner;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    quantize_col_block(a, t);
  }
}

ffi::Error Quantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                    ffi::Result<ffi::AnyBuffer> scales, int32_t format, int32_t mode,
                    int64_t block, int64_t axis) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return e;
  if (!high_precision(x.element_type())) return invalid("quantize needs a bf16, f16 or f32 input");
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return invalid("quantize axis " + std::to_string(axis) + " out of range");
  }
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  FormatInfo info = *format_info(format);
  if (ffi::Error e = check_buffer("data", *data, info.storage, dims, axis, info.storage_length(n));
      !e.success()) {
    return e;
  }
  if (ffi::Error e = check_buffer("scales", *scales, ffi::DataType::F8E8M0FNU, dims, axis,
                                  cdiv(n, block));
      !e.success()) {
    return e;
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  auto* d = static_cast<uint8_t*>(data->untyped_data());
  auto* s = static_cast<uint8_t*>(scales->untyped_data());
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    using T = typename In::T;
    QuantizeArgs<F, In> a{static_cast<const T*>(x.untyped_data()), outer, n, inner, int(block),
                          mode, false, d, s};
    if (inner == 1) {
      a.vec = aligned16(a.x) && n % kVec<In> == 0;
      quantize_rows_kernel<<<grid_for(outer * a.nb() * a.lanes()), kThreads, 0, stream>>>(a);
    } else {
      quantize_cols_kernel<<<grid_for(outer * a.nb() * inner), kThreads, 0, stream>>>(a);
    }
  });
  return launch_status("quantize");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxQuantizeCuda, mxjax::cuda::Quantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
