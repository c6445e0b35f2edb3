// Cycles found from reads (daemon/read_cycles.hpp, docs/policy.md "Cycles in the daemon"): the
// rule on its own, then the daemon end to end: a model that does not fit in DRAM, read again and
// again, keeps a stable part resident with policy.eviction hints, where LRU gets no hit at all.
#include <algorithm>

#include "daemon/read_cycles.hpp"
#include "unit/daemon/engine_util.hpp"

namespace cairn {
namespace {

using namespace engine_test;

ChunkHash chunk_n(uint64_t n) { return ChunkHash{0xC1C1E, n}; }

// A model whose tensor i has the chunks numbered in chunks[i].
ModelManifest model_of(const std::string& id, const std::vector<std::vector<uint64_t>>& chunks) {
  ModelManifest m;
  m.id = id;
  m.created_ns = 1;
  std::vector<TensorManifest> ts;
  for (size_t i = 0; i < chunks.size(); ++i) {
    TensorManifest t;
    t.name = "t" + std::to_string(i);
    for (uint64_t n : chunks[i]) t.chunks.push_back(ChunkRef{chunk_n(n), 1, "", 0});
    ts.push_back(std::move(t));
  }
  m.tensors = std::move(ts);
  return m;
}

std::vector<ChunkHash> sorted(std::vector<ChunkHash> v) {
  std::sort(v.begin(), v.end(), [](const ChunkHash& a, const ChunkHash& b) { return a.hex() < b.hex(); });
  return v;
}

std::vector<ChunkHash> chunks_n(std::initializer_list<uint64_t> ns) {
  std::vector<ChunkHash> v;
  for (uint64_t n : ns) v.push_back(chunk_n(n));
  return sorted(v);
}

}  // namespace

TEST_CASE("ReadCycles: a model read again after its chunks left DRAM is cyclic; a first read or a hit is not",
          "[cycles]") {
  ReadCycles cycles;
  const ModelManifest m = model_of("m", {{1, 2}, {3, 2}});  // chunk 2 in both tensors
  const TensorManifest* t0 = &m.tensors[0];
  const TensorManifest* t1 = &m.tensors[1];
  // The first reads of each tensor load them: nothing read before.
  auto c = cycles.read(m, {t0}, {2}, 10, 20);
  CHECK(c.mark.empty());
  c = cycles.read(m, {t1}, {1}, 30, 40);
  CHECK(c.mark.empty());
  // Read again, all resident.
  c = cycles.read(m, {t0, t1}, {0, 0}, 50, 60);
  CHECK(c.mark.empty());
  // A lease that began before the last read of t0 ended (two readers of a first load): its load
  // is not evidence of an eviction.
  c = cycles.read(m, {t0}, {1}, 55, 70);
  CHECK(c.mark.empty());
  // A device lease says nothing of DRAM.
  c = cycles.read(m, {t0}, {}, 75, 78);
  CHECK(c.mark.empty());
  CHECK_FALSE(cycles.cyclic("m"));
  CHECK(cycles.found() == 0);
  // t0 was read (that lease ended at 70) and is loaded again by a lease that began after: evicted since.
  c = cycles.read(m, {t0}, {1}, 80, 90);
  CHECK(sorted(c.mark) == chunks_n({1, 2, 3}));  // every distinct chunk, resident or not
  CHECK(c.unmark.empty());
  CHECK(cycles.cyclic("m"));
  CHECK(cycles.cyclic_models() == 1);
  CHECK(cycles.found() == 1);
  // Found once: later rounds change nothing.
  c = cycles.read(m, {t1}, {1}, 100, 110);
  CHECK(c.mark.empty());
  CHECK(cycles.found() == 1);
}

TEST_CASE("ReadCycles: forgetting a model unmarks the chunks no other cyclic model uses", "[cycles]") {
  ReadCycles cycles;
  const ModelManifest a = model_of("a", {{1, 2}});
  const ModelManifest b = model_of("b", {{2, 3}});
  for (const ModelManifest* m : {&a, &b}) {
    (void)cycles.read(*m, {&m->tensors[0]}, {2}, 10, 20);
    REQUIRE_FALSE(cycles.read(*m, {&m->tensors[0]}, {1}, 30, 40).mark.empty());
  }
  CHECK(cycles.cyclic_models() == 2);
  auto c = cycles.forget("a");
  CHECK(c.unmark == std::vector<ChunkHash>{chunk_n(1)});  // chunk 2 stays: b is still cyclic
  CHECK_FALSE(cycles.cyclic("a"));
  c = cycles.forget("b");
  CHECK(sorted(c.unmark) == chunks_n({2, 3}));
  CHECK(cycles.forget("b").unmark.empty());  // twice: nothing
  CHECK(cycles.cyclic_models() == 0);
}

TEST_CASE("ReadCycles: a cyclic model not read for the idle time stops being cyclic", "[cycles]") {
  ReadCycles::Options o;
  o.idle_ns = 5'000'000'000;
  ReadCycles cycles(o);
  const ModelManifest a = model_of("a", {{1}});
  const ModelManifest b = model_of("b", {{2}});
  (void)cycles.read(a, {&a.tensors[0]}, {1}, 1'000'000'000, 1'000'000'000);
  REQUIRE(cycles.read(a, {&a.tensors[0]}, {1}, 2'000'000'000, 2'000'000'000).mark.size() == 1);
  // Reads of a keep it cyclic; reads of b do not.
  (void)cycles.read(a, {&a.tensors[0]}, {0}, 6'000'000'000, 6'000'000'000);
  CHECK(cycles.read(b, {&b.tensors[0]}, {1}, 10'000'000'000, 10'000'000'000).unmark.empty());
  CHECK(cycles.cyclic("a"));
  auto c = cycles.read(b, {&b.tensors[0]}, {0}, 11'000'000'000, 11'000'000'000);
  CHECK(c.unmark == std::vector<ChunkHash>{chunk_n(1)});
  CHECK_FALSE(cycles.cyclic("a"));
  // Forgotten: its next reads start afresh (a first read again, then a re-read that misses).
  CHECK(cycles.read(a, {&a.tensors[0]}, {1}, 12'000'000'000, 12'000'000'000).mark.empty());
  CHECK(cycles.read(a, {&a.tensors[0]}, {1}, 13'000'000'000, 13'000'000'000).mark.size() == 1);
  CHECK(cycles.found() == 2);
}

namespace {

// 8 MiB: 32 tensors of 256 KiB, 4 chunks each (engine tests use 64 KiB chunks).
constexpr int kTensors = 32;
constexpr uint64_t kTensorBytes = 4 * kChunk;

struct StoredBase {
  TempDir dir;
  StoredBase() {
    auto e = make_engine(dir.path);
    Session s;
    std::vector<std::pair<std::string, std::vector<uint8_t>>> tensors;
    for (int i = 0; i < kTensors; ++i)
      tensors.emplace_back("layer" + std::to_string(i), pattern(kTensorBytes, 700 + static_cast<uint64_t>(i)));
    commit_inline(*e, s, "base", "", tensors);
    e->end_session(s);
  }
};

// Reads every tensor of `base` `rounds` times, one lease at a time, in a daemon whose DRAM arena
// holds half of it; returns the DRAM hits of each round.
std::vector<uint64_t> read_in_cycles(const StoredBase& st, const std::string& eviction, int rounds, json* prefetch) {
  auto e = make_engine(st.dir.path, [&](Config& c) {
    c.tiers.dram.capacity = kTensors * kTensorBytes / 2;  // 4 MiB
    c.policy.eviction = eviction;
  });
  Session s;
  std::vector<uint64_t> hits;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t before = e->dram().stats().hits;
    for (int i = 0; i < kTensors; ++i) {
      const std::string name = "layer" + std::to_string(i);
      REQUIRE((read_tensor(*e, s, "base", name) == pattern(kTensorBytes, 700 + static_cast<uint64_t>(i))));  // exact
    }
    hits.push_back(e->dram().stats().hits - before);
  }
  if (prefetch) *prefetch = stats(*e, s)["prefetch"];
  e->end_session(s);
  return hits;
}

}  // namespace

TEST_CASE("cycles: a model re-read in a cycle that does not fit keeps a stable part resident (hints), LRU none",
          "[cycles][engine]") {
  StoredBase st;
  json p;
  const std::vector<uint64_t> lru = read_in_cycles(st, "lru", 4, &p);
  const std::vector<uint64_t> hints = read_in_cycles(st, "hints", 4, &p);
  WARN("DRAM hits per round (of 128 chunks): lru " << json(lru).dump() << ", hints " << json(hints).dump());
  // Recency pushes out each chunk just before its next read.
  CHECK(lru == std::vector<uint64_t>{0, 0, 0, 0});
  // Found at the first re-read; from then on the part resident then is hit on every round: nearly
  // the arena (128 chunks, 64 in the arena, less one tensor's room to pass the rest through).
  CHECK(p["cycles_found"] == 1);
  CHECK(p["cyclic_models"] == 1);
  CHECK(hints[0] == 0);
  for (int r = 1; r < 4; ++r) {
    CHECK(hints[static_cast<size_t>(r)] >= 40);
    CHECK(hints[static_cast<size_t>(r)] <= 64);
  }
  CHECK(hints[2] == hints[3]);  // a stable part
}

TEST_CASE("cycles: reads that fit, or a first read that does not, find no cycle; done ends one", "[cycles][engine]") {
  StoredBase st;
  {
    // One pass through a DRAM tier too small: each chunk is read once, nothing is read again.
    json p;
    (void)read_in_cycles(st, "hints", 1, &p);
    CHECK(p["cycles_found"] == 0);
  }
  {
    // Re-reads that fit hit everything: no cycle.
    auto e = make_engine(st.dir.path, [&](Config& c) { c.policy.eviction = "hints"; });
    Session s;
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < kTensors; ++i) (void)read_tensor(*e, s, "base", "layer" + std::to_string(i));
    CHECK(stats(*e, s)["prefetch"]["cycles_found"] == 0);
    e->end_session(s);
  }
  {
    // A cycle, then `done`: not cyclic any more.
    auto e = make_engine(st.dir.path, [&](Config& c) {
      c.tiers.dram.capacity = kTensors * kTensorBytes / 2;
      c.policy.eviction = "hints";
    });
    Session s;
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < kTensors; ++i) (void)read_tensor(*e, s, "base", "layer" + std::to_string(i));
    CHECK(stats(*e, s)["prefetch"]["cyclic_models"] == 1);
    ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "done"}, {"models", {"base"}}}}});
    CHECK(stats(*e, s)["prefetch"]["cyclic_models"] == 0);
    e->end_session(s);
  }
}

}  // namespace cairn
