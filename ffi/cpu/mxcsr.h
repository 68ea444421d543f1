// x86's MXCSR flush-to-zero (bit 15) and denormals-are-zero (bit 6), set or cleared for a
// scope: parallel.h clears them around every kernel chunk (XLA's threads set them, and the
// codecs need exact subnormal arithmetic); the RHT sets them around its transform, so the
// hardware flushes as rht.h defines. Where there is no MXCSR the scopes do nothing.
#ifndef MXJAX_CPU_MXCSR_H_
#define MXJAX_CPU_MXCSR_H_

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define MXJAX_HAVE_MXCSR 1
#endif

namespace mxjax::cpu {

// FTZ and DAZ on (kFlush) or off for the scope's lifetime, as they were after it.
template <bool kFlush>
class FlushScope {
 public:
#ifdef MXJAX_HAVE_MXCSR
  FlushScope() : saved_(_mm_getcsr()) {
    constexpr unsigned kFtzDaz = (1u << 15) | (1u << 6);
    _mm_setcsr(kFlush ? saved_ | kFtzDaz : saved_ & ~kFtzDaz);
  }
  ~FlushScope() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

using ExactFloatScope = FlushScope<false>;

}  // namespace mxjax::cpu

#endif  // MXJAX_CPU_MXCSR_H_
