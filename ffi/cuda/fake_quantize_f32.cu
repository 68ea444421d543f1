// mxjax_fake_quantize's launches for f32 inputs, in a translation unit of their own (see
// fake_quantize.cu: nvcc then compiles the two fast input dtypes on two cores).
#define MXJAX_FAKE_QUANTIZE_INPUT F32
#include "cuda/fake_quantize.cu"
