// The lineage scorer's arithmetic (GreedyDual-Size-Frequency weighted by lineage references), in one
// place so that LineagePolicy and HintAwarePolicy rank chunks by exactly the same H. Pure.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

namespace cairn::gdsf {

// An access count as of last_access_ns, decayed to `now`: each half-life since then halves it. A
// clock that steps back (it should not) does not inflate it.
inline double decayed_frequency(double frequency, int64_t last_access_ns, int64_t now, double half_life_s) {
  const int64_t dt_ns = std::max<int64_t>(0, now - last_access_ns);
  return frequency * std::exp2(-(static_cast<double>(dt_ns) * 1e-9) / half_life_s);
}

// H = aging + frequency * (1 + references) * refetch_cost / size. An unknown refetch cost is
// bytes / default_bandwidth. An empty chunk frees nothing but still costs its refetch latency:
// dividing by one byte keeps it ranked (and finite) instead of dividing by zero.
inline double priority(double aging, double decayed, uint32_t references, std::optional<double> refetch_cost,
                       uint64_t bytes, double default_bandwidth) {
  const double cost = refetch_cost ? *refetch_cost : static_cast<double>(bytes) / default_bandwidth;
  const double size = static_cast<double>(std::max<uint64_t>(bytes, 1));
  return aging + decayed * (1.0 + references) * cost / size;
}

}  // namespace cairn::gdsf
