// The simulator's indexed trace and replays, shared by its source files (simulator.cpp: indexing,
// the tiers' policies and Belady; simulator_baselines.cpp: ARC, S3-FIFO and the win-probability
// bound). Not part of the simulator's interface.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "policy/simulator.hpp"

namespace cairn {

inline constexpr uint32_t kSimNone = std::numeric_limits<uint32_t>::max();
inline constexpr size_t kSimNever = std::numeric_limits<size_t>::max();

// An event with its ids interned.
struct SimEvent {
  TraceEventKind kind = TraceEventKind::kAccess;
  int64_t time_ns = 0;
  uint32_t chunk = kSimNone;
  TraceTier tier = TraceTier::kUnknown;
  HintKind hint = HintKind::kNone;
  std::optional<double> when_s;
  std::vector<uint32_t> models;    // one for access and insert; the hint's models
  size_t next_access = kSimNever;  // index of the next access of `chunk` after this event
};

// Policies see chunks as ChunkHash keys; the simulator's chunk numbers make them.
inline ChunkHash key_of(uint32_t chunk) { return ChunkHash{0x5157, chunk}; }

// Counts one request (an access event of `bytes`) in r.
inline void count_request(SimResult& r, const SimEvent& e, uint64_t bytes, bool hit) {
  ++r.requests;
  r.bytes_requested += bytes;
  if (hit) {
    ++r.hits;
    r.bytes_hit += bytes;
  } else {
    r.bytes_missed_by_tier[static_cast<int>(e.tier)] += bytes;
  }
}

struct Simulator::Impl {
  SimOptions options;
  TraceSummary summary;
  std::vector<SimEvent> events;
  std::vector<uint64_t> chunk_bytes;
  size_t model_count = 0;

  SimResult run_online(SimPolicy policy, uint64_t capacity) const;  // lru, lineage, hints
  SimResult run_belady(uint64_t capacity) const;
  SimResult run_baseline(SimPolicy policy, uint64_t capacity) const;  // arc, s3fifo
  SimResult run_bound(uint64_t capacity) const;
};

}  // namespace cairn
