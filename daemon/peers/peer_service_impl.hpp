// Internal to daemon/peers/peer_service*.cpp: the peer service's state and its methods, by file:
//   peer_service.cpp   start and stop, `cairn peers`, the chunk source, the service thread
//                      (announcements to the homes, the membership scan)
//   peer_messages.cpp  the messages from other members (on the fabric's progress thread)
//   peer_fetch.cpp     a reader's fetch: ask the home, receive the body from a holder
// Locking: mu guards the members, the directory and the pending requests; no fabric call and no
// blocking wait is made while holding it, except the readers' waits on cv.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/sync.hpp"
#include "daemon/peers/directory.hpp"
#include "daemon/peers/membership.hpp"
#include "daemon/peers/peer_bodies.hpp"
#include "daemon/peers/peer_service.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "daemon/peers/replay_window.hpp"
#include "policy/placement.hpp"
#include "tiers/peer/fabric.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

struct PeerService::Impl {
  using json = nlohmann::json;
  using PClock = std::chrono::steady_clock;

  // One member other than this one.
  struct Member {
    MemberInfo info;
    uint64_t handle = 0;       // on the control endpoint
    uint64_t data_handle = 0;  // on the data endpoint (chunk bodies)
    bool reachable = false;    // in both address vectors
    bool verified = false;     // answered this member's challenge
    std::string nonce;         // the challenge this member sent it
    PClock::time_point hello_at{};
    uint64_t bytes_sent = 0, bytes_received = 0, chunks_served = 0, chunks_fetched = 0, refused = 0;
    uint64_t replayed = 0;  // its frames refused as replayed, too old or addressed to another member
  };

  // A reader waiting for an answer (a lookup's verdict, a body).
  struct Pending {
    bool done = false;
    Status status;
    ChunkDirectory::Verdict verdict = ChunkDirectory::Verdict::kWait;
    std::string holder;
    std::string target;  // the member it waits on (gone -> fails at once)
    size_t bytes = 0;
    double seconds = 0;  // a stage_reply's
  };

  Options opts;
  DramTier& dram;
  // Where the group's events go (PeerService::start; null until then). Written under stage_mu
  // before the service thread starts; read by that thread and, under stage_mu, by serve_stage.
  PeerEvents* events = nullptr;
  // Two endpoints: control messages and chunk bodies travel on separate connections, so that a
  // lookup's answer never waits behind megabytes of bodies on one TCP stream (over tcp;ofi_rxm that
  // cost a reader milliseconds per chunk). The arena is registered with the data endpoint.
  std::unique_ptr<Fabric> fabric;  // control
  std::unique_ptr<Fabric> data;    // bodies
  std::unique_ptr<Membership> membership;
  std::string self;
  std::string secret;
  // Test hooks (CAIRN_PEERS_FAULT, a comma-separated list; docs/peers.md "Test hooks"), set at start:
  bool corrupt_bodies = false;     // corrupt_bodies: a faulty holder flips a byte of every chunk it sends
  bool fault_replay = false;       // replay: with each frame, resends an earlier one verbatim (to its own
                                   // receiver, and to this frame's receiver when that is another member)
  bool fault_forge = false;        // forge: with each frame, sends a copy altered after signing and one
                                   // signed with another secret
  bool fault_garbage = false;      // garbage_bodies: with each frame, a well-signed frame of the same type
                                   // whose body no decoder accepts, and random bytes (not a frame)
  bool fault_late_bodies = false;  // late_bodies: a holder sends each body 1.5 timeouts late (the
                                   // readers have given up: delayed_bodies, sent by the service thread)
  bool fault_no_drain = false;     // no_drain: a reader that timed out leaves no drain (drain_late_body),
                                   // as one that died: the holder's send never completes

  mutable cairn::Mutex mu;
  cairn::CondVar cv;                                           // pendings, expect
  std::map<std::string, Member> members CAIRN_GUARDED_BY(mu);  // without self
  std::vector<std::string> ids CAIRN_GUARDED_BY(mu);           // live member ids, self included, sorted
  ChunkDirectory directory CAIRN_GUARDED_BY(mu);
  std::unordered_map<uint64_t, Pending> pendings CAIRN_GUARDED_BY(mu);
  uint64_t next_request CAIRN_GUARDED_BY(mu) = 1;
  uint64_t refused_frames CAIRN_GUARDED_BY(mu) = 0;  // failed decode (MAC, malformed)
  // Frames with a good MAC refused: seen before or too old (replay_window.hpp), addressed to another
  // member, or a body its decoder refuses (peer_bodies.hpp, part_messages.hpp).
  uint64_t replayed_frames CAIRN_GUARDED_BY(mu) = 0;
  uint64_t misaddressed_frames CAIRN_GUARDED_BY(mu) = 0;
  uint64_t malformed_bodies CAIRN_GUARDED_BY(mu) = 0;
  ReplayGuard replay CAIRN_GUARDED_BY(mu);  // per sender
  uint64_t fetched_chunks CAIRN_GUARDED_BY(mu) = 0;
  uint64_t fetched_bytes CAIRN_GUARDED_BY(mu) = 0;
  uint64_t served_chunks CAIRN_GUARDED_BY(mu) = 0;
  uint64_t served_bytes CAIRN_GUARDED_BY(mu) = 0;
  uint64_t bad_bodies CAIRN_GUARDED_BY(mu) = 0;
  uint64_t loads_assigned CAIRN_GUARDED_BY(mu) = 0;
  uint64_t peer_timeouts CAIRN_GUARDED_BY(mu) = 0;
  PClock::time_point last_refusal_log CAIRN_GUARDED_BY(mu){};
  PClock::time_point last_replay_log CAIRN_GUARDED_BY(mu){};
  PClock::time_point last_malformed_log CAIRN_GUARDED_BY(mu){};
  // Chunk bodies being sent from the arena, each pinning its chunk until its send completes. Over
  // tcp;ofi_rxm a body past the eager size is a rendezvous that completes only when the receiver
  // matches it, and a receiver that gave up (its timeout, then a cancel) or died never does: the
  // pin would outlive every client. So a send still pending kServeHoldTimeouts peer timeouts after
  // it started gives its pin up (release_stale_sends, on the service thread); whichever of that and
  // the completion comes first unpins, once. A receiver that still read it late would read bytes
  // the arena may have reused, and its hash check drops them (fetch_from).
  struct ServedBody {
    ChunkHash hash;
    PClock::time_point give_up;
    std::shared_ptr<std::atomic<bool>> released;
  };
  static constexpr int kServeHoldTimeouts = 3;
  std::vector<ServedBody> serving CAIRN_GUARDED_BY(mu);
  uint64_t abandoned_sends CAIRN_GUARDED_BY(mu) = 0;  // pins given up by release_stale_sends
  // The receiving side of the same: a reader that timed out leaves a small receive posted for its
  // request's tag, which takes a body that comes late and discards it, so the holder's send
  // completes. Cancelled once past its give_up, with the sends.
  struct Drain {
    uint64_t tag;
    PClock::time_point give_up;
  };
  std::vector<Drain> drains CAIRN_GUARDED_BY(mu);
  uint64_t late_bodies_drained CAIRN_GUARDED_BY(mu) = 0;

  // Holder announcements from the DRAM tier's hook, sent by the service thread.
  cairn::Mutex announce_mu;
  cairn::CondVar announce_cv;
  std::vector<std::pair<ChunkHash, bool>> announcements CAIRN_GUARDED_BY(announce_mu);
  bool rescan CAIRN_GUARDED_BY(announce_mu) = false;
  bool stopping CAIRN_GUARDED_BY(announce_mu) = false;
  // The job's catalog, handed to PeerEvents::model_announced / member_left on the service thread.
  std::vector<std::pair<ModelManifest, std::string>> incoming_models CAIRN_GUARDED_BY(announce_mu);
  std::vector<std::string> gone_members CAIRN_GUARDED_BY(announce_mu);
  // Multi-part messages, handed to PeerEvents::part_message on the service thread.
  struct IncomingPart {
    PeerMsg type;
    json body;
    std::string member;
  };
  std::vector<IncomingPart> incoming_parts CAIRN_GUARDED_BY(announce_mu);
  uint64_t models_announced CAIRN_GUARDED_BY(mu) = 0;
  uint64_t models_received CAIRN_GUARDED_BY(mu) = 0;
  uint64_t models_too_large CAIRN_GUARDED_BY(mu) = 0;
  std::thread service;
  // The next seq of the frames to each member (from 1; the receiver's anti-replay window is per
  // sender, and per-receiver numbering keeps the reordering it must absorb to that pair's).
  cairn::Mutex seq_mu;
  std::unordered_map<std::string, uint64_t> next_seq CAIRN_GUARDED_BY(seq_mu);

  // One upload of a chunk per holder at a time: each finished fetch adds a holder, so a chunk that
  // every member wants spreads as a tree (directory.hpp).
  static constexpr uint32_t kUploadsPerHolder = 1;
  Impl(const Options& o, DramTier& d) : opts(o), dram(d), directory(o.timeout, kUploadsPerHolder) {}

  // ---- sending ----

  struct Outgoing {
    uint64_t handle;
    std::string to;
    std::vector<uint8_t> frame;
    bool via_data = false;  // on the data endpoint (handle is the member's data handle)
  };

  Outgoing make(const std::string& to, uint64_t handle, PeerMsg type, json body) {
    PeerMessage m;
    m.type = type;
    {
      cairn::MutexLock sl(seq_mu);
      m.seq = ++next_seq[to];
    }
    m.from = self;
    m.to = to;
    m.body = std::move(body);
    return Outgoing{handle, to, encode_peer_message(m, secret)};
  }
  // An outgoing message to a member, or nothing if it is not reachable.
  std::optional<Outgoing> to_member(const std::string& id, PeerMsg type, json body) CAIRN_REQUIRES(mu) {
    auto it = members.find(id);
    if (it == members.end() || !it->second.reachable) return std::nullopt;
    return make(id, it->second.handle, type, std::move(body));
  }
  void send(std::vector<Outgoing>& out) {
    for (Outgoing& o : out) {
      send_one(o);
      if (fault_replay || fault_forge || fault_garbage) send_faults(o);
    }
    out.clear();
  }
  void send_one(const Outgoing& o) {
    Status st = (o.via_data ? data : fabric)->send_control(o.handle, o.frame);
    if (!st.ok()) CAIRN_LOG_DEBUG("peers: sending to {}: {}", o.to, st.to_string());
  }
  // The replay and forge test hooks after o was sent (peer_faults.cpp).
  void send_faults(const Outgoing& o);
  // Reads CAIRN_PEERS_FAULT; a warning for each hook set. kInvalidArgument for an unknown one.
  Status set_faults(const char* spec);
  cairn::Mutex fault_mu;
  std::vector<Outgoing> fault_sent CAIRN_GUARDED_BY(fault_mu);  // the last frames sent, for replay
  std::atomic<uint64_t> fault_frames = 0;  // frames sent by the replay, forge and garbage_bodies hooks

  // An answer of the directory goes to its requester: this member's own
  // pending request, or a lookup_reply message.
  void deliver(const ChunkDirectory::Answer& a, std::vector<Outgoing>& out) CAIRN_REQUIRES(mu);
  void deliver_all(const std::vector<ChunkDirectory::Answer>& answers, std::vector<Outgoing>& out) CAIRN_REQUIRES(mu) {
    for (const auto& a : answers) deliver(a, out);
  }

  std::string home(const ChunkHash& h) const CAIRN_REQUIRES(mu) { return home_of(h, ids); }

  // The address a member publishes (membership file, hello): both endpoints' addresses,
  // u16 LE length of the control address | control | data.
  std::string published_address() const;
  // Makes a member reachable on both endpoints from its published address;
  // false (and a log line) when the address is not one or the fabric refuses it.
  bool reach(Member& mem, const std::string& published) CAIRN_REQUIRES(mu);

  // ---- receiving (on the fabric's progress thread; never blocks) ----

  void on_message(std::span<const uint8_t> frame);
  // Whether a frame that passed its MAC is addressed to this member and new
  // (counted and logged at a bounded rate when not).
  bool admit(const PeerMessage& m) CAIRN_REQUIRES(mu);
  // Counts and logs (at a bounded rate) a body its decoder refused.
  void malformed(const PeerMessage& m, const Status& why) CAIRN_REQUIRES(mu);

  // A verified member asks for a chunk's body: send it from the arena, pinned
  // until the send completes.
  void serve_get(Member& mem, const GetBody& get, std::vector<Outgoing>& out) CAIRN_REQUIRES(mu);
  // Unpins the chunks of body sends still pending past their give_up (ServedBody), forgets the
  // completed ones, and cancels the drains past theirs; on the service thread, each scan.
  void release_stale_sends();
  // Without mu. After a fetch timed out: a receive for tag that discards a body arriving late.
  void drain_late_body(uint64_t tag);
  // M's body passed check_peer_body. A message from a verified member.
  void handle_verified(Member& mem, PeerMessage& m, std::vector<Outgoing>& out) CAIRN_REQUIRES(mu);
  std::vector<std::function<void()>> bodies CAIRN_GUARDED_BY(mu);  // body sends queued by serve_get
  // With late_bodies, the body sends and when they are due.
  std::vector<std::pair<PClock::time_point, std::function<void()>>> delayed_bodies CAIRN_GUARDED_BY(mu);
  // Without mu. Runs the delayed body sends that are due (the service thread, each scan).
  void send_delayed_bodies();

  // Greets a member: a challenge it must answer with the secret.
  void greet(Member& mem, std::vector<Outgoing>& out) CAIRN_REQUIRES(mu);

  // A member is gone: out of the directory, its readers' waits end.
  void forget(const std::string& id, std::vector<Outgoing>& out) CAIRN_REQUIRES(mu);

  // ---- staging for another member (peer_stage.cpp) ----
  cairn::Mutex stage_mu;
  cairn::CondVar stage_cv;
  size_t stages_running CAIRN_GUARDED_BY(stage_mu) = 0;
  bool stages_stopped CAIRN_GUARDED_BY(stage_mu) = false;
  uint64_t stages_served CAIRN_GUARDED_BY(mu) = 0;
  // A member asks this one to stage a model: runs PeerEvents::stage on a thread
  // of its own, then answers with a stage_reply.
  void serve_stage(Member& mem, const StageBody& stage) CAIRN_REQUIRES(mu);
  // A stage_reply ends the requester's pending wait.
  void stage_replied(const StageReplyBody& reply) CAIRN_REQUIRES(mu);

  // ---- the service thread: announcements, membership ----

  // The DRAM tier's residency hook: queues a have/drop for the service thread (never blocks).
  void announce(const ChunkHash& h, bool resident);
  // Sends a batch of announcements to the chunks' homes (this member's own directory directly).
  void flush_announcements(std::vector<std::pair<ChunkHash, bool>>& batch);
  // Reads the rendezvous directory: greets new members, forgets gone ones, moves homes.
  void scan();
  // The service thread: announcements as they come, a scan and the directory's expiry every timeout/4.
  void service_loop();

  // ---- reading ----

  uint64_t add_pending(const std::string& target) CAIRN_REQUIRES(mu) {
    uint64_t req = next_request++;
    pendings[req].target = target;
    return req;
  }
  // Waits for a pending request; returns it (removed) or nullopt on timeout (removed too).
  // Waits on cv with `lock` (on mu); the analysis checks the callers, not the body (see fetch_from).
  std::optional<Pending> wait(cairn::MutexLock& lock, uint64_t req, PClock::time_point deadline)
      CAIRN_REQUIRES(mu) CAIRN_NO_THREAD_SAFETY_ANALYSIS;

  // PeerService::fetch: ask the home, then fetch from the holder it names (peer_service.hpp).
  Status fetch(const ChunkRef& ref, void* dst);

  // One body from holder into dst, verified. It drops `lock` (on mu) while it waits and takes it again,
  // which the analysis cannot follow through a lock passed in: its callers are checked, its body is not.
  Status fetch_from(cairn::MutexLock& lock, const std::string& holder, const ChunkRef& ref, void* dst)
      CAIRN_REQUIRES(mu) CAIRN_NO_THREAD_SAFETY_ANALYSIS;

  size_t verified_count() const CAIRN_REQUIRES(mu) {
    size_t n = 0;
    for (const auto& [id, m] : members) n += m.verified;
    return n;
  }
};

}  // namespace cairn
