// The hint-aware eviction scorer: the lineage scorer (GreedyDual-Size-Frequency with lineage
// references and refetch cost, as LineagePolicy) plus what the workflow announced.
//
// Why: a NAS driver knows its live population, an ensemble or a sweep knows what it reads next, and
// a finished model will not be read again. Recency and frequency learn this late; hints say it ahead.
// The same scorer serves DRAM and NVMe (each tier owns an instance); it is pure, like every policy.
//
// Each chunk stands in one of four standings; victims come from the lowest standing first:
//   0 done       every model using it is done (set_done)            ordered by H, lowest first
//   1 ordinary   no hint                                             ordered by H, lowest first
//   2 population used by a model of the live population              the least likely to be read by
//                                                                    the next parent first
//                                                                    (set_parent_chance), then H
//   3 expected   a read is expected within the horizon               the farthest expected first
// where H is LineagePolicy's priority, L + frequency * (1 + references) * refetch_cost / size.
// Scan resistance: within the ordinary and population standings, a chunk of a model read in a
// cycle (set_cyclic) ranks above every other chunk of its standing, and cyclic chunks go newest
// taken-in first, so that when a cycle does not fit, the part taken in first stays resident and is
// hit on every round while the rest passes through (instead of recency pushing each chunk out just
// before its next read).
// An expectation outranks done and population (a hint naming the model again overrides "done").
// Without hints every chunk is ordinary and the policy picks exactly what LineagePolicy picks.
// Only victims of standings 1 and 2 raise L (hint-forced victims would inflate it past chunks that
// won the ordinary competition). An expectation overdue by more than the grace goes stale and is
// dropped at the next pick_victim (a wrong hint cannot pin a chunk forever).
//
// Not thread-safe, as every policy: the owning tier serializes calls. O(log n) per call, plus the
// chunks pick_victim skips and the stale expectations it drops.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "policy/eviction.hpp"

namespace cairn {

class HintAwarePolicy final : public EvictionPolicy {
 public:
  // REQUIRES: all > 0 (half_life_s and expected_use_horizon_s may be infinity); the constructor
  // throws std::invalid_argument otherwise.
  struct Options {
    double half_life_s = 60.0;            // frequency decay, as LineagePolicy
    double default_bandwidth = 1e9;       // bytes/s, for chunks without a refetch cost
    double expected_use_horizon_s = 600;  // an expected read farther ahead than this is ignored
    double expected_use_grace_s = 60;     // an expectation overdue by this much is dropped
  };
  enum class Standing : int { kDone = 0, kOrdinary = 1, kPopulation = 2, kExpected = 3 };

  // `clock` is borrowed: it must outlive the policy.
  explicit HintAwarePolicy(const Clock& clock = steady_clock());
  HintAwarePolicy(const Clock& clock, Options options);
  ~HintAwarePolicy() override;

  void track(const ChunkHash& key, uint64_t bytes) override;
  // Enters with no access counted (H = L: the first ordinary victim until read), its standing from
  // the hints it already has; a chunk already tracked only learns its size.
  void track_written(const ChunkHash& key, uint64_t bytes) override;
  void touch(const ChunkHash& key) override;
  void remove(const ChunkHash& key) override;
  void set_references(const ChunkHash& key, uint32_t live_models) override;
  void set_refetch_cost(const ChunkHash& key, double seconds) override;
  void set_expected_use(const ChunkHash& key, double seconds_from_now) override;
  void set_population(const ChunkHash& key, bool member) override;
  void set_parent_chance(const ChunkHash& key, double chance) override;
  void set_done(const ChunkHash& key, bool done) override;
  void set_cyclic(const ChunkHash& key, bool in_cycle) override;
  std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) override;
  const char* name() const override { return "hints"; }

  size_t size() const;
  // The chunk pick_victim would pick now, without picking it (L is not raised; stale expectations
  // are not dropped first). For a caller that weighs a victim before evicting it.
  std::optional<ChunkHash> peek_victim(const std::function<bool(const ChunkHash&)>& evictable) const;
  // For tests and stats; nullopt for an unknown key. The standing as of the last call that changed
  // the chunk (a stale expectation is only dropped by pick_victim).
  std::optional<Standing> standing(const ChunkHash& key) const;
  // Whether set_cyclic marked the chunk; nullopt for an unknown key.
  std::optional<bool> cyclic(const ChunkHash& key) const;
  // The chance set_parent_chance gave (NaN when none); nullopt for an unknown key.
  std::optional<double> parent_chance(const ChunkHash& key) const;
  // H as LineagePolicy::priority computes it (whatever the standing).
  std::optional<double> priority(const ChunkHash& key) const;
  double aging() const;  // L

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

const char* standing_name(HintAwarePolicy::Standing s);  // "done", "ordinary", ...

// now_ns + seconds, saturating at the ends of int64 (a hint's "in a very long time" must not
// overflow). REQUIRES: seconds is not NaN.
int64_t add_seconds_ns(int64_t now_ns, double seconds);

}  // namespace cairn
