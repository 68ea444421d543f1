// Runs work units on XLA's CPU thread pool and completes an ffi::Future when the last
// chunk is done (the handler never blocks). Every chunk runs with FTZ / DAZ cleared.
#ifndef MXJAX_CPU_PARALLEL_H_
#define MXJAX_CPU_PARALLEL_H_

#include <cstdint>
#include <utility>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define MXJAX_HAVE_MXCSR 1
#endif

#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {

namespace ffi = xla::ffi;

// Clears MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) for its lifetime:
// XLA's threads set them, and the kernels need exact subnormal arithmetic.
class ExactFloatScope {
 public:
#ifdef MXJAX_HAVE_MXCSR
  ExactFloatScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~((1u << 15) | (1u << 6))); }
  ~ExactFloatScope() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

inline ffi::Future ready_future(ffi::Error error = ffi::Error::Success()) {
  ffi::Promise promise;
  ffi::Future future(promise);
  if (error.success()) {
    promise.SetAvailable();
  } else {
    promise.SetError(std::move(error));
  }
  return future;
}

// Calls body(begin, end) over [0, units) in chunks: a few per pool thread, each at least
// ~min_elems elements (elems_per_unit each); small problems run inline.
template <class Body>
ffi::Future parallel_for(ffi::ThreadPool& pool, int64_t units, int64_t elems_per_unit,
                         Body body) {
  constexpr int64_t kMinElems = 1 << 16;
  constexpr int64_t kChunksPerThread = 4;
  int64_t threads = pool.num_threads();
  int64_t chunks = units * elems_per_unit / kMinElems;
  if (chunks > threads * kChunksPerThread) chunks = threads * kChunksPerThread;
  if (chunks > units) chunks = units;
  if (threads <= 1 || chunks <= 1) {
    ExactFloatScope exact;
    if (units > 0) body(int64_t{0}, units);
    return ready_future();
  }
  ffi::CountDownPromise done(chunks);
  ffi::Future future(done);
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t begin = units * c / chunks, end = units * (c + 1) / chunks;
    pool.Schedule([body, done, begin, end]() mutable {
      {
        ExactFloatScope exact;
        body(begin, end);
      }
      done.CountDown();
    });
  }
  return future;
}

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_PARALLEL_H_
