#include "core/copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CAIRN_STREAM_COPY 1
#endif

namespace cairn {

#ifdef CAIRN_STREAM_COPY
namespace {

constexpr size_t kPage = 4096, kLine = 64, kGroup = 4 * kPage;

// Copies `groups` groups of four pages; d is page-aligned.
void stream_groups_sse2(uint8_t* d, const uint8_t* s, size_t groups) {
  for (size_t g = 0; g < groups; ++g, d += kGroup, s += kGroup) {
    for (size_t line = 0; line < kPage; line += kLine) {
      for (size_t k = 0; k < 4; ++k) {
        const uint8_t* from = s + k * kPage + line;
        auto* to = reinterpret_cast<__m128i*>(d + k * kPage + line);
        _mm_prefetch(reinterpret_cast<const char*>(from + 2 * kLine), _MM_HINT_T0);
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 32));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 48));
        _mm_stream_si128(to, a);
        _mm_stream_si128(to + 1, b);
        _mm_stream_si128(to + 2, c);
        _mm_stream_si128(to + 3, e);
      }
    }
  }
}

// The same with 32-byte vectors where the CPU has AVX2 (7% faster on the development VM).
__attribute__((target("avx2"))) void stream_groups_avx2(uint8_t* d, const uint8_t* s, size_t groups) {
  for (size_t g = 0; g < groups; ++g, d += kGroup, s += kGroup) {
    for (size_t line = 0; line < kPage; line += kLine) {
      for (size_t k = 0; k < 4; ++k) {
        const uint8_t* from = s + k * kPage + line;
        auto* to = reinterpret_cast<__m256i*>(d + k * kPage + line);
        _mm_prefetch(reinterpret_cast<const char*>(from + 2 * kLine), _MM_HINT_T0);
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32));
        _mm256_stream_si256(to, a);
        _mm256_stream_si256(to + 1, b);
      }
    }
  }
}

// Copies n bytes, a multiple of 64, with 32-byte streaming stores, one line after the other; d is
// page-aligned. On AMD EPYC (the dev VM from 2026-11-27) the four-page interleave above runs at
// 2.2 GB/s where this runs at 10.5 GB/s and memcpy at 4.0-7.4 (256 MiB from a memfd mapping,
// whole and in 8 pieces, medians of 9); the interleave was measured on Intel Xeon.
__attribute__((target("avx2"))) void stream_linear_avx2(uint8_t* d, const uint8_t* s, size_t n) {
  for (size_t i = 0; i < n; i += kLine) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");
// The four-page interleave follows glibc's large copy for Intel; other CPUs stream line by line.
const bool kInterleave = __builtin_cpu_is("intel");

}  // namespace
#endif

void stream_copy(void* dst, const void* src, size_t n, bool streaming) {
#ifdef CAIRN_STREAM_COPY
  if (!streaming || n < 2 * kGroup) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Up to the destination's next page boundary with memcpy: the streaming stores are aligned.
  const size_t head = (kPage - (reinterpret_cast<uintptr_t>(d) & (kPage - 1))) & (kPage - 1);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t groups = n / kGroup;
  if (kHasAvx2 && !kInterleave)
    stream_linear_avx2(d, s, groups * kGroup);
  else if (kHasAvx2)
    stream_groups_avx2(d, s, groups);
  else
    stream_groups_sse2(d, s, groups);
  _mm_sfence();  // the streaming stores are visible before anything that follows the copy
  std::memcpy(d + groups * kGroup, s + groups * kGroup, n - groups * kGroup);
#else
  (void)streaming;
  std::memcpy(dst, src, n);
#endif
}

}  // namespace cairn
