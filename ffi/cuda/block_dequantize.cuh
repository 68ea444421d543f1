// The CUDA kernels of mxjax_block_dequantize (block_dequantize.cu): codes packed along the
// contiguous axis (1 x b, b x b tiles): a thread decodes 4 segments of 8 codes (F::bits bytes
// in, 32 bytes out each); packed along a strided axis (b x 1 tiles): a thread decodes 8 rows
// x 8 columns (F::bits rows of 8 bytes in). Any tile shape.
#ifndef MXJAX_CUDA_BLOCK_DEQUANTIZE_CUH_
#define MXJAX_CUDA_BLOCK_DEQUANTIZE_CUH_

#include "cuda/block_device.cuh"

namespace mxjax::cuda {

// The tensor scale dequantize divides by: its Sig (sig 0: none) and f32 (1 for none).
struct DivScale {
  Sig ts;
  float tsf;
};

MXJAX_HD DivScale div_scale(const uint32_t* ts, bool apply) {
  const uint32_t bits = apply ? ts[0] : 0u;
  const Sig s = bits ? sig_of_bits(bits) : Sig{0, 0};
  return {s, s.sig ? f32_value(s) : 1.0f};
}

// Codes packed along cols: out [batch, rows, cols] from codes [batch, rows, storage]. A
// thread block takes a region of RR lines (rows over batch * rows) x CC segments.
template <class F>
struct DequantizeRows {
  static constexpr int kThreads = 256, kK = 4, kRegion = kThreads * kK;
  struct Args {
    const uint8_t* codes;
    const void* scales;
    const uint32_t* ts;
    bool apply;
    BlockView v;
    int64_t storage, lines, segs;  // packed bytes per line, lines, segments per line
    Divisor rows, tr, tc;
    bool ragged;     // rows % tr != 0
    bool tc8;        // tc a multiple of 8: a segment's codes share one scale
    int cc_log2;     // log2(CC)
    int64_t regions_c, regions;
    bool vec32;  // out rows 16-byte aligned
    uint32_t* out;
  };

  static Args make(const BlockView& v, const uint8_t* codes, const void* scales,
                   const uint32_t* ts, bool apply, uint32_t* out) {
    Args a{};
    a.codes = codes, a.scales = scales, a.ts = ts, a.apply = apply, a.v = v, a.out = out;
    a.storage = cdiv(v.cols, F::group_codes) * F::group_bytes;
    a.lines = v.batch * v.rows, a.segs = cdiv(v.cols, kSeg);
    a.rows = Divisor(v.rows), a.tr = Divisor(v.tr), a.tc = Divisor(v.tc);
    a.ragged = v.rows % v.tr != 0, a.tc8 = v.tc % kSeg == 0;
    int64_t cc = 1;
    while (cc < kRegion && cc < a.segs) cc *= 2;
    a.cc_log2 = Divisor(cc).shift;
    a.regions_c = cdiv(a.segs, cc);
    a.regions = cdiv(a.lines, kRegion / cc) * a.regions_c;
    a.vec32 = aligned16(out) && v.cols % 4 == 0;
    return a;
  }

  // Index of the scale of element `col` of `line`.
  MXJAX_HD static int64_t scale_index(const Args& a, int64_t line, int64_t col) {
    int64_t tile_row = a.tr.div(line);
    if (a.ragged) {
      const int64_t b = a.rows.div(line), r = line - b * a.v.rows;
      tile_row = b * a.v.ntr() + a.tr.div(r);
    }
    return tile_row * a.v.ntc() + a.tc.div(col);
  }

  MXJAX_HD static void run(const Args& a, int64_t it, int t) {
    const int64_t cc = int64_t{1} << a.cc_log2, rr = kRegion >> a.cc_log2;
    const int64_t line0 = it / a.regions_c * rr, seg0 = (it % a.regions_c) << a.cc_log2;
    int64_t line[kK], col[kK];
    uint64_t w[kK];
    uint32_t stored[kK];
#pragma unroll
    for (int k = 0; k < kK; ++k) {  // every load first
      const int local = k * kThreads + t;
      line[k] = line0 + (local >> a.cc_log2);
      col[k] = (seg0 + (local & (cc - 1))) * kSeg;
      const bool valid = line[k] < a.lines && col[k] < a.v.cols;
      const int64_t pos = col[k] / kSeg * F::bits;
      w[k] = load_codes<F>(a.codes + line[k] * a.storage + pos, valid ? a.storage - pos : 0);
      stored[k] = valid && a.tc8 ? load_scale(a.scales, scale_index(a, line[k], col[k]), a.v.scale)
                                 : 0u;
      if (!valid) line[k] = -1;
    }
    const DivScale ts = div_scale(a.ts, a.apply);
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      if (line[k] < 0) continue;
      uint32_t v[kSeg];
      if (a.tc8) {
        const StoredScale s = stored_scale<F>(stored[k], a.v.scale, ts.ts);
#pragma unroll
        for (int i = 0; i < kSeg; ++i) v[i] = decode_stored<F>(unpack_code<F>(w[k], i), s, ts.ts, ts.tsf);
      } else {
        for (int i = 0; i < kSeg; ++i) {
          const int64_t c = min64(col[k] + i, a.v.cols - 1);
          const StoredScale s = stored_scale<F>(
              load_scale(a.scales, scale_index(a, line[k], c), a.v.scale), a.v.scale, ts.ts);
          v[i] = decode_stored<F>(unpack_code<F>(w[k], i), s, ts.ts, ts.tsf);
        }
      }
      store_f32x8(a.out + line[k] * a.v.cols + col[k], a.v.cols - col[k], a.vec32, v);
    }
  }
};

// Codes packed along rows (b x 1 tiles): out [outer, n, inner] from codes
// [outer, storage, inner]. Thread: 8 rows (a row group) x 8 columns (a segment); a thread
// block takes RR row groups x CC segments.
template <class F>
struct DequantizeCols {
  static constexpr int kThreads = 256;
  struct Args {
    const uint8_t* codes;
    const void* scales;
    const uint32_t* ts;
    bool apply;
    int64_t outer, n, inner, b, nb;
    int64_t storage, groups, segs;  // packed rows, row groups per outer, segments per row
    Divisor group_div;
    int cc_log2;
    int64_t regions_c, regions;
    int32_t scale;
    bool vec32;
    uint32_t* out;
  };

  static Args make(const BlockView& v, const uint8_t* codes, const void* scales,
                   const uint32_t* ts, bool apply, uint32_t* out) {
    Args a{};
    a.codes = codes, a.scales = scales, a.ts = ts, a.apply = apply, a.out = out;
    a.outer = v.batch, a.n = v.rows, a.inner = v.cols, a.b = v.tr, a.nb = v.ntr();
    a.scale = v.scale;
    a.storage = cdiv(v.rows, F::group_codes) * F::group_bytes;
    a.groups = cdiv(v.rows, kSeg), a.segs = cdiv(v.cols, kSeg);
    a.group_div = Divisor(a.groups);
    int64_t cc = 1;
    while (cc < kThreads && cc < a.segs) cc *= 2;
    a.cc_log2 = Divisor(cc).shift;
    a.regions_c = cdiv(a.segs, cc);
    a.regions = cdiv(a.outer * a.groups, kThreads / cc) * a.regions_c;
    a.vec32 = aligned16(out) && v.cols % 4 == 0;
    return a;
  }

  MXJAX_HD static void run(const Args& a, int64_t it, int t) {
    const int64_t cc = int64_t{1} << a.cc_log2, rr = kThreads >> a.cc_log2;
    const int64_t rg = it / a.regions_c * rr + (t >> a.cc_log2);
    const int64_t c0 = (it % a.regions_c * cc + (t & (cc - 1))) * kSeg;
    if (rg >= a.outer * a.groups || c0 >= a.inner) return;
    const int64_t o = a.group_div.div(rg), g = rg - o * a.groups, avail = a.inner - c0;
    uint64_t rows[kSeg];  // storage row k of the 8 columns
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      const int64_t br = g * F::bits + k;
      rows[k] = k < F::bits && br < a.storage
                    ? load_n<8>(a.codes + (o * a.storage + br) * a.inner + c0, avail)
                    : 0;
    }
    const bool one_tile = a.b % kSeg == 0;  // the 8 rows share their tile row
    uint32_t stored[kSeg];
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      stored[i] = one_tile && i < avail
                      ? load_scale(a.scales, (o * a.nb + g * kSeg / a.b) * a.inner + c0 + i, a.scale)
                      : 0u;
    }
    const DivScale ts = div_scale(a.ts, a.apply);
    uint64_t codes[kSeg];  // column i's 8 codes
#pragma unroll
    for (int i = 0; i < kSeg; ++i) codes[i] = byte_row(rows, i);
    StoredScale s[kSeg];
#pragma unroll
    for (int i = 0; i < kSeg; ++i) s[i] = stored_scale<F>(stored[i], a.scale, ts.ts);
#pragma unroll
    for (int r = 0; r < kSeg; ++r) {
      const int64_t row = g * kSeg + r;
      if (row >= a.n) break;
      uint32_t v[kSeg];
#pragma unroll
      for (int i = 0; i < kSeg; ++i) {
        StoredScale si = s[i];
        if (!one_tile) {
          const int64_t c = min64(c0 + i, a.inner - 1);
          si = stored_scale<F>(load_scale(a.scales, (o * a.nb + row / a.b) * a.inner + c, a.scale),
                               a.scale, ts.ts);
        }
        v[i] = decode_stored<F>(unpack_code<F>(codes[i], r), si, ts.ts, ts.tsf);
      }
      store_f32x8(a.out + (o * a.n + row) * a.inner + c0, avail, a.vec32, v);
    }
  }
};

#if MXJAX_CUDA_DEVICE
template <class K>
__global__ void __launch_bounds__(256) dequantize_blocks_kernel(const typename K::Args a) {
  for (int64_t it = blockIdx.x; it < a.regions; it += gridDim.x) K::run(a, it, threadIdx.x);
}
#endif

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_BLOCK_DEQUANTIZE_CUH_
