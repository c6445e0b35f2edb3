#include "core/hash.hpp"

#include "core/hash_simd.hpp"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (core/hash_copy.inc)
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <thread>

namespace cairn {

namespace {
#include "core/hash_copy.inc"

// libxxhash's own build (the x86-64 baseline), with the calls that core/hash_simd.inc makes for the
// wider ones.
namespace hash_libxxhash {
ChunkHash hash(const void* data, size_t size) {
  const XXH128_hash_t h = XXH3_128bits(data, size);
  return ChunkHash{h.high64, h.low64};
}
ChunkHash copy_and_hash(unsigned char* dst, const unsigned char* src, uint64_t len) {
  return copy_and_hash_one(dst, src, len);
}
ChunkHash copy_and_hash_ready(unsigned char* dst, const unsigned char* src, uint64_t len,
                              const std::function<uint64_t(uint64_t)>& ready) {
  return copy_and_hash_as_ready(dst, src, len, ready);
}
}  // namespace hash_libxxhash

// One build of xxh3; every one gives the same hashes.
struct HashBuild {
  const char* name;
  decltype(&hash_libxxhash::hash) hash;
  decltype(&hash_libxxhash::copy_and_hash) copy_and_hash;
  decltype(&hash_libxxhash::copy_and_hash_ready) copy_and_hash_ready;
};

// The widest build the CPU runs (core/hash_simd.hpp).
HashBuild widest_build() {
#if defined(CAIRN_HASH_SIMD)
  if (__builtin_cpu_supports("avx512f"))
    return {"xxh3 (AVX-512)", hash_avx512::hash, hash_avx512::copy_and_hash, hash_avx512::copy_and_hash_ready};
  if (__builtin_cpu_supports("avx2"))
    return {"xxh3 (AVX2)", hash_avx2::hash, hash_avx2::copy_and_hash, hash_avx2::copy_and_hash_ready};
#endif
  return {"xxh3 (libxxhash)", hash_libxxhash::hash, hash_libxxhash::copy_and_hash, hash_libxxhash::copy_and_hash_ready};
}
// Chosen on first use (a hash computed while another file's statics are built gets it too).
const HashBuild& build() {
  static const HashBuild b = widest_build();
  return b;
}
}  // namespace

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
    if (c >= '0' && c <= '9')
      v = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v = static_cast<uint64_t>(c - 'a' + 10);
    else
      return std::nullopt;
    uint64_t& word = i < 16 ? h.hi : h.lo;
    word = (word << 4) | v;
  }
  return h;
}

const char* hash_implementation() { return build().name; }

ChunkHash hash_bytes(const void* data, size_t size) { return build().hash(data, size); }

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

std::vector<ChunkHash> copy_and_hash_chunks(void* dst, const void* src, uint64_t size, uint64_t chunk_size,
                                            unsigned threads) {
  return std::move(copy_and_hash_many({CopyJob{dst, src, size}}, chunk_size, threads).front());
}

std::vector<std::vector<ChunkHash>> copy_and_hash_many(const std::vector<CopyJob>& jobs, uint64_t chunk_size,
                                                       unsigned threads) {
  std::vector<std::vector<ChunkHash>> out(jobs.size());
  // Every chunk of every job, in order: (job, chunk) numbered 0..units.
  std::vector<std::pair<uint32_t, uint64_t>> units;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const uint64_t chunks = chunk_count(jobs[j].size, chunk_size);
    out[j].resize(chunks);
    for (uint64_t c = 0; c < chunks; ++c) units.emplace_back(static_cast<uint32_t>(j), c);
  }
  std::atomic<uint64_t> next{0};
  auto work = [&] {
    for (uint64_t u; (u = next++) < units.size();) {
      const auto [j, c] = units[u];
      const CopyJob& job = jobs[j];
      const uint64_t from = c * chunk_size, len = std::min(chunk_size, job.size - from);
      auto* d = static_cast<unsigned char*>(job.dst) + from;
      const auto* s = static_cast<const unsigned char*>(job.src) + from;
      out[j][c] = build().copy_and_hash(d, s, len);
    }
  };
  const uint64_t helpers = std::min<uint64_t>(threads > 0 ? threads - 1 : 0, units.empty() ? 0 : units.size() - 1);
  std::vector<std::thread> pool;
  for (uint64_t h = 0; h < helpers; ++h) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones running (and this one) do the rest
    }
  }
  work();
  for (auto& t : pool) t.join();
  return out;
}

ChunkHash copy_and_hash_as_ready(void* dst, const void* src, uint64_t len,
                                 const std::function<uint64_t(uint64_t)>& ready) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  return build().copy_and_hash_ready(d, s, len, ready);
}

}  // namespace cairn
