#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "policy/eviction.hpp"

using cairn::ChunkHash;
using cairn::FakeClock;
using cairn::LineagePolicy;

namespace {

ChunkHash key(uint64_t i) { return ChunkHash{0xC0FFEE, i}; }

const auto kAny = [](const ChunkHash&) { return true; };

constexpr uint64_t kMiB = 1ull << 20;

// The tier manager's cost model: size / bandwidth + latency.
double refetch_seconds(uint64_t bytes, double bandwidth, double latency_s) {
  return static_cast<double>(bytes) / bandwidth + latency_s;
}

}  // namespace

TEST_CASE("LineagePolicy with equal sizes, costs and references evicts the least used first", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  ChunkHash a = key(1), b = key(2), c = key(3);
  p.track(a, kMiB);
  p.track(b, kMiB);
  p.track(c, kMiB);
  REQUIRE(p.size() == 3);
  // Same priority: the one accessed longest ago goes.
  REQUIRE(p.pick_victim(kAny) == a);
  clock.advance_s(1);
  p.touch(a);
  REQUIRE(p.pick_victim(kAny) == b);

  SECTION("frequency outweighs recency at equal age of L") {
    // b was read three times, c once and most recently: c goes.
    p.touch(b);
    p.touch(b);
    REQUIRE(p.pick_victim(kAny) == c);
  }
}

TEST_CASE("LineagePolicy keeps a chunk referenced by many live models", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  ChunkHash shared = key(1), single = key(2);
  p.track(shared, kMiB);
  p.track(single, kMiB);
  REQUIRE(p.pick_victim(kAny) == shared);  // older, all else equal
  p.set_references(shared, 12);
  p.set_references(single, 1);
  REQUIRE(p.pick_victim(kAny) == single);
  REQUIRE(*p.priority(shared) > *p.priority(single));
  // Retiring the models that shared it makes it an ordinary chunk again: one access, one model,
  // unknown cost (1 / bandwidth per byte), on top of the L that picking `single` raised.
  p.set_references(shared, 1);
  REQUIRE(p.aging() == *p.priority(single));
  REQUIRE(*p.priority(shared) - p.aging() == Approx(1 * (1 + 1) / 1e9));
}

TEST_CASE("LineagePolicy evicts a large chunk before a small one with the same accesses", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  ChunkHash small = key(1), large = key(2);
  p.track(small, 64 * 1024);  // older: LRU would take it
  p.track(large, 16 * kMiB);
  p.set_refetch_cost(small, refetch_seconds(64 * 1024, 2e9, 0.005));
  p.set_refetch_cost(large, refetch_seconds(16 * kMiB, 2e9, 0.005));
  REQUIRE(p.pick_victim(kAny) == large);

  SECTION("also at equal refetch cost") {
    p.set_refetch_cost(small, 0.01);
    p.set_refetch_cost(large, 0.01);
    REQUIRE(p.pick_victim(kAny) == large);
  }
}

TEST_CASE("LineagePolicy keeps a chunk that is expensive to fetch back", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  ChunkHash on_pfs = key(1), on_nvme = key(2);
  p.track(on_pfs, 16 * kMiB);  // older
  p.track(on_nvme, 16 * kMiB);
  p.set_refetch_cost(on_pfs, refetch_seconds(16 * kMiB, 1e9, 0.010));
  p.set_refetch_cost(on_nvme, refetch_seconds(16 * kMiB, 5e9, 0.0001));
  REQUIRE(p.pick_victim(kAny) == on_nvme);
  // Once its NVMe copy is gone it is as dear as the other; then age decides again.
  p.set_refetch_cost(on_nvme, refetch_seconds(16 * kMiB, 1e9, 0.010));
  REQUIRE(p.pick_victim(kAny) == on_pfs);
}

TEST_CASE("LineagePolicy ages out a chunk used often long ago", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy::Options options;
  options.half_life_s = 10;
  LineagePolicy p(clock, options);
  ChunkHash old_hot = key(1), once = key(2);
  p.track(old_hot, kMiB);
  for (int i = 0; i < 9; ++i) p.touch(old_hot);  // 10 accesses
  p.track(once, kMiB);
  REQUIRE(p.pick_victim(kAny) == once);  // right now the hot chunk deserves its place
  p.remove(once);
  const double hot_priority = *p.priority(old_hot);

  // A scan streams through a tier of five chunks, one chunk a second, each read once. Every
  // eviction raises L, so the hot chunk, never read again, must eventually fall behind.
  uint64_t next = 100;
  std::optional<ChunkHash> victim;
  int seconds = 0;
  while (seconds < 1000) {
    clock.advance_s(1);
    ++seconds;
    p.track(key(next++), kMiB);
    if (p.size() <= 5) continue;
    victim = p.pick_victim(kAny);
    REQUIRE(victim.has_value());
    if (*victim == old_hot) break;
    p.remove(*victim);
  }
  REQUIRE(victim == old_hot);
  REQUIRE(p.aging() == hot_priority);
  INFO("evicted after " << seconds << " s");
  REQUIRE(seconds > 2 * options.half_life_s);
  // Every chunk still there was read once, and more recently: all of them outlive it.
  for (uint64_t k = 100; k < next; ++k)
    if (auto q = p.priority(key(k))) REQUIRE(*q > hot_priority);
}

TEST_CASE("LineagePolicy frequency decays with the half-life", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy::Options options;
  options.half_life_s = 30;
  LineagePolicy p(clock, options);
  ChunkHash a = key(1), b = key(2);
  p.track(a, kMiB);
  p.touch(a);  // f = 2 (within the same instant: no decay)
  const double fresh = *p.priority(a);
  REQUIRE(fresh == Approx(2.0 / 1e9));  // L = 0; unknown cost: 2 * (1 + 0) * (size / 1e9) / size

  clock.advance_s(60);     // two half-lives
  p.set_references(a, 0);  // re-ranks without counting as an access
  const double later = *p.priority(a);
  REQUIRE(later < fresh);
  REQUIRE(later == Approx(fresh / 4));

  // An access adds one to the decayed count: 2/4 + 1, against 2 + 1 without the wait.
  p.touch(a);
  REQUIRE(*p.priority(a) == Approx(1.5 / 1e9));
  p.track(b, kMiB);
  p.touch(b);
  p.touch(b);
  REQUIRE(*p.priority(b) == Approx(3.0 / 1e9));
  REQUIRE(p.pick_victim(kAny) == a);
}

TEST_CASE("LineagePolicy ignores unknown keys", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  p.track(key(1), kMiB);
  p.remove(key(2));
  p.touch(key(2));
  p.set_references(key(2), 5);
  p.set_refetch_cost(key(2), 1.0);
  REQUIRE(p.size() == 1);
  REQUIRE_FALSE(p.priority(key(2)).has_value());
  p.remove(key(1));
  p.remove(key(1));
  REQUIRE(p.size() == 0);
  REQUIRE_FALSE(p.pick_victim(kAny).has_value());
  REQUIRE(p.aging() == 0);
}

TEST_CASE("LineagePolicy skips chunks that are not evictable", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  ChunkHash pinned = key(1), cold = key(2), warm = key(3);
  p.track(pinned, kMiB);
  p.track(cold, kMiB);
  p.track(warm, kMiB);
  p.touch(warm);
  auto not_pinned = [&](const ChunkHash& k) { return !(k == pinned); };
  REQUIRE(p.pick_victim(not_pinned) == cold);
  REQUIRE(p.aging() == *p.priority(cold));
  // Nothing evictable: no victim, and L stays where it was.
  const double aging = p.aging();
  REQUIRE_FALSE(p.pick_victim([](const ChunkHash&) { return false; }).has_value());
  REQUIRE(p.aging() == aging);
  p.remove(cold);
  REQUIRE(p.pick_victim(not_pinned) == warm);
  const double raised = p.aging();
  REQUIRE(raised == *p.priority(warm));
  p.remove(warm);
  // The pinned chunk was skipped while L rose past it; taking it now must not lower L.
  REQUIRE(*p.priority(pinned) < raised);
  REQUIRE(p.pick_victim(kAny) == pinned);
  REQUIRE(p.aging() == raised);
}

TEST_CASE("LineagePolicy handles empty chunks and odd costs", "[policy][lineage]") {
  FakeClock clock;
  LineagePolicy p(clock);
  ChunkHash empty = key(1), other = key(2);
  p.track(empty, 0);
  REQUIRE(std::isfinite(*p.priority(empty)));
  REQUIRE(*p.priority(empty) == 0);  // unknown cost of 0 bytes is 0
  p.set_refetch_cost(empty, 0.001);  // a latency still makes it worth something
  REQUIRE(std::isfinite(*p.priority(empty)));
  REQUIRE(*p.priority(empty) > 0);
  p.track(other, kMiB);
  p.set_refetch_cost(other, std::numeric_limits<double>::quiet_NaN());
  REQUIRE(*p.priority(other) == 0);
  p.set_refetch_cost(other, -1);
  REQUIRE(*p.priority(other) == 0);
  REQUIRE(p.pick_victim(kAny) == other);
  p.set_refetch_cost(other, std::numeric_limits<double>::infinity());  // no other copy
  REQUIRE(p.pick_victim(kAny) == empty);
  // Its frequency decays to exactly 0 after enough half-lives; infinity times 0 must not make a NaN
  // (which would break the ordering of the ranks).
  clock.advance_s(60.0 * 5000);
  p.set_references(other, 0);
  REQUIRE_FALSE(std::isnan(*p.priority(other)));
  p.set_references(empty, 0);
  REQUIRE(p.pick_victim(kAny).has_value());

  LineagePolicy::Options bad;
  bad.half_life_s = 0;
  REQUIRE_THROWS_AS(LineagePolicy(clock, bad), std::invalid_argument);
  bad = {};
  bad.default_bandwidth = 0;
  REQUIRE_THROWS_AS(LineagePolicy(clock, bad), std::invalid_argument);
  bad = {};
  bad.half_life_s = std::numeric_limits<double>::infinity();  // no decay
  LineagePolicy no_decay(clock, bad);
  no_decay.track(key(1), kMiB);
  const double before = *no_decay.priority(key(1));
  clock.advance_s(1e6);
  no_decay.set_references(key(1), 0);
  REQUIRE(*no_decay.priority(key(1)) == before);
}

namespace {

// The same formula, evaluated the slow and obvious way: every chunk's state in a map, the victim by
// a linear scan for the lowest (priority, access order).
class BruteForceLineage {
 public:
  BruteForceLineage(const FakeClock& clock, LineagePolicy::Options options) : clock_(clock), options_(options) {}

  void track(const ChunkHash& k, uint64_t bytes) {
    auto found = chunks_.find(k);
    if (found == chunks_.end()) {
      Chunk fresh;
      fresh.last_access_ns = clock_.now_ns();
      found = chunks_.emplace(k, fresh).first;
    }
    found->second.bytes = bytes;
    access(found->second);
  }
  void touch(const ChunkHash& k) {
    auto found = chunks_.find(k);
    if (found != chunks_.end()) access(found->second);
  }
  void remove(const ChunkHash& k) { chunks_.erase(k); }
  void set_references(const ChunkHash& k, uint32_t n) {
    auto found = chunks_.find(k);
    if (found == chunks_.end()) return;
    found->second.references = n;
    rank(found->second);
  }
  void set_refetch_cost(const ChunkHash& k, double s) {
    auto found = chunks_.find(k);
    if (found == chunks_.end()) return;
    found->second.cost = s;
    found->second.cost_known = true;
    rank(found->second);
  }
  std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
    const Chunk* best = nullptr;
    std::optional<ChunkHash> best_key;
    for (const auto& [k, c] : chunks_) {
      if (!evictable(k)) continue;
      if (!best || c.priority < best->priority || (c.priority == best->priority && c.order < best->order)) {
        best = &c;
        best_key = k;
      }
    }
    if (best && best->priority > aging_) aging_ = best->priority;
    return best_key;
  }
  std::optional<double> priority(const ChunkHash& k) const {
    auto found = chunks_.find(k);
    if (found == chunks_.end()) return std::nullopt;
    return found->second.priority;
  }
  double aging() const { return aging_; }
  size_t size() const { return chunks_.size(); }

 private:
  struct Chunk {
    uint64_t bytes = 0;
    uint32_t references = 0;
    bool cost_known = false;
    double cost = 0;
    double frequency = 0;
    int64_t last_access_ns = 0;
    double priority = 0;
    uint64_t order = 0;
  };
  double decayed(const Chunk& c) const {
    const double dt_s = static_cast<double>(clock_.now_ns() - c.last_access_ns) * 1e-9;
    return c.frequency * std::exp2(-dt_s / options_.half_life_s);
  }
  void access(Chunk& c) {
    c.frequency = decayed(c) + 1;
    c.last_access_ns = clock_.now_ns();
    c.order = accesses_++;
    rank(c);
  }
  void rank(Chunk& c) {
    const double cost =
        c.cost_known ? std::max(c.cost, 0.0) : static_cast<double>(c.bytes) / options_.default_bandwidth;
    const double size = c.bytes == 0 ? 1.0 : static_cast<double>(c.bytes);
    c.priority = aging_ + decayed(c) * (1.0 + c.references) * cost / size;
  }

  const FakeClock& clock_;
  LineagePolicy::Options options_;
  std::map<ChunkHash, Chunk> chunks_;
  double aging_ = 0;
  uint64_t accesses_ = 0;
};

}  // namespace

TEST_CASE("LineagePolicy picks the same victims as a brute-force evaluation of its formula", "[policy][lineage]") {
  FakeClock clock(1'000'000'000);
  LineagePolicy::Options options;
  options.half_life_s = 20;
  options.default_bandwidth = 2e9;
  LineagePolicy fast(clock, options);
  BruteForceLineage slow(clock, options);

  std::mt19937_64 rng(20240611);
  auto uniform = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const uint64_t kKeys = 200;
  int picks = 0, victims = 0, ties = 0;
  for (int event = 0; event < 2000; ++event) {
    // Mostly short steps, sometimes several half-lives at once, sometimes none (exact ties).
    const uint64_t step = uniform(10);
    if (step < 3) {
    } else if (step < 9) {
      clock.advance_ns(static_cast<int64_t>(uniform(2'000'000'000)));
    } else {
      clock.advance_s(static_cast<double>(uniform(120)));
    }
    const ChunkHash k = key(uniform(kKeys));
    const uint64_t kind = uniform(100);
    if (kind < 30) {
      // Every sixteenth size is 0; a few share a size so equal priorities happen.
      const uint64_t bytes = uniform(16) == 0 ? 0 : (uniform(4) == 0 ? kMiB : 1 + uniform(16 * kMiB));
      fast.track(k, bytes);
      slow.track(k, bytes);
    } else if (kind < 55) {
      fast.touch(k);
      slow.touch(k);
    } else if (kind < 65) {
      const auto refs = static_cast<uint32_t>(uniform(20));
      fast.set_references(k, refs);
      slow.set_references(k, refs);
    } else if (kind < 73) {
      const double cost = uniform(8) == 0 ? -1.0 : static_cast<double>(uniform(1000)) * 1e-4;
      fast.set_refetch_cost(k, cost);
      slow.set_refetch_cost(k, cost);
    } else if (kind < 78) {
      fast.remove(k);
      slow.remove(k);
    } else {
      // A random quarter of the keys is pinned (or none, or all).
      const uint64_t mode = uniform(10);
      const uint64_t salt = rng();
      auto evictable = [&](const ChunkHash& c) {
        if (mode == 0) return true;
        if (mode == 1) return false;
        return ((c.lo * 0x9E3779B97F4A7C15ull) ^ salt) % 4 != 0;
      };
      const auto want = slow.pick_victim(evictable);
      const auto got = fast.pick_victim(evictable);
      ++picks;
      INFO("event " << event);
      REQUIRE(got.has_value() == want.has_value());
      if (got) {
        ++victims;
        INFO("victim " << got->hex() << " expected " << want->hex());
        REQUIRE(*got == *want);
        REQUIRE(fast.aging() == slow.aging());
        // Count exact ties to make sure the tie rule was exercised.
        for (uint64_t i = 0; i < kKeys; ++i) {
          auto q = slow.priority(key(i));
          if (q && !(key(i) == *want) && *q == *slow.priority(*want)) {
            ++ties;
            break;
          }
        }
        if (uniform(4) != 0) {  // usually the tier then evicts it; sometimes it asks again
          fast.remove(*got);
          slow.remove(*want);
        }
      }
    }
    REQUIRE(fast.size() == slow.size());
  }
  // Every tracked chunk ranks where the brute force says.
  for (uint64_t i = 0; i < kKeys; ++i) {
    const auto want = slow.priority(key(i));
    const auto got = fast.priority(key(i));
    REQUIRE(got.has_value() == want.has_value());
    if (got) REQUIRE(*got == Approx(*want).epsilon(1e-12));
  }
  INFO("picks " << picks << ", victims " << victims << ", tied victims " << ties);
  CHECK(victims > 200);
  CHECK(ties > 0);
}

namespace {

struct Access {
  ChunkHash chunk;
  uint32_t references;
};

// NAS-like: each candidate model loads the shared ancestor layers and its own new layers, is
// evaluated (its own layers read again shortly after), while a stream of one-off chunks (other
// jobs' data, a scan) passes through the same tier.
std::vector<Access> nas_trace() {
  constexpr uint64_t kAncestors = 8, kOwn = 4, kCandidates = 300;
  constexpr uint32_t kLiveModels = 16;
  std::vector<Access> trace;
  uint64_t next = 1000;
  auto scan = [&](int n) {
    for (int i = 0; i < n; ++i) trace.push_back({key(next++), 0});
  };
  for (uint64_t c = 0; c < kCandidates; ++c) {
    std::vector<ChunkHash> own;
    for (uint64_t i = 0; i < kOwn; ++i) own.push_back(key(next++));
    for (uint64_t a = 0; a < kAncestors; ++a) trace.push_back({key(a), kLiveModels});
    for (const auto& o : own) trace.push_back({o, 1});
    scan(6);
    for (const auto& o : own) trace.push_back({o, 1});
    scan(18);
  }
  return trace;
}

// Hit rate of a tier holding `capacity` equal-sized chunks, one access per millisecond.
double hit_rate(cairn::EvictionPolicy& policy, FakeClock& clock, const std::vector<Access>& trace, size_t capacity) {
  std::set<ChunkHash> resident;
  size_t hits = 0;
  for (const auto& a : trace) {
    clock.advance_ns(1'000'000);
    if (resident.count(a.chunk)) {
      ++hits;
      policy.touch(a.chunk);
      continue;
    }
    while (resident.size() >= capacity) {
      auto victim = policy.pick_victim(kAny);
      REQUIRE(victim.has_value());
      policy.remove(*victim);
      REQUIRE(resident.erase(*victim) == 1);
    }
    policy.track(a.chunk, 16 * kMiB);
    policy.set_references(a.chunk, a.references);
    resident.insert(a.chunk);
  }
  return static_cast<double>(hits) / static_cast<double>(trace.size());
}

}  // namespace

TEST_CASE("LineagePolicy beats LRU on a NAS-like trace with a scan", "[policy][lineage]") {
  const auto trace = nas_trace();
  // Smaller than the ancestors plus what passes between two loads of them (8 + 4 + 6 + 18 + 7).
  constexpr size_t kCapacity = 24;
  FakeClock lru_clock, lineage_clock;
  cairn::LruPolicy lru;
  LineagePolicy lineage(lineage_clock);
  const double lru_rate = hit_rate(lru, lru_clock, trace, kCapacity);
  const double lineage_rate = hit_rate(lineage, lineage_clock, trace, kCapacity);
  WARN("NAS-like trace, " << trace.size() << " accesses, capacity " << kCapacity << " chunks: hit rate lru " << lru_rate
                          << ", lineage " << lineage_rate);
  REQUIRE(lineage_rate > lru_rate);
}

TEST_CASE("make_eviction_policy builds lineage with the given clock", "[policy][lineage]") {
  FakeClock clock;
  auto p = cairn::make_eviction_policy("lineage", clock);
  REQUIRE(p.ok());
  REQUIRE(std::string((*p)->name()) == "lineage");
  auto* lineage = dynamic_cast<LineagePolicy*>(p->get());
  REQUIRE(lineage != nullptr);
  lineage->track(key(1), kMiB);
  clock.advance_s(120);  // two default half-lives
  lineage->set_references(key(1), 0);
  REQUIRE(*lineage->priority(key(1)) == Approx(0.25 / 1e9));
}

TEST_CASE("Admission policies", "[policy][admission]") {
  using Candidate = cairn::AdmissionPolicy::Candidate;
  auto all = cairn::make_admission_policy("all");
  REQUIRE(all.ok());
  REQUIRE(std::string((*all)->name()) == "all");
  REQUIRE((*all)->admit(Candidate{}));
  REQUIRE((*all)->admit(Candidate{16 * kMiB, 1, 0, 0.5}));

  auto reuse = cairn::make_admission_policy("reuse");
  REQUIRE(reuse.ok());
  REQUIRE(std::string((*reuse)->name()) == "reuse");
  REQUIRE_FALSE((*reuse)->admit(Candidate{}));
  REQUIRE_FALSE((*reuse)->admit(Candidate{16 * kMiB, 1, 1, 10.0}));  // read once, one model: a scan
  REQUIRE((*reuse)->admit(Candidate{16 * kMiB, 2, 0, 0}));
  REQUIRE((*reuse)->admit(Candidate{16 * kMiB, 0, 2, 0}));

  auto bad = cairn::make_admission_policy("x");
  REQUIRE_FALSE(bad.ok());
  REQUIRE(bad.status().code() == cairn::StatusCode::kInvalidArgument);
  REQUIRE(bad.status().message() == "policy.admission: 'x' is not one of all, reuse");
}
