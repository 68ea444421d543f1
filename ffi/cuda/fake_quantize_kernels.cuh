// The kernels of mxjax_fake_quantize (fake_quantize.cu): x [outer, n, inner] (bf16 / f16 /
// f32) -> out of the same shape (bf16 / f16 / f32), the values of dequantize(quantize(x
// along n)) in one pass. They are quantize_kernels.cuh's (rows: L threads per block, flat,
// 16-byte loads; columns: B x V register tiles; other rows: a thread per block), each
// element's code decoded and scaled in registers (codec.h's dequantize_element) and
// narrowed to the output type.
//
// Every body is __host__ __device__: tests/host_check.cu includes this header alone and
// runs the threads on the CPU (the __global__ kernels and launches compile only where
// MXJAX_CUDA_DEVICE).
#ifndef MXJAX_CUDA_FAKE_QUANTIZE_KERNELS_CUH_
#define MXJAX_CUDA_FAKE_QUANTIZE_KERNELS_CUH_

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

#if MXJAX_CUDA_DEVICE
template <class F, class In, class Out, int B, int L, Enc E>
__global__ void __launch_bounds__(kThreads) fake_quantize_rows_kernel(FakeArgs<In, Out> a) {
  using P = FqRowPlan<In, Out, B, L>;
  const int64_t segs = a.outer * a.n / P::S;
  const int64_t total = L == 1 ? segs : cdiv(segs, 32) * 32;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    uint32_t w[P::kInWords];
    uint32_t amax = fq_rows_load<In, Out, B, L>(a, t, segs, w);
    amax = group_max(amax, L);  // over the L lanes of a block
    if (t < segs) fq_rows_store<F, In, Out, B, L, E>(a, t, w, amax);
  }
}
#endif

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

#if MXJAX_CUDA_DEVICE
template <class F, class In, class Out>
__global__ void __launch_bounds__(kThreads)
fake_quantize_rows_generic_kernel(FakeArgs<In, Out> a, int block) {
  const int64_t total = a.outer * cdiv(a.n, block);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    fq_rows_generic_block<F, In, Out>(a, block, i);
  }
}
#endif

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

#if MXJAX_CUDA_DEVICE
template <class F, class In, class Out, int B, int V, Enc E>
__global__ void __launch_bounds__(kThreads) fake_quantize_cols_kernel(FakeArgs<In, Out> a) {
  const int64_t total = a.outer * cdiv(a.n, B) * (a.inner / V);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    fq_cols_tile<F, In, Out, B, V, E>(a, t);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Launch (also used by tests/bench_kernels.cu with other variants).

#if MXJAX_CUDA_DEVICE
template <class F, class In, class Out, int kLanes = kFakeRowLanesDefault,
          int kTileBytes = kColTileBytesDefault, Enc E = kEncDefault>
void launch_fake_quantize(const FakeArgs<In, Out>& a, int block, cudaStream_t stream) {
  with_block(block, [&](auto bc) {
    constexpr int B = decltype(bc)::value;
    if (a.inner == 1) {
      if constexpr (fast_fake_quantize<In, Out>()) {  // (f16: the element-by-element kernel)
        if (a.n % B == 0 && aligned16(a.x) && aligned16(a.out)) {
          constexpr int L = row_lanes<In, B, kLanes>();
          fake_quantize_rows_kernel<F, In, Out, B, L, E>
              <<<grid_for(a.outer * a.n / (B / L)), kThreads, 0, stream>>>(a);
          return;
        }
      }
      fake_quantize_rows_generic_kernel<F, In, Out>
          <<<grid_for(a.outer * cdiv(a.n, B)), kThreads, 0, stream>>>(a, B);
      return;
    }
    constexpr int V = fast_fake_quantize<In, Out>() ? tile_cols<In, B, kTileBytes>() : 1;
    if (V > 1 && a.inner % V == 0 && aligned16(a.x) && aligned16(a.out)) {
      fake_quantize_cols_kernel<F, In, Out, B, V, E>
          <<<grid_for(a.outer * cdiv(a.n, B) * (a.inner / V)), kThreads, 0, stream>>>(a);
    } else {
      fake_quantize_cols_kernel<F, In, Out, B, 1, E>
          <<<grid_for(a.outer * cdiv(a.n, B) * a.inner), kThreads, 0, stream>>>(a);
    }
  });
}
#endif  // MXJAX_CUDA_DEVICE

}  // namespace
}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_FAKE_QUANTIZE_KERNELS_CUH_
