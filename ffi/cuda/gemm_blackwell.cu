// XLA FFI handler (platform "CUDA"): mxjax_mx_gemm, an MXFP8 GEMM on Blackwell tensor cores
// through cuBLASLt block scaling (CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0).
//
//   a        [..., K]   f8 (e4m3 / e5m2), quantized along K (block 32)
//   a_scales [..., K/32] e8m0, compact (mxjax's storage)
//   b        [N, K]     f8, quantized along K (the weight, "NT": out = a . b^T)
//   b_scales [N, K/32]  e8m0
//   out      [..., N]   bf16 / f16 / f32 = sum_k a*2^ea * b*2^eb, f32 accumulation
//
// The scales are swizzled into the 128x4 layout (scale_swizzle.h) in scratch memory first.
// Row-major out = a . b^T is column-major out^T = b . a^T, so cuBLASLt's A is our b (TRANSA
// = T, K x N, ld K), its B our a (K x M, ld K) and D our out (N x M, ld N): the "TN" layout
// cuBLASLt's FP8 kernels require. Needs compute capability >= 10.0; on Hopper (9.x, FP8
// tensor cores without block scales) it returns an error and callers use the dequantize +
// dot path. NOT RUN YET: written and compiled without a Blackwell GPU.
#include <string>

#include "cuda/cublaslt_api.h"
#include "cuda/device.cuh"
#include "cuda/handlers.h"
#include "cuda/scale_swizzle.h"

namespace mxjax::cuda {
namespace {

constexpr int64_t kMxBlock = 32;  // cuBLASLt VEC32_UE8M0: one scale per 32 elements along K

ffi::Error invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("mxjax_mx_gemm: " + what);
}

// Compute capability major.minor of the stream's device.
ffi::Error device_of(cudaStream_t stream, int& device, int& major, int& minor) {
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess && cudaGetDevice(&device) != cudaSuccess) {
    return ffi::Error::Internal("mxjax_mx_gemm: cannot tell the stream's device");
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return launch_status("device query");
}

#ifdef MXJAX_HAVE_CUBLASLT

constexpr size_t kWorkspaceBytes = 32 << 20;  // cuBLASLt's advice for Hopper / Blackwell
constexpr size_t kScratchAlign = 256;

std::optional<cudaDataType_t> cuda_type(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F8E4M3FN: return CUDA_R_8F_E4M3;
    case ffi::DataType::F8E5M2: return CUDA_R_8F_E5M2;
    case ffi::DataType::BF16: return CUDA_R_16BF;
    case ffi::DataType::F16: return CUDA_R_16F;
    case ffi::DataType::F32: return CUDA_R_32F;
    default: return std::nullopt;
  }
}

// Owns the cuBLASLt descriptors of one call.
struct Descriptors {
  const CublasLt& lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) lt.MatmulPreferenceDestroy(pref);
    for (auto* l : {a, b, d}) if (l) lt.MatrixLayoutDestroy(l);
    if (op) lt.MatmulDescDestroy(op);
  }
};

// out [m, n] (row-major) = a [m, k] . b [n, k]^T with swizzled VEC32 scales sa, sb.
ffi::Error run_matmul(const CublasLt& lt, cublasLtHandle_t handle, cudaStream_t stream,
                      const void* a, cudaDataType_t ta, const void* sa, const void* b,
                      cudaDataType_t tb, const void* sb, void* out, cudaDataType_t tout,
                      int64_t m, int64_t n, int64_t k, void* workspace) {
  Descriptors ds{lt};
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  auto check = [&](cublasStatus_t s) { if (st == CUBLAS_STATUS_SUCCESS) st = s; };
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
    check(lt.MatmulDescSetAttribute(ds.op, attr, &value, sizeof(value)));
  };
  check(lt.MatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (st == CUBLAS_STATUS_SUCCESS) {
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    set(CUBLASLT_MATMUL_DESC_TRANSA, trans);
    set(CUBLASLT_MATMUL_DESC_TRANSB, no_trans);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sb);  // cuBLASLt's A is our b
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sa);
  }
  check(lt.MatrixLayoutCreate(&ds.a, tb, k, n, k));
  check(lt.MatrixLayoutCreate(&ds.b, ta, k, m, k));
  check(lt.MatrixLayoutCreate(&ds.d, tout, n, m, n));
  check(lt.MatmulPreferenceCreate(&ds.pref));
  if (st == CUBLAS_STATUS_SUCCESS) {
    const uint64_t ws = kWorkspaceBytes;
    check(lt.MatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof(ws)));
  }
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    check(lt.MatmulAlgoGetHeuristic(handle, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &heuristic,
                                    &found));
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    const float alpha = 1.0f, beta = 0.0f;  // C = D with beta 0: D is written, never read
    check(lt.Matmul(handle, ds.op, &alpha, b, ds.a, a, ds.b, &beta, out, ds.d, out, ds.d,
                    &heuristic.algo, workspace, kWorkspaceBytes, stream));
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    return ffi::Error::Internal(std::string("mxjax_mx_gemm: cuBLASLt: ") + lt.GetStatusString(st) +
                                " (m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                                ", k=" + std::to_string(k) + ")");
  }
  return ffi::Error::Success();
}

#endif  // MXJAX_HAVE_CUBLASLT

ffi::Error MxGemm(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer a,
                  ffi::AnyBuffer a_scales, ffi::AnyBuffer b, ffi::AnyBuffer b_scales,
                  ffi::Result<ffi::AnyBuffer> out) {
  auto ad = a.dimensions(), bd = b.dimensions(), od = out->dimensions();
  if (ad.size() < 2 || bd.size() != 2 || od.size() != ad.size()) {
    return invalid("needs a [..., K], b [N, K] and out [..., N]");
  }
  const int64_t k = ad.back(), n = bd[0], m = k == 0 ? 0 : a.element_count() / k;
  if (bd[1] != k || od.back() != n || out->element_count() != m * n) {
    return invalid("shapes do not match a [..., K] . b [N, K]^T -> out [..., N]");
  }
  if (k % kMxBlock != 0) return invalid("K must be a multiple of 32 (MXFP8 block size)");
  if (a_scales.element_type() != ffi::DataType::F8E8M0FNU ||
      b_scales.element_type() != ffi::DataType::F8E8M0FNU ||
      a_scales.element_count() != m * (k / kMxBlock) ||
      b_scales.element_count() != n * (k / kMxBlock) ||
      a_scales.dimensions().back() != k / kMxBlock || b_scales.dimensions().back() != k / kMxBlock) {
    return invalid("scales must be e8m0 [..., K/32] next to their data");
  }
  int device = 0, major = 0, minor = 0;
  if (ffi::Error e = device_of(stream, device, major, minor); !e.success()) return e;
  if (major < 10) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "mxjax_mx_gemm: block-scaled MXFP8 GEMM needs compute capability >= 10.0 "
                      "(Blackwell); this GPU is sm_" + std::to_string(major * 10 + minor) +
                      " (Hopper has FP8 tensor cores but no block scales): dequantize and dot");
  }
#ifndef MXJAX_HAVE_CUBLASLT
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "mxjax_mx_gemm: mxjax was built without the cuBLASLt headers");
#else
  auto ta = cuda_type(a.element_type()), tb = cuda_type(b.element_type());
  auto tout = cuda_type(out->element_type());
  if (!ta || !tb || *ta == CUDA_R_16BF || *ta == CUDA_R_16F || *ta == CUDA_R_32F ||
      *tb == CUDA_R_16BF || *tb == CUDA_R_16F || *tb == CUDA_R_32F) {
    return invalid("a and b must be float8_e4m3fn or float8_e5m2");
  }
  if (!tout || *tout == CUDA_R_8F_E4M3 || *tout == CUDA_R_8F_E5M2) {
    return invalid("out must be bf16, f16 or f32");
  }
  if (m == 0 || n == 0) return ffi::Error::Success();
  std::string error;
  const CublasLt* lt = cublaslt(&error);
  if (!lt) return ffi::Error::Internal(error);
  cublasLtHandle_t handle = cublaslt_handle(*lt, device, &error);
  if (!handle) return ffi::Error::Internal(error);

  // Scratch: swizzled scales of a (m rows) and b (n rows), then the cuBLASLt workspace.
  const int64_t kb = k / kMxBlock;
  auto sa = scratch.Allocate(swizzled_bytes(m, kb), kScratchAlign);
  auto sb = scratch.Allocate(swizzled_bytes(n, kb), kScratchAlign);
  auto ws = scratch.Allocate(kWorkspaceBytes, kScratchAlign);
  if (!sa || !sb || !ws) return ffi::Error::Internal("mxjax_mx_gemm: scratch allocation failed");
  swizzle_scales(static_cast<const uint8_t*>(a_scales.untyped_data()), m, kb,
                 static_cast<uint8_t*>(*sa), stream);
  swizzle_scales(static_cast<const uint8_t*>(b_scales.untyped_data()), n, kb,
                 static_cast<uint8_t*>(*sb), stream);
  if (ffi::Error e = launch_status("scale swizzle"); !e.success()) return e;
  return run_matmul(*lt, handle, stream, a.untyped_data(), *ta, *sa, b.untyped_data(), *tb, *sb,
                    out->untyped_data(), *tout, m, n, k, *ws);
#endif
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxMxGemmCuda, mxjax::cuda::MxGemm,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::ScratchAllocator>()
                                  .Arg<xla::ffi::AnyBuffer>()   // a
                                  .Arg<xla::ffi::AnyBuffer>()   // a_scales
                                  .Arg<xla::ffi::AnyBuffer>()   // b
                                  .Arg<xla::ffi::AnyBuffer>()   // b_scales
                                  .Ret<xla::ffi::AnyBuffer>());  // out
