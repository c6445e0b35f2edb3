// The lineage scorer's arithmetic (GreedyDual-Size-Frequency weighted by lineage references), in one
// place so that LineagePolicy and HintAwarePolicy rank chunks by exactly the same H. Pure.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

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

// Throws std::invalid_argument naming `who` unless half_life_s > 0 (infinity: no decay) and
// default_bandwidth is a positive finite number of bytes/s. Written so that NaN fails too.
inline void check_options(const char* who, double half_life_s, double default_bandwidth) {
  if (!(half_life_s > 0))
    throw std::invalid_argument(std::string(who) + ": half_life_s must be > 0 (use infinity for no decay)");
  if (!(default_bandwidth > 0) || std::isinf(default_bandwidth))
    throw std::invalid_argument(std::string(who) + ": default_bandwidth must be a positive number of bytes/s");
}

// What the lineage scorer knows of one chunk, and what a read and the tier manager's facts do to
// it: the per-chunk state of LineagePolicy, and the lineage half of HintAwarePolicy's. Plain data;
// the policy that holds it keeps its ordering in step (erase the old rank before a change).
struct Terms {
  uint64_t bytes = 0;
  uint32_t references = 0;             // live models using the chunk
  std::optional<double> refetch_cost;  // seconds; unset until the tier manager tells
  double frequency = 0;                // as of last_access_ns, before decay since then
  int64_t last_access_ns = 0;
  double priority = 0;    // H, as of the last rerank
  uint64_t sequence = 0;  // order of the last access: breaks ties, older first

  // A read at `now`, the policy's `seq`-th: the frequency decays to now and counts it.
  void access(int64_t now, uint64_t seq, double half_life_s) {
    frequency = decayed_frequency(frequency, last_access_ns, now, half_life_s) + 1.0;
    last_access_ns = now;
    sequence = seq;
  }

  // Recomputes H with aging L at `now`; returns it.
  double rerank(double aging, int64_t now, double half_life_s, double default_bandwidth) {
    priority = gdsf::priority(aging, decayed_frequency(frequency, last_access_ns, now, half_life_s), references,
                              refetch_cost, bytes, default_bandwidth);
    return priority;
  }

  // A NaN priority would break an ordering, so neither NaN nor infinity gets in (infinity times a
  // frequency decayed to 0 is NaN); a negative cost means nothing (0). The largest finite cost still
  // ranks a chunk with no other copy last, which is what it deserves. Call rerank after.
  void set_refetch_cost(double seconds) {
    refetch_cost = (seconds >= 0) ? std::min(seconds, std::numeric_limits<double>::max()) : 0.0;
  }
};

}  // namespace cairn::gdsf
