// The tiles that a tiled kernel (quantize_2x, columnwise quantize: kTileRows rows of
// kUnitCols columns each) fetches ahead as it encodes one: its rows are more streams than
// hardware prefetchers follow.
#ifndef MXJAX_CPU_TILE_AHEAD_H_
#define MXJAX_CPU_TILE_AHEAD_H_

#include <cstdint>

namespace mxjax::cpu {

// The first elements of the next two work units of a thread where they are whole tiles
// (kTileRows rows of kUnitCols columns, the tile's row stride), nullptr otherwise. The next
// one is fetched into L1, the one after into L2, from memory a whole tile's time ahead. On a
// Zen 4 with two threads (8192 x 8192 bf16) this made quantize_2x 10-19% faster for FP8 than
// fetching only the next tile, up to 15% for FP4 and about 3% for the compute-bound FP6, and
// columnwise quantize 25-85% faster than fetching the next tile in its first pass.
// Of a tile of T (the bf16 tiles' TileAhead; f32 / f16 inputs: kernels.cc, bf16_odd.h).
template <class T>
struct TileAheadOf {
  const T* next;
  const T* after;
};
using TileAhead = TileAheadOf<uint16_t>;

// Fetches the line at `offset` elements into both tiles of `a`. Always inlined: GCC 12 finds
// a function of prefetches alone free of side effects and deletes the calls that its early
// inliner leaves (the AVX-512 quantize_2x tile's, from a lambda: it then fetched nothing).
__attribute__((always_inline)) inline void fetch_ahead(const TileAhead& a, int64_t offset) {
  if (a.next) __builtin_prefetch(a.next + offset, 0, 3);
  if (a.after) __builtin_prefetch(a.after + offset, 0, 2);
}

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_TILE_AHEAD_H_
