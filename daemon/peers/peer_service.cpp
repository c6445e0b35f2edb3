// The peer service (peer_service.hpp): the protocol between the members of a job's group, the chunk
// source the tier manager asks before the repository, and `cairn peers`.
#include "daemon/peers/peer_service.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/hash.hpp"
#include "core/log.hpp"
#include "daemon/peers/crypto.hpp"
#include "daemon/peers/directory.hpp"
#include "daemon/peers/membership.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "policy/placement.hpp"
#include "tiers/pfs/manifest.hpp"
#include "tiers/peer/fabric.hpp"

namespace cairn {

using json = nlohmann::json;
using PClock = std::chrono::steady_clock;

namespace {

const char* verdict_name(ChunkDirectory::Verdict v) {
  switch (v) {
    case ChunkDirectory::Verdict::kFetch: return "fetch";
    case ChunkDirectory::Verdict::kLoad: return "load";
    case ChunkDirectory::Verdict::kWait: return "wait";
  }
  return "?";
}

// One member other than this one.
struct Member {
  MemberInfo info;
  uint64_t handle = 0;
  bool reachable = false;     // in the address vector
  bool verified = false;      // answered this member's challenge
  std::string nonce;          // the challenge this member sent it
  PClock::time_point hello_at{};
  uint64_t bytes_sent = 0, bytes_received = 0, chunks_served = 0, chunks_fetched = 0, refused = 0;
};

// A reader waiting for an answer (a lookup's verdict, a body).
struct Pending {
  bool done = false;
  Status status;
  ChunkDirectory::Verdict verdict = ChunkDirectory::Verdict::kWait;
  std::string holder;
  std::string target;  // the member it waits on (gone -> fails at once)
  size_t bytes = 0;
};

}  // namespace

struct PeerService::Impl {
  Options opts;
  DramTier& dram;
  std::unique_ptr<Fabric> fabric;
  std::unique_ptr<Membership> membership;
  std::string self;
  std::string secret;
  bool corrupt_bodies = false;  // CAIRN_PEERS_FAULT=corrupt_bodies: a test's faulty holder

  mutable std::mutex mu;
  std::condition_variable cv;           // pendings, expect
  std::map<std::string, Member> members;  // GUARDED_BY(mu), without self
  std::vector<std::string> ids;           // GUARDED_BY(mu): live member ids, self included, sorted
  ChunkDirectory directory;               // GUARDED_BY(mu)
  std::unordered_map<uint64_t, Pending> pendings;  // GUARDED_BY(mu)
  uint64_t next_request = 1;              // GUARDED_BY(mu)
  uint64_t refused_frames = 0;            // GUARDED_BY(mu)
  uint64_t fetched_chunks = 0, fetched_bytes = 0, served_chunks = 0, served_bytes = 0, bad_bodies = 0,
           loads_assigned = 0, peer_timeouts = 0;  // GUARDED_BY(mu)
  PClock::time_point last_refusal_log{};

  // Holder announcements from the DRAM tier's hook, sent by the service thread.
  std::mutex announce_mu;
  std::condition_variable announce_cv;
  std::vector<std::pair<ChunkHash, bool>> announcements;  // GUARDED_BY(announce_mu)
  bool rescan = false, stopping = false;                   // GUARDED_BY(announce_mu)
  std::thread service;
  std::atomic<uint64_t> seq{1};

  Impl(const Options& o, DramTier& d) : opts(o), dram(d), directory(o.timeout) {}

  // ---- sending ----

  struct Outgoing {
    uint64_t handle;
    std::string to;
    std::vector<uint8_t> frame;
  };

  Outgoing make(const std::string& to, uint64_t handle, PeerMsg type, json body) {
    PeerMessage m;
    m.type = type;
    m.seq = seq++;
    m.from = self;
    m.body = std::move(body);
    return Outgoing{handle, to, encode_peer_message(m, secret)};
  }
  // REQUIRES: mu held. An outgoing message to a member, or nothing if it is not reachable.
  std::optional<Outgoing> to_member(const std::string& id, PeerMsg type, json body) {
    auto it = members.find(id);
    if (it == members.end() || !it->second.reachable) return std::nullopt;
    return make(id, it->second.handle, type, std::move(body));
  }
  void send(std::vector<Outgoing>& out) {
    for (Outgoing& o : out) {
      Status st = fabric->send_control(o.handle, o.frame);
      if (!st.is_ok()) CAIRN_LOG_DEBUG("peers: sending to {}: {}", o.to, st.to_string());
    }
    out.clear();
  }

  // REQUIRES: mu held. An answer of the directory goes to its requester: this member's own
  // pending request, or a lookup_reply message.
  void deliver(const ChunkDirectory::Answer& a, std::vector<Outgoing>& out) {
    if (a.verdict == ChunkDirectory::Verdict::kLoad) ++loads_assigned;
    if (a.requester == self) {
      auto it = pendings.find(a.request);
      if (it == pendings.end()) {
        // The reader gave up; release what the answer handed out.
        if (a.verdict == ChunkDirectory::Verdict::kFetch) directory.fetch_done(a.chunk, a.holder);
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
  void deliver_all(const std::vector<ChunkDirectory::Answer>& answers, std::vector<Outgoing>& out) {
    for (const auto& a : answers) deliver(a, out);
  }

  std::string home(const ChunkHash& h) const { return home_of(h, ids); }

  // ---- receiving (on the fabric's progress thread; never blocks) ----

  void on_message(std::span<const uint8_t> frame) {
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
      if (!mem.reachable) {
        auto h = fabric->add_peer(address);
        if (!h.is_ok()) return;
        mem.handle = *h;
        mem.reachable = true;
        mem.info.address = address;
      }
      std::string nonce;
      if (!from_hex(b["nonce"].get<std::string>(), nonce)) return;
      std::string answer = hmac_sha256(secret, nonce + "|" + self + "|" + m.from);
      out.push_back(make(m.from, mem.handle, PeerMsg::kHelloReply,
                         json{{"nonce", to_hex(nonce)}, {"answer", to_hex(answer)}}));
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
        if (h && b.contains("holder") && b["holder"].is_string()) directory.fetch_done(*h, b["holder"].get<std::string>());
        break;
      }
      case PeerMsg::kLoaded: {
        auto h = chunk_of(b.value("chunk", json()));
        if (h && !b.value("ok", false)) deliver_all(directory.load_failed(*h, m.from, now), out);
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
  void serve_get(Member& mem, const json& b, std::vector<Outgoing>& out) {
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
    const uint64_t handle = mem.handle;
    const json req = b["req"];
    // Sent once the lock is released (a fabric call never runs under mu).
    bodies.push_back([this, handle, tag, src, length, hash, copy, to, req] {
      Status st = fabric->send_body(handle, tag, src, length, [this, hash, copy](const Status& s, size_t) {
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
  std::vector<std::function<void()>> bodies;  // GUARDED_BY(mu): body sends queued by serve_get

  // REQUIRES: mu held. Greets a member: a challenge it must answer with the secret.
  void greet(Member& mem, std::vector<Outgoing>& out) {
    if (!mem.reachable) return;
    if (mem.nonce.empty()) mem.nonce = random_bytes(16);
    mem.hello_at = PClock::now();
    out.push_back(make(mem.info.id, mem.handle, PeerMsg::kHello,
                       json{{"nonce", to_hex(mem.nonce)}, {"address", to_hex(fabric->address())}}));
  }

  // REQUIRES: mu held. A member is gone: out of the directory, its readers' waits end.
  void forget(const std::string& id, std::vector<Outgoing>& out) {
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
  }

  // ---- the service thread: announcements, membership ----

  void announce(const ChunkHash& h, bool resident) {
    {
      std::lock_guard lock(announce_mu);
      announcements.emplace_back(h, resident);
    }
    announce_cv.notify_all();
  }

  void flush_announcements(std::vector<std::pair<ChunkHash, bool>>& batch) {
    std::vector<Outgoing> out;
    std::lock_guard lock(mu);
    std::map<std::string, std::pair<json, json>> per_home;  // home -> (have, drop)
    auto now = PClock::now();
    for (const auto& [h, resident] : batch) {
      std::string home_id = home(h);
      if (home_id == self) {
        if (resident) deliver_all(directory.add_holder(h, self, now), out);
        else directory.remove_holder(h, self);
        continue;
      }
      auto& [have, drop] = per_home[home_id];
      (resident ? have : drop).push_back(h.hex());
    }
    for (auto& [home_id, lists] : per_home) {
      // At most ~1,500 hashes a frame (64 KiB).
      for (int kind = 0; kind < 2; ++kind) {
        json& list = kind == 0 ? lists.first : lists.second;
        if (list.is_null()) continue;
        for (size_t i = 0; i < list.size(); i += 1000) {
          json part = json::array();
          for (size_t j = i; j < std::min(list.size(), i + 1000); ++j) part.push_back(list[j]);
          if (auto o = to_member(home_id, kind == 0 ? PeerMsg::kHave : PeerMsg::kDrop, json{{"chunks", part}}))
            out.push_back(std::move(*o));
        }
      }
    }
    batch.clear();
    send_unlocked_later(out);
  }
  std::vector<Outgoing> deferred;  // GUARDED_BY(mu)
  void send_unlocked_later(std::vector<Outgoing>& out) {
    for (auto& o : out) deferred.push_back(std::move(o));
    out.clear();
  }
  void send_deferred() {
    std::vector<Outgoing> out;
    {
      std::lock_guard lock(mu);
      out.swap(deferred);
    }
    send(out);
  }

  void scan() {
    std::vector<MemberInfo> live = membership->scan();
    (void)membership->heartbeat();
    std::vector<Outgoing> out;
    std::vector<ChunkHash> reannounce;
    {
      std::lock_guard lock(mu);
      std::vector<std::string> now_ids;
      for (const MemberInfo& m : live) now_ids.push_back(m.id);
      std::sort(now_ids.begin(), now_ids.end());
      // Members gone from the directory (left, died, stale heartbeat).
      std::vector<std::string> gone;
      for (const auto& [id, mem] : members)
        if (!std::binary_search(now_ids.begin(), now_ids.end(), id)) gone.push_back(id);
      for (const std::string& id : gone) {
        CAIRN_LOG_INFO("peers: member {} is gone", id);
        forget(id, out);
      }
      // New members: reach them and challenge them.
      for (const MemberInfo& m : live) {
        if (m.id == self) continue;
        Member& mem = members[m.id];
        mem.info = m;
        if (!mem.reachable) {
          auto h = fabric->add_peer(m.address);
          if (!h.is_ok()) {
            CAIRN_LOG_WARN("peers: member {} at {}: {}", m.id, m.host, h.status().to_string());
            continue;
          }
          mem.handle = *h;
          mem.reachable = true;
        }
        if (!mem.verified && PClock::now() - mem.hello_at > std::chrono::milliseconds(500)) greet(mem, out);
      }
      if (now_ids != ids) {
        std::vector<std::string> old = ids;
        ids = now_ids;
        (void)directory.take_moved(ids, self);
        for (const ChunkHash& h : dram.resident_chunks())
          if (home_of(h, old) != home_of(h, ids)) reannounce.push_back(h);
      }
    }
    send(out);
    for (const ChunkHash& h : reannounce) announce(h, true);
  }

  void service_loop() {
    auto period = std::max(std::chrono::milliseconds(50), opts.timeout / 4);
    auto next_scan = PClock::now() + period;
    std::vector<std::pair<ChunkHash, bool>> batch;
    while (true) {
      bool do_scan = false;
      {
        std::unique_lock lock(announce_mu);
        announce_cv.wait_until(lock, next_scan, [&] { return stopping || rescan || !announcements.empty(); });
        if (stopping) return;
        batch.swap(announcements);
        do_scan = rescan || PClock::now() >= next_scan;
        rescan = false;
      }
      if (!batch.empty()) flush_announcements(batch);
      send_deferred();
      if (do_scan) {
        scan();
        {
          std::vector<Outgoing> out;
          std::lock_guard lock(mu);
          deliver_all(directory.expire(PClock::now()), out);
          send_unlocked_later(out);
        }
        send_deferred();
        next_scan = PClock::now() + period;
      }
    }
  }

  // ---- reading ----

  // REQUIRES: mu held.
  uint64_t add_pending(const std::string& target) {
    uint64_t req = next_request++;
    pendings[req].target = target;
    return req;
  }
  // Waits for a pending request; returns it (removed) or nullopt on timeout (removed too).
  std::optional<Pending> wait(std::unique_lock<std::mutex>& lock, uint64_t req, PClock::time_point deadline) {
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

  Status fetch(const ChunkRef& ref, void* dst) {
    Status last = not_found("peer group: no other member holds chunk " + ref.hash.hex());
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::unique_lock lock(mu);
      const std::string home_id = home(ref.hash);
      if (home_id.empty()) return last;
      // 1. Ask the chunk's home (this member's own directory when it is the home).
      uint64_t req = add_pending(home_id);
      std::vector<Outgoing> out;
      if (home_id == self) {
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
      if (!answer->status.is_ok()) return answer->status;
      if (answer->verdict != ChunkDirectory::Verdict::kFetch || answer->holder.empty() || answer->holder == self)
        return not_found("peer group: this member reads chunk " + ref.hash.hex() + " from the repository for the job");
      // 2. Fetch the body from the holder, straight into dst.
      const std::string holder = answer->holder;
      Status st = fetch_from(lock, holder, ref, dst);
      // 3. Tell the home the fetch is over (its load count for the holder).
      out.clear();
      if (home_id == self) directory.fetch_done(ref.hash, holder);
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
  Status fetch_from(std::unique_lock<std::mutex>& lock, const std::string& holder, const ChunkRef& ref, void* dst) {
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

  size_t verified_count() const {
    size_t n = 0;
    for (const auto& [id, m] : members) n += m.verified;
    return n;
  }
};

namespace {

class PeerSource final : public ChunkSource {
 public:
  explicit PeerSource(PeerService& service) : service_(service) {}
  const std::string& name() const override { return name_; }
  bool has(const ChunkRef&) const override { return service_.has_members(); }
  Status read(const ChunkRef& ref, void* dst) override {
    auto t0 = PClock::now();
    Status st = service_.fetch(ref, dst);
    if (st.is_ok()) bw_.sample(ref.length, std::chrono::duration<double>(PClock::now() - t0).count());
    return st;
  }
  double cost(uint64_t bytes) const override { return bw_.seconds_for(bytes); }

 private:
  PeerService& service_;
  const std::string name_ = "peer";
  MeasuredBandwidth bw_{1e9};
};

}  // namespace

Result<std::unique_ptr<PeerService>> PeerService::start(const Options& options, DramTier& dram) {
  auto impl = std::make_unique<Impl>(options, dram);
  if (const char* f = std::getenv("CAIRN_PEERS_FAULT"); f && std::strcmp(f, "corrupt_bodies") == 0) {
    impl->corrupt_bodies = true;
    CAIRN_LOG_WARN("peers: CAIRN_PEERS_FAULT=corrupt_bodies: every chunk this member sends is corrupted (tests only)");
  }
  FabricOptions fo;
  fo.provider = options.provider;
  fo.address = options.address;
  auto fabric = Fabric::open(fo);
  if (!fabric.is_ok()) return fabric.status().with_context("peers: opening the fabric");
  impl->fabric = std::move(fabric).value();
  CAIRN_RETURN_IF_ERROR(impl->fabric->register_region(dram.base(), dram.arena_size()));
  auto joined = Membership::join(options.rendezvous, options.job, impl->fabric->address(), options.timeout);
  if (!joined.is_ok()) return joined.status().with_context("peers: joining job " + options.job);
  impl->membership = std::move(joined).value();
  impl->self = impl->membership->self().id;
  impl->secret = impl->membership->secret();
  impl->ids = {impl->self};
  Impl* raw = impl.get();
  raw->fabric->set_control_handler([raw](std::span<const uint8_t> frame) { raw->on_message(frame); });
  std::unique_ptr<PeerService> service(new PeerService(std::move(impl)));
  dram.set_residency_hook([raw](const ChunkHash& h, bool resident) { raw->announce(h, resident); });
  raw->scan();
  // Chunks already resident (none at a normal start) are announced by the scan's re-announcement.
  raw->service = std::thread([raw] { raw->service_loop(); });
  CAIRN_LOG_INFO("peers: member {} of job {} at {} ({}), rendezvous {}", raw->self, options.job,
                 raw->fabric->address_text(), raw->fabric->provider(), raw->membership->directory());
  if (options.expect > 1) {
    std::unique_lock lock(raw->mu);
    auto deadline = PClock::now() + options.timeout;
    raw->cv.wait_until(lock, deadline, [&] { return raw->verified_count() + 1 >= options.expect; });
    if (raw->verified_count() + 1 < options.expect)
      CAIRN_LOG_WARN("peers: {} of the {} expected members are there after {} ms; going on", raw->verified_count() + 1,
                     options.expect, options.timeout.count());
  }
  return service;
}

PeerService::PeerService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PeerService::~PeerService() {
  Impl& s = *impl_;
  s.dram.set_residency_hook({});
  {
    std::lock_guard lock(s.announce_mu);
    s.stopping = true;
  }
  s.announce_cv.notify_all();
  if (s.service.joinable()) s.service.join();
  std::vector<Impl::Outgoing> out;
  {
    std::lock_guard lock(s.mu);
    for (auto& [id, m] : s.members)
      if (m.reachable && m.verified) out.push_back(s.make(id, m.handle, PeerMsg::kBye, json::object()));
  }
  s.send(out);
  if (s.membership) s.membership->leave();
  // A moment for the goodbyes to leave before the endpoint closes.
  if (!s.members.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.fabric.reset();
}

std::unique_ptr<ChunkSource> PeerService::source() { return std::make_unique<PeerSource>(*this); }

Status PeerService::fetch(const ChunkRef& ref, void* dst) { return impl_->fetch(ref, dst); }

bool PeerService::has_members() const {
  std::lock_guard lock(impl_->mu);
  return impl_->verified_count() > 0;
}

json PeerService::status() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  json members = json::array();
  members.push_back({{"id", s.self},
                     {"self", true},
                     {"host", s.membership->self().host},
                     {"pid", s.membership->self().pid},
                     {"address", s.fabric->address_text()},
                     {"state", "self"}});
  for (const auto& [id, m] : s.members)
    members.push_back({{"id", id},
                       {"self", false},
                       {"host", m.info.host},
                       {"pid", m.info.pid},
                       {"state", m.verified ? "verified" : (m.reachable ? "greeting" : "unreachable")},
                       {"bytes_sent", m.bytes_sent},
                       {"bytes_received", m.bytes_received},
                       {"chunks_served", m.chunks_served},
                       {"chunks_fetched", m.chunks_fetched},
                       {"refused", m.refused}});
  return json{{"enabled", true},
              {"job", s.opts.job},
              {"rendezvous", s.membership->directory()},
              {"provider", s.fabric->provider()},
              {"self", s.self},
              {"members", members},
              {"directory_entries", s.directory.entries()},
              {"fetched_chunks", s.fetched_chunks},
              {"fetched_bytes", s.fetched_bytes},
              {"served_chunks", s.served_chunks},
              {"served_bytes", s.served_bytes},
              {"bad_bodies", s.bad_bodies},
              {"loads_assigned", s.loads_assigned},
              {"timeouts", s.peer_timeouts},
              {"refused_frames", s.refused_frames},
              {"fabric", s.fabric->stats()}};
}

}  // namespace cairn
