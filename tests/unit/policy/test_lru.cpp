#include <catch2/catch.hpp>

#include "policy/eviction.hpp"

using cairn::ChunkHash;

TEST_CASE("LRU evicts the least recently used evictable chunk", "[policy]") {
  cairn::LruPolicy lru;
  ChunkHash a{0, 1}, b{0, 2}, c{0, 3};
  lru.track(a, 10);
  lru.track(b, 10);
  lru.track(c, 10);
  auto any = [](const ChunkHash&) { return true; };
  REQUIRE(lru.pick_victim(any) == a);
  lru.touch(a);
  REQUIRE(lru.pick_victim(any) == b);
  // A pinned chunk is skipped, not lost.
  REQUIRE(lru.pick_victim([&](const ChunkHash& k) { return !(k == b); }) == c);
  lru.remove(b);
  REQUIRE(lru.pick_victim(any) == c);
  lru.remove(c);
  lru.remove(a);
  REQUIRE_FALSE(lru.pick_victim(any).has_value());
  REQUIRE(lru.size() == 0);
}

TEST_CASE("make_eviction_policy rejects unknown names", "[policy]") {
  auto p = cairn::make_eviction_policy("fifo");
  REQUIRE_FALSE(p.is_ok());
  REQUIRE(p.status().message().find("policy.eviction") != std::string::npos);
  REQUIRE(cairn::make_eviction_policy("lru").is_ok());
}
