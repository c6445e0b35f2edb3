#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "policy/placement.hpp"

using cairn::ChunkHash;
using cairn::home_of;

namespace {

std::vector<ChunkHash> random_chunks(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ChunkHash> out(n);
  for (auto& c : out) c = ChunkHash{rng(), rng()};
  return out;
}

std::vector<std::string> members(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back("member-" + std::to_string(i) + "-a1b2c3");
  return out;
}

}  // namespace

TEST_CASE("home_of is deterministic and independent of the members' order", "[placement]") {
  auto ms = members(8);
  auto shuffled = ms;
  std::reverse(shuffled.begin(), shuffled.end());
  for (const auto& c : random_chunks(500, 1)) {
    std::string h = home_of(c, ms);
    REQUIRE(h == home_of(c, ms));
    REQUIRE(h == home_of(c, shuffled));
    REQUIRE(std::find(ms.begin(), ms.end(), h) != ms.end());
    REQUIRE(cairn::placement_weight(c, h) == cairn::placement_weight(c, h));
  }
  // Pinned values: the weight must be the same on every machine and in every build (a change here
  // splits a mixed-version group's directory).
  ChunkHash c{0x0123456789abcdefull, 0xfedcba9876543210ull};
  REQUIRE(cairn::placement_weight(c, "a") == 0x8056155086f6b0aeull);
  REQUIRE(cairn::placement_weight(c, "member-0") == 0x3b3217fa5074574eull);
  REQUIRE(cairn::placement_weight(ChunkHash{}, "") == 0xc32e7ee0a420febdull);
  REQUIRE(home_of(c, {"a", "b", "c", "d"}) == "d");
  REQUIRE(cairn::placement_weight(c, "a") != cairn::placement_weight(c, "b"));
  REQUIRE(cairn::placement_weight(c, "a") != cairn::placement_weight(ChunkHash{c.lo, c.hi}, "a"));
}

TEST_CASE("home_of with one member is that member; with none it is empty", "[placement]") {
  for (const auto& c : random_chunks(100, 2)) {
    REQUIRE(home_of(c, {"only"}) == "only");
    REQUIRE(home_of(c, {}).empty());
  }
}

TEST_CASE("home_of spreads chunks evenly over the members", "[placement]") {
  auto ms = members(8);
  std::map<std::string, int> count;
  const int n = 10000;
  for (const auto& c : random_chunks(n, 3)) ++count[home_of(c, ms)];
  REQUIRE(count.size() == 8);
  for (const auto& [m, k] : count) {
    INFO(m << " got " << k);
    REQUIRE(k >= n * (0.125 - 0.02));
    REQUIRE(k <= n * (0.125 + 0.02));
  }
}

TEST_CASE("removing a member moves only its chunks", "[placement]") {
  auto ms = members(8);
  auto fewer = ms;
  const std::string gone = fewer[3];
  fewer.erase(fewer.begin() + 3);
  int moved = 0;
  for (const auto& c : random_chunks(10000, 4)) {
    std::string before = home_of(c, ms), after = home_of(c, fewer);
    REQUIRE(after != gone);
    if (before == gone) {
      ++moved;
    } else {
      REQUIRE(after == before);
    }
  }
  REQUIRE(moved > 0);
}

TEST_CASE("adding a member takes about 1/N, only to itself", "[placement]") {
  auto ms = members(8);
  auto more = ms;
  more.push_back("newcomer-ff00");
  const int n = 10000;
  int moved = 0;
  for (const auto& c : random_chunks(n, 5)) {
    std::string before = home_of(c, ms), after = home_of(c, more);
    if (after != before) {
      REQUIRE(after == "newcomer-ff00");
      ++moved;
    }
  }
  REQUIRE(moved >= n * (1.0 / 9 - 0.02));
  REQUIRE(moved <= n * (1.0 / 9 + 0.02));
}
