// The tiles that a tiled kernel (quantize_2x, columnwise quantize: kTileRows rows of
// kUnitCols columns each) fetches ahead as it encodes one: its rows are more streams than
// hardware prefetchers follow.
#ifndef MXJAX_CPU_TILE_AHEAD_H_
#define MXJAX_CPU_TILE_AHEAD_H_

#include <cstdint>

namespace mxjax::cpu {

// The next two work units of a thread where they are whole tiles of inputs T (their first
// inputs, nullptr otherwise; rows `ld` inputs apart). The encode passes fetch them block by
// block, from memory a whole tile's time ahead: the next tile into L1 (f32: into L2, as twice
// L1), the one after into L2. On a Zen 4 with two threads (8192 x 8192 bf16) this made
// quantize_2x 10-19% faster for FP8 than fetching only the next tile, up to 15% for FP4 and
// about 3% for the compute-bound FP6, and columnwise quantize 25-85% faster than fetching the
// next tile in its first pass. f32 / f16 tiles, narrowed to bf16 tiles first (kernels.cc,
// bf16_odd.h), are fetched from the bf16 tiles' encode passes too: fetched from their
// narrowing passes, memory idled while the tile encoded (8192 x 8192 f32, two threads, the
// fraction of the memory roofline: quantize_2x 0.54-0.86 -> 0.78-0.97 at AVX-512 and AVX2,
// columnwise 0.63-0.89 -> 0.91-0.98 at AVX2).
template <class T>
struct TileAheadOf {
  const T* next;
  const T* after;
  int64_t ld;
};

// Fetches the lines of the block of 32 inputs at row `row`, column `col` of both tiles of
// `a`. Always inlined: GCC 12 finds a function of prefetches alone free of side effects and
// deletes the calls that its early inliner leaves (the AVX-512 quantize_2x tile's, from a
// lambda: it then fetched nothing).
template <class T>
__attribute__((always_inline)) inline void fetch_ahead(const TileAheadOf<T>& a, int64_t row,
                                                       int64_t col) {
  constexpr int kNext = sizeof(T) == 2 ? 3 : 2;  // __builtin_prefetch's locality
  const int64_t at = row * a.ld + col;
  for (int b = 0; b < 32 * int(sizeof(T)); b += 64) {
    if (a.next) __builtin_prefetch(reinterpret_cast<const char*>(a.next + at) + b, 0, kNext);
    if (a.after) __builtin_prefetch(reinterpret_cast<const char*>(a.after + at) + b, 0, 2);
  }
}

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_TILE_AHEAD_H_
