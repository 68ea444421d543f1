// Block amaxes for the block-scaled kernels (block_kernels.cc, compiled once per SIMD
// level): the largest magnitude of each tile of a work unit, as f32 bits. Magnitudes are
// compared in the input's own width (a bf16 or f16 magnitude orders as its value, NaN above
// Inf), and only each tile's largest is widened to f32 bits. Whole units of narrow tiles
// reduce in registers: GCC's vector extensions, lowered to the level's registers.
#ifndef MXJAX_CPU_AMAX_TILES_H_
#define MXJAX_CPU_AMAX_TILES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels.h"
#include "mxjax/quantize.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {
namespace {

using cpu::ceil_div;
using std::size_t;

// Magnitudes in the input's own width, ordered as their values (NaN above Inf), and their
// f32 bits: a block's amax is reduced on them.
template <class In>
struct Mag;
template <>
struct Mag<BF16> {
  using M = uint16_t;
  static M of(uint16_t h) { return uint16_t(h & 0x7FFFu); }
  static uint32_t f32(M m) { return uint32_t(m) << 16; }
};
template <>
struct Mag<F16> {
  using M = uint16_t;
  static M of(uint16_t h) { return uint16_t(h & 0x7FFFu); }
  static uint32_t f32(M m) { return f16_to_f32(m); }
};
template <>
struct Mag<F32> {
  using M = uint32_t;
  static M of(uint32_t b) { return b & kF32Abs; }
  static uint32_t f32(M m) { return m; }
};

template <class M>
M mmax(M a, M b) {
  return a > b ? a : b;
}

// out[i] = max(in[2i], in[2i + 1]) for i < n.
template <class M>
__attribute__((noinline)) void halve(int64_t n, const M* __restrict in, M* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = mmax(in[2 * i], in[2 * i + 1]);
}

// The level's vector register as GCC's vector extension (of M lanes).
using cpu::kVecBytes;
template <class M>
using Vec __attribute__((vector_size(kVecBytes))) = M;

// Lanes kFirst, kFirst + 2, ... of the concatenation a:b (as many as a has). nvcc's front
// end (ffi/cuda/tests/block_host_check.cu includes these kernels) rejects a pack expansion
// in __builtin_shufflevector: there, lane by lane.
template <size_t kFirst, class V, size_t... I>
V every_other(V a, V b, std::index_sequence<I...>) {
#ifdef __CUDACC__
  constexpr size_t n = sizeof...(I);
  return V{(kFirst + 2 * I < n ? a[kFirst + 2 * I] : b[kFirst + 2 * I - n])...};
#else
  return __builtin_shufflevector(a, b, (kFirst + 2 * I)...);
#endif
}
template <class V, class Idx>
V evens(V a, V b, Idx idx) {
  return every_other<0>(a, b, idx);
}
template <class V, class Idx>
V odds(V a, V b, Idx idx) {
  return every_other<1>(a, b, idx);
}

// One level of unit_tile_amax's tree over v[0, kN): v[j] = max of the deinterleaved pair
// v[2j], v[2j + 1] (v[0] with itself where kN is 1), each tile's lanes halved; then the
// levels below, down to one lane per tile (kPerTile lanes a tile now).
template <int kN, int kPerTile, class V, class Idx>
inline void tile_tree(V* v, Idx idx) {
  if constexpr (kPerTile > 1) {
#pragma GCC unroll 16
    for (int j = 0; j < (kN + 1) / 2; ++j) {
      const V a = v[2 * j], b = kN > 1 ? v[2 * j + 1] : v[2 * j];
      const V e = evens(a, b, idx), o = odds(a, b, idx);
      v[j] = e > o ? e : o;
    }
    tile_tree<(kN + 1) / 2, kPerTile / 2>(v, idx);
  }
}

// The amax (f32 bits) of each kTC-column tile of a whole unit (kUnitCols columns) of
// `rows` rows (x at its first element, rows `ld` apart) in registers: the rows' magnitudes
// reduced vector by vector, then a tree of maxes of deinterleaved vector pairs (each level
// halves the lanes per tile, keeping the tiles in order) down to one lane per tile.
template <class In, int kTC>
void unit_tile_amax(const typename In::T* x, int64_t ld, int64_t rows, uint32_t* amax) {
  using M = typename Mag<In>::M;
  using V = Vec<M>;
  constexpr int kLanes = kVecBytes / sizeof(M), kVecs = cpu::kUnitCols / kLanes;
  // Lines 8 KiB ahead (the next batch of units) asked for early: the hardware prefetcher
  // alone leaves this, the first pass over x, waiting on memory.
  constexpr int64_t kAhead = 8192 / int64_t(sizeof(typename In::T));
  const M mask = M(sizeof(M) == 2 ? 0x7FFFu : kF32Abs);
  V v[kVecs];
#pragma GCC unroll 64
  for (int i = 0; i < kVecs; ++i) {
    if (i % (64 / kVecBytes) == 0) __builtin_prefetch(x + i * kLanes + kAhead);
    std::memcpy(&v[i], x + i * kLanes, kVecBytes);
    v[i] &= mask;
  }
  for (int64_t r = 1; r < rows; ++r) {
#pragma GCC unroll 64
    for (int i = 0; i < kVecs; ++i) {
      if (i % (64 / kVecBytes) == 0) __builtin_prefetch(x + r * ld + i * kLanes + kAhead);
      V a;
      std::memcpy(&a, x + r * ld + i * kLanes, kVecBytes);
      a &= mask;
      v[i] = v[i] > a ? v[i] : a;
    }
  }
  tile_tree<kVecs, kTC>(v, std::make_index_sequence<kLanes>{});
  constexpr int kTiles = cpu::kUnitCols / kTC;
  M out[kVecs * kLanes];
  std::memcpy(out, v, sizeof(V) * ((kTiles + kLanes - 1) / kLanes));
  for (int j = 0; j < kTiles; ++j) amax[j] = Mag<In>::f32(out[j]);
}

// The amax (f32 bits) of each tc-column tile of `width` columns (at most kUnitCols where tc
// is 1 or kTC 16 / 32) of `rows` rows (x at the first element, rows `ld` apart): per
// column (tc 1), or reduced over the rows column by column and then halved kTC-wide, or
// tile by tile.
template <class In, int kTC>
void tile_amax(const typename In::T* x, int64_t ld, int64_t rows, int64_t width, int64_t tc,
               uint32_t* amax) {
  using T = typename In::T;
  using M = typename Mag<In>::M;
  const int64_t tiles = ceil_div(width, tc);
  if (tc == 1 || kTC > 1) {
    alignas(64) M a[cpu::kUnitCols], h[cpu::kUnitCols / 2];
    const int64_t n = tiles * (kTC > 1 ? kTC : 1);  // <= kUnitCols
    for (int64_t c = 0; c < n; ++c) a[c] = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict row = x + r * ld;
      M* __restrict acc = a;
      for (int64_t c = 0; c < width; ++c) acc[c] = mmax(acc[c], Mag<In>::of(row[c]));
    }
    const M* out = a;
    if constexpr (kTC > 1) {
      for (int64_t len = n; len > tiles; len /= 2) {
        M* dst = out == a ? h : a;
        halve(len / 2, out, dst);
        out = dst;
      }
    }
    for (int64_t j = 0; j < tiles; ++j) amax[j] = Mag<In>::f32(out[j]);
    return;
  }
  for (int64_t j = 0; j < tiles; ++j) {
    const int64_t c0 = j * tc, n = min64(tc, width - c0);
    M m = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict tile = x + r * ld + c0;
      for (int64_t c = 0; c < n; ++c) m = mmax(m, Mag<In>::of(tile[c]));
    }
    amax[j] = Mag<In>::f32(m);
  }
}

}  // namespace
}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CPU_AMAX_TILES_H_
