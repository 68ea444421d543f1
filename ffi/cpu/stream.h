// Non-temporal (streaming) stores for outputs too large to stay in cache. An ordinary store
// to a line the core does not hold first reads that line from memory (read-for-ownership);
// a streaming store of a whole line skips the read, so a kernel whose output goes straight
// to memory moves a third less for FP8 (2 bytes read, 1 written per element, not 2 + 2).
// Host only; compiled once per SIMD level (kernels.cc), using the widest stores it has.
#ifndef MXJAX_CPU_STREAM_H_
#define MXJAX_CPU_STREAM_H_

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "mxjax/codec.h"

namespace mxjax {
inline namespace MXJAX_ISA_NS {

// One 64-byte line from src to the 64-byte aligned dst, bypassing the caches.
inline void stream_line(uint8_t* dst, const uint8_t* src) {
#if defined(__AVX512F__)
  _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_loadu_si512(src));
#elif defined(__AVX__)
  for (int i = 0; i < 64; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
#elif defined(__SSE2__)
  for (int i = 0; i < 64; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
#else
  std::memcpy(dst, src, 64);
#endif
}

// Copies n bytes from src (a staging buffer in L1) to dst: the whole 64-byte lines of dst
// with streaming stores, the ragged ends (lines shared with a neighbour) with ordinary ones.
inline void stream_copy(uint8_t* dst, const uint8_t* src, int64_t n) {
  const int64_t head = min64(n, int64_t(-reinterpret_cast<uintptr_t>(dst) & 63));
  std::memcpy(dst, src, size_t(head));
  int64_t i = head;
  for (; i + 64 <= n; i += 64) stream_line(dst + i, src + i);
  std::memcpy(dst + i, src + i, size_t(n - i));
}

// One vector to out: a streaming store when `stream` (out aligned to the vector's width),
// an ordinary unaligned one otherwise. One overload per vector width the level has.
#if defined(__SSE2__)
inline void store_vector(void* out, __m128i v, bool stream) {
  __m128i* dst = static_cast<__m128i*>(out);
  if (stream) {
    _mm_stream_si128(dst, v);
  } else {
    _mm_storeu_si128(dst, v);
  }
}
#endif
#if defined(__AVX__)
inline void store_vector(void* out, __m256i v, bool stream) {
  __m256i* dst = static_cast<__m256i*>(out);
  if (stream) {
    _mm256_stream_si256(dst, v);
  } else {
    _mm256_storeu_si256(dst, v);
  }
}
#endif
#if defined(__AVX512F__)
inline void store_vector(void* out, __m512i v, bool stream) {
  if (stream) {
    _mm512_stream_si512(static_cast<__m512i*>(out), v);
  } else {
    _mm512_storeu_si512(out, v);
  }
}
#endif

// Orders this thread's streaming stores before its later stores (and before the work
// unit's completion is signalled): they are weakly ordered otherwise.
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace MXJAX_ISA_NS
}  // namespace mxjax

#endif  // MXJAX_CPU_STREAM_H_
