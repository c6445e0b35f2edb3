// The engine: everything cairnd does, as a library. The server (server.hpp) only moves frames
// between sockets and Engine::handle; tests run an Engine in-process.
//
// Requests and their fields are documented in docs/protocol.md. Each connection has a Session that
// owns its leases (pinned chunks and named tensors) and its staging allocations; end_session
// releases both, so a client that dies leaks nothing.
//
// Thread-safety: handle() may be called concurrently for different sessions; one session is used by
// one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"
#include "daemon/catalog.hpp"
#include "core/fs.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A connection's state.
struct Session {
  uint64_t id = 0;
  struct Lease {
    std::vector<ChunkHash> pinned_chunks;  // unpinned at release
    std::vector<Extent> owned_extents;     // assembled views, released at release
    std::string named_key;                 // a named tensor's pin ("" = none)
    uint64_t named_generation = 0;
  };
  std::map<uint64_t, Lease> leases;
  std::map<uint64_t, Extent> staging;      // arena space handed out for writes, not yet committed
  std::set<uint64_t> tickets;              // tickets handed out and not yet waited for
  uint64_t next_id = 1;
};

struct Response {
  nlohmann::json body;
  std::vector<uint8_t> blob;
};

// What tests swap in: the file systems under the burst buffer and the repository (nullptr = the
// real one), and the back-pressure timeout.
struct EngineOptions {
  FileSystem* nvme_fs = nullptr;
  FileSystem* repository_fs = nullptr;
  std::chrono::milliseconds backpressure_timeout{60000};
};

class Engine {
 public:
  // Opens the repository, creates the DRAM arena and opens the burst buffer (when
  // tiers.nvme.capacity > 0) from config, then recovers what a crashed daemon left on the burst
  // buffer: models committed `local` are registered again and written to the repository. Fails
  // with the component's error.
  static Result<std::unique_ptr<Engine>> create(const Config& config, EngineOptions options = {});
  // Drains pending flushes (drain()), stops the flushers, and closes the burst buffer (removing
  // its files unless tiers.nvme.persistent).
  ~Engine();

  // Serves one request. Never throws; errors become error responses.
  Response handle(Session& session, const nlohmann::json& request, std::vector<uint8_t>& blob);
  // Releases everything the session holds.
  void end_session(Session& session);
  // Blocks until every commit acknowledged at `memory` or `local` has reached the repository.
  void drain();
  // The same with a limit: false when models are still pending after timeout.
  bool drain_for(std::chrono::milliseconds timeout);

  int arena_fd() const { return dram_->arena_fd(); }
  uint64_t arena_size() const { return dram_->arena_size(); }
  const Config& config() const { return config_; }
  Repository& repository() { return *repo_; }
  Catalog& catalog() { return catalog_; }
  DramTier& dram() { return *dram_; }
  NvmeTier* nvme() { return nvme_.get(); }
  TierManager& tiers() { return *tiers_; }

 private:
  struct NamedTensor {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    Extent extent;
    uint32_t pins = 0;
    uint64_t generation = 0;
  };
  struct Ticket {
    int target = 2;     // durability level asked for: 0 memory, 1 local, 2 global
    int reached = 0;
    Status error;
  };
  // A model committed and not yet in the repository. It goes through the local stage (to the burst
  // buffer) when it was committed at memory or local and there is a burst buffer, then through the
  // global stage (to the repository), in commit order.
  struct PendingModel {
    std::shared_ptr<const ModelManifest> manifest;
    uint64_t ticket = 0;       // 0: none (recovered)
    uint64_t seq = 0;
    bool needs_local = false;
    bool local_done = false;
    bool on_nvme = false;      // recorded in the burst buffer's journal
  };

  Engine(Config config, std::unique_ptr<Repository> repo, std::unique_ptr<DramTier> dram,
         std::unique_ptr<NvmeTier> nvme, std::unique_ptr<AdmissionPolicy> admission);

  Result<nlohmann::json> dispatch(Session& s, const std::string& op, const nlohmann::json& req,
                                  std::vector<uint8_t>& blob, std::vector<uint8_t>& out_blob);
  Result<nlohmann::json> op_hello(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> op_allocate(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> op_free(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> op_put_tensor(Session& s, const nlohmann::json& req, std::vector<uint8_t>& blob);
  Result<nlohmann::json> op_tensor_info(const nlohmann::json& req);
  Result<nlohmann::json> op_lease_tensor(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> op_poll_tensor(const nlohmann::json& req);
  Result<nlohmann::json> op_delete_tensor(const nlohmann::json& req);
  Result<nlohmann::json> op_commit(Session& s, const nlohmann::json& req, std::vector<uint8_t>& blob);
  Result<nlohmann::json> op_wait(const nlohmann::json& req);
  Result<nlohmann::json> op_open(const nlohmann::json& req);
  Result<nlohmann::json> op_lease(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> op_release(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> op_prefetch(const nlohmann::json& req);
  Result<nlohmann::json> op_list(const nlohmann::json& req);
  Result<nlohmann::json> op_show(const nlohmann::json& req);
  Result<nlohmann::json> op_stats(const nlohmann::json& req);
  Result<nlohmann::json> op_remove(const nlohmann::json& req);
  Result<nlohmann::json> op_query(const nlohmann::json& req);
  Result<nlohmann::json> op_gc(const nlohmann::json& req);
  Result<nlohmann::json> op_fsck(const nlohmann::json& req);
  Result<nlohmann::json> op_flush(const nlohmann::json& req);
  Result<nlohmann::json> query_best_ancestor(const nlohmann::json& q);

  // The catalog's graph for a model: its architecture, else its parent's when it has exactly the
  // parent's tensors, else one derived from its tensor names. parsed: the architecture, parsed;
  // parent: the parent's manifest (nullptr for a root).
  GraphHandle graph_for(const ModelManifest& m, const Graph* parsed, const ModelManifest* parent);
  // Fills the catalog from the repository (at start).
  Status load_catalog();
  // Registers the models a crashed daemon committed `local` and queues them for the repository.
  void recover_from_nvme();

  // The manifest of a committed model (pending in memory or in the repository).
  Result<std::shared_ptr<const ModelManifest>> find_model(const std::string& id) const;
  // Makes every chunk of t resident and pinned; fills the extents (one per chunk, in order). On
  // failure nothing stays pinned.
  Status pin_tensor(const TensorManifest& t, std::vector<ChunkHash>& pinned, std::vector<Extent>& extents);
  // Reads chunks that are not resident from the repository into [base, ...) of one allocation.
  // Starts the kernel reading the repository ranges of the tensors' chunks not resident in DRAM.
  void readahead(const std::vector<const TensorManifest*>& tensors);
  void release_lease(Session::Lease& lease);
  void local_loop();
  void global_loop();
  // Counts the live models referencing each chunk and tells the DRAM policy (lineage scorer).
  void count_references(const ModelManifest& m, int delta);
  void finish_ticket(uint64_t id, int reached, const Status& error);

  const Config config_;
  std::unique_ptr<Repository> repo_;
  std::unique_ptr<DramTier> dram_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<TierManager> tiers_;  // after the tiers it uses: destroyed before them
  Catalog catalog_;
  // gc holds it exclusively; commits and reads of repository data hold it shared, so gc never
  // frees a chunk that a commit is about to reference or a reader is about to read.
  std::shared_mutex gc_mu_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable named_cv_;
  std::condition_variable ticket_cv_;
  std::condition_variable flush_cv_;
  std::unordered_map<std::string, NamedTensor> named_;
  std::vector<NamedTensor> orphaned_named_;  // replaced or deleted while pinned
  uint64_t named_generation_ = 0;
  std::unordered_map<uint64_t, Ticket> tickets_;
  uint64_t next_ticket_ = 1;
  std::map<std::string, PendingModel> pending_;          // committed, not yet in the repository
  std::deque<std::string> flush_order_;                  // pending models in commit order (global stage)
  std::deque<std::string> local_queue_;                  // those waiting for the local stage
  uint64_t next_seq_ = 1;
  std::unordered_map<ChunkHash, uint32_t, ChunkHashHasher> chunk_refs_;  // live models per chunk
  uint64_t recovered_models_ = 0, lost_models_ = 0;
  std::map<std::string, std::string> committing_;        // id -> parent, between validation and registration
  bool stopping_ = false;
  int64_t last_created_ns_ = 0;  // stamps of committed models, increasing
  uint64_t pfs_bytes_written_ = 0;
  std::atomic<uint64_t> next_session_{1};
  std::thread local_flusher_, global_flusher_;
};

}  // namespace cairn
