// Runs work units on XLA's CPU thread pool and completes an ffi::Future when the last
// chunk is done (the handler never blocks). Every chunk runs with FTZ / DAZ cleared.
#ifndef MXJAX_CPU_PARALLEL_H_
#define MXJAX_CPU_PARALLEL_H_

#include <cstdint>
#include <utility>

#include "mxcsr.h"
#include "xla/ffi/api/ffi.h"

namespace mxjax::cpu {

namespace ffi = xla::ffi;

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
