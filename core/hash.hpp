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
  size_t operator()(const ChunkHash& h) const noexcept { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

ChunkHash hash_bytes(const void* data, size_t size);

// 64-bit hash of a string (for file names derived from ids).
uint64_t hash64(std::string_view s);

// Default chunk size: 16 MiB. Tensors larger than this are split into pieces of exactly this size
// (the last one shorter). The chunk size is fixed per repository (it is stored in its FORMAT file).
inline constexpr uint64_t kDefaultChunkSize = 16ull << 20;

// The number of chunks for a tensor of nbytes (0 for an empty tensor).
inline uint64_t chunk_count(uint64_t nbytes, uint64_t chunk_size) {
  return (nbytes + chunk_size - 1) / chunk_size;
}

// Hashes each chunk of data[0..size).
std::vector<ChunkHash> hash_chunks(const void* data, uint64_t size, uint64_t chunk_size);

}  // namespace cairn
