// The CUDA kernel of the block formats' b x 1 tiles along a strided axis (x viewed as
// [outer, n, inner], b a multiple of 8, b <= 2048): quantize, fake_quantize, and
// quantize_2x, whose 1 x b tiles along inner come from the same registers (kRows).
//
// A panel is one tile row (b rows) of W = 8 * CS columns (CS a power of two); a thread block
// takes P panels. Thread (panel, q, cs) loads rows [8q, 8q + 8) of the panel's columns
// [8cs, 8cs + 8) (eight 16-byte loads in flight; neighbouring threads read neighbouring
// columns), writes its 8 column amaxes (kRows: and its 8 row-segment amaxes) to shared
// memory, one thread per column (per row tile) makes the scale from there, and every
// thread encodes its 8 x 8 elements from registers: codes packed along n are 8 codes =
// F::bits bytes per column, stored as F::bits rows of 8 bytes. x is read once.
#ifndef MXJAX_CUDA_BLOCK_PANELS_CUH_
#define MXJAX_CUDA_BLOCK_PANELS_CUH_

#include "cuda/block_device.cuh"

namespace mxjax::cuda {

template <class F, class In, bool kSR, bool kFake, bool kRows>
struct PanelKernel {
  using T = typename In::T;
  using Packed = PackedScale<kFake>;
  static constexpr int kMaxThreads = 256;
  // Shared memory, in words: column partial amaxes, column scales, row-segment amaxes and
  // row-tile scales (kRows; b >= 16, so at most 1024 of each), and the panels' origins.
  static constexpr int kColInfo = kRows ? 1024 * Packed::kWords : 2048 * Packed::kWords;
  static constexpr int kRowSeg = kRows ? 2048 : 1;
  static constexpr int kRowInfo = kRows ? 1024 * Packed::kWords : 1;
  static constexpr int kOrigin = kRows ? 4 : 2;  // int64 per panel (Origin)
  static constexpr int kOrigins = (kRows ? 128 : 256) * kOrigin;

  struct Args {
    const T* x;
    const uint32_t* rand;  // kSR: bits of x's shape
    const uint32_t* ts;    // [1]: the tensor scale's f32 bits (0: none)
    int64_t outer, n, inner;
    int b, gr, cs_log2, p;  // tile rows; threads per column (b / 8); log2(CS); panels
    int32_t scale, mode;
    int64_t nb, nch, panels;  // tile rows ceil(n / b), chunks ceil(inner / W), panels in all
    bool vec, vec32;          // rows of x / of rand and out aligned for vector access
    int64_t storage_n;        // codes: [outer, storage_n, inner] (packed along n)
    uint8_t* codes;
    void* scales;    // [outer, nb, inner]
    uint32_t* out;   // fake_quantize: f32 bits of x's shape
    int64_t storage_k;   // kRows: row codes [outer, n, storage_k], scales [outer, n, nbk]
    uint8_t* row_codes;
    void* row_scales;
    MXJAX_HD int cs() const { return 1 << cs_log2; }
    MXJAX_HD int w() const { return kSeg << cs_log2; }
    MXJAX_HD int threads() const { return gr * cs() * p; }
    MXJAX_HD int64_t nbk() const { return cdiv(inner, b); }
  };

  static bool takes(int64_t b) {
    return b % kSeg == 0 && b / kSeg <= kMaxThreads &&
           (!kRows || (b >= 16 && b <= 128 && pow2(b)));
  }

  // kRows: W a multiple of b.
  static Args make(int64_t outer, int64_t n, int64_t inner, int b, int32_t scale, int32_t mode,
                   const T* x, const uint32_t* rand, const uint32_t* ts, bool x_aligned,
                   bool out_aligned, uint8_t* codes, void* scales, uint32_t* out) {
    Args a{};
    a.x = x, a.rand = rand, a.ts = ts, a.outer = outer, a.n = n, a.inner = inner;
    a.b = b, a.gr = b / kSeg, a.scale = scale, a.mode = mode;
    // Column segments: the smallest power of two covering inner (kRows: whole row tiles),
    // at most what 256 threads hold.
    const int64_t want = kRows ? cdiv(inner, b) * a.gr : cdiv(inner, kSeg);
    int cs = 1;
    while (cs < want && a.gr * cs * 2 <= kMaxThreads) cs *= 2;
    a.cs_log2 = Divisor(cs).shift;
    a.p = kMaxThreads / (a.gr * cs);
    if (kRows && a.p > 128) a.p = 128;  // (kOrigins)
    a.nb = cdiv(n, b), a.nch = cdiv(inner, a.w()), a.panels = outer * a.nb * a.nch;
    a.vec = x_aligned && inner % (16 / int64_t(sizeof(T))) == 0;
    a.vec32 = out_aligned && inner % 4 == 0;
    a.storage_n = cdiv(n, F::group_codes) * F::group_bytes;
    a.storage_k = cdiv(inner, F::group_codes) * F::group_bytes;
    a.codes = codes, a.scales = scales, a.out = out;
    return a;
  }

  // A panel: its tile row over outer * nb (-1: no panel), column chunk, and (kRows) its
  // first row over outer * n and within its outer entry.
  struct Origin {
    int64_t tile_row, ch, row, row_in;
  };

  MXJAX_HD static Origin origin(const Args& a, int64_t id) {
    if (id >= a.panels) return {-1, 0, 0, 0};
    const int64_t tr = id / a.nch, ch = id - tr * a.nch, o = tr / a.nb, j = tr - o * a.nb;
    return {tr, ch, o * a.n + j * a.b, j * a.b};
  }

  MXJAX_HD static void put_origin(int64_t* s, const Origin& o) {
    s[0] = o.tile_row, s[1] = o.ch;
    if (kRows) s[2] = o.row, s[3] = o.row_in;
  }
  MXJAX_HD static Origin get_origin(const int64_t* s) {
    return {s[0], s[1], kRows ? s[2] : 0, kRows ? s[3] : 0};
  }

  // The thread's place: panel p of the thread block, rows [8q, 8q + 8) of the panel,
  // columns [8cs, 8cs + 8) of the panel's chunk.
  struct State {
    Raw<In> x[kSeg];  // rows
    int p, q, cs;
    int64_t tile_row, o, r0, c0;  // tile row over outer * nb (-1: none), outer index, first
    int64_t first;                // row (in [0, n)) and column; index of that element
  };

  // Phase 1: loads 8 rows x 8 columns; writes the column amaxes (kRows: row amaxes) and the
  // panel's origin.
  MXJAX_HD static void load(const Args& a, int64_t it, int t, State& st, uint32_t* colpart,
                            uint32_t* rowseg, int64_t* origins) {
    st.cs = t & (a.cs() - 1);
    st.q = (t >> a.cs_log2) % a.gr;
    st.p = (t >> a.cs_log2) / a.gr;
    const int64_t id = it * a.p + st.p;
    const int64_t tr = id / a.nch, ch = id - tr * a.nch, o = tr / a.nb, j = tr - o * a.nb;
    st.tile_row = id < a.panels ? tr : -1;
    st.o = o;
    st.r0 = j * a.b + st.q * kSeg;
    st.c0 = ch * a.w() + st.cs * kSeg;
    st.first = (o * a.n + st.r0) * a.inner + st.c0;
    if (st.q == 0 && st.cs == 0) put_origin(origins + st.p * kOrigin, origin(a, id));
    const int64_t avail = st.tile_row >= 0 ? a.inner - st.c0 : 0;
#pragma unroll
    for (int r = 0; r < kSeg; ++r) {
      load_raw<In>(a.x + st.first + r * a.inner, st.r0 + r < a.n ? avail : 0, a.vec, st.x[r]);
    }
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      uint32_t m = 0;
#pragma unroll
      for (int r = 0; r < kSeg; ++r) m = umax(m, st.x[r].bits(i) & kF32Abs);
      colpart[t * kSeg + i] = m;
    }
    if (kRows) {
#pragma unroll
      for (int r = 0; r < kSeg; ++r) {
        rowseg[((st.p * a.b) + st.q * kSeg + r) * a.cs() + st.cs] = st.x[r].amax();
      }
    }
  }

  // Phase 2: one thread per column (kRows: and per row tile) of each panel makes its scale.
  MXJAX_HD static void scales(const Args& a, int t, const uint32_t* colpart,
                              const uint32_t* rowseg, const int64_t* origins, uint32_t* colinfo,
                              uint32_t* rowinfo) {
    const Sig s_enc = encode_scale_sig(a.ts[0]);
    const int w = a.w(), wl = a.cs_log2 + 3;
    for (int c = t; c < a.p * w; c += a.threads()) {
      const int pp = c >> wl, col = c & (w - 1);
      const Origin o = get_origin(origins + pp * kOrigin);
      if (o.tile_row < 0 || o.ch * w + col >= a.inner) continue;
      uint32_t amax = 0;
      for (int q = 0; q < a.gr; ++q) amax = umax(amax, colpart[((pp * a.gr + q) << wl) + col]);
      const ::mxjax::BlockScale bs = block_scale_of<F>(amax, a.scale, a.mode, s_enc);
      Packed::put(colinfo + c * Packed::kWords, tile_scale<F, kFake>(bs));
      if (!kFake) store_scale(a.scales, o.tile_row * a.inner + o.ch * w + col, a.scale, bs.stored);
    }
    if (!kRows) return;
    const int tiles = w / a.b;  // row tiles per panel row, a power of two
    const int tl = floor_log2_u32(uint32_t(tiles));
    for (int e = t; e < a.p * w; e += a.threads()) {
      const int pp = e >> wl, r = (e & (w - 1)) >> tl, tt = e & (tiles - 1);
      const Origin o = get_origin(origins + pp * kOrigin);
      const int64_t tcol = o.ch * tiles + tt;
      if (o.tile_row < 0 || o.row_in + r >= a.n || tcol >= a.nbk()) continue;
      uint32_t amax = 0;
      for (int u = 0; u < a.gr; ++u) {
        amax = umax(amax, rowseg[(pp * a.b + r) * a.cs() + tt * a.gr + u]);
      }
      const ::mxjax::BlockScale bs = block_scale_of<F>(amax, a.scale, a.mode, s_enc);
      Packed::put(rowinfo + e * Packed::kWords, tile_scale<F, kFake>(bs));
      store_scale(a.row_scales, (o.row + r) * a.nbk() + tcol, a.scale, bs.stored);
    }
  }

  // Phase 3: encodes the thread's 8 x 8 elements along n (and, kRows, along inner).
  MXJAX_HD static void encode(const Args& a, const State& st, const uint32_t* colinfo,
                              const uint32_t* rowinfo) {
    if (st.tile_row < 0 || st.r0 >= a.n || st.c0 >= a.inner) return;
    const int64_t avail = a.inner - st.c0;
    const uint32_t* info = colinfo + ((st.p << (a.cs_log2 + 3)) + st.cs * kSeg) * Packed::kWords;
    bool fast = true;  // every column's scale takes the f32 path (columns past inner: none)
#pragma unroll
    for (int i = 0; i < kSeg; ++i) fast = fast && (i >= avail || Packed::get(info + i * Packed::kWords).fast);
    uint64_t cw[kSeg];  // column i's codes, row r's at bit r * F::bits
    if (fast) {
      encode_columns<true>(a, st, info, avail, cw);
    } else {
      encode_columns<false>(a, st, info, avail, cw);
    }
    if constexpr (!kFake) {
      const int64_t br0 = st.r0 / kSeg * F::bits;  // storage row along n
#pragma unroll
      for (int k = 0; k < F::bits; ++k) {
        if (br0 + k < a.storage_n) {
          store_n<8>(a.codes + (st.o * a.storage_n + br0 + k) * a.inner + st.c0, avail,
                     byte_row(cw, k));
        }
      }
      if (kRows) encode_rows(a, st, rowinfo);
    }
  }

  // The column codes of the thread's 8 x 8 elements, a row at a time (kFake: their values,
  // stored row by row); kFast: every column's scale takes the f32 path.
  template <bool kFast>
  MXJAX_HD static void encode_columns(const Args& a, const State& st, const uint32_t* info,
                                      int64_t avail, uint64_t (&cw)[kSeg]) {
    Sig m[kSeg], d[kSeg];  // (exact path)
    float mf[kSeg], df[kSeg];  // (f32 path)
    uint32_t special = 0;  // bit i: column i's block holds NaN / Inf
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {  // columns past inner (codes dropped) take column 0's
      const TileScale s = Packed::get(info + (i < avail ? i : 0) * Packed::kWords);
      special |= uint32_t(s.special) << i;
      if (kFast) {
        mf[i] = f32_value(s.m), df[i] = f32_value(s.d);
      } else {
        m[i] = s.m, d[i] = s.d;
      }
      cw[i] = 0;
    }
#pragma unroll
    for (int r = 0; r < kSeg; ++r) {
      if (st.r0 + r >= a.n) break;  // (zero codes)
      const int64_t first = st.first + r * a.inner;
      Raw<F32> rand;
      if (kSR) load_raw<F32>(a.rand + first, avail, a.vec32, rand);
      uint32_t v[kSeg];
#pragma unroll
      for (int i = 0; i < kSeg; ++i) {
        const uint32_t x = st.x[r].bits(i), bits = kSR ? rand.w[i] : 0u;
        uint32_t code = kFast ? block_encode_f32<F, kSR>(x, mf[i], bits)
                              : block_encode<F, kSR>(x, m[i], bits);
        code = (special >> i) & 1u ? 0u : code;
        cw[i] |= uint64_t(code) << (r * F::bits);
        if (kFake) {
          v[i] = kFast ? as_bits(mul_rn(as_float(grid_value_bits<F>(code)), df[i]))
                       : block_decode<F>(code, d[i], Sig{0, 0});
          v[i] = (special >> i) & 1u ? kF32QNaN : v[i];
        }
      }
      if (kFake) store_f32x8(a.out + first, avail, a.vec32, v);
    }
  }

  // kRows: the codes of the thread's 8 rows along inner.
  MXJAX_HD static void encode_rows(const Args& a, const State& st, const uint32_t* rowinfo) {
    const int tiles = a.w() / a.b;
    const int64_t pos = st.c0 / kSeg * F::bits;
    const int64_t row0 = st.o * a.n + st.r0;  // over outer * n
#pragma unroll
    for (int r = 0; r < kSeg; ++r) {
      if (st.r0 + r >= a.n) continue;
      const int e = (st.p << (a.cs_log2 + 3)) + (st.q * kSeg + r) * tiles + st.cs / a.gr;
      const TileScale s = Packed::get(rowinfo + e * Packed::kWords);
      const uint64_t code =
          encode_segment<F, false>([&](int i) { return st.x[r].bits(i); }, Raw<F32>{}, s);
      store_codes<F>(a.row_codes + (row0 + r) * a.storage_k + pos, a.storage_k - pos, code);
    }
  }
};

#if MXJAX_CUDA_DEVICE
template <class F, class In, bool kSR, bool kFake, bool kRows>
__global__ void __launch_bounds__(256, 2)
panel_kernel(const typename PanelKernel<F, In, kSR, kFake, kRows>::Args a) {
  using K = PanelKernel<F, In, kSR, kFake, kRows>;
  __shared__ uint32_t colpart[K::kMaxThreads * kSeg];
  __shared__ uint32_t colinfo[K::kColInfo];
  __shared__ uint32_t rowseg[K::kRowSeg];
  __shared__ uint32_t rowinfo[K::kRowInfo];
  __shared__ int64_t origins[K::kOrigins];
  const int64_t iters = cdiv(a.panels, a.p);
  for (int64_t it = blockIdx.x; it < iters; it += gridDim.x) {
    typename K::State st;
    K::load(a, it, threadIdx.x, st, colpart, rowseg, origins);
    __syncthreads();
    K::scales(a, threadIdx.x, colpart, rowseg, origins, colinfo, rowinfo);
    __syncthreads();
    K::encode(a, st, colinfo, rowinfo);
  }
}
#endif

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_BLOCK_PANELS_CUH_
