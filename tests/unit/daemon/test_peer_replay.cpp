// The peer messages' anti-replay window (daemon/peers/replay_window.hpp).
#include <catch2/catch.hpp>
#include <random>
#include <set>
#include <string>

#include "daemon/peers/replay_window.hpp"

using cairn::ReplayGuard;
using cairn::ReplayWindow;
using V = ReplayWindow::Verdict;

namespace {
constexpr uint64_t kBits = ReplayWindow::kBits;
}  // namespace

TEST_CASE("replay window: each seq is accepted once, in order", "[peers][replay]") {
  ReplayWindow w;
  for (uint64_t s = 1; s <= 3000; ++s) REQUIRE(w.accept(s) == V::kNew);
  REQUIRE(w.highest() == 3000);
  REQUIRE(w.accept(3000) == V::kReplayed);
  REQUIRE(w.accept(2999) == V::kReplayed);
  REQUIRE(w.accept(3000 - kBits + 1) == V::kReplayed);
  REQUIRE(w.accept(3000 - kBits) == V::kTooOld);
  REQUIRE(w.accept(1) == V::kTooOld);
  REQUIRE(w.accept(0) == V::kTooOld);
}

TEST_CASE("replay window: out of order within the window is accepted once", "[peers][replay]") {
  ReplayWindow w;
  REQUIRE(w.accept(0) == V::kTooOld);  // never sent
  REQUIRE(w.accept(10) == V::kNew);
  REQUIRE(w.accept(3) == V::kNew);
  REQUIRE(w.accept(3) == V::kReplayed);
  REQUIRE(w.accept(1) == V::kNew);
  REQUIRE(w.check(2) == V::kNew);
  REQUIRE(w.check(2) == V::kNew);  // check does not mark
  REQUIRE(w.accept(2) == V::kNew);
  REQUIRE(w.accept(10) == V::kReplayed);
  // A frame overtaken by the whole window: the highest moves past it.
  REQUIRE(w.accept(10 + kBits) == V::kNew);
  REQUIRE(w.accept(11) == V::kNew);  // the oldest the window still holds
  REQUIRE(w.accept(10) == V::kTooOld);
  REQUIRE(w.accept(9) == V::kTooOld);
}

TEST_CASE("replay window: a jump past the window forgets what it held", "[peers][replay]") {
  ReplayWindow w;
  for (uint64_t s = 1; s <= 100; ++s) REQUIRE(w.accept(s) == V::kNew);
  const uint64_t far = 100 + 5 * kBits + 7;
  REQUIRE(w.accept(far) == V::kNew);
  // The seqs just below the new highest were never seen (their bits, set for old seqs at the same
  // positions, are cleared).
  for (uint64_t s = far - kBits + 1; s < far; ++s) REQUIRE(w.check(s) == V::kNew);
  REQUIRE(w.accept(far - 1) == V::kNew);
  REQUIRE(w.accept(far - 1) == V::kReplayed);
  // A slide of less than the window keeps what is still in it and clears what it passes.
  REQUIRE(w.accept(far + 64 + 3) == V::kNew);
  REQUIRE(w.accept(far - 1) == V::kReplayed);
  REQUIRE(w.accept(far) == V::kReplayed);
  for (uint64_t s = far + 1; s < far + 64 + 3; ++s) REQUIRE(w.check(s) == V::kNew);
}

TEST_CASE("replay window: agrees with a model on random reordered and replayed seqs", "[peers][replay]") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    ReplayWindow w;
    std::set<uint64_t> seen;
    uint64_t highest = 0, next = 1;
    size_t replays = 0, too_old = 0, fresh = 0;
    for (int i = 0; i < 200000; ++i) {
      uint64_t s;
      switch (rng() % 4) {
        case 0:
          s = next++;
          break;  // the next one
        case 1:
          next += rng() % 40;
          s = next++;
          break;  // a gap (sent to others, lost)
        case 2:
          s = highest > 2 * kBits ? highest - rng() % (2 * kBits) : 1 + rng() % (highest + 1);
          break;  // late or replay
        default:
          s = highest + 1 + rng() % 3;
          next = std::max(next, s + 1);
          break;
      }
      V want;
      if (s == 0 || (s <= highest && highest - s >= kBits))
        want = V::kTooOld;
      else if (seen.count(s))
        want = V::kReplayed;
      else
        want = V::kNew;
      INFO("seed " << seed << " op " << i << " seq " << s << " highest " << highest);
      REQUIRE(w.accept(s) == want);
      if (want == V::kNew) {
        seen.insert(s);
        highest = std::max(highest, s);
        ++fresh;
      }
      replays += want == V::kReplayed;
      too_old += want == V::kTooOld;
      if (seen.size() > 4 * kBits) seen.erase(seen.begin(), seen.lower_bound(highest - 2 * kBits));
    }
    // The walk exercised every verdict.
    REQUIRE(fresh > 1000);
    REQUIRE(replays > 1000);
    REQUIRE(too_old > 1000);
    REQUIRE(w.highest() == highest);
  }
}

TEST_CASE("replay guard: one window per sender, bounded", "[peers][replay]") {
  ReplayGuard g(3);
  REQUIRE(g.accept("a", 1) == V::kNew);
  REQUIRE(g.accept("b", 1) == V::kNew);  // another sender's seq 1 is its own
  REQUIRE(g.accept("a", 1) == V::kReplayed);
  REQUIRE(g.accept("a", 2) == V::kNew);
  REQUIRE(g.accept("c", 0) == V::kTooOld);  // refused without taking a window
  REQUIRE(g.senders() == 2);
  REQUIRE(g.accept("c", 5) == V::kNew);
  REQUIRE(g.accept("b", 2) == V::kNew);  // b used after a and c
  // Full: a new sender takes the window of the one heard from least recently (a).
  REQUIRE(g.accept("d", 1) == V::kNew);
  REQUIRE(g.senders() == 3);
  REQUIRE(g.accept("b", 1) == V::kReplayed);
  REQUIRE(g.accept("c", 5) == V::kReplayed);
  REQUIRE(g.accept("d", 1) == V::kReplayed);
  // a's window is gone: its old frames would be accepted once more (the documented limit).
  REQUIRE(g.accept("a", 1) == V::kNew);
}
