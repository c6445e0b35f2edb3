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
    if (best == nullptr || h.second < best->second) best = &h;  // strict <: ties keep the first added
  }
  if (best == nullptr) return false;
  ++best->second;
  holder = best->first;
  return true;
}

// Each queued waiter is answered as if it asked now, in queue order: a holder other than itself ->
// kFetch; else no loader (or itself the loader) -> it becomes the loader (kLoad); else it keeps
// waiting. So at most one member loads, and the first waiter is the one that takes over.
void ChunkDirectory::resolve(const ChunkHash& h, Entry& e, Clock::time_point now, std::vector<Answer>& out) {
  std::vector<Waiter> still;
  for (Waiter& w : e.waiters) {
    Answer a;
    a.chunk = h;
    a.requester = w.member;
    a.request = w.request;
    if (pick(e, w.member, a.holder)) {
      a.verdict = Verdict::kFetch;
    } else if (e.loader.empty() || e.loader == w.member) {
      e.loader = w.member;
      e.deadline = now + load_timeout_;
      a.verdict = Verdict::kLoad;
    } else {
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
  if (pick(e, requester, a.holder)) {
    a.verdict = Verdict::kFetch;
  } else if (e.loader.empty() || e.loader == requester) {
    // Nobody else holds it and nobody (else) is reading it: the requester reads the repository. A
    // loader that asks again (a retry) is told to load again, with a fresh deadline.
    e.loader = requester;
    e.deadline = now + load_timeout_;
    a.verdict = Verdict::kLoad;
  } else {
    e.waiters.push_back(Waiter{requester, request});
    a.verdict = Verdict::kWait;
  }
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

void ChunkDirectory::fetch_done(const ChunkHash& h, const std::string& holder) {
  auto it = entries_.find(h);
  if (it == entries_.end()) return;
  auto hit = find_holder(it->second.holders, holder);
  if (hit != it->second.holders.end() && hit->second > 0) --hit->second;
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
    if (e.loader == member) {
      e.loader.clear();
      resolve(h, e, now, out);
    }
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
