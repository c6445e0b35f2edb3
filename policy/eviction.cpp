#include "policy/eviction.hpp"
#include "policy/gdsf.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>

#include "policy/hint_policy.hpp"

namespace cairn {

namespace {

class SteadyClock final : public Clock {
 public:
  int64_t now_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Clock& steady_clock() {
  // Never destroyed: policies owned by static objects may still read it during exit.
  static SteadyClock* clock = new SteadyClock();
  return *clock;
}

// ---- LruPolicy ----

void LruPolicy::track(const ChunkHash& key, uint64_t /*bytes*/) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.push_front(key);
  index_.emplace(key, order_.begin());
}

void LruPolicy::touch(const ChunkHash& key) {
  auto it = index_.find(key);
  if (it != index_.end()) order_.splice(order_.begin(), order_, it->second);
}

void LruPolicy::remove(const ChunkHash& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  order_.erase(it->second);
  index_.erase(it);
}

std::optional<ChunkHash> LruPolicy::pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it)
    if (evictable(*it)) return *it;
  return std::nullopt;
}

// ---- LineagePolicy ----

struct LineagePolicy::Impl {
  struct Entry {
    uint64_t bytes = 0;
    uint32_t references = 0;
    std::optional<double> refetch_cost;  // seconds; unset until the tier manager tells
    double frequency = 0;                // as of last_access_ns, before decay since then
    int64_t last_access_ns = 0;
    double priority = 0;
    uint64_t sequence = 0;  // order of the last access: breaks priority ties, older first
  };
  // (priority, sequence, key): sequences are unique, so the key only makes the entry findable.
  using Rank = std::tuple<double, uint64_t, ChunkHash>;

  const Clock& clock;
  Options options;
  double aging = 0;  // L
  uint64_t next_sequence = 0;
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries;
  std::set<Rank> order;

  Impl(const Clock& c, Options o) : clock(c), options(o) {}

  // The frequency decayed to `now`: each half-life since the last access halves it.
  double decayed_frequency(const Entry& e, int64_t now) const {
    return gdsf::decayed_frequency(e.frequency, e.last_access_ns, now, options.half_life_s);
  }

  // Re-ranks e with the current L and what is known now; O(log n).
  void rerank(const ChunkHash& key, Entry& e, int64_t now) {
    order.erase(Rank{e.priority, e.sequence, key});
    rank(key, e, now);
  }

  // REQUIRES: e is not in `order` (new, or just erased from it).
  void rank(const ChunkHash& key, Entry& e, int64_t now) {
    e.priority = gdsf::priority(aging, decayed_frequency(e, now), e.references, e.refetch_cost, e.bytes,
                                options.default_bandwidth);
    order.insert(Rank{e.priority, e.sequence, key});
  }

  // `fresh`: e was just created and is not in `order` yet.
  void access(const ChunkHash& key, Entry& e, bool fresh) {
    const int64_t now = clock.now_ns();
    if (!fresh) order.erase(Rank{e.priority, e.sequence, key});  // before the sequence changes
    e.frequency = decayed_frequency(e, now) + 1.0;
    e.last_access_ns = now;
    e.sequence = next_sequence++;
    rank(key, e, now);
  }
};

LineagePolicy::LineagePolicy(const Clock& clock) : LineagePolicy(clock, Options{}) {}

LineagePolicy::LineagePolicy(const Clock& clock, Options options) {
  // Written so NaN fails too.
  if (!(options.half_life_s > 0))
    throw std::invalid_argument("LineagePolicy: half_life_s must be > 0 (use infinity for no decay)");
  if (!(options.default_bandwidth > 0) || std::isinf(options.default_bandwidth))
    throw std::invalid_argument("LineagePolicy: default_bandwidth must be a positive number of bytes/s");
  impl_ = std::make_unique<Impl>(clock, options);
}

LineagePolicy::~LineagePolicy() = default;

void LineagePolicy::track(const ChunkHash& key, uint64_t bytes) {
  auto [it, inserted] = impl_->entries.try_emplace(key);
  Impl::Entry& e = it->second;
  if (inserted) e.last_access_ns = impl_->clock.now_ns();
  // Tracking a chunk again is an access, as in LruPolicy; it may have been rewritten at a new size.
  e.bytes = bytes;
  impl_->access(key, e, inserted);
}

void LineagePolicy::touch(const ChunkHash& key) {
  auto it = impl_->entries.find(key);
  if (it != impl_->entries.end()) impl_->access(key, it->second, false);
}

void LineagePolicy::remove(const ChunkHash& key) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  impl_->order.erase(Impl::Rank{it->second.priority, it->second.sequence, key});
  impl_->entries.erase(it);
}

void LineagePolicy::set_references(const ChunkHash& key, uint32_t live_models) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  it->second.references = live_models;
  impl_->rerank(key, it->second, impl_->clock.now_ns());
}

void LineagePolicy::set_refetch_cost(const ChunkHash& key, double seconds) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  // A NaN priority would break the set's ordering, so neither NaN nor infinity gets in (infinity
  // times a frequency decayed to 0 is NaN); a negative cost means nothing. The largest finite cost
  // still ranks a chunk with no other copy last, which is what it deserves.
  it->second.refetch_cost = (seconds >= 0) ? std::min(seconds, std::numeric_limits<double>::max()) : 0.0;
  impl_->rerank(key, it->second, impl_->clock.now_ns());
}

std::optional<ChunkHash> LineagePolicy::pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
  for (const auto& [priority, sequence, key] : impl_->order) {
    if (!evictable(key)) continue;
    // max: a chunk that was pinned while L rose past it must not pull L back down.
    impl_->aging = std::max(impl_->aging, priority);
    return key;
  }
  return std::nullopt;
}

size_t LineagePolicy::size() const { return impl_->entries.size(); }

std::optional<double> LineagePolicy::priority(const ChunkHash& key) const {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return std::nullopt;
  return it->second.priority;
}

double LineagePolicy::aging() const { return impl_->aging; }

Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const std::string& name, const Clock& clock) {
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(std::make_unique<LruPolicy>());
  if (name == "lineage") return std::unique_ptr<EvictionPolicy>(std::make_unique<LineagePolicy>(clock));
  if (name == "hints") return std::unique_ptr<EvictionPolicy>(std::make_unique<HintAwarePolicy>(clock));
  return invalid_argument("policy.eviction: '" + name + "' is not one of lru, lineage, hints");
}

// ---- admission ----

namespace {

class AdmitAll final : public AdmissionPolicy {
 public:
  bool admit(const Candidate& /*c*/) const override { return true; }
  const char* name() const override { return "all"; }
};

// A chunk read once and used by one model is most likely a scan passing through: writing it to NVMe
// costs bandwidth that the chunks worth keeping need.
class AdmitReuse final : public AdmissionPolicy {
 public:
  bool admit(const Candidate& c) const override { return c.accesses >= 2 || c.references >= 2; }
  const char* name() const override { return "reuse"; }
};

}  // namespace

Result<std::unique_ptr<AdmissionPolicy>> make_admission_policy(const std::string& name) {
  if (name == "all") return std::unique_ptr<AdmissionPolicy>(std::make_unique<AdmitAll>());
  if (name == "reuse") return std::unique_ptr<AdmissionPolicy>(std::make_unique<AdmitReuse>());
  return invalid_argument("policy.admission: '" + name + "' is not one of all, reuse");
}

}  // namespace cairn
