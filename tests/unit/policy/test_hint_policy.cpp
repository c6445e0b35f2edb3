#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "policy/eviction.hpp"
#include "policy/hint_policy.hpp"

using cairn::ChunkHash;
using cairn::FakeClock;
using cairn::HintAwarePolicy;
using Standing = cairn::HintAwarePolicy::Standing;

namespace {

ChunkHash key(uint64_t i) { return ChunkHash{0x4117, i}; }

const auto kAny = [](const ChunkHash&) { return true; };

constexpr uint64_t kMiB = 1ull << 20;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Tracks chunks 1..n of a MiB, one a second: by age alone 1 goes first.
void track_one_a_second(HintAwarePolicy& p, FakeClock& clock, uint64_t n) {
  for (uint64_t k = 1; k <= n; ++k) {
    p.track(key(k), kMiB);
    clock.advance_s(1);
  }
}

// The order in which the policy would give its chunks up (each victim removed in turn).
std::vector<uint64_t> eviction_order(HintAwarePolicy& p) {
  std::vector<uint64_t> order;
  while (auto v = p.pick_victim(kAny)) {
    order.push_back(v->lo);
    p.remove(*v);
  }
  return order;
}

}  // namespace

TEST_CASE("HintAwarePolicy without hints picks exactly what LineagePolicy picks", "[policy][hints]") {
  FakeClock clock;
  cairn::LineagePolicy::Options lo;
  lo.half_life_s = 20;
  HintAwarePolicy::Options ho;
  ho.half_life_s = 20;
  cairn::LineagePolicy lineage(clock, lo);
  HintAwarePolicy hints(clock, ho);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> live;
  for (int step = 0; step < 5000; ++step) {
    clock.advance_ns(static_cast<int64_t>(rng() % 2'000'000'000));
    const int op = static_cast<int>(rng() % 10);
    if (op < 3 || live.empty()) {
      const uint64_t k = rng() % 200;
      const uint64_t bytes = (1 + rng() % 16) * kMiB;
      lineage.track(key(k), bytes);
      hints.track(key(k), bytes);
      if (std::find(live.begin(), live.end(), k) == live.end()) live.push_back(k);
    } else if (op < 6) {
      const uint64_t k = live[rng() % live.size()];
      lineage.touch(key(k));
      hints.touch(key(k));
    } else if (op == 6) {
      const uint64_t k = live[rng() % live.size()];
      const auto refs = static_cast<uint32_t>(rng() % 5);
      lineage.set_references(key(k), refs);
      hints.set_references(key(k), refs);
    } else if (op == 7) {
      const uint64_t k = live[rng() % live.size()];
      const double cost = static_cast<double>(rng() % 1000) * 1e-4;
      lineage.set_refetch_cost(key(k), cost);
      hints.set_refetch_cost(key(k), cost);
    } else {
      // Some chunks pinned: both must skip the same ones.
      const uint64_t pinned = rng() % 200;
      auto evictable = [&](const ChunkHash& h) { return h.lo % 7 != pinned % 7; };
      const auto a = lineage.pick_victim(evictable);
      const auto b = hints.pick_victim(evictable);
      REQUIRE(a == b);
      if (a) {
        lineage.remove(*a);
        hints.remove(*a);
        live.erase(std::find(live.begin(), live.end(), a->lo));
      }
      REQUIRE(lineage.aging() == hints.aging());
    }
    for (uint64_t k : live) REQUIRE(lineage.priority(key(k)) == hints.priority(key(k)));
  }
  REQUIRE(lineage.size() == hints.size());
}

TEST_CASE("HintAwarePolicy gives up done chunks first and population chunks last", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  track_one_a_second(p, clock, 4);
  p.set_population(key(1), true);  // the oldest, but a live parent
  p.set_done(key(4), true);        // the newest, but nobody will read it again
  REQUIRE(p.standing(key(1)) == Standing::kPopulation);
  REQUIRE(p.standing(key(2)) == Standing::kOrdinary);
  REQUIRE(p.standing(key(4)) == Standing::kDone);
  REQUIRE(eviction_order(p) == std::vector<uint64_t>{4, 2, 3, 1});
}

TEST_CASE("HintAwarePolicy gives up the population's least likely parent chunks first", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  track_one_a_second(p, clock, 5);
  for (uint64_t k = 1; k <= 4; ++k) p.set_population(key(k), true);
  SECTION("without chances the population goes by H") {
    REQUIRE(eviction_order(p) == std::vector<uint64_t>{5, 1, 2, 3, 4});
  }
  SECTION("with chances the least likely first; the ordinary chunk still before them all") {
    p.set_parent_chance(key(1), 0.6);
    p.set_parent_chance(key(2), 0.1);
    p.set_parent_chance(key(3), 0.3);
    p.set_parent_chance(key(4), 0.1);  // ties go by H: 2 is older than 4
    p.set_parent_chance(key(5), 0.9);  // not in the population: no effect on its rank
    REQUIRE(p.parent_chance(key(1)) == 0.6);
    REQUIRE(eviction_order(p) == std::vector<uint64_t>{5, 2, 4, 3, 1});
  }
  SECTION("NaN withdraws a chance; values are clamped to 0..1; unknown keys are ignored") {
    p.set_parent_chance(key(1), 7.0);
    REQUIRE(p.parent_chance(key(1)) == 1.0);
    p.set_parent_chance(key(2), -1.0);
    REQUIRE(p.parent_chance(key(2)) == 0.0);
    p.set_parent_chance(key(1), std::nan(""));
    REQUIRE(std::isnan(*p.parent_chance(key(1))));
    p.set_parent_chance(key(99), 0.5);
    REQUIRE_FALSE(p.parent_chance(key(99)).has_value());
    // 1 has no chance again (ranks as 0, then by H: older than 2), 3 and 4 neither.
    REQUIRE(eviction_order(p) == std::vector<uint64_t>{5, 1, 2, 3, 4});
  }
  SECTION("leaving the population drops the chance's weight") {
    p.set_parent_chance(key(1), 0.9);
    p.set_population(key(1), false);
    REQUIRE(eviction_order(p) == std::vector<uint64_t>{1, 5, 2, 3, 4});
  }
}

TEST_CASE("HintAwarePolicy keeps the chunks expected soonest, farthest expected first", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  for (uint64_t k = 1; k <= 5; ++k) p.track(key(k), kMiB);
  p.set_expected_use(key(1), 10);   // soon
  p.set_expected_use(key(2), 100);  // later
  p.set_expected_use(key(3), 0);    // next
  p.set_population(key(4), true);
  REQUIRE(p.standing(key(1)) == Standing::kExpected);
  // Ordinary 5, then population 4, then the expected ones from the farthest: 2, 1, 3.
  REQUIRE(eviction_order(p) == std::vector<uint64_t>{5, 4, 2, 1, 3});
}

TEST_CASE("An expectation outranks done and population; a read ends it and refutes done", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  p.track(key(1), kMiB);
  p.track(key(2), kMiB);
  p.set_done(key(1), true);
  p.set_population(key(1), true);
  REQUIRE(p.standing(key(1)) == Standing::kDone);  // done wins over population
  p.set_expected_use(key(1), 5);
  REQUIRE(p.standing(key(1)) == Standing::kExpected);
  REQUIRE(p.pick_victim(kAny) == key(2));

  // The expected read happens: the expectation is fulfilled, done is refuted, population stays.
  clock.advance_s(5);
  p.touch(key(1));
  REQUIRE(p.standing(key(1)) == Standing::kPopulation);
  p.set_population(key(1), false);
  REQUIRE(p.standing(key(1)) == Standing::kOrdinary);

  // track() of a tracked chunk is a read too.
  p.set_done(key(2), true);
  p.set_expected_use(key(2), 1);
  p.track(key(2), 2 * kMiB);
  REQUIRE(p.standing(key(2)) == Standing::kOrdinary);
}

TEST_CASE("Expectations: infinity and NaN withdraw, beyond the horizon is ignored, overdue is now", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy::Options o;
  o.expected_use_horizon_s = 60;
  o.expected_use_grace_s = 30;
  HintAwarePolicy p(clock, o);
  p.track(key(1), kMiB);
  p.track(key(2), kMiB);
  p.set_expected_use(key(1), 61);
  REQUIRE(p.standing(key(1)) == Standing::kOrdinary);
  p.set_expected_use(key(1), 60);
  REQUIRE(p.standing(key(1)) == Standing::kExpected);
  p.set_expected_use(key(1), kInf);
  REQUIRE(p.standing(key(1)) == Standing::kOrdinary);
  p.set_expected_use(key(1), 1);
  p.set_expected_use(key(1), std::nan(""));
  REQUIRE(p.standing(key(1)) == Standing::kOrdinary);
  // Overdue (negative) counts as expected now: it outranks one expected later.
  p.set_expected_use(key(1), -3);
  p.set_expected_use(key(2), 2);
  REQUIRE(p.pick_victim(kAny) == key(2));
  // Unknown keys are ignored.
  p.set_expected_use(key(9), 1);
  p.set_population(key(9), true);
  p.set_done(key(9), true);
  REQUIRE(p.size() == 2);
  REQUIRE_FALSE(p.standing(key(9)).has_value());
}

TEST_CASE("A stale expectation is dropped, so a wrong hint cannot pin a chunk", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy::Options o;
  o.expected_use_grace_s = 30;
  HintAwarePolicy p(clock, o);
  p.track(key(1), kMiB);  // older
  clock.advance_s(1);
  p.track(key(2), kMiB);
  p.set_expected_use(key(1), 10);
  REQUIRE(p.pick_victim(kAny) == key(2));
  clock.advance_s(10 + 30);  // due, and exactly the grace overdue: still expected
  REQUIRE(p.pick_victim(kAny) == key(2));
  clock.advance_s(1);
  REQUIRE(p.pick_victim(kAny) == key(1));
  REQUIRE(p.standing(key(1)) == Standing::kOrdinary);
}

TEST_CASE("HintAwarePolicy skips pinned chunks and moves L only for ordinary competition", "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  p.track(key(1), kMiB);
  p.touch(key(1));
  p.touch(key(1));  // a high H
  p.track(key(2), kMiB);
  p.set_done(key(1), true);
  // The done chunk goes first, and its H does not become L.
  REQUIRE(p.pick_victim(kAny) == key(1));
  REQUIRE(p.aging() == 0);
  p.remove(key(1));
  // A pinned chunk is skipped.
  p.track(key(3), kMiB);
  REQUIRE(p.pick_victim([](const ChunkHash& h) { return h != key(2); }) == key(3));
  REQUIRE(p.aging() == *p.priority(key(3)));
  REQUIRE_FALSE(p.pick_victim([](const ChunkHash&) { return false; }).has_value());
}

TEST_CASE("HintAwarePolicy options are checked; make_eviction_policy knows 'hints'", "[policy][hints]") {
  FakeClock clock;
  auto with = [&](auto set) {
    HintAwarePolicy::Options o;
    set(o);
    return o;
  };
  REQUIRE_THROWS_AS(HintAwarePolicy(clock, with([](auto& o) { o.half_life_s = 0; })), std::invalid_argument);
  REQUIRE_THROWS_AS(HintAwarePolicy(clock, with([](auto& o) { o.default_bandwidth = kInf; })), std::invalid_argument);
  REQUIRE_THROWS_AS(HintAwarePolicy(clock, with([](auto& o) { o.expected_use_horizon_s = std::nan(""); })),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(HintAwarePolicy(clock, with([](auto& o) { o.expected_use_grace_s = kInf; })),
                    std::invalid_argument);
  REQUIRE_NOTHROW(HintAwarePolicy(clock, with([](auto& o) { o.expected_use_horizon_s = kInf; })));
  auto p = cairn::make_eviction_policy("hints", clock);
  REQUIRE(p.ok());
  REQUIRE(std::string((*p)->name()) == "hints");
  REQUIRE(std::string(cairn::standing_name(Standing::kPopulation)) == "population");
}

TEST_CASE("LRU and lineage ignore the hint hooks", "[policy][hints]") {
  FakeClock clock;
  cairn::LruPolicy lru;
  cairn::LineagePolicy lineage(clock);
  for (cairn::EvictionPolicy* p :
       {static_cast<cairn::EvictionPolicy*>(&lru), static_cast<cairn::EvictionPolicy*>(&lineage)}) {
    p->track(key(1), kMiB);
    p->track(key(2), kMiB);
    p->set_expected_use(key(1), 0);
    p->set_population(key(1), true);
    p->set_done(key(2), true);
    REQUIRE(p->pick_victim(kAny) == key(1));
  }
}

TEST_CASE("add_seconds_ns saturates instead of overflowing", "[policy][hints]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  REQUIRE(cairn::add_seconds_ns(5, 1.5) == 1'500'000'005);
  REQUIRE(cairn::add_seconds_ns(kMax - 10, 1) == kMax);
  REQUIRE(cairn::add_seconds_ns(0, 1e300) == kMax);
  REQUIRE(cairn::add_seconds_ns(0, -1e300) == std::numeric_limits<int64_t>::min());
  REQUIRE(cairn::add_seconds_ns(100, -1e-7) == 0);
}

TEST_CASE("A chunk a commit wrote enters cold: it goes before chunks that were read, until it is read",
          "[policy][hints]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  p.track(key(1), kMiB);  // read into the tier
  clock.advance_ns(1'000'000);
  p.track_written(key(2), kMiB);                    // written by a commit, newer but never read
  CHECK(*p.priority(key(2)) == Approx(p.aging()));  // H = L: no access counted
  CHECK(*p.priority(key(1)) > *p.priority(key(2)));
  p.track_written(key(3), kMiB);
  p.touch(key(3));  // a read counts: now it ranks as a chunk read once, newest
  CHECK(eviction_order(p) == std::vector<uint64_t>{2, 1, 3});

  // Hints still decide the standing: a written chunk of the population outranks an ordinary read one.
  HintAwarePolicy q(clock);
  q.track(key(4), kMiB);
  q.set_population(key(5), true);  // unknown key: ignored
  q.track_written(key(5), kMiB);
  q.set_population(key(5), true);
  CHECK(q.standing(key(5)) == Standing::kPopulation);
  CHECK(eviction_order(q) == std::vector<uint64_t>{4, 5});

  // Writing bytes the tier already holds is no read: the rank stays.
  HintAwarePolicy r(clock);
  r.track_written(key(6), kMiB);
  r.track(key(7), kMiB);
  r.track_written(key(6), kMiB);
  CHECK(eviction_order(r) == std::vector<uint64_t>{6, 7});

  // LineagePolicy, the same scorer without hooks, does the same; LRU treats a write as a use.
  cairn::LineagePolicy l(clock);
  l.track(key(8), kMiB);
  l.track_written(key(9), kMiB);
  CHECK(l.pick_victim(kAny)->lo == 9);
  cairn::LruPolicy lru;
  lru.track(key(8), kMiB);
  lru.track_written(key(9), kMiB);
  CHECK(lru.pick_victim(kAny)->lo == 8);
}

TEST_CASE("HintAwarePolicy keeps the chunks of a cycle it took in first", "[policy][hints][cyclic]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  for (uint64_t i = 1; i <= 4; ++i) {
    p.track(key(i), kMiB);
    clock.advance_s(1);
  }
  // 1 and 4 stay ordinary; 2 and 3 are read in a cycle: after the ordinary chunks, the newest taken
  // in goes first, whatever was read since (3 is read again and still goes before 2).
  p.set_cyclic(key(2), true);
  p.set_cyclic(key(3), true);
  p.touch(key(3));
  CHECK(p.cyclic(key(2)) == true);
  CHECK(p.cyclic(key(1)) == false);
  CHECK_FALSE(p.cyclic(key(9)).has_value());
  CHECK(p.standing(key(2)) == Standing::kOrdinary);
  CHECK(p.peek_victim(kAny) == key(1));
  const double aging_before = p.aging();
  const std::vector<uint64_t> order = eviction_order(p);
  CHECK(order == std::vector<uint64_t>{1, 4, 3, 2});
  CHECK(p.aging() >= aging_before);
}

TEST_CASE("HintAwarePolicy: a cyclic victim does not raise L, and set_cyclic(false) withdraws it",
          "[policy][hints][cyclic]") {
  FakeClock clock;
  HintAwarePolicy p(clock);
  p.track(key(1), kMiB);
  clock.advance_s(1);
  p.track(key(2), kMiB);
  p.set_cyclic(key(1), true);
  p.set_cyclic(key(2), true);
  auto v = p.pick_victim(kAny);
  REQUIRE(v);
  CHECK(*v == key(2));  // the newest taken in
  CHECK(p.aging() == 0);
  p.set_cyclic(key(1), false);
  CHECK(p.cyclic(key(1)) == false);
  // A population chunk read in a cycle stays above the population's other chunks.
  p.remove(key(2));
  p.track(key(3), kMiB);
  p.set_population(key(1), true);
  p.set_population(key(3), true);
  p.set_cyclic(key(1), true);
  CHECK(eviction_order(p) == std::vector<uint64_t>{3, 1});
}
