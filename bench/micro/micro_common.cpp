#include "bench/micro/micro_common.hpp"

#include <cstring>
#include <random>

namespace cairn::bench {

std::string size_label(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB"};
  if (bytes == 0 || bytes % 1024 != 0) return std::to_string(bytes) + "B";
  uint64_t v = bytes / 1024;
  int unit = 0;
  while (unit < 2 && v % 1024 == 0) {
    v /= 1024;
    ++unit;
  }
  return std::to_string(v) + kUnits[unit];
}

std::string bench_name(const std::string& family, const std::string& size, const std::string& system) {
  return family + "/" + size + "/" + system;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

}  // namespace cairn::bench
