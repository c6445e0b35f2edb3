// Multi-part models whose parts are committed on several members of a peer group: "parts on
// different nodes, one manifest" (docs/peers.md, "Parts on several members"). With one daemon
// (or no other verified member) a multi-part model is assembled by that daemon alone
// (commit_parts.cpp); with other members, every part goes through this class.
//
// Three roles; every member plays each for some models:
//  - holder: a member a writer committed a part to. It places and hashes the part in its own arena
//    (CommitPath::commit_group_part), keeps the part's chunks there, pinned and announced to the
//    chunk directory (so the group reads them where they were written), and sends the part's
//    description (names, dtypes, shapes, chunk hashes) to the model's home. Its parts' tickets
//    follow what the home and the registrar report.
//  - home: the verified member the id hashes to (as a chunk's home). It reserves the id (a claim in
//    the shared repository, so ids stay unique across the job), collects the parts until all N are
//    in or the first one's timeout passes, and builds the one manifest (tensors in part order).
//  - registrar: the holder of the most bytes, so that the fewest bytes move when the model is
//    written to the repository (the home hands it the manifest and the id). It asks every other
//    holder whether it still holds its parts (a holder that died while the others were arriving
//    fails the model here, before anything is visible), then registers the model as one commit:
//    visible on it and announced to the group at once (the job's catalog), and reports to every
//    holder the levels the model reaches: memory at once, local when every holder has its parts on
//    its burst buffer, global when its flusher has written the model (fetching the other holders'
//    chunks from them: the repository stores a model's chunks with its record).
// A part missing at the timeout, a holder that leaves before the model is in the repository, a home
// or registrar that leaves: every holder's tickets fail naming why; a model not yet registered was
// never visible anywhere; the id is free again.
//
// Threads: one worker runs every message, every timer and every role's step in order (the state
// needs no lock but mu_, held briefly); writers' request threads call reserve_part/hold; an I/O
// thread writes holders' parts to the burst buffer; one thread per registered model waits for it
// to reach the repository.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/part_sink.hpp"
#include "daemon/peers/part_messages.hpp"
#include "daemon/peers/part_transport.hpp"
#include "daemon/tickets.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

class DramTier;
class Flusher;
class PeerCatalog;
class TierManager;

class GroupParts {
 public:
  struct Parts {
    PartSink& commits;  // the commit path: ids reserved, assembled models registered
    TicketBook& tickets;
    DramTier& dram;
    TierManager& tiers;
    const Flusher& flusher;
    // A model a member registered and announced failed to reach the repository: out of this
    // member's view of the job's catalog.
    PeerCatalog& peer_catalog;
    bool burst_buffer = false;
    std::chrono::milliseconds peer_timeout{10000};  // a member silent this long is gone
  };
  // transport: the peer group (PeerPartTransport in cairnd); outlives this object.
  GroupParts(Parts parts, PartTransport& transport);
  // REQUIRES: stop() was called.
  ~GroupParts();
  GroupParts(const GroupParts&) = delete;
  GroupParts& operator=(const GroupParts&) = delete;

  // Whether parts go through the group now (another verified member is there).
  bool active() const { return t_.active(); }

  // A writer's part arrives here (the holder role), on its request thread: reserves (id, index) on
  // this member before the part is placed. kExists when this member holds parts of a model of that
  // id that is registered already; kInvalidArgument when the part is here already or being placed.
  Status reserve_part(const std::string& id, uint32_t index, uint32_t of);
  void unreserve_part(const std::string& id, uint32_t index);
  // The part is placed and hashed: its chunks (pinned once each, as adopted) stay here until the
  // model reaches the repository or fails; `ticket` (created assembling) follows the model. Sends
  // the part to the model's home. REQUIRES: reserve_part(part.id, index) succeeded.
  void hold(PartMessage part, uint64_t ticket, std::vector<ChunkRef> pinned);

  // A part message from a member (PeerEvents::part_message): decoded and handled in order.
  void on_message(PeerMsg type, nlohmann::json body, const std::string& member);
  // A member left the group (PeerEvents::member_left).
  void member_gone(const std::string& member);

  // Blocks until this member holds no part of a model that is not in the repository yet (each one
  // reached it, failed, or its registrar left), or timeout passes; false then. Called before the
  // daemon drains at exit, so a holder that exits cleanly does not take its parts with it.
  bool drain_for(std::chrono::milliseconds timeout);
  // Stops the threads. REQUIRES: the ticket book was stopped or no model registered here is pending
  // (the waiting threads return then).
  void stop();

  // For `cairn peers --json`: parts held, assemblies collected here, models registered here.
  nlohmann::json status() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct HeldPart {
    uint64_t ticket = 0;
    Durability target = Durability::kGlobal;
    std::vector<ChunkRef> chunks;  // adopted here, pinned once each
  };
  struct Held {  // holder: the parts of one model held here
    std::string home, registrar;
    std::map<uint32_t, HeldPart> parts;
    std::set<uint32_t> placing;               // reserved, not held yet
    bool registered = false;                  // the registrar said memory
    Durability target = Durability::kGlobal;  // the model's, once registered
    Clock::time_point deadline;               // to be registered by
  };
  struct Fragment {
    std::string holder;
    TensorList tensors;
    Durability durability = Durability::kGlobal;
    uint64_t bytes = 0;
  };
  struct Assembly {  // home: the parts of a model collected here
    std::string parent;
    uint32_t of = 0;
    uint64_t timeout_ms = 0;
    Clock::time_point deadline;
    std::vector<std::optional<Fragment>> parts;
    uint32_t arrived = 0;
    nlohmann::json metadata = nlohmann::json::object();
    nlohmann::json architecture;
    std::set<std::string> holders;
  };
  struct Checking {  // registrar: the holders were asked whether they still hold their parts
    AssembleMessage assembly;
    std::string home;
    std::set<std::string> waiting;  // holders that have not answered yet
    Clock::time_point deadline;
  };
  struct Registered {     // registrar: a model registered here, on its way to the repository
    uint64_t ticket = 0;  // the model's (target global), waited for by waiters_[ticket]
    std::vector<std::string> holders;
    std::set<std::string> local_done;
    bool local_failed = false;  // a holder could not write its parts to its burst buffer
    bool local_reported = false;
    Durability target = Durability::kGlobal;
  };

  // The error texts the roles share: "model 'X'"; "model 'X' was not created: parts 1, 2 of 4 were
  // lost: <why> ..." ("$them" in why says "it" or "them"); "model 'X' was not created: <why>".
  static std::string quoted(const std::string& id);
  static Status parts_lost(const std::string& id, const std::vector<uint32_t>& parts, size_t of, std::string why);
  static Status failed_because(const std::string& id, const Status& why);

  // Queues work for the worker (in order).
  void post(std::function<void()> task);
  void worker_loop();
  // A message to a member: to this one, handled by the worker like any other.
  Status send(const std::string& member, PeerMsg type, nlohmann::json body);
  void send_state(const std::string& member, PartStateMessage m);
  void handle(PeerMsg type, const nlohmann::json& body, const std::string& from);

  // The roles' steps (on the worker).
  void on_part(PartMessage m, const std::string& from);                               // home
  void complete(const std::string& id, Assembly a);                                   // home
  void fail_assembly(const std::string& id, const Assembly& a, const Status& error);  // home
  void on_assemble(AssembleMessage m, const std::string& from, bool reserved);        // registrar
  void fail_check(const std::string& id, const Checking& c, const Status& error);     // registrar
  void register_model(Checking c);                                                    // registrar
  void on_flushed(const std::string& id, TicketBook::Outcome outcome);                // registrar
  void on_ack(const PartAckMessage& m, const std::string& from);                      // registrar
  void on_state(const PartStateMessage& m, const std::string& from);                  // holder
  void write_local(const std::string& id, std::vector<ChunkRef> chunks,
                   const std::string& registrar);  // holder (I/O thread)
  // Holder: the parts (all when `which` is empty) fail with error; their chunks go back.
  void fail_held(const std::string& id, const Status& error, const std::vector<uint32_t>& which = {});
  // Unpins a held part's chunks; `stored`: they are in the repository (clean), else abandoned
  // unless a pending model or another held part needs them.
  void release_chunks(const std::vector<ChunkRef>& chunks, bool stored);
  void check_deadlines();

  Parts p_;
  PartTransport& t_;
  mutable cairn::Mutex mu_;
  cairn::CondVar cv_;  // tasks, stopping, drained
  std::deque<std::function<void()>> tasks_ CAIRN_GUARDED_BY(mu_);
  std::map<std::string, Held> held_ CAIRN_GUARDED_BY(mu_);
  // Changed only by the worker, under mu_; the worker reads them without it (which the analysis
  // cannot express, so these three are not annotated).
  std::map<std::string, Assembly> assemblies_;
  std::map<std::string, Checking> checking_;
  std::map<std::string, Registered> registered_;
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  std::thread worker_;
  // The burst-buffer writes of holders (blocking I/O, off the worker).
  std::deque<std::function<void()>> io_tasks_ CAIRN_GUARDED_BY(mu_);
  std::thread io_;
  std::map<uint64_t, std::thread> waiters_ CAIRN_GUARDED_BY(mu_);  // one per registered model, by ticket
  uint64_t parts_held_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t assembled_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t failed_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t bad_messages_ CAIRN_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn
