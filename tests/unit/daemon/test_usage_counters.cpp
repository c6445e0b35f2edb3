// The usage counters behind `stats` "usage" and the job summary (daemon/usage_counters.hpp).
#include <catch2/catch.hpp>

#include "daemon/usage_counters.hpp"
#include "unit/daemon/engine_util.hpp"

namespace cairn {
namespace {

using namespace engine_test;

TEST_CASE("usage counters: each record lands in its own counter; unknown sources count as other", "[usage]") {
  UsageCounters u;
  json zero = u.to_json();
  CHECK(zero["requests"] == 0);
  CHECK(zero["request_wait_ns"] == 0);
  CHECK(zero["committed_bytes"] == json{{"stored", 0}, {"deduplicated", 0}, {"inherited", 0}});
  u.request_served(std::chrono::milliseconds(3));
  u.request_served(std::chrono::nanoseconds(-5));  // a clock that went back adds nothing
  u.model_committed(100, 20, 3);
  u.model_committed(1, 2, 0);
  u.model_opened();
  u.chunk_leased("dram", 10);
  u.chunk_leased("nvme", 11);
  u.chunk_leased("peer", 12);
  u.chunk_leased("repository", 13);
  u.chunk_leased("hbm", 14);
  u.chunk_leased("dram", 1);
  json j = u.to_json();
  CHECK(j["requests"] == 2);
  CHECK(j["request_wait_ns"] == 3000000);
  CHECK(j["models_committed"] == 2);
  CHECK(j["models_opened"] == 1);
  CHECK(j["committed_bytes"] == json{{"stored", 101}, {"deduplicated", 22}, {"inherited", 3}});
  CHECK(j["leased_bytes"] == json{{"dram", 11}, {"nvme", 11}, {"peer", 12}, {"repository", 13}, {"other", 14}});
}

TEST_CASE("usage counters: stats count commits, deduplicated and inherited bytes, opens, leases by tier, waits",
          "[usage][engine]") {
  TempDir dir;
  const auto a = pattern(3 * kChunk, 1), b = pattern(kChunk + 100, 2), c = pattern(kChunk, 3);
  {
    auto e = make_engine(dir.path + "/repo");
    Session s;
    commit_inline(*e, s, "base", "", {{"a", a}, {"b", b}});
    // "a2" repeats a's bytes (deduplicated), "c" is new, "b" is inherited from the parent.
    commit_inline(*e, s, "child", "base", {{"a2", a}, {"c", c}}, {"b"});
    // A commit that fails counts as a request, not as a model.
    fails(*e, s, {{"op", "commit"}, {"id", "bad"}, {"tensors", "not a list"}}, StatusCode::kInvalidArgument);
    ok(*e, s, {{"op", "open"}, {"id", "child"}});
    CHECK(read_tensor(*e, s, "child", "a2") == a);  // resident since the commit: served from DRAM
    json u = stats(*e, s)["usage"];
    INFO(u.dump());
    CHECK(u["models_committed"] == 2);
    CHECK(u["models_opened"] == 1);
    CHECK(u["committed_bytes"]["stored"] == a.size() + b.size() + c.size());
    CHECK(u["committed_bytes"]["deduplicated"] == a.size());
    CHECK(u["committed_bytes"]["inherited"] == b.size());
    CHECK(u["leased_bytes"]["dram"] == a.size());
    CHECK(u["leased_bytes"]["repository"] == 0);
    // commit, commit, the failed commit, open, lease, release (stats counts once it is answered).
    CHECK(u["requests"] == 6);
    CHECK(u["request_wait_ns"].get<uint64_t>() > 0);
    CHECK(u["started_unix_ns"].get<int64_t>() > 0);
  }
  // A daemon that starts cold reads from the repository.
  auto e = make_engine(dir.path + "/repo");
  Session s;
  CHECK(read_tensor(*e, s, "child", "c") == c);
  CHECK(read_tensor(*e, s, "child", "c") == c);
  json u = stats(*e, s)["usage"];
  INFO(u.dump());
  CHECK(u["models_committed"] == 0);
  CHECK(u["leased_bytes"]["repository"] == c.size());
  CHECK(u["leased_bytes"]["dram"] == c.size());
}

}  // namespace
}  // namespace cairn
