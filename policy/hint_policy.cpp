#include "policy/hint_policy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "policy/gdsf.hpp"

namespace cairn {

struct HintAwarePolicy::Impl {
  // The lineage terms, exactly LineagePolicy's (gdsf::Terms), plus the hint terms.
  struct Entry : gdsf::Terms {
    bool population = false;
    bool done = false;
    bool cyclic = false;
    double parent_chance = std::numeric_limits<double>::quiet_NaN();  // NaN: not known
    // The sequence at which the chunk entered the policy.
    uint64_t taken_in = 0;
    std::optional<int64_t> expected_at_ns;  // when a read is expected (steady ns)
    Standing standing = Standing::kOrdinary;
  };
  // (standing, cyclic, chance, H, -expected_at, sequence, key), lowest first. Expected: (3, 0, 0,
  // 0, -expected_at, sequence): the farthest expected read first. Cyclic chunks of the ordinary and
  // population standings: (standing, 1, 0, -taken_in, 0, sequence): after the others of their
  // standing, the newest taken in first. Population: (2, 0, parent chance or 0 when not known, H,
  // 0, sequence): the least likely parent's first. Others: (standing, 0, 0, H, 0, sequence).
  // Sequences are unique.
  using Rank = std::tuple<int, int, double, double, int64_t, int64_t, ChunkHash>;

  const Clock& clock;
  Options options;
  double aging = 0;  // L
  uint64_t next_sequence = 0;
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries;
  std::set<Rank> order;
  std::set<std::pair<int64_t, ChunkHash>> expectations;  // (expected_at, key), to find stale ones

  Impl(const Clock& c, Options o) : clock(c), options(o) {}

  static Rank rank_of(const ChunkHash& key, const Entry& e) {
    if (e.standing == Standing::kExpected) {
      // Later reads rank lower; -INT64_MIN would overflow (add_seconds_ns only saturates upwards
      // here, but a clock may start anywhere).
      const int64_t at = std::max(*e.expected_at_ns, std::numeric_limits<int64_t>::min() + 1);
      return Rank{3, 0, 0.0, 0.0, -at, static_cast<int64_t>(e.sequence), key};
    }
    if (e.cyclic && e.standing != Standing::kDone) {
      const double newest_first = -static_cast<double>(e.taken_in);
      return Rank{static_cast<int>(e.standing), 1, 0.0, newest_first, 0, static_cast<int64_t>(e.sequence), key};
    }
    const double chance = e.standing == Standing::kPopulation && !std::isnan(e.parent_chance) ? e.parent_chance : 0.0;
    return Rank{static_cast<int>(e.standing), 0, chance, e.priority, 0, static_cast<int64_t>(e.sequence), key};
  }

  static Standing standing_of(const Entry& e) {
    if (e.expected_at_ns) return Standing::kExpected;
    if (e.done) return Standing::kDone;
    if (e.population) return Standing::kPopulation;
    return Standing::kOrdinary;
  }

  // H with the current L, as LineagePolicy computes it.
  void rerank_lineage(Entry& e, int64_t now) const {
    e.rerank(aging, now, options.half_life_s, options.default_bandwidth);
  }

  // REQUIRES: e is not in `order`. Recomputes the standing and inserts e.
  void place(const ChunkHash& key, Entry& e) {
    e.standing = standing_of(e);
    order.insert(rank_of(key, e));
  }

  void unplace(const ChunkHash& key, const Entry& e) { order.erase(rank_of(key, e)); }

  void clear_expectation(const ChunkHash& key, Entry& e) {
    if (!e.expected_at_ns) return;
    expectations.erase(std::make_pair(*e.expected_at_ns, key));
    e.expected_at_ns.reset();
  }

  // A read: frequency, recency and H as LineagePolicy; the read fulfils an expectation and refutes
  // a done hint. `fresh`: e was just created and is not in `order` yet.
  void access(const ChunkHash& key, Entry& e, bool fresh) {
    const int64_t now = clock.now_ns();
    if (!fresh) unplace(key, e);
    e.access(now, next_sequence++, options.half_life_s);
    clear_expectation(key, e);
    e.done = false;
    rerank_lineage(e, now);
    place(key, e);
  }

  // Sets a hint flag (population, done) of a tracked chunk and re-ranks it.
  void set_flag(const ChunkHash& key, bool Entry::*flag, bool value) {
    auto it = entries.find(key);
    if (it == entries.end() || it->second.*flag == value) return;
    unplace(key, it->second);
    it->second.*flag = value;
    place(key, it->second);
  }

  // Drops the expectations overdue by more than the grace.
  void drop_stale(int64_t now) {
    const double grace_ns = options.expected_use_grace_s * 1e9;
    while (!expectations.empty()) {
      const auto [at, key] = *expectations.begin();
      if (static_cast<double>(now) - static_cast<double>(at) <= grace_ns) break;
      Entry& e = entries.at(key);
      unplace(key, e);
      clear_expectation(key, e);
      place(key, e);
    }
  }
};

HintAwarePolicy::HintAwarePolicy(const Clock& clock) : HintAwarePolicy(clock, Options{}) {}

HintAwarePolicy::HintAwarePolicy(const Clock& clock, Options options) {
  gdsf::check_options("HintAwarePolicy", options.half_life_s, options.default_bandwidth);
  // Written so NaN fails too.
  if (!(options.expected_use_horizon_s > 0))
    throw std::invalid_argument("HintAwarePolicy: expected_use_horizon_s must be > 0 (infinity: no horizon)");
  if (!(options.expected_use_grace_s > 0) || std::isinf(options.expected_use_grace_s))
    throw std::invalid_argument("HintAwarePolicy: expected_use_grace_s must be a positive number of seconds");
  impl_ = std::make_unique<Impl>(clock, options);
}

HintAwarePolicy::~HintAwarePolicy() = default;

void HintAwarePolicy::track(const ChunkHash& key, uint64_t bytes) {
  auto [it, inserted] = impl_->entries.try_emplace(key);
  Impl::Entry& e = it->second;
  if (inserted) {
    e.last_access_ns = impl_->clock.now_ns();
    e.taken_in = impl_->next_sequence;
  }
  // Tracking a chunk again is an access, as in LineagePolicy (the rank does not hold the size, so
  // access() still finds the entry to re-rank).
  e.bytes = bytes;
  impl_->access(key, e, inserted);
}

void HintAwarePolicy::track_written(const ChunkHash& key, uint64_t bytes) {
  auto [it, inserted] = impl_->entries.try_emplace(key);
  Impl::Entry& e = it->second;
  if (!inserted) {  // a write of bytes the tier holds: no read, no change of rank but the size
    impl_->unplace(key, e);
    e.bytes = bytes;
    impl_->rerank_lineage(e, impl_->clock.now_ns());
    impl_->place(key, e);
    return;
  }
  const int64_t now = impl_->clock.now_ns();
  e.bytes = bytes;
  e.last_access_ns = now;
  e.taken_in = impl_->next_sequence;
  e.sequence = impl_->next_sequence++;
  impl_->rerank_lineage(e, now);
  impl_->place(key, e);
}

void HintAwarePolicy::touch(const ChunkHash& key) {
  auto it = impl_->entries.find(key);
  if (it != impl_->entries.end()) impl_->access(key, it->second, false);
}

void HintAwarePolicy::remove(const ChunkHash& key) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  impl_->unplace(key, it->second);
  impl_->clear_expectation(key, it->second);
  impl_->entries.erase(it);
}

void HintAwarePolicy::set_references(const ChunkHash& key, uint32_t live_models) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  Impl::Entry& e = it->second;
  impl_->unplace(key, e);
  e.references = live_models;
  impl_->rerank_lineage(e, impl_->clock.now_ns());
  impl_->place(key, e);
}

void HintAwarePolicy::set_refetch_cost(const ChunkHash& key, double seconds) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  Impl::Entry& e = it->second;
  impl_->unplace(key, e);
  e.set_refetch_cost(seconds);
  impl_->rerank_lineage(e, impl_->clock.now_ns());
  impl_->place(key, e);
}

void HintAwarePolicy::set_expected_use(const ChunkHash& key, double seconds_from_now) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  Impl::Entry& e = it->second;
  impl_->unplace(key, e);
  impl_->clear_expectation(key, e);
  // NaN and +infinity withdraw; so does a read expected beyond the horizon (the caller tells again
  // when it is nearer).
  if (!std::isnan(seconds_from_now) && seconds_from_now <= impl_->options.expected_use_horizon_s &&
      !std::isinf(seconds_from_now)) {
    const int64_t at = add_seconds_ns(impl_->clock.now_ns(), std::max(0.0, seconds_from_now));
    e.expected_at_ns = at;
    impl_->expectations.insert(std::make_pair(at, key));
  }
  impl_->place(key, e);
}

void HintAwarePolicy::set_population(const ChunkHash& key, bool member) {
  impl_->set_flag(key, &Impl::Entry::population, member);
}

void HintAwarePolicy::set_parent_chance(const ChunkHash& key, double chance) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  Impl::Entry& e = it->second;
  const double value = std::isnan(chance) ? chance : std::clamp(chance, 0.0, 1.0);
  if (std::isnan(value) && std::isnan(e.parent_chance)) return;
  if (value == e.parent_chance) return;
  impl_->unplace(key, e);
  e.parent_chance = value;
  impl_->place(key, e);
}

void HintAwarePolicy::set_done(const ChunkHash& key, bool done) { impl_->set_flag(key, &Impl::Entry::done, done); }

void HintAwarePolicy::set_cyclic(const ChunkHash& key, bool in_cycle) {
  impl_->set_flag(key, &Impl::Entry::cyclic, in_cycle);
}

std::optional<ChunkHash> HintAwarePolicy::pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
  impl_->drop_stale(impl_->clock.now_ns());
  for (const auto& [rank_standing, rank_cyclic, chance, h, neg_expected, sequence, key] : impl_->order) {
    if (!evictable(key)) continue;
    // Only the ordinary competition moves L (and never down: see LineagePolicy); a cyclic victim's
    // rank is not its H.
    if (rank_cyclic == 0 && (rank_standing == static_cast<int>(Standing::kOrdinary) ||
                             rank_standing == static_cast<int>(Standing::kPopulation)))
      impl_->aging = std::max(impl_->aging, h);
    return key;
  }
  return std::nullopt;
}

std::optional<ChunkHash> HintAwarePolicy::peek_victim(const std::function<bool(const ChunkHash&)>& evictable) const {
  for (const auto& rank : impl_->order)
    if (evictable(std::get<6>(rank))) return std::get<6>(rank);
  return std::nullopt;
}

size_t HintAwarePolicy::size() const { return impl_->entries.size(); }

std::optional<HintAwarePolicy::Standing> HintAwarePolicy::standing(const ChunkHash& key) const {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return std::nullopt;
  return it->second.standing;
}

std::optional<bool> HintAwarePolicy::cyclic(const ChunkHash& key) const {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return std::nullopt;
  return it->second.cyclic;
}

std::optional<double> HintAwarePolicy::parent_chance(const ChunkHash& key) const {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return std::nullopt;
  return it->second.parent_chance;
}

std::optional<double> HintAwarePolicy::priority(const ChunkHash& key) const {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return std::nullopt;
  return it->second.priority;
}

double HintAwarePolicy::aging() const { return impl_->aging; }

int64_t add_seconds_ns(int64_t now_ns, double seconds) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  const double ns = seconds * 1e9;
  // 9.2e18 is below 2^63, so the casts below stay in range.
  if (ns >= 9.2e18) return kMax;
  if (ns <= -9.2e18) return kMin;
  const auto d = static_cast<int64_t>(ns);
  if (d > 0 && now_ns > kMax - d) return kMax;
  if (d < 0 && now_ns < kMin - d) return kMin;
  return now_ns + d;
}

const char* standing_name(HintAwarePolicy::Standing s) {
  switch (s) {
    case HintAwarePolicy::Standing::kDone:
      return "done";
    case HintAwarePolicy::Standing::kOrdinary:
      return "ordinary";
    case HintAwarePolicy::Standing::kPopulation:
      return "population";
    case HintAwarePolicy::Standing::kExpected:
      return "expected";
  }
  return "?";
}

}  // namespace cairn
