#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "policy/simulator.hpp"
#include "policy/trace.hpp"
#include "policy/trace_gen.hpp"
#include "unit/policy/trace_builder.hpp"

using cairn::HintKind;
using cairn::SimPolicy;
using cairn::SimResult;
using cairn::Simulator;
using cairn::Trace;
using cairn::TraceEvent;
using cairn::TraceEventKind;
using cairn::TraceTier;
using cairn::testing::Build;

namespace {

Simulator make(const Trace& t) {
  auto s = Simulator::create(t);
  REQUIRE(s.ok());
  return std::move(s).value();
}

}  // namespace

TEST_CASE("Simulator: LRU and Belady hits on a hand-made trace", "[policy][sim]") {
  // a b a c b a through a cache of two chunks.
  Build b;
  b.access("m", "a").access("m", "b").access("m", "a").access("m", "c").access("m", "b").access("m", "a");
  const Simulator sim = make(b.trace());
  const SimResult lru = sim.run(SimPolicy::kLru, 20);
  REQUIRE(lru.requests == 6);
  REQUIRE(lru.hits == 1);  // only the second a: c pushes b out, b pushes a out, a pushes c out
  REQUIRE(lru.bytes_hit == 10);
  REQUIRE(lru.evictions == 3);
  const SimResult opt = sim.run(SimPolicy::kBelady, 20);
  REQUIRE(opt.hits == 3);  // c is never read again: not cached; b and a hit
  REQUIRE(opt.bypassed == 1);
  REQUIRE(opt.evictions == 0);
  REQUIRE(opt.byte_hit_ratio() == Approx(0.5));
  REQUIRE(opt.object_hit_ratio() == Approx(0.5));
  // A cache of all three hits every second read.
  for (SimPolicy p : cairn::kAllSimPolicies) REQUIRE(sim.run(p, 30).hits == 3);
  // An empty cache hits nothing.
  for (SimPolicy p : cairn::kAllSimPolicies) REQUIRE(sim.run(p, 0).hits == 0);
}

TEST_CASE("Simulator: a chunk larger than the cache is never cached", "[policy][sim]") {
  Build b;
  b.access("m", "big", 20).access("m", "small", 5).access("m", "big", 20).access("m", "small", 5);
  const Simulator sim = make(b.trace());
  for (SimPolicy p : cairn::kAllSimPolicies) {
    INFO(cairn::sim_policy_name(p));
    const SimResult r = sim.run(p, 15);
    REQUIRE(r.hits == 1);
    REQUIRE(r.bytes_hit == 5);
    REQUIRE(r.bytes_missed() == 45);
  }
}

TEST_CASE("Simulator: inserts fill the cache without being requests; misses counted per tier", "[policy][sim]") {
  Build b;
  b.insert("m", "a").insert("m", "x", 7);
  b.access("m", "a", 10, TraceTier::kDram).access("m", "b", 10, TraceTier::kRepository);
  b.access("m", "c", 10, TraceTier::kNvme).access("m", "b", 10, TraceTier::kPeer);
  const Simulator sim = make(b.trace());
  const cairn::TraceSummary& s = sim.summary();
  REQUIRE(s.events == 6);
  REQUIRE(s.accesses == 4);
  REQUIRE(s.inserts == 2);
  REQUIRE(s.models == 1);
  REQUIRE(s.chunks_accessed == 3);
  REQUIRE(s.working_set_bytes == 30);  // x is written, never read: not in the working set
  REQUIRE(s.unbounded_hits == 2);
  const SimResult r = sim.run(SimPolicy::kLru, 1000);
  REQUIRE(r.requests == 4);
  REQUIRE(r.hits == 2);
  REQUIRE(r.bytes_missed_by_tier[static_cast<int>(TraceTier::kRepository)] == 10);
  REQUIRE(r.bytes_missed_by_tier[static_cast<int>(TraceTier::kNvme)] == 10);
  REQUIRE(r.bytes_missed_by_tier[static_cast<int>(TraceTier::kPeer)] == 0);
  REQUIRE(r.bytes_missed_by_tier[static_cast<int>(TraceTier::kDram)] == 0);
  // At 0.5 of the working set (15 bytes: one chunk of 10).
  const std::vector<SimResult> rs = sim.run_fractions({SimPolicy::kLru, SimPolicy::kBelady}, {0.5, 1.0});
  REQUIRE(rs.size() == 4);
  REQUIRE(rs[0].capacity_bytes == 15);
  REQUIRE(rs[0].fraction == 0.5);
  REQUIRE(rs[1].policy == SimPolicy::kBelady);
  REQUIRE(rs[3].capacity_bytes == 30);
}

TEST_CASE("Simulator: a population hint keeps the parent through a scan", "[policy][sim]") {
  Build b;
  b.hint(HintKind::kPopulation, {"parent"});
  b.access("parent", "P").access("other", "Y1").access("other", "Y2").access("parent", "P");
  const Simulator sim = make(b.trace());
  REQUIRE(sim.run(SimPolicy::kLru, 20).hits == 0);
  REQUIRE(sim.run(SimPolicy::kLineage, 20).hits == 0);
  REQUIRE(sim.run(SimPolicy::kHints, 20).hits == 1);
  REQUIRE(sim.run(SimPolicy::kBelady, 20).hits == 1);
}

TEST_CASE("Simulator: a population with scores keeps the likeliest parent's chunks", "[policy][sim]") {
  // Three members read one chunk each, a and b of 10 bytes, c of 20; the population hint then says
  // a wins the next tournament with 0.7, b with 0.2, c with 0.1. Another model reads X (10 bytes),
  // which needs room, and then the winner a is read. The cache holds 40 bytes.
  //  hints without the chances: X takes the place of the population chunk with the lowest H, A,
  //  the oldest: 0 hits. With them: X, read once, ranks below every population chunk with a chance
  //  and passes through (bypassed); A hits. LRU: X evicts A. Belady bypasses X.
  auto trace = [](bool chances) {
    Build b;
    b.access("a", "A").access("b", "B").access("c", "C", 20);
    b.hint(HintKind::kPopulation, {"a", "b", "c"});
    if (chances) b.chance("a", 0.7).chance("b", 0.2).chance("c", 0.1);
    b.access("x", "X").access("a", "A");
    return b.simulator();
  };
  const Simulator plain = trace(false), scored = trace(true);
  CHECK(plain.run(SimPolicy::kHints, 40).hits == 0);
  CHECK(scored.run(SimPolicy::kHints, 40).hits == 1);
  CHECK(scored.run(SimPolicy::kLru, 40).hits == 0);
  CHECK(scored.run(SimPolicy::kBelady, 40).hits == 1);

  SECTION("a chunk several members use has the sum of their chances") {
    // Three loads read two chunks each, so every position has a share of 1: b reads S B, a reads
    // A A2, c reads S C (S hits). The population then gives a 0.3, b 0.2, c 0.15 and d, not yet
    // stored, 0.35: S has b's and c's, 0.35, above A and A2 (0.3); B 0.2; C 0.15. d's commit writes
    // D1 and D2 (20 bytes each, 0.35) into a cache of 60 that holds 50: C, B and then A leave (had
    // S one member's chance, 0.2 or 0.15, it would have left before A). S and A2 are read again and
    // hit, as Belady, which bypasses D1 and D2.
    Build b;
    b.access("b", "S").access("b", "B").access("a", "A").access("a", "A2").access("c", "S").access("c", "C");
    b.hint(HintKind::kPopulation, {"a", "b", "c", "d"});
    b.chance("a", 0.3).chance("b", 0.2).chance("c", 0.15).chance("d", 0.35);
    b.insert("d", "D1", 20).insert("d", "D2", 20).access("c", "S").access("a", "A2");
    const Simulator sim = b.simulator();
    CHECK(sim.run(SimPolicy::kHints, 60).hits == 3);
    CHECK(sim.run(SimPolicy::kBelady, 60).hits == 3);
  }

  SECTION("a new population withdraws the previous one's chances") {
    // After the chances, a population without scores: every member is equal again (by H), so A,
    // the oldest, leaves first, as without chances.
    Build b;
    b.access("a", "A").access("b", "B").access("c", "C", 20);
    b.hint(HintKind::kPopulation, {"a", "b", "c"}).chance("a", 0.7).chance("b", 0.2).chance("c", 0.1);
    b.hint(HintKind::kPopulation, {"a", "b", "c"});
    b.access("x", "X").access("a", "A");
    CHECK(b.simulator().run(SimPolicy::kHints, 40).hits == 0);
  }
}

TEST_CASE("Simulator: a done model's chunks go first", "[policy][sim]") {
  Build b;
  b.access("e", "E").access("d", "D").hint(HintKind::kDone, {"d"}).access("f", "F").access("e", "E");
  const Simulator sim = make(b.trace());
  REQUIRE(sim.run(SimPolicy::kLru, 20).hits == 0);  // F pushed E out
  REQUIRE(sim.run(SimPolicy::kHints, 20).hits == 1);
}

TEST_CASE("Simulator: a will_load hint keeps the model through other reads", "[policy][sim]") {
  Build b;
  b.access("a", "A").access("b", "B").hint(HintKind::kWillLoad, {"a"}).access("c", "C").access("a", "A");
  const Simulator sim = make(b.trace());
  REQUIRE(sim.run(SimPolicy::kLru, 20).hits == 0);
  REQUIRE(sim.run(SimPolicy::kHints, 20).hits == 1);

  SECTION("a chunk shared with a model read meanwhile stays expected") {
    Build s;
    s.access("a", "A").access("b", "B").hint(HintKind::kWillLoad, {"a"});
    s.access("x", "A").access("c", "C").access("a", "A");  // x reads a's chunk: a's read is still to come
    const Simulator sim2 = make(s.trace());
    REQUIRE(sim2.run(SimPolicy::kHints, 20).hits == 2);
  }
}

TEST_CASE("Simulator: a will_load naming chunks keeps those, not the rest of the model", "[policy][sim]") {
  // Model a has chunks A1 and A2; the hint expects A1 only. Two other reads need the room of one.
  Build b;
  b.access("a", "A1").access("a", "A2").expect("a", "A1").access("c", "C").access("a", "A1").access("a", "A2");
  const Simulator sim = make(b.trace());
  REQUIRE(sim.run(SimPolicy::kLru, 20).hits == 0);
  const SimResult h = sim.run(SimPolicy::kHints, 20);
  CHECK(h.hits == 1);                                // A1 kept through C; A2 went
  CHECK(sim.run(SimPolicy::kBelady, 20).hits == 2);  // Belady does not cache C at all

  SECTION("the expectation is used up by the read") {
    // After its read A1 is no longer expected, so `done` makes it the first victim and B stays; a
    // lingering expectation would outrank done and push B out instead.
    Build u;
    u.access("a", "A1").expect("a", "A1").access("a", "A1").hint(HintKind::kDone, {"a"});
    u.access("b", "B").access("c", "C").access("b", "B");
    CHECK(make(u.trace()).run(SimPolicy::kHints, 20).hits == 2);
  }
  SECTION("two announced reads of one chunk: the first read fulfils one, the other stays") {
    // Two candidates will load A1; after the first one's read A1 must still outrank a done chunk...
    // here, a done A1 with a pending read outranks B, so B goes when C comes, and the second read hits.
    Build two;
    two.access("a", "A1").expect("a", "A1").expect("a", "A1").access("a", "A1").hint(HintKind::kDone, {"a"});
    two.access("b", "B").access("c", "C").access("a", "A1");
    CHECK(make(two.trace()).run(SimPolicy::kHints, 20).hits == 2);
  }
  SECTION("a chunk expected before it is written enters expected") {
    Build w;
    w.expect("p", "P").insert("p", "P").insert("q", "Q1").insert("q", "Q2").access("p", "P");
    CHECK(make(w.trace()).run(SimPolicy::kHints, 20).hits == 1);
    CHECK(make(w.trace()).run(SimPolicy::kLineage, 20).hits == 0);
  }
}

TEST_CASE("Simulator: a model re-read in a cycle keeps a stable part resident (hints)", "[policy][sim][cyclic]") {
  // One model of four 10-byte chunks read three times over, a cache of two chunks.
  //  pass 1: a b c d miss; the lineage order is recency here: c evicts a, d evicts b.  cache {c, d}
  //  pass 2: the run reads a, its first chunk, again: the model is read in a cycle and its chunks
  //          rank newest taken in first. a comes in and ranks lowest with only cyclic chunks to give
  //          way: it is bypassed; so is b. c and d hit (2).
  //  pass 3: the same (2).
  // hints: 4 hits, as Belady (which keeps a and b from the start). LRU and lineage: 0.
  Build b;
  for (int pass = 0; pass < 3; ++pass) b.access("m", "a").access("m", "b").access("m", "c").access("m", "d");
  const Simulator sim = make(b.trace());
  CHECK(sim.run(SimPolicy::kLru, 20).hits == 0);
  CHECK(sim.run(SimPolicy::kLineage, 20).hits == 0);
  const SimResult h = sim.run(SimPolicy::kHints, 20);
  CHECK(h.hits == 4);
  CHECK(h.bypassed == 4);
  CHECK(sim.run(SimPolicy::kBelady, 20).hits == 4);
  // Without competing admission the newest chunk taken in gives way instead: pass 2, a evicts d, b
  // evicts a, c hits, d evicts b; pass 3 the same: c hits twice.
  cairn::SimOptions o;
  o.competing_admission = false;
  auto plain = Simulator::create(b.trace(), o);
  REQUIRE(plain.ok());
  CHECK(plain->run(SimPolicy::kHints, 20).hits == 2);
}

TEST_CASE("Simulator: a model read again after its chunks left is cyclic across runs; writes pass it by",
          "[policy][sim][cyclic]") {
  // m (a b c d) is read three times through a cache of two chunks, each time after y reads Y, and a
  // commit of z writes W before the third. The runs never wrap, but run 2 reads a, which run 1 read
  // and which has left: m is cyclic from then on (as the daemon's rule), and stays so in run 3.
  //  run 1: a b c d, then Y: {d, Y}. Run 2: a comes in (cyclic) and takes Y's place; b and c, the
  //  newest cyclic, pass through; d hits. Y and W rank below the cyclic chunks and pass through.
  //  Run 3: a and d hit. LRU: 0.
  Build b;
  b.reads("abcd").access("y", "Y").reads("abcd").access("y", "Y").insert("z", "W").reads("abcd");
  const Simulator sim = b.simulator();
  CHECK(sim.run(SimPolicy::kHints, 20).hits == 3);
  CHECK(sim.run(SimPolicy::kLru, 20).hits == 0);
}

TEST_CASE("Simulator: a checkpoint restore keeps the newest checkpoint's chunks it will read",
          "[policy][sim][cyclic]") {
  // ck/1 is written (a b), then ck/2 (c d e f) through a cache of two chunks: cold writes leave in
  // the order they came, so e and f stay. ck/1 is done; ck/2 will be read, then is read in order.
  //  hints: c comes in, ranks lowest (read, nothing more expected) and only expected chunks would
  //  give way: bypassed; so is d. e and f hit (2), as Belady. LRU: c evicts e, d evicts f: 0.
  Build b;
  b.insert("ck/1", "a").insert("ck/1", "b");
  b.insert("ck/2", "c").insert("ck/2", "d").insert("ck/2", "e").insert("ck/2", "f");
  b.hint(HintKind::kDone, {"ck/1"}).hint(HintKind::kWillLoad, {"ck/2"});
  b.access("ck/2", "c").access("ck/2", "d").access("ck/2", "e").access("ck/2", "f");
  const Simulator sim = make(b.trace());
  CHECK(sim.run(SimPolicy::kLru, 20).hits == 0);
  CHECK(sim.run(SimPolicy::kHints, 20).hits == 2);
  CHECK(sim.run(SimPolicy::kBelady, 20).hits == 2);
}

TEST_CASE("Simulator: a chunk id with two sizes is an error naming it", "[policy][sim]") {
  Build b;
  b.access("m", "a", 10).access("m", "a", 11);
  auto sim = Simulator::create(b.trace());
  REQUIRE_FALSE(sim.ok());
  REQUIRE(sim.status().message() ==
          "simulator: event 2: chunk a has 11 bytes, but 10 before (a chunk id names one content)");
  cairn::SimOptions bad;
  bad.sequence_step_s = -1;
  REQUIRE_FALSE(Simulator::create(Trace{}, bad).ok());
  REQUIRE(cairn::parse_sim_policy("opt").status().message() ==
          "policy 'opt' is not one of lru, arc, s3fifo, lineage, hints, bound, belady");
  REQUIRE(*cairn::parse_sim_policy("belady") == SimPolicy::kBelady);
}

// ---- the committed traces (bench/traces/) ----

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("The committed traces are the generators' output, small, and replay sensibly", "[policy][sim][traces]") {
  for (const char* workload : cairn::kTraceWorkloads) {
    INFO(workload);
    const std::string path = std::string(CAIRN_SOURCE_DIR) + "/bench/traces/" + workload + ".csv";
    const std::string text = read_text(path);
    REQUIRE(!text.empty());
    REQUIRE(text.size() < 200 * 1024);
    auto generated = cairn::generate_trace(workload);
    REQUIRE(generated.ok());
    // Regenerate with: cairn-sim --generate <workload> --out bench/traces/<workload>.csv
    REQUIRE(cairn::format_trace(*generated) == text);

    auto trace = cairn::read_trace_file(path);
    REQUIRE(trace.ok());
    REQUIRE(*trace == *generated);
    const Simulator sim = make(*trace);
    const cairn::TraceSummary& s = sim.summary();
    REQUIRE(s.working_set_bytes > 0);
    const auto results = sim.run_fractions(
        {SimPolicy::kLru, SimPolicy::kLineage, SimPolicy::kHints, SimPolicy::kBelady}, {0.125, 0.25, 0.5});
    REQUIRE(results.size() == 12);
    for (size_t i = 0; i < results.size(); i += 4) {
      const SimResult& lru = results[i];
      const SimResult& opt = results[i + 3];
      REQUIRE(opt.policy == SimPolicy::kBelady);
      for (size_t k = i; k < i + 4; ++k) {
        REQUIRE(results[k].requests == s.accesses);
        REQUIRE(results[k].bytes_hit <= s.unbounded_bytes_hit);
      }
      REQUIRE(opt.bytes_hit >= lru.bytes_hit);
    }
  }
}

TEST_CASE("On the NAS trace the hint-aware policy beats LRU and the lineage scorer at every size",
          "[policy][sim][traces]") {
  auto trace = cairn::read_trace_file(std::string(CAIRN_SOURCE_DIR) + "/bench/traces/nas.csv");
  REQUIRE(trace.ok());
  const Simulator sim = make(*trace);
  const auto r =
      sim.run_fractions({SimPolicy::kLru, SimPolicy::kLineage, SimPolicy::kHints, SimPolicy::kBelady}, {0.125, 0.25});
  for (size_t i = 0; i < r.size(); i += 4) {
    INFO("size " << r[i].fraction << ": lru " << r[i].byte_hit_ratio() << " lineage " << r[i + 1].byte_hit_ratio()
                 << " hints " << r[i + 2].byte_hit_ratio() << " belady " << r[i + 3].byte_hit_ratio());
    REQUIRE(r[i + 2].byte_hit_ratio() > r[i].byte_hit_ratio());
    REQUIRE(r[i + 2].byte_hit_ratio() > r[i + 1].byte_hit_ratio());
    // The goal is 0.95 of Belady at 1/4 (docs/policy.md); this trace (seed 1) gives 0.94 there and 0.85 at
    // 1/8 (other seeds: docs/policy.md). The test guards against a regression, not the goal.
    REQUIRE(r[i + 2].byte_hit_ratio() >= (r[i].fraction < 0.2 ? 0.8 : 0.9) * r[i + 3].byte_hit_ratio());
  }
}

TEST_CASE("The generators are deterministic and refuse unknown workloads", "[policy][sim]") {
  cairn::GenerateOptions o;
  o.seed = 42;
  o.scale = 0.2;
  for (const char* workload : cairn::kTraceWorkloads) {
    INFO(workload);
    auto a = cairn::generate_trace(workload, o);
    auto b = cairn::generate_trace(workload, o);
    REQUIRE(a.ok());
    REQUIRE(*a == *b);
    const std::string text = cairn::format_trace(*a);
    auto back = cairn::parse_trace(text);
    REQUIRE(back.ok());
    REQUIRE(*back == *a);
  }
  REQUIRE(cairn::generate_trace("zoo").status().message() ==
          "generate: workload 'zoo' is not one of nas, ensemble, sweep, checkpoint");
  o.scale = 0;
  REQUIRE_FALSE(cairn::generate_trace("nas", o).ok());
}
