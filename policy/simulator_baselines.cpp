// The simulator's replays of the field's baselines (ARC, S3-FIFO: policy/baselines.hpp) and of the
// win-probability bound (docs/policy.md, "Simulator and cairn-sim").
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "policy/baselines.hpp"
#include "policy/simulator.hpp"
#include "policy/simulator_internal.hpp"

namespace cairn {

SimResult Simulator::Impl::run_baseline(SimPolicy which, uint64_t capacity) const {
  SimResult r;
  r.policy = which;
  r.capacity_bytes = capacity;
  std::unique_ptr<BaselineCache> cache;
  if (which == SimPolicy::kArc) {
    cache = std::make_unique<ArcCache>(capacity);
  } else {
    cache = std::make_unique<S3FifoCache>(capacity);
  }
  for (const SimEvent& e : events) {
    if (e.kind == TraceEventKind::kAccess) {
      count_request(r, e, chunk_bytes[e.chunk], cache->access(e.chunk, chunk_bytes[e.chunk]));
    } else if (e.kind == TraceEventKind::kInsert) {
      cache->insert(e.chunk, chunk_bytes[e.chunk]);
    }
  }
  r.evictions = cache->evictions();
  r.bypassed = cache->bypassed();
  return r;
}

namespace {

// What the win-probability bound is told, computed once per replay from the whole trace.
//  - A load is a run of consecutive reads of one model (any other event, or a read of another
//    model, ends it), as the hint tracker counts loads.
//  - A chunk's position in a model is the order in which the trace first shows the model using it
//    (access, insert, inherit): a load reads a prefix of the model's tensors.
//  - q[j]: the fraction of all loads that read the chunk at position j of the model they load.
//  - A model lives until its `done` hint that follows its last load (the end of the trace if none).
//  - w(m) at a point of the replay: of the loads still to start within m's life, the fraction that
//    load m: what the driver's scores give as m's chance of winning the next tournament, taken
//    here from hindsight.
struct BoundOracle {
  std::vector<size_t> run_of;                       // per event: the load it belongs to, or kSimNever
  std::vector<std::vector<size_t>> model_runs;      // per model: its loads, ascending
  std::vector<size_t> life_end;                     // per model: loads started before its end
  std::vector<double> position_share;               // q
  std::unordered_map<uint64_t, uint32_t> position;  // (model << 32 | chunk) -> position
  size_t runs = 0;

  BoundOracle(const std::vector<SimEvent>& events, size_t models) : model_runs(models), life_end(models, kSimNever) {
    run_of.assign(events.size(), kSimNever);
    std::vector<uint32_t> next_position(models, 0);
    std::vector<uint64_t> reads_at;  // loads reading position j (a load reads a chunk once here)
    uint32_t loading = kSimNone;
    std::unordered_set<uint64_t> read_in_run;
    for (size_t i = 0; i < events.size(); ++i) {
      const SimEvent& e = events[i];
      const bool data =
          e.kind == TraceEventKind::kAccess || e.kind == TraceEventKind::kInsert || e.kind == TraceEventKind::kInherit;
      if (data) {
        const uint32_t m = e.models.front();
        const uint64_t pair = (static_cast<uint64_t>(m) << 32) | e.chunk;
        if (position.try_emplace(pair, next_position[m]).second) ++next_position[m];
      }
      if (e.kind != TraceEventKind::kAccess) {
        if (e.kind != TraceEventKind::kEvict) loading = kSimNone;
        continue;
      }
      const uint32_t m = e.models.front();
      if (m != loading) {
        loading = m;
        model_runs[m].push_back(runs++);
        read_in_run.clear();
      }
      run_of[i] = runs - 1;
      const uint32_t j = position.at((static_cast<uint64_t>(m) << 32) | e.chunk);
      if (read_in_run.insert(e.chunk).second) {
        if (reads_at.size() <= j) reads_at.resize(j + 1, 0);
        ++reads_at[j];
      }
    }
    // A done hint before a model's last load did not end its life: its life ends at the first
    // done hint after that load.
    {
      size_t started = 0;
      uint32_t current = kSimNone;
      for (const SimEvent& e : events) {
        if (e.kind == TraceEventKind::kAccess) {
          if (e.models.front() != current) {
            current = e.models.front();
            ++started;
          }
          continue;
        }
        if (e.kind != TraceEventKind::kEvict) current = kSimNone;
        if (e.kind != TraceEventKind::kHint || e.hint != HintKind::kDone || e.chunk != kSimNone) continue;
        for (uint32_t m : e.models) {
          const bool after_last = model_runs[m].empty() || model_runs[m].back() < started;
          if (after_last && life_end[m] == kSimNever) life_end[m] = started;
        }
      }
    }
    for (size_t& end : life_end)
      if (end == kSimNever) end = runs;
    position_share.resize(reads_at.size());
    for (size_t j = 0; j < reads_at.size(); ++j)
      position_share[j] = runs ? static_cast<double>(reads_at[j]) / static_cast<double>(runs) : 0.0;
  }

  // w(m) when `started` loads have started.
  double win(uint32_t m, size_t started) const {
    const size_t end = life_end[m];
    if (end <= started) return 0;
    const auto& mine = model_runs[m];
    const auto from = std::lower_bound(mine.begin(), mine.end(), started);
    const auto to = std::lower_bound(mine.begin(), mine.end(), end);
    return static_cast<double>(to - from) / static_cast<double>(end - started);
  }

  double share(uint32_t position_in_model) const {
    return position_in_model < position_share.size() ? position_share[position_in_model] : 0.0;
  }
};

}  // namespace

// The win-probability bound: on a miss it evicts, until the chunk fits, the resident chunk with the
// lowest chance of being read by the next load, max over the live models using it of
// w(model) * q[position in that model] (per byte kept, this is the chance per byte of a hit); a chunk
// with a pending announced read (a will_load naming it, or its model, not yet read and not stale)
// ranks above every other; ties go to the chunk used longest ago. Like the online policies it admits
// every chunk it can hold.
SimResult Simulator::Impl::run_bound(uint64_t capacity) const {
  SimResult r;
  r.policy = SimPolicy::kBound;
  r.capacity_bytes = capacity;
  const BoundOracle oracle(events, model_count);
  const double grace_ns = options.hints.expected_use_grace_s * 1e9;
  std::vector<std::vector<uint32_t>> chunk_models(chunk_bytes.size());
  std::unordered_set<uint64_t> pairs;
  std::vector<std::vector<int64_t>> announced(chunk_bytes.size());  // pending chunk-level reads
  std::vector<char> model_announced(model_count, 0);
  std::vector<char> resident(chunk_bytes.size(), 0);
  std::vector<uint64_t> last_use(chunk_bytes.size(), 0);
  std::vector<uint32_t> resident_list;
  uint64_t used = 0, clock = 0;
  size_t started = 0;
  uint32_t loading = kSimNone;
  int64_t now = 0;

  auto use = [&](uint32_t m, uint32_t c) {
    if (pairs.insert((static_cast<uint64_t>(m) << 32) | c).second) chunk_models[c].push_back(m);
  };
  auto fresh_announcements = [&](uint32_t c) {
    auto& a = announced[c];
    while (!a.empty() && static_cast<double>(now - a.front()) > grace_ns) a.erase(a.begin());
    return !a.empty();
  };
  auto value = [&](uint32_t c) {
    if (fresh_announcements(c)) return 2.0;
    double best = 0;
    for (uint32_t m : chunk_models[c]) {
      if (model_announced[m] && m != loading) return 2.0;
      const double w = oracle.win(m, started);
      if (w > 0) best = std::max(best, w * oracle.share(oracle.position.at((static_cast<uint64_t>(m) << 32) | c)));
    }
    return best;
  };
  auto admit = [&](uint32_t c) {
    const uint64_t bytes = chunk_bytes[c];
    if (bytes > capacity) {
      ++r.bypassed;
      return;
    }
    while (used + bytes > capacity) {
      size_t victim = 0;
      double victim_value = 0;
      for (size_t i = 0; i < resident_list.size(); ++i) {
        const double v = value(resident_list[i]);
        if (i == 0 || v < victim_value ||
            (v == victim_value && last_use[resident_list[i]] < last_use[resident_list[victim]])) {
          victim = i;
          victim_value = v;
        }
      }
      const uint32_t v = resident_list[victim];
      resident_list[victim] = resident_list.back();
      resident_list.pop_back();
      resident[v] = 0;
      used -= chunk_bytes[v];
      ++r.evictions;
    }
    resident[c] = 1;
    resident_list.push_back(c);
    used += bytes;
  };

  for (size_t i = 0; i < events.size(); ++i) {
    const SimEvent& e = events[i];
    now = e.time_ns;
    if (e.kind != TraceEventKind::kAccess && e.kind != TraceEventKind::kEvict) {
      if (loading != kSimNone) model_announced[loading] = 0;  // its load ended: the will_load is fulfilled
      loading = kSimNone;
    }
    switch (e.kind) {
      case TraceEventKind::kAccess: {
        const uint32_t c = e.chunk, m = e.models.front();
        if (m != loading) {
          if (loading != kSimNone) model_announced[loading] = 0;
          loading = m;
          started = oracle.run_of[i] + 1;
        }
        use(m, c);
        if (!announced[c].empty()) announced[c].erase(announced[c].begin());
        const bool hit = resident[c] != 0;
        count_request(r, e, chunk_bytes[c], hit);
        if (!hit) admit(c);
        last_use[c] = ++clock;
        break;
      }
      case TraceEventKind::kInsert:
        use(e.models.front(), e.chunk);
        if (!resident[e.chunk]) {
          admit(e.chunk);
          last_use[e.chunk] = ++clock;
        }
        break;
      case TraceEventKind::kInherit:
        use(e.models.front(), e.chunk);
        break;
      case TraceEventKind::kHint:
        if (e.chunk != kSimNone) {
          auto& a = announced[e.chunk];
          const int64_t at = add_seconds_ns(now, e.when_s.value_or(0.0));
          a.insert(std::upper_bound(a.begin(), a.end(), at), at);
        } else if (e.hint == HintKind::kWillLoad || e.hint == HintKind::kSequence) {
          for (uint32_t m : e.models) model_announced[m] = 1;
        } else if (e.hint == HintKind::kDone) {
          for (uint32_t m : e.models) model_announced[m] = 0;
        }
        break;
      case TraceEventKind::kCommit:
      case TraceEventKind::kEvict:
        break;
    }
  }
  return r;
}

}  // namespace cairn
