// mxjax_fake_quantize's launches for bf16 inputs, in a translation unit of their own (see
// fake_quantize.cu: nvcc then compiles the two fast input dtypes on two cores).
#define MXJAX_FAKE_QUANTIZE_INPUT BF16
#include "cuda/fake_quantize.cu"
