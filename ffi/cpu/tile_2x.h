// A quantize_2x tile, the same at every SIMD level (simd256_2x.h, simd512_2x.h): its largest
// size and where its outputs go.
#ifndef MXJAX_CPU_TILE_2X_H_
#define MXJAX_CPU_TILE_2X_H_

#include <cstdint>

namespace mxjax::cpu {

// The largest tile: one block of rows, 16 blocks of columns (kUnitCols of block 32).
constexpr int kTileRows = 32;
constexpr int kTileBlocks = 16;

// Where a tile's outputs go: the rowwise data and scales of the tile's first row at its first
// block (rows row_ld and scale_ld apart; `row_stream`: whole lines with streaming stores,
// through a staging buffer), the columnwise data and scales at its first column (storage
// rows col_ld apart; `col_stream`: streaming stores, which need col_data and col_scales
// aligned to the level's vectors and col_ld a multiple of their width).
struct Tile2xOut {
  uint8_t* row_data;
  int64_t row_ld;
  uint8_t* row_scales;
  int64_t scale_ld;
  bool row_stream;
  uint8_t* col_data;
  uint8_t* col_scales;
  int64_t col_ld;
  bool col_stream;
};

// The tiles a tile's second pass fetches ahead, row by row as it encodes its own (its rows
// are more streams than hardware prefetchers follow): the first elements of its thread's next
// two work units where they are whole tiles (kTileRows rows of kTileBlocks blocks, the
// tile's row stride), nullptr otherwise. The next one into L1; the one after into L2, from
// memory a whole tile's time ahead. On a Zen 4 with two threads (8192 x 8192 bf16) this made
// quantize_2x 10-19% faster for FP8 than fetching only the next tile, up to 15% for FP4 and
// about 3% for the compute-bound FP6.
struct Tile2xAhead {
  const uint16_t* next;
  const uint16_t* after;
};

// Fetches the line at `offset` elements into both tiles of `a`. Always inlined: GCC 12 finds
// a function of prefetches alone free of side effects and deletes the calls that its early
// inliner leaves (the AVX-512 tile's, from a lambda: it then fetched nothing).
__attribute__((always_inline)) inline void fetch_ahead(const Tile2xAhead& a, int64_t offset) {
  if (a.next) __builtin_prefetch(a.next + offset, 0, 3);
  if (a.after) __builtin_prefetch(a.after + offset, 0, 2);
}

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_TILE_2X_H_
