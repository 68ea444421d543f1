// XLA FFI handler (platform "CUDA"): mxjax_fake_quantize, dequantize(quantize(x)) in one
// pass: x [outer, n, inner] (bf16 / f16 / f32) -> out of the same shape (bf16 / f16 / f32),
// the values of dequantize(quantize(x along n)) without the MX data reaching memory. Same
// attributes and buffers as the CPU handler (ffi/cpu/fake_quantize_ffi.cc).
//
// The kernels are quantize.cu's (rows: L threads per block, flat, 16-byte loads; columns:
// B x V register tiles; other rows: a thread per block), each element's code decoded and
// scaled in registers (codec.h's dequantize_element) and narrowed to the output type.
#ifndef MXJAX_FAKE_QUANTIZE_CU_
#define MXJAX_FAKE_QUANTIZE_CU_
#ifndef MXJAX_CUDA_KERNELS_ONLY  // tests/bench_kernels.cu: the kernels only
#include "cpu/checks.h"
#include "cuda/handlers.h"
#endif
#include "cuda/device.cuh"

namespace mxjax::cuda {
namespace {

template <class In, class Out>
struct FakeArgs {
  const typename In::T* x;
  int64_t outer, n, inner;
  int32_t mode;
  typename Out::T* out;
};

// Values of a run of V elements (raw words of In) in blocks of scales s[0] (kSame) or s[i]
// (one per column), narrowed to Out into raw words.
template <class F, class In, class Out, Enc E, int V, bool kSame>
MXJAX_HD void fq_values(const uint32_t* w, const BlockScale* s,
                        uint32_t (&o)[raw_words<Out, V>()]) {
  constexpr uint32_t kMask = (1u << F::bits) - 1;
  if constexpr (V == 1) {
    const uint32_t c = encode2<F, E>(raw_elem<In, 1>(w, 0), 0, s[0], s[0]) & kMask;
    put_out<Out, 1>(o, 0, scaled_value<F>(c, s[0]));
  } else {
#pragma unroll
    for (int i = 0; i < V; i += 2) {
      const BlockScale& s0 = s[kSame ? 0 : i];
      const BlockScale& s1 = s[kSame ? 0 : i + 1];
      const uint32_t c2 = encode2<F, E>(raw_elem<In, V>(w, i), raw_elem<In, V>(w, i + 1), s0, s1);
      put_out<Out, V>(o, i, scaled_value<F>(c2 & kMask, s0));
      put_out<Out, V>(o, i + 1, scaled_value<F>(c2 >> F::bits, s1));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Rows, n % B == 0: segment t (S = B / L elements) of the flat run of blocks.

template <class In, class Out, int B, int L>
struct FqRowPlan {
  static constexpr int S = B / L;
  static constexpr int kInWords = raw_words<In, S>();
  static constexpr int kOutBytes = S * int(sizeof(typename Out::T));
};

template <class In, class Out, int B, int L>
MXJAX_HD uint32_t fq_rows_load(const FakeArgs<In, Out>& a, int64_t t, int64_t segs,
                               uint32_t (&w)[FqRowPlan<In, Out, B, L>::kInWords]) {
  using P = FqRowPlan<In, Out, B, L>;
  uint32_t acc = 0;
  if (t < segs) {
    load_raw<In, P::S>(a.x + t * P::S, w);
#pragma unroll
    for (int i = 0; i < P::kInWords; ++i) acc = raw_abs_max<In>(acc, w[i]);
  }
  return raw_amax_f32<In>(acc);
}

template <class F, class In, class Out, int B, int L, Enc E>
MXJAX_HD void fq_rows_store(const FakeArgs<In, Out>& a, int64_t t,
                            const uint32_t (&w)[FqRowPlan<In, Out, B, L>::kInWords],
                            uint32_t amax) {
  using P = FqRowPlan<In, Out, B, L>;
  const BlockScale s = block_scale<F>(amax, a.mode);
  uint32_t o[raw_words<Out, P::S>()];
  fq_values<F, In, Out, E, P::S, true>(w, &s, o);
  store_raw<P::kOutBytes, align_of(P::kOutBytes)>(reinterpret_cast<uint8_t*>(a.out + t * P::S),
                                                  o);
}

template <class F, class In, class Out, int B, int L, Enc E>
__global__ void __launch_bounds__(kThreads) fake_quantize_rows_kernel(FakeArgs<In, Out> a) {
  using P = FqRowPlan<In, Out, B, L>;
  const int64_t segs = a.outer * a.n / P::S;
  const int64_t total = L == 1 ? segs : cdiv(segs, 32) * 32;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    uint32_t w[P::kInWords];
    uint32_t amax = fq_rows_load<In, Out, B, L>(a, t, segs, w);
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2) {
      amax = umax(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    if (t < segs) fq_rows_store<F, In, Out, B, L, E>(a, t, w, amax);
  }
}

// ---------------------------------------------------------------------------------------
// Rows, n % B != 0: block i, element by element.

template <class F, class In, class Out>
MXJAX_HD void fq_rows_generic_block(const FakeArgs<In, Out>& a, int block, int64_t i) {
  const int64_t nb = cdiv(a.n, block), row = div_fast(i, nb), j = i - row * nb;
  const int64_t start = row * a.n + j * block;
  const int valid = int(min64(block, a.n - j * block));
  uint32_t amax = 0;
  for (int k = 0; k < valid; ++k) amax = umax(amax, In::widen(a.x[start + k]) & kF32Abs);
  const BlockScale s = block_scale<F>(amax, a.mode);
  for (int k = 0; k < valid; ++k) {
    const uint32_t c = encode_element<F>(In::widen(a.x[start + k]), s.inv) & s.keep;
    a.out[start + k] = Out::narrow(scaled_value<F>(c, s));
  }
}

template <class F, class In, class Out>
__global__ void __launch_bounds__(kThreads)
fake_quantize_rows_generic_kernel(FakeArgs<In, Out> a, int block) {
  const int64_t total = a.outer * cdiv(a.n, block);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    fq_rows_generic_block<F, In, Out>(a, block, i);
  }
}

// ---------------------------------------------------------------------------------------
// Columns: tile t = (outer o, block row j, column group g of V), as in quantize.cu.

template <class F, class In, class Out, int B, int V, Enc E>
MXJAX_HD void fq_cols_tile(const FakeArgs<In, Out>& a, int64_t t) {
  constexpr int kInWords = raw_words<In, V>();
  const int64_t groups = a.inner / V, nb = cdiv(a.n, B);
  const int64_t oj = div_fast(t, groups), g = t - oj * groups;
  const int64_t o = div_fast(oj, nb), j = oj - o * nb;
  const int valid = int(min64(B, a.n - j * B));
  const int64_t first = (o * a.n + j * B) * a.inner + g * V;
  uint32_t w[B][kInWords];
#pragma unroll
  for (int r = 0; r < B; ++r) {
    if (r < valid) {
      load_raw<In, V>(a.x + first + r * a.inner, w[r]);
    } else {
#pragma unroll
      for (int k = 0; k < kInWords; ++k) w[r][k] = 0;
    }
  }
  BlockScale s[V];
  col_scales<F, In, B, V>(w, a.mode, s);
  constexpr int kBytes = V * int(sizeof(typename Out::T));
#pragma unroll
  for (int r = 0; r < B; ++r) {
    if (r >= valid) break;
    uint32_t o8[raw_words<Out, V>()];
    fq_values<F, In, Out, E, V, false>(w[r], s, o8);
    store_raw<kBytes, align_of(kBytes)>(reinterpret_cast<uint8_t*>(a.out + first + r * a.inner),
                                        o8);
  }
}

template <class F, class In, class Out, int B, int V, Enc E>
__global__ void __launch_bounds__(kThreads) fake_quantize_cols_kernel(FakeArgs<In, Out> a) {
  const int64_t total = a.outer * cdiv(a.n, B) * (a.inner / V);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    fq_cols_tile<F, In, Out, B, V, E>(a, t);
  }
}

// ---------------------------------------------------------------------------------------
// Launch (also used by tests/bench_kernels.cu with other variants).

template <class In, class Out, int B, int L>
constexpr int fq_row_lanes() {
  constexpr int S = B / L;
  return (L >= 1 && B % L == 0 && S * sizeof(typename In::T) % 16 == 0 && S % 2 == 0 &&
          L <= 32) ? L : 1;
}

template <class F, class In, class Out, int kLanes = kFakeRowLanesDefault,
          int kTileBytes = kColTileBytesDefault, Enc E = kEncDefault>
void launch_fake_quantize(const FakeArgs<In, Out>& a, int block, cudaStream_t stream) {
  with_block(block, [&](auto bc) {
    constexpr int B = decltype(bc)::value;
    if (a.inner == 1) {
      if (a.n % B == 0 && aligned16(a.x) && aligned16(a.out)) {
        constexpr int L = fq_row_lanes<In, Out, B, kLanes>();
        fake_quantize_rows_kernel<F, In, Out, B, L, E>
            <<<grid_for(a.outer * a.n / (B / L)), kThreads, 0, stream>>>(a);
      } else {
        fake_quantize_rows_generic_kernel<F, In, Out>
            <<<grid_for(a.outer * cdiv(a.n, B)), kThreads, 0, stream>>>(a, B);
      }
      return;
    }
    constexpr int V = tile_cols<In, B, kTileBytes>();
    if (V > 1 && a.inner % V == 0 && aligned16(a.x) && aligned16(a.out)) {
      fake_quantize_cols_kernel<F, In, Out, B, V, E>
          <<<grid_for(a.outer * cdiv(a.n, B) * (a.inner / V)), kThreads, 0, stream>>>(a);
    } else {
      fake_quantize_cols_kernel<F, In, Out, B, 1, E>
          <<<grid_for(a.outer * cdiv(a.n, B) * a.inner), kThreads, 0, stream>>>(a);
    }
  });
}

// Calls fn(Out{}) for a high-precision output dtype.
template <class Fn>
void with_out_dtype(ffi::DataType dtype, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::BF16: return fn(BF16{});
    case ffi::DataType::F16: return fn(F16{});
    default: return fn(F32{});
  }
}


}  // namespace
}  // namespace mxjax::cuda

namespace mxjax::cuda {

// The launches of one input dtype (every format, output dtype and block size). The library
// build compiles each input dtype in its own translation unit (fake_quantize_{bf16,f16,
// f32}.cu define MXJAX_FAKE_QUANTIZE_INPUT), so nvcc's work spreads over the cores; a
// single-translation-unit build (host_check.cu) instantiates them here.
template <class In>
void fake_quantize_input(int32_t format, ffi::DataType out_type, const void* x, int64_t outer,
                         int64_t n, int64_t inner, int32_t mode, void* out, int block,
                         cudaStream_t stream) {
  with_format(format, [&](auto f) {
    with_out_dtype(out_type, [&](auto o) {
      using F = decltype(f);
      using Out = decltype(o);
      launch_fake_quantize<F, In, Out>(
          FakeArgs<In, Out>{static_cast<const typename In::T*>(x), outer, n, inner, mode,
                            static_cast<typename Out::T*>(out)},
          block, stream);
    });
  });
}

#if defined(MXJAX_CUDA_SPLIT_UNITS) && !defined(MXJAX_FAKE_QUANTIZE_INPUT)
#define MXJAX_FQ_DECLARE(T)                                                                  \
  extern template void fake_quantize_input<T>(int32_t, ffi::DataType, const void*, int64_t, \
                                              int64_t, int64_t, int32_t, void*, int,        \
                                              cudaStream_t);
MXJAX_FQ_DECLARE(BF16)
MXJAX_FQ_DECLARE(F16)
MXJAX_FQ_DECLARE(F32)
#undef MXJAX_FQ_DECLARE
#endif

#ifdef MXJAX_FAKE_QUANTIZE_INPUT
template void fake_quantize_input<MXJAX_FAKE_QUANTIZE_INPUT>(
    int32_t, ffi::DataType, const void*, int64_t, int64_t, int64_t, int32_t, void*, int,
    cudaStream_t);
#endif

#if !defined(MXJAX_CUDA_KERNELS_ONLY) && !defined(MXJAX_FAKE_QUANTIZE_INPUT)
namespace {

ffi::Error FakeQuantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                        int32_t format, int32_t mode, int64_t block, int64_t axis) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return e;
  if (!high_precision(x.element_type())) {
    return invalid("fake_quantize needs a bf16, f16 or f32 input");
  }
  if (!high_precision(out->element_type())) {
    return invalid("fake_quantize produces bf16, f16 or f32 only");
  }
  auto dims = x.dimensions();
  if (axis < 0 || axis >= int64_t(dims.size())) {
    return invalid("fake_quantize axis " + std::to_string(axis) + " out of range");
  }
  if (ffi::Error e = check_buffer("out", *out, out->element_type(), dims, axis, dims[axis]);
      !e.success()) {
    return e;
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  int64_t outer, n, inner;
  view3(dims, axis, outer, n, inner);
  auto run = [&](auto in) {
    fake_quantize_input<decltype(in)>(format, out->element_type(), x.untyped_data(), outer, n,
                                      inner, mode, out->untyped_data(), int(block), stream);
  };
  switch (x.element_type()) {
    case ffi::DataType::BF16: run(BF16{}); break;
    case ffi::DataType::F16: run(F16{}); break;
    default: run(F32{});
  }
  return launch_status("fake_quantize");
}

}  // namespace
#endif
}  // namespace mxjax::cuda

#if !defined(MXJAX_CUDA_KERNELS_ONLY) && !defined(MXJAX_FAKE_QUANTIZE_INPUT)
XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxFakeQuantizeCuda, mxjax::cuda::FakeQuantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
#endif  // MXJAX_CUDA_KERNELS_ONLY
#endif  // MXJAX_FAKE_QUANTIZE_CU_
