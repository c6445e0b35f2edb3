// ARC, S3-FIFO and the win-probability bound on small hand-made traces, hits worked out by hand.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "policy/baselines.hpp"
#include "policy/simulator.hpp"
#include "unit/policy/trace_builder.hpp"

using cairn::ArcCache;
using cairn::HintKind;
using cairn::S3FifoCache;
using cairn::SimPolicy;
using cairn::Simulator;
using cairn::testing::Build;

namespace {

uint64_t key(char c) { return static_cast<uint64_t>(c); }

}  // namespace

TEST_CASE("ARC keeps chunks read twice through a scan and adapts p on a ghost hit", "[policy][sim][arc]") {
  // Capacity 30 bytes: three 10-byte chunks. p starts at 0.
  //  a  miss  T1=[a]
  //  a  hit   T2=[a]                       (hit 1)
  //  b  miss  T1=[b]
  //  b  hit   T2=[b,a]                     (hit 2)
  //  x  miss  T1=[x]           (30 bytes: full, nothing evicted)
  //  y  miss  REPLACE: T1 (10) > p (0): x -> B1.       T1=[y]   B1=[x]
  //  z  miss  REPLACE: T1 (10) > p: y -> B1.           T1=[z]   B1=[y,x]
  //  a  hit   T2=[a,b]                     (hit 3)
  //  b  hit   T2=[b,a]                     (hit 4)
  //  x  miss, in B1: p += max(1, B2/B1 = 0) * 10 = 10; REPLACE: T1 (10) > p (10) fails, so T2's LRU a
  //           goes to B2. T2=[x,b]  T1=[z]  B1=[y]  B2=[a]
  // 4 hits. LRU hits 2 (the second a and b; the scan x y z pushes a and b out).
  const char* trace = "aabbxyzabx";
  ArcCache arc(30);
  int hits = 0;
  for (const char* c = trace; *c; ++c) hits += arc.access(key(*c), 10) ? 1 : 0;
  CHECK(hits == 4);
  CHECK(arc.target_t1_bytes() == 10);
  CHECK(arc.resident(key('x')));
  CHECK(arc.resident(key('b')));
  CHECK(arc.resident(key('z')));
  CHECK_FALSE(arc.resident(key('a')));
  CHECK_FALSE(arc.resident(key('y')));
  CHECK(arc.used_bytes() == 30);
  CHECK(arc.evictions() == 3);

  const Simulator sim = Build().reads(trace).simulator();
  CHECK(sim.run(SimPolicy::kArc, 30).hits == 4);
  CHECK(sim.run(SimPolicy::kArc, 30).bytes_hit == 40);
  CHECK(sim.run(SimPolicy::kLru, 30).hits == 2);
}

TEST_CASE("ARC: a ghost hit in B2 lowers p and the chunk returns to T2", "[policy][sim][arc]") {
  // Capacity 30. a b c a d b e a:
  //  a b c  miss  T1=[c,b,a]
  //  a      hit   T2=[a]  T1=[c,b]                              (hit 1)
  //  d      miss  REPLACE: T1 (20) > p (0): b -> B1.   T1=[d,c]  B1=[b]
  //  b      miss, in B1: p = 0 + max(1, 0/10) * 10 = 10; REPLACE: T1 (20) > 10: c -> B1.
  //               T2=[b,a]  T1=[d]  B1=[c]
  //  e      miss  REPLACE: T1 (10) > p (10) fails: T2's LRU a -> B2.  T1=[e,d]  T2=[b]  B2=[a]
  //  a      miss, in B2: p = 10 - max(1, B1/B2 = 10/10) * 10 = 0; REPLACE (a from B2): T1 (20) > 0:
  //               d -> B1.  T2=[a,b]  T1=[e]  B1=[d,c]
  // 1 hit; p ends at 0 with a and b in T2.
  ArcCache arc(30);
  int hits = 0;
  for (char c : std::string("abcadbea")) hits += arc.access(key(c), 10) ? 1 : 0;
  CHECK(hits == 1);
  CHECK(arc.target_t1_bytes() == 0);
  CHECK(arc.resident(key('a')));
  CHECK(arc.resident(key('b')));
  CHECK(arc.resident(key('e')));
  CHECK_FALSE(arc.resident(key('d')));
  // A chunk larger than the cache is never cached.
  CHECK_FALSE(arc.access(key('Z'), 31));
  CHECK_FALSE(arc.resident(key('Z')));
  CHECK(arc.bypassed() == 1);
}

TEST_CASE("S3-FIFO filters one-hit chunks through the small queue and readmits from its ghost",
          "[policy][sim][s3fifo]") {
  // Capacity 50 bytes (five 10-byte chunks): S's share 5 bytes, M's 45, the ghost 45 bytes of keys.
  //  a      miss  S=[a]
  //  a      hit   a.freq = 1                                    (hit 1)
  //  b c d e miss S=[e,d,c,b,a]  (50 bytes)
  //  f      miss  M (0) <= 45 and S not empty: evict from S. Tail a was hit: moves to M (freq 0);
  //               tail b was not: evicted, G=[b].   S=[f,e,d,c]  M=[a]
  //  g      miss  from S: c -> G.  S=[g,f,e,d]  G=[c,b]
  //  a      hit   (in M) a.freq = 1                             (hit 2)
  //  b      miss  from S: d -> G=[d,c,b]; b is in G: enters M.  M=[b,a]  S=[g,f,e]  G=[d,c]
  //  d      miss  from S: e -> G=[e,d,c]; d is in G: enters M.  M=[d,b,a]  S=[g,f]  G=[e,c]
  //  a      hit   a.freq = 2                                    (hit 3)
  //  h      miss  from S: f -> G.  S=[h,g]  G=[f,e,c]
  // 3 hits; LRU hits 2 (the second a, and the last a).
  const char* trace = "aabcdefgabdah";
  S3FifoCache s3(50);
  int hits = 0;
  for (const char* c = trace; *c; ++c) hits += s3.access(key(*c), 10) ? 1 : 0;
  CHECK(hits == 3);
  CHECK(s3.in_main(key('a')));
  CHECK(s3.in_main(key('b')));
  CHECK(s3.in_main(key('d')));
  CHECK(s3.in_small(key('g')));
  CHECK(s3.in_small(key('h')));
  CHECK(s3.in_ghost(key('f')));
  CHECK(s3.in_ghost(key('e')));
  CHECK(s3.in_ghost(key('c')));
  CHECK_FALSE(s3.in_ghost(key('b')));
  CHECK(s3.used_bytes() == 50);
  CHECK(s3.evictions() == 5);

  const Simulator sim = Build().reads(trace).simulator();
  CHECK(sim.run(SimPolicy::kS3Fifo, 50).hits == 3);
  CHECK(sim.run(SimPolicy::kLru, 50).hits == 2);
}

TEST_CASE("S3-FIFO: the main queue gives a hit chunk another round, then evicts it", "[policy][sim][s3fifo]") {
  // Capacity 30 (three chunks): S's share 3 bytes, M's 27, the ghost 27 bytes of keys (two chunks).
  //  a b c  miss  S=[c,b,a]
  //  d      miss  from S: a -> G.  S=[d,c,b]  G=[a]
  //  a      miss  from S: b -> G=[b,a]; a is in G: enters M.  M=[a]  S=[d,c]  G=[b]
  //  a      hit   a.freq = 1                                    (hit 1)
  //  b      miss  from S: c -> G=[c,b]; b in G: M=[b,a]  S=[d]  G=[c]
  //  c      miss  from S: d -> G=[d,c]; c in G: M=[c,b,a] (30 bytes, over M's share)  S=[]  G=[d]
  //  e      miss  M over its share: from M. Tail a has freq 1: back to M's head with 0; tail b
  //               (freq 0) is evicted, without a ghost.  M=[a,c]  S=[e]
  //  a      hit                                                 (hit 2)
  // 2 hits.
  S3FifoCache s3(30);
  int hits = 0;
  for (char c : std::string("abcdaabcea")) hits += s3.access(key(c), 10) ? 1 : 0;
  CHECK(hits == 2);
  CHECK(s3.in_main(key('a')));
  CHECK(s3.in_main(key('c')));
  CHECK(s3.in_small(key('e')));
  CHECK(s3.in_ghost(key('d')));
  CHECK_FALSE(s3.resident(key('b')));
  CHECK_FALSE(s3.in_ghost(key('b')));  // evicted from M: no ghost
  CHECK(s3.evictions() == 5);          // a, b, c, d from S; b from M
}

TEST_CASE("The win-probability bound keeps what the models still to be loaded will read", "[policy][sim][bound]") {
  // Capacity 20 (two chunks). m1 writes a, m2 writes b, m3 writes c; then loads m1, m3, m1 read a,
  // c, a. Three loads; each reads the chunk at position 0 of its model, so q[0] = 1. When c comes
  // in (no load started yet): w(m1) = 2/3, w(m2) = 0, w(m3) = 1/3, so b (value 0) goes and a and c
  // stay: the three reads hit. LRU evicts a (used longest ago) when c comes in, then b for a: 2 hits.
  Build ev;
  ev.insert("m1", "a").insert("m2", "b").insert("m3", "c");
  ev.access("m1", "a").access("m3", "c").access("m1", "a");
  const Simulator sim = ev.simulator();
  CHECK(sim.run(SimPolicy::kBound, 20).hits == 3);
  CHECK(sim.run(SimPolicy::kLru, 20).hits == 2);
  CHECK(sim.run(SimPolicy::kBelady, 20).hits == 3);
}

TEST_CASE("The win-probability bound: a model's life ends at its done hint", "[policy][sim][bound]") {
  // Capacity 20. m2 writes b; m1 writes a and reads it once (load 0); m2 is read (load 1) and is
  // then done; m3 writes c (eviction: 2 loads started, a third to come that reads a); m1 is read
  // (load 2). m2's life ended with load 1, so w(m2) = 0 and b goes; w(m1) = 1: a stays and hits.
  //  hits: a (load 0), b (load 1), a (load 2) = 3. LRU evicts a, touched before b: 2 hits.
  Build ev;
  ev.insert("m2", "b").insert("m1", "a").access("m1", "a").access("m2", "b").hint(HintKind::kDone, {"m2"});
  ev.insert("m3", "c").access("m1", "a");
  const Simulator sim = ev.simulator();
  CHECK(sim.run(SimPolicy::kBound, 20).hits == 3);
  CHECK(sim.run(SimPolicy::kLru, 20).hits == 2);
}

TEST_CASE("cairn-sim's policy names include the baselines and the bound", "[policy][sim]") {
  for (const char* name : {"arc", "s3fifo", "bound"}) {
    auto p = cairn::parse_sim_policy(name);
    REQUIRE(p.ok());
    CHECK(std::string(cairn::sim_policy_name(*p)) == name);
  }
  CHECK_FALSE(cairn::parse_sim_policy("clock").ok());
}
