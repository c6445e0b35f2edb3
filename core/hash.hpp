// Content hashing and chunking.
//
// A chunk is a piece of a tensor's bytes of at most the chunk size, identified by the xxh3-128 hash
// of its bytes (libxxhash). The hash is both the deduplication key and the checksum verified on
// every read from storage. xxh3 is not cryptographic: cairn trusts the users of one repository
// (docs/decisions/0001-chunk-hash.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cairn {

struct ChunkHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const ChunkHash&) const = default;
  auto operator<=>(const ChunkHash&) const = default;
  // 32 lowercase hex digits.
  std::string hex() const;
  static std::optional<ChunkHash> from_hex(std::string_view hex);
};

struct ChunkHashHasher {
  size_t operator()(const ChunkHash& h) const noexcept {
    return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
  }
};

ChunkHash hash_bytes(const void* data, size_t size);
// Which build of xxh3 hash_bytes and the copy-and-hash calls use: the widest vector unit the CPU
// has ("xxh3 (AVX-512)", "xxh3 (AVX2)", else "xxh3 (libxxhash)"); every one gives the same hashes.
const char* hash_implementation();

// 64-bit hash of a string (for file names derived from ids).
uint64_t hash64(std::string_view s);

// Default chunk size: 16 MiB. Tensors larger than this are split into pieces of exactly this size
// (the last one shorter). The chunk size is fixed per repository (it is stored in its FORMAT file).
inline constexpr uint64_t kDefaultChunkSize = 16ull << 20;

// The number of chunks for a tensor of nbytes (0 for an empty tensor).
inline uint64_t chunk_count(uint64_t nbytes, uint64_t chunk_size) { return (nbytes + chunk_size - 1) / chunk_size; }

// Hashes each chunk of data[0..size).
std::vector<ChunkHash> hash_chunks(const void* data, uint64_t size, uint64_t chunk_size);

// Copies src[0..size) to dst and returns the hash of each chunk of the copy, hashing each 64 KiB
// block of dst right after copying it, while it is still in the cache (so the hash is of the bytes
// that landed, even if src changes meanwhile). With `threads` > 1, chunks are shared among that
// many threads (the caller's and threads - 1 more). Measured on the development VM for 1 GiB
// (AVX-512 build, four runs): memcpy 95-115 ms, this on one thread 165-217 ms, on two 100-145 ms;
// with the cache-resident hash at 36 GB/s, the 64 KiB copies from memory are most of it.
std::vector<ChunkHash> copy_and_hash_chunks(void* dst, const void* src, uint64_t size, uint64_t chunk_size,
                                            unsigned threads);

// copy_and_hash_chunks of one chunk whose source is still arriving (a read in flight): ready(n)
// waits until the first n bytes of src are in place and returns how many are, and each 64 KiB
// block is copied and hashed as soon as it is there. A ready() that returns less than it was asked
// for stops the copy; the hash returned is then meaningless (the caller knows why it stopped).
ChunkHash copy_and_hash_as_ready(void* dst, const void* src, uint64_t len,
                                 const std::function<uint64_t(uint64_t)>& ready);

// One buffer for copy_and_hash_many.
struct CopyJob {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t size = 0;
};

// copy_and_hash_chunks over several buffers at once: the chunks of all of them are shared among up
// to `threads` threads, so a model of many one-chunk tensors is copied on every thread too (one
// tensor at a time can only use one). Returns each job's chunk hashes, in the jobs' order.
std::vector<std::vector<ChunkHash>> copy_and_hash_many(const std::vector<CopyJob>& jobs, uint64_t chunk_size,
                                                       unsigned threads);

}  // namespace cairn
