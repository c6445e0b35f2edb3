// The engine in-process: requests go through Engine::handle exactly as the server passes them (JSON
// that went through text, so non-negative integers arrive unsigned), and bytes are checked in the
// arena at the offsets the responses name.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/status.hpp"
#include "daemon/engine.hpp"
#include "unit/daemon/engine_util.hpp"
#include "unit/temp_dir.hpp"

namespace cairn {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

using namespace engine_test;

// An engine on a fresh repository, and one session; cleans up in order.
struct Fixture {
  TempDir dir;
  std::string repo = dir.path + "/repo";
  std::unique_ptr<Engine> engine = make_engine(repo);
  Session session;

  ~Fixture() {
    if (engine) engine->end_session(session);
  }
  Engine& e() { return *engine; }
  // Ends the session and the engine, and starts a new engine on the same repository.
  void restart() {
    engine->end_session(session);
    session = Session{};
    engine.reset();
    engine = make_engine(repo);
  }
};

}  // namespace

TEST_CASE("engine: create checks a config built in code before it opens anything", "[engine]") {
  TempDir dir;
  Config c;
  c.repository = dir.path + "/repo";
  c.chunk_size = kChunk;
  c.tiers.dram.capacity = kArenaBytes;
  c.watchdog = "banana";
  auto r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message() ==
        "watchdog: 'banana' is not a duration (a number and ms, s or m: 500ms, 10s, 10m; 0 = off)");
  CHECK_FALSE(fs::exists(c.repository));  // nothing was opened
  c.watchdog = "10m";
  c.repository_refresh = "1h";
  r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().rfind("repository_refresh: '1h' is not a duration", 0) == 0);
  c.repository_refresh = "1s";
  c.compute.start_timeout = "0";
  r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().rfind("compute.start_timeout: '0' is not a positive duration", 0) == 0);
  c.compute.start_timeout = "60s";
  CHECK(Engine::create(c).ok());
}

TEST_CASE("engine: hello, ping, and ops it does not know", "[engine]") {
  Fixture f;
  json h = ok(f.e(), f.session, {{"op", "hello"}});
  REQUIRE(h["arena_size"] == f.e().arena_size());
  REQUIRE(h["arena_size"].get<uint64_t>() >= kArenaBytes);
  REQUIRE(h["chunk_size"] == kChunk);
  REQUIRE(h["pid"] == static_cast<int64_t>(::getpid()));
  REQUIRE(h["version"].is_string());
  const uint64_t sid = h["session"].get<uint64_t>();
  REQUIRE(sid >= 1);
  REQUIRE(ok(f.e(), f.session, {{"op", "hello"}})["session"] == sid);  // one id per connection
  Session other;
  REQUIRE(ok(f.e(), other, {{"op", "hello"}})["session"] != sid);

  ok(f.e(), f.session, {{"op", "ping"}});
  fails(f.e(), f.session, {{"op", "frobnicate"}}, StatusCode::kInvalidArgument, "frobnicate");
  fails(f.e(), f.session, {{"op", "allocate"}}, StatusCode::kInvalidArgument, "'nbytes'");
  fails(f.e(), f.session, {{"op", "allocate"}, {"nbytes", -5}}, StatusCode::kInvalidArgument, "'nbytes'");
  fails(f.e(), f.session, {{"op", "open"}, {"id", ""}}, StatusCode::kInvalidArgument, "model id");

  // Regression: handle() read "op" outside its try block, so a request that is not an object or
  // whose op is not a string threw out of handle() instead of becoming an error response.
  for (const json& bad : {json(5), json::array({"hello"}), json{{"op", 5}}, json::object()}) {
    INFO(bad.dump());
    std::vector<uint8_t> none;
    Response r;
    REQUIRE_NOTHROW(r = f.e().handle(f.session, bad, none));
    REQUIRE(r.body["status"] == code(StatusCode::kInvalidArgument));
    REQUIRE(r.body["error"].get<std::string>().find("'op'") != std::string::npos);
  }
}

TEST_CASE("engine: staging space is allocated in the arena and freed", "[engine]") {
  Fixture f;
  const uint64_t used0 = used_bytes(f.e());
  json a = ok(f.e(), f.session, {{"op", "allocate"}, {"nbytes", 100000}});
  const uint64_t space = a["space"].get<uint64_t>();
  const uint64_t off = a["offset"].get<uint64_t>();
  REQUIRE(off + 100000 <= f.e().arena_size());
  REQUIRE(used_bytes(f.e()) == used0 + round4k(100000));
  std::memset(f.e().dram().base() + off, 0x11, 100000);  // the client writes into it

  ok(f.e(), f.session, {{"op", "free"}, {"space", space}});
  REQUIRE(used_bytes(f.e()) == used0);
  fails(f.e(), f.session, {{"op", "free"}, {"space", space}}, StatusCode::kNotFound, "staging space");

  // Another connection's space is not this one's.
  json b = ok(f.e(), f.session, {{"op", "allocate"}, {"nbytes", 10}});
  Session other;
  fails(f.e(), other, {{"op", "free"}, {"space", b["space"]}}, StatusCode::kNotFound, "in this connection");
  ok(f.e(), f.session, {{"op", "free"}, {"space", b["space"]}});

  fails(f.e(), f.session, {{"op", "allocate"}, {"nbytes", f.e().arena_size() + 1}}, StatusCode::kNoSpace,
        "tiers.dram.capacity");
  REQUIRE(used_bytes(f.e()) == used0);
}

TEST_CASE("engine: named tensors are put inline or from a space, described, leased and deleted", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto a = pattern(1000, 1);
  ok(e, s, {{"op", "put_tensor"}, {"key", "a"}, {"dtype", "U8"}, {"shape", {10, 100}}}, a);
  json info = ok(e, s, {{"op", "tensor_info"}, {"key", "a"}});
  REQUIRE(info["dtype"] == "U8");
  REQUIRE(info["shape"] == json::array({10, 100}));
  REQUIRE(info["nbytes"] == 1000);

  json l = ok(e, s, {{"op", "lease_tensor"}, {"key", "a"}});
  REQUIRE(l["nbytes"] == 1000);
  REQUIRE(l["dtype"] == "U8");
  REQUIRE(l["shape"] == json::array({10, 100}));
  REQUIRE(bytes_at(e, l["offset"].get<uint64_t>(), 1000) == a);
  ok(e, s, {{"op", "release"}, {"leases", {l["lease"]}}});

  fails(e, s, {{"op", "put_tensor"}, {"key", "bad"}, {"dtype", "F32"}, {"shape", {10}}}, StatusCode::kInvalidArgument,
        "40", pattern(39, 2));
  fails(e, s, {{"op", "put_tensor"}, {"key", "bad"}, {"dtype", "Q7"}, {"shape", {1}}}, StatusCode::kInvalidArgument,
        "unknown dtype");
  fails(e, s, {{"op", "put_tensor"}, {"key", "bad"}, {"dtype", "U8"}, {"shape", {-1}}}, StatusCode::kInvalidArgument,
        "shape");

  // Through a staging space: the daemon takes the space over, no copy.
  const auto b = pattern(1000, 3);
  json sp = ok(e, s, {{"op", "allocate"}, {"nbytes", 1000}});
  const uint64_t off = sp["offset"].get<uint64_t>();
  std::memcpy(e.dram().base() + off, b.data(), b.size());
  fails(e, s, {{"op", "put_tensor"}, {"key", "b"}, {"dtype", "F32"}, {"shape", {10}}, {"space", sp["space"]}},
        StatusCode::kInvalidArgument, "staging space holds 1000 bytes");
  fails(e, s, {{"op", "put_tensor"}, {"key", "b"}, {"dtype", "U8"}, {"shape", {1000}}, {"space", 987654}},
        StatusCode::kNotFound, "987654");
  ok(e, s, {{"op", "put_tensor"}, {"key", "b"}, {"dtype", "F32"}, {"shape", {250}}, {"space", sp["space"]}});
  fails(e, s, {{"op", "free"}, {"space", sp["space"]}}, StatusCode::kNotFound);  // consumed
  json lb = ok(e, s, {{"op", "lease_tensor"}, {"key", "b"}});
  REQUIRE(lb["offset"] == off);
  REQUIRE(lb["dtype"] == "F32");
  REQUIRE(bytes_at(e, off, 1000) == b);
  ok(e, s, {{"op", "release"}, {"leases", {lb["lease"]}}});

  // Deleting frees the bytes at once when nobody holds them.
  const uint64_t used = used_bytes(e);
  ok(e, s, {{"op", "delete_tensor"}, {"key", "a"}});
  REQUIRE(used_bytes(e) == used - round4k(1000));
  fails(e, s, {{"op", "tensor_info"}, {"key", "a"}}, StatusCode::kNotFound, "'a'");
  fails(e, s, {{"op", "lease_tensor"}, {"key", "a"}}, StatusCode::kNotFound, "'a'");
  fails(e, s, {{"op", "delete_tensor"}, {"key", "a"}}, StatusCode::kNotFound, "'a'");
  ok(e, s, {{"op", "delete_tensor"}, {"key", "b"}});
}

TEST_CASE("engine: a named tensor replaced or deleted while leased stays readable until release", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto a = pattern(4096, 10), b = pattern(4096, 11);
  ok(e, s, {{"op", "put_tensor"}, {"key", "k"}, {"dtype", "U8"}, {"shape", {4096}}}, a);
  json l1 = ok(e, s, {{"op", "lease_tensor"}, {"key", "k"}});
  const uint64_t off1 = l1["offset"].get<uint64_t>();
  const uint64_t used1 = used_bytes(e);

  ok(e, s, {{"op", "put_tensor"}, {"key", "k"}, {"dtype", "U8"}, {"shape", {4096}}}, b);
  REQUIRE(used_bytes(e) == used1 + 4096);  // the old bytes are kept for the lease
  REQUIRE(bytes_at(e, off1, 4096) == a);
  json l2 = ok(e, s, {{"op", "lease_tensor"}, {"key", "k"}});
  const uint64_t off2 = l2["offset"].get<uint64_t>();
  REQUIRE(off2 != off1);
  REQUIRE(bytes_at(e, off2, 4096) == b);

  // Space the engine hands out meanwhile does not overlap the old bytes.
  json sp = ok(e, s, {{"op", "allocate"}, {"nbytes", 1 << 20}});
  std::memset(e.dram().base() + sp["offset"].get<uint64_t>(), 0xEE, 1 << 20);
  REQUIRE(bytes_at(e, off1, 4096) == a);
  ok(e, s, {{"op", "free"}, {"space", sp["space"]}});

  ok(e, s, {{"op", "release"}, {"leases", {l1["lease"]}}});
  REQUIRE(used_bytes(e) == used1);
  ok(e, s, {{"op", "release"}, {"leases", {l1["lease"]}}});  // twice: harmless
  REQUIRE(used_bytes(e) == used1);

  // Deleted while leased: gone from the key space, bytes kept until the lease ends.
  ok(e, s, {{"op", "delete_tensor"}, {"key", "k"}});
  fails(e, s, {{"op", "tensor_info"}, {"key", "k"}}, StatusCode::kNotFound);
  REQUIRE(used_bytes(e) == used1);
  REQUIRE(bytes_at(e, off2, 4096) == b);
  ok(e, s, {{"op", "release"}, {"leases", {l2["lease"]}}});
  REQUIRE(used_bytes(e) == used1 - 4096);

  // Any request may carry leases to release, saving the client a round trip.
  ok(e, s, {{"op", "put_tensor"}, {"key", "k2"}, {"dtype", "U8"}, {"shape", {4096}}}, a);
  json l3 = ok(e, s, {{"op", "lease_tensor"}, {"key", "k2"}});
  ok(e, s, {{"op", "delete_tensor"}, {"key", "k2"}});
  REQUIRE(used_bytes(e) == used1);
  ok(e, s, {{"op", "ping"}, {"release", {l3["lease"]}}});
  REQUIRE(used_bytes(e) == used1 - 4096);
  fails(e, s, {{"op", "ping"}, {"release", "nonsense"}}, StatusCode::kInvalidArgument, "leases");
}

TEST_CASE("engine: poll_tensor times out, and sees a key another connection puts", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  auto t0 = std::chrono::steady_clock::now();
  json r = ok(e, f.session, {{"op", "poll_tensor"}, {"key", "late"}, {"timeout_ms", 50}});
  REQUIRE(r["found"] == false);
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  REQUIRE(ok(e, f.session, {{"op", "poll_tensor"}, {"key", "late"}})["found"] == false);  // default: no wait

  std::atomic<int> put_status{-1};
  std::thread producer([&e, &put_status] {
    Session s2;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<uint8_t> blob = pattern(16, 20);
    Response resp = e.handle(s2, json::parse(R"({"op":"put_tensor","key":"late","dtype":"U8","shape":[16]})"), blob);
    put_status = resp.body["status"].get<int>();
    e.end_session(s2);
  });
  t0 = std::chrono::steady_clock::now();
  r = ok(e, f.session, {{"op", "poll_tensor"}, {"key", "late"}, {"timeout_ms", 30000}});
  const auto waited = std::chrono::steady_clock::now() - t0;
  producer.join();
  REQUIRE(put_status == 0);
  REQUIRE(r["found"] == true);
  REQUIRE(waited < std::chrono::seconds(20));
  REQUIRE(ok(e, f.session, {{"op", "poll_tensor"}, {"key", "late"}, {"timeout_ms", 0}})["found"] == true);
}

TEST_CASE("engine: a committed model reads back exactly, also from a new engine on the same repository", "[engine]") {
  Fixture f;
  const uint64_t n_w = 3 * kChunk + 123;  // four chunks, the last one short
  const auto w = pattern(n_w, 30);
  const auto bias = pattern(64, 31);
  {
    Engine& e = f.e();
    Session& s = f.session;
    json sp = ok(e, s, {{"op", "allocate"}, {"nbytes", n_w}});
    std::memcpy(e.dram().base() + sp["offset"].get<uint64_t>(), w.data(), n_w);
    json req{{"op", "commit"},
             {"id", "base"},
             {"tensors",
              {{{"name", "w"}, {"dtype", "U8"}, {"shape", {n_w}}, {"space", sp["space"]}},
               {{"name", "bias"}, {"dtype", "F32"}, {"shape", {16}}, {"inline", {0, 64}}}}},
             {"metadata", {{"epoch", 3}}},
             {"architecture", {{"layers", {{{"name", "stem"}, {"type", "Conv2d"}}}}}},
             {"durability", "global"}};
    json c = ok(e, s, req, bias);
    REQUIRE(c["id"] == "base");
    REQUIRE(c["reached"] == "global");
    REQUIRE_FALSE(c.contains("ticket"));
    REQUIRE(e.repository().contains("base"));
    fails(e, s, {{"op", "free"}, {"space", sp["space"]}}, StatusCode::kNotFound);  // taken by the commit

    REQUIRE(read_tensor(e, s, "base", "w") == w);
    REQUIRE(read_tensor(e, s, "base", "bias") == bias);
    json st = stats(e, s);
    REQUIRE(st["tiers"]["dram"]["dirty_bytes"] == 0);  // flushed
    REQUIRE(st["repository"]["physical_bytes"] == n_w + 64);
  }

  f.restart();
  Engine& e = f.e();
  Session& s = f.session;
  REQUIRE(e.dram().stats().chunks == 0);

  json list = ok(e, s, {{"op", "list"}});
  REQUIRE(list["models"].size() == 1);
  REQUIRE(list["models"][0]["id"] == "base");
  REQUIRE(list["models"][0]["durability"] == "global");
  REQUIRE(list["models"][0]["tensors"] == 2);
  REQUIRE(list["models"][0]["bytes"] == n_w + 64);
  REQUIRE(list["models"][0]["parent"].is_null());

  json o = ok(e, s, {{"op", "open"}, {"id", "base"}});
  REQUIRE(o["id"] == "base");
  REQUIRE(o["parent"].is_null());
  REQUIRE(o["metadata"] == json::object({{"epoch", 3}}));
  REQUIRE(o["tensors"].size() == 2);
  REQUIRE(o["tensors"][0]["name"] == "w");
  REQUIRE(o["tensors"][0]["nbytes"] == n_w);
  REQUIRE(o["tensors"][1]["name"] == "bias");
  REQUIRE(o["tensors"][1]["dtype"] == "F32");
  REQUIRE(o["tensors"][1]["shape"] == json::array({16}));

  // Cold: both tensors come from the repository, in one request.
  json l = ok(e, s, {{"op", "lease"}, {"id", "base"}, {"tensors", {"w", "bias"}}, {"contiguous", false}});
  REQUIRE(l["leases"].size() == 2);
  REQUIRE(l["leases"][0]["extents"].size() == 4);
  REQUIRE(l["leases"][0]["nbytes"] == n_w);
  REQUIRE(bytes_at(e, l["leases"][0]["extents"]) == w);
  REQUIRE(bytes_at(e, l["leases"][1]["extents"]) == bias);
  ok(e, s, {{"op", "release"}, {"leases", {l["leases"][0]["lease"], l["leases"][1]["lease"]}}});
  json st = stats(e, s);
  REQUIRE(st["tiers"]["pfs"]["hits"] == 5);  // chunk reads
  REQUIRE(st["tiers"]["pfs"]["bytes_out"] == n_w + 64);
  REQUIRE(st["tiers"]["dram"]["misses"] == 5);

  // Warm and contiguous: one extent, no further repository reads.
  json lc = ok(e, s, {{"op", "lease"}, {"id", "base"}, {"tensors", {"w"}}, {"contiguous", true}});
  REQUIRE(lc["leases"][0]["extents"].size() == 1);
  REQUIRE(bytes_at(e, lc["leases"][0]["extents"]) == w);
  ok(e, s, {{"op", "release"}, {"leases", {lc["leases"][0]["lease"]}}});
  REQUIRE(stats(e, s)["tiers"]["pfs"]["hits"] == 5);

  json show = ok(e, s, {{"op", "show"}, {"id", "base"}});
  REQUIRE(show["durability"] == "global");
  REQUIRE(show["logical_bytes"] == n_w + 64);
  REQUIRE(show["tensors"][0]["chunks"] == 4);
  REQUIRE(show["tensors"][1]["chunks"] == 1);
  REQUIRE(show["children"].empty());
  REQUIRE(show["architecture"]["layers"][0]["name"] == "stem");
  REQUIRE(show["pack"].is_string());
  REQUIRE_FALSE(show["pack"].get<std::string>().empty());

  fails(e, s, {{"op", "lease"}, {"id", "base"}, {"tensors", {"w", "nope"}}}, StatusCode::kNotFound, "'nope'");
  fails(e, s, {{"op", "lease"}, {"id", "nope"}, {"tensors", {"w"}}}, StatusCode::kNotFound, "'nope'");
  fails(e, s, {{"op", "lease"}, {"id", "base"}}, StatusCode::kInvalidArgument, "'tensors'");
  fails(e, s, {{"op", "open"}, {"id", "nope"}}, StatusCode::kNotFound, "'nope'");
  fails(e, s, {{"op", "show"}, {"id", "nope"}}, StatusCode::kNotFound, "'nope'");
}

TEST_CASE("engine: prefetch loads a model into DRAM; later leases read nothing from the repository", "[engine]") {
  Fixture f;
  const auto a = pattern(2 * kChunk + 7, 40), b = pattern(300, 41);
  commit_inline(f.e(), f.session, "m", "", {{"a", a}, {"b", b}});
  f.restart();
  Engine& e = f.e();
  Session& s = f.session;
  json p = ok(e, s, {{"op", "prefetch"}, {"id", "m"}});
  REQUIRE(p["bytes"] == a.size() + b.size());
  REQUIRE(e.dram().stats().chunks == 4);
  REQUIRE(stats(e, s)["tiers"]["pfs"]["hits"] == 4);
  REQUIRE(read_tensor(e, s, "m", "a") == a);
  REQUIRE(read_tensor(e, s, "m", "b") == b);
  REQUIRE(stats(e, s)["tiers"]["pfs"]["hits"] == 4);
  // Prefetch pins nothing: the whole arena can be taken back.
  auto all = e.dram().allocate(e.arena_size());
  REQUIRE(all.ok());
  e.dram().release(*all, e.arena_size());
  fails(e, s, {{"op", "prefetch"}, {"id", "nope"}}, StatusCode::kNotFound, "'nope'");
}

TEST_CASE("engine: concurrent cold readers of one tensor read each chunk from the repository once", "[engine]") {
  Fixture f;
  const auto w = pattern(4 * kChunk, 50);
  commit_inline(f.e(), f.session, "m", "", {{"w", w}});
  f.restart();
  Engine& e = f.e();
  constexpr int kReaders = 4;
  std::atomic<int> good{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&e, &w, &good, i] {
      Session s;
      std::vector<uint8_t> none;
      json req{{"op", "lease"}, {"id", "m"}, {"tensors", {"w"}}, {"contiguous", i % 2 == 0}};
      Response r = e.handle(s, json::parse(req.dump()), none);
      if (r.body["status"] == 0) {
        std::vector<uint8_t> got;
        for (const auto& ex : r.body["leases"][0]["extents"]) {
          const uint64_t off = ex[0].get<uint64_t>(), len = ex[1].get<uint64_t>();
          got.insert(got.end(), e.dram().base() + off, e.dram().base() + off + len);
        }
        if (got == w) ++good;
      }
      e.end_session(s);  // a reader that goes away without releasing
    });
  }
  for (auto& t : readers) t.join();
  REQUIRE(good == kReaders);
  json st = stats(e, f.session);
  REQUIRE(st["tiers"]["pfs"]["hits"] == 4);
  REQUIRE(st["tiers"]["dram"]["misses"] == 4);
  auto all = e.dram().allocate(e.arena_size());  // nothing is left pinned
  REQUIRE(all.ok());
  e.dram().release(*all, e.arena_size());
}

TEST_CASE("engine: a tensor whose chunks are not consecutive is leased as extents or assembled", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto p = pattern(kChunk, 60), q = pattern(kChunk, 61);
  commit_inline(e, s, "pq", "", {{"x", concat(p, q)}});
  const uint64_t physical = stats(e, s)["repository"]["physical_bytes"].get<uint64_t>();
  REQUIRE(physical == 2 * kChunk);
  commit_inline(e, s, "qp", "", {{"y", concat(q, p)}});
  REQUIRE(stats(e, s)["repository"]["physical_bytes"] == physical);  // both chunks deduplicated

  json l = ok(e, s, {{"op", "lease"}, {"id", "qp"}, {"tensors", {"y"}}});
  const json& ex = l["leases"][0]["extents"];
  REQUIRE(ex.size() == 2);
  REQUIRE(ex[1][0].get<uint64_t>() != ex[0][0].get<uint64_t>() + ex[0][1].get<uint64_t>());  // not in order
  REQUIRE(bytes_at(e, ex) == concat(q, p));

  const uint64_t used = used_bytes(e);
  json lc = ok(e, s, {{"op", "lease"}, {"id", "qp"}, {"tensors", {"y"}}, {"contiguous", true}});
  REQUIRE(lc["leases"][0]["extents"].size() == 1);
  REQUIRE(bytes_at(e, lc["leases"][0]["extents"]) == concat(q, p));
  REQUIRE(used_bytes(e) == used + 2 * kChunk);  // an assembled copy
  ok(e, s, {{"op", "release"}, {"leases", {lc["leases"][0]["lease"]}}});
  REQUIRE(used_bytes(e) == used);
  ok(e, s, {{"op", "release"}, {"leases", {l["leases"][0]["lease"]}}});
  REQUIRE(read_tensor(e, s, "pq", "x") == concat(p, q));
}

TEST_CASE("engine: commit at memory durability returns a ticket; wait and drain complete it", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto a = pattern(kChunk + 5, 70);
  json c = ok(e, s,
              {{"op", "commit"},
               {"id", "m1"},
               {"durability", "memory"},
               {"wait", false},
               {"tensors", {inline_tensor("a", 0, a.size())}}},
              a);
  REQUIRE(c["reached"] == "memory");
  const uint64_t ticket = c["ticket"].get<uint64_t>();
  REQUIRE(ticket >= 1);
  // Visible at once, whether or not the flusher has written it yet.
  REQUIRE(read_tensor(e, s, "m1", "a") == a);
  json w = ok(e, s, {{"op", "wait"}, {"ticket", ticket}});
  REQUIRE((w["reached"] == "memory" || w["reached"] == "global"));
  fails(e, s, {{"op", "wait"}, {"ticket", ticket}}, StatusCode::kNotFound, std::to_string(ticket));
  fails(e, s, {{"op", "wait"}, {"ticket", 999999}}, StatusCode::kNotFound, "999999");
  fails(e, s, {{"op", "wait"}}, StatusCode::kInvalidArgument, "'ticket'");

  e.drain();
  json st = stats(e, s);
  REQUIRE(st["pending_models"] == 0);
  REQUIRE(st["dirty_bytes"] == 0);
  REQUIRE(e.repository().contains("m1"));

  // Global without waiting: the ticket reaches global.
  const auto b = pattern(100, 71);
  json g =
      ok(e, s, {{"op", "commit"}, {"id", "g1"}, {"wait", false}, {"tensors", {inline_tensor("b", 0, b.size())}}}, b);
  json gw = ok(e, s, {{"op", "wait"}, {"ticket", g["ticket"]}, {"timeout_ms", 30000}});
  REQUIRE(gw["reached"] == "global");
  REQUIRE(e.repository().contains("g1"));

  // Local, waiting: answered once it is at least local (the repository is the only tier below).
  const auto lbytes = pattern(10, 73);
  json l = ok(e, s, {{"op", "commit"}, {"id", "l1"}, {"durability", "local"}, {"tensors", {inline_tensor("c", 0, 10)}}},
              lbytes);
  REQUIRE(l["reached"] == "global");

  fails(e, s, {{"op", "commit"}, {"id", "t1"}, {"durability", "tape"}, {"tensors", json::array()}},
        StatusCode::kInvalidArgument, "tape");

  // Tickets belong to their connection: one never waited for is forgotten when it ends, and a
  // commit that waited (wait=true) leaves no ticket behind at all.
  const auto q = pattern(64, 74);
  json unwaited =
      ok(e, s, {{"op", "commit"}, {"id", "q1"}, {"wait", false}, {"tensors", {inline_tensor("q", 0, 64)}}}, q);
  json waited = commit_inline(e, s, "q2", "", {{"q", q}}, {}, "memory");
  REQUIRE_FALSE(waited.contains("ticket"));
  e.end_session(s);
  fails(e, s, {{"op", "wait"}, {"ticket", unwaited["ticket"]}}, StatusCode::kNotFound, "ticket");

  // A model committed at memory and never waited for is on disk after the engine ends.
  const auto m = pattern(3000, 72);
  commit_inline(e, s, "m2", "", {{"m", m}}, {}, "memory");
  f.restart();
  REQUIRE(f.e().repository().contains("m2"));
  REQUIRE(read_tensor(f.e(), f.session, "m2", "m") == m);
}

TEST_CASE("engine: a derived model stores only new bytes; inherited tensors read back", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto a = pattern(1000, 80);
  const auto b = pattern(150000, 81);
  json sp = ok(e, s, {{"op", "allocate"}, {"nbytes", b.size()}});
  std::memcpy(e.dram().base() + sp["offset"].get<uint64_t>(), b.data(), b.size());
  ok(e, s,
     {{"op", "commit"},
      {"id", "p"},
      {"tensors",
       {inline_tensor("a", 0, a.size()),
        {{"name", "b"}, {"dtype", "U8"}, {"shape", {b.size()}}, {"space", sp["space"]}}}}},
     a);
  json st0 = stats(e, s);
  const uint64_t physical0 = st0["repository"]["physical_bytes"].get<uint64_t>();
  const uint64_t logical0 = st0["repository"]["logical_bytes"].get<uint64_t>();
  REQUIRE(physical0 == a.size() + b.size());
  REQUIRE(logical0 == a.size() + b.size());

  // Inherits both and adds a copy of `a` under another name: nothing new to store.
  commit_inline(e, s, "c", "p", {{"a_copy", a}}, {"a", "b"});
  json st1 = stats(e, s);
  REQUIRE(st1["repository"]["physical_bytes"] == physical0);
  REQUIRE(st1["repository"]["logical_bytes"] == logical0 + 2 * a.size() + b.size());
  REQUIRE(st1["repository"]["models"] == 2);
  REQUIRE(st1["tiers"]["pfs"]["bytes_in"] == physical0);  // bytes the flusher wrote

  json o = ok(e, s, {{"op", "open"}, {"id", "c"}});
  REQUIRE(o["parent"] == "p");
  REQUIRE(read_tensor(e, s, "c", "b") == b);
  REQUIRE(read_tensor(e, s, "c", "a") == a);
  REQUIRE(read_tensor(e, s, "c", "a_copy") == a);

  // From a cold engine too.
  f.restart();
  REQUIRE(read_tensor(f.e(), f.session, "c", "b") == b);
  REQUIRE(ok(f.e(), f.session, {{"op", "show"}, {"id", "p"}})["children"] == json::array({"c"}));

  // A child of a parent that is still only in memory.
  Engine& e2 = f.e();
  commit_inline(e2, f.session, "p2", "", {{"z", pattern(5000, 82)}}, {}, "memory");
  commit_inline(e2, f.session, "c2", "p2", {}, {"z"}, "memory");
  e2.drain();
  REQUIRE(e2.repository().contains("c2"));
  REQUIRE(read_tensor(e2, f.session, "c2", "z") == pattern(5000, 82));
}

TEST_CASE("engine: commit rejects bad requests and leaves nothing behind", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto a = pattern(100, 90);
  commit_inline(e, s, "m", "", {{"a", a}});

  auto commit = [&](const json& extra, std::vector<uint8_t> blob = {}) {
    json req{{"op", "commit"}, {"id", "n"}, {"tensors", {inline_tensor("a", 0, blob.size())}}};
    for (auto it = extra.begin(); it != extra.end(); ++it) req[it.key()] = it.value();
    return req;
  };
  fails(e, s, commit({{"id", "m"}}, a), StatusCode::kExists, "'m'");
  fails(e, s, commit({{"parent", "ghost"}}, a), StatusCode::kNotFound, "ghost");
  fails(e, s, {{"op", "commit"}, {"id", "n"}, {"tensors", {{{"name", "a"}, {"inherit", true}}}}},
        StatusCode::kInvalidArgument, "no parent");
  fails(e, s, {{"op", "commit"}, {"id", "n"}, {"parent", "m"}, {"tensors", {{{"name", "zz"}, {"inherit", true}}}}},
        StatusCode::kNotFound, "'zz'");
  fails(e, s, {{"op", "commit"}, {"id", "n"}, {"tensors", {inline_tensor("a", 0, 100), inline_tensor("a", 0, 100)}}},
        StatusCode::kInvalidArgument, "twice", a);
  fails(e, s, {{"op", "commit"}, {"id", "n"}, {"tensors", {inline_tensor("a", 50, 100)}}}, StatusCode::kInvalidArgument,
        "inline", a);
  fails(e, s, {{"op", "commit"}, {"id", "n"}}, StatusCode::kInvalidArgument, "'tensors'");
  fails(e, s, commit({{"metadata", json::array()}}, a), StatusCode::kInvalidArgument, "metadata");
  fails(e, s, commit({{"architecture", 7}}, a), StatusCode::kInvalidArgument, "graph");
  fails(e, s, commit({{"architecture", {{"layers", {{{"name", "a"}, {"type", "X"}, {"inputs", {"ghost"}}}}}}}}, a),
        StatusCode::kInvalidArgument, "ghost");
  fails(e, s, {{"op", "commit"}, {"id", "n"}, {"tensors", {{{"name", "a"}, {"dtype", "U8"}, {"shape", {1}}}}}},
        StatusCode::kInvalidArgument, "'space', 'inline' or 'inherit'");

  // A failed commit does not consume the spaces it named.
  json sp = ok(e, s, {{"op", "allocate"}, {"nbytes", 10}});
  fails(e, s,
        {{"op", "commit"},
         {"id", "n"},
         {"tensors",
          {{{"name", "s"}, {"dtype", "U8"}, {"shape", {10}}, {"space", sp["space"]}},
           {{"name", "t"}, {"dtype", "U8"}, {"shape", {10}}, {"space", 424242}}}}},
        StatusCode::kNotFound, "424242");
  fails(e, s,
        {{"op", "commit"},
         {"id", "n"},
         {"tensors", {{{"name", "s"}, {"dtype", "U8"}, {"shape", {11}}, {"space", sp["space"]}}}}},
        StatusCode::kInvalidArgument, "staging space holds 10 bytes");
  // Chunk hashes a client sends with a space: one per chunk, each 32 lowercase hex digits.
  const std::string good(32, 'a');
  auto with_hashes = [&](const json& hashes) {
    return json{
        {"op", "commit"},
        {"id", "n"},
        {"tensors", {{{"name", "s"}, {"dtype", "U8"}, {"shape", {10}}, {"space", sp["space"]}, {"hashes", hashes}}}}};
  };
  fails(e, s, with_hashes(json::array({good, good})), StatusCode::kInvalidArgument, "array of 1 chunk hashes");
  fails(e, s, with_hashes(good), StatusCode::kInvalidArgument, "array of 1 chunk hashes");
  fails(e, s, with_hashes(json::array({std::string(32, 'A')})), StatusCode::kInvalidArgument, "hashes[0]");
  fails(e, s, with_hashes(json::array({7})), StatusCode::kInvalidArgument, "hashes[0]");
  ok(e, s, {{"op", "free"}, {"space", sp["space"]}});

  // Nothing of "n" exists, and the id is still free.
  fails(e, s, {{"op", "open"}, {"id", "n"}}, StatusCode::kNotFound);
  REQUIRE(stats(e, s)["repository"]["models"] == 1);
  commit_inline(e, s, "n", "", {{"a", a}});
  fails(e, s, commit({{"id", "n"}}, a), StatusCode::kExists, "'n'");
}

TEST_CASE("engine: end_session releases the connection's leases and staging space", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  const auto p = pattern(kChunk, 100), q = pattern(kChunk, 101);
  commit_inline(e, s, "pq", "", {{"x", concat(p, q)}});
  commit_inline(e, s, "qp", "", {{"y", concat(q, p)}});
  ok(e, s, {{"op", "put_tensor"}, {"key", "named"}, {"dtype", "U8"}, {"shape", {4096}}}, pattern(4096, 102));
  const uint64_t used0 = used_bytes(e);

  Session s2;
  ok(e, s2, {{"op", "hello"}});
  ok(e, s2, {{"op", "allocate"}, {"nbytes", 1 << 20}});
  ok(e, s2, {{"op", "allocate"}, {"nbytes", 1000}});
  ok(e, s2, {{"op", "lease"}, {"id", "qp"}, {"tensors", {"y"}}, {"contiguous", true}});  // assembled copy
  ok(e, s2, {{"op", "lease"}, {"id", "pq"}, {"tensors", {"x"}}});                        // pinned chunks
  ok(e, s2, {{"op", "lease_tensor"}, {"key", "named"}});
  REQUIRE(used_bytes(e) == used0 + (1 << 20) + round4k(1000) + 2 * kChunk);
  REQUIRE(s2.leases.size() == 3);
  REQUIRE(s2.staging.size() == 2);

  e.end_session(s2);  // the connection closed without releasing anything
  REQUIRE(s2.leases.empty());
  REQUIRE(s2.staging.empty());
  REQUIRE(used_bytes(e) == used0);
  // The named tensor is no longer pinned: deleting it frees its bytes at once.
  ok(e, s, {{"op", "delete_tensor"}, {"key", "named"}});
  REQUIRE(used_bytes(e) == used0 - 4096);
  // And no chunk is pinned: the whole arena can be taken back.
  auto all = e.dram().allocate(e.arena_size());
  REQUIRE(all.ok());
  e.dram().release(*all, e.arena_size());
}

TEST_CASE("engine: lineage queries, list, show and remove", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  commit_inline(e, s, "A", "", {{"w", pattern(100, 110)}});
  commit_inline(e, s, "B", "A", {{"v", pattern(100, 111)}}, {"w"});
  commit_inline(e, s, "C", "B", {}, {"w", "v"});
  commit_inline(e, s, "D", "A", {{"u", pattern(100, 112)}});

  json q = ok(e, s, {{"op", "query"}, {"query", {{"op", "ancestors"}, {"model", "C"}}}});
  REQUIRE(q["model"] == "C");
  REQUIRE(q["ancestors"] == json::array({"B", "A"}));
  q = ok(e, s, {{"op", "query"}, {"query", {{"op", "ancestors"}, {"model", "C"}, {"depth", 1}}}});
  REQUIRE(q["ancestors"] == json::array({"B"}));
  REQUIRE(ok(e, s, {{"op", "query"}, {"query", {{"op", "ancestors"}, {"model", "A"}}}})["ancestors"].empty());

  q = ok(e, s, {{"op", "query"}, {"query", {{"op", "descendants"}, {"model", "A"}}}});
  auto as_set = [](const json& a) {
    std::set<std::string> out;
    for (const auto& v : a) out.insert(v.get<std::string>());
    return out;
  };
  REQUIRE(q["descendants"].size() == 3);
  REQUIRE(as_set(q["descendants"]) == std::set<std::string>{"B", "C", "D"});
  REQUIRE(q["descendants"][2] == "C");  // breadth first
  q = ok(e, s, {{"op", "query"}, {"query", {{"op", "descendants"}, {"model", "A"}, {"depth", 1}}}});
  REQUIRE(as_set(q["descendants"]) == std::set<std::string>{"B", "D"});

  fails(e, s, {{"op", "query"}, {"query", {{"op", "ancestors"}, {"model", "Z"}}}}, StatusCode::kNotFound, "'Z'");
  fails(e, s, {{"op", "query"}, {"query", {{"op", "ancestors"}}}}, StatusCode::kInvalidArgument, "'model'");
  fails(e, s, {{"op", "query"}, {"query", {{"op", "siblings"}, {"model", "A"}}}}, StatusCode::kInvalidArgument,
        "siblings");
  fails(e, s, {{"op", "query"}}, StatusCode::kInvalidArgument, "'query'");

  json list = ok(e, s, {{"op", "list"}});
  REQUIRE(list["models"].size() == 4);
  json show = ok(e, s, {{"op", "show"}, {"id", "B"}});
  REQUIRE(show["parent"] == "A");
  REQUIRE(show["children"] == json::array({"C"}));
  REQUIRE(show["tensors"].size() == 2);

  // rm retires: the model leaves ls and queries but keeps its bytes and lineage until gc.
  REQUIRE(ok(e, s, {{"op", "remove"}, {"id", "C"}})["retired"] == "C");
  ok(e, s, {{"op", "remove"}, {"id", "C"}});  // retiring twice is harmless
  fails(e, s, {{"op", "remove"}, {"id", "Z"}}, StatusCode::kNotFound, "'Z'");
  REQUIRE(read_tensor(e, s, "C", "v") == pattern(100, 111));
  REQUIRE(ok(e, s, {{"op", "list"}})["models"].size() == 3);
  json all = ok(e, s, {{"op", "list"}, {"all", true}});
  REQUIRE(all["models"].size() == 4);
  REQUIRE(ok(e, s, {{"op", "show"}, {"id", "B"}})["children"] == json::array({"C"}));

  // gc deletes the retired leaf.
  json gc = ok(e, s, {{"op", "gc"}});
  REQUIRE(gc["removed"] == json::array({"C"}));
  REQUIRE(gc["collected"].empty());
  fails(e, s, {{"op", "open"}, {"id", "C"}}, StatusCode::kNotFound, "'C'");
  REQUIRE(ok(e, s, {{"op", "show"}, {"id", "B"}})["children"].empty());
  REQUIRE(ok(e, s, {{"op", "list"}, {"all", true}})["models"].size() == 3);

  // A retired model with live descendants is collected: lineage stays, data goes.
  ok(e, s, {{"op", "remove"}, {"id", "A"}});
  gc = ok(e, s, {{"op", "gc"}});
  REQUIRE(gc["removed"].empty());
  REQUIRE(gc["collected"] == json::array({"A"}));
  fails(e, s, {{"op", "open"}, {"id", "A"}}, StatusCode::kNotFound, "collected");
  json shown = ok(e, s, {{"op", "show"}, {"id", "A"}});
  REQUIRE(shown["collected"] == true);
  REQUIRE(shown["tensors"].empty());
  REQUIRE(ok(e, s, {{"op", "query"}, {"query", {{"op", "ancestors"}, {"model", "B"}}}})["ancestors"] ==
          json::array({"A"}));
  REQUIRE(read_tensor(e, s, "B", "w") == pattern(100, 110));  // B inherited w: it stays
  REQUIRE(read_tensor(e, s, "D", "u") == pattern(100, 112));
  REQUIRE(ok(e, s, {{"op", "fsck"}})["ok"] == true);
}

TEST_CASE("engine: stats report the tiers and the repository", "[engine]") {
  Fixture f;
  Engine& e = f.e();
  Session& s = f.session;
  json st = stats(e, s);
  for (const char* tier : {"hbm", "dram", "nvme", "pfs"}) {
    INFO(tier);
    REQUIRE(st["tiers"].contains(tier));
    for (const char* k : {"enabled", "capacity_bytes", "used_bytes", "hits", "misses", "bytes_in", "bytes_out",
                          "chunks", "dirty_bytes"})
      REQUIRE(st["tiers"][tier].contains(k));
  }
  REQUIRE(st["tiers"]["dram"]["enabled"] == true);
  REQUIRE(st["tiers"]["dram"]["capacity_bytes"] == e.arena_size());
  REQUIRE(st["tiers"]["dram"]["used_bytes"] == 0);
  REQUIRE(st["tiers"]["hbm"]["enabled"] == false);
  REQUIRE(st["tiers"]["pfs"]["enabled"] == true);
  REQUIRE(st["tiers"]["pfs"]["path"] == e.repository().dir());
  REQUIRE(st["tiers"]["nvme"].contains("path"));
  REQUIRE(st["repository"]["path"] == e.repository().dir());
  REQUIRE(st["repository"]["models"] == 0);
  REQUIRE(st["repository"]["logical_bytes"] == 0);
  REQUIRE(st["repository"]["physical_bytes"] == 0);
  REQUIRE(st["pending_models"] == 0);
  REQUIRE(st["dirty_bytes"] == 0);
  REQUIRE(st["chunk_size"] == kChunk);

  const auto a = pattern(2 * kChunk, 120);
  commit_inline(e, s, "m", "", {{"a", a}, {"a2", a}});
  st = stats(e, s);
  REQUIRE(st["repository"]["models"] == 1);
  REQUIRE(st["repository"]["packs"] == 1);
  REQUIRE(st["repository"]["chunks"] == 2);
  REQUIRE(st["repository"]["logical_bytes"] == 2 * a.size());
  REQUIRE(st["repository"]["physical_bytes"] == a.size());
  REQUIRE(st["tiers"]["pfs"]["used_bytes"] == a.size());
  REQUIRE(st["tiers"]["pfs"]["chunks"] == 2);
  REQUIRE(st["tiers"]["pfs"]["bytes_in"] == a.size());
  REQUIRE(st["tiers"]["dram"]["chunks"] == 2);
  REQUIRE(st["tiers"]["dram"]["bytes_in"] == a.size());
  REQUIRE(st["tiers"]["dram"]["used_bytes"] == a.size());  // the duplicate tensor's bytes went back
}

TEST_CASE("engine: rm racing gc never answers 'not found' for a model it retired", "[engine]") {
  // rm and gc at once from two connections: every rm succeeds, every gc succeeds, and in the end
  // nothing is left. (The torture harness found an rm answering "not in the catalog": a gc had
  // decided between its retire in the repository and in the catalog. rm now holds the gc lock
  // across both. That window is microseconds wide and this test seldom lands in it; it checks the
  // behaviour around it.)
  TempDir tmp;
  auto e = make_engine(tmp.repo());
  Session s;
  const int n = 120;
  for (int i = 0; i < n; ++i)
    commit_inline(*e, s, "r" + std::to_string(i), "", {{"v", pattern(64, static_cast<uint64_t>(i))}}, {}, "memory");
  ok(*e, s, {{"op", "flush"}});
  std::atomic<bool> done{false};
  std::vector<json> failures;
  std::thread remover([&] {
    Session rs;
    for (int i = 0; i < n; ++i) {
      std::vector<uint8_t> none;
      Response r = e->handle(rs, json{{"op", "remove"}, {"id", "r" + std::to_string(i)}}, none);
      if (!r.body.is_object() || r.body.value("status", -1) != 0) failures.push_back(r.body);
    }
    done = true;
  });
  int gcs = 0;
  Session gs;
  while (!done) {
    std::vector<uint8_t> none;
    Response r = e->handle(gs, json{{"op", "gc"}}, none);
    REQUIRE(r.body.value("status", -1) == 0);
    ++gcs;
  }
  remover.join();
  INFO((failures.empty() ? std::string() : failures.front().dump()));
  CHECK(failures.empty());
  CHECK(gcs > 0);
  ok(*e, s, {{"op", "gc"}});
  CHECK(ok(*e, s, {{"op", "list"}, {"all", true}})["models"].empty());
}

}  // namespace cairn
