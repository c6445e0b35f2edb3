// Replays a chunk-level trace (policy/trace.hpp) against a cache of a given byte capacity and an
// eviction policy, to measure a policy's hit ratio against the best any cache could do.
//
// The cache model (docs/policy.md, "Simulator"): one tier of `capacity` bytes in front of slower
// storage.
//  - access: a hit when the chunk is resident; otherwise a miss, and the chunk is brought in,
//    evicting the policy's victims until it fits. A chunk larger than the whole cache is never cached.
//  - insert: a chunk written by a commit enters the cache the same way (not a request; a resident
//    chunk inserted again is left as it is, not counted as a read).
//  - inherit: tells which model uses the chunk (for references and hints); moves no data.
//  - hint: fed to the hint-aware policy (a model-level hint applies to the chunks the trace has
//    seen that model use, and to those it uses later); other policies ignore hints.
//  - commit and evict: recorded facts about the original cache; the simulator ignores them.
// The online policies are the tier's own classes (LruPolicy, LineagePolicy, HintAwarePolicy) on a
// FakeClock that follows the trace's timestamps. references = the distinct models the trace has
// seen using the chunk (for the hint-aware policy, those not done). Refetch costs are left unknown
// (the policies' size / bandwidth default).
//
// The hint-aware replay also marks a model whose run of reads wraps around (reads its first chunk
// again) as cyclic, and admits a read chunk by competition (SimOptions::competing_admission).
// ARC and S3-FIFO (policy/baselines.hpp) and the win-probability bound ("bound") are replayed by
// simulator_baselines.cpp: docs/policy.md, "Simulator and cairn-sim", says what each does.
//
// Belady ("belady") knows the future: on a miss it evicts the resident chunks whose next access is
// farthest away, and bypasses the new chunk (does not cache it) when its own next access is farther
// than those of the chunks it would have to evict (or never comes). With equal chunk sizes this is
// the optimum (Belady's MIN with bypass); with unequal sizes the optimum is NP-hard and this is the
// usual size-aware heuristic: a strong reference, not a proven upper bound.
//
// Pure and single-threaded; a Simulator is immutable after create and run() may be called from
// several threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "policy/eviction.hpp"
#include "policy/hint_policy.hpp"
#include "policy/trace.hpp"

namespace cairn {

// lru, lineage and hints are the tiers' policy classes; arc and s3fifo the field's baselines
// (policy/baselines.hpp); bound the win-probability replay (an online policy told, from hindsight,
// each live model's chance of being read next and each chunk's chance of being loaded with it);
// belady the offline reference.
enum class SimPolicy { kLru, kArc, kS3Fifo, kLineage, kHints, kBound, kBelady };
inline constexpr SimPolicy kAllSimPolicies[] = {SimPolicy::kLru,     SimPolicy::kArc,   SimPolicy::kS3Fifo,
                                                SimPolicy::kLineage, SimPolicy::kHints, SimPolicy::kBound,
                                                SimPolicy::kBelady};
// "lru", "arc", "s3fifo", "lineage", "hints", "bound", "belady"
const char* sim_policy_name(SimPolicy p);
// invalid_argument naming the known ones for anything else.
Result<SimPolicy> parse_sim_policy(const std::string& name);

struct SimOptions {
  LineagePolicy::Options lineage;
  HintAwarePolicy::Options hints;
  // Seconds between the models of a `sequence` hint (the i-th is expected i * step from the hint).
  // 0: estimated from the trace so far (the mean time between the starts of model loads; 1 s until
  // two loads were seen). Either way shortened so that the whole sequence lies within
  // hints.expected_use_horizon_s (the order is what a sequence says for sure). REQUIRES: >= 0.
  double sequence_step_s = 0;
  // Chunks a commit writes enter the lineage and hints policies cold (EvictionPolicy::track_written),
  // as in the daemon; false replays them as reads (as before), for comparison.
  bool cold_writes = true;
  // The hint-aware policy's admission: a chunk coming in is taken in with its hint state and then
  // competes with the resident chunks, so that when it ranks lowest it is the one that leaves (it is
  // bypassed, as Belady bypasses). false: room is made before the chunk comes in, as for the other
  // online policies.
  bool competing_admission = true;
};

// What the trace holds, independent of any cache.
struct TraceSummary {
  uint64_t events = 0;
  uint64_t accesses = 0;  // requests
  uint64_t inserts = 0;
  uint64_t hints = 0;
  uint64_t models = 0;             // distinct model ids in access, insert and commit events
  uint64_t chunks_accessed = 0;    // distinct chunks read
  uint64_t working_set_bytes = 0;  // their bytes: the distinct bytes accessed
  uint64_t bytes_requested = 0;    // sum over accesses
  // What a cache that never evicts would hit (every read of a chunk seen before, by read or insert):
  // the ceiling for every policy.
  uint64_t unbounded_hits = 0;
  uint64_t unbounded_bytes_hit = 0;
};

struct SimResult {
  SimPolicy policy = SimPolicy::kLru;
  double fraction = 0;  // of the working set (0 when the capacity was given in bytes)
  uint64_t capacity_bytes = 0;
  uint64_t requests = 0;
  uint64_t hits = 0;
  uint64_t bytes_requested = 0;
  uint64_t bytes_hit = 0;
  // Bytes of the misses, by the tier the trace says served the read (index: TraceTier; kUnknown
  // when the trace does not say). A miss recorded as served from dram was a hit in the recorded
  // cache; it counts under dram here.
  std::array<uint64_t, kTraceTierCount> bytes_missed_by_tier{};
  uint64_t evictions = 0;
  uint64_t bypassed = 0;  // chunks not cached (too large, or Belady chose not to)

  double object_hit_ratio() const { return requests ? static_cast<double>(hits) / static_cast<double>(requests) : 0; }
  double byte_hit_ratio() const {
    return bytes_requested ? static_cast<double>(bytes_hit) / static_cast<double>(bytes_requested) : 0;
  }
  uint64_t bytes_missed() const { return bytes_requested - bytes_hit; }
};

class Simulator {
 public:
  // Indexes the trace. invalid_argument when a chunk appears with two different sizes (naming the
  // chunk and the event number) or options are out of range.
  static Result<Simulator> create(const Trace& trace, SimOptions options = {});
  Simulator(Simulator&&) noexcept;
  Simulator& operator=(Simulator&&) noexcept;
  ~Simulator();

  const TraceSummary& summary() const;
  // One replay at `capacity_bytes`.
  SimResult run(SimPolicy policy, uint64_t capacity_bytes) const;
  // One replay per (fraction, policy), fraction of the working set (capacity = floor(f * ws)),
  // in that order: for each fraction, each policy. REQUIRES: fractions > 0.
  std::vector<SimResult> run_fractions(const std::vector<SimPolicy>& policies,
                                       const std::vector<double>& fractions) const;

 private:
  struct Impl;
  explicit Simulator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
