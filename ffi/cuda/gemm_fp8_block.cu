// XLA FFI handler (platform "CUDA"): mxjax_fp8_block_gemm, an FP8 GEMM with FP32 block
// scales (DeepSeek-V3 / TransformerEngine Float8BlockScaling) on Hopper tensor cores through
// cuBLASLt (scale modes CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F and BLK128x128_32F).
//
//   a         [..., K]          float8_e4m3fn / float8_e5m2, quantized along K in 1x128 blocks
//   a_scales  [..., L]          f32 decode scales (value = code * scale), L = ceil(K / 128),
//                               compact row-major: a_scales[m, j] covers a[m, 128j : 128j+128]
//   b         [N, K]            float8 (the weight; out = a . b^T, "NT" in row-major terms)
//   b_scales  [N, L]            b_block_rows == 1: 1x128 blocks along K, as a's
//             [ceil(N/128), L]  b_block_rows == 128: 128x128 tiles, b_scales[t, j] covers
//                               b[128t : 128t+128, 128j : 128j+128]
//   out       [..., N]          bf16 / f16 / f32: out[m, n] = sum_j a_scales[m, j] *
//                               b_scales[., j] * sum_{k in block j} a[m, k] * b[n, k]
//   workspace [W] u8            scratch result (the caller drops it): the scales in
//                               cuBLASLt's layout, then cuBLASLt's workspace (all the rest;
//                               mxjax.fp8_block_gemm.scratch_bytes gives 32 MiB).
//   attribute b_block_rows      int64: 1 or 128.
//
// Layouts: fp8_block_scales.h (the compact layout above is relaid into cuBLASLt's by two
// small kernels, skipped where they coincide). Row-major out = a . b^T is column-major
// out^T = b . a^T: cuBLASLt's A is our b (TRANSA = T, K x N, ld K), its B our a (K x M,
// ld K), D our out (N x M, ld N), the "TN" layout cuBLASLt's FP8 kernels require; so A's
// scale mode is b's (VEC128_32F or BLK128x128_32F) and B's is VEC128_32F.
//
// Numerics (cuBLAS docs; TransformerEngine's reference of this GEMM): each 128-wide K block
// is multiplied on the FP8 tensor cores and its partial sum promoted to an f32 accumulator
// as acc = fma(partial * s1, s2, acc), s1 / s2 the two block scales: s1 is a's where b's
// are 2-D, b's where both are 1-D (so partial * s1 can overflow f32 for a block amax above
// about FLT_MAX / 2^16 even where the product is finite).
// FAST_ACCUM must stay 0 (cuBLASLt refuses these scale modes with it).
//
// Refusals (never a crash): compute capability other than 9.x (the scale modes exist only
// on 9.0, per the cuBLAS docs' "Scaling Mode Support Overview"; Blackwell 10.x runs MXFP8,
// mxjax_mx_gemm, instead), cuBLASLt older than 12.9 at build or run time, no cuBLASLt
// header at build time, E5M2 x E5M2 (no such cuBLASLt FP8 kernel), and shapes outside
// M % 8 == 0, N % 8 == 0, K % 16 == 0 (FP8 operands need 16-byte aligned leading
// dimensions; the scale layouts need M, N multiples of 4; bf16 / f16 rows of out need
// N % 8; TransformerEngine requires M % 8 for a 1-D scaled B as well). Each message names
// its rule. NOT RUN YET: written and compiled without a GPU (ffi/cuda/tests/
// gpu_check_fp8_gemm.py checks it on a Hopper GPU).
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/cublaslt_api.h"
#include "cuda/device.cuh"
#include "cuda/fp8_block_scales.h"
#include "cuda/handlers.h"

namespace mxjax::cuda {
namespace {

__global__ void relayout_vec128_kernel(const uint32_t* __restrict__ in, int64_t rows,
                                       int64_t cols, uint32_t* __restrict__ out) {
  const int64_t total = vec128_elements(rows, cols);
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total;
       o += int64_t(gridDim.x) * blockDim.x) {
    out[o] = in[vec128_source(o, rows, cols)];
  }
}

__global__ void relayout_blk128_kernel(const uint32_t* __restrict__ in, int64_t rows,
                                       int64_t cols, uint32_t* __restrict__ out) {
  const int64_t total = blk128_elements(rows, cols);
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = blk128_source(o, cols);
    out[o] = s < 0 ? 0u : in[s];
  }
}

}  // namespace

void relayout_vec128(const uint32_t* in, int64_t rows, int64_t cols, uint32_t* out,
                     cudaStream_t stream) {
  relayout_vec128_kernel<<<grid_for(vec128_elements(rows, cols)), kThreads, 0, stream>>>(
      in, rows, cols, out);
}

void relayout_blk128(const uint32_t* in, int64_t rows, int64_t cols, uint32_t* out,
                     cudaStream_t stream) {
  relayout_blk128_kernel<<<grid_for(blk128_elements(rows, cols)), kThreads, 0, stream>>>(
      in, rows, cols, out);
}

namespace {

constexpr const char* kName = "mxjax_fp8_block_gemm";
constexpr int64_t kAlignM = 8, kAlignN = 8, kAlignK = 16;

ffi::Error invalid(const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(kName) + ": " + what);
}
ffi::Error unimplemented(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented, std::string(kName) + ": " + what);
}

bool is_fp8(ffi::DataType t) {
  return t == ffi::DataType::F8E4M3FN || t == ffi::DataType::F8E5M2;
}

std::string shape_str(int64_t m, int64_t n, int64_t k) {
  return "M=" + std::to_string(m) + ", N=" + std::to_string(n) + ", K=" + std::to_string(k);
}

#if defined(MXJAX_HAVE_CUBLASLT) && CUBLAS_VERSION >= 120900

constexpr size_t kMinCublasLt = 120900;  // first cuBLASLt with VEC128_32F / BLK128x128_32F
constexpr uintptr_t kScratchAlign = 256;

uintptr_t align_up(uintptr_t p, uintptr_t a) { return (p + a - 1) / a * a; }

// The largest power of two (<= 256) dividing the address: cuBLASLt's alignment preferences.
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

cudaDataType_t cuda_type(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F8E4M3FN: return CUDA_R_8F_E4M3;
    case ffi::DataType::F8E5M2: return CUDA_R_8F_E5M2;
    case ffi::DataType::BF16: return CUDA_R_16BF;
    case ffi::DataType::F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
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

// What selects an algorithm: device, shape, types, b's scale mode, pointer alignments and
// the workspace limit. The heuristic's choice is kept per key (it costs host time per call).
using AlgoKey = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, int, uint32_t,
                           uint32_t, uint32_t, size_t>;

struct AlgoCache {
  std::mutex mu;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
};

AlgoCache& algo_cache() {
  static AlgoCache* cache = new AlgoCache();  // never destroyed (used until process exit)
  return *cache;
}

struct Call {
  int device;
  const void *a, *b, *sa, *sb;
  void* out;
  cudaDataType_t ta, tb, tout;
  bool b_2d;
  int64_t m, n, k;
  void* workspace;
  size_t workspace_bytes;
};

// out [m, n] (row-major) = a [m, k] . b [n, k]^T with scales in cuBLASLt's layouts.
ffi::Error run_matmul(const CublasLt& lt, cublasLtHandle_t handle, cudaStream_t stream,
                      const Call& c) {
  Descriptors ds{lt};
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const char* failed = nullptr;
  auto check = [&](cublasStatus_t s, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_SUCCESS) { st = s; failed = what; }
  };
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value, const char* what) {
    check(lt.MatmulDescSetAttribute(ds.op, attr, &value, sizeof(value)), what);
  };
  check(lt.MatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  if (st == CUBLAS_STATUS_SUCCESS) {
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    const int32_t mode_a = c.b_2d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                  : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int8_t fast_accum = 0;
    set(CUBLASLT_MATMUL_DESC_TRANSA, trans, "TRANSA");
    set(CUBLASLT_MATMUL_DESC_TRANSB, no_trans, "TRANSB");
    set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum, "FAST_ACCUM");
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_a, "A_SCALE_MODE");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_b, "B_SCALE_MODE");
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, c.sb, "A_SCALE_POINTER");  // cuBLASLt's A: our b
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, c.sa, "B_SCALE_POINTER");
  }
  check(lt.MatrixLayoutCreate(&ds.a, c.tb, c.k, c.n, c.k), "A layout");
  check(lt.MatrixLayoutCreate(&ds.b, c.ta, c.k, c.m, c.k), "B layout");
  check(lt.MatrixLayoutCreate(&ds.d, c.tout, c.n, c.m, c.n), "D layout");
  const uint32_t align_a = alignment_of(c.b), align_b = alignment_of(c.a);
  const uint32_t align_d = alignment_of(c.out);
  const AlgoKey key{c.device, c.m, c.n, c.k, int(c.ta), int(c.tb), int(c.tout), int(c.b_2d),
                    align_a, align_b, align_d, c.workspace_bytes};
  cublasLtMatmulAlgo_t algo;
  bool have_algo = false;
  {
    std::lock_guard<std::mutex> lock(algo_cache().mu);
    auto it = algo_cache().algos.find(key);
    if (it != algo_cache().algos.end()) { algo = it->second; have_algo = true; }
  }
  if (!have_algo && st == CUBLAS_STATUS_SUCCESS) {
    check(lt.MatmulPreferenceCreate(&ds.pref), "cublasLtMatmulPreferenceCreate");
    auto pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
      if (st == CUBLAS_STATUS_SUCCESS) {
        check(lt.MatmulPreferenceSetAttribute(ds.pref, attr, &value, sizeof(value)),
              "preference");
      }
    };
    const uint64_t ws = c.workspace_bytes;
    pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      check(lt.MatmulAlgoGetHeuristic(handle, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1,
                                      &heuristic, &found),
            "cublasLtMatmulAlgoGetHeuristic");
    }
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) {
      return ffi::Error::Internal(
          std::string(kName) + ": cuBLASLt has no FP8 block-scaled algorithm for " +
          shape_str(c.m, c.n, c.k) + " (its heuristic returned none)");
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      algo = heuristic.algo;
      std::lock_guard<std::mutex> lock(algo_cache().mu);
      algo_cache().algos.emplace(key, algo);
    }
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    const float alpha = 1.0f, beta = 0.0f;  // C = D with beta 0: D is written, never read
    check(lt.Matmul(handle, ds.op, &alpha, c.b, ds.a, c.a, ds.b, &beta, c.out, ds.d, c.out, ds.d,
                    &algo, c.workspace, c.workspace_bytes, stream),
          "cublasLtMatmul");
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    return ffi::Error::Internal(std::string(kName) + ": cuBLASLt " + failed + ": " +
                                lt.GetStatusString(st) + " (" + shape_str(c.m, c.n, c.k) + ")");
  }
  return ffi::Error::Success();
}

#endif  // MXJAX_HAVE_CUBLASLT && CUBLAS_VERSION >= 120900

ffi::Error Fp8BlockGemm(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scales,
                        ffi::AnyBuffer b, ffi::AnyBuffer b_scales, int64_t b_block_rows,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace) {
  // Operand contract (the Python wrapper checks the same, with the same words).
  auto ad = a.dimensions(), bd = b.dimensions(), od = out->dimensions();
  if (ad.size() < 2 || bd.size() != 2 || od.size() != ad.size()) {
    return invalid("needs a [..., K], b [N, K] and out [..., N]");
  }
  const int64_t k = ad.back(), n = bd[0];
  int64_t m = 1;
  for (size_t i = 0; i + 1 < ad.size(); ++i) m *= ad[i];
  bool same_lead = true;
  for (size_t i = 0; i + 1 < ad.size(); ++i) same_lead &= od[i] == ad[i];
  if (bd[1] != k || od.back() != n || !same_lead) {
    return invalid("shapes do not match a [..., K] . b [N, K]^T -> out [..., N]");
  }
  if (!is_fp8(a.element_type()) || !is_fp8(b.element_type())) {
    return invalid("a and b must be float8_e4m3fn or float8_e5m2");
  }
  if (a.element_type() == ffi::DataType::F8E5M2 && b.element_type() == ffi::DataType::F8E5M2) {
    return invalid("a and b are both float8_e5m2: cuBLASLt has no E5M2 x E5M2 FP8 GEMM "
                   "(make one of them float8_e4m3fn)");
  }
  const auto to = out->element_type();
  if (to != ffi::DataType::BF16 && to != ffi::DataType::F16 && to != ffi::DataType::F32) {
    return invalid("out must be bfloat16, float16 or float32 (cuBLASLt's block-scaled FP8 "
                   "GEMM writes no other type)");
  }
  if (b_block_rows != 1 && b_block_rows != kFp8Block) {
    return invalid("b_block_rows must be 1 (1x128 blocks) or 128 (128x128 tiles), got " +
                   std::to_string(b_block_rows));
  }
  const bool b_2d = b_block_rows == kFp8Block;
  const int64_t l = fp8_blocks(k), b_rows = b_2d ? fp8_blocks(n) : n;
  auto sad = a_scales.dimensions(), sbd = b_scales.dimensions();
  bool a_scales_ok = a_scales.element_type() == ffi::DataType::F32 && sad.size() == ad.size() &&
                     sad.back() == l;
  for (size_t i = 0; a_scales_ok && i + 1 < ad.size(); ++i) a_scales_ok = sad[i] == ad[i];
  if (!a_scales_ok) return invalid("a_scales must be float32 [..., ceil(K/128)] next to a");
  if (b_scales.element_type() != ffi::DataType::F32 || sbd.size() != 2 || sbd[0] != b_rows ||
      sbd[1] != l) {
    return invalid(b_2d ? "b_scales must be float32 [ceil(N/128), ceil(K/128)] (128x128 tiles)"
                        : "b_scales must be float32 [N, ceil(K/128)] (1x128 blocks)");
  }
  if (workspace->element_type() != ffi::DataType::U8 || workspace->dimensions().size() != 1) {
    return invalid("the workspace result must be uint8 [W]");
  }
  // cuBLASLt's rules for this GEMM (cuBLAS docs: FP8 "Tensor Core Usage" alignment,
  // "Scaling factors layouts"; TransformerEngine's checks of the same call).
  if (m % kAlignM != 0 || n % kAlignN != 0 || k % kAlignK != 0) {
    return invalid("cuBLASLt's FP8 block-scaled GEMM needs M % 8 == 0, N % 8 == 0 and "
                   "K % 16 == 0 (16-byte aligned FP8 rows, scale layouts of M, N multiples "
                   "of 4, 16-byte rows of out); got " + shape_str(m, n, k));
  }

  int device = 0, major = 0, minor = 0;
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess && cudaGetDevice(&device) != cudaSuccess) {
    return ffi::Error::Internal(std::string(kName) + ": cannot tell the stream's device");
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (ffi::Error e = launch_status("device query"); !e.success()) return e;
  if (major != 9) {
    return unimplemented(
        "FP8 GEMM with 1x128 / 128x128 FP32 block scales needs compute capability 9.x "
        "(Hopper): cuBLASLt's VEC128_32F / BLK128x128_32F scale modes run on 9.0 only "
        "(Blackwell, 10.x, has MXFP8 instead: mxjax_mx_gemm); this GPU is sm_" +
        std::to_string(major * 10 + minor));
  }
#if !defined(MXJAX_HAVE_CUBLASLT)
  return unimplemented("mxjax was built without the cuBLASLt headers (cublasLt.h from the "
                       "CUDA toolkit or the nvidia-cublas wheel)");
#elif CUBLAS_VERSION < 120900
  return unimplemented("mxjax was built with cuBLASLt headers " + std::to_string(CUBLAS_VERSION) +
                       ", older than 12.9 (120900), the first with VEC128_32F / "
                       "BLK128x128_32F block scales");
#else
  std::string error;
  const CublasLt* lt = cublaslt(&error);
  if (!lt) return ffi::Error::Internal(error);
  const size_t version = lt->GetVersion();
  if (version < kMinCublasLt) {
    return unimplemented("the loaded cuBLASLt is " + std::to_string(version) +
                         ", older than 12.9 (120900), the first with VEC128_32F / "
                         "BLK128x128_32F block scales");
  }
  if (!aligned16(a.untyped_data()) || !aligned16(b.untyped_data()) ||
      !aligned16(out->untyped_data()) || !aligned16(a_scales.untyped_data()) ||
      !aligned16(b_scales.untyped_data())) {
    return invalid("operands must be 16-byte aligned (cuBLASLt FP8 rule)");
  }
  if (m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {  // empty sum
    if (cudaMemsetAsync(out->untyped_data(), 0, out->size_bytes(), stream) != cudaSuccess) {
      return launch_status("memset");
    }
    return ffi::Error::Success();
  }
  cublasLtHandle_t handle = cublaslt_handle(*lt, device, &error);
  if (!handle) return ffi::Error::Internal(error);

  // Scratch: a's scales, b's scales in cuBLASLt's layouts (or the operands themselves
  // where the layouts coincide), then cuBLASLt's workspace (the rest).
  const auto* sa_in = static_cast<const uint32_t*>(a_scales.untyped_data());
  const auto* sb_in = static_cast<const uint32_t*>(b_scales.untyped_data());
  const bool move_a = l > 1, move_b = b_2d ? l % 4 != 0 : l > 1;
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  const uintptr_t end = base + workspace->size_bytes();
  uintptr_t p = align_up(base, kScratchAlign);
  uint32_t* sa = nullptr;
  uint32_t* sb = nullptr;
  if (move_a) {
    sa = reinterpret_cast<uint32_t*>(p);
    p = align_up(p + vec128_elements(m, l) * 4, kScratchAlign);
  }
  if (move_b) {
    sb = reinterpret_cast<uint32_t*>(p);
    p = align_up(p + (b_2d ? blk128_elements(b_rows, l) : vec128_elements(n, l)) * 4,
                 kScratchAlign);
  }
  if (p > end) {
    return invalid("the workspace result is too small for the relaid scales (" +
                   std::to_string(workspace->size_bytes()) + " bytes)");
  }
  if (move_a) relayout_vec128(sa_in, m, l, sa, stream);
  if (move_b && b_2d) relayout_blk128(sb_in, b_rows, l, sb, stream);
  if (move_b && !b_2d) relayout_vec128(sb_in, n, l, sb, stream);
  if (ffi::Error e = launch_status("scale relayout"); !e.success()) return e;

  Call call{device,
            a.untyped_data(),
            b.untyped_data(),
            move_a ? sa : sa_in,
            move_b ? sb : sb_in,
            out->untyped_data(),
            cuda_type(a.element_type()),
            cuda_type(b.element_type()),
            cuda_type(to),
            b_2d,
            m,
            n,
            k,
            reinterpret_cast<void*>(p),
            size_t(end - p)};
  return run_matmul(*lt, handle, stream, call);
#endif
}

}  // namespace
}  // namespace mxjax::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(MxjaxFp8BlockGemmCuda, mxjax::cuda::Fp8BlockGemm,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()   // a
                                  .Arg<xla::ffi::AnyBuffer>()   // a_scales
                                  .Arg<xla::ffi::AnyBuffer>()   // b
                                  .Arg<xla::ffi::AnyBuffer>()   // b_scales
                                  .Attr<int64_t>("b_block_rows")
                                  .Ret<xla::ffi::AnyBuffer>()   // out
                                  .Ret<xla::ffi::AnyBuffer>());  // workspace (scratch)
