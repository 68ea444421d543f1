// A region where GCC's (maybe-)uninitialized warnings are off: GCC 12 raises them on the
// _mm512_undefined_* operands inside its own AVX-512 intrinsics, and on quantize.h's zeroed
// block of codes once inlined into the AVX-512 build. Other compilers: no effect.
#ifndef MXJAX_CPU_GCC_DIAGNOSTICS_H_
#define MXJAX_CPU_GCC_DIAGNOSTICS_H_

#if defined(__GNUC__) && !defined(__clang__)
#define MXJAX_UNINITIALIZED_WARNINGS_OFF                \
  _Pragma("GCC diagnostic push")                        \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define MXJAX_UNINITIALIZED_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define MXJAX_UNINITIALIZED_WARNINGS_OFF
#define MXJAX_UNINITIALIZED_WARNINGS_ON
#endif

#endif  // MXJAX_CPU_GCC_DIAGNOSTICS_H_
