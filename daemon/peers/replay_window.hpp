// Anti-replay for peer messages: a frame's MAC proves a member of the job made it, not that it is
// new. A captured frame sent again later (by anyone who can reach the endpoint: it needs no secret)
// must be refused, or a replayed `get` would make a holder send a chunk again, a replayed `have`
// would resurrect a holder, a replayed `hello` re-add a member that left.
//
// Each sender numbers its frames to each receiver 1, 2, 3, ... (PeerService's per-member counters);
// its id is random at every start (membership.hpp), so a restarted daemon is a new sender. Frames
// over an RDM endpoint, and over the two endpoints of a pair, may arrive out of order, so the
// receiver keeps, per sender, a sliding window as IPsec's (RFC 4303 section 3.4.3): the highest seq
// accepted and a bitmap of the kBits seqs up to it. A seq is new when it is above the highest, or
// within the window and not seen; one seen before is a replay; one kBits or more below the highest
// is too old (refused too: it cannot be told from a replay).
//
// Thread-safety: none; the peer service calls it under its lock.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace cairn {

class ReplayWindow {
 public:
  // How many seqs below the highest are remembered. A frame overtaken by more than this many later
  // frames of the same sender to the same receiver is refused as too old.
  static constexpr uint64_t kBits = 1024;
  enum class Verdict { kNew, kReplayed, kTooOld };

  // Whether seq is new; if so it is marked seen. seq 0 is never sent: too old.
  Verdict accept(uint64_t seq);
  // The same without marking.
  Verdict check(uint64_t seq) const;
  uint64_t highest() const { return highest_; }

 private:
  bool seen(uint64_t seq) const { return bits_[(seq % kBits) / 64] >> (seq % 64) & 1; }
  uint64_t highest_ = 0;
  // Bit seq % kBits: seq in (highest_ - kBits, highest_] was accepted.
  std::array<uint64_t, kBits / 64> bits_{};
};

// The windows of every sender heard from, by member id. Windows outlive their members (a frame of a
// member that left, replayed, is still refused) up to max_senders; then the sender heard from
// least recently is forgotten (a replay of its frames would then be accepted once: documented in
// docs/peers.md).
class ReplayGuard {
 public:
  explicit ReplayGuard(size_t max_senders = 16384) : max_senders_(max_senders) {}
  ReplayWindow::Verdict accept(const std::string& sender, uint64_t seq);
  size_t senders() const { return windows_.size(); }

 private:
  struct Entry {
    ReplayWindow window;
    uint64_t last_used = 0;
  };
  size_t max_senders_;
  uint64_t tick_ = 0;
  std::unordered_map<std::string, Entry> windows_;
};

const char* replay_verdict_name(ReplayWindow::Verdict v);

}  // namespace cairn
