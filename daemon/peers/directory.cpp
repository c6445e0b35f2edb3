#include "daemon/peers/directory.hpp"

#include <algorithm>

#include "policy/placement.hpp"

namespace cairn {

namespace {

template <typename Holders>
auto find_holder(Holders& holders, const std::string& member) {
  return std::find_if(holders.begin(), holders.end(), [&](const auto& p) { return p.first == member; });
}

}  // namespace

bool ChunkDirectory::pick(Entry& e, const std::string& requester, std::string& holder) {
  std::pair<std::string, uint32_t>* best = nullptr;
  for (auto& h : e.holders) {
    if (h.first == requester) continue;
    if (uploads_per_holder_ && h.second >= uploads_per_holder_) continue;  // its slots are taken
    if (best == nullptr || h.second < best->second) best = &h;             // strict <: ties keep the first added
  }
  if (best == nullptr) return false;
  ++best->second;
  holder = best->first;
  e.fetches.emplace_back(requester, holder);
  return true;
}

bool ChunkDirectory::has_other_holder(const Entry& e, const std::string& requester) {
  return std::any_of(e.holders.begin(), e.holders.end(), [&](const auto& h) { return h.first != requester; });
}

ChunkDirectory::Verdict ChunkDirectory::decide(Entry& e, const std::string& requester, Clock::time_point now,
                                               std::string& holder) {
  if (pick(e, requester, holder)) return Verdict::kFetch;
  // Holders, all busy: wait for a slot (a fetch ending, or the next holder) rather than load again.
  if (has_other_holder(e, requester)) return Verdict::kWait;
  if (e.loader.empty() || e.loader == requester) {
    // Nobody else holds it and nobody (else) is reading it: the requester reads the repository. A
    // loader that asks again (a retry) is told to load again, with a fresh deadline.
    e.loader = requester;
    e.deadline = now + load_timeout_;
    return Verdict::kLoad;
  }
  return Verdict::kWait;
}

// Each queued waiter is answered as if it asked now, in queue order (decide); those told to wait
// stay queued. So at most one member loads, and the first waiter is the one that takes over.
void ChunkDirectory::resolve(const ChunkHash& h, Entry& e, Clock::time_point now, std::vector<Answer>& out) {
  std::vector<Waiter> still;
  for (Waiter& w : e.waiters) {
    Answer a;
    a.chunk = h;
    a.requester = w.member;
    a.request = w.request;
    a.verdict = decide(e, w.member, now, a.holder);
    if (a.verdict == Verdict::kWait) {
      still.push_back(std::move(w));
      continue;
    }
    out.push_back(std::move(a));
  }
  e.waiters = std::move(still);
}

ChunkDirectory::Answer ChunkDirectory::lookup(const ChunkHash& h, const std::string& requester, uint64_t request,
                                              Clock::time_point now) {
  Entry& e = entries_[h];
  Answer a;
  a.chunk = h;
  a.requester = requester;
  a.request = request;
  a.verdict = decide(e, requester, now, a.holder);
  if (a.verdict == Verdict::kWait) e.waiters.push_back(Waiter{requester, request});
  return a;
}

std::vector<ChunkDirectory::Answer> ChunkDirectory::add_holder(const ChunkHash& h, const std::string& member,
                                                               Clock::time_point now) {
  std::vector<Answer> out;
  Entry& e = entries_[h];
  if (find_holder(e.holders, member) == e.holders.end()) e.holders.emplace_back(member, 0);
  if (e.loader == member) e.loader.clear();
  resolve(h, e, now, out);
  return out;
}

void ChunkDirectory::remove_holder(const ChunkHash& h, const std::string& member) {
  auto it = entries_.find(h);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  auto hit = find_holder(e.holders, member);
  if (hit != e.holders.end()) e.holders.erase(hit);
  if (e.holders.empty() && e.loader.empty() && e.waiters.empty()) entries_.erase(it);
}

std::vector<ChunkDirectory::Answer> ChunkDirectory::load_failed(const ChunkHash& h, const std::string& member,
                                                                Clock::time_point now) {
  std::vector<Answer> out;
  auto it = entries_.find(h);
  if (it == entries_.end() || it->second.loader != member) return out;  // stale: not the loader (any more)
  Entry& e = it->second;
  e.loader.clear();
  resolve(h, e, now, out);
  if (e.holders.empty() && e.loader.empty() && e.waiters.empty()) entries_.erase(it);
  return out;
}

// Ends one fetch (requester, holder): the holder's slot is free again.
static void end_fetch(std::vector<std::pair<std::string, uint32_t>>& holders,
                      std::vector<std::pair<std::string, std::string>>& fetches, const std::string& requester,
                      const std::string& holder) {
  auto f = std::find(fetches.begin(), fetches.end(), std::pair{requester, holder});
  if (f == fetches.end()) return;  // unknown or already ended (a duplicate fetched message)
  fetches.erase(f);
  auto hit = find_holder(holders, holder);
  if (hit != holders.end() && hit->second > 0) --hit->second;
}

std::vector<ChunkDirectory::Answer> ChunkDirectory::fetch_done(const ChunkHash& h, const std::string& holder,
                                                               const std::string& requester, Clock::time_point now) {
  std::vector<Answer> out;
  auto it = entries_.find(h);
  if (it == entries_.end()) return out;
  end_fetch(it->second.holders, it->second.fetches, requester, holder);
  resolve(h, it->second, now, out);
  return out;
}

// Visits every entry, then erases those left with no holder, loader or waiter.
template <typename Map, typename Visit>
static void sweep(Map& entries, Visit&& visit) {
  for (auto it = entries.begin(); it != entries.end();) {
    auto& e = it->second;
    visit(it->first, e);
    if (e.holders.empty() && e.loader.empty() && e.waiters.empty()) {
      it = entries.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<ChunkDirectory::Answer> ChunkDirectory::member_gone(const std::string& member, Clock::time_point now) {
  std::vector<Answer> out;
  sweep(entries_, [&](const ChunkHash& h, Entry& e) {
    auto hit = find_holder(e.holders, member);
    if (hit != e.holders.end()) e.holders.erase(hit);
    std::erase_if(e.waiters, [&](const Waiter& w) { return w.member == member; });
    // Its fetches in flight (as requester) free their holders' slots; those it served are gone.
    for (size_t i = e.fetches.size(); i-- > 0;) {
      auto [requester, holder] = e.fetches[i];
      if (requester == member)
        end_fetch(e.holders, e.fetches, requester, holder);
      else if (holder == member)
        e.fetches.erase(e.fetches.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (e.loader == member) e.loader.clear();
    resolve(h, e, now, out);
  });
  return out;
}

std::vector<ChunkDirectory::Answer> ChunkDirectory::expire(Clock::time_point now) {
  std::vector<Answer> out;
  sweep(entries_, [&](const ChunkHash& h, Entry& e) {
    if (!e.loader.empty() && e.deadline <= now) {
      e.loader.clear();
      resolve(h, e, now, out);
    }
  });
  return out;
}

// Every moved entry is returned (also one with no holders yet); its loader and waiters are
// forgotten here: their lookups go to the new home when they ask again.
std::vector<std::pair<ChunkHash, std::vector<std::string>>> ChunkDirectory::take_moved(
    const std::vector<std::string>& members, const std::string& self) {
  std::vector<std::pair<ChunkHash, std::vector<std::string>>> moved;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (home_of(it->first, members) == self) {
      ++it;
      continue;
    }
    std::vector<std::string> names;
    names.reserve(it->second.holders.size());
    for (const auto& h : it->second.holders) names.push_back(h.first);
    moved.emplace_back(it->first, std::move(names));
    it = entries_.erase(it);
  }
  return moved;
}

std::vector<std::string> ChunkDirectory::holders(const ChunkHash& h) const {
  std::vector<std::string> names;
  auto it = entries_.find(h);
  if (it == entries_.end()) return names;
  for (const auto& p : it->second.holders) names.push_back(p.first);
  return names;
}

}  // namespace cairn
