// The CUDA kernel of mxjax_tensor_amax (tensor_amax.cu): the largest f32 bits of |x| over
// x's finite elements. Each thread reduces segments of 8 (16-byte loads, 4 in flight), a
// thread block its threads (warp shuffles, shared memory), and its first thread atomicMax-es
// the result into the output, which the launch zeroed first.
#ifndef MXJAX_CUDA_TENSOR_AMAX_CUH_
#define MXJAX_CUDA_TENSOR_AMAX_CUH_

#include "cuda/block_device.cuh"

namespace mxjax::cuda {

constexpr int kAmaxK = 4;  // segments per thread per step

template <class In>
struct AmaxArgs {
  const typename In::T* x;
  int64_t n;
  bool vec;  // x 16-byte aligned
  MXJAX_HD int64_t segs() const { return cdiv(n, kSeg); }
};

MXJAX_HD uint32_t finite_mag(uint32_t bits) {
  const uint32_t m = bits & kF32Abs;
  return m < kF32Inf ? m : 0u;
}

// The max of finite |x| over segments first, first + stride, ... (kAmaxK at a time).
template <class In>
MXJAX_HD uint32_t amax_segments(const AmaxArgs<In>& a, int64_t first, int64_t stride) {
  uint32_t m = 0;
  for (int64_t s = first; s < a.segs(); s += kAmaxK * stride) {
    Raw<In> r[kAmaxK];
#pragma unroll
    for (int k = 0; k < kAmaxK; ++k) {
      const int64_t i = (s + k * stride) * kSeg;
      load_raw<In>(a.x + i, a.n - i, a.vec, r[k]);
    }
#pragma unroll
    for (int k = 0; k < kAmaxK; ++k) {
#pragma unroll
      for (int e = 0; e < kSeg; ++e) m = umax(m, finite_mag(r[k].bits(e)));
    }
  }
  return m;
}

#if MXJAX_CUDA_DEVICE
template <class In>
__global__ void __launch_bounds__(256) tensor_amax_kernel(AmaxArgs<In> a, uint32_t* out) {
  __shared__ uint32_t warps[kThreads / 32];
  uint32_t m = amax_segments(a, blockIdx.x * int64_t(kThreads) + threadIdx.x,
                             int64_t(gridDim.x) * kThreads);
  m = group_max(m, 32);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = umax(m, warps[w]);
    if (m) atomicMax(out, m);
  }
}
#endif

// Thread blocks for n elements: enough for about 4 steps per thread, at most 2048.
inline unsigned amax_grid(int64_t n) {
  const int64_t blocks = cdiv(cdiv(n, kSeg), int64_t(kThreads) * kAmaxK * 4);
  return unsigned(blocks < 2048 ? (blocks > 0 ? blocks : 1) : 2048);
}

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_TENSOR_AMAX_CUH_
