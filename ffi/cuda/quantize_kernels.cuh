// The kernels of mxjax_quantize and mxjax_quantize_2x (quantize.cu), x [outer, n, inner]
// (bf16 / f16 / f32) quantized along n -> data [outer, storage(n), inner] (f8 or packed
// u8) and scales [outer, ceil(n/B), inner] (e8m0 bytes). Every body is __host__ __device__:
// tests/host_check.cu includes this header alone and runs the threads on the CPU (the
// __global__ kernels and launches compile only where MXJAX_CUDA_DEVICE).
//
// Three kernels (ffi/cuda/PERF_NOTES.md has the arithmetic behind them):
// - rows (inner == 1, n % B == 0): the tensor is one run of outer * n / B blocks; each of L
//   threads (kRowLanes) of a block loads its B / L elements with 16-byte loads, the L reduce
//   amax by shuffles, and each stores its packed codes with the widest aligned stores. No
//   division anywhere.
// - columns (inner > 1): a thread keeps a register tile of B rows x V columns (one load of
//   V * sizeof(T) bytes per row), finds the V scales and stores the codes row by row (V
//   bytes per storage row, coalesced across the warp).
// - other rows (n % B != 0): a thread per block, element by element (the slow path).
#ifndef MXJAX_CUDA_QUANTIZE_KERNELS_CUH_
#define MXJAX_CUDA_QUANTIZE_KERNELS_CUH_

#include "cuda/device.cuh"

namespace mxjax::cuda {
namespace {

// Where a launch reads and writes: x [outer, n, inner] -> data [outer, storage(n), inner],
// scales [outer, ceil(n / B), inner].
template <class In>
struct QuantizeArgs {
  const typename In::T* x;
  int64_t outer, n, inner;
  int32_t mode;
  uint8_t* data;
  uint8_t* scales;
};

// ---------------------------------------------------------------------------------------
// Rows, n % B == 0: segment t (S = B / L elements) of the flat run of blocks.

template <class F, class In, int B, int L>
struct RowPlan {
  static constexpr int S = B / L;
  static constexpr int kInWords = raw_words<In, S>();
  static constexpr int kOutBytes = S * F::bits / 8;
  static constexpr int kOutWords = (S * F::bits + 31) / 32;
  static_assert(S * sizeof(typename In::T) % 16 == 0, "whole 16-byte loads");
};

// Loads segment t (zeros past the last of `segs`) and returns its amax (f32 bits).
template <class F, class In, int B, int L>
MXJAX_HD uint32_t rows_load(const QuantizeArgs<In>& a, int64_t t, int64_t segs,
                            uint32_t (&w)[RowPlan<F, In, B, L>::kInWords]) {
  using P = RowPlan<F, In, B, L>;
  uint32_t acc = 0;
  if (t < segs) {
    load_raw<In, P::S>(a.x + t * P::S, w);
#pragma unroll
    for (int i = 0; i < P::kInWords; ++i) acc = raw_abs_max<In>(acc, w[i]);
  }
  return raw_amax_f32<In>(acc);
}

// Encodes and stores segment t given its block's amax; the block's first segment stores
// the scale.
template <class F, class In, int B, int L, Enc E>
MXJAX_HD void rows_store(const QuantizeArgs<In>& a, int64_t t,
                         const uint32_t (&w)[RowPlan<F, In, B, L>::kInWords], uint32_t amax) {
  using P = RowPlan<F, In, B, L>;
  const BlockScale s = block_scale<F>(amax, a.mode);
  uint32_t out[P::kOutWords];
  encode_run<F, In, E, P::S>(w, s, out);
  store_raw<P::kOutBytes, align_of(P::kOutBytes)>(a.data + t * P::kOutBytes, out);
  if (t % L == 0) a.scales[t / L] = uint8_t(s.byte);
}

#if MXJAX_CUDA_DEVICE
template <class F, class In, int B, int L, Enc E>
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(QuantizeArgs<In> a) {
  using P = RowPlan<F, In, B, L>;
  const int64_t segs = a.outer * a.n / P::S;
  // With L > 1, whole warps iterate together so that every lane reaches the shuffles.
  const int64_t total = L == 1 ? segs : cdiv(segs, 32) * 32;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    uint32_t w[P::kInWords];
    uint32_t amax = rows_load<F, In, B, L>(a, t, segs, w);
    amax = group_max(amax, L);  // over the L lanes of a block
    if (t < segs) rows_store<F, In, B, L, E>(a, t, w, amax);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Rows, n % B != 0: block i (of outer * ceil(n / B)), element by element.

template <class F, class In>
MXJAX_HD void rows_generic_block(const QuantizeArgs<In>& a, int block, int64_t i) {
  const int64_t nb = cdiv(a.n, block), row = div_fast(i, nb), j = i - row * nb;
  const int64_t start = j * block, storage = cdiv(a.n, F::group_codes) * F::group_bytes;
  const int valid = int(min64(block, a.n - start));
  const typename In::T* x = a.x + row * a.n + start;
  uint32_t amax = 0;
  for (int k = 0; k < valid; ++k) amax = umax(amax, In::widen(x[k]) & kF32Abs);
  const BlockScale s = block_scale<F>(amax, a.mode);
  uint8_t* out = a.data + row * storage;
  for (int g = 0; g < valid; g += 8) {
    uint32_t codes[8];
    for (int k = 0; k < 8; ++k) {
      codes[k] = g + k < valid ? encode_element<F>(In::widen(x[g + k]), s.inv) & s.keep : 0u;
    }
    const int64_t pos = (start + g) * F::bits / 8;
    store_bytes(out + pos, 1, pos, storage, pack_codes<F>(codes, 8), F::bits);
  }
  a.scales[i] = uint8_t(s.byte);
}

#if MXJAX_CUDA_DEVICE
template <class F, class In>
__global__ void __launch_bounds__(kThreads) quantize_rows_generic_kernel(QuantizeArgs<In> a,
                                                                         int block) {
  const int64_t total = a.outer * cdiv(a.n, block);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    rows_generic_block<F, In>(a, block, i);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Columns (inner > 1): tile t = (outer o, block row j, column group g of V columns). V > 1
// needs inner % V == 0 and x, data, scales aligned (the launch checks).

template <class F, class In, int B, int V, Enc E>
MXJAX_HD void cols_tile(const QuantizeArgs<In>& a, int64_t t) {
  constexpr int kInWords = raw_words<In, V>();
  const int64_t groups = a.inner / V, nb = cdiv(a.n, B);
  const int64_t oj = div_fast(t, groups), g = t - oj * groups;
  const int64_t o = div_fast(oj, nb), j = oj - o * nb;
  const int valid = int(min64(B, a.n - j * B));
  const typename In::T* x = a.x + (o * a.n + j * B) * a.inner + g * V;
  uint32_t w[B][kInWords];
#pragma unroll
  for (int r = 0; r < B; ++r) {
    if (r < valid) {
      load_raw<In, V>(x + r * a.inner, w[r]);
    } else {
#pragma unroll
      for (int k = 0; k < kInWords; ++k) w[r][k] = 0;
    }
  }
  const int64_t storage = cdiv(a.n, F::group_codes) * F::group_bytes;
  store_col_blocks<F, In, B, V, E>(
      w, valid, a.mode, a.inner, a.scales + (o * nb + j) * a.inner + g * V,
      a.data + (o * storage + j * (B / F::group_codes * F::group_bytes)) * a.inner + g * V);
}

#if MXJAX_CUDA_DEVICE
template <class F, class In, int B, int V, Enc E>
__global__ void __launch_bounds__(kThreads) quantize_cols_kernel(QuantizeArgs<In> a) {
  const int64_t total = a.outer * cdiv(a.n, B) * (a.inner / V);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    cols_tile<F, In, B, V, E>(a, t);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Launch (also used by tests/bench_kernels.cu with other variants).

#if MXJAX_CUDA_DEVICE
template <class F, class In, int kLanes = kRowLanesDefault<F, In>,
          int kTileBytes = kColTileBytesDefault, Enc E = kEncDefault>
void launch_quantize(const QuantizeArgs<In>& a, int block, cudaStream_t stream) {
  with_block(block, [&](auto bc) {
    constexpr int B = decltype(bc)::value;
    if (a.inner == 1) {
      if constexpr (fast_input<In>()) {  // (f16: the element-by-element kernel)
        if (a.n % B == 0 && aligned16(a.x) && aligned16(a.data)) {
          constexpr int L = row_lanes<In, B, kLanes>();
          quantize_rows_kernel<F, In, B, L, E>
              <<<grid_for(a.outer * a.n / (B / L)), kThreads, 0, stream>>>(a);
          return;
        }
      }
      quantize_rows_generic_kernel<F, In>
          <<<grid_for(a.outer * cdiv(a.n, B)), kThreads, 0, stream>>>(a, B);
      return;
    }
    constexpr int V = fast_input<In>() ? tile_cols<In, B, kTileBytes>() : 1;  // (f16: 1)
    const bool vec = a.inner % V == 0 && aligned16(a.x) && aligned16(a.data) &&
                     aligned16(a.scales);
    if (V > 1 && vec) {
      quantize_cols_kernel<F, In, B, V, E>
          <<<grid_for(a.outer * cdiv(a.n, B) * (a.inner / V)), kThreads, 0, stream>>>(a);
    } else {
      quantize_cols_kernel<F, In, B, 1, E>
          <<<grid_for(a.outer * cdiv(a.n, B) * a.inner), kThreads, 0, stream>>>(a);
    }
  });
}
#endif  // MXJAX_CUDA_DEVICE

}  // namespace
}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_QUANTIZE_KERNELS_CUH_
