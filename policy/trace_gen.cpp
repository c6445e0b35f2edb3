#include "policy/trace_gen.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <iterator>
#include <utility>
#include <vector>

namespace cairn {

namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr double kReadBandwidth = 2e9;  // bytes/s for the reads' timestamps

struct Chunk {
  std::string id;
  uint64_t bytes = 0;
};
using Chunks = std::vector<Chunk>;

// Appends events in time order; owns the PRNG and the chunk numbering.
class Builder {
 public:
  explicit Builder(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}

  // splitmix64.
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t below(uint64_t n) { return next() % n; }
  double between(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  // A layer's size: mostly a few MiB, some full 16 MiB chunks, some small.
  uint64_t layer_bytes() {
    static constexpr uint64_t kSizes[] = {512 * kKiB, 2 * kMiB, 4 * kMiB, 4 * kMiB, 8 * kMiB, 16 * kMiB};
    return kSizes[below(std::size(kSizes))];
  }
  Chunk new_chunk(uint64_t bytes) { return Chunk{"c" + std::to_string(++chunks_), bytes}; }
  Chunks new_chunks(size_t n) {
    Chunks out;
    for (size_t i = 0; i < n; ++i) out.push_back(new_chunk(layer_bytes()));
    return out;
  }

  void advance_s(double s) { now_ += static_cast<int64_t>(s * 1e9); }

  void access(const std::string& model, const Chunks& chunks) {
    for (const Chunk& c : chunks) {
      add(TraceEventKind::kAccess, {model}, c);
      advance_s(static_cast<double>(c.bytes) / kReadBandwidth);
    }
  }
  // A commit of `model`: `fresh` written, `inherited` referenced; then the commit itself.
  void commit(const std::string& model, const Chunks& inherited, const Chunks& fresh) {
    uint64_t total = 0;
    for (const Chunk& c : inherited) {
      add(TraceEventKind::kInherit, {model}, c);
      total += c.bytes;
    }
    for (const Chunk& c : fresh) {
      add(TraceEventKind::kInsert, {model}, c);
      advance_s(static_cast<double>(c.bytes) / kReadBandwidth);
      total += c.bytes;
    }
    TraceEvent e;
    e.time_ns = now_;
    e.kind = TraceEventKind::kCommit;
    e.models = {model};
    e.bytes = total;
    trace_.events.push_back(std::move(e));
  }
  void hint(HintKind kind, std::vector<std::string> models, std::optional<double> when_s = std::nullopt) {
    TraceEvent e;
    e.time_ns = now_;
    e.kind = TraceEventKind::kHint;
    e.hint = kind;
    e.models = std::move(models);
    e.when_s = when_s;
    trace_.events.push_back(std::move(e));
  }
  Trace take() { return std::move(trace_); }

 private:
  void add(TraceEventKind kind, std::vector<std::string> models, const Chunk& c) {
    TraceEvent e;
    e.time_ns = now_;
    e.kind = kind;
    e.models = std::move(models);
    e.chunk = c.id;
    e.bytes = c.bytes;
    trace_.events.push_back(std::move(e));
  }

  uint64_t state_;
  uint64_t chunks_ = 0;
  int64_t now_ = 0;
  Trace trace_;
};

std::string numbered(const char* prefix, uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%04llu", prefix, static_cast<unsigned long long>(i));
  return buf;
}

Chunks concat(const Chunks& a, const Chunks& b) {
  Chunks out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

size_t scaled(double n, double scale) { return std::max<size_t>(1, static_cast<size_t>(std::lround(n * scale))); }

// Regularized evolution with weight inheritance.
Trace nas(Builder& b, double scale) {
  constexpr size_t kPopulation = 12, kSample = 4, kSlots = 7;
  struct Model {
    std::string id;
    Chunks slots;  // the last one is the classifier head
    double fitness = 0;
  };
  const Chunks stem = b.new_chunks(3);  // a frozen stem every candidate shares
  std::vector<Model> models;
  std::deque<size_t> population;
  for (size_t i = 0; i < kPopulation; ++i) {
    Model m{numbered("nas-", models.size()), b.new_chunks(kSlots), b.between(0.3, 0.6)};
    if (i == 0) {
      b.commit(m.id, {}, concat(stem, m.slots));
    } else {
      b.commit(m.id, stem, m.slots);
    }
    b.advance_s(b.between(1, 3));
    population.push_back(models.size());
    models.push_back(std::move(m));
  }
  auto population_ids = [&] {
    std::vector<std::string> ids;
    for (size_t i : population) ids.push_back(models[i].id);
    return ids;
  };
  b.hint(HintKind::kPopulation, population_ids());
  // Tournament: the fittest of a sample of the population is the parent.
  auto tournament = [&] {
    size_t parent = population[b.below(kPopulation)];
    for (size_t s = 1; s < kSample; ++s) {
      const size_t other = population[b.below(kPopulation)];
      if (models[other].fitness > models[parent].fitness) parent = other;
    }
    return parent;
  };
  // The driver is pipelined (as asynchronous regularized evolution is): it draws the next
  // candidate's parent when the current candidate starts training, and says so at once.
  size_t next_parent = tournament();
  b.hint(HintKind::kWillLoad, {models[next_parent].id});
  std::vector<size_t> dead_unread;  // died while chosen as the next parent: done once read
  const size_t cycles = scaled(120, scale);
  for (size_t cycle = 0; cycle < cycles; ++cycle) {
    const size_t parent = next_parent;
    b.access(models[parent].id, concat(stem, models[parent].slots));
    for (size_t d : dead_unread) b.hint(HintKind::kDone, {models[d].id});
    dead_unread.clear();
    next_parent = tournament();
    const double training_s = b.between(20, 40);
    b.hint(HintKind::kWillLoad, {models[next_parent].id}, std::round(training_s));
    b.advance_s(training_s);
    const Model& p = models[parent];
    Model child{numbered("nas-", models.size()), p.slots, 0};
    std::vector<char> fresh(kSlots, 0);
    fresh[kSlots - 1] = 1;  // the head is always retrained
    const size_t mutations = b.uniform() < 0.7 ? 1 : 2;
    for (size_t k = 0; k < mutations; ++k) fresh[b.below(kSlots - 1)] = 1;
    Chunks inherited = stem, written;
    for (size_t s = 0; s < kSlots; ++s) {
      if (fresh[s]) {
        child.slots[s] = b.new_chunk(s == kSlots - 1 ? child.slots[s].bytes : b.layer_bytes());
        written.push_back(child.slots[s]);
      } else {
        inherited.push_back(child.slots[s]);
      }
    }
    child.fitness = std::min(1.0, p.fitness + b.between(-0.04, 0.06));
    // The evaluated child joins the population and the oldest dies; the driver says so before it
    // stores the child, so that the child's chunks are protected as they arrive.
    const std::string child_id = child.id;
    population.push_back(models.size());
    models.push_back(std::move(child));
    const size_t dead = population.front();
    population.pop_front();
    if (dead == next_parent) {
      dead_unread.push_back(dead);
    } else {
      b.hint(HintKind::kDone, {models[dead].id});
    }
    b.hint(HintKind::kPopulation, population_ids());
    b.commit(child_id, inherited, written);
    b.advance_s(b.between(0.5, 2));
  }
  // The final evaluation of the three fittest survivors.
  std::vector<size_t> best(population.begin(), population.end());
  std::sort(best.begin(), best.end(), [&](size_t x, size_t y) { return models[x].fitness > models[y].fitness; });
  best.resize(3);
  std::vector<std::string> ids;
  for (size_t i : best) ids.push_back(models[i].id);
  b.hint(HintKind::kSequence, ids);
  for (size_t i : best) {
    b.access(models[i].id, concat(stem, models[i].slots));
    b.advance_s(b.between(5, 10));
  }
  return b.take();
}

// An ensemble of fine-tuned members of one base, read in rounds, with unrelated reads between.
Trace ensemble(Builder& b, double scale) {
  constexpr size_t kMembers = 8, kBackbone = 10;
  const Chunks backbone = b.new_chunks(kBackbone);
  b.commit("ens-base", {}, concat(backbone, b.new_chunks(2)));
  std::vector<std::pair<std::string, Chunks>> members;
  for (size_t i = 0; i < kMembers; ++i) {
    // Odd members also fine-tuned the last block of the backbone.
    Chunks shared(backbone.begin(), backbone.end() - (i % 2 ? 2 : 0));
    Chunks own = b.new_chunks(i % 2 ? 4 : 2);
    b.commit(numbered("ens-m", i), shared, own);
    members.emplace_back(numbered("ens-m", i), concat(shared, own));
    b.advance_s(b.between(30, 60));
  }
  std::vector<std::string> order;
  for (const auto& m : members) order.push_back(m.first);
  const size_t rounds = scaled(28, scale);
  size_t others = 0;
  for (size_t r = 0; r < rounds; ++r) {
    b.hint(HintKind::kSequence, order);
    for (const auto& [id, chunks] : members) {
      b.access(id, chunks);
      b.advance_s(b.between(1, 3));  // inference
      // Another user's model read once, between the members' loads.
      if (b.uniform() < 0.1) {
        const std::string other = numbered("other-", others++);
        b.access(other, b.new_chunks(3 + b.below(4)));
      }
    }
    b.advance_s(b.between(20, 60));
  }
  return b.take();
}

// A fine-tuning sweep in order, then two evaluation passes over its results.
Trace sweep(Builder& b, double scale) {
  constexpr size_t kLayers = 12, kFrozen = 6;
  const Chunks base = b.new_chunks(kLayers);
  b.commit("sweep-base", {}, base);
  const Chunks frozen(base.begin(), base.begin() + kFrozen);
  const size_t runs = scaled(24, scale);
  std::vector<std::pair<std::string, Chunks>> results;
  for (size_t r = 0; r < runs; ++r) {
    const std::string id = numbered("sweep-r", r);
    b.hint(HintKind::kWillLoad, {"sweep-base"});
    b.access("sweep-base", base);
    b.advance_s(b.between(60, 120));
    Chunks tuned;
    for (size_t k = kFrozen; k < kLayers; ++k) tuned.push_back(b.new_chunk(base[k].bytes));
    b.commit(id, frozen, tuned);
    results.emplace_back(id, concat(frozen, tuned));
  }
  std::vector<std::string> order;
  for (const auto& r : results) order.push_back(r.first);
  for (int pass = 0; pass < 2; ++pass) {
    b.hint(HintKind::kSequence, order);
    for (const auto& [id, chunks] : results) {
      b.access(id, chunks);
      b.advance_s(b.between(2, 5));
    }
    b.advance_s(30);
  }
  return b.take();
}

// A training loop writing checkpoints, an evaluator reading each, rotation, restarts.
Trace checkpoint(Builder& b, double scale) {
  constexpr size_t kFrozen = 4, kTrained = 8, kKeep = 3;
  const Chunks frozen = b.new_chunks(kFrozen);
  std::vector<std::pair<std::string, Chunks>> ckpts;
  std::vector<double> score;
  size_t best = 0;
  const size_t count = scaled(60, scale);
  for (size_t i = 0; i < count; ++i) {
    b.advance_s(b.between(300, 400));  // training between checkpoints
    const std::string id = numbered("ckpt-", i);
    Chunks trained;
    for (size_t k = 0; k < kTrained; ++k)
      trained.push_back(b.new_chunk(i ? ckpts[0].second[kFrozen + k].bytes : b.layer_bytes()));
    if (i == 0) {
      b.commit(id, {}, concat(frozen, trained));
    } else {
      b.commit(id, frozen, trained);
    }
    ckpts.emplace_back(id, concat(frozen, trained));
    // The evaluator picks it up a little later.
    b.hint(HintKind::kWillLoad, {id}, 20.0);
    b.advance_s(20);
    b.access(id, ckpts.back().second);
    score.push_back(b.uniform() + 0.01 * static_cast<double>(i));
    const size_t previous_best = best;
    if (score[i] > score[best]) best = i;
    // Keep the last kKeep and the best; tell the cache the others are done.
    if (previous_best != best && previous_best + kKeep < i) b.hint(HintKind::kDone, {ckpts[previous_best].first});
    if (i >= kKeep && i - kKeep != best) b.hint(HintKind::kDone, {ckpts[i - kKeep].first});
    // Now and then the job fails and restarts from its latest checkpoint; after a loss spike it
    // rolls back to the best one instead.
    if (i % 10 == 9) {
      b.advance_s(b.between(100, 200));
      b.hint(HintKind::kWillLoad, {id});
      b.access(id, ckpts.back().second);
    } else if (i % 7 == 6 && best != i) {
      b.advance_s(b.between(30, 60));
      b.hint(HintKind::kWillLoad, {ckpts[best].first});
      b.access(ckpts[best].first, ckpts[best].second);
    }
  }
  b.hint(HintKind::kSequence, {ckpts[best].first, ckpts.back().first});
  b.access(ckpts[best].first, ckpts[best].second);
  b.access(ckpts.back().first, ckpts.back().second);
  return b.take();
}

}  // namespace

Result<Trace> generate_trace(const std::string& workload, const GenerateOptions& options) {
  if (!(options.scale > 0) || !(options.scale <= 1000))
    return invalid_argument("generate: scale must be in (0, 1000], not " + std::to_string(options.scale));
  Builder b(options.seed);
  if (workload == "nas") return nas(b, options.scale);
  if (workload == "ensemble") return ensemble(b, options.scale);
  if (workload == "sweep") return sweep(b, options.scale);
  if (workload == "checkpoint") return checkpoint(b, options.scale);
  return invalid_argument("generate: workload '" + workload + "' is not one of nas, ensemble, sweep, checkpoint");
}

}  // namespace cairn
