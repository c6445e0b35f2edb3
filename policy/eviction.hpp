// Eviction policies: pure decisions, no I/O (CacheLib's four verbs).
//
// A tier tells its policy what happens to the chunks it holds (track, touch, remove) and asks it for
// victims in order of preference; the tier decides whether a candidate may go (it skips pinned and
// dirty chunks) and does the moving. Policies are not thread-safe: the owning tier serializes calls.
#pragma once

#include <boost/intrusive/list.hpp>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/hash.hpp"
#include "core/status.hpp"

namespace cairn {

// Time as policies see it: steady nanoseconds. Tests drive a FakeClock by hand.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t now_ns() const = 0;
};
// std::chrono::steady_clock (a process-wide object).
Clock& steady_clock();
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 0) : now_(start_ns) {}
  int64_t now_ns() const override { return now_; }
  void advance_ns(int64_t ns) { now_ += ns; }
  void advance_s(double s) { now_ += static_cast<int64_t>(s * 1e9); }

 private:
  int64_t now_;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // A chunk of `bytes` entered the tier (read into it: a use).
  virtual void track(const ChunkHash& key, uint64_t bytes) = 0;
  // A chunk of `bytes` entered the tier because a commit wrote it: not evidence that it will be
  // read. Policies that weigh frequency let it enter cold (the first read counts it); the default
  // treats it as track(). A chunk already tracked keeps its standing.
  virtual void track_written(const ChunkHash& key, uint64_t bytes) { track(key, bytes); }
  // The chunk was read.
  virtual void touch(const ChunkHash& key) = 0;
  // The chunk left the tier (evicted or deleted). Unknown keys are ignored.
  virtual void remove(const ChunkHash& key) = 0;
  // How many live models reference the chunk (the tier manager tells on commit, retire and gc).
  // Policies that do not weigh it ignore it. Unknown keys are ignored.
  virtual void set_references(const ChunkHash& /*key*/, uint32_t /*live_models*/) {}
  // What fetching the chunk back costs once it has left this tier: seconds to read it from the
  // fastest tier below that holds it (the tier manager's cost model: size / bandwidth + latency).
  // Unknown keys are ignored.
  virtual void set_refetch_cost(const ChunkHash& /*key*/, double /*seconds*/) {}

  // ---- Hints (docs/policy.md, "Hints in the eviction order") ----
  // What the workflow announced (cairn_hint: will_load, population, sequence, done), mapped by the
  // caller from models to the chunks they use and passed on per chunk. Only the hint-aware policy
  // ("hints", policy/hint_policy.hpp) weighs them; these defaults do nothing, so lru and lineage
  // ignore them. Contract for the tier that passes them on:
  //  - a key the policy does not track is ignored, so when a chunk enters the tier later (a
  //    prefetch or a read landing) the tier passes that chunk's hint state again after track();
  //  - a hint only reorders victims: pick_victim still honours evictable() (pinned, dirty chunks);
  //  - a wrong or stale hint costs hits, never correctness.
  // The chunk is expected to be read `seconds_from_now` from now (0: next; < 0: overdue, taken as
  // 0). +infinity or NaN withdraws the expectation; so do track() and touch() of the chunk (the
  // expected read happened) and, in the hint-aware policy, the expectation going stale.
  virtual void set_expected_use(const ChunkHash& /*key*/, double /*seconds_from_now*/) {}
  // Whether a model of the live population (the last `population` hint) uses the chunk. Holds until
  // changed or the chunk leaves.
  virtual void set_population(const ChunkHash& /*key*/, bool /*member*/) {}
  // The chance that the next parent drawn from the population uses the chunk: the sum of the
  // tournament win chances (daemon/hints.hpp tournament_win_chances) of the population members that
  // use it, 0..1. NaN: not known (a population hint without scores). Among the population's chunks
  // the hint-aware policy evicts the least likely first. Holds until changed or the chunk leaves.
  virtual void set_parent_chance(const ChunkHash& /*key*/, double /*chance*/) {}
  // Whether every model that uses the chunk is `done` (no more reads expected): such chunks go
  // first. track() and touch() withdraw it (a read proves the hint wrong).
  virtual void set_done(const ChunkHash& /*key*/, bool /*done*/) {}
  // Whether a model that uses the chunk is being read in a cycle (a reader re-reads it from its
  // start, or several readers read it out of step) that may not fit: the hint-aware policy then keeps
  // a stable part of such chunks resident (the ones it took in first) and lets the rest pass
  // through, instead of cycling all of them out. Holds until changed or the chunk leaves.
  virtual void set_cyclic(const ChunkHash& /*key*/, bool /*cyclic*/) {}

  // The best victim for which evictable(key) is true, or nullopt when none is.
  virtual std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) = 0;
  virtual const char* name() const = 0;
};

// Least recently used: the baseline every other policy is measured against. The recency order is a
// Boost.Intrusive list threaded through the index's nodes: one allocation per chunk, and a touch
// moves a node without allocating (bench/workloads/boost_bench.cpp measures it against a std::list
// of keys beside an index of iterators).
class LruPolicy final : public EvictionPolicy {
 public:
  LruPolicy() = default;
  LruPolicy(const LruPolicy&) = delete;
  LruPolicy& operator=(const LruPolicy&) = delete;
  void track(const ChunkHash& key, uint64_t bytes) override;
  void touch(const ChunkHash& key) override;
  void remove(const ChunkHash& key) override;
  std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) override;
  const char* name() const override { return "lru"; }
  size_t size() const { return index_.size(); }

 private:
  struct Node : boost::intrusive::list_base_hook<boost::intrusive::link_mode<boost::intrusive::normal_link>> {
    ChunkHash key;
  };
  std::unordered_map<ChunkHash, Node, ChunkHashHasher> index_;
  boost::intrusive::list<Node, boost::intrusive::constant_time_size<false>> order_;  // front = most recent
};

// The lineage-aware scorer (GreedyDual-Size-Frequency with lineage weight). Each chunk's priority
//   H = L + frequency * (1 + references) * refetch_cost / size
// where frequency is an access count that decays with a half-life (so recency counts twice: through
// the aging value L and through the decay), references the live models that use the chunk (shared
// ancestor layers stay), refetch_cost the seconds to bring it back and size its bytes. The victim is
// the chunk with the lowest H; evicting it raises L to its H, so chunks not touched for a while fall
// behind newly used ones. Unknown refetch cost defaults to size / default_bandwidth (so the size
// term cancels until the tier manager gives a cost with a latency in it). Ties go to the chunk
// accessed longest ago. O(log n) per call, plus the chunks pick_victim skips. It is HintAwarePolicy
// (policy/hint_policy.hpp) without the hint hooks: one implementation of the scorer for both.
class LineagePolicy final : public EvictionPolicy {
 public:
  // REQUIRES: both > 0 (half_life_s may be infinity: no decay); the constructor throws
  // std::invalid_argument otherwise.
  struct Options {
    double half_life_s = 60.0;       // frequency decay
    double default_bandwidth = 1e9;  // bytes/s, for chunks without a refetch cost
  };
  // `clock` is borrowed: it must outlive the policy.
  explicit LineagePolicy(const Clock& clock = steady_clock());
  LineagePolicy(const Clock& clock, Options options);
  ~LineagePolicy() override;
  void track(const ChunkHash& key, uint64_t bytes) override;
  void track_written(const ChunkHash& key, uint64_t bytes) override;
  void touch(const ChunkHash& key) override;
  void remove(const ChunkHash& key) override;
  void set_references(const ChunkHash& key, uint32_t live_models) override;
  void set_refetch_cost(const ChunkHash& key, double seconds) override;
  std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) override;
  const char* name() const override { return "lineage"; }
  size_t size() const;
  // The priority a tracked chunk ranks by: as computed on its last track, touch, set_references or
  // set_refetch_cost (with its frequency decayed to then). nullopt when unknown. For tests and stats.
  std::optional<double> priority(const ChunkHash& key) const;
  double aging() const;  // L; pick_victim raises it to the victim's priority

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The policy named by policy.eviction: "lru", "lineage" or "hints" (HintAwarePolicy,
// policy/hint_policy.hpp). `clock` must outlive the policy.
Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const std::string& name,
                                                             const Clock& clock = steady_clock());

// Admission to a lower tier (which chunks leaving DRAM are worth writing to NVMe). Chunks whose only
// copy is in DRAM (dirty) are always admitted; this decides for clean ones. Pure, like eviction.
class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  struct Candidate {
    uint64_t bytes = 0;
    uint32_t accesses = 0;    // reads while it was in DRAM
    uint32_t references = 0;  // live models using it
    double refetch_cost = 0;  // seconds to fetch it from the repository
  };
  virtual bool admit(const Candidate& c) const = 0;
  virtual const char* name() const = 0;
};
// "all": every chunk. "reuse": chunks read at least twice or used by at least two live models.
Result<std::unique_ptr<AdmissionPolicy>> make_admission_policy(const std::string& name);

}  // namespace cairn
