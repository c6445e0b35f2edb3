#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "daemon/peers/directory.hpp"
#include "policy/placement.hpp"

using cairn::ChunkDirectory;
using cairn::ChunkHash;
using Verdict = ChunkDirectory::Verdict;
using namespace std::chrono_literals;

namespace {

const ChunkDirectory::Clock::time_point t0{};
const ChunkHash kChunk{0x1111, 0x2222};
const ChunkHash kOther{0x3333, 0x4444};

const ChunkDirectory::Answer* answer_for(const std::vector<ChunkDirectory::Answer>& as, const std::string& who) {
  for (const auto& a : as)
    if (a.requester == who) return &a;
  return nullptr;
}

}  // namespace

TEST_CASE("first lookup loads, the next ones wait, the loader's add_holder sends them to it", "[peers]") {
  ChunkDirectory d(1000ms);
  auto a = d.lookup(kChunk, "A", 1, t0);
  REQUIRE(a.verdict == Verdict::kLoad);
  REQUIRE(a.requester == "A");
  REQUIRE(a.request == 1);
  REQUIRE(a.chunk == kChunk);
  REQUIRE(d.lookup(kChunk, "B", 2, t0).verdict == Verdict::kWait);
  REQUIRE(d.lookup(kChunk, "C", 3, t0).verdict == Verdict::kWait);
  REQUIRE(d.entries() == 1);
  REQUIRE(d.holders(kChunk).empty());

  auto out = d.add_holder(kChunk, "A", t0 + 10ms);
  REQUIRE(out.size() == 2);
  for (const auto& ans : out) {
    REQUIRE(ans.verdict == Verdict::kFetch);
    REQUIRE(ans.holder == "A");
    REQUIRE(ans.chunk == kChunk);
  }
  REQUIRE(answer_for(out, "B")->request == 2);
  REQUIRE(answer_for(out, "C")->request == 3);
  REQUIRE(d.holders(kChunk) == std::vector<std::string>{"A"});
  // The loader is done: a later loader timeout changes nothing.
  REQUIRE(d.expire(t0 + 1h).empty());
  // And the next asker fetches at once.
  auto e = d.lookup(kChunk, "D", 4, t0 + 20ms);
  REQUIRE(e.verdict == Verdict::kFetch);
  REQUIRE(e.holder == "A");
}

TEST_CASE("lookups go to the least-loaded holder; fetch_done gives the load back", "[peers]") {
  ChunkDirectory d(1000ms);
  REQUIRE(d.add_holder(kChunk, "H1", t0).empty());
  REQUIRE(d.add_holder(kChunk, "H2", t0).empty());
  auto holder = [&](const std::string& r) {
    auto a = d.lookup(kChunk, r, 0, t0);
    REQUIRE(a.verdict == Verdict::kFetch);
    return a.holder;
  };
  REQUIRE(holder("R1") == "H1");  // tie: the first added
  REQUIRE(holder("R2") == "H2");
  REQUIRE(holder("R3") == "H1");
  REQUIRE(holder("R4") == "H2");
  // H1 2, H2 2. Two of H2's fetches finish: H2 is the least loaded twice.
  d.fetch_done(kChunk, "H2", "R2", t0);
  d.fetch_done(kChunk, "H2", "R4", t0);
  REQUIRE(holder("R5") == "H2");
  REQUIRE(holder("R6") == "H2");
  REQUIRE(holder("R7") == "H1");
  // H1 3, H2 2. More fetch_done than fetches (repeats) never underflows: H1 0.
  for (const char* r : {"R1", "R3", "R7", "R1", "R3", "R7", "R1"}) d.fetch_done(kChunk, "H1", r, t0);
  REQUIRE(holder("R8") == "H1");
  REQUIRE(holder("R9") == "H1");
  REQUIRE(holder("R10") == "H1");  // 2 and 2: the first added
  REQUIRE(holder("R11") == "H2");
  // fetch_done for an unknown chunk or holder is ignored.
  d.fetch_done(kOther, "H1", "R8", t0);
  d.fetch_done(kChunk, "nobody", "R8", t0);
  REQUIRE(d.entries() == 1);
}

TEST_CASE("add_holder spreads the waiters over the holders by load", "[peers]") {
  ChunkDirectory d(1000ms);
  REQUIRE(d.add_holder(kChunk, "H1", t0).empty());
  d.remove_holder(kChunk, "H1");
  REQUIRE(d.entries() == 0);
  REQUIRE(d.lookup(kChunk, "L", 1, t0).verdict == Verdict::kLoad);
  for (int i = 0; i < 4; ++i) REQUIRE(d.lookup(kChunk, "W" + std::to_string(i), 10 + i, t0).verdict == Verdict::kWait);
  // Someone else turned up holding it while L loads: the waiters go to it...
  auto out = d.add_holder(kChunk, "X", t0);
  REQUIRE(out.size() == 4);
  for (const auto& a : out) REQUIRE(a.holder == "X");
  // ...and L still loads; its holding later is one more holder.
  REQUIRE(d.lookup(kChunk, "W9", 99, t0).verdict == Verdict::kFetch);
  REQUIRE(d.add_holder(kChunk, "L", t0).empty());
  // X serves 5 fetches, L none: the next 5 go to L.
  for (int i = 0; i < 5; ++i) REQUIRE(d.lookup(kChunk, "Y" + std::to_string(i), 0, t0).holder == "L");
  REQUIRE(d.lookup(kChunk, "Z", 0, t0).holder == "X");
}

TEST_CASE("a requester that holds the chunk is never told to fetch from itself", "[peers]") {
  ChunkDirectory d(1000ms);
  REQUIRE(d.add_holder(kChunk, "A", t0).empty());
  // A is the only holder: it reads the repository (it lost its copy, or its drop is in flight).
  auto a = d.lookup(kChunk, "A", 1, t0);
  REQUIRE(a.verdict == Verdict::kLoad);
  REQUIRE(a.holder.empty());
  // With another holder, A fetches from that one, however loaded.
  REQUIRE(d.add_holder(kChunk, "B", t0).empty());
  for (int i = 0; i < 3; ++i) REQUIRE(d.lookup(kChunk, "C" + std::to_string(i), 0, t0).verdict == Verdict::kFetch);
  for (int i = 0; i < 5; ++i) {
    auto b = d.lookup(kChunk, "A", 2, t0);
    REQUIRE(b.verdict == Verdict::kFetch);
    REQUIRE(b.holder == "B");
  }
  // A waiter that becomes a holder itself is not sent to itself either.
  ChunkDirectory e(1000ms);
  REQUIRE(e.lookup(kChunk, "L", 1, t0).verdict == Verdict::kLoad);
  REQUIRE(e.lookup(kChunk, "W", 2, t0).verdict == Verdict::kWait);
  REQUIRE(e.lookup(kChunk, "V", 3, t0).verdict == Verdict::kWait);
  auto out = e.add_holder(kChunk, "W", t0);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "V");
  REQUIRE(out[0].holder == "W");
  // W keeps waiting for L (nobody but itself holds it and L is still loading).
  out = e.add_holder(kChunk, "L", t0);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "W");
  REQUIRE(out[0].verdict == Verdict::kFetch);
  REQUIRE(out[0].holder == "L");
}

TEST_CASE("a loader that asks again is told to load again, not to wait for itself", "[peers]") {
  ChunkDirectory d(1000ms);
  REQUIRE(d.lookup(kChunk, "A", 1, t0).verdict == Verdict::kLoad);
  REQUIRE(d.lookup(kChunk, "A", 2, t0 + 900ms).verdict == Verdict::kLoad);
  // The deadline moved with the retry.
  REQUIRE(d.lookup(kChunk, "B", 3, t0).verdict == Verdict::kWait);
  REQUIRE(d.expire(t0 + 1500ms).empty());
  auto out = d.expire(t0 + 1900ms);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "B");
  REQUIRE(out[0].verdict == Verdict::kLoad);
}

TEST_CASE("load_failed: the first waiter loads, the others keep waiting", "[peers]") {
  ChunkDirectory d(1000ms);
  REQUIRE(d.lookup(kChunk, "A", 1, t0).verdict == Verdict::kLoad);
  REQUIRE(d.lookup(kChunk, "B", 2, t0).verdict == Verdict::kWait);
  REQUIRE(d.lookup(kChunk, "C", 3, t0).verdict == Verdict::kWait);
  // Not the loader: ignored.
  REQUIRE(d.load_failed(kChunk, "C", t0).empty());
  REQUIRE(d.load_failed(kOther, "A", t0).empty());
  auto out = d.load_failed(kChunk, "A", t0 + 5ms);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "B");
  REQUIRE(out[0].request == 2);
  REQUIRE(out[0].verdict == Verdict::kLoad);
  // A retries: B is loading now, so A waits behind C.
  REQUIRE(d.lookup(kChunk, "A", 4, t0 + 6ms).verdict == Verdict::kWait);
  out = d.load_failed(kChunk, "B", t0 + 7ms);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "C");
  REQUIRE(out[0].verdict == Verdict::kLoad);
  out = d.add_holder(kChunk, "C", t0 + 8ms);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "A");
  REQUIRE(out[0].request == 4);
  REQUIRE(out[0].verdict == Verdict::kFetch);
  REQUIRE(out[0].holder == "C");
  // A failed load with nobody waiting leaves no entry behind.
  REQUIRE(d.lookup(kOther, "A", 5, t0).verdict == Verdict::kLoad);
  REQUIRE(d.load_failed(kOther, "A", t0).empty());
  REQUIRE(d.entries() == 1);
  REQUIRE(d.lookup(kOther, "B", 6, t0).verdict == Verdict::kLoad);
}

TEST_CASE("expire: a loader past its deadline is treated as failed", "[peers]") {
  ChunkDirectory d(1000ms);
  REQUIRE(d.lookup(kChunk, "A", 1, t0).verdict == Verdict::kLoad);
  REQUIRE(d.lookup(kChunk, "B", 2, t0 + 100ms).verdict == Verdict::kWait);
  REQUIRE(d.lookup(kChunk, "C", 3, t0 + 200ms).verdict == Verdict::kWait);
  REQUIRE(d.lookup(kOther, "D", 4, t0 + 500ms).verdict == Verdict::kLoad);
  REQUIRE(d.expire(t0 + 999ms).empty());
  auto out = d.expire(t0 + 1001ms);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "B");
  REQUIRE(out[0].verdict == Verdict::kLoad);
  REQUIRE(out[0].chunk == kChunk);
  // B's deadline starts when it was told to load; D (no waiters) expires and its entry goes.
  REQUIRE(d.expire(t0 + 1600ms).empty());
  REQUIRE(d.entries() == 1);
  out = d.expire(t0 + 2002ms);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "C");
  REQUIRE(out[0].verdict == Verdict::kLoad);
  // The slow first loader finishing late is simply one more holder.
  REQUIRE(d.add_holder(kChunk, "A", t0 + 2100ms).empty());
  REQUIRE(d.lookup(kChunk, "E", 5, t0 + 2200ms).holder == "A");
}

TEST_CASE("member_gone: the loader's waiters move on, the holder leaves, its lookups are dropped", "[peers]") {
  SECTION("the loader is gone: the next waiter loads") {
    ChunkDirectory d(1000ms);
    REQUIRE(d.lookup(kChunk, "A", 1, t0).verdict == Verdict::kLoad);
    REQUIRE(d.lookup(kChunk, "B", 2, t0).verdict == Verdict::kWait);
    REQUIRE(d.lookup(kChunk, "C", 3, t0).verdict == Verdict::kWait);
    auto out = d.member_gone("A", t0);
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].requester == "B");
    REQUIRE(out[0].verdict == Verdict::kLoad);
    out = d.add_holder(kChunk, "B", t0);
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].requester == "C");
    REQUIRE(out[0].holder == "B");
  }
  SECTION("the only holder is gone: the next lookup loads") {
    ChunkDirectory d(1000ms);
    REQUIRE(d.add_holder(kChunk, "H", t0).empty());
    REQUIRE(d.add_holder(kOther, "H", t0).empty());
    REQUIRE(d.add_holder(kOther, "K", t0).empty());
    REQUIRE(d.member_gone("H", t0).empty());
    REQUIRE(d.holders(kChunk).empty());
    REQUIRE(d.holders(kOther) == std::vector<std::string>{"K"});
    REQUIRE(d.entries() == 1);
    REQUIRE(d.lookup(kChunk, "R", 1, t0).verdict == Verdict::kLoad);
    REQUIRE(d.lookup(kOther, "R", 2, t0).holder == "K");
  }
  SECTION("a gone member's queued lookups are dropped") {
    ChunkDirectory d(1000ms);
    REQUIRE(d.lookup(kChunk, "A", 1, t0).verdict == Verdict::kLoad);
    REQUIRE(d.lookup(kChunk, "B", 2, t0).verdict == Verdict::kWait);
    REQUIRE(d.lookup(kChunk, "C", 3, t0).verdict == Verdict::kWait);
    REQUIRE(d.lookup(kChunk, "B", 4, t0).verdict == Verdict::kWait);
    REQUIRE(d.member_gone("B", t0).empty());
    auto out = d.add_holder(kChunk, "A", t0);
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].requester == "C");
    // Both gone: loader and its waiters; nothing is left of the chunk.
    REQUIRE(d.lookup(kOther, "X", 5, t0).verdict == Verdict::kLoad);
    REQUIRE(d.lookup(kOther, "Y", 6, t0).verdict == Verdict::kWait);
    REQUIRE(d.member_gone("Y", t0).empty());
    REQUIRE(d.member_gone("X", t0).empty());
    REQUIRE(d.entries() == 1);
  }
  SECTION("the gone loader's next waiter is itself gone too") {
    ChunkDirectory d(1000ms);
    REQUIRE(d.lookup(kChunk, "A", 1, t0).verdict == Verdict::kLoad);
    REQUIRE(d.lookup(kChunk, "B", 2, t0).verdict == Verdict::kWait);
    REQUIRE(d.lookup(kChunk, "C", 3, t0).verdict == Verdict::kWait);
    REQUIRE(d.member_gone("B", t0).empty());
    auto out = d.member_gone("A", t0);
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].requester == "C");
    REQUIRE(out[0].verdict == Verdict::kLoad);
  }
}

TEST_CASE("take_moved returns and removes exactly the entries whose home changed", "[peers]") {
  std::vector<std::string> members{"m0", "m1", "m2", "m3"};
  const std::string self = "m0";
  ChunkDirectory d(1000ms);
  std::mt19937_64 rng(7);
  std::vector<ChunkHash> mine;
  while (mine.size() < 400) {
    ChunkHash c{rng(), rng()};
    if (cairn::home_of(c, members) != self) continue;
    mine.push_back(c);
    d.add_holder(c, "h" + std::to_string(mine.size() % 3), t0);
    d.add_holder(c, "m2", t0);
  }
  REQUIRE(d.take_moved(members, self).empty());
  REQUIRE(d.entries() == mine.size());

  auto grown = members;
  grown.push_back("m4");
  std::set<ChunkHash> expect;
  for (const auto& c : mine)
    if (cairn::home_of(c, grown) != self) expect.insert(c);
  REQUIRE(!expect.empty());
  auto moved = d.take_moved(grown, self);
  std::set<ChunkHash> got;
  for (const auto& [c, hs] : moved) {
    got.insert(c);
    REQUIRE(cairn::home_of(c, grown) == "m4");  // a join only moves chunks to the newcomer
    REQUIRE(hs.size() == 2);
    REQUIRE(hs[1] == "m2");
  }
  REQUIRE(got == expect);
  REQUIRE(moved.size() == expect.size());
  REQUIRE(d.entries() == mine.size() - expect.size());
  for (const auto& c : mine) REQUIRE(d.holders(c).empty() == (expect.count(c) == 1));
  REQUIRE(d.take_moved(grown, self).empty());
  // self left the list (it is leaving): everything moves.
  auto rest = d.entries();
  REQUIRE(d.take_moved({"m1", "m2"}, self).size() == rest);
  REQUIRE(d.entries() == 0);
}

TEST_CASE("each chunk is read from the repository once, however the lookups interleave", "[peers]") {
  // 8 members each want the same 64 chunks; lookups, loads and fetches complete in random order.
  // With no limit on a holder's uploads, and with one upload slot per holder (the daemon's rule).
  const uint32_t slots = GENERATE(0u, 1u);
  INFO("uploads per holder " << slots);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    ChunkDirectory d(1000ms, slots);
    const int kMembers = 8, kChunks = 64;
    std::vector<ChunkHash> chunks;
    for (int i = 0; i < kChunks; ++i) chunks.push_back(ChunkHash{rng(), static_cast<uint64_t>(i)});
    std::vector<std::string> names;
    for (int m = 0; m < kMembers; ++m) names.push_back("member" + std::to_string(m));

    enum class State { kWant, kAsked, kLoading, kFetching, kHave };
    struct Task {
      int member, chunk;
      State state = State::kWant;
      std::string from;
    };
    std::vector<Task> tasks;
    for (int m = 0; m < kMembers; ++m)
      for (int c = 0; c < kChunks; ++c) tasks.push_back(Task{m, c});
    std::map<std::pair<std::string, ChunkHash>, size_t> index;
    for (size_t i = 0; i < tasks.size(); ++i) index[{names[tasks[i].member], chunks[tasks[i].chunk]}] = i;

    int loads = 0, fetches = 0, done = 0;
    auto apply = [&](const ChunkDirectory::Answer& a) {
      Task& t = tasks.at(index.at({a.requester, a.chunk}));
      REQUIRE(t.state == State::kAsked);
      REQUIRE(a.request == static_cast<uint64_t>(index.at({a.requester, a.chunk})));
      if (a.verdict == Verdict::kLoad) {
        ++loads;
        t.state = State::kLoading;
      } else if (a.verdict == Verdict::kFetch) {
        REQUIRE(a.holder != a.requester);
        ++fetches;
        t.state = State::kFetching;
        t.from = a.holder;
      }
    };
    auto now = t0;
    while (done < kMembers * kChunks) {
      now += 1ms;
      Task& t = tasks[rng() % tasks.size()];
      const ChunkHash& h = chunks[t.chunk];
      const std::string& me = names[t.member];
      switch (t.state) {
        case State::kWant:
          t.state = State::kAsked;
          apply(d.lookup(h, me, index.at({me, h}), now));
          break;
        case State::kLoading:
        case State::kFetching:
          if (t.state == State::kFetching) {
            // The holder must really hold it.
            REQUIRE(tasks[index.at({t.from, h})].state == State::kHave);
            for (const auto& a : d.fetch_done(h, t.from, me, now)) apply(a);
          }
          t.state = State::kHave;
          ++done;
          for (const auto& a : d.add_holder(h, me, now)) apply(a);
          break;
        case State::kAsked:
        case State::kHave:
          break;
      }
    }
    REQUIRE(loads == kChunks);
    REQUIRE(fetches == (kMembers - 1) * kChunks);
    for (const auto& c : chunks) REQUIRE(d.holders(c).size() == kMembers);
  }
}

TEST_CASE("one upload slot per holder: waiters are served as holders free up, the holders double", "[peers]") {
  ChunkDirectory d(1000ms, 1);
  REQUIRE(d.add_holder(kChunk, "A", t0).empty());
  // B fetches from A; C..H wait (A's slot is taken), they are not told to load.
  auto b = d.lookup(kChunk, "B", 1, t0);
  REQUIRE(b.verdict == Verdict::kFetch);
  REQUIRE(b.holder == "A");
  for (int i = 0; i < 6; ++i) {
    std::string r(1, static_cast<char>('C' + i));
    REQUIRE(d.lookup(kChunk, r, 10 + i, t0).verdict == Verdict::kWait);
  }
  // B's fetch ends and B holds the chunk: A and B each serve one waiter.
  REQUIRE(d.fetch_done(kChunk, "A", "B", t0).size() == 1);  // A's slot: the first waiter
  auto out = d.add_holder(kChunk, "B", t0);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "D");
  REQUIRE(out[0].holder == "B");
  // Both served fetches end and both requesters hold it: four holders, four more served.
  std::vector<ChunkDirectory::Answer> next;
  for (auto [holder, requester] : {std::pair{"A", "C"}, std::pair{"B", "D"}}) {
    for (auto& a : d.fetch_done(kChunk, holder, requester, t0)) next.push_back(a);
    for (auto& a : d.add_holder(kChunk, requester, t0)) next.push_back(a);
  }
  REQUIRE(next.size() == 4);
  std::set<std::string> from;
  for (const auto& a : next) {
    REQUIRE(a.verdict == Verdict::kFetch);
    from.insert(a.holder);
  }
  REQUIRE(from == std::set<std::string>{"A", "B", "C", "D"});
}

TEST_CASE("a requester that dies mid-fetch frees its holder's slot for the next waiter", "[peers]") {
  ChunkDirectory d(1000ms, 1);
  REQUIRE(d.add_holder(kChunk, "A", t0).empty());
  REQUIRE(d.lookup(kChunk, "B", 1, t0).verdict == Verdict::kFetch);
  REQUIRE(d.lookup(kChunk, "C", 2, t0).verdict == Verdict::kWait);
  auto out = d.member_gone("B", t0);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].requester == "C");
  REQUIRE(out[0].verdict == Verdict::kFetch);
  REQUIRE(out[0].holder == "A");
  // A late fetched message from the gone member changes nothing.
  REQUIRE(d.fetch_done(kChunk, "A", "B", t0).empty());
  REQUIRE(d.lookup(kChunk, "E", 3, t0).verdict == Verdict::kWait);
}
