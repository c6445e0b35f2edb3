// A reader's fetch from the peer group (peer_service_impl.hpp): ask the chunk's home, then receive
// the body from the holder it names straight into arena space, and check it against its hash.
#include <map>

#include "core/hash.hpp"
#include "daemon/peers/peer_service_impl.hpp"

namespace cairn {

using json = nlohmann::json;
using PClock = std::chrono::steady_clock;
using Member = PeerService::Impl::Member;
using Pending = PeerService::Impl::Pending;
using Outgoing = PeerService::Impl::Outgoing;
using Ahead = PeerService::Impl::Ahead;

// Waits for a pending request; returns it (removed) or nullopt on timeout (removed too).
std::optional<Pending> PeerService::Impl::wait(std::unique_lock<std::mutex>& lock, uint64_t req, PClock::time_point deadline) {
  bool ok = cv.wait_until(lock, deadline, [&] {
    auto it = pendings.find(req);
    return it == pendings.end() || it->second.done;
  });
  auto it = pendings.find(req);
  if (it == pendings.end()) return std::nullopt;
  Pending p = std::move(it->second);
  pendings.erase(it);
  if (!ok) return std::nullopt;
  return p;
}

Status PeerService::Impl::fetch(const ChunkRef& ref, void* dst) {
  Status last = not_found("peer group: no other member holds chunk " + ref.hash.hex());
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_lock lock(mu);
    std::vector<Outgoing> out;
    // 1. The verdict of a lookup sent ahead, or ask the chunk's home now (this member's own
    //    directory when it is the home).
    std::optional<Ahead> pre;
    if (ahead_wanted.erase(ref.hash)) {
      if (auto it = ahead.find(ref.hash); it != ahead.end()) {
        pre = std::move(it->second);
        ahead.erase(it);
        ++ahead_used;
      }
      send_ahead(out);
    }
    const std::string home_id = pre ? pre->home : home(ref.hash);
    if (home_id.empty()) return last;
    uint64_t req = pre ? pre->req : add_pending(home_id);
    if (pre) {
      // (nothing to send: the lookup went ahead)
    } else if (home_id == self) {
      auto a = directory.lookup(ref.hash, self, req, PClock::now());
      if (a.verdict != ChunkDirectory::Verdict::kWait) deliver(a, out);
    } else {
      auto o = to_member(home_id, PeerMsg::kLookup,
                         json{{"req", req}, {"chunk", ref.hash.hex()}, {"length", ref.length}});
      if (!o || !members[home_id].verified) {
        pendings.erase(req);
        return not_found("peer group: the home of chunk " + ref.hash.hex() + " (" + home_id + ") is not verified yet");
      }
      out.push_back(std::move(*o));
    }
    lock.unlock();
    send(out);
    lock.lock();
    auto answer = wait(lock, req, PClock::now() + opts.timeout);
    if (!answer) {
      ++peer_timeouts;
      return timed_out("peer group: the home of chunk " + ref.hash.hex() + " (" + home_id + ") did not answer within " +
                       std::to_string(opts.timeout.count()) + " ms");
    }
    if (!answer->status.is_ok()) {
      if (pre) continue;  // that home left meanwhile: ask the current one
      return answer->status;
    }
    if (answer->verdict != ChunkDirectory::Verdict::kFetch || answer->holder.empty() || answer->holder == self)
      return not_found("peer group: this member reads chunk " + ref.hash.hex() + " from the repository for the job");
    // 2. Fetch the body from the holder, straight into dst.
    const std::string holder = answer->holder;
    Status st = fetch_from(lock, holder, ref, dst);
    // 3. Tell the home the fetch is over (its load count for the holder).
    out.clear();
    if (home_id == self) deliver_all(directory.fetch_done(ref.hash, holder, self, PClock::now()), out);
    else if (auto o = to_member(home_id, PeerMsg::kFetched, json{{"chunk", ref.hash.hex()}, {"holder", holder}}))
      out.push_back(std::move(*o));
    if (st.is_ok()) {
      auto it = members.find(holder);
      if (it != members.end()) {
        ++it->second.chunks_fetched;
        it->second.bytes_received += ref.length;
      }
      ++fetched_chunks;
      fetched_bytes += ref.length;
    }
    lock.unlock();
    send(out);
    if (st.is_ok()) return st;
    last = st;
    if (st.code() == StatusCode::kTimeout) return st;  // the timeout is spent: the repository next
  }
  return last;
}

// REQUIRES: lock held (released while waiting). One body from holder into dst, verified.
Status PeerService::Impl::fetch_from(std::unique_lock<std::mutex>& lock, const std::string& holder, const ChunkRef& ref, void* dst) {
  auto it = members.find(holder);
  if (it == members.end() || !it->second.reachable)
    return unavailable("peer group: holder " + holder + " of chunk " + ref.hash.hex() + " is gone");
  const uint64_t handle = it->second.handle;
  const uint64_t req = add_pending(holder);
  const uint64_t tag = Fabric::kBodyTagBit | req;
  Outgoing get = make(holder, handle, PeerMsg::kGet,
                      json{{"req", req}, {"chunk", ref.hash.hex()}, {"length", ref.length}, {"tag", tag}});
  lock.unlock();
  // The body's completion: the same pending entry as a get_reply refusal; the first one wins.
  auto body_done = std::make_shared<std::atomic<bool>>(false);
  Status posted = fabric->post_body_receive(tag, dst, ref.length, [this, req, body_done](const Status& s, size_t n) {
    std::lock_guard g(mu);
    body_done->store(true);
    auto p = pendings.find(req);
    if (p != pendings.end() && !p->second.done) {
      p->second.done = true;
      p->second.status = s;
      p->second.bytes = n;
    }
    cv.notify_all();
  });
  if (posted.is_ok()) {
    Status sent = fabric->send_control(handle, get.frame);
    if (!sent.is_ok()) {
      fabric->cancel_body_receive(tag);
      posted = sent;
    }
  }
  lock.lock();
  if (!posted.is_ok()) {
    pendings.erase(req);
    return posted;
  }
  auto p = wait(lock, req, PClock::now() + opts.timeout);
  const bool got_body = p && p->status.is_ok() && body_done->load();
  if (!got_body) {
    // Make sure the fabric no longer writes into dst before it goes back to the caller.
    lock.unlock();
    fabric->cancel_body_receive(tag);
    lock.lock();
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return body_done->load(); });
    if (!p) {
      ++peer_timeouts;
      return timed_out("peer group: holder " + holder + " did not send chunk " + ref.hash.hex() + " within " +
                       std::to_string(opts.timeout.count()) + " ms");
    }
    return p->status.is_ok() ? unavailable("peer group: the body of chunk " + ref.hash.hex() + " did not arrive")
                             : p->status;
  }
  if (p->bytes != ref.length || hash_bytes(dst, ref.length) != ref.hash) {
    ++bad_bodies;
    CAIRN_LOG_WARN("peers: member {} sent chunk {} with wrong bytes ({} of {} bytes): dropped", holder,
                   ref.hash.hex(), p->bytes, ref.length);
    return corruption("peer group: chunk " + ref.hash.hex() + " from " + holder + " fails its hash");
  }
  return Status::ok();
}

// ---- lookups ahead ----

void PeerService::Impl::look_ahead(std::span<const ChunkRef* const> refs) {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu);
    const auto now = PClock::now();
    for (const ChunkRef* r : refs)
      if (ahead_wanted.insert(r->hash).second) ahead_queue.emplace_back(*r, now);
    send_ahead(out);
  }
  send(out);
}

void PeerService::Impl::send_ahead(std::vector<Outgoing>& out) {
  constexpr size_t kPerFrame = 400;  // ~100 bytes a lookup: well inside a control frame
  std::map<std::string, json> per_home;
  const auto now = PClock::now();
  while (ahead.size() < kAheadWindow && !ahead_queue.empty()) {
    const ChunkRef ref = ahead_queue.front().first;
    ahead_queue.pop_front();
    // Fetched already, resident meanwhile, or asked already.
    if (!ahead_wanted.count(ref.hash) || ahead.count(ref.hash)) continue;
    const std::string home_id = home(ref.hash);
    auto m = members.find(home_id);
    if (home_id == self || m == members.end() || !m->second.verified || !m->second.reachable || dram.offset_of(ref.hash)) {
      // Its own directory answers at once; an unverified home is asked when the fetch comes.
      ahead_wanted.erase(ref.hash);
      continue;
    }
    const uint64_t req = add_pending(home_id);
    ahead[ref.hash] = Ahead{req, home_id, now};
    ++ahead_sent;
    per_home[home_id].push_back(json{{"req", req}, {"chunk", ref.hash.hex()}, {"length", ref.length}});
  }
  for (auto& [home_id, list] : per_home)
    for (size_t i = 0; i < list.size(); i += kPerFrame) {
      json part = json::array();
      for (size_t j = i; j < std::min(list.size(), i + kPerFrame); ++j) part.push_back(std::move(list[j]));
      if (auto o = to_member(home_id, PeerMsg::kLookup, json{{"lookups", std::move(part)}})) out.push_back(std::move(*o));
    }
}

void PeerService::Impl::give_back(const ChunkHash& h, const std::string& home_id, const Pending& p,
                                  std::vector<Outgoing>& out) {
  if (!p.done || !p.status.is_ok()) return;
  const auto now = PClock::now();
  if (p.verdict == ChunkDirectory::Verdict::kFetch && !p.holder.empty()) {
    if (home_id == self) deliver_all(directory.fetch_done(h, p.holder, self, now), out);
    else if (auto o = to_member(home_id, PeerMsg::kFetched, json{{"chunk", h.hex()}, {"holder", p.holder}}))
      out.push_back(std::move(*o));
  } else if (p.verdict == ChunkDirectory::Verdict::kLoad) {
    if (home_id == self) deliver_all(directory.load_failed(h, self, now), out);
    else if (auto o = to_member(home_id, PeerMsg::kLoaded, json{{"chunk", h.hex()}, {"ok", false}}))
      out.push_back(std::move(*o));
  }
}

void PeerService::Impl::expire_ahead(PClock::time_point now, std::vector<Outgoing>& out) {
  const auto limit = 2 * opts.timeout;
  while (!ahead_queue.empty() && now - ahead_queue.front().second > limit) {
    if (!ahead.count(ahead_queue.front().first.hash)) ahead_wanted.erase(ahead_queue.front().first.hash);
    ahead_queue.pop_front();
  }
  for (auto it = ahead.begin(); it != ahead.end();) {
    if (now - it->second.sent <= limit) {
      ++it;
      continue;
    }
    ++ahead_expired;
    if (auto p = pendings.find(it->second.req); p != pendings.end()) {
      give_back(it->first, it->second.home, p->second, out);
      pendings.erase(p);  // a verdict that comes later is given back on arrival (peer_messages.cpp)
    }
    ahead_wanted.erase(it->first);
    it = ahead.erase(it);
  }
  send_ahead(out);
}

}  // namespace cairn
