// The commit path: staging space for writers, and `commit`, which turns tensors in the arena into
// an immutable model. Requests: allocate, free, commit, wait (docs/protocol.md, "Writing models").
//
// A commit: validates the whole request touching nothing (plan), copies inline bytes into the
// arena, hashes every new chunk in place (on up to 4 threads for big commits), adopts the chunks
// into the DRAM tier (deduplicating), builds the manifest, and hands the model to the flusher,
// which makes it visible (catalog, lookups) and queues it as one step. A commit that waits blocks
// on its ticket until the durability it asked for.
//
// Owns: the ids being committed (so two commits of one id cannot both succeed) and the tickets it
// hands out (in the ticket book); stamps each model from the commit clock (commit_clock.hpp). Never writes to the
// burst buffer or the repository (the flusher does) and never reads chunks for clients.
//
// Thread-safety: every method may be called from any thread; a Session by one thread at a time.
// Lock order: the gc lock (shared) is held across a commit until the model is registered; mu_ is a
// leaf; the commit clock's lock is taken under the flusher's lock (in its admit step), so stamps
// follow the flush (and repository) order.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/graph.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/catalog.hpp"
#include "daemon/commit_clock.hpp"
#include "daemon/flusher.hpp"
#include "daemon/models.hpp"
#include "daemon/part_sink.hpp"
#include "daemon/references.hpp"
#include "daemon/repository_view.hpp"
#include "daemon/request.hpp"
#include "daemon/session.hpp"
#include "daemon/tickets.hpp"
#include "daemon/usage_counters.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

class GroupParts;
class PartTransport;
class PeerCatalog;
class TraceRecorder;

class CommitPath : public PartSink {
 public:
  struct Parts {
    DramTier& dram;
    TierManager& tiers;
    Repository& repo;
    Catalog& catalog;
    Flusher& flusher;
    ReferenceCounts& references;
    TicketBook& tickets;
    const ModelDirectory& models;
    CommitClock& clock;              // stamps each registered model (created_ns)
    cairn::SharedMutex& gc_mu;       // held shared until a commit's chunks are referenced by a registered model
    bool burst_buffer = false;       // memory and local commits go through the local stage
    TraceRecorder* trace = nullptr;  // records the chunks each commit creates (policy.trace)
    // Called with each model once it is registered (visible): the peer group announces it.
    std::function<void(const ModelManifest&)> committed = {};
    UsageCounters* usage = nullptr;  // counts each registered model and its bytes (null: none)
    // Brings the catalog up to date with the repository now (the repository watch; null: never):
    // a parent that another daemon published since the last refresh is found by id on the spot,
    // and must be in the catalog before its child is registered.
    RepositoryView* view = nullptr;
    // With a peer group: the commit path makes and owns its GroupParts (multi-part models whose
    // parts are committed on several members, daemon/peers/group_parts.hpp), giving it itself as
    // the PartSink and the group as its PartTransport. While another verified member is there,
    // every part goes through it (commit_parts.cpp). Null: no peer group.
    PartTransport* part_transport = nullptr;
    PeerCatalog* peer_catalog = nullptr;            // with part_transport
    std::chrono::milliseconds peer_timeout{10000};  // with part_transport: a member silent this long is gone
  };
  explicit CommitPath(Parts parts);
  ~CommitPath() override;
  CommitPath(const CommitPath&) = delete;
  CommitPath& operator=(const CommitPath&) = delete;

  // `allocate`: arena space for a tensor of r.nbytes, the connection's until committed or freed.
  Result<request::AllocateReply> allocate(Session& s, const request::Allocate& r);
  // `free`: kNotFound for a space the connection does not hold.
  Status free(Session& s, const request::Free& r);
  // `commit`: the model registered (visible) as one step, or nothing of it. With r.wait, returns
  // once r.durability is reached. `blob` is the frame's payload (r's inline tensors).
  Result<request::CommitReply> commit(Session& s, request::Commit r, const std::vector<uint8_t>& blob);
  // `wait`: kTimeout when the ticket's durability was not reached within r.timeout_ms.
  Result<request::WaitReply> wait(const request::Wait& r);

  // The GroupParts this commit path made (Parts::part_transport), null without a peer group. The
  // engine routes the group's part messages to it, reports it in `peers`, and drains and stops it
  // at exit, before the commit path is destroyed.
  GroupParts* group_parts() const { return group_parts_.get(); }
  // PartSink, for GroupParts.
  Status reserve_assembly(const std::string& id, const std::string& parent) override;
  void release_assembly(const std::string& id) override { unreserve(id); }
  Status register_assembled(const ModelManifest& model, uint64_t ticket) override;
  // Gives back the session's staging space and forgets its tickets.
  void end_session(Session& s);

 private:
  // One tensor of a commit request, validated (plan), before anything is touched.
  struct Planned {
    std::string name;
    request::TensorDesc desc;
    enum { kSpace, kInline, kInherit } source;
    uint64_t space = 0;
    uint64_t blob_offset = 0;
    const TensorManifest* inherited = nullptr;
    std::vector<ChunkHash> hashes;  // a staging space's chunk hashes, when the client sent them
  };
  // Pass 1 of a commit: every tensor checked against the connection's spaces, the parent and the
  // frame's payload (`blob`), nothing touched. Takes the tensors' names and hashes.
  Result<std::vector<Planned>> plan(Session& s, const std::string& id, std::vector<request::CommitTensor>& tensors,
                                    bool inherit_all, const ModelManifest* parent, const std::vector<uint8_t>& blob);

  // What build_and_register turns into a registered model.
  struct Build {
    std::string id;
    std::string parent;
    const ModelManifest* parent_manifest = nullptr;
    nlohmann::json metadata = nlohmann::json::object();
    nlohmann::json architecture;   // null when none
    const Graph* graph = nullptr;  // the architecture parsed (null: derived or the parent's)
    // The parts' plans and where each planned tensor's bytes are, in order (a plain commit is one).
    std::vector<std::pair<const std::vector<Planned>*, const std::vector<Extent>*>> parts;
    std::string source_header;  // the safetensors header, as the request gave it ("" = none)
    uint64_t ticket = 0;        // 0: none
    Durability target = Durability::kGlobal;
    // On error the ticket is forgotten; false: finished with the error (parts follow it).
    bool forget_ticket_on_error = true;
    bool acknowledged_early = false;  // the client is answered before the repository has it
  };
  // Under the gc lock (shared): the model's chunks are referenced once it is registered.
  Result<std::shared_ptr<ModelManifest>> build_and_register(Build b) CAIRN_REQUIRES_SHARED(p_.gc_mu);

  // Multi-part models (daemon/commit_parts.cpp): each part is planned and its bytes placed in the
  // arena when it arrives; the model is built and registered, as one commit, when the last arrives;
  // the reaper fails an assembly whose parts did not all arrive within its timeout.
  struct Assembly;
  Result<request::CommitReply> commit_part(Session& s, request::Commit& r, const std::vector<uint8_t>& blob);
  // reserve_assembly's work.
  Status reserve_locked(const std::string& id, const std::string& parent) CAIRN_REQUIRES(mu_);
  // A part's parent found, its tensors planned, its inline bytes copied into the arena and its
  // staging spaces taken from the writer's connection (nothing of it is hashed or visible).
  struct PlacedPart {
    std::vector<Planned> plan;
    std::vector<Extent> ext;
    std::shared_ptr<const ModelManifest> parent;
  };
  Result<PlacedPart> place_part(Session& s, const std::vector<uint8_t>& blob, request::Commit& r);
  // A part through the peer group: placed, hashed and adopted here, handed to group_parts_.
  Result<request::CommitReply> commit_group_part(Session& s, const std::vector<uint8_t>& blob, request::Commit& r);
  // A part's reply: at once with its ticket, or once the model reached the part's durability.
  Result<request::CommitReply> part_reply(Session& s, request::CommitReply out, uint64_t ticket, bool wait);
  // Hashes each (arena offset, length) range of base, on several threads when there is much to hash.
  static std::vector<ChunkHash> hash_ranges(const uint8_t* base,
                                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  Status complete_assembly(Assembly& a);
  void fail_assembly(Assembly& a, const Status& error);
  void release_part_bytes(const std::vector<Planned>& plan, const std::vector<Extent>& ext);
  void unreserve(const std::string& id);
  void reap_loop();

  Parts p_;
  mutable cairn::Mutex mu_;
  std::map<std::string, std::string> committing_ CAIRN_GUARDED_BY(mu_);  // id -> parent, validation to registration
  std::map<std::string, std::shared_ptr<Assembly>> assemblies_ CAIRN_GUARDED_BY(mu_);
  cairn::CondVar reap_cv_;
  std::thread reaper_;  // started with the first assembly
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  // Last: destroyed first, while the rest of the commit path it calls as its PartSink is there.
  std::unique_ptr<GroupParts> group_parts_;
};

}  // namespace cairn
