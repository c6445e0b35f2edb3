// Deterministic, incompressible-looking bytes for tests (xorshift64 from a seed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cairn::testing {

inline std::string make_bytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x & 0xFF);
  }
  return s;
}

}  // namespace cairn::testing
