// XLA FFI handler (platform "CUDA"): mxjax_quantize_2x. x [batch, M, K] (bf16 / f16 / f32)
// -> row_data [batch, M, storage(K)], row_scales [batch, M, ceil(K/B)] (along K) and
// col_data [batch, storage(M), K], col_scales [batch, ceil(M/B), K] (along M), both from x,
// reading x once.
//
// Register tiles (K % B == 0, aligned buffers): a thread keeps B rows x V columns of x; its
// V column blocks are whole (as in quantize.cu's columns), and the B / V threads that hold
// the rest of each row block reduce its amax with shuffles, then each encodes and stores its
// own V codes of every row. Otherwise (K % B != 0): 64 x 64 tiles staged in shared memory.
#ifndef MXJAX_CUDA_KERNELS_ONLY  // tests/bench_kernels.cu: the kernels only
#include "cpu/checks.h"
#include "cuda/handlers.h"
#endif
#include "cuda/device.cuh"

namespace mxjax::cuda {
namespace {

constexpr int kTile = 64;          // tile edge: a multiple of every block size (16, 32, 64)
constexpr int kLd = kTile + 1;     // padded smem row: column walks hit 32 distinct banks

struct Problem2x {
  int64_t batch, m, k;
  int block;
  int32_t mode;
  bool vec;  // x 16-byte aligned and k a multiple of the vector width
  uint8_t *row_data, *row_scales, *col_data, *col_scales;
};

// Quantizes `block` values tile[first + i * step] (f32 bits, zero past the tensor) and stores
// the packed codes at out[pos * stride] for storage positions [pos, limit). Returns the scale.
template <class F>
MXJAX_HD uint8_t quantize_smem_block(const uint32_t* tile, int first, int step, int block,
                                       int32_t mode, uint8_t* out, int64_t stride, int64_t pos,
                                       int64_t limit) {
  uint32_t amax = 0;
  for (int i = 0; i < block; ++i) amax = umax(amax, tile[first + i * step] & kF32Abs);
  const uint8_t s = e8m0_from_amax<F>(amax, mode);
  const float inv = as_float(s == kE8M0NaN ? 0u : inv_scale_bits(s));
  for (int g = 0; g < block && pos < limit; g += 8, pos += F::bits) {
    uint32_t codes[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      codes[i] = s == kE8M0NaN ? 0u : encode_element<F>(tile[first + (g + i) * step], inv);
    }
    store_bytes(out, stride, pos, limit, pack_codes<F>(codes, 8), F::bits);
    out += F::bits * stride;
  }
  return s;
}

// Tile `id` of the launch: batch b, first row m0 and first column k0.
struct TileOrigin {
  int64_t b, m0, k0;
};

MXJAX_HD int64_t tile_count(const Problem2x& p) {
  return p.batch * cdiv(p.m, kTile) * cdiv(p.k, kTile);
}

MXJAX_HD TileOrigin tile_origin(const Problem2x& p, int64_t id) {
  const int64_t tiles_m = cdiv(p.m, kTile), tiles_k = cdiv(p.k, kTile);
  return {id / (tiles_m * tiles_k), id / tiles_k % tiles_m * kTile, id % tiles_k * kTile};
}

// Stages vector c (kVec elements of one tile row) of the tile as f32 bits; zeros outside x.
template <class In>
MXJAX_HD void stage_vector(const typename In::T* x, const Problem2x& p, TileOrigin o, int c,
                           uint32_t* tile) {
  constexpr int V = kVec<In>;
  const int r = c / (kTile / V), col = c % (kTile / V) * V;
  const int64_t gm = o.m0 + r;
  uint32_t u[V];
  load_widened<In, V>(x + (o.b * p.m + gm) * p.k, o.k0 + col, gm < p.m ? p.k : 0, p.vec, u);
  for (int i = 0; i < V; ++i) tile[r * kLd + col + i] = u[i];
}

// Task t of a staged tile: [0, tasks) are row blocks (along K), [tasks, 2 * tasks) column
// blocks (along M), tasks = kTile * kTile / block.
template <class F>
MXJAX_HD void run_task(const Problem2x& p, TileOrigin o, int t, const uint32_t* tile) {
  const int per_edge = kTile / p.block, tasks = kTile * per_edge;
  if (t < tasks) {
    const int r = t / per_edge, kb = t % per_edge;
    const int64_t gm = o.m0 + r, gk = o.k0 + kb * p.block;
    if (gm >= p.m || gk >= p.k) return;
    const int64_t storage = cdiv(p.k, F::group_codes) * F::group_bytes;
    const int64_t pos = gk * F::bits / 8;
    uint8_t* out = p.row_data + (o.b * p.m + gm) * storage + pos;
    p.row_scales[(o.b * p.m + gm) * cdiv(p.k, p.block) + gk / p.block] = quantize_smem_block<F>(
        tile, r * kLd + kb * p.block, 1, p.block, p.mode, out, 1, pos, storage);
  } else {
    const int c = (t - tasks) % kTile, mb = (t - tasks) / kTile;
    const int64_t gk = o.k0 + c, gm = o.m0 + mb * p.block;
    if (gm >= p.m || gk >= p.k) return;
    const int64_t storage = cdiv(p.m, F::group_codes) * F::group_bytes;
    const int64_t pos = gm * F::bits / 8;
    uint8_t* out = p.col_data + (o.b * storage + pos) * p.k + gk;
    p.col_scales[(o.b * cdiv(p.m, p.block) + gm / p.block) * p.k + gk] = quantize_smem_block<F>(
        tile, mb * p.block * kLd + c, kLd, p.block, p.mode, out, p.k, pos, storage);
  }
}

// One thread block per tile (grid-stride over tiles): stage, then row and column tasks
// (row tasks fill whole warps, so warps never mix the two kinds).
template <class F, class In>
__global__ void __launch_bounds__(kThreads)
quantize_2x_smem_kernel(const typename In::T* __restrict__ x, Problem2x p) {
  __shared__ uint32_t tile[kTile * kLd];
  const int tasks = kTile * (kTile / p.block);
  for (int64_t id = blockIdx.x; id < tile_count(p); id += gridDim.x) {
    const TileOrigin o = tile_origin(p, id);
    for (int c = threadIdx.x; c < kTile * kTile / kVec<In>; c += blockDim.x) {
      stage_vector<In>(x, p, o, c, tile);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < 2 * tasks; t += blockDim.x) run_task<F>(p, o, t, tile);
    __syncthreads();  // the tile is reused by the next iteration
  }
}

// ---------------------------------------------------------------------------------------
// Register tiles. Tile t = (batch b, block row jm along M, column group g of V along K);
// the L = B / V tiles of one row block are L consecutive threads of one warp.

template <class F, class In, int B, int V>
struct Plan2x {
  static constexpr int L = B / V;
  static constexpr int kInWords = raw_words<In, V>();
  static constexpr int kRowBytes = V * F::bits / 8;  // one row's codes of one tile
  static constexpr int kRowWords = (V * F::bits + 31) / 32;
  static constexpr int kRowAlign = align_of(kRowBytes) < align_of(B * F::bits / 8)
                                       ? align_of(kRowBytes) : align_of(B * F::bits / 8);
  static constexpr bool ok = V >= 2 && V % 2 == 0 && V * F::bits % 8 == 0 && L >= 1 && L <= 32 &&
                            B % V == 0;
};

// A thread's registers: the tile and the amax of each row's V elements (then of the row
// block, once reduced).
template <class F, class In, int B, int V>
struct Tile2x {
  uint32_t w[B][Plan2x<F, In, B, V>::kInWords];
  uint32_t row_amax[B];
};

// Loads tile t (zeros past M, or past the last tile) and its rows' partial amax.
template <class F, class In, int B, int V>
MXJAX_HD void tile2x_load(const typename In::T* x, const Problem2x& p, int64_t t, int64_t tiles,
                          Tile2x<F, In, B, V>& r) {
  using P = Plan2x<F, In, B, V>;
  const int64_t groups = p.k / V, nbm = cdiv(p.m, B);
  const int64_t bj = div_fast(t, groups), g = t - bj * groups;
  const int64_t b = div_fast(bj, nbm), jm = bj - b * nbm;
  const int valid = t < tiles ? int(min64(B, p.m - jm * B)) : 0;
  const typename In::T* row0 = x + (b * p.m + jm * B) * p.k + g * V;
#pragma unroll
  for (int i = 0; i < B; ++i) {
    uint32_t acc = 0;
    if (i < valid) {
      load_raw<In, V>(row0 + i * p.k, r.w[i]);
#pragma unroll
      for (int k = 0; k < P::kInWords; ++k) acc = raw_abs_max<In>(acc, r.w[i][k]);
    } else {
#pragma unroll
      for (int k = 0; k < P::kInWords; ++k) r.w[i][k] = 0;
    }
    r.row_amax[i] = raw_amax_f32<In>(acc);
  }
}

// Encodes and stores tile t given its rows' block amax: its V codes of each row (and, in
// the row block's first thread, the row scales), then its V column blocks.
template <class F, class In, int B, int V, Enc E>
MXJAX_HD void tile2x_store(const Problem2x& p, int64_t t, const Tile2x<F, In, B, V>& r) {
  using P = Plan2x<F, In, B, V>;
  const int64_t groups = p.k / V, nbm = cdiv(p.m, B);
  const int64_t bj = div_fast(t, groups), g = t - bj * groups;
  const int64_t b = div_fast(bj, nbm), jm = bj - b * nbm;
  const int valid = int(min64(B, p.m - jm * B));
  const int64_t row_storage = p.k * F::bits / 8, nbk = p.k / B;
  for (int i = 0; i < valid; ++i) {
    const int64_t gm = b * p.m + jm * B + i;
    const BlockScale s = block_scale<F>(r.row_amax[i], p.mode);
    uint32_t out[P::kRowWords];
    encode_run<F, In, E, V>(r.w[i], s, out);
    store_raw<P::kRowBytes, P::kRowAlign>(p.row_data + gm * row_storage + g * P::kRowBytes, out);
    if (g % P::L == 0) p.row_scales[gm * nbk + g / P::L] = uint8_t(s.byte);
  }
  const int64_t col_storage = cdiv(p.m, F::group_codes) * F::group_bytes;
  store_col_blocks<F, In, B, V, E>(r.w, valid, p.mode, p.k,
                                   p.col_scales + (b * nbm + jm) * p.k + g * V,
                                   p.col_data + (b * col_storage + jm * (B / F::group_codes *
                                                 F::group_bytes)) * p.k + g * V);
}

template <class F, class In, int B, int V, Enc E>
__global__ void __launch_bounds__(kThreads)
quantize_2x_tiles_kernel(const typename In::T* __restrict__ x, Problem2x p) {
  using P = Plan2x<F, In, B, V>;
  const int64_t tiles = p.batch * cdiv(p.m, B) * (p.k / V);
  const int64_t total = cdiv(tiles, 32) * 32;  // whole warps reach the shuffles
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    Tile2x<F, In, B, V> r;
    tile2x_load<F, In, B, V>(x, p, t < tiles ? t : 0, t < tiles ? tiles : 0, r);
#pragma unroll
    for (int i = 0; i < B; ++i) {
#pragma unroll
      for (int off = P::L / 2; off > 0; off /= 2) {
        r.row_amax[i] = umax(r.row_amax[i], __shfl_xor_sync(0xFFFFFFFFu, r.row_amax[i], off));
      }
    }
    if (t < tiles) tile2x_store<F, In, B, V, E>(p, t, r);
  }
}

// ---------------------------------------------------------------------------------------
// Launch (also used by tests/bench_kernels.cu with other variants).

template <class F, class In, int kTileBytes = k2xTileBytesDefault, Enc E = kEncDefault>
void launch_quantize_2x(const typename In::T* x, const Problem2x& p, int block,
                        cudaStream_t stream) {
  with_block(block, [&](auto bc) {
    constexpr int B = decltype(bc)::value;
    constexpr int V = tile_cols<In, B, kTileBytes>();
    using P = Plan2x<F, In, B, V>;
    const bool tiles_ok = P::ok && p.k % B == 0 && aligned16(x) && aligned16(p.row_data) &&
                          aligned16(p.col_data) && aligned16(p.col_scales);
    if constexpr (P::ok) {
      if (tiles_ok) {
        const int64_t tiles = p.batch * cdiv(p.m, B) * (p.k / V);
        quantize_2x_tiles_kernel<F, In, B, V, E>
            <<<grid_for(cdiv(tiles, 32) * 32), kThreads, 0, stream>>>(x, p);
        return;
      }
    }
    Problem2x q = p;
    q.vec = aligned16(x) && p.k % kVec<In> == 0;
    const int64_t n = tile_count(q);
    quantize_2x_smem_kernel<F, In><<<unsigned(n < (1 << 20) ? n : (1 << 20)), kThreads, 0,
                                      stream>>>(x, q);
  });
}

#ifndef MXJAX_CUDA_KERNELS_ONLY
ffi::Error Quantize2x(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> row_data,
                      ffi::Result<ffi::AnyBuffer> row_scales, ffi::Result<ffi::AnyBuffer> col_data,
                      ffi::Result<ffi::AnyBuffer> col_scales, int32_t format, int32_t mode,
                      int64_t block) {
  using namespace mxjax::cpu;  // shared attribute and buffer checks
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return e;
  if (!high_precision(x.element_type())) {
    return invalid("quantize_2x needs a bf16, f16 or f32 input");
  }
  auto dims = x.dimensions();
  const int64_t rank = dims.size();
  if (rank < 2) return invalid("quantize_2x needs an input of rank >= 2");
  FormatInfo info = *format_info(format);
  Problem2x p{1, dims[rank - 2], dims[rank - 1], int(block), mode, false};
  for (int64_t i = 0; i < rank - 2; ++i) p.batch *= dims[i];
  struct Check {
    const char* name;
    ffi::AnyBuffer buf;
    ffi::DataType type;
    int64_t axis, length;
  } checks[] = {
      {"row_data", *row_data, info.storage, rank - 1, info.storage_length(p.k)},
      {"row_scales", *row_scales, ffi::DataType::F8E8M0FNU, rank - 1, cdiv(p.k, block)},
      {"col_data", *col_data, info.storage, rank - 2, info.storage_length(p.m)},
      {"col_scales", *col_scales, ffi::DataType::F8E8M0FNU, rank - 2, cdiv(p.m, block)},
  };
  for (const Check& c : checks) {
    if (ffi::Error e = check_buffer(c.name, c.buf, c.type, dims, c.axis, c.length); !e.success()) {
      return e;
    }
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  p.row_data = static_cast<uint8_t*>(row_data->untyped_data());
  p.row_scales = static_cast<uint8_t*>(row_scales->untyped_data());
  p.col_data = static_cast<uint8_t*>(col_data->untyped_data());
  p.col_scales = static_cast<uint8_t*>(col_scales->untyped_data());
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    launch_quantize_2x<F, In>(static_cast<const typename In::T*>(x.untyped_data()), p,
                              int(block), stream);
  });
  return launch_status("quantize_2x");
}

#endif  // MXJAX_CUDA_KERNELS_ONLY

}  // namespace
}  // namespace mxjax::cuda

#ifndef MXJAX_CUDA_KERNELS_ONLY
XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxQuantize2xCuda, mxjax::cuda::Quantize2x,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_size"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
#endif  // MXJAX_CUDA_KERNELS_ONLY
