// Host side of the CUDA block-format handlers: the view of an operand from its dims and the
// attributes (the CPU handlers' block_view, with the same checks and messages), the buffer
// checks of the packed codes, scales and tensor scale, and the launch of the kernel that
// takes a view (block_tiles.cuh, block_panels.cuh, else block_generic.cuh).
#ifndef MXJAX_CUDA_BLOCK_LAUNCH_CUH_
#define MXJAX_CUDA_BLOCK_LAUNCH_CUH_

#include <string>
#include <type_traits>

#include "cpu/checks.h"
#include "cuda/block_device.cuh"
#include "cuda/block_generic.cuh"
#include "cuda/block_panels.cuh"
#include "cuda/block_tiles.cuh"

namespace mxjax::cuda {

// The view of an operand of dims (see BlockView) and the axis its codes are packed along
// (1-D blocks: `axis`; 2-D tiles: the last); an error for bad attributes.
inline ffi::Error block_view(ffi::AnyBuffer::Dimensions dims, int32_t format, int32_t scale,
                             int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis,
                             BlockView& v, int64_t& packed_axis) {
  using cpu::invalid;
  if (!cpu::format_info(format)) return invalid("unknown format id " + std::to_string(format));
  if (scale < 0 || scale > 3) return invalid("unknown scale format id " + std::to_string(scale));
  if (mode != 0 && mode != 1) return invalid("unknown scale_mode id " + std::to_string(mode));
  if (block_cols < 1 || block_cols > cpu::kUnitCols * 64 ||
      (block_rows != 1 && block_rows != block_cols)) {
    return invalid("block must be (1, b) or (b, b) with 1 <= b <= 32768");
  }
  const int64_t rank = dims.size();
  v = BlockView{};
  v.scale = scale, v.mode = mode;
  if (block_rows > 1) {
    if (rank < 2) return invalid("2-D blocks need an input of rank >= 2");
    v.batch = 1;
    for (int64_t i = 0; i < rank - 2; ++i) v.batch *= dims[i];
    v.rows = dims[rank - 2], v.cols = dims[rank - 1];
    v.tr = v.tc = block_cols;
    packed_axis = rank - 1;
    return ffi::Error::Success();
  }
  if (axis < 0 || axis >= rank) return invalid("axis " + std::to_string(axis) + " out of range");
  int64_t outer, n, inner;
  cpu::view3(dims, axis, outer, n, inner);
  v.batch = outer;
  if (inner == 1) {
    v.rows = 1, v.cols = n, v.tr = 1, v.tc = block_cols;
  } else {
    v.rows = n, v.cols = inner, v.tr = block_cols, v.tc = 1, v.pack_rows = true;
  }
  packed_axis = axis;
  return ffi::Error::Success();
}

// Scales: uint8 (E8M0 / E4M3 bytes) or uint32 (f32 bits), one per tile.
inline ffi::Error check_block_scales(const ffi::AnyBuffer& scales, const BlockView& v) {
  auto type = v.scale >= kScaleFP32 ? ffi::DataType::U32 : ffi::DataType::U8;
  if (scales.element_type() != type) return cpu::invalid("scales have the wrong dtype");
  if (int64_t(scales.element_count()) != v.tiles()) return cpu::invalid("scales have the wrong size");
  return ffi::Error::Success();
}

// Codes: uint8 (or, for 8-bit formats, their float8 type) of dims with the packed axis's
// length replaced by its packed storage length.
inline ffi::Error check_block_codes(const char* name, const ffi::AnyBuffer& codes,
                                    ffi::AnyBuffer::Dimensions dims, int64_t packed_axis,
                                    int32_t format) {
  const cpu::FormatInfo info = *cpu::format_info(format);
  const ffi::DataType t = codes.element_type();
  if (t != ffi::DataType::U8 && !(info.group_codes == 1 && t == info.storage)) {
    return cpu::invalid(std::string(name) + " must be uint8 (packed codes)");
  }
  return cpu::check_buffer(name, codes, t, dims, packed_axis,
                           info.storage_length(dims[packed_axis]));
}

inline ffi::Error check_tensor_scale(const ffi::AnyBuffer& ts) {
  if (ts.element_type() != ffi::DataType::U32 || ts.element_count() != 1) {
    return cpu::invalid("tensor_scale must be uint32[1] (f32 bits)");
  }
  return ffi::Error::Success();
}

// Which (format, input, rounding) the fast kernels (tiles, panels) are compiled for: bf16
// and f32 inputs, nearest even for every format, stochastic rounding for FP4 (E2M1: the
// NVFP4 / MXFP4 gradients). The rest (f16 inputs, stochastic rounding of FP6 / FP8) runs the
// generic kernel: the same bytes, slower (a thread per tile), and ~130 s less CPU to build
// (each fast kernel is ~15k unrolled SASS instructions, ~2 s of cicc + ptxas apiece).
template <class F, class In, bool kSR>
constexpr bool fast_block_kernels() {
  return fast_input<In>() && (!kSR || F::bits == 4);
}

// Which kernel quantizes a view (sr: with stochastic rounding): the tile kernel (contiguous
// tiles of 8 <= b, b a power of two), the panel kernel (b x 1 tiles along a strided axis, b
// a multiple of 8), both only where fast_block_kernels, else the generic one (kNone where no
// kernel can pack the codes: a block splits a packing group).
enum class BlockKernel { kTiles, kPanels, kGeneric, kNone };

template <class F, class In, bool kFake>
BlockKernel block_kernel_for(const BlockView& v, bool sr = false) {
  const bool fast = sr ? fast_block_kernels<F, In, true>() : fast_block_kernels<F, In, false>();
  if (fast && !v.pack_rows && TileKernel<F, In, false, kFake>::takes(v)) {
    return BlockKernel::kTiles;
  }
  if (fast && v.pack_rows && v.tc == 1 && PanelKernel<F, In, false, kFake, false>::takes(v.tr)) {
    return BlockKernel::kPanels;
  }
  return GenericKernel<F, In, kFake>::takes(v) ? BlockKernel::kGeneric : BlockKernel::kNone;
}

inline unsigned grid_of(int64_t blocks) {
  return unsigned(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
}

#if MXJAX_CUDA_DEVICE
// Enqueues the quantization (kFake: fake quantization, f32 out) of x under view v: codes and
// scales (or out); rand: stochastic-rounding bits of x's shape or nullptr (always, where
// !kMaybeSR: no kernels with stochastic rounding are compiled then); ts: [1] on the device.
// An error where no kernel takes the view.
template <class F, class In, bool kFake, bool kMaybeSR = true>
ffi::Error launch_block_quantize(cudaStream_t stream, const BlockView& v,
                                 const typename In::T* x, const uint32_t* rand,
                                 const uint32_t* ts, uint8_t* codes, void* scales,
                                 uint32_t* out) {
  const bool x_aligned = aligned16(x);
  const bool out_aligned = (!rand || aligned16(rand)) && (!out || aligned16(out));
  auto with_sr = [&](auto sr) {
    constexpr bool kSR = decltype(sr)::value;
    if constexpr (fast_block_kernels<F, In, kSR>()) {  // (only these kernels are compiled)
      if (!v.pack_rows) {
        using K = TileKernel<F, In, kSR, kFake>;
        auto a = K::make(v, x, rand, ts, x_aligned, out_aligned, codes, scales, out);
        tile_kernel<F, In, kSR, kFake><<<grid_of(a.regions), K::kThreads, 0, stream>>>(a);
      } else {
        using K = PanelKernel<F, In, kSR, kFake, false>;
        auto a = K::make(v.batch, v.rows, v.cols, int(v.tr), v.scale, v.mode, x, rand, ts,
                         x_aligned, out_aligned, codes, scales, out);
        panel_kernel<F, In, kSR, kFake, false>
            <<<grid_of(cdiv(a.panels, a.p)), a.threads(), 0, stream>>>(a);
      }
    }
  };
  const bool sr = kMaybeSR && rand;
  switch (block_kernel_for<F, In, kFake>(v, sr)) {
    case BlockKernel::kTiles:
    case BlockKernel::kPanels:
      if constexpr (kMaybeSR) {
        if (sr) {
          with_sr(std::true_type{});
          break;
        }
      }
      with_sr(std::false_type{});
      break;
    case BlockKernel::kGeneric: {
      using K = GenericKernel<F, In, kFake>;
      generic_kernel<F, In, kFake>
          <<<grid_for(v.tiles()), kThreads, 0, stream>>>(K::make(v, x, rand, ts, codes, scales, out));
      break;
    }
    case BlockKernel::kNone:
      return cpu::invalid("the CUDA block kernels need blocks of a whole number of packing "
                          "groups (" + std::to_string(F::group_codes) + " codes) along the "
                          "packed axis");
  }
  return ffi::Error::Success();
}

// launch_block_quantize<F, In, false, false> (nearest even) for a format id and x's dtype
// (bf16 / f16 / f32). Defined in block_quantize.cu, whose kernels it launches: the
// instantiations it needs are among those block_quantize.cu compiles anyway, so
// quantize_2x's two-launch path compiles no second copy of them.
ffi::Error launch_block_quantize_rn(cudaStream_t stream, int32_t format, ffi::DataType dtype,
                                    const BlockView& v, const void* x, const uint32_t* ts,
                                    uint8_t* codes, void* scales);
#endif

}  // namespace mxjax::cuda

#endif  // MXJAX_CUDA_BLOCK_LAUNCH_CUH_
