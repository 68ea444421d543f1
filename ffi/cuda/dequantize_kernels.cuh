// The kernels of mxjax_dequantize (dequantize.cu): data [outer, storage(n), inner] and
// scales [outer, ceil(n/B), inner] -> out [outer, n, inner]. Rows (inner == 1,
// n % B == 0): the codes are one flat run; a thread decodes C codes (16 bytes of FP8 / FP4
// codes, 12 of FP6) of one block and stores them with 16-byte stores. Columns (inner > 1):
// a thread decodes 8 rows x V columns (V bytes per storage row). Anything else: 8 codes per
// thread, element by element (the slow path).
//
// Every body is __host__ __device__: tests/host_check.cu includes this header alone and
// runs the threads on the CPU (the __global__ kernels and launches compile only where
// MXJAX_CUDA_DEVICE).
#ifndef MXJAX_CUDA_DEQUANTIZE_KERNELS_CUH_
#define MXJAX_CUDA_DEQUANTIZE_KERNELS_CUH_

#include "cuda/device.cuh"

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

#if MXJAX_CUDA_DEVICE
template <class F, class Out>
__global__ void dequantize_generic_kernel(DequantizeArgs<F, Out> a) {
  const int64_t total = a.outer * a.chunks() * a.inner;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    dequantize_chunk(a, t);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Rows, n % B == 0: chunk t of C codes of the flat run of blocks.

template <class F, class Out, int B>
struct DeqRowPlan {
  static constexpr int C = F::bits == 6 ? 16 : (128 / F::bits < B ? 128 / F::bits : B);
  static constexpr int kInBytes = C * F::bits / 8;
  static constexpr int kInWords = kInBytes / 4;
  static constexpr int kOutBytes = C * int(sizeof(typename Out::T));
};

// Bits [pos, pos + nbits) of a little-endian bit stream w (pos and nbits known at compile
// time after unrolling; nbits <= 8).
template <int N>
MXJAX_HD uint32_t get_bits(const uint32_t (&w)[N], int pos, int nbits) {
  const int word = pos / 32, off = pos % 32;
  uint32_t v = w[word] >> off;
  if (off + nbits > 32) v |= w[word + 1] << (32 - off);
  return v & ((1u << nbits) - 1);
}

template <class F, class Out, int B>
MXJAX_HD void deq_rows_chunk(const DequantizeArgs<F, Out>& a, int64_t t) {
  using P = DeqRowPlan<F, Out, B>;
  uint32_t w[P::kInWords];
  load_bytes_raw<P::kInBytes, align_of(P::kInBytes)>(a.data + t * P::kInBytes, w);
  const BlockScale s = stored_scale(a.scales[t * P::C / B]);
  uint32_t o[raw_words<Out, P::C>()];
#pragma unroll
  for (int i = 0; i < P::C; ++i) {
    put_out<Out, P::C>(o, i, scaled_value<F>(get_bits(w, i * F::bits, F::bits), s));
  }
  store_raw<P::kOutBytes, 16>(reinterpret_cast<uint8_t*>(a.out + t * P::C), o);
}

#if MXJAX_CUDA_DEVICE
template <class F, class Out, int B>
__global__ void __launch_bounds__(kThreads) dequantize_rows_kernel(DequantizeArgs<F, Out> a) {
  const int64_t total = a.outer * a.n / DeqRowPlan<F, Out, B>::C;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    deq_rows_chunk<F, Out, B>(a, t);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Columns: tile t = (outer o, 8 rows along n, column group g of V); V > 1 needs inner % V
// == 0 and aligned buffers.

template <class F, class Out, int B, int V>
MXJAX_HD void deq_cols_tile(const DequantizeArgs<F, Out>& a, int64_t t) {
  constexpr int kRows = 8, kStorageRows = kRows / F::group_codes * F::group_bytes;
  constexpr int kCodeWords = (V + 3) / 4;
  const int64_t groups = a.inner / V, chunks = cdiv(a.n, kRows), nb = cdiv(a.n, B);
  const int64_t oc = div_fast(t, groups), g = t - oc * groups;
  const int64_t o = div_fast(oc, chunks), c = oc - o * chunks;
  const int64_t storage = cdiv(a.n, F::group_codes) * F::group_bytes;
  const int valid = int(min64(kRows, a.n - c * kRows));
  const int stored = int(min64(kStorageRows, storage - c * kStorageRows));
  const uint8_t* src = a.data + (o * storage + c * kStorageRows) * a.inner + g * V;
  uint32_t d[kStorageRows][kCodeWords];
#pragma unroll
  for (int k = 0; k < kStorageRows; ++k) {
    if (k < stored) {
      load_bytes_raw<V, align_of(V)>(src + k * a.inner, d[k]);
    } else {
#pragma unroll
      for (int i = 0; i < kCodeWords; ++i) d[k][i] = 0;
    }
  }
  uint32_t sw[kCodeWords];
  load_bytes_raw<V, align_of(V)>(a.scales + (o * nb + c * kRows / B) * a.inner + g * V, sw);
  BlockScale s[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s[j] = stored_scale(uint8_t(sw[j / 4] >> (8 * (j % 4))));
  typename Out::T* out = a.out + (o * a.n + c * kRows) * a.inner + g * V;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= valid) break;
    uint32_t o8[raw_words<Out, V>()];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      uint32_t rows[F::group_bytes];
#pragma unroll
      for (int k = 0; k < F::group_bytes; ++k) {
        rows[k] = d[r / F::group_codes * F::group_bytes + k][j / 4];
      }
      const uint32_t code = (unpack_rows<F>(rows, r % F::group_codes) >> (8 * (j % 4))) & 0xFFu;
      put_out<Out, V>(o8, j, scaled_value<F>(code, s[j]));
    }
    constexpr int kBytes = V * int(sizeof(typename Out::T));
    store_raw<kBytes, align_of(kBytes)>(reinterpret_cast<uint8_t*>(out + r * a.inner), o8);
  }
}

#if MXJAX_CUDA_DEVICE
template <class F, class Out, int B, int V>
__global__ void __launch_bounds__(kThreads) dequantize_cols_kernel(DequantizeArgs<F, Out> a) {
  const int64_t total = a.outer * cdiv(a.n, 8) * (a.inner / V);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    deq_cols_tile<F, Out, B, V>(a, t);
  }
}
#endif

#if MXJAX_CUDA_DEVICE
// ---------------------------------------------------------------------------------------
// Launch (also used by tests/bench_kernels.cu with other variants).

template <class F, class Out, int kColBytes = kDeqColBytesDefault>
void launch_dequantize(const DequantizeArgs<F, Out>& a, int block, cudaStream_t stream) {
  with_block(block, [&](auto bc) {
    constexpr int B = decltype(bc)::value;
    if (a.inner == 1) {
      if (a.n % B == 0 && aligned16(a.data) && aligned16(a.out)) {
        dequantize_rows_kernel<F, Out, B>
            <<<grid_for(a.outer * a.n / DeqRowPlan<F, Out, B>::C), kThreads, 0, stream>>>(a);
      } else {
        dequantize_generic_kernel<<<grid_for(a.outer * a.chunks()), kThreads, 0, stream>>>(a);
      }
      return;
    }
    constexpr int V = kColBytes;
    if (a.inner % V == 0 && aligned16(a.data) && aligned16(a.scales) && aligned16(a.out)) {
      dequantize_cols_kernel<F, Out, B, V>
          <<<grid_for(a.outer * cdiv(a.n, 8) * (a.inner / V)), kThreads, 0, stream>>>(a);
    } else {
      dequantize_cols_kernel<F, Out, B, 1>
          <<<grid_for(a.outer * cdiv(a.n, 8) * a.inner), kThreads, 0, stream>>>(a);
    }
  });
}
#endif  // MXJAX_CUDA_DEVICE

}  // namespace
}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_DEQUANTIZE_KERNELS_CUH_
