// What every tier reports, and the seam the tier manager of a later issue builds on.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace cairn {

// Counters of one tier. Bytes in: bytes that entered the tier (writes, loads from below);
// bytes out: bytes that left it (evictions, flushes to the tier below).
struct TierStats {
  std::string name;
  bool enabled = false;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t chunks = 0;
  uint64_t dirty_bytes = 0;
  uint64_t backpressure_waits = 0;  // allocations that had to wait for dirty data to be written down

  nlohmann::json to_json() const {
    return {{"backpressure_waits", backpressure_waits},{"enabled", enabled},     {"capacity_bytes", capacity_bytes}, {"used_bytes", used_bytes},
            {"hits", hits},           {"misses", misses},                 {"bytes_in", bytes_in},
            {"bytes_out", bytes_out}, {"chunks", chunks},                 {"dirty_bytes", dirty_bytes}};
  }
};

}  // namespace cairn
