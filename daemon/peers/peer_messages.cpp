// The messages from other members of the group (peer_service_impl.hpp): the challenge, lookups
// answered from this member's part of the chunk directory, holder announcements, body requests,
// goodbyes. They run on the fabric's progress thread and never block.
#include <array>
#include <cstdint>
#include <memory>

#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_bodies.hpp"
#include "daemon/peers/peer_service_impl.hpp"

namespace cairn {

using json = nlohmann::json;
using PClock = std::chrono::steady_clock;
using Member = PeerService::Impl::Member;
using Pending = PeerService::Impl::Pending;
using Outgoing = PeerService::Impl::Outgoing;

namespace {

const char* verdict_name(ChunkDirectory::Verdict v) {
  switch (v) {
    case ChunkDirectory::Verdict::kFetch:
      return "fetch";
    case ChunkDirectory::Verdict::kLoad:
      return "load";
    case ChunkDirectory::Verdict::kWait:
      return "wait";
  }
  return "?";
}

// A body's decoded value, or nullopt when its decoder refused it (counted and logged as malformed).
template <class T>
std::optional<T> readable(PeerService::Impl& s, const PeerMessage& m, Result<T> r) CAIRN_REQUIRES(s.mu) {
  if (r.ok()) return std::move(r).value();
  s.malformed(m, r.status());
  return std::nullopt;
}

}  // namespace

// An answer of the directory goes to its requester: this member's own
// pending request, or a lookup_reply message.
void PeerService::Impl::deliver(const ChunkDirectory::Answer& a, std::vector<Outgoing>& out) {
  if (a.verdict == ChunkDirectory::Verdict::kLoad) ++loads_assigned;
  if (a.requester == self) {
    auto it = pendings.find(a.request);
    if (it == pendings.end()) {
      // The reader gave up; release what the answer handed out.
      if (a.verdict == ChunkDirectory::Verdict::kFetch)
        deliver_all(directory.fetch_done(a.chunk, a.holder, self, PClock::now()), out);
      else if (a.verdict == ChunkDirectory::Verdict::kLoad)
        deliver_all(directory.load_failed(a.chunk, self, PClock::now()), out);
      return;
    }
    it->second.done = true;
    it->second.verdict = a.verdict;
    it->second.holder = a.holder;
    cv.notify_all();
    return;
  }
  if (auto o = to_member(a.requester, PeerMsg::kLookupReply,
                         json{{"req", a.request},
                              {"chunk", a.chunk.hex()},
                              {"verdict", verdict_name(a.verdict)},
                              {"holder", a.holder}}))
    out.push_back(std::move(*o));
}

bool PeerService::Impl::admit(const PeerMessage& m) {
  const char* why = nullptr;
  if (m.to != self) {
    ++misaddressed_frames;
    why = "it is addressed to another member";
  } else {
    const ReplayWindow::Verdict v = replay.accept(m.from, m.seq);
    if (v == ReplayWindow::Verdict::kNew) return true;
    ++replayed_frames;
    why = replay_verdict_name(v);
  }
  if (auto it = members.find(m.from); it != members.end()) {
    ++it->second.refused;
    ++it->second.replayed;
  }
  const auto now = PClock::now();
  if (now - last_replay_log > std::chrono::seconds(5)) {
    last_replay_log = now;
    CAIRN_LOG_WARN(
        "peers: refused a {} message from member {} (seq {}, to {}): {}; a replayed or misdirected frame "
        "(replayed: {}, misaddressed: {} so far)",
        peer_msg_name(m.type), m.from, m.seq, m.to, why, replayed_frames, misaddressed_frames);
  }
  return false;
}

void PeerService::Impl::malformed(const PeerMessage& m, const Status& why) {
  ++malformed_bodies;
  if (auto it = members.find(m.from); it != members.end()) ++it->second.refused;
  const auto now = PClock::now();
  if (now - last_malformed_log > std::chrono::seconds(5)) {
    last_malformed_log = now;
    CAIRN_LOG_WARN("peers: member {} sent a message this daemon cannot read (seq {}): {}", m.from, m.seq,
                   why.message());
  }
}

void PeerService::Impl::on_message(std::span<const uint8_t> frame) {
  auto decoded = decode_peer_message(frame, secret);
  std::vector<Outgoing> out;
  cairn::MutexLock lock(mu);
  if (!decoded.ok()) {
    ++refused_frames;
    auto now = PClock::now();
    if (now - last_refusal_log > std::chrono::seconds(5)) {
      last_refusal_log = now;
      CAIRN_LOG_WARN("peers: refused a message that is not from a member of job {}: {}", opts.job,
                     decoded.status().message());
    }
    return;
  }
  PeerMessage& m = decoded.value();
  if (!admit(m)) return;
  // Every body is decoded field by field (peer_bodies.hpp) before it is acted on; one that fails is
  // dropped, counted and logged. (A multi-part message's body is decoded on the service thread.)
  auto it = members.find(m.from);
  if (m.type == PeerMsg::kHello) {
    // A member proving itself, maybe one that joined after this member's last scan.
    auto decoded_hello = readable(*this, m, decode_hello(m.body));
    if (!decoded_hello) return;
    const HelloBody& hello = *decoded_hello;
    if (it == members.end()) {
      it = members.emplace(m.from, Member{}).first;
      it->second.info.id = m.from;
    }
    Member& mem = it->second;
    if (!mem.reachable && !reach(mem, hello.address)) return;
    std::string answer = hmac_sha256(secret, hello.nonce + "|" + self + "|" + m.from);
    // The answer goes over the data endpoint: that connection is then up before the first chunk.
    out.push_back(make(m.from, mem.data_handle, PeerMsg::kHelloReply,
                       json{{"nonce", to_hex(hello.nonce)}, {"answer", to_hex(answer)}}));
    out.back().via_data = true;
    if (mem.nonce.empty()) greet(mem, out);
    {
      cairn::MutexLock al(announce_mu);
      rescan = true;
    }
    announce_cv.notify_all();
    lock.unlock();
    send(out);
    return;
  }
  if (it == members.end()) return;  // not greeted yet: its hello comes first
  Member& mem = it->second;
  if (m.type == PeerMsg::kHelloReply) {
    auto reply = readable(*this, m, decode_hello_reply(m.body));
    if (!reply) return;
    if (!mem.nonce.empty() && reply->nonce == mem.nonce &&
        same_mac(reply->answer, hmac_sha256(secret, mem.nonce + "|" + m.from + "|" + self))) {
      if (!mem.verified) CAIRN_LOG_INFO("peers: member {} ({}) verified", m.from, mem.info.host);
      mem.verified = true;
      cv.notify_all();
    } else {
      ++mem.refused;
      CAIRN_LOG_WARN("peers: member {} answered the challenge wrongly; not serving it", m.from);
    }
    return;
  }
  if (!mem.verified) {
    // Serve nothing before the challenge is answered; greet again in case the hello was lost.
    ++mem.refused;
    if (m.type == PeerMsg::kLookup)
      if (auto q = readable(*this, m, decode_lookup(m.body)))
        out.push_back(make(m.from, mem.handle, PeerMsg::kLookupReply,
                           json{{"req", q->req}, {"verdict", "load"}, {"holder", ""}}));
    if (m.type == PeerMsg::kGet)
      if (auto g = readable(*this, m, decode_get(m.body)))
        out.push_back(
            make(m.from, mem.handle, PeerMsg::kGetReply, json{{"req", g->req}, {"error", "not verified yet"}}));
    if (PClock::now() - mem.hello_at > std::chrono::milliseconds(200)) greet(mem, out);
    lock.unlock();
    send(out);
    return;
  }
  handle_verified(mem, m, out);
  std::vector<std::function<void()>> to_send;
  to_send.swap(bodies);
  if (fault_late_bodies) {
    for (auto& f : to_send) delayed_bodies.emplace_back(PClock::now() + opts.timeout * 3 / 2, std::move(f));
    to_send.clear();
  }
  lock.unlock();
  send(out);
  for (auto& f : to_send) f();
}

void PeerService::Impl::handle_verified(Member& mem, PeerMessage& m, std::vector<Outgoing>& out) {
  auto now = PClock::now();
  switch (m.type) {
    case PeerMsg::kLookup: {
      auto q = readable(*this, m, decode_lookup(m.body));
      if (!q) break;
      auto a = directory.lookup(q->chunk, m.from, q->req, now);
      if (a.verdict != ChunkDirectory::Verdict::kWait) deliver(a, out);
      break;
    }
    case PeerMsg::kLookupReply: {
      auto decoded_reply = readable(*this, m, decode_lookup_reply(m.body));
      if (!decoded_reply) break;
      const LookupReplyBody& r = *decoded_reply;
      auto p = pendings.find(r.req);
      if (p == pendings.end()) {
        // Too late: the reader gave up. A fetch slot it was given goes back to the home; a load it
        // was told to do, the home hands on.
        if (r.chunk && r.verdict == ChunkDirectory::Verdict::kFetch)
          out.push_back(
              make(m.from, mem.handle, PeerMsg::kFetched, json{{"chunk", r.chunk->hex()}, {"holder", r.holder}}));
        if (r.chunk && r.verdict == ChunkDirectory::Verdict::kLoad)
          out.push_back(make(m.from, mem.handle, PeerMsg::kLoaded, json{{"chunk", r.chunk->hex()}, {"ok", false}}));
        break;
      }
      p->second.done = true;
      p->second.verdict = r.verdict;
      p->second.holder = r.holder;
      cv.notify_all();
      break;
    }
    case PeerMsg::kHave:
    case PeerMsg::kDrop: {
      auto list = readable(*this, m, decode_chunks(m.type, m.body));
      if (!list) break;
      for (const ChunkHash& h : list->chunks) {
        if (m.type == PeerMsg::kHave)
          deliver_all(directory.add_holder(h, m.from, now), out);
        else
          directory.remove_holder(h, m.from);
      }
      break;
    }
    case PeerMsg::kGet:
      if (auto g = readable(*this, m, decode_get(m.body))) serve_get(mem, *g, out);
      break;
    case PeerMsg::kGetReply: {
      auto r = readable(*this, m, decode_get_reply(m.body));
      if (!r) break;
      auto p = pendings.find(r->req);
      if (p == pendings.end() || p->second.done) break;
      p->second.done = true;
      p->second.status = unavailable("peer " + m.from + " did not send the chunk: " + r->error);
      cv.notify_all();
      break;
    }
    case PeerMsg::kFetched: {
      if (auto f = readable(*this, m, decode_fetched(m.body)))
        deliver_all(directory.fetch_done(f->chunk, f->holder, m.from, now), out);
      break;
    }
    case PeerMsg::kLoaded: {
      auto l = readable(*this, m, decode_loaded(m.body));
      if (l && !l->ok) deliver_all(directory.load_failed(l->chunk, m.from, now), out);
      break;
    }
    case PeerMsg::kCommit: {
      // A model committed on that member: into the job's catalog, on the service thread.
      auto model = readable(*this, m, decode_commit(m.body));
      if (!model) break;
      ++models_received;
      {
        cairn::MutexLock al(announce_mu);
        incoming_models.emplace_back(std::move(*model), m.from);
      }
      announce_cv.notify_all();
      break;
    }
    case PeerMsg::kStage:
      if (auto st = readable(*this, m, decode_stage(m.body))) serve_stage(mem, *st);
      break;
    case PeerMsg::kStageReply:
      if (auto r = readable(*this, m, decode_stage_reply(m.body))) stage_replied(*r);
      break;
    case PeerMsg::kPart:
    case PeerMsg::kPartState:
    case PeerMsg::kAssemble:
    case PeerMsg::kPartAck: {
      // A multi-part model across the group: handled on the service thread, in order.
      {
        cairn::MutexLock al(announce_mu);
        incoming_parts.push_back({m.type, std::move(m.body), m.from});
      }
      announce_cv.notify_all();
      break;
    }
    case PeerMsg::kBye: {
      CAIRN_LOG_INFO("peers: member {} ({}) left", m.from, mem.info.host);
      forget(m.from, out);
      break;
    }
    default:
      break;
  }
}

// A verified member asks for a chunk's body: send it from the arena, pinned
// until the send completes.
void PeerService::Impl::serve_get(Member& mem, const GetBody& g, std::vector<Outgoing>& out) {
  const uint64_t tag = g.tag;
  const uint64_t length = g.length;
  const json req = g.req;
  auto refuse = [&](const std::string& why) {
    out.push_back(make(mem.info.id, mem.handle, PeerMsg::kGetReply, json{{"req", req}, {"error", why}}));
  };
  uint64_t held = 0;
  auto off = dram.pin_if_resident(g.chunk, &held);
  if (!off) return refuse("not held any more");
  if (held != length) {
    // Never send past the chunk (another chunk's bytes, or past the arena).
    dram.unpin(g.chunk);
    return refuse("chunk " + g.chunk.hex() + " has " + std::to_string(held) + " bytes here, not " +
                  std::to_string(length));
  }
  const ChunkHash hash = g.chunk;
  const uint8_t* src = dram.base() + *off;
  std::shared_ptr<std::vector<uint8_t>> copy;
  if (corrupt_bodies) {  // the faulty holder of a test: one flipped byte
    copy = std::make_shared<std::vector<uint8_t>>(src, src + length);
    if (!copy->empty()) (*copy)[copy->size() / 2] ^= 0x5a;
    src = copy->data();
  }
  const std::string to = mem.info.id;
  ++mem.chunks_served;
  mem.bytes_sent += length;
  ++served_chunks;
  served_bytes += length;
  const uint64_t handle = mem.handle, data_handle = mem.data_handle;
  // The pin goes with whichever comes first: the send's completion, or its give_up (ServedBody).
  auto released = std::make_shared<std::atomic<bool>>(false);
  serving.push_back({hash, PClock::now() + kServeHoldTimeouts * opts.timeout, released});
  // Sent once the lock is released (a fabric call never runs under mu).
  bodies.push_back([this, handle, data_handle, tag, src, length, hash, copy, to, req, released] {
    Status st = data->send_body(data_handle, tag, src, length, [this, hash, copy, released](const Status& s, size_t) {
      if (!released->exchange(true)) dram.unpin(hash);
      if (!s.ok()) CAIRN_LOG_DEBUG("peers: sending chunk {}: {}", hash.hex(), s.to_string());
    });
    if (!st.ok()) {
      if (!released->exchange(true)) dram.unpin(hash);
      std::vector<Outgoing> o{make(to, handle, PeerMsg::kGetReply, json{{"req", req}, {"error", st.message()}})};
      send(o);
    }
  });
}

void PeerService::Impl::send_delayed_bodies() {
  std::vector<std::function<void()>> due;
  {
    cairn::MutexLock lock(mu);
    const auto now = PClock::now();
    std::erase_if(delayed_bodies, [&](auto& d) {
      if (now < d.first) return false;
      due.push_back(std::move(d.second));
      return true;
    });
  }
  for (auto& f : due) f();
}

void PeerService::Impl::drain_late_body(uint64_t tag) {
  if (fault_no_drain) return;
  auto scratch = std::make_shared<std::array<uint8_t, 64>>();
  Status st = data->post_body_receive(tag, scratch->data(), scratch->size(), [this, scratch](const Status& s, size_t) {
    // A body longer than the scratch completes truncated: taken and dropped, as meant.
    if (s.ok() || s.message().find("cancelled") == std::string::npos) {
      cairn::MutexLock g(mu);
      ++late_bodies_drained;
    }
  });
  if (!st.ok()) {
    CAIRN_LOG_DEBUG("peers: posting the drain of a late body: {}", st.to_string());
    return;
  }
  cairn::MutexLock lock(mu);
  drains.push_back({tag, PClock::now() + kServeHoldTimeouts * opts.timeout});
}

void PeerService::Impl::release_stale_sends() {
  std::vector<ChunkHash> stale;
  std::vector<uint64_t> expired;
  {
    cairn::MutexLock lock(mu);
    const auto now = PClock::now();
    std::erase_if(drains, [&](const Drain& d) {
      if (now < d.give_up) return false;
      expired.push_back(d.tag);
      return true;
    });
    std::erase_if(serving, [&](const ServedBody& b) {
      if (b.released->load()) return true;
      if (now < b.give_up) return false;
      if (!b.released->exchange(true)) stale.push_back(b.hash);
      return true;
    });
    abandoned_sends += stale.size();
  }
  for (uint64_t tag : expired) data->cancel_body_receive(tag);  // a drain that took a body is gone already
  for (const ChunkHash& h : stale) {
    CAIRN_LOG_WARN(
        "peers: the send of chunk {} to a member did not complete in {} ms (the member gave up or "
        "died): its arena space is no longer held for it",
        h.hex(), kServeHoldTimeouts * opts.timeout.count());
    dram.unpin(h);
  }
}

// Greets a member: a challenge it must answer with the secret.
void PeerService::Impl::greet(Member& mem, std::vector<Outgoing>& out) {
  if (!mem.reachable) return;
  if (mem.nonce.empty()) mem.nonce = random_bytes(16);
  mem.hello_at = PClock::now();
  out.push_back(make(mem.info.id, mem.handle, PeerMsg::kHello,
                     json{{"nonce", to_hex(mem.nonce)}, {"address", to_hex(published_address())}}));
}

// A member is gone: out of the directory, its readers' waits end.
void PeerService::Impl::forget(const std::string& id, std::vector<Outgoing>& out) {
  auto it = members.find(id);
  if (it == members.end()) return;
  // Its address stays in the address vector: a reader may hold its handle in a message about to
  // be sent (a send to a dead member fails cleanly; one to a removed fi_addr crashes rxm).
  members.erase(it);
  deliver_all(directory.member_gone(id, PClock::now()), out);
  for (auto& [req, p] : pendings)
    if (!p.done && p.target == id) {
      p.done = true;
      p.status = unavailable("peer " + id + " left the group");
    }
  cv.notify_all();
  {
    cairn::MutexLock al(announce_mu);
    gone_members.push_back(id);
  }
  announce_cv.notify_all();
}

}  // namespace cairn
