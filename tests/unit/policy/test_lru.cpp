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
  REQUIRE_FALSE(p.ok());
  REQUIRE(p.status().code() == cairn::StatusCode::kInvalidArgument);
  REQUIRE(p.status().message() == "policy.eviction: 'fifo' is not one of lru, lineage, hints");
  auto lru = cairn::make_eviction_policy("lru");
  REQUIRE(lru.ok());
  REQUIRE(std::string((*lru)->name()) == "lru");
  auto lineage = cairn::make_eviction_policy("lineage");
  REQUIRE(lineage.ok());
  REQUIRE(std::string((*lineage)->name()) == "lineage");
}

TEST_CASE("LRU ignores references, refetch costs and unknown keys", "[policy]") {
  cairn::LruPolicy lru;
  ChunkHash a{0, 1}, b{0, 2};
  lru.track(a, 10);
  lru.track(b, 10);
  lru.set_references(a, 100);
  lru.set_refetch_cost(a, 10.0);
  lru.touch(ChunkHash{0, 9});
  lru.remove(ChunkHash{0, 9});
  REQUIRE(lru.size() == 2);
  REQUIRE(lru.pick_victim([](const ChunkHash&) { return true; }) == a);
}
