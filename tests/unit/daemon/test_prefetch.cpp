// Hints and the prefetcher (daemon/hints.hpp, daemon/prefetcher.hpp, docs/policy.md): parsing with
// errors that name the field, staging ahead of reads, sequences, budgets, and hints that are wrong
// or too big, which must never change what a read returns.
#include <map>
#include <unordered_set>

#include "daemon/hints.hpp"
#include "policy/trace.hpp"
#include "unit/daemon/engine_util.hpp"

namespace cairn {
namespace {

using namespace engine_test;

// A repository with `n` models of two tensors each (three chunks per tensor), committed `global`
// by one engine and reopened by a fresh one, so that nothing is in DRAM.
struct Stored {
  TempDir dir;
  std::vector<std::vector<uint8_t>> w, b;
  explicit Stored(int n) {
    auto e = make_engine(dir.path);
    Session s;
    for (int i = 0; i < n; ++i) {
      w.push_back(pattern(3 * kChunk, 100 + static_cast<uint64_t>(i)));
      b.push_back(pattern(3 * kChunk - 17, 200 + static_cast<uint64_t>(i)));
      commit_inline(*e, s, "m" + std::to_string(i), "", {{"w", w.back()}, {"b", b.back()}});
    }
    e->end_session(s);
  }
};

uint64_t dram_hits(Engine& e) { return e.dram().stats().hits; }

// The parser refuses j with invalid_argument, its message containing `needle` (the field).
void bad(const json& j, const std::string& needle) {
  auto h = parse_hint(j);
  INFO(j.dump());
  REQUIRE_FALSE(h.ok());
  CHECK(h.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(h.status().message(), Catch::Contains(needle));
}

}  // namespace

TEST_CASE("hints: the parser rejects garbage naming the field", "[hints]") {
  bad(json::array(), "hint: must be a JSON object");
  bad(json{{"models", {"a"}}}, "hint.kind");
  bad(json{{"kind", "maybe_load"}, {"models", {"a"}}}, "hint.kind: 'maybe_load'");
  bad(json{{"kind", "done"}}, "hint.models: missing");
  bad(json{{"kind", "done"}, {"models", "a"}}, "hint.models: must be an array");
  bad(json{{"kind", "done"}, {"models", {"a", 7}}}, "hint.models[1]");
  bad(json{{"kind", "done"}, {"models", {""}}}, "hint.models[0]");
  bad(json{{"kind", "done"}, {"models", {"a"}}, {"when", 1}}, "hint.when: not a field of a 'done' hint");
  bad(json{{"kind", "will_load"}, {"models", {"a"}}, {"when", -1}}, "hint.when");
  bad(json{{"kind", "will_load"}, {"models", {"a"}}, {"when", "later"}}, "hint.when");
  bad(json{{"kind", "will_load"}, {"models", {"a"}}, {"tensors", {1}}}, "hint.tensors[0]");
  bad(json{{"kind", "sequence"}, {"models", {"a"}}, {"ahead", 0}}, "hint.ahead");
  bad(json{{"kind", "sequence"}, {"models", {"a"}}, {"ahead", 1000}}, "hint.ahead");

  auto h = parse_hint(json{{"kind", "will_load"}, {"models", {"a", "b", "a"}}, {"tensors", {"w"}}, {"when", "next"}});
  REQUIRE(h.ok());
  CHECK(h->models == std::vector<std::string>{"a", "b"});  // duplicates dropped, order kept
  CHECK(h->tensors == std::vector<std::string>{"w"});
  CHECK(h->when_s == 0);
  auto q = parse_hint(json{{"kind", "sequence"}, {"models", {"x", "y"}}, {"ahead", 3}});
  REQUIRE(q.ok());
  CHECK(q->kind == Hint::Kind::kSequence);
  CHECK(q->ahead == 3);
}

TEST_CASE("hints: a population with scores gives each member its chance to win a tournament", "[hints]") {
  const json models = {"a", "b", "c", "d", "e", "f"};
  bad(json{{"kind", "population"}, {"models", models}, {"scores", {1, 2, 3, 4, 5, 6}}}, "hint.tournament: missing");
  bad(json{{"kind", "population"}, {"models", models}, {"tournament", 3}}, "hint.scores: missing");
  bad(json{{"kind", "population"}, {"models", models}, {"scores", {1, 2}}, {"tournament", 3}},
      "hint.scores: 2 scores for 6 models");
  bad(json{{"kind", "population"}, {"models", models}, {"scores", 1}, {"tournament", 3}},
      "hint.scores: must be an array");
  bad(json{{"kind", "population"}, {"models", models}, {"scores", {1, 2, "x", 4, 5, 6}}, {"tournament", 3}},
      "hint.scores[2]: must be a finite number");
  bad(json{{"kind", "population"}, {"models", models}, {"scores", {1, 2, 3, 4, 5, 6}}, {"tournament", 0}},
      "hint.tournament: must be an integer");
  bad(json{{"kind", "population"}, {"models", models}, {"scores", {1, 2, 3, 4, 5, 6}}, {"tournament", 2.5}},
      "hint.tournament: must be an integer");
  bad(json{{"kind", "population"}, {"models", {"a", "a"}}, {"scores", {1, 2}}, {"tournament", 2}},
      "hint.models: must be distinct");
  bad(json{{"kind", "done"}, {"models", {"a"}}, {"scores", {1}}}, "hint.scores: not a field of a 'done' hint");

  // Six members, tournaments of 3 drawn without replacement: rank r wins with C(5-r, 2) / C(6, 3),
  // i.e. 10, 6, 3, 1, 0, 0 in 20. Scores in any order; higher is better.
  auto h = parse_hint(
      json{{"kind", "population"}, {"models", models}, {"scores", {0.2, 0.9, 0.5, 0.1, 0.7, 0.3}}, {"tournament", 3}});
  REQUIRE(h.ok());
  CHECK(h->tournament == 3);
  REQUIRE(h->parent_chance.size() == 6);
  // Ranks: b 0.9, e 0.7, c 0.5, f 0.3, a 0.2, d 0.1.
  const std::vector<double> want = {0.0, 10.0 / 20, 3.0 / 20, 0.0, 6.0 / 20, 1.0 / 20};
  for (size_t i = 0; i < 6; ++i) CHECK(h->parent_chance[i] == Approx(want[i]).margin(1e-12));
  // Without scores: as before, no chances.
  auto plain = parse_hint(json{{"kind", "population"}, {"models", models}});
  REQUIRE(plain.ok());
  CHECK(plain->parent_chance.empty());
  CHECK(plain->tournament == 0);
}

TEST_CASE("hints: tournament win chances by rank, ties shared, tournaments larger than the population", "[hints]") {
  // Brute force over every tournament of k distinct members out of n: the best drawn wins.
  auto brute = [](const std::vector<double>& scores, size_t k) {
    const size_t n = scores.size();
    std::vector<double> wins(n, 0.0);
    double draws = 0;
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      if (static_cast<size_t>(__builtin_popcount(mask)) != k) continue;
      ++draws;
      double best = -1e300;
      std::vector<size_t> top;
      for (size_t i = 0; i < n; ++i) {
        if (!(mask & (1u << i))) continue;
        if (scores[i] > best) {
          best = scores[i];
          top = {i};
        } else if (scores[i] == best) {
          top.push_back(i);
        }
      }
      for (size_t i : top) wins[i] += 1.0 / static_cast<double>(top.size());
    }
    for (double& w : wins) w /= draws;
    return wins;
  };
  const std::vector<std::vector<double>> cases = {
      {3, 1, 2}, {5, 4, 3, 2, 1, 0, -1, 7}, {1, 1, 2, 2, 0}, {0.5, 0.5, 0.5, 0.5}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}};
  for (const auto& scores : cases)
    for (size_t k = 1; k <= scores.size(); ++k) {
      const auto got = cairn::tournament_win_chances(scores, static_cast<uint32_t>(k));
      const auto want = brute(scores, k);
      double sum = 0;
      for (size_t i = 0; i < scores.size(); ++i) {
        INFO("n " << scores.size() << " k " << k << " member " << i);
        CHECK(got[i] == Approx(want[i]).margin(1e-12));
        sum += got[i];
      }
      CHECK(sum == Approx(1.0));
    }
  // A tournament larger than the population draws everyone: the best always wins.
  CHECK(cairn::tournament_win_chances({1, 3, 2}, 10) == std::vector<double>{0, 1, 0});
}

TEST_CASE("hints: will_load stages a model before it is read; the read finds it in DRAM", "[hints][prefetch]") {
  Stored st(2);
  auto e = make_engine(st.dir.path);
  Session s;
  json r = ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"m1"}}, {"when", "next"}}}});
  CHECK(r["kind"] == "will_load");
  CHECK(r["models"] == 1);
  CHECK(r["queued"] == 1);
  CHECK(r["unknown"].empty());
  e->prefetcher().idle();
  json p = stats(*e, s)["prefetch"];
  CHECK(p["chunks_staged"] == 6);
  CHECK(p["bytes_staged"] == 6 * kChunk - 17);
  const uint64_t hits0 = dram_hits(*e);
  CHECK(read_tensor(*e, s, "m1", "w") == st.w[1]);
  CHECK(read_tensor(*e, s, "m1", "b") == st.b[1]);
  CHECK(dram_hits(*e) - hits0 == 6);  // every chunk was already there
  p = stats(*e, s)["prefetch"];
  CHECK(p["chunks_used"] == 6);
  CHECK(p["chunks_wasted"] == 0);
  CHECK(p["chunks_unread"] == 0);
  // m0 was not announced: its read misses.
  const uint64_t misses0 = e->dram().stats().misses;
  CHECK(read_tensor(*e, s, "m0", "w") == st.w[0]);
  CHECK(e->dram().stats().misses - misses0 == 3);
  e->end_session(s);
}

TEST_CASE("hints: will_load of some tensors stages only those", "[hints][prefetch]") {
  Stored st(1);
  auto e = make_engine(st.dir.path);
  Session s;
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"m0"}}, {"tensors", {"b"}}}}});
  e->prefetcher().idle();
  CHECK(stats(*e, s)["prefetch"]["chunks_staged"] == 3);
  e->end_session(s);
}

TEST_CASE("hints: will_load of some tensors expects only their chunks, and the trace records each",
          "[hints][prefetch][trace]") {
  Stored st(1);
  const std::string trace = st.dir.path + "/trace.csv";
  auto e = make_engine(st.dir.path, [&](Config& c) { c.policy.trace = trace; });
  Session s;
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"m0"}}, {"tensors", {"b"}}, {"when", 2.5}}}});
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"m0"}}}}});
  e->prefetcher().idle();
  e->end_session(s);
  e.reset();  // closes the trace
  auto t = read_trace_file(trace);
  REQUIRE(t.ok());
  std::vector<TraceEvent> scoped, whole;
  for (const TraceEvent& ev : t->events) {
    if (ev.kind != TraceEventKind::kHint) continue;
    (ev.chunk.empty() ? whole : scoped).push_back(ev);
  }
  // b's three chunks, one line each, with their sizes and the `when`; the unscoped hint as one line.
  REQUIRE(scoped.size() == 3);
  uint64_t bytes = 0;
  for (const TraceEvent& ev : scoped) {
    CHECK(ev.hint == HintKind::kWillLoad);
    CHECK(ev.models == std::vector<std::string>{"m0"});
    CHECK(ev.when_s == 2.5);
    bytes += ev.bytes;
  }
  CHECK(bytes == st.b[0].size());
  REQUIRE(whole.size() == 1);
  CHECK(whole[0].models == std::vector<std::string>{"m0"});
}

TEST_CASE("hints: a sequence keeps `ahead` models staged in front of the reader", "[hints][prefetch]") {
  Stored st(4);
  auto e = make_engine(st.dir.path);
  Session s;
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "sequence"}, {"models", {"m0", "m1", "m2", "m3"}}, {"ahead", 1}}}});
  e->prefetcher().idle();
  CHECK(stats(*e, s)["prefetch"]["chunks_staged"] == 6);  // m0 only
  for (int i = 0; i < 4; ++i) {
    const std::string id = "m" + std::to_string(i);
    const uint64_t used0 = stats(*e, s)["prefetch"]["chunks_used"].get<uint64_t>();
    CHECK(read_tensor(*e, s, id, "w") == st.w[static_cast<size_t>(i)]);
    CHECK(read_tensor(*e, s, id, "b") == st.b[static_cast<size_t>(i)]);
    // Every chunk of the model was staged before its turn (the DRAM miss counter would count the
    // prefetcher's own staging of the next model, which runs meanwhile).
    CHECK(stats(*e, s)["prefetch"]["chunks_used"].get<uint64_t>() - used0 == 6);
    e->prefetcher().idle();
  }
  json p = stats(*e, s)["prefetch"];
  CHECK(p["chunks_staged"] == 24);
  CHECK(p["chunks_used"] == 24);
  e->end_session(s);
}

TEST_CASE("hints: unknown models are listed and the rest applies; bad hints are errors naming the field",
          "[hints][prefetch]") {
  Stored st(1);
  auto e = make_engine(st.dir.path);
  Session s;
  json r = ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"nope", "m0", "also-nope"}}}}});
  CHECK(r["models"] == 1);
  CHECK(r["unknown"] == json{"nope", "also-nope"});
  fails(*e, s, {{"op", "hint"}}, StatusCode::kInvalidArgument, "missing object field 'hint'");
  fails(*e, s, {{"op", "hint"}, {"hint", {{"kind", "soon"}, {"models", {"m0"}}}}}, StatusCode::kInvalidArgument,
        "hint.kind");
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "done"}, {"models", {"m0", "ghost"}}}}});
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "population"}, {"models", {"ghost"}}}}});
  e->prefetcher().idle();
  CHECK(read_tensor(*e, s, "m0", "w") == st.w[0]);
  CHECK(stats(*e, s)["prefetch"]["unknown_models"] == 4);
  e->end_session(s);
}

TEST_CASE("hints: a flood bigger than the budget and DRAM stages within the budget and reads stay exact",
          "[hints][prefetch]") {
  Stored st(12);  // 12 x 6 chunks of 64 KiB
  auto e = make_engine(st.dir.path, [](Config& c) { c.policy.prefetch_budget = 10 * kChunk; });
  Session s;
  std::vector<std::string> all;
  for (int i = 0; i < 12; ++i) all.push_back("m" + std::to_string(i));
  for (int round = 0; round < 3; ++round)
    ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", all}}}});
  e->prefetcher().idle();
  json p = stats(*e, s)["prefetch"];
  CHECK(p["bytes_unread"].get<uint64_t>() <= 10 * kChunk);
  CHECK(p["skipped_for_budget"].get<uint64_t>() > 0);
  for (int i = 11; i >= 0; --i)
    CHECK(read_tensor(*e, s, all[static_cast<size_t>(i)], "w") == st.w[static_cast<size_t>(i)]);
  e->end_session(s);
}

TEST_CASE("hints: with policy.prefetch none a hint stages nothing", "[hints][prefetch]") {
  Stored st(1);
  auto e = make_engine(st.dir.path, [](Config& c) { c.policy.prefetch = "none"; });
  Session s;
  json r = ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"m0"}}}}});
  e->prefetcher().idle();
  CHECK(stats(*e, s)["prefetch"]["chunks_staged"] == 0);
  e->end_session(s);
}

TEST_CASE("prefetch lineage: opening a model stages its parent; a best_ancestor answer stages its tensors",
          "[hints][prefetch]") {
  TempDir dir;
  const auto a = pattern(3 * kChunk, 1), b = pattern(3 * kChunk, 2);
  {
    auto e = make_engine(dir.path);
    Session s;
    commit_inline(*e, s, "parent", "", {{"w", a}, {"v", b}});
    commit_inline(*e, s, "child", "parent", {{"w", pattern(3 * kChunk, 3)}}, {"v"});
    e->end_session(s);
  }
  auto e = make_engine(dir.path, [](Config& c) { c.policy.prefetch = "lineage"; });
  Session s;
  ok(*e, s, {{"op", "open"}, {"id", "child"}});
  e->prefetcher().idle();
  CHECK(stats(*e, s)["prefetch"]["chunks_staged"] == 6);  // the parent's w and v
  const uint64_t misses0 = e->dram().stats().misses;
  CHECK(read_tensor(*e, s, "parent", "w") == a);
  CHECK(e->dram().stats().misses == misses0);
  e->end_session(s);
}

TEST_CASE("hints: a scored population orders DRAM victims by chance, a member named before its commit included",
          "[hints][prefetch]") {
  TempDir dir;
  auto e = make_engine(dir.path, [](Config& c) { c.policy.eviction = "hints"; });
  Session s;
  // Three models of two tensors, four chunks each; the chunks of each, by hash.
  std::map<std::string, std::unordered_set<ChunkHash, ChunkHashHasher>> chunks;
  auto tensors_of = [&](const std::string& id, uint64_t seed) {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> ts;
    for (uint64_t t = 0; t < 2; ++t) {
      ts.emplace_back("t" + std::to_string(t), pattern(4 * kChunk, seed + t));
      for (uint64_t k = 0; k < 4; ++k) chunks[id].insert(hash_bytes(ts.back().second.data() + k * kChunk, kChunk));
    }
    return ts;
  };
  commit_inline(*e, s, "p0", "", tensors_of("p0", 10));
  commit_inline(*e, s, "p1", "", tensors_of("p1", 20));
  // Loads: every tensor of p0 and p1 once (a share of 1/2 for each position).
  for (const char* id : {"p0", "p1"})
    for (const char* t : {"t0", "t1"}) (void)read_tensor(*e, s, id, t);
  // p2 is named with its score before it is stored: listed as unknown, weighed when committed.
  // Tournaments of 2 of 3: p2 wins with 2/3, p1 with 1/3, p0 never.
  json r =
      ok(*e, s,
         {{"op", "hint"},
          {"hint",
           {{"kind", "population"}, {"models", {"p0", "p1", "p2"}}, {"scores", {0.1, 0.5, 0.9}}, {"tournament", 2}}}});
  CHECK(r["unknown"] == json{"p2"});
  commit_inline(*e, s, "p2", "", tensors_of("p2", 30));
  // The DRAM tier gives up p0's chunks first, then p1's, then p2's.
  std::vector<std::string> order;
  while (auto v = e->dram().take_victim()) {
    for (const auto& [id, set] : chunks)
      if (set.count(v->hash)) order.push_back(id);
    e->dram().finish_demotion(v->hash);
  }
  std::vector<std::string> want;
  for (const char* id : {"p0", "p1", "p2"}) want.insert(want.end(), 8, id);
  CHECK(order == want);
  e->end_session(s);
}

}  // namespace cairn
