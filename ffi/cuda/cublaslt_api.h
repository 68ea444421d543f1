// cuBLASLt entry points, loaded at run time with dlopen so that the module imports (and the
// quantize kernels run) on machines without libcublasLt; only mxjax_mx_gemm needs it. The
// header comes from the CUDA toolkit or the `nvidia-cublas` wheel (CMake adds its include
// dir); without it MXJAX_HAVE_CUBLASLT stays undefined and the GEMM reports so at run time.
#ifndef MXJAX_CUDA_CUBLASLT_API_H_
#define MXJAX_CUDA_CUBLASLT_API_H_

#if __has_include(<cublasLt.h>)
#define MXJAX_HAVE_CUBLASLT 1
#include <cublasLt.h>

#include <string>

namespace mxjax::cuda {

#define MXJAX_CUBLASLT_FUNCTIONS(X)                                                  \
  X(Create) X(GetVersion) X(GetStatusString) X(Matmul) X(MatmulDescCreate)           \
  X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatrixLayoutCreate)               \
  X(MatrixLayoutDestroy) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)        \
  X(MatmulPreferenceSetAttribute) X(MatmulAlgoGetHeuristic)

// Function pointers named after the API without its prefix: lt.Matmul is cublasLtMatmul.
struct CublasLt {
#define MXJAX_CUBLASLT_MEMBER(name) decltype(&::cublasLt##name) name = nullptr;
  MXJAX_CUBLASLT_FUNCTIONS(MXJAX_CUBLASLT_MEMBER)
#undef MXJAX_CUBLASLT_MEMBER
};

// The loaded library (first call loads it: libcublasLt.so.<major of the headers>, as already
// loaded by jax's CUDA plugin or found by the dynamic linker, else the nvidia-cublas wheel
// next to this package), or nullptr with *error saying why.
const CublasLt* cublaslt(std::string* error);

// One cuBLASLt handle per device, created on first use and kept for the process.
cublasLtHandle_t cublaslt_handle(const CublasLt& lt, int device, std::string* error);

}  // namespace mxjax::cuda

#endif  // __has_include(<cublasLt.h>)
#endif  // MXJAX_CUDA_CUBLASLT_API_H_
