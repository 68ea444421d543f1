// Picks the widest kernel table the CPU runs; MXJAX_SIMD=scalar|avx2|avx512 caps it, and
// set_simd() switches between the levels under that cap (the tests run every level in one
// process).
#include <atomic>
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
         __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// The table of `level` (0 scalar, 1 avx2, 2 avx512) where this build has it and this CPU
// runs it under the MXJAX_SIMD cap; nullptr otherwise.
const Kernels* runnable(int level) {
  const char* cap = std::getenv("MXJAX_SIMD");
  const int max_level = !cap || !*cap || std::strcmp(cap, "avx512") == 0 ? 2
                        : std::strcmp(cap, "avx2") == 0                 ? 1
                                                                        : 0;
  if (level > max_level) return nullptr;
#ifdef MXJAX_HAVE_X86_LEVELS
  if (level == 2) return has_avx512() ? &kernels_avx512() : nullptr;
  if (level == 1) return has_avx2() ? &kernels_avx2() : nullptr;
#endif
  return level == 0 ? &kernels_scalar() : nullptr;
}

constexpr const char* kLevels[] = {"scalar", "avx2", "avx512"};
constexpr int kNumLevels = 3;

std::atomic<const Kernels*> current{nullptr};

}  // namespace

const Kernels& kernels() {
  const Kernels* k = current.load(std::memory_order_acquire);
  if (k) return *k;
  for (int level = kNumLevels - 1; level >= 0 && !k; --level) k = runnable(level);
  const Kernels* expected = nullptr;
  current.compare_exchange_strong(expected, k, std::memory_order_acq_rel);
  return *current.load(std::memory_order_acquire);
}

int runnable_simd(const char** levels) {
  int n = 0;
  for (int level = 0; level < kNumLevels; ++level) {
    if (runnable(level)) levels[n++] = kLevels[level];
  }
  return n;
}

bool set_simd(const char* name) {
  for (int level = 0; level < kNumLevels; ++level) {
    if (std::strcmp(name, kLevels[level]) != 0) continue;
    const Kernels* k = runnable(level);
    if (k) current.store(k, std::memory_order_release);
    return k != nullptr;
  }
  return false;
}

}  // namespace mxjax::cpu
