// The CUDA kernel of the block formats for the tiles the fast kernels do not take (b not a
// multiple of 8, non-power-of-two b along the contiguous axis, very large tiles): one thread
// per tile, reading it twice (amax, then codes) straight from global memory. Correct for
// every view; slow. Packed codes need whole packing groups per tile along the packed axis
// (`takes`): a group shared by two tiles would be written by two threads.
#ifndef MXJAX_CUDA_BLOCK_GENERIC_CUH_
#define MXJAX_CUDA_BLOCK_GENERIC_CUH_

#include "cuda/block_device.cuh"

namespace mxjax::cuda {

template <class F, class In, bool kFake>
struct GenericKernel {
  using T = typename In::T;
  struct Args {
    const T* x;
    const uint32_t* rand;  // bits of x's shape, or nullptr (nearest even)
    const uint32_t* ts;    // [1]: the tensor scale's f32 bits (0: none)
    BlockView v;
    int64_t storage;  // packed bytes along the packed axis
    uint8_t* codes;   // [batch, rows, storage] or (pack_rows) [batch, storage, cols]
    void* scales;     // [batch, ntr, ntc]
    uint32_t* out;    // fake_quantize
  };

  // Whether no packing group of codes straddles two tiles (always for fake_quantize).
  static bool takes(const BlockView& v) {
    return kFake || (v.pack_rows ? v.tr : v.tc) % F::group_codes == 0;
  }

  static Args make(const BlockView& v, const T* x, const uint32_t* rand, const uint32_t* ts,
                   uint8_t* codes, void* scales, uint32_t* out) {
    const int64_t n = v.pack_rows ? v.rows : v.cols;
    return {x, rand, ts, v, cdiv(n, F::group_codes) * F::group_bytes, codes, scales, out};
  }

  // The code of element i of x under its tile's scale s.
  MXJAX_HD static uint32_t code(const Args& a, int64_t i, const TileScale& s) {
    const uint32_t x = In::widen(a.x[i]);
    uint32_t c;
    if (a.rand) {
      c = s.fast ? block_encode_f32<F, true>(x, f32_value(s.m), a.rand[i])
                 : block_encode<F, true>(x, s.m, a.rand[i]);
    } else {
      c = s.fast ? block_encode_f32<F, false>(x, f32_value(s.m), 0)
                 : block_encode<F, false>(x, s.m, 0);
    }
    return s.special ? 0u : c;
  }

  MXJAX_HD static void tile(const Args& a, int64_t id) {
    const BlockView& v = a.v;
    const int64_t tc = id % v.ntc(), tr = id / v.ntc() % v.ntr(), b = id / (v.ntc() * v.ntr());
    const int64_t r0 = tr * v.tr, r1 = min64(v.rows, r0 + v.tr);
    const int64_t c0 = tc * v.tc, c1 = min64(v.cols, c0 + v.tc);
    const int64_t base = b * v.rows * v.cols;
    uint32_t amax = 0;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) amax = umax(amax, In::widen(a.x[base + r * v.cols + c]) & kF32Abs);
    }
    const ::mxjax::BlockScale bs = block_scale_of<F>(amax, v.scale, v.mode, encode_scale_sig(a.ts[0]));
    const TileScale s = tile_scale<F, kFake>(bs);
    if (kFake) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t i = base + r * v.cols + c;
          a.out[i] = decode_code<F>(code(a, i, s), s);
        }
      }
      return;
    }
    store_scale(a.scales, id, v.scale, bs.stored);
    constexpr int g = F::group_codes;
    if (!v.pack_rows) {  // groups of g codes along cols
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; c += g) {
          uint64_t w = 0;
          for (int k = 0; k < g && c + k < c1; ++k) {
            w |= uint64_t(code(a, base + r * v.cols + c + k, s)) << (k * F::bits);
          }
          uint8_t* p = a.codes + (b * v.rows + r) * a.storage + c / g * F::group_bytes;
          for (int k = 0; k < F::group_bytes; ++k) p[k] = uint8_t(w >> (8 * k));
        }
      }
      return;
    }
    for (int64_t c = c0; c < c1; ++c) {  // groups of g codes along rows
      for (int64_t r = r0; r < r1; r += g) {
        uint64_t w = 0;
        for (int k = 0; k < g && r + k < r1; ++k) {
          w |= uint64_t(code(a, base + (r + k) * v.cols + c, s)) << (k * F::bits);
        }
        for (int k = 0; k < F::group_bytes; ++k) {
          a.codes[(b * a.storage + r / g * F::group_bytes + k) * v.cols + c] = uint8_t(w >> (8 * k));
        }
      }
    }
  }
};

#if MXJAX_CUDA_DEVICE
template <class F, class In, bool kFake>
__global__ void __launch_bounds__(256) generic_kernel(const typename GenericKernel<F, In, kFake>::Args a) {
  const int64_t tiles = a.v.tiles();
  for (int64_t id = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; id < tiles;
       id += int64_t(gridDim.x) * blockDim.x) {
    GenericKernel<F, In, kFake>::tile(a, id);
  }
}
#endif

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_BLOCK_GENERIC_CUH_
