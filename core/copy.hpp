// Copies of many megabytes: what a DRAM hit read into a caller's buffer, a commit from the caller's
// own buffer and a reader's copy-out are made of.
//
// glibc's memcpy switches to non-temporal stores only above a threshold derived from the cache
// size the CPU reports (on the development VM: copies under about 180 MiB), so a model copied one
// tensor at a time runs at 0.6x of the same bytes copied in one call (measured: 8 tensors of 32 MiB
// 38.7 ms, one 256 MiB memcpy 26.2 ms). stream_copy writes around the caches itself: on Intel four
// pages at a time (one cache line of each in turn, as glibc's large copy does, so the DRAM pages stay
// open), 23.1 ms for the same bytes in any piece size; elsewhere one line after the other, which on
// AMD EPYC runs at 10.5 GB/s where the four-page interleave ran at 2.2 (core/copy.cpp).
#pragma once

#include <cstddef>

namespace cairn {

// Copies n bytes like memcpy (the ranges must not overlap). With `streaming`, bytes beyond the
// first destination page go to memory with non-temporal stores, so the destination is not in the
// caches afterwards: for copies much larger than the caches, where it is the faster way.
void stream_copy(void* dst, const void* src, size_t n, bool streaming = true);

// Whether a request that copies `total` bytes should stream its pieces: when they cannot stay in
// the caches anyway (16 MiB and more), pieces of 64 KiB and more.
inline bool should_stream(size_t total, size_t piece) { return total >= (16u << 20) && piece >= (64u << 10); }

}  // namespace cairn
