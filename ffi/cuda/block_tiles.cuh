// The CUDA kernel of the block formats' tiles along the contiguous axis: 1 x b blocks along
// the last axis and b x b tiles, b a power of two with 8 <= b (quantize and fake_quantize).
//
// A thread block of 256 threads takes a region of 2048 segments (8 elements of a row):
// 2048 / TS whole tiles (TS = tr * tc / 8 segments each, <= 2048), RR tile rows of CC tiles.
// Each thread loads its 8 segments (16-byte loads, all in flight at once), a tile's amax is
// reduced with warp shuffles and in shared memory, one thread per tile makes its scale
// (block_codec.h) and stores it, and every thread encodes its segments from registers:
// x is read once. Load k of thread t is segment k * 256 + t of the region, so each load of a
// warp reads 32 neighbouring segments.
#ifndef MXJAX_CUDA_BLOCK_TILES_CUH_
#define MXJAX_CUDA_BLOCK_TILES_CUH_

#include "cuda/block_device.cuh"

namespace mxjax::cuda {

template <class F, class In, bool kSR, bool kFake>
struct TileKernel {
  using T = typename In::T;
  using Packed = PackedScale<kFake>;
  static constexpr int kThreads = 256;
  static constexpr int kK = 8;  // segments per thread
  static constexpr int kRegion = kThreads * kK;

  struct Args {
    const T* x;
    const uint32_t* rand;  // kSR: bits of x's shape
    const uint32_t* ts;    // [1]: the tensor scale's f32 bits (0: none)
    BlockView v;
    int ts_log2, cc_log2, segs_log2;  // log2 of TS, CC and tc / 8
    Divisor ntr;                      // tile rows per batch entry
    bool ragged;                      // rows % tr != 0
    int64_t tile_rows;                // batch * ntr
    int64_t regions_c, regions;       // regions per row of regions, in all
    bool vec, vec32;  // rows of x (16-byte vectors) / of rand and out (4-byte elements) aligned
    int64_t storage;  // packed bytes per row
    uint8_t* codes;   // quantize: [batch, rows, storage]
    void* scales;     // quantize: [batch, ntr, ntc]
    uint32_t* out;    // fake_quantize: f32 bits of x's shape
    MXJAX_HD int tsegs() const { return 1 << ts_log2; }
    MXJAX_HD int tiles() const { return kRegion >> ts_log2; }  // per region
    MXJAX_HD int width() const { return tsegs() < 32 ? tsegs() : 32; }  // lanes of one reduction
    MXJAX_HD int per() const { return tsegs() > kThreads ? tsegs() / kThreads : 1; }  // loads/tile
    MXJAX_HD int partials() const { return tsegs() >= kThreads ? 8 : tsegs() / width(); }  // per tile
  };

  // Whether the kernel takes the view v: b a power of two, 8 <= b, TS <= the region.
  static bool takes(const BlockView& v) {
    return !v.pack_rows && v.tc >= kSeg && pow2(v.tc) && (v.tr == 1 || v.tr == v.tc) &&
           v.tr * v.tc / kSeg <= kRegion;
  }

  static Args make(const BlockView& v, const T* x, const uint32_t* rand, const uint32_t* ts,
                   bool x_aligned, bool out_aligned, uint8_t* codes, void* scales,
                   uint32_t* out) {
    Args a{};
    a.x = x, a.rand = rand, a.ts = ts, a.v = v;
    const int64_t segs = v.tc / kSeg, tsegs = v.tr * segs;
    a.ts_log2 = Divisor(tsegs).shift, a.segs_log2 = Divisor(segs).shift;
    const int64_t nt = kRegion / tsegs;
    int64_t cc = 1;
    while (cc < nt && cc < v.ntc()) cc *= 2;
    a.cc_log2 = Divisor(cc).shift;
    a.ntr = Divisor(v.ntr());
    a.ragged = v.rows % v.tr != 0;
    a.tile_rows = v.batch * v.ntr();
    a.regions_c = cdiv(v.ntc(), cc);
    a.regions = cdiv(a.tile_rows, nt / cc) * a.regions_c;
    a.vec = x_aligned && v.cols % (16 / int64_t(sizeof(T))) == 0;
    a.vec32 = out_aligned && v.cols % 4 == 0;
    a.storage = cdiv(v.cols, F::group_codes) * F::group_bytes;
    a.codes = codes, a.scales = scales, a.out = out;
    return a;
  }

  struct State {
    Raw<In> x[kK];
    // What the lanes reduce: segment amaxes, red[k] for k a multiple of per() holding its
    // tile's (indices known at compile time: the array stays in registers).
    uint32_t red[kK];
  };

  // A region's first tile row (over batch * ntr) and tile column.
  struct Region {
    int64_t tile_row, tile_col;
  };

  MXJAX_HD static Region region(const Args& a, int64_t it) {
    const int64_t rr = a.tiles() >> a.cc_log2;
    return {it / a.regions_c * rr, it % a.regions_c << a.cc_log2};
  }

  // Where load k of thread t of region g is: its tile in the region, the tile's row index
  // over batch * ntr and column, and its first element.
  struct Loc {
    int tile;
    int64_t tile_row, tile_col, row, col;  // row: over batch * rows
    bool valid;
  };

  MXJAX_HD static Loc locate(const Args& a, const Region& g, int t, int k) {
    const int tsegs = a.tsegs();
    int tile, pos;
    if (tsegs <= kThreads) {
      tile = k * (kThreads >> a.ts_log2) + (t >> a.ts_log2), pos = t & (tsegs - 1);
    } else {
      const int per = tsegs / kThreads;  // loads per tile
      tile = k / per, pos = (k % per) * kThreads + t;
    }
    Loc l;
    l.tile = tile;
    l.tile_row = g.tile_row + (tile >> a.cc_log2);
    l.tile_col = g.tile_col + (tile & ((1 << a.cc_log2) - 1));
    const int64_t pr = pos >> a.segs_log2, pc = pos & ((1 << a.segs_log2) - 1);
    l.col = l.tile_col * a.v.tc + pc * kSeg;
    bool in_rows = l.tile_row < a.tile_rows;
    if (a.ragged) {
      const int64_t b = a.ntr.div(l.tile_row), ti = l.tile_row - b * a.v.ntr();
      in_rows = in_rows && ti * a.v.tr + pr < a.v.rows;
      l.row = b * a.v.rows + ti * a.v.tr + pr;
    } else {
      l.row = l.tile_row * a.v.tr + pr;
    }
    l.valid = in_rows && l.col < a.v.cols;
    return l;
  }

  // Phase 1: loads the thread's segments; red = what its lanes reduce.
  MXJAX_HD static void load(const Args& a, const Region& g, int t, State& st) {
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      const Loc l = locate(a, g, t, k);
      load_raw<In>(a.x + l.row * a.v.cols + l.col, l.valid ? a.v.cols - l.col : 0, a.vec, st.x[k]);
    }
#pragma unroll
    for (int k = 0; k < kK; ++k) st.red[k] = st.x[k].amax();
#pragma unroll
    for (int step = 1; step < kK; step *= 2) {  // the loads of one tile (TS > 256)
#pragma unroll
      for (int k = 0; k + step < kK; k += 2 * step) {
        if (a.per() > step) st.red[k] = umax(st.red[k], st.red[k + step]);
      }
    }
  }

  // Phase 2, after each red[k] (k a multiple of per()) holds its max over its group of
  // width() lanes: the groups' first lanes write their partial amaxes.
  MXJAX_HD static void publish(const Args& a, int t, const State& st, uint32_t* partial) {
    const int w = a.width();
    if (t % w != 0) return;
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      if (k % a.per() == 0) partial[(k / a.per() * kThreads + t) / w] = st.red[k];
    }
  }

  // Phase 3: one thread per tile makes its scale (shared memory `info`) and stores it.
  MXJAX_HD static void scales(const Args& a, const Region& g, int t, const uint32_t* partial,
                              uint32_t* info) {
    const Sig s_enc = encode_scale_sig(a.ts[0]);
    const int per = a.partials();
    for (int tile = t; tile < a.tiles(); tile += kThreads) {
      const int64_t tile_row = g.tile_row + (tile >> a.cc_log2);
      const int64_t tile_col = g.tile_col + (tile & ((1 << a.cc_log2) - 1));
      if (tile_row >= a.tile_rows || tile_col >= a.v.ntc()) continue;
      uint32_t amax = 0;
      for (int i = 0; i < per; ++i) amax = umax(amax, partial[tile * per + i]);
      const ::mxjax::BlockScale bs = block_scale_of<F>(amax, a.v.scale, a.v.mode, s_enc);
      Packed::put(info + tile * Packed::kWords, tile_scale<F, kFake>(bs));
      if (!kFake) store_scale(a.scales, tile_row * a.v.ntc() + tile_col, a.v.scale, bs.stored);
    }
  }

  // Phase 4: encodes (and, kFake, decodes) the thread's segments and stores them.
  MXJAX_HD static void encode(const Args& a, const Region& g, int t, const State& st,
                              const uint32_t* info) {
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      const Loc l = locate(a, g, t, k);
      if (!l.valid) continue;
      const int64_t first = l.row * a.v.cols + l.col, avail = a.v.cols - l.col;
      Raw<F32> rand;
      if (kSR) load_raw<F32>(a.rand + first, avail, a.vec32, rand);
      const TileScale s = Packed::get(info + l.tile * Packed::kWords);
      const Raw<In>& x = st.x[k];
      const uint64_t w = encode_segment<F, kSR>([&](int i) { return x.bits(i); }, rand, s);
      if (kFake) {
        uint32_t v[kSeg];
        decode_segment<F>(w, s, v);
        store_f32x8(a.out + first, avail, a.vec32, v);
      } else {
        const int64_t pos = l.col / kSeg * F::bits;
        store_codes<F>(a.codes + l.row * a.storage + pos, a.storage - pos, w);
      }
    }
  }
};

#if MXJAX_CUDA_DEVICE
template <class F, class In, bool kSR, bool kFake>
__global__ void __launch_bounds__(256, 3)
tile_kernel(const typename TileKernel<F, In, kSR, kFake>::Args a) {
  using K = TileKernel<F, In, kSR, kFake>;
  __shared__ uint32_t partial[K::kRegion];
  __shared__ uint32_t info[K::kRegion * K::Packed::kWords];
  for (int64_t it = blockIdx.x; it < a.regions; it += gridDim.x) {
    const typename K::Region g = K::region(a, it);
    typename K::State st;
    K::load(a, g, threadIdx.x, st);
#pragma unroll
    for (int k = 0; k < K::kK; ++k) {
      if (k % a.per() == 0) st.red[k] = group_max(st.red[k], a.width());
    }
    K::publish(a, threadIdx.x, st, partial);
    __syncthreads();
    K::scales(a, g, threadIdx.x, partial, info);
    __syncthreads();
    K::encode(a, g, threadIdx.x, st, info);
  }
}
#endif

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_BLOCK_TILES_CUH_
