// XLA FFI handler (platform "CUDA"): mxjax_block_quantize_2x, with the operands and
// attributes of the CPU handler (ffi/cpu/block_ffi.cc): x [..., M, K] (bf16 / f16 / f32) and
// tensor_scale -> row codes (packed along K) and scales (1 x b blocks along K), column codes
// (packed along M) and scales (b x 1 blocks along M), b dividing 512, nearest even. For
// 16 <= b <= 128 one kernel reads x once (block_panels.cuh, kRows; bf16 / f32 inputs);
// otherwise the rows and the columns are two launches (of block_quantize.cu's kernels:
// launch_block_quantize_rn; f16 inputs: the generic kernel, see fast_block_kernels).
#include "cuda/block_handlers.h"
#include "cuda/block_launch.cuh"

namespace mxjax::cuda {
namespace {

ffi::Error BlockQuantize2x(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer ts,
                           ffi::Result<ffi::AnyBuffer> row_codes,
                           ffi::Result<ffi::AnyBuffer> row_scales,
                           ffi::Result<ffi::AnyBuffer> col_codes,
                           ffi::Result<ffi::AnyBuffer> col_scales, int32_t format, int32_t scale,
                           int32_t mode, int64_t block_rows, int64_t block_cols, int64_t axis) {
  auto dims = x.dimensions();
  const int64_t rank = dims.size();
  if (rank < 2) return cpu::invalid("block quantize_2x needs an input of rank >= 2");
  if (!cpu::high_precision(x.element_type())) {
    return cpu::invalid("block quantize_2x needs a bf16, f16 or f32 input");
  }
  BlockView row;
  int64_t packed_axis;
  if (auto e = block_view(dims, format, scale, mode, 1, block_cols, rank - 1, row, packed_axis);
      !e.success()) {
    return e;
  }
  if (block_rows != 1 || cpu::kUnitCols % block_cols != 0) {
    return cpu::invalid("block quantize_2x takes 1-D blocks of a size dividing 512");
  }
  row.batch = 1;  // [batch, m, k] in 1 x b tiles
  for (int64_t i = 0; i < rank - 2; ++i) row.batch *= dims[i];
  row.rows = dims[rank - 2];
  BlockView col = row;  // ... and in b x 1 tiles, packed along m
  col.tr = block_cols, col.tc = 1, col.pack_rows = true;
  if (auto e = check_tensor_scale(ts); !e.success()) return e;
  if (auto e = check_block_codes("row codes", *row_codes, dims, rank - 1, format); !e.success()) {
    return e;
  }
  if (auto e = check_block_codes("column codes", *col_codes, dims, rank - 2, format);
      !e.success()) {
    return e;
  }
  if (auto e = check_block_scales(*row_scales, row); !e.success()) return e;
  if (auto e = check_block_scales(*col_scales, col); !e.success()) return e;
  if (x.element_count() == 0) return ffi::Error::Success();
  const auto* t = static_cast<const uint32_t*>(ts.untyped_data());
  auto* rc = static_cast<uint8_t*>(row_codes->untyped_data());
  auto* cc = static_cast<uint8_t*>(col_codes->untyped_data());
  ffi::Error err = ffi::Error::Success();
  dispatch(format, x.element_type(), [&](auto f, auto in) {
    using F = decltype(f);
    using In = decltype(in);
    const auto* xp = static_cast<const typename In::T*>(x.untyped_data());
    using K = PanelKernel<F, In, false, false, true>;
    if constexpr (fast_block_kernels<F, In, false>()) {  // (f16: the two launches, generic)
      if (K::takes(block_cols)) {
        auto a = K::make(col.batch, col.rows, col.cols, int(block_cols), scale, mode, xp,
                         nullptr, t, aligned16(xp), true, cc, col_scales->untyped_data(),
                         nullptr);
        a.row_codes = rc, a.row_scales = row_scales->untyped_data();
        panel_kernel<F, In, false, false, true>
            <<<grid_of(cdiv(a.panels, a.p)), a.threads(), 0, stream>>>(a);
        return;
      }
    }
    err = launch_block_quantize_rn(stream, format, x.element_type(), row, xp, t, rc,
                                   row_scales->untyped_data());
    if (err.success()) {
      err = launch_block_quantize_rn(stream, format, x.element_type(), col, xp, t, cc,
                                     col_scales->untyped_data());
    }
  });
  if (!err.success()) return err;
  return launch_status("block quantize_2x");
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxBlockQuantize2xCuda, mxjax::cuda::BlockQuantize2x,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale")
                                  .Attr<int32_t>("scale_mode")
                                  .Attr<int64_t>("block_rows")
                                  .Attr<int64_t>("block_cols")
                                  .Attr<int64_t>("axis"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
