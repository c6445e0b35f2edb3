#include "core/hash.hpp"

#include <xxhash.h>

#include <cstdio>

namespace cairn {

std::string ChunkHash::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return std::string(buf, 32);
}

std::optional<ChunkHash> ChunkHash::from_hex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  ChunkHash h;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') v = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v = static_cast<uint64_t>(c - 'a' + 10);
    else return std::nullopt;
    uint64_t& word = i < 16 ? h.hi : h.lo;
    word = (word << 4) | v;
  }
  return h;
}

ChunkHash hash_bytes(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return ChunkHash{h.high64, h.low64};
}

uint64_t hash64(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }

std::vector<ChunkHash> hash_chunks(const void* data, uint64_t size, uint64_t chunk_size) {
  std::vector<ChunkHash> out;
  out.reserve(chunk_count(size, chunk_size));
  const auto* p = static_cast<const unsigned char*>(data);
  for (uint64_t off = 0; off < size; off += chunk_size) {
    uint64_t n = size - off < chunk_size ? size - off : chunk_size;
    out.push_back(hash_bytes(p + off, n));
  }
  return out;
}

}  // namespace cairn
