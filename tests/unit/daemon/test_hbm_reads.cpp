// The GPU tier in an in-process engine (emulated device backend): lease_device, its leases and the
// session's end, prefetch and will_load hints with tier hbm, hello and stats, and the errors without
// an HBM tier (docs/gpu.md, docs/protocol.md).
#include <catch2/catch.hpp>
#include <cstring>

#include "daemon/hints.hpp"
#include "tiers/hbm/device.hpp"
#include "unit/daemon/engine_util.hpp"

namespace cairn {
namespace {

using namespace engine_test;

std::unique_ptr<Engine> make_hbm_engine(const std::string& repo) {
  return make_engine(repo, [](Config& c) {
    c.tiers.hbm.capacity = 1 << 20;
    c.tiers.hbm.backend = "emulated";
    c.tiers.hbm.devices = {0};
  });
}

// The bytes a device lease names, read through the emulated device's mapper as a client would.
std::vector<uint8_t> device_bytes(const json& lease) {
  auto m = hbm::open_mapper("emulated");
  REQUIRE(m.ok());
  const uint64_t slab = lease["slab_bytes"].get<uint64_t>(), off = lease["offset"].get<uint64_t>(),
                 n = lease["nbytes"].get<uint64_t>();
  auto p = (*m)->open(lease["handle"].get<std::string>(), slab);
  REQUIRE(p.ok());
  std::vector<uint8_t> out(n);
  REQUIRE((*m)->copy(0, out.data(), static_cast<uint8_t*>(*p) + off, n, hbm::CopyKind::kDeviceToHost).ok());
  (*m)->close(*p, slab);
  return out;
}

json hbm_stats(Engine& e, Session& s) { return ok(e, s, {{"op", "stats"}})["tiers"]["hbm"]; }

}  // namespace

TEST_CASE("hbm reads: lease_device promotes, shares, pins until release or the session's end", "[hbm]") {
  TempDir dir;
  auto e = make_hbm_engine(dir.path + "/repo");
  Session a, b;
  json hello = ok(*e, a, {{"op", "hello"}});
  REQUIRE(hello.contains("hbm"));
  CHECK(hello["hbm"]["backend"] == "emulated");
  CHECK(hello["hbm"]["devices"] == json::array({0}));
  const auto w = pattern(200 * 1024, 1), bias = pattern(100, 2);  // w spans 4 chunks of 64 KiB
  commit_inline(*e, a, "m", "", {{"w", w}, {"b", bias}}, {}, "memory");

  json r = ok(*e, a, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"w", "b"}}});
  REQUIRE(r["leases"].size() == 2);
  CHECK(r["backend"] == "emulated");
  CHECK(r["leases"][0]["hit"] == false);
  CHECK(device_bytes(r["leases"][0]) == w);
  CHECK(device_bytes(r["leases"][1]) == bias);
  json h = hbm_stats(*e, a);
  CHECK(h["devices"][0]["pinned_bytes"] == w.size() + bias.size());
  CHECK(h["misses"] == 2);

  // Another connection: the same copies, hits.
  json r2 = ok(*e, b, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"w"}}, {"device", 0}});
  CHECK(r2["leases"][0]["hit"] == true);
  CHECK(r2["leases"][0]["handle"] == r["leases"][0]["handle"]);
  CHECK(r2["leases"][0]["offset"] == r["leases"][0]["offset"]);

  ok(*e, a, {{"op", "release"}, {"leases", {r["leases"][0]["lease"], r["leases"][1]["lease"]}}});
  CHECK(hbm_stats(*e, a)["devices"][0]["pinned_bytes"] == w.size());  // b's lease still holds w
  e->end_session(b);                                                  // a client that goes away
  CHECK(hbm_stats(*e, a)["devices"][0]["pinned_bytes"] == 0);
  CHECK(hbm_stats(*e, a)["chunks"] == 2);  // still resident, as a cache

  fails(*e, a, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"nope"}}}, StatusCode::kNotFound, "nope");
  fails(*e, a, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"w"}}, {"device", 3}}, StatusCode::kInvalidArgument,
        "tiers.hbm.devices");
  fails(*e, a, {{"op", "lease_device"}, {"id", "m"}}, StatusCode::kInvalidArgument, "tensors");
}

TEST_CASE("hbm reads: a lease_device that does not fit leaves nothing pinned", "[hbm]") {
  TempDir dir;
  auto e = make_hbm_engine(dir.path + "/repo");
  Session s;
  commit_inline(*e, s, "m", "",
                {{"a", pattern(400 * 1024, 3)}, {"b", pattern(400 * 1024, 4)}, {"c", pattern(400 * 1024, 5)}}, {},
                "memory");
  fails(*e, s, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"a", "b", "c"}}}, StatusCode::kNoSpace,
        "held by device leases");
  CHECK(hbm_stats(*e, s)["devices"][0]["pinned_bytes"] == 0);  // all or nothing
  json r = ok(*e, s, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"a", "b"}}});
  CHECK(r["leases"].size() == 2);
}

TEST_CASE("hbm reads: prefetch and will_load hints with tier hbm promote without pinning", "[hbm]") {
  TempDir dir;
  auto e = make_hbm_engine(dir.path + "/repo");
  Session s;
  commit_inline(*e, s, "p", "", {{"x", pattern(150 * 1024, 6)}}, {}, "memory");
  commit_inline(*e, s, "q", "", {{"y", pattern(150 * 1024, 7)}, {"z", pattern(10, 8)}}, {}, "memory");

  json pf = ok(*e, s, {{"op", "prefetch"}, {"id", "p"}, {"tier", "hbm"}});
  CHECK(pf["tier"] == "hbm");
  CHECK(pf["bytes"] == 150 * 1024);
  fails(*e, s, {{"op", "prefetch"}, {"id", "p"}, {"tier", "nvme"}}, StatusCode::kInvalidArgument, "dram or hbm");

  ok(*e, s,
     {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"q"}}, {"tensors", {"y"}}, {"tier", "hbm"}}}});
  e->prefetcher().idle();
  json h = hbm_stats(*e, s);
  CHECK(h["misses"] == 2);  // x and y; not z
  CHECK(h["devices"][0]["pinned_bytes"] == 0);
  CHECK(ok(*e, s, {{"op", "stats"}})["prefetch"]["tensors_to_hbm"] == 1);
  json r = ok(*e, s, {{"op", "lease_device"}, {"id", "q"}, {"tensors", {"y", "z"}}});
  CHECK(r["leases"][0]["hit"] == true);
  CHECK(r["leases"][1]["hit"] == false);

  CHECK_FALSE(parse_hint(json{{"kind", "will_load"}, {"models", {"q"}}, {"tier", "gpu"}}).ok());
  CHECK_FALSE(parse_hint(json{{"kind", "done"}, {"models", {"q"}}, {"tier", "hbm"}}).ok());
  CHECK(parse_hint(json{{"kind", "will_load"}, {"models", {"q"}}, {"tier", "hbm"}})->hbm);
}

TEST_CASE("hbm reads: without an HBM tier, device requests say why and hints stay advice", "[hbm]") {
  TempDir dir;
  auto e = make_engine(dir.path + "/repo");
  Session s;
  CHECK_FALSE(ok(*e, s, {{"op", "hello"}}).contains("hbm"));
  commit_inline(*e, s, "m", "", {{"w", pattern(1000, 9)}}, {}, "memory");
  fails(*e, s, {{"op", "lease_device"}, {"id", "m"}, {"tensors", {"w"}}}, StatusCode::kUnavailable,
        "no HBM tier (tiers.hbm.capacity is 0)");
  fails(*e, s, {{"op", "prefetch"}, {"id", "m"}, {"tier", "hbm"}}, StatusCode::kUnavailable, "no HBM tier");
  ok(*e, s, {{"op", "hint"}, {"hint", {{"kind", "will_load"}, {"models", {"m"}}, {"tier", "hbm"}}}});
  e->prefetcher().idle();
  json st = ok(*e, s, {{"op", "stats"}});
  CHECK(st["prefetch"]["hbm_skipped"] == 1);
  CHECK(st["tiers"]["hbm"]["enabled"] == false);
  CHECK(st["tiers"]["hbm"]["why"].get<std::string>().find("tiers.hbm.capacity is 0") != std::string::npos);
}

}  // namespace cairn
