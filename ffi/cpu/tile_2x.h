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

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_TILE_2X_H_
