// Helpers for in-process engine tests: requests go through Engine::handle exactly as the server
// passes them (JSON that went through text, so non-negative integers arrive unsigned), and bytes are
// checked in the arena at the offsets the responses name.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/status.hpp"
#include "daemon/engine.hpp"
#include "unit/temp_dir.hpp"

namespace cairn {
namespace engine_test {

using nlohmann::json;

constexpr uint64_t kChunk = 64 * 1024;  // small chunks so that tests see multi-chunk tensors
constexpr uint64_t kArenaBytes = 64ull << 20;

inline int code(StatusCode c) { return static_cast<int>(c); }
// The DRAM arena allocates in 4 KiB units (so chunks can move to and from NVMe with direct I/O).
inline uint64_t round4k(uint64_t n) { return n == 0 ? 4096 : (n + 4095) / 4096 * 4096; }

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("cairn-test-engine") {}
};

inline std::unique_ptr<Engine> make_engine(const std::string& repo, const std::function<void(Config&)>& tweak = {},
                                           EngineOptions options = {}) {
  Config c;
  c.repository = repo;
  c.chunk_size = kChunk;
  c.tiers.dram.capacity = kArenaBytes;
  if (tweak) tweak(c);
  auto e = Engine::create(c, options);
  INFO((e.ok() ? std::string() : e.status().to_string()));
  REQUIRE(e.ok());
  return std::move(e).value();
}

// Deterministic, incompressible-looking bytes.
inline std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

inline std::vector<uint8_t> concat(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<uint8_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// One request as the server would hand it over. Any status.
inline json call(Engine& e, Session& s, const json& req, std::vector<uint8_t> blob = {}) {
  const json wire = json::parse(req.dump());
  Response r = e.handle(s, wire, blob);
  REQUIRE(r.body.is_object());
  REQUIRE(r.body.contains("status"));
  return r.body;
}

// One request that must succeed.
inline json ok(Engine& e, Session& s, const json& req, std::vector<uint8_t> blob = {}) {
  json r = call(e, s, req, std::move(blob));
  INFO("request " << req.dump() << " -> " << r.dump());
  REQUIRE(r["status"] == 0);
  REQUIRE_FALSE(r.contains("error"));
  return r;
}

// One request that must fail with `expected`, with a message containing `needle`.
inline json fails(Engine& e, Session& s, const json& req, StatusCode expected, const std::string& needle = "",
                  std::vector<uint8_t> blob = {}) {
  json r = call(e, s, req, std::move(blob));
  INFO("request " << req.dump() << " -> " << r.dump());
  REQUIRE(r["status"] == code(expected));
  REQUIRE(r["error"].is_string());
  REQUIRE(r["error"].get<std::string>().find(needle) != std::string::npos);
  return r;
}

// The bytes at the (offset, length) pairs of a lease, in order.
inline std::vector<uint8_t> bytes_at(Engine& e, const json& extents) {
  std::vector<uint8_t> out;
  for (const auto& ex : extents) {
    const uint64_t off = ex.at(0).get<uint64_t>(), len = ex.at(1).get<uint64_t>();
    REQUIRE(off <= e.arena_size());
    REQUIRE(len <= e.arena_size() - off);
    out.insert(out.end(), e.dram().base() + off, e.dram().base() + off + len);
  }
  return out;
}

inline std::vector<uint8_t> bytes_at(Engine& e, uint64_t off, uint64_t len) {
  REQUIRE(off + len <= e.arena_size());
  return {e.dram().base() + off, e.dram().base() + off + len};
}

inline uint64_t used_bytes(Engine& e) { return e.dram().stats().used_bytes; }

// A tensor entry of a commit whose bytes travel inline at blob[off, off+n).
inline json inline_tensor(const std::string& name, uint64_t off, uint64_t n) {
  return json{{"name", name}, {"dtype", "U8"}, {"shape", {n}}, {"inline", {off, n}}};
}

// Commits a model whose tensors all travel inline; returns the response.
inline json commit_inline(Engine& e, Session& s, const std::string& id, const std::string& parent,
                          const std::vector<std::pair<std::string, std::vector<uint8_t>>>& tensors,
                          const std::vector<std::string>& inherited = {}, const std::string& durability = "global") {
  std::vector<uint8_t> blob;
  json list = json::array();
  for (const auto& [name, bytes] : tensors) {
    list.push_back(inline_tensor(name, blob.size(), bytes.size()));
    blob.insert(blob.end(), bytes.begin(), bytes.end());
  }
  for (const auto& name : inherited) list.push_back(json{{"name", name}, {"inherit", true}});
  json req{{"op", "commit"}, {"id", id}, {"tensors", list}, {"durability", durability}};
  if (!parent.empty()) req["parent"] = parent;
  return ok(e, s, req, blob);
}

// Leases tensor `name` of model `id` and returns its bytes; releases the lease.
inline std::vector<uint8_t> read_tensor(Engine& e, Session& s, const std::string& id, const std::string& name,
                                        bool contiguous = false) {
  json r = ok(e, s, {{"op", "lease"}, {"id", id}, {"tensors", {name}}, {"contiguous", contiguous}});
  REQUIRE(r["leases"].size() == 1);
  const json& l = r["leases"][0];
  std::vector<uint8_t> out = bytes_at(e, l["extents"]);
  REQUIRE(out.size() == l["nbytes"].get<uint64_t>());
  ok(e, s, {{"op", "release"}, {"leases", {l["lease"]}}});
  return out;
}

inline json stats(Engine& e, Session& s) { return ok(e, s, {{"op", "stats"}}); }

}  // namespace engine_test
}  // namespace cairn
