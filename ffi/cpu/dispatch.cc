// Picks the widest kernel table the CPU runs; MXJAX_SIMD=scalar|avx2|avx512 caps it.
#include <cstdlib>
#include <cstring>

#include "kernels.h"

namespace mxjax::cpu {
namespace {

bool has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

const Kernels& select() {
  const char* cap = std::getenv("MXJAX_SIMD");
  bool allow512 = !cap || !*cap || std::strcmp(cap, "avx512") == 0;
  bool allow2 = allow512 || std::strcmp(cap, "avx2") == 0;
#ifdef MXJAX_HAVE_X86_LEVELS
  if (allow512 && has_avx512()) return kernels_avx512();
  if (allow2 && has_avx2()) return kernels_avx2();
#else
  (void)allow2;
#endif
  return kernels_scalar();
}

}  // namespace

const Kernels& kernels() {
  static const Kernels& chosen = select();
  return chosen;
}

}  // namespace mxjax::cpu
