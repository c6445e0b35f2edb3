// The messages from other members of the group (peer_service_impl.hpp): the challenge, lookups
// answered from this member's part of the chunk directory, holder announcements, body requests,
// goodbyes. They run on the fabric's progress thread and never block.
#include <cstdint>
#include <memory>

#include "daemon/peers/crypto.hpp"
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
    case ChunkDirectory::Verdict::kFetch: return "fetch";
    case ChunkDirectory::Verdict::kLoad: return "load";
    case ChunkDirectory::Verdict::kWait: return "wait";
  }
  return "?";
}

}  // namespace

// REQUIRES: mu held. An answer of the directory goes to its requester: this member's own
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

void PeerService::Impl::on_message(std::span<const uint8_t> frame) {
  auto decoded = decode_peer_message(frame, secret);
  std::vector<Outgoing> out;
  std::unique_lock lock(mu);
  if (!decoded.is_ok()) {
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
  const json& b = m.body;
  auto it = members.find(m.from);
  if (m.type == PeerMsg::kHello) {
    // A member proving itself, maybe one that joined after this member's last scan.
    std::string address;
    if (!b.contains("address") || !b["address"].is_string() || !from_hex(b["address"].get<std::string>(), address) ||
        !b.contains("nonce") || !b["nonce"].is_string())
      return;
    if (it == members.end()) {
      it = members.emplace(m.from, Member{}).first;
      it->second.info.id = m.from;
    }
    Member& mem = it->second;
    if (!mem.reachable && !reach(mem, address)) return;
    std::string nonce;
    if (!from_hex(b["nonce"].get<std::string>(), nonce)) return;
    std::string answer = hmac_sha256(secret, nonce + "|" + self + "|" + m.from);
    // The answer goes over the data endpoint: that connection is then up before the first chunk.
    out.push_back(make(m.from, mem.data_handle, PeerMsg::kHelloReply,
                       json{{"nonce", to_hex(nonce)}, {"answer", to_hex(answer)}}));
    out.back().via_data = true;
    if (mem.nonce.empty()) greet(mem, out);
    {
      std::lock_guard al(announce_mu);
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
    std::string answer;
    if (b.contains("answer") && b["answer"].is_string() && from_hex(b["answer"].get<std::string>(), answer) &&
        !mem.nonce.empty() && same_mac(answer, hmac_sha256(secret, mem.nonce + "|" + m.from + "|" + self))) {
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
    if (m.type == PeerMsg::kLookup && b.contains("req"))
      out.push_back(make(m.from, mem.handle, PeerMsg::kLookupReply,
                         json{{"req", b["req"]}, {"verdict", "load"}, {"holder", ""}}));
    if (m.type == PeerMsg::kGet && b.contains("req"))
      out.push_back(make(m.from, mem.handle, PeerMsg::kGetReply,
                         json{{"req", b["req"]}, {"error", "not verified yet"}}));
    if (PClock::now() - mem.hello_at > std::chrono::milliseconds(200)) greet(mem, out);
    lock.unlock();
    send(out);
    return;
  }
  auto chunk_of = [&](const json& v) -> std::optional<ChunkHash> {
    if (!v.is_string()) return std::nullopt;
    return ChunkHash::from_hex(v.get<std::string>());
  };
  auto now = PClock::now();
  switch (m.type) {
    case PeerMsg::kLookup: {
      auto h = chunk_of(b.value("chunk", json()));
      if (!h || !b.contains("req") || !b["req"].is_number_unsigned()) break;
      auto a = directory.lookup(*h, m.from, b["req"].get<uint64_t>(), now);
      if (a.verdict != ChunkDirectory::Verdict::kWait) deliver(a, out);
      break;
    }
    case PeerMsg::kLookupReply: {
      if (!b.contains("req") || !b["req"].is_number_unsigned()) break;
      auto p = pendings.find(b["req"].get<uint64_t>());
      if (p == pendings.end()) {
        // Too late: the reader gave up. A fetch slot it was given goes back to the home.
        if (b.value("verdict", "") == "fetch" && b.contains("chunk"))
          out.push_back(make(m.from, mem.handle, PeerMsg::kFetched,
                             json{{"chunk", b["chunk"]}, {"holder", b.value("holder", "")}}));
        // A load it was told to do: the home hands it on.
        if (b.value("verdict", "") == "load" && b.contains("chunk"))
          out.push_back(make(m.from, mem.handle, PeerMsg::kLoaded, json{{"chunk", b["chunk"]}, {"ok", false}}));
        break;
      }
      std::string v = b.value("verdict", "");
      p->second.done = true;
      p->second.verdict = v == "fetch" ? ChunkDirectory::Verdict::kFetch
                          : v == "wait" ? ChunkDirectory::Verdict::kWait
                                        : ChunkDirectory::Verdict::kLoad;
      p->second.holder = b.value("holder", "");
      cv.notify_all();
      break;
    }
    case PeerMsg::kHave:
    case PeerMsg::kDrop: {
      if (!b.contains("chunks") || !b["chunks"].is_array()) break;
      for (const json& c : b["chunks"]) {
        auto h = chunk_of(c);
        if (!h) continue;
        if (m.type == PeerMsg::kHave) deliver_all(directory.add_holder(*h, m.from, now), out);
        else directory.remove_holder(*h, m.from);
      }
      break;
    }
    case PeerMsg::kGet: serve_get(mem, b, out); break;
    case PeerMsg::kGetReply: {
      if (!b.contains("req") || !b["req"].is_number_unsigned()) break;
      auto p = pendings.find(b["req"].get<uint64_t>());
      if (p == pendings.end() || p->second.done) break;
      p->second.done = true;
      p->second.status = unavailable("peer " + m.from + " did not send the chunk: " + b.value("error", "?"));
      cv.notify_all();
      break;
    }
    case PeerMsg::kFetched: {
      auto h = chunk_of(b.value("chunk", json()));
      if (h && b.contains("holder") && b["holder"].is_string())
          deliver_all(directory.fetch_done(*h, b["holder"].get<std::string>(), m.from, now), out);
      break;
    }
    case PeerMsg::kLoaded: {
      auto h = chunk_of(b.value("chunk", json()));
      if (h && !b.value("ok", false)) deliver_all(directory.load_failed(*h, m.from, now), out);
      break;
    }
    case PeerMsg::kCommit: {
      // A model committed on that member: into the job's catalog, on the service thread.
      if (!b.contains("model")) break;
      auto model = manifest_from_json(b["model"], /*with_locations=*/false);
      if (!model.is_ok()) {
        CAIRN_LOG_WARN("peers: member {} announced a model this daemon cannot read: {}", m.from,
                       model.status().to_string());
        break;
      }
      ++models_received;
      {
        std::lock_guard al(announce_mu);
        incoming_models.emplace_back(std::move(model).value(), m.from);
      }
      announce_cv.notify_all();
      break;
    }
    case PeerMsg::kStage: serve_stage(mem, b); break;
    case PeerMsg::kStageReply: stage_replied(b); break;
    case PeerMsg::kPart:
    case PeerMsg::kPartState:
    case PeerMsg::kAssemble:
    case PeerMsg::kPartAck: {
      // A multi-part model across the group: decoded and handled on the service thread, in order.
      {
        std::lock_guard al(announce_mu);
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
    default: break;
  }
  std::vector<std::function<void()>> to_send;
  to_send.swap(bodies);
  lock.unlock();
  send(out);
  for (auto& f : to_send) f();
}

// REQUIRES: mu held. A verified member asks for a chunk's body: send it from the arena, pinned
// until the send completes.
void PeerService::Impl::serve_get(Member& mem, const json& b, std::vector<Outgoing>& out) {
  if (!b.contains("req") || !b.contains("tag") || !b.contains("length") || !b["tag"].is_number_unsigned() ||
      !b["length"].is_number_unsigned() || !b.contains("chunk") || !b["chunk"].is_string())
    return;
  auto h = ChunkHash::from_hex(b["chunk"].get<std::string>());
  const uint64_t tag = b["tag"].get<uint64_t>();
  const uint64_t length = b["length"].get<uint64_t>();
  auto refuse = [&](const std::string& why) {
    out.push_back(make(mem.info.id, mem.handle, PeerMsg::kGetReply, json{{"req", b["req"]}, {"error", why}}));
  };
  if (!h || !(tag & Fabric::kBodyTagBit)) return refuse("bad request");
  auto off = dram.pin_if_resident(*h);
  if (!off) return refuse("not held any more");
  const ChunkHash hash = *h;
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
  const json req = b["req"];
  // Sent once the lock is released (a fabric call never runs under mu).
  bodies.push_back([this, handle, data_handle, tag, src, length, hash, copy, to, req] {
    Status st = data->send_body(data_handle, tag, src, length, [this, hash, copy](const Status& s, size_t) {
      dram.unpin(hash);
      if (!s.is_ok()) CAIRN_LOG_DEBUG("peers: sending chunk {}: {}", hash.hex(), s.to_string());
    });
    if (!st.is_ok()) {
      dram.unpin(hash);
      std::vector<Outgoing> o{make(to, handle, PeerMsg::kGetReply, json{{"req", req}, {"error", st.message()}})};
      send(o);
    }
  });
}

// REQUIRES: mu held. Greets a member: a challenge it must answer with the secret.
void PeerService::Impl::greet(Member& mem, std::vector<Outgoing>& out) {
  if (!mem.reachable) return;
  if (mem.nonce.empty()) mem.nonce = random_bytes(16);
  mem.hello_at = PClock::now();
  out.push_back(make(mem.info.id, mem.handle, PeerMsg::kHello,
                     json{{"nonce", to_hex(mem.nonce)}, {"address", to_hex(published_address())}}));
}

// REQUIRES: mu held. A member is gone: out of the directory, its readers' waits end.
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
    std::lock_guard al(announce_mu);
    gone_members.push_back(id);
  }
  announce_cv.notify_all();
}

}  // namespace cairn
