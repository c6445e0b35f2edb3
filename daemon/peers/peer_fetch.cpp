// A reader's fetch from the peer group (peer_service_impl.hpp): ask the chunk's home, then receive
// the body from the holder it names straight into arena space, and check it against its hash.
#include <cstring>

#include "core/hash.hpp"
#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_service_impl.hpp"

namespace cairn {

using json = nlohmann::json;
using PClock = std::chrono::steady_clock;
using Member = PeerService::Impl::Member;
using Pending = PeerService::Impl::Pending;
using Outgoing = PeerService::Impl::Outgoing;

// Waits for a pending request; returns it (removed) or nullopt on timeout (removed too).
std::optional<Pending> PeerService::Impl::wait(cairn::MutexLock& lock, uint64_t req, PClock::time_point deadline) {
  bool ok = cv.wait_until(lock, deadline, [&]() CAIRN_REQUIRES(mu) {
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
    cairn::MutexLock lock(mu);
    const std::string home_id = home(ref.hash);
    if (home_id.empty()) return last;
    // 1. Ask the chunk's home (this member's own directory when it is the home).
    uint64_t req = add_pending(home_id);
    std::vector<Outgoing> out;
    if (home_id == self) {
      auto a = directory.lookup(ref.hash, self, req, PClock::now());
      if (a.verdict != ChunkDirectory::Verdict::kWait) deliver(a, out);
    } else {
      auto o =
          to_member(home_id, PeerMsg::kLookup, json{{"req", req}, {"chunk", ref.hash.hex()}, {"length", ref.length}});
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
    if (!answer->status.ok()) return answer->status;
    if (answer->verdict != ChunkDirectory::Verdict::kFetch || answer->holder.empty() || answer->holder == self)
      return not_found("peer group: this member reads chunk " + ref.hash.hex() + " from the repository for the job");
    // 2. Fetch the body from the holder, straight into dst.
    const std::string holder = answer->holder;
    Status st = fetch_from(lock, holder, ref, dst);
    // 3. Tell the home the fetch is over (its load count for the holder).
    out.clear();
    if (home_id == self)
      deliver_all(directory.fetch_done(ref.hash, holder, self, PClock::now()), out);
    else if (auto o = to_member(home_id, PeerMsg::kFetched, json{{"chunk", ref.hash.hex()}, {"holder", holder}}))
      out.push_back(std::move(*o));
    if (st.ok()) {
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
    if (st.ok()) return st;
    last = st;
    if (st.code() == StatusCode::kTimeout) return st;  // the timeout is spent: the repository next
  }
  return last;
}

Status PeerService::Impl::fetch_from(cairn::MutexLock& lock, const std::string& holder, const ChunkRef& ref,
                                     void* dst) {
  auto it = members.find(holder);
  if (it == members.end() || !it->second.reachable)
    return unavailable("peer group: holder " + holder + " of chunk " + ref.hash.hex() + " is gone");
  const uint64_t handle = it->second.handle;
  const uint64_t req = add_pending(holder);
  // A random tag: the body's receive takes a message with this tag from any source, so a process
  // that can reach the data endpoint must not be able to guess it (it would still have to match the
  // chunk's hash). 62 random bits; two requests sharing one is as likely as guessing it.
  uint64_t random_tag = 0;
  std::memcpy(&random_tag, random_bytes(sizeof random_tag).data(), sizeof random_tag);
  const uint64_t tag = Fabric::kBodyTagBit | (random_tag & (Fabric::kBodyTagBit - 1));
  Outgoing get = make(holder, handle, PeerMsg::kGet,
                      json{{"req", req}, {"chunk", ref.hash.hex()}, {"length", ref.length}, {"tag", tag}});
  lock.unlock();
  // The body's completion: the same pending entry as a get_reply refusal; the first one wins.
  auto body_done = std::make_shared<std::atomic<bool>>(false);
  Status posted = data->post_body_receive(tag, dst, ref.length, [this, req, body_done](const Status& s, size_t n) {
    cairn::MutexLock g(mu);
    body_done->store(true);
    auto p = pendings.find(req);
    if (p != pendings.end() && !p->second.done) {
      p->second.done = true;
      p->second.status = s;
      p->second.bytes = n;
    }
    cv.notify_all();
  });
  if (posted.ok()) {
    Status sent = fabric->send_control(handle, get.frame);
    if (!sent.ok()) {
      data->cancel_body_receive(tag);
      posted = sent;
    }
  }
  lock.lock();
  if (!posted.ok()) {
    pendings.erase(req);
    return posted;
  }
  auto p = wait(lock, req, PClock::now() + opts.timeout);
  const bool got_body = p && p->status.ok() && body_done->load();
  if (!got_body) {
    // Make sure the fabric no longer writes into dst before it goes back to the caller.
    lock.unlock();
    data->cancel_body_receive(tag);
    lock.lock();
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return body_done->load(); });
    if (!p) {
      ++peer_timeouts;
      // The holder may still send it: a receive that discards it lets that send complete.
      lock.unlock();
      drain_late_body(tag);
      lock.lock();
      return timed_out("peer group: holder " + holder + " did not send chunk " + ref.hash.hex() + " within " +
                       std::to_string(opts.timeout.count()) + " ms");
    }
    return p->status.ok() ? unavailable("peer group: the body of chunk " + ref.hash.hex() + " did not arrive")
                          : p->status;
  }
  if (p->bytes != ref.length || hash_bytes(dst, ref.length) != ref.hash) {
    ++bad_bodies;
    CAIRN_LOG_WARN("peers: member {} sent chunk {} with wrong bytes ({} of {} bytes): dropped", holder, ref.hash.hex(),
                   p->bytes, ref.length);
    return corruption("peer group: chunk " + ref.hash.hex() + " from " + holder + " fails its hash");
  }
  return Status::OK();
}

}  // namespace cairn
