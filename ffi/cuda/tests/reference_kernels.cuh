// The quantize kernels as they were before ffi/cuda/PERF_NOTES.md (commit 9d32038, measured
// on an H100 in shared/gpu/h100-2026-11-27.md, equal to the CPU kernels there): bench_kernels.cu
// times them as the "before" rows and checks every new variant's bytes against them.
// Include after cuda/device.cuh.
#ifndef MXJAX_CUDA_TESTS_REFERENCE_KERNELS_CUH_
#define MXJAX_CUDA_TESTS_REFERENCE_KERNELS_CUH_

namespace mxjax::cuda::ref {

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

// The pre-change launch: rows kernel for inner == 1, one thread per column block otherwise.
template <class F, class In>
void launch_quantize(const typename In::T* x, int64_t outer, int64_t n, int64_t inner, int block,
                     int32_t mode, uint8_t* data, uint8_t* scales, cudaStream_t stream) {
  QuantizeArgs<F, In> a{x, outer, n, inner, block, mode, false, data, scales};
  auto grid = [](int64_t threads) {
    const int64_t blocks = cdiv(threads, kThreads);
    return unsigned(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
  };
  if (inner == 1) {
    a.vec = aligned16(a.x) && n % kVec<In> == 0;
    quantize_rows_kernel<<<grid(outer * a.nb() * a.lanes()), kThreads, 0, stream>>>(a);
  } else {
    quantize_cols_kernel<<<grid(outer * a.nb() * inner), kThreads, 0, stream>>>(a);
  }
}

}  // namespace mxjax::cuda::ref

#endif  // MXJAX_CUDA_TESTS_REFERENCE_KERNELS_CUH_
