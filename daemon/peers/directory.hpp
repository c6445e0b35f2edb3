// The chunk directory: the part a member keeps for the chunks it is home for (policy/placement.hpp
// picks the home). For each chunk: which members hold it in DRAM, how many fetches each holder is
// serving now, and at most one member loading it from the repository. A state machine, no I/O and
// no clock of its own (the caller passes now): the peer service turns its verdicts into messages.
//
// The rules (docs/peers.md):
//   - lookup by R: a holder other than R with a free upload slot exists -> kFetch from the
//     least-loaded one (its load count +1 until fetch_done); holders but none free -> kWait (R is
//     queued until a fetch ends or a new holder appears); no holder and no loader -> kLoad (R reads
//     the repository; its deadline is now + timeout); no holder but a loader -> kWait;
//   - add_holder(h, M): M holds h now; every queued waiter gets kFetch (spread over the holders by
//     load); a loader that became a holder is no longer loading;
//   - load_failed(h, M) / a loader past its deadline / a loader gone: the first waiter becomes the
//     loader (kLoad), the rest keep waiting;
//   - member_gone(M): M leaves every holder set; waiters of chunks M was loading are resolved as
//     above; M's own queued lookups are dropped;
//   - so each chunk is read from the repository once per job, and a chunk every member loads
//     spreads as a tree: with one upload slot per holder, each finished fetch makes one more holder,
//     and the holders double every transfer time, instead of every member queueing at the first
//     holder's network card (bench/workloads/peers_sim.py shows the difference: linear in the
//     number of members without the limit, logarithmic with it).
//
// Thread-safety: none; the peer service holds its lock around every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/hash.hpp"

namespace cairn {

class ChunkDirectory {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Verdict { kFetch, kLoad, kWait };
  // An answer to one lookup (now, or later for a queued one).
  struct Answer {
    ChunkHash chunk;
    std::string requester;
    uint64_t request = 0;  // the requester's request id, echoed
    Verdict verdict = Verdict::kWait;
    std::string holder;  // kFetch: whom to fetch from
  };

  // uploads_per_holder: fetches of one chunk a holder serves at once (0 = no limit).
  explicit ChunkDirectory(std::chrono::milliseconds load_timeout, uint32_t uploads_per_holder = 0)
      : load_timeout_(load_timeout), uploads_per_holder_(uploads_per_holder) {}

  // R asks for h. Returns the answer now (kWait: R is queued and answered by a later call).
  Answer lookup(const ChunkHash& h, const std::string& requester, uint64_t request, Clock::time_point now);
  // M holds h now. Returns the answers for the waiters this resolves.
  std::vector<Answer> add_holder(const ChunkHash& h, const std::string& member, Clock::time_point now);
  // M no longer holds h.
  void remove_holder(const ChunkHash& h, const std::string& member);
  // M's repository read of h failed: the next waiter (if any) becomes the loader.
  std::vector<Answer> load_failed(const ChunkHash& h, const std::string& member, Clock::time_point now);
  // requester's fetch from holder (answered kFetch earlier) finished, well or not: the holder's
  // slot is free again. Returns the answers for the waiters this resolves.
  std::vector<Answer> fetch_done(const ChunkHash& h, const std::string& holder, const std::string& requester,
                                 Clock::time_point now);
  // M is gone: drop it everywhere (as holder, loader, waiter, and its fetches in flight, whose
  // holders' slots are freed); returns the answers this resolves.
  std::vector<Answer> member_gone(const std::string& member, Clock::time_point now);
  // Loaders past their deadline are treated as failed; returns the answers this resolves.
  std::vector<Answer> expire(Clock::time_point now);

  // The entries whose home is no longer `self` under `members`: removed from this directory and
  // returned as (chunk, holders), for the caller to announce to the new homes.
  std::vector<std::pair<ChunkHash, std::vector<std::string>>> take_moved(const std::vector<std::string>& members,
                                                                         const std::string& self);

  // Holders of h (tests, `cairn peers`).
  std::vector<std::string> holders(const ChunkHash& h) const;
  size_t entries() const { return entries_.size(); }

 private:
  struct Waiter {
    std::string member;
    uint64_t request = 0;
  };
  struct Entry {
    std::vector<std::pair<std::string, uint32_t>> holders;     // member, fetches it is serving now
    std::vector<std::pair<std::string, std::string>> fetches;  // (requester, holder) in flight
    std::string loader;                                        // "" = none
    Clock::time_point deadline{};
    std::vector<Waiter> waiters;
  };
  // Picks the least-loaded holder other than `requester` with a free slot (ties: the first added),
  // counts the fetch.
  bool pick(Entry& e, const std::string& requester, std::string& holder);
  // Whether a holder other than `requester` exists (free or not).
  static bool has_other_holder(const Entry& e, const std::string& requester);
  // The answer for `requester` now: kFetch, kLoad (it becomes the loader) or kWait.
  Verdict decide(Entry& e, const std::string& requester, Clock::time_point now, std::string& holder);
  // Resolves e's waiters after a change: to holders when there are any, else a new loader.
  void resolve(const ChunkHash& h, Entry& e, Clock::time_point now, std::vector<Answer>& out);

  std::chrono::milliseconds load_timeout_;
  uint32_t uploads_per_holder_;
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries_;
};

}  // namespace cairn
