#include "daemon/peers/replay_window.hpp"

#include <algorithm>

namespace cairn {

ReplayWindow::Verdict ReplayWindow::check(uint64_t seq) const {
  if (seq == 0) return Verdict::kTooOld;
  if (seq > highest_) return Verdict::kNew;
  if (highest_ - seq >= kBits) return Verdict::kTooOld;
  return seen(seq) ? Verdict::kReplayed : Verdict::kNew;
}

ReplayWindow::Verdict ReplayWindow::accept(uint64_t seq) {
  const Verdict v = check(seq);
  if (v != Verdict::kNew) return v;
  if (seq > highest_) {
    // Slide: the seqs between the old highest and seq were not seen (clear their bits).
    if (seq - highest_ >= kBits) {
      bits_.fill(0);
    } else {
      for (uint64_t s = highest_ + 1; s < seq; ++s) bits_[(s % kBits) / 64] &= ~(uint64_t{1} << (s % 64));
    }
    highest_ = seq;
  }
  bits_[(seq % kBits) / 64] |= uint64_t{1} << (seq % 64);
  return Verdict::kNew;
}

ReplayWindow::Verdict ReplayGuard::accept(const std::string& sender, uint64_t seq) {
  auto it = windows_.find(sender);
  if (it == windows_.end()) {
    if (seq == 0) return ReplayWindow::Verdict::kTooOld;  // nothing to remember
    if (windows_.size() >= max_senders_ && !windows_.empty()) {
      auto oldest = std::min_element(windows_.begin(), windows_.end(), [](const auto& a, const auto& b) {
        return a.second.last_used < b.second.last_used;
      });
      windows_.erase(oldest);
    }
    it = windows_.emplace(sender, Entry{}).first;
  }
  it->second.last_used = ++tick_;
  return it->second.window.accept(seq);
}

const char* replay_verdict_name(ReplayWindow::Verdict v) {
  switch (v) {
    case ReplayWindow::Verdict::kNew:
      return "new";
    case ReplayWindow::Verdict::kReplayed:
      return "a replay (seen before)";
    case ReplayWindow::Verdict::kTooOld:
      return "too old (below the sender's window)";
  }
  return "?";
}

}  // namespace cairn
