#include "policy/eviction.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>

#include "policy/gdsf.hpp"
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
  auto [it, fresh] = index_.try_emplace(key);
  if (!fresh) {
    order_.erase(order_.iterator_to(it->second));
  } else {
    it->second.key = key;
  }
  order_.push_front(it->second);
}

void LruPolicy::touch(const ChunkHash& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  order_.erase(order_.iterator_to(it->second));
  order_.push_front(it->second);
}

void LruPolicy::remove(const ChunkHash& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  order_.erase(order_.iterator_to(it->second));
  index_.erase(it);
}

std::optional<ChunkHash> LruPolicy::pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it)
    if (evictable(it->key)) return it->key;
  return std::nullopt;
}

// ---- LineagePolicy ----

// LineagePolicy is HintAwarePolicy without its hint hooks: with no hint every chunk is ordinary and
// HintAwarePolicy ranks by exactly LineagePolicy's H, raising L the same way, so one implementation
// of the scorer serves both (the hint hooks stay EvictionPolicy's no-ops here).
struct LineagePolicy::Impl {
  HintAwarePolicy scorer;
  Impl(const Clock& clock, const Options& o) : scorer(clock, scorer_options(o)) {}
  static HintAwarePolicy::Options scorer_options(const Options& o) {
    HintAwarePolicy::Options h;
    h.half_life_s = o.half_life_s;
    h.default_bandwidth = o.default_bandwidth;
    return h;
  }
};

LineagePolicy::LineagePolicy(const Clock& clock) : LineagePolicy(clock, Options{}) {}

LineagePolicy::LineagePolicy(const Clock& clock, Options options) {
  gdsf::check_options("LineagePolicy", options.half_life_s, options.default_bandwidth);
  impl_ = std::make_unique<Impl>(clock, options);
}

LineagePolicy::~LineagePolicy() = default;

void LineagePolicy::track(const ChunkHash& key, uint64_t bytes) { impl_->scorer.track(key, bytes); }
void LineagePolicy::track_written(const ChunkHash& key, uint64_t bytes) { impl_->scorer.track_written(key, bytes); }
void LineagePolicy::touch(const ChunkHash& key) { impl_->scorer.touch(key); }
void LineagePolicy::remove(const ChunkHash& key) { impl_->scorer.remove(key); }
void LineagePolicy::set_references(const ChunkHash& key, uint32_t live_models) {
  impl_->scorer.set_references(key, live_models);
}
void LineagePolicy::set_refetch_cost(const ChunkHash& key, double seconds) {
  impl_->scorer.set_refetch_cost(key, seconds);
}
std::optional<ChunkHash> LineagePolicy::pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
  return impl_->scorer.pick_victim(evictable);
}
size_t LineagePolicy::size() const { return impl_->scorer.size(); }
std::optional<double> LineagePolicy::priority(const ChunkHash& key) const { return impl_->scorer.priority(key); }
double LineagePolicy::aging() const { return impl_->scorer.aging(); }

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
