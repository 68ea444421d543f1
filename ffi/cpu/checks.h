// Attribute and buffer checks shared by the CPU handlers: every bad input becomes an
// ffi::Error (InvalidArgument) instead of undefined behaviour.
#ifndef MXJAX_CPU_CHECKS_H_
#define MXJAX_CPU_CHECKS_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {

namespace ffi = xla::ffi;

// Storage facts of an element format id (see mxjax/formats.py).
struct FormatInfo {
  int group_codes, group_bytes;
  ffi::DataType storage;
  int64_t storage_length(int64_t n) const { return ceil_div(n, group_codes) * group_bytes; }
};

inline std::optional<FormatInfo> format_info(int32_t format) {
  switch (format) {
    case 0: return FormatInfo{1, 1, ffi::DataType::F8E4M3FN};
    case 1: return FormatInfo{1, 1, ffi::DataType::F8E5M2};
    case 2:
    case 3: return FormatInfo{4, 3, ffi::DataType::U8};
    case 4: return FormatInfo{2, 1, ffi::DataType::U8};
    default: return std::nullopt;
  }
}

inline std::optional<DType> high_precision(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return kBF16;
    case ffi::DataType::F16: return kF16;
    case ffi::DataType::F32: return kF32;
    default: return std::nullopt;
  }
}

inline ffi::Error invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("mxjax: " + what);
}

inline ffi::Error check_attrs(int32_t format, int32_t mode, int64_t block) {
  if (!format_info(format)) return invalid("unknown format id " + std::to_string(format));
  if (mode != 0 && mode != 1) return invalid("unknown scale_mode id " + std::to_string(mode));
  if (block != 16 && block != 32 && block != 64) {
    return invalid("unsupported block_size " + std::to_string(block) + " (16, 32 or 64)");
  }
  return ffi::Error::Success();
}

// `buf` has `dims` with dims[axis] replaced by `length`, and element type `type`.
inline ffi::Error check_buffer(const char* name, const ffi::AnyBuffer& buf, ffi::DataType type,
                               ffi::AnyBuffer::Dimensions dims, int64_t axis, int64_t length) {
  if (buf.element_type() != type) return invalid(std::string(name) + " has the wrong dtype");
  auto got = buf.dimensions();
  bool ok = got.size() == dims.size();
  for (size_t i = 0; ok && i < dims.size(); ++i) {
    ok = got[i] == (int64_t(i) == axis ? length : dims[i]);
  }
  return ok ? ffi::Error::Success() : invalid(std::string(name) + " has the wrong shape");
}

// The checks of an MX quantize_2x of x [..., m, k] (the CPU and CUDA handlers'): the
// attributes, x's dtype and rank, and the four results (rows along k, columns along m).
// Sets batch (the product of the leading dims), m and k.
inline ffi::Error check_quantize_2x(const ffi::AnyBuffer& x, const ffi::AnyBuffer& row_data,
                                    const ffi::AnyBuffer& row_scales,
                                    const ffi::AnyBuffer& col_data,
                                    const ffi::AnyBuffer& col_scales, int32_t format,
                                    int32_t mode, int64_t block, int64_t& batch, int64_t& m,
                                    int64_t& k) {
  if (ffi::Error e = check_attrs(format, mode, block); !e.success()) return e;
  if (!high_precision(x.element_type())) {
    return invalid("quantize_2x needs a bf16, f16 or f32 input");
  }
  auto dims = x.dimensions();
  const int64_t rank = dims.size();
  if (rank < 2) return invalid("quantize_2x needs an input of rank >= 2");
  m = dims[rank - 2], k = dims[rank - 1], batch = 1;
  for (int64_t i = 0; i < rank - 2; ++i) batch *= dims[i];
  const FormatInfo info = *format_info(format);
  struct Check {
    const char* name;
    const ffi::AnyBuffer& buf;
    ffi::DataType type;
    int64_t axis, length;
  } checks[] = {
      {"row_data", row_data, info.storage, rank - 1, info.storage_length(k)},
      {"row_scales", row_scales, ffi::DataType::F8E8M0FNU, rank - 1, ceil_div(k, block)},
      {"col_data", col_data, info.storage, rank - 2, info.storage_length(m)},
      {"col_scales", col_scales, ffi::DataType::F8E8M0FNU, rank - 2, ceil_div(m, block)},
  };
  for (const Check& c : checks) {
    if (ffi::Error e = check_buffer(c.name, c.buf, c.type, dims, c.axis, c.length); !e.success()) {
      return e;
    }
  }
  return ffi::Error::Success();
}

// Splits dims into [outer, dims[axis], inner].
inline void view3(ffi::AnyBuffer::Dimensions dims, int64_t axis, int64_t& outer, int64_t& n,
                  int64_t& inner) {
  outer = inner = 1;
  for (int64_t i = 0; i < int64_t(dims.size()); ++i) {
    if (i < axis) outer *= dims[i];
    if (i > axis) inner *= dims[i];
  }
  n = dims[axis];
}

// The RHT's attribute `signs` (n = its length, a power of two in [2, 256]; entries +-1) as
// n sign masks (rht.h) and the factor c = f32(1 / sqrt(n)); an error for bad ones.
inline ffi::Error rht_signs(ffi::Span<const float> signs, std::vector<uint32_t>& masks,
                            float& c) {
  const int64_t n = int64_t(signs.size());
  if (n < 2 || n > 256 || (n & (n - 1))) {
    return invalid("the RHT's signs must number a power of two in [2, 256]");
  }
  masks.clear();
  for (float s : signs) {
    if (s != 1.0f && s != -1.0f) return invalid("the RHT's signs must be +1 or -1");
    masks.push_back(s < 0 ? 0x80000000u : 0u);
  }
  c = float(1.0 / std::sqrt(double(n)));
  return ffi::Error::Success();
}

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_CHECKS_H_
