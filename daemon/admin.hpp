// Administration: what `cairn ls/show/stats/rm/gc/fsck/flush` ask of the daemon. Requests: list,
// show, stats, remove, gc, fsck, flush (docs/protocol.md, "Catalog").
//
// Owns: nothing; it reads the other components' state and calls the repository's maintenance.
// gc waits for the flusher to drain, then takes the gc lock exclusively (no commit or read of
// repository data runs meanwhile) and drains what was committed since, at most 10 s (kBusy
// otherwise), so every committed model's references count and gc never holds the lock for long. Never reads or writes
// chunks itself.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/progress.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/catalog.hpp"
#include "daemon/flusher.hpp"
#include "daemon/peers/remote_models.hpp"
#include "daemon/prefetcher.hpp"
#include "daemon/references.hpp"
#include "daemon/request.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/hbm/hbm_tier.hpp"
#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

// What recovery at start found (daemon/recovery.hpp), reported by stats.
struct RecoveryReport {
  uint64_t models_recovered = 0;  // committed `local` before a crash, found on the burst buffer
  uint64_t models_lost = 0;       // their record or chunks failed their checks
};

class Admin {
 public:
  struct Parts {
    Repository& repo;
    Catalog& catalog;
    Flusher& flusher;
    ReferenceCounts& references;
    DramTier& dram;
    NvmeTier* nvme;  // null without a burst buffer
    TierManager& tiers;
    const std::string& nvme_path;  // tiers.nvme.path, reported by stats
    const RecoveryReport& recovery;
    cairn::SharedMutex& gc_mu;
    Prefetcher* prefetcher = nullptr;      // its counters in stats
    const RemoteModels* remote = nullptr;  // models committed on other members of the job
    const HbmTier* hbm = nullptr;          // the GPU tier, reported by stats (null: none)
  };
  explicit Admin(Parts parts) : p_(parts), hbm_(parts.hbm) {}

  Result<nlohmann::json> list(const request::List& req);
  Result<nlohmann::json> show(const request::ModelId& req);
  Result<nlohmann::json> stats();
  Result<nlohmann::json> remove(const request::ModelId& req);
  // The long ones report their progress (daemon/progress_board.hpp): gc the models it waits for
  // to reach the repository, then the packs it reclaims; fsck the chunks (bytes) it checks, then
  // the packs it scans; flush the models written to the repository.
  Result<nlohmann::json> gc(OperationProgress& progress);
  Result<nlohmann::json> fsck(const request::Fsck& req, OperationProgress& progress);
  Result<nlohmann::json> flush(const request::Flush& req, OperationProgress& progress);

 private:
  // Waits until the flusher is drained (timeout_ms < 0: without limit), reporting the models
  // written against those pending; false when some are still pending after timeout_ms.
  bool drain_reporting(OperationProgress& progress, int64_t timeout_ms);

  Parts p_;
  const HbmTier* const hbm_;
};

}  // namespace cairn
