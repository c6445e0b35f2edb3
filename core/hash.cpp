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
// The widest xxh3 build the CPU runs (core/hash_simd.hpp); the same hashes from each.
enum class Isa { kBaseline, kAvx2, kAvx512 };
Isa best_isa() {
#if defined(CAIRN_HASH_SIMD)
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}
const Isa kIsa = best_isa();
}  // namespace

namespace {
#include "core/hash_copy.inc"
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
    if (c >= '0' && c <= '9') v = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v = static_cast<uint64_t>(c - 'a' + 10);
    else return std::nullopt;
    uint64_t& word = i < 16 ? h.hi : h.lo;
    word = (word << 4) | v;
  }
  return h;
}

const char* hash_implementation() {
  switch (kIsa) {
    case Isa::kAvx512: return "xxh3 (AVX-512)";
    case Isa::kAvx2: return "xxh3 (AVX2)";
    case Isa::kBaseline: break;
  }
  return "xxh3 (libxxhash)";
}

ChunkHash hash_bytes(const void* data, size_t size) {
#if defined(CAIRN_HASH_SIMD)
  if (kIsa == Isa::kAvx512) return hash_avx512::hash(data, size);
  if (kIsa == Isa::kAvx2) return hash_avx2::hash(data, size);
#endif
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
#if defined(CAIRN_HASH_SIMD)
      if (kIsa == Isa::kAvx512) {
        out[j][c] = hash_avx512::copy_and_hash(d, s, len);
        continue;
      }
      if (kIsa == Isa::kAvx2) {
        out[j][c] = hash_avx2::copy_and_hash(d, s, len);
        continue;
      }
#endif
      out[j][c] = copy_and_hash_one(d, s, len);
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
#if defined(CAIRN_HASH_SIMD)
  if (kIsa == Isa::kAvx512) return hash_avx512::copy_and_hash_ready(d, s, len, ready);
  if (kIsa == Isa::kAvx2) return hash_avx2::copy_and_hash_ready(d, s, len, ready);
#endif
  return copy_and_hash_as_ready(d, s, len, ready);
}

}  // namespace cairn
