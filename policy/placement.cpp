#include "policy/placement.hpp"

namespace cairn {

namespace {

// splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits with full avalanche.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

// hash64 is XXH3-64 of the id's bytes and mix64 is plain integer arithmetic, so the weight is the
// same on every process and machine (no seeds, no std::hash, no byte order).
uint64_t placement_weight(const ChunkHash& chunk, const std::string& member) {
  const uint64_t m = hash64(member);
  return mix64(chunk.lo ^ mix64(chunk.hi ^ m));
}

std::string home_of(const ChunkHash& chunk, const std::vector<std::string>& members) {
  const std::string* best = nullptr;
  uint64_t best_weight = 0;
  for (const std::string& m : members) {
    const uint64_t w = placement_weight(chunk, m);
    if (best == nullptr || w > best_weight || (w == best_weight && m < *best)) {
      best = &m;
      best_weight = w;
    }
  }
  return best ? *best : std::string();
}

}  // namespace cairn
