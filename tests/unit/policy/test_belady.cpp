// The simulator's Belady against an exhaustive search over every eviction choice.
//
// The search plays the same cache model as the simulator: on a miss the cache may bypass the chunk
// or cache it after evicting any set of resident chunks that makes room (evicting later, only
// when room is needed, never does worse, so evictions happen on misses only). It maximizes the
// bytes hit. With equal sizes farthest-next-use with bypass is optimal, so Belady must equal it;
// with unequal sizes Belady is a heuristic and must lie between LRU and the optimum.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "policy/simulator.hpp"

using cairn::SimPolicy;

namespace {

struct Small {
  std::vector<int> reads;       // chunk numbers, in order
  std::vector<uint64_t> bytes;  // per chunk
};

cairn::Trace to_trace(const Small& s) {
  cairn::Trace t;
  for (size_t i = 0; i < s.reads.size(); ++i) {
    cairn::TraceEvent e;
    e.time_ns = static_cast<int64_t>(i);
    e.kind = cairn::TraceEventKind::kAccess;
    e.models = {"m"};
    e.chunk = "c" + std::to_string(s.reads[i]);
    e.bytes = s.bytes[static_cast<size_t>(s.reads[i])];
    t.events.push_back(std::move(e));
  }
  return t;
}

class BruteForce {
 public:
  BruteForce(const Small& s, uint64_t capacity) : s_(s), capacity_(capacity) {}

  // The most bytes any cache of `capacity` can hit on the reads from `i` with `resident` cached.
  uint64_t best(size_t i = 0, uint32_t resident = 0) {
    if (i == s_.reads.size()) return 0;
    const auto key = std::make_pair(i, resident);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const int c = s_.reads[i];
    const uint32_t bit = 1u << c;
    const uint64_t bytes = s_.bytes[static_cast<size_t>(c)];
    uint64_t result = 0;
    if (resident & bit) {
      result = bytes + best(i + 1, resident);
    } else {
      result = best(i + 1, resident);  // bypass
      if (bytes <= capacity_) {
        // Every subset of the resident chunks as the evicted set.
        for (uint32_t evict = resident;; evict = (evict - 1) & resident) {
          const uint32_t kept = resident & ~evict;
          if (used(kept) + bytes <= capacity_) result = std::max(result, best(i + 1, kept | bit));
          if (evict == 0) break;
        }
      }
    }
    memo_[key] = result;
    return result;
  }

 private:
  uint64_t used(uint32_t set) const {
    uint64_t total = 0;
    for (size_t c = 0; c < s_.bytes.size(); ++c)
      if (set & (1u << c)) total += s_.bytes[c];
    return total;
  }

  const Small& s_;
  const uint64_t capacity_;
  std::map<std::pair<size_t, uint32_t>, uint64_t> memo_;
};

Small random_small(std::mt19937& rng, bool equal_sizes) {
  Small s;
  const int chunks = 2 + static_cast<int>(rng() % 5);  // 2..6
  const int reads = 4 + static_cast<int>(rng() % 11);  // 4..14
  for (int c = 0; c < chunks; ++c) s.bytes.push_back(equal_sizes ? 1 : 1 + rng() % 6);
  // A skewed choice, so that some chunks come back often.
  for (int r = 0; r < reads; ++r) {
    const int a = static_cast<int>(rng() % static_cast<unsigned>(chunks));
    const int b = static_cast<int>(rng() % static_cast<unsigned>(chunks));
    s.reads.push_back(std::min(a, b));
  }
  return s;
}

}  // namespace

TEST_CASE("Belady equals the exhaustive optimum when chunks are the same size", "[policy][belady]") {
  std::mt19937 rng(20240611);
  for (int round = 0; round < 1500; ++round) {
    const Small s = random_small(rng, true);
    const uint64_t capacity = rng() % 5;  // 0..4 chunks
    auto sim = cairn::Simulator::create(to_trace(s));
    REQUIRE(sim.ok());
    const cairn::SimResult belady = sim->run(SimPolicy::kBelady, capacity);
    BruteForce brute(s, capacity);
    const uint64_t best = brute.best();
    INFO("round " << round << " capacity " << capacity);
    REQUIRE(belady.bytes_hit == best);
    REQUIRE(belady.hits == best);
    // No online policy does better than the optimum.
    for (SimPolicy p : {SimPolicy::kLru, SimPolicy::kLineage, SimPolicy::kHints})
      REQUIRE(sim->run(p, capacity).bytes_hit <= best);
  }
}

TEST_CASE("With unequal sizes Belady lies between LRU and the exhaustive optimum", "[policy][belady]") {
  std::mt19937 rng(7);
  int below_optimum = 0;
  for (int round = 0; round < 1500; ++round) {
    const Small s = random_small(rng, false);
    const uint64_t capacity = 1 + rng() % 12;
    auto sim = cairn::Simulator::create(to_trace(s));
    REQUIRE(sim.ok());
    const uint64_t belady = sim->run(SimPolicy::kBelady, capacity).bytes_hit;
    const uint64_t lru = sim->run(SimPolicy::kLru, capacity).bytes_hit;
    BruteForce brute(s, capacity);
    const uint64_t best = brute.best();
    INFO("round " << round << " capacity " << capacity << " lru " << lru << " belady " << belady << " best " << best);
    REQUIRE(belady <= best);
    REQUIRE(belady >= lru);
    for (SimPolicy p : {SimPolicy::kLineage, SimPolicy::kHints}) REQUIRE(sim->run(p, capacity).bytes_hit <= best);
    below_optimum += belady < best;
  }
  // The heuristic is not the optimum: some traces show it (and the search finds them).
  WARN("size-aware Belady below the optimum on " << below_optimum << " of 1500 random traces");
}
