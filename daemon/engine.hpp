// The engine: everything cairnd does, as a library. The server (server.hpp) only moves frames
// between sockets and Engine::handle; tests run an Engine in-process.
//
// The engine is a router over components that each own their state and lock. Engine::create
// (engine_open.cpp) assembles them from the config, each from what it needs, in dependency order;
// docs/architecture.md has the picture, the order, the threads and the locks:
//   NamedTensors (named_tensors.hpp)  put/info/lease/poll/delete of named tensors
//   CommitPath   (commit_path.hpp)    staging space, commit (validate, hash, manifest), tickets
//   Flusher      (flusher.hpp)        the local and global stages, their queues and threads, drain
//   Reads        (reads.hpp)          open, leases, pinning, assembled views, readahead, prefetch
//   Admin        (admin.hpp)          list, show, stats, remove, gc, fsck, flush
//   CatalogQueries (queries.hpp)      the catalog's queries
//   Prefetcher   (prefetcher.hpp)     hints, staging ahead of need (its own thread)
//   RepositoryWatch (repository_watch.hpp) other daemons' commits to the shared repository; sync
//   PeerService, PeerCatalog, GroupParts (peers/) the job's peer group, the models its other
//                                     members committed, multi-part models across members
//   Watchdog     (watchdog.hpp)       requests in flight; reports stuck ones with every thread's stack
//   FaultInjection (fault_injection.hpp) the `fault` request (debug.fault_injection only)
//   RequestMetrics, MetricsExporter (request_metrics.hpp, metrics_exporter.hpp) metrics for
//                                     monitoring (metrics.listen, metrics.textfile); rendered by
//                                     metrics_text() (engine_metrics.cpp)
// with the tiers below them (tiers/: DRAM, NVMe, the repository, the tier manager). Requests are
// dispatched through one table from op name to handler (Engine::table(), engine.cpp; Engine::ops()
// lists its names): a handler decodes the request into the op's struct (request.hpp), calls the
// component that serves it and encodes the typed reply. Every op the table names is documented in
// docs/protocol.md, and a test checks the two against each other.
//
// Each connection has a Session that owns its leases (pinned chunks and named tensors) and its
// staging allocations; end_session releases both, so a client that dies leaks nothing.
//
// Thread-safety: handle() may be called concurrently for different sessions; one session is used by
// one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/fs.hpp"
#include "core/metrics.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/admin.hpp"
#include "daemon/catalog.hpp"
#include "daemon/commit_clock.hpp"
#include "daemon/commit_path.hpp"
#include "daemon/compute.hpp"
#include "daemon/fault_injection.hpp"
#include "daemon/flusher.hpp"
#include "daemon/metrics_exporter.hpp"
#include "daemon/models.hpp"
#include "daemon/named_tensors.hpp"
#include "daemon/peers/group_parts.hpp"
#include "daemon/peers/peer_catalog.hpp"
#include "daemon/peers/peer_events.hpp"
#include "daemon/peers/peer_service.hpp"
#include "daemon/prefetcher.hpp"
#include "daemon/progress_board.hpp"
#include "daemon/queries.hpp"
#include "daemon/reads.hpp"
#include "daemon/references.hpp"
#include "daemon/repository_watch.hpp"
#include "daemon/request.hpp"
#include "daemon/request_metrics.hpp"
#include "daemon/session.hpp"
#include "daemon/tickets.hpp"
#include "daemon/usage_counters.hpp"
#include "daemon/watchdog.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

// What tests swap in: the file systems under the burst buffer and the repository (nullptr = the
// real one), and the back-pressure timeout.
struct EngineOptions {
  FileSystem* nvme_fs = nullptr;
  FileSystem* repository_fs = nullptr;
  std::chrono::milliseconds backpressure_timeout{60000};
};

class Engine {
 public:
  // Opens the engine (engine_open.cpp): checks the config (check_config), opens the repository,
  // creates the DRAM arena, opens the GPU tier and the burst buffer (when their capacity is > 0)
  // and joins the peer group (when there is one), makes the components, loads the catalog, then
  // recovers what a crashed daemon left on the burst buffer: models committed `local` are
  // registered again and written to the repository. Fails with the config key's or the
  // component's error.
  static Result<std::unique_ptr<Engine>> create(const Config& config, EngineOptions options = {});
  // Stops the threads that serve others (metrics, compute worker, peers' staging, repository
  // watch, prefetcher), drains pending flushes (drain()), stops the flushers, leaves the peer
  // group, and closes the burst buffer (removing its files unless tiers.nvme.persistent).
  ~Engine();

  // Serves one request. Never throws; errors become error responses.
  Response handle(Session& session, const nlohmann::json& request, std::vector<uint8_t>& blob);
  // Releases everything the session holds.
  void end_session(Session& session);
  // Releases the session's leases only (reads and named tensors), for a client that hung up while a
  // request of its that never touches them still runs (Server's hang-up watcher).
  void release_leases(Session& session);
  // Blocks until every commit acknowledged at `memory` or `local` has reached the repository.
  void drain();
  // The same with a limit: false when models are still pending after timeout.
  bool drain_for(std::chrono::milliseconds timeout);

  // The ops the dispatch table serves, sorted (docs/protocol.md documents each).
  static std::vector<std::string> ops();

  // The daemon's metrics in a text exposition format (docs/metrics.md lists them): the counters of
  // `stats`, queue depths, and, when metrics are on (metrics.listen or metrics.textfile), the
  // requests' latencies and errors. Each sample carries a job_id label when the daemon belongs to
  // a job. Thread-safe; what the metrics exporter serves and writes.
  std::string metrics_text(metrics::Format format);
  // The metrics exporter (null when metrics are off).
  MetricsExporter* metrics_exporter() { return metrics_.get(); }

  int arena_fd() const { return dram_->arena_fd(); }
  uint64_t arena_size() const { return dram_->arena_size(); }
  const Config& config() const { return config_; }
  Repository& repository() { return *repo_; }
  Catalog& catalog() { return catalog_; }
  DramTier& dram() { return *dram_; }
  HbmTier* hbm() { return hbm_.get(); }
  TierManager& tiers() { return *tiers_; }
  Prefetcher& prefetcher() { return *prefetcher_; }
  PeerService* peers() { return peers_.get(); }

 private:
  using Handler = Result<nlohmann::json> (*)(Engine&, Session&, const nlohmann::json&, std::vector<uint8_t>&);
  struct Op;
  static const std::vector<Op>& table();

  // What create opens before the components are made (engine_open.cpp).
  struct Opened;
  // Makes every component from `opened` and the ones made before it (engine_open.cpp).
  explicit Engine(Opened opened);
  // The index of `op` in table(); table().size() for an unknown op.
  static size_t op_slot(const std::string& op);
  // The ops of table(), in its order (RequestMetrics' slots).
  static std::vector<std::string> ops_in_table_order();
  // Records one request in request_metrics_ (engine_metrics.cpp). REQUIRES: request_metrics_.
  void record_request(size_t slot, const nlohmann::json& request, StatusCode code,
                      std::chrono::steady_clock::duration took);
  Result<nlohmann::json> dispatch(Session& s, size_t slot, const std::string& op, const nlohmann::json& req,
                                  std::vector<uint8_t>& blob);
  Result<nlohmann::json> hello(Session& s);
  // `prefetch`: into this daemon's DRAM; with "all": true, into every member's of the peer group at
  // once (docs/peers.md, "cairn prefetch --all").
  Result<nlohmann::json> prefetch(const request::Prefetch& req, OperationProgress& progress);

  // Declaration order is construction order (engine_open.cpp makes each from the ones above it),
  // so destruction stops the users (the flusher's threads) before what they use; ~Engine stops
  // the threads that reach across components first.
  const Config config_;
  // Per-op latencies and errors, recorded by handle() (null when metrics are off). Destroyed last:
  // a request may be recorded until the engine is gone.
  std::unique_ptr<RequestMetrics> request_metrics_;
  // What the daemon did for its clients (`stats` "usage", the job summary); always counted.
  // Before the components that count into it.
  UsageCounters usage_;
  const std::string metrics_job_;  // the job_id label's value ("" = none): the peer group's job
  const int64_t started_unix_ns_;  // when the engine was created (cairn_start_time_seconds)
  // Every request in flight, and the thread that reports stuck ones (the `watchdog` key).
  Watchdog watchdog_;
  ProgressBoard progress_;  // the long requests' progress, by token (`progress`)
  // The fault injector under the repository and the burst buffer (debug.fault_injection; else
  // null). Before them: it outlives their files.
  std::unique_ptr<FaultyFileSystem> faulty_fs_;
  FaultInjection faults_;
  // ---- opened by create, in this order ----
  std::unique_ptr<Repository> repo_;
  std::unique_ptr<DramTier> dram_;
  // The GPU tier (null when tiers.hbm.capacity is 0). After dram_, whose arena it registers.
  std::unique_ptr<HbmTier> hbm_;
  std::unique_ptr<NvmeTier> nvme_;
  // The job's peer group (null when the daemon is alone): opened by create, delivering to
  // peer_events_ once started; left in ~Engine, before the components its events reach go.
  std::unique_ptr<PeerService> peers_;
  std::unique_ptr<PeerPartTransport> part_transport_;  // over peers_ (null without a group)
  std::unique_ptr<TraceRecorder> trace_;               // null unless policy.trace
  // ---- made by the constructor, in this order ----
  // The sources below DRAM: the burst buffer, the peer group, the repository. After peers_, whose
  // chunk source it holds: that source goes first.
  std::unique_ptr<TierManager> tiers_;
  Catalog catalog_;
  // gc holds it exclusively; commits and reads of repository data hold it shared, so gc never
  // frees a chunk that a commit is about to reference or a reader is about to read.
  cairn::SharedMutex gc_mu_;
  ReferenceCounts references_;
  TicketBook tickets_;
  CommitClock clock_;  // every model's created_ns
  NamedTensors named_;
  RecoveryReport recovery_;
  std::unique_ptr<Flusher> flusher_;
  // Models committed on other members of the job, not yet in the repository.
  PeerCatalog peer_catalog_;
  // Other daemons' commits to the shared repository; its thread starts once the catalog is loaded.
  std::unique_ptr<RepositoryWatch> watch_;
  std::unique_ptr<ModelDirectory> models_;
  // With a peer group, it owns the GroupParts of multi-part models whose parts are on several members.
  std::unique_ptr<CommitPath> commits_;
  // Made before reads_, whose observer it is; started once reads_ is made (it stages through it).
  std::unique_ptr<Prefetcher> prefetcher_;
  std::unique_ptr<Reads> reads_;
  std::unique_ptr<Admin> admin_;
  std::unique_ptr<CatalogQueries> queries_;
  std::unique_ptr<ComputeWorker> compute_;  // the near-data worker's supervisor (compute.enabled)
  // What the peer group tells this daemon, routed to peer_catalog_, the commit path's GroupParts and reads_ (null
  // without a peer group).
  std::unique_ptr<PeerEvents> peer_events_;
  // The metrics endpoint and textfile (null when metrics are off). Started by create once every
  // component is up; stopped first in ~Engine, its threads render from every component above.
  std::unique_ptr<MetricsExporter> metrics_;
  std::atomic<uint64_t> next_session_{1};
};

}  // namespace cairn
