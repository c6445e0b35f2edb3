#include "policy/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "policy/simulator_internal.hpp"

namespace cairn {

namespace {

// The model-level knowledge of one replay (which models use which chunks, population, done,
// expected reads), turned into the per-chunk calls of EvictionPolicy for the resident chunks.
// With `hints` false only references are passed on (the lineage policy).
class HintTracker {
 public:
  HintTracker(EvictionPolicy& policy, const FakeClock& clock, const std::vector<char>& resident, size_t models,
              size_t chunks, bool hints, const SimOptions& options)
      : policy_(policy),
        clock_(clock),
        resident_(resident),
        hints_(hints),
        options_(options),
        model_chunks_(models),
        chunk_models_(chunks),
        chunk_positions_(chunks),
        population_count_(chunks, 0),
        done_count_(chunks, 0),
        cyclic_count_(chunks, 0),
        in_population_(models, 0),
        model_chance_(models, std::numeric_limits<double>::quiet_NaN()),
        cyclic_(models, 0),
        last_end_ns_(models, -1),
        done_(models, 0),
        expected_at_(models),
        chunk_expected_at_(chunks) {}

  // Model m read or wrote chunk c: remembers the pair, and passes on what changes for c.
  void use(uint32_t m, uint32_t c) {
    if (!pairs_.insert((static_cast<uint64_t>(m) << 32) | c).second) return;
    chunk_positions_[c].push_back(static_cast<uint32_t>(model_chunks_[m].size()));
    model_chunks_[m].push_back(c);
    chunk_models_[c].push_back(m);
    population_count_[c] += in_population_[m];
    done_count_[c] += done_[m];
    cyclic_count_[c] += cyclic_[m];
    if (!resident_[c]) return;
    policy_.set_references(key_of(c), references(c));
    if (!hints_) return;
    policy_.set_population(key_of(c), population_count_[c] > 0);
    policy_.set_parent_chance(key_of(c), parent_chance(c));
    policy_.set_cyclic(key_of(c), cyclic_count_[c] > 0);
    policy_.set_done(key_of(c), is_done(c));
    if (expected_at_[m]) refresh_expected(c, kSimNone);
  }

  // After the policy tracked c (fresh): passes on everything known about c. `reader` kSimNone: a
  // commit wrote c (it fulfils no expectation).
  void tracked(uint32_t c, uint32_t reader) {
    policy_.set_references(key_of(c), references(c));
    if (!hints_) return;
    if (reader != kSimNone) fulfil(c);
    policy_.set_population(key_of(c), population_count_[c] > 0);
    policy_.set_parent_chance(key_of(c), parent_chance(c));
    policy_.set_cyclic(key_of(c), cyclic_count_[c] > 0);
    policy_.set_done(key_of(c), is_done(c));
    refresh_expected(c, reader);
  }

  // After the policy saw `reader` read c (which withdrew c's expectation and done flag).
  void touched(uint32_t c, uint32_t reader) {
    if (!hints_) return;
    fulfil(c);
    if (is_done(c)) policy_.set_done(key_of(c), true);
    refresh_expected(c, reader);
  }

  // An access of chunk c by m: a done model read again was not done; a new run of reads by another
  // model ends the previous one (whose expectation it fulfilled). The model is read in a cycle that
  // does not fit (cyclic) when a run reads its first chunk again (it wrapped around), or reads a
  // chunk an earlier run of the model read that has left the cache since (as the daemon's rule,
  // daemon/read_cycles.hpp); it stays cyclic until a done hint names it, or its next run starts
  // more than kCycleIdleNs after its last one ended (the daemon forgets it then).
  void access_by(uint32_t m, uint32_t c) {
    if (!hints_) return;
    if (done_[m]) set_done(m, false);
    const int64_t now = clock_.now_ns();
    const bool recent = last_end_ns_[m] >= 0 && now - last_end_ns_[m] <= kCycleIdleNs;
    if (m != loading_ && cyclic_[m] && !recent) set_cyclic(m, false);
    if (!cyclic_[m] && recent && !resident_[c] && read_before_.count((static_cast<uint64_t>(m) << 32) | c))
      set_cyclic(m, true);
    if (m == loading_) {
      if (c == run_first_chunk_ && !cyclic_[m]) set_cyclic(m, true);
      run_chunks_.push_back(c);
      return;
    }
    end_load();
    loading_ = m;
    run_first_chunk_ = c;
    run_chunks_.push_back(c);
    if (last_load_start_ns_ >= 0) {
      load_gaps_ns_ += static_cast<double>(now - last_load_start_ns_);
      ++load_gaps_;
    }
    last_load_start_ns_ = now;
  }

  // The run of reads of the loading model ended: its expectation is fulfilled.
  void end_load() {
    if (loading_ != kSimNone && expected_at_[loading_]) set_expected(loading_, std::nullopt);
    if (loading_ != kSimNone) {
      last_end_ns_[loading_] = clock_.now_ns();
      count_load();
    }
    loading_ = kSimNone;
  }

  // A read of c fulfils its earliest chunk-level expectation (if any); a later one (another
  // candidate that will read c too) stays. Stale ones go with it.
  void fulfil(uint32_t c) {
    auto& pending = chunk_expected_at_[c];
    if (pending.empty()) return;
    const int64_t now = clock_.now_ns();
    pending.erase(pending.begin());
    --pending_;
    while (!pending.empty() && stale(pending.front(), now)) {
      pending.erase(pending.begin());
      --pending_;
    }
  }

  void hint(const SimEvent& e) {
    if (!hints_) return;
    const int64_t now = clock_.now_ns();
    if (e.chunk != kSimNone) {  // a will_load scoped to tensors: this chunk only, one read each
      const uint32_t c = e.chunk;
      const int64_t at = add_seconds_ns(now, e.when_s.value_or(0.0));
      auto& pending = chunk_expected_at_[c];
      pending.insert(std::upper_bound(pending.begin(), pending.end(), at), at);
      ++pending_;
      if (resident_[c]) refresh_expected(c, kSimNone);
      return;
    }
    switch (e.hint) {
      case HintKind::kWillLoad:
        for (uint32_t m : e.models) {
          if (done_[m]) set_done(m, false);
          set_expected(m, add_seconds_ns(now, e.when_s.value_or(0.0)));
        }
        break;
      case HintKind::kSequence: {
        const double step = sequence_step_s(e.models.size());
        for (size_t i = 0; i < e.models.size(); ++i) {
          const uint32_t m = e.models[i];
          if (done_[m]) set_done(m, false);
          set_expected(m, add_seconds_ns(now, static_cast<double>(i) * step));
        }
        break;
      }
      case HintKind::kPopulation: {
        // A new population: the chances of the previous one no longer hold (parent_chance lines
        // that follow give the new ones).
        for (uint32_t m : std::exchange(chanced_, {})) set_chance(m, std::numeric_limits<double>::quiet_NaN());
        std::unordered_set<uint32_t> next(e.models.begin(), e.models.end());
        for (uint32_t m : std::vector<uint32_t>(population_.begin(), population_.end()))
          if (!next.count(m)) set_population(m, false);
        for (uint32_t m : next) {
          if (done_[m]) set_done(m, false);
          if (!in_population_[m]) set_population(m, true);
        }
        break;
      }
      case HintKind::kParentChance:
        if (e.when_s) {
          chanced_.push_back(e.models.front());
          set_chance(e.models.front(), *e.when_s);
        }
        break;
      case HintKind::kDone:
        for (uint32_t m : e.models) {
          if (expected_at_[m]) set_expected(m, std::nullopt);
          if (!done_[m]) set_done(m, true);
          if (cyclic_[m]) set_cyclic(m, false);
        }
        break;
      case HintKind::kNone:
        break;
    }
  }

 private:
  // The models using c; with hints, those not done (a done model will not read it again).
  uint32_t references(uint32_t c) const {
    const auto all = static_cast<uint32_t>(chunk_models_[c].size());
    return hints_ ? all - done_count_[c] : all;
  }

  bool is_done(uint32_t c) const { return !chunk_models_[c].empty() && done_count_[c] == chunk_models_[c].size(); }

  // Seconds between the models of a sequence of `count`: the option, or the mean time between load
  // starts so far, shortened so that the whole sequence lies within the policy's horizon (a
  // sequence names what comes next, in order; the order matters more than the estimate).
  double sequence_step_s(size_t count) const {
    double step = options_.sequence_step_s;
    if (step == 0) step = load_gaps_ == 0 ? 1.0 : load_gaps_ns_ / static_cast<double>(load_gaps_) * 1e-9;
    if (count > 1) step = std::min(step, options_.hints.expected_use_horizon_s / static_cast<double>(count - 1));
    return step;
  }

  void set_done(uint32_t m, bool done) {
    done_[m] = done;
    for (uint32_t c : model_chunks_[m]) {
      done_count_[c] = done ? done_count_[c] + 1 : done_count_[c] - 1;
      if (!resident_[c]) continue;
      policy_.set_references(key_of(c), references(c));
      policy_.set_done(key_of(c), is_done(c));
    }
  }

  void set_population(uint32_t m, bool member) {
    in_population_[m] = member;
    if (member) {
      population_.insert(m);
    } else {
      population_.erase(m);
    }
    for (uint32_t c : model_chunks_[m]) {
      population_count_[c] = member ? population_count_[c] + 1 : population_count_[c] - 1;
      if (!resident_[c]) continue;
      policy_.set_population(key_of(c), population_count_[c] > 0);
      policy_.set_parent_chance(key_of(c), parent_chance(c));
    }
  }

  // The load that ended read run_chunks_ of loading_: counts the positions it read once each. (The
  // chances passed on change with the next hint or use, as in the daemon, which weighs a
  // population's chunks when the hint comes and when a member is committed.)
  void count_load() {
    std::unordered_set<uint32_t> seen;
    for (uint32_t c : run_chunks_) {
      if (!seen.insert(c).second) continue;
      read_before_.insert((static_cast<uint64_t>(loading_) << 32) | c);
      const uint32_t j = position(loading_, c);
      if (j == kSimNone) continue;
      if (reads_at_.size() <= j) reads_at_.resize(j + 1, 0);
      ++reads_at_[j];
    }
    run_chunks_.clear();
    ++loads_;
  }

  // The position of c in m (the order in which the trace first showed m using it), kSimNone if m
  // does not use c.
  uint32_t position(uint32_t m, uint32_t c) const {
    for (size_t i = 0; i < chunk_models_[c].size(); ++i)
      if (chunk_models_[c][i] == m) return chunk_positions_[c][i];
    return kSimNone;
  }

  // The share of the loads so far that read position j of the model they loaded (1 before any).
  double share(uint32_t j) const {
    if (loads_ == 0) return 1.0;
    return j < reads_at_.size() ? static_cast<double>(reads_at_[j]) / static_cast<double>(loads_) : 0.0;
  }

  // Model m's chance to be the next parent (NaN: not known), passed on to its resident chunks.
  void set_chance(uint32_t m, double chance) {
    model_chance_[m] = chance;
    for (uint32_t c : model_chunks_[m])
      if (resident_[c]) policy_.set_parent_chance(key_of(c), parent_chance(c));
  }

  // The chance that the next load reads c: over the population members using c, the sum of each
  // one's chance to be the next parent times the share of loads that read c's position in it (the
  // members are one parent each, so the events are disjoint); NaN when none of them has a chance.
  double parent_chance(uint32_t c) const {
    double sum = std::numeric_limits<double>::quiet_NaN();
    for (size_t i = 0; i < chunk_models_[c].size(); ++i) {
      const uint32_t m = chunk_models_[c][i];
      if (!in_population_[m] || std::isnan(model_chance_[m])) continue;
      const double p = model_chance_[m] * share(chunk_positions_[c][i]);
      sum = std::isnan(sum) ? p : sum + p;
    }
    return std::min(sum, 1.0);
  }

  void set_cyclic(uint32_t m, bool in_cycle) {
    cyclic_[m] = in_cycle;
    for (uint32_t c : model_chunks_[m]) {
      cyclic_count_[c] = in_cycle ? cyclic_count_[c] + 1 : cyclic_count_[c] - 1;
      if (resident_[c]) policy_.set_cyclic(key_of(c), cyclic_count_[c] > 0);
    }
  }

  void set_expected(uint32_t m, std::optional<int64_t> at) {
    if (at && !expected_at_[m]) ++pending_;
    if (!at && expected_at_[m]) --pending_;
    expected_at_[m] = at;
    for (uint32_t c : model_chunks_[m])
      if (resident_[c]) refresh_expected(c, kSimNone);
  }

  // Passes on c's nearest expected read by a model other than `reader` (or none).
  void refresh_expected(uint32_t c, uint32_t reader) {
    if (pending_ == 0) {
      policy_.set_expected_use(key_of(c), std::numeric_limits<double>::infinity());
      return;
    }
    const int64_t now = clock_.now_ns();
    std::optional<int64_t> soonest;
    for (int64_t at : chunk_expected_at_[c])
      if (!stale(at, now)) {
        soonest = at;
        break;
      }
    for (uint32_t m : chunk_models_[c]) {
      if (m == reader || !expected_at_[m] || stale(*expected_at_[m], now)) continue;
      if (!soonest || *expected_at_[m] < *soonest) soonest = expected_at_[m];
    }
    policy_.set_expected_use(key_of(c), soonest ? (static_cast<double>(*soonest) - static_cast<double>(now)) * 1e-9
                                                : std::numeric_limits<double>::infinity());
  }

  // An expectation overdue by more than the policy's grace (the policy drops those itself).
  bool stale(int64_t at, int64_t now) const {
    return static_cast<double>(now) - static_cast<double>(at) > options_.hints.expected_use_grace_s * 1e9;
  }

  EvictionPolicy& policy_;
  const FakeClock& clock_;
  const std::vector<char>& resident_;
  const bool hints_;
  const SimOptions& options_;
  std::unordered_set<uint64_t> pairs_;  // (model << 32) | chunk seen
  std::vector<std::vector<uint32_t>> model_chunks_;
  std::vector<std::vector<uint32_t>> chunk_models_;
  std::vector<std::vector<uint32_t>> chunk_positions_;      // parallel to chunk_models_: c's position in each
  static constexpr int64_t kCycleIdleNs = 120'000'000'000;  // as the daemon's ReadCycles
  std::unordered_set<uint64_t> read_before_;                // (model << 32) | chunk read by an ended run of the model
  std::vector<uint32_t> run_chunks_;                        // chunks the current load read, in order
  std::vector<uint64_t> reads_at_;                          // loads that read position j
  uint64_t loads_ = 0;
  std::vector<uint32_t> population_count_;  // models of the population using the chunk
  std::vector<uint32_t> done_count_;        // done models using the chunk
  std::vector<uint32_t> cyclic_count_;      // models read in a cycle using the chunk
  std::vector<char> in_population_;
  std::vector<double> model_chance_;  // parent_chance hints of the current population (NaN: none)
  std::vector<uint32_t> chanced_;     // the models given a chance since the last population hint
  std::vector<char> cyclic_;
  std::vector<int64_t> last_end_ns_;  // per model: when its last run of reads ended (-1: never)
  std::vector<char> done_;
  std::vector<std::optional<int64_t>> expected_at_;
  std::vector<std::vector<int64_t>> chunk_expected_at_;  // will_load hints naming the chunk, sorted
  std::set<uint32_t> population_;
  size_t pending_ = 0;  // models and chunks with an expectation
  uint32_t loading_ = kSimNone;
  uint32_t run_first_chunk_ = kSimNone;  // the chunk the loading model's run of reads began with
  int64_t last_load_start_ns_ = -1;
  double load_gaps_ns_ = 0;
  uint64_t load_gaps_ = 0;
};

}  // namespace

SimResult Simulator::Impl::run_online(SimPolicy which, uint64_t capacity) const {
  SimResult r;
  r.policy = which;
  r.capacity_bytes = capacity;
  FakeClock clock(events.empty() ? 0 : events.front().time_ns);
  std::unique_ptr<EvictionPolicy> policy;
  switch (which) {
    case SimPolicy::kLineage:
      policy = std::make_unique<LineagePolicy>(clock, options.lineage);
      break;
    case SimPolicy::kHints:
      policy = std::make_unique<HintAwarePolicy>(clock, options.hints);
      break;
    default:
      policy = std::make_unique<LruPolicy>();
      break;
  }
  std::vector<char> resident(chunk_bytes.size(), 0);
  uint64_t used = 0;
  const bool tracks_models = which != SimPolicy::kLru;
  const bool cold_writes = options.cold_writes;
  HintTracker tracker(*policy, clock, resident, model_count, chunk_bytes.size(), which == SimPolicy::kHints, options);
  const std::function<bool(const ChunkHash&)> any = [](const ChunkHash&) { return true; };

  // Brings c in, evicting until it fits; false when it cannot be cached at all.
  // With competing admission the chunk is taken in with its hint state first and then chunks leave
  // until the cache fits again. The new chunk itself leaves (is bypassed, not cached), whether a
  // read or a commit brought it in, when it ranks lowest and the chunk that would go in its place is
  // one the hints protect: an expected read, the stable part of a cycle, or a population chunk with
  // a known parent chance (the daemon takes a written chunk in and, ranking lowest, it is the first
  // victim once flushed). Otherwise victims are what they are without competing admission.
  auto* hint_policy = dynamic_cast<HintAwarePolicy*>(policy.get());
  const bool competes = hint_policy != nullptr && options.competing_admission;
  auto make_room = [&](uint32_t c) {
    const ChunkHash incoming = key_of(c);
    const std::function<bool(const ChunkHash&)> others = [&](const ChunkHash& k) { return !(k == incoming); };
    while (competes && used > capacity) {
      bool bypass = false;
      if (hint_policy->peek_victim(any) == incoming) {
        const std::optional<ChunkHash> other = hint_policy->peek_victim(others);
        // A population chunk with a known chance that ranks above the incoming chunk is likelier
        // to be read next: the scores decide.
        const bool likelier = other && hint_policy->standing(*other) == HintAwarePolicy::Standing::kPopulation &&
                              !std::isnan(hint_policy->parent_chance(*other).value_or(std::nan("")));
        bypass = !other || likelier || hint_policy->standing(*other) == HintAwarePolicy::Standing::kExpected ||
                 hint_policy->cyclic(*other).value_or(false);
      }
      std::optional<ChunkHash> victim = bypass ? std::optional<ChunkHash>(incoming) : policy->pick_victim(others);
      if (!victim) break;  // cannot happen: every resident chunk is evictable
      const uint32_t v = static_cast<uint32_t>(victim->lo);
      policy->remove(*victim);
      resident[v] = 0;
      used -= chunk_bytes[v];
      if (v == c) {
        ++r.bypassed;
      } else {
        ++r.evictions;
      }
    }
  };
  auto admit = [&](uint32_t c, bool written = false) {
    const uint64_t bytes = chunk_bytes[c];
    if (bytes > capacity) {
      ++r.bypassed;
      return false;
    }
    while (!competes && used + bytes > capacity) {
      std::optional<ChunkHash> victim = policy->pick_victim(any);
      if (!victim) break;  // cannot happen: every resident chunk is evictable
      const uint32_t v = static_cast<uint32_t>(victim->lo);
      policy->remove(*victim);
      resident[v] = 0;
      used -= chunk_bytes[v];
      ++r.evictions;
    }
    if (written && cold_writes)
      policy->track_written(key_of(c), bytes);
    else
      policy->track(key_of(c), bytes);
    resident[c] = 1;
    used += bytes;
    return true;
  };

  for (const SimEvent& e : events) {
    clock.advance_ns(e.time_ns - clock.now_ns());
    switch (e.kind) {
      case TraceEventKind::kAccess: {
        const uint32_t c = e.chunk, m = e.models.front();
        if (tracks_models) tracker.access_by(m, c);
        const bool hit = resident[c] != 0;
        count_request(r, e, chunk_bytes[c], hit);
        if (hit) {
          policy->touch(key_of(c));
          if (tracks_models) {
            tracker.use(m, c);
            tracker.touched(c, m);
          }
        } else if (admit(c) && tracks_models) {
          tracker.use(m, c);
          tracker.tracked(c, m);
          make_room(c);
        } else if (tracks_models) {
          tracker.use(m, c);
        }
        break;
      }
      case TraceEventKind::kInsert: {
        const uint32_t c = e.chunk, m = e.models.front();
        if (tracks_models) tracker.end_load();
        if (!resident[c] && admit(c, true) && tracks_models) {
          tracker.use(m, c);
          tracker.tracked(c, kSimNone);
          make_room(c);
        } else if (tracks_models) {
          tracker.use(m, c);
        }
        break;
      }
      case TraceEventKind::kInherit:
        if (tracks_models) {
          tracker.end_load();
          tracker.use(e.models.front(), e.chunk);
        }
        break;
      case TraceEventKind::kHint:
        if (tracks_models) {
          tracker.end_load();
          tracker.hint(e);
        }
        break;
      case TraceEventKind::kCommit:
        if (tracks_models) tracker.end_load();
        break;
      case TraceEventKind::kEvict:
        break;
    }
  }
  return r;
}

SimResult Simulator::Impl::run_belady(uint64_t capacity) const {
  SimResult r;
  r.policy = SimPolicy::kBelady;
  r.capacity_bytes = capacity;
  // Resident chunks by their next access, farthest last.
  std::set<std::pair<size_t, uint32_t>> by_next;
  std::vector<size_t> next_of(chunk_bytes.size(), kSimNever);
  std::vector<char> resident(chunk_bytes.size(), 0);
  uint64_t used = 0;

  // Caches c (next read at `next`) if that is worth it: evicts the chunks read farthest ahead, all
  // farther than `next`, until c fits; bypasses c when those do not free enough room.
  auto admit = [&](uint32_t c, size_t next) {
    const uint64_t bytes = chunk_bytes[c];
    if (bytes > capacity || next == kSimNever) {
      ++r.bypassed;
      return;
    }
    if (used + bytes > capacity) {
      uint64_t freed = 0;
      auto it = by_next.end();
      while (used - freed + bytes > capacity && it != by_next.begin()) {
        --it;
        if (it->first <= next) break;
        freed += chunk_bytes[it->second];
      }
      if (used - freed + bytes > capacity) {
        ++r.bypassed;
        return;
      }
      while (used + bytes > capacity) {
        auto last = std::prev(by_next.end());
        resident[last->second] = 0;
        used -= chunk_bytes[last->second];
        by_next.erase(last);
        ++r.evictions;
      }
    }
    resident[c] = 1;
    used += bytes;
    next_of[c] = next;
    by_next.insert(std::make_pair(next, c));
  };

  for (const SimEvent& e : events) {
    if (e.kind != TraceEventKind::kAccess && e.kind != TraceEventKind::kInsert) continue;
    const uint32_t c = e.chunk;
    if (e.kind == TraceEventKind::kAccess) count_request(r, e, chunk_bytes[c], resident[c] != 0);
    if (resident[c]) {
      by_next.erase(std::make_pair(next_of[c], c));
      next_of[c] = e.next_access;
      by_next.insert(std::make_pair(next_of[c], c));
    } else {
      admit(c, e.next_access);
    }
  }
  return r;
}

// ---- Simulator ----

const char* sim_policy_name(SimPolicy p) {
  switch (p) {
    case SimPolicy::kLru:
      return "lru";
    case SimPolicy::kLineage:
      return "lineage";
    case SimPolicy::kHints:
      return "hints";
    case SimPolicy::kArc:
      return "arc";
    case SimPolicy::kS3Fifo:
      return "s3fifo";
    case SimPolicy::kBound:
      return "bound";
    case SimPolicy::kBelady:
      return "belady";
  }
  return "?";
}

Result<SimPolicy> parse_sim_policy(const std::string& name) {
  for (SimPolicy p : kAllSimPolicies)
    if (name == sim_policy_name(p)) return p;
  return invalid_argument("policy '" + name + "' is not one of lru, arc, s3fifo, lineage, hints, bound, belady");
}

Simulator::Simulator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Simulator::Simulator(Simulator&&) noexcept = default;
Simulator& Simulator::operator=(Simulator&&) noexcept = default;
Simulator::~Simulator() = default;

Result<Simulator> Simulator::create(const Trace& trace, SimOptions options) {
  if (!(options.sequence_step_s >= 0) || std::isinf(options.sequence_step_s))
    return invalid_argument("simulator: sequence_step_s must be a finite number of seconds >= 0");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::unordered_map<std::string, uint32_t> chunk_ids, model_ids;
  auto model_id = [&](const std::string& m) {
    auto [it, inserted] = model_ids.try_emplace(m, static_cast<uint32_t>(model_ids.size()));
    return it->second;
  };
  TraceSummary& s = impl->summary;
  std::vector<char> accessed, seen;
  std::unordered_set<uint32_t> data_models;
  impl->events.reserve(trace.events.size());
  int64_t last_time = 0;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& t = trace.events[i];
    // A trace built in memory has not been through the reader's checks.
    if (Status valid = validate_trace_event(t); !valid.ok())
      return invalid_argument("simulator: event " + std::to_string(i + 1) + ": " + valid.message());
    if (t.time_ns < last_time)
      return invalid_argument("simulator: event " + std::to_string(i + 1) + ": time_ns goes back");
    last_time = t.time_ns;
    SimEvent e;
    e.kind = t.kind;
    e.time_ns = t.time_ns;
    e.tier = t.tier;
    e.hint = t.hint;
    e.when_s = t.when_s;
    ++s.events;
    if (t.kind == TraceEventKind::kEvict) {
      impl->events.push_back(std::move(e));
      continue;
    }
    for (const std::string& m : t.models) e.models.push_back(model_id(m));
    if (t.kind != TraceEventKind::kHint) data_models.insert(e.models.front());
    if (t.kind == TraceEventKind::kHint) ++s.hints;
    // A will_load hint may name a chunk (a hint scoped to tensors, recorded chunk by chunk).
    if (t.kind == TraceEventKind::kAccess || t.kind == TraceEventKind::kInsert || t.kind == TraceEventKind::kInherit ||
        !t.chunk.empty()) {
      auto [it, inserted] = chunk_ids.try_emplace(t.chunk, static_cast<uint32_t>(chunk_ids.size()));
      e.chunk = it->second;
      if (inserted) {
        impl->chunk_bytes.push_back(t.bytes);
        accessed.push_back(0);
        seen.push_back(0);
      } else if (impl->chunk_bytes[e.chunk] != t.bytes) {
        return invalid_argument("simulator: event " + std::to_string(i + 1) + ": chunk " + t.chunk + " has " +
                                std::to_string(t.bytes) + " bytes, but " + std::to_string(impl->chunk_bytes[e.chunk]) +
                                " before (a chunk id names one content)");
      }
      if (t.kind == TraceEventKind::kAccess) {
        ++s.accesses;
        s.bytes_requested += t.bytes;
        if (seen[e.chunk]) {
          ++s.unbounded_hits;
          s.unbounded_bytes_hit += t.bytes;
        }
        if (!accessed[e.chunk]) {
          accessed[e.chunk] = 1;
          ++s.chunks_accessed;
          s.working_set_bytes += t.bytes;
        }
        seen[e.chunk] = 1;
      } else if (t.kind == TraceEventKind::kInsert) {
        ++s.inserts;
        seen[e.chunk] = 1;
      }
    }
    impl->events.push_back(std::move(e));
  }
  s.models = data_models.size();
  impl->model_count = model_ids.size();
  // Next accesses, from the end.
  std::vector<size_t> next(impl->chunk_bytes.size(), kSimNever);
  for (size_t i = impl->events.size(); i-- > 0;) {
    SimEvent& e = impl->events[i];
    if (e.chunk == kSimNone) continue;
    e.next_access = next[e.chunk];
    if (e.kind == TraceEventKind::kAccess) next[e.chunk] = i;
  }
  return Simulator(std::move(impl));
}

const TraceSummary& Simulator::summary() const { return impl_->summary; }

SimResult Simulator::run(SimPolicy policy, uint64_t capacity_bytes) const {
  switch (policy) {
    case SimPolicy::kBelady:
      return impl_->run_belady(capacity_bytes);
    case SimPolicy::kArc:
    case SimPolicy::kS3Fifo:
      return impl_->run_baseline(policy, capacity_bytes);
    case SimPolicy::kBound:
      return impl_->run_bound(capacity_bytes);
    default:
      return impl_->run_online(policy, capacity_bytes);
  }
}

std::vector<SimResult> Simulator::run_fractions(const std::vector<SimPolicy>& policies,
                                                const std::vector<double>& fractions) const {
  std::vector<SimResult> out;
  for (double f : fractions) {
    const auto capacity = static_cast<uint64_t>(std::floor(f * static_cast<double>(impl_->summary.working_set_bytes)));
    for (SimPolicy p : policies) {
      SimResult r = run(p, capacity);
      r.fraction = f;
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace cairn
