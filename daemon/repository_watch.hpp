// The repository watch: keeps this daemon's catalog current with what other daemons publish to the
// shared repository. Every `repository_refresh` (default 1s) a thread asks the repository for the
// new records of the other writers' logs and adds their models to the lineage catalog and the
// reference counts (and retires or erases the ones they retired or collected). `cairn sync` (wire
// op `sync`) does the same at once. A lookup of an unknown id does not wait for it: the repository
// looks the id up on the spot (Repository::get refreshes on a miss).
//
// Owns: the thread and its stop flag, and the counters it reports. Never writes the repository.
//
// Its thread starts with start(), once the catalog is loaded (recovery.hpp); until then, and with
// repository_refresh 0, only `sync` and refresh() refresh.
//
// Thread-safety: every method may be called from any thread; a refresh runs under mu_, so the
// thread, a `sync` and a refresh() never interleave. Lock order: mu_ before the catalog's and the reference
// counts' locks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/status.hpp"
#include "daemon/catalog.hpp"
#include "daemon/commit_clock.hpp"
#include "daemon/peers/remote_models.hpp"
#include "daemon/references.hpp"
#include "daemon/repository_view.hpp"
#include "daemon/request.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

class RepositoryWatch final : public RepositoryView {
 public:
  struct Parts {
    Repository& repo;
    Catalog& catalog;
    ReferenceCounts& references;
    CommitClock& clock;              // told the stamp of each model learnt
    RemoteModels* remote = nullptr;  // the job's models from peers: dropped once published here
  };
  // interval: the period of the thread start() starts (0: none).
  RepositoryWatch(Parts parts, std::chrono::milliseconds interval);
  ~RepositoryWatch() override;
  RepositoryWatch(const RepositoryWatch&) = delete;
  RepositoryWatch& operator=(const RepositoryWatch&) = delete;

  // Starts the periodic refresh (nothing with interval 0). REQUIRES: called once, the catalog loaded.
  void start();
  void stop();
  // RepositoryView: refresh now.
  Status refresh() override;
  // `sync`: refresh now (also what a commit of a parent this daemon has not seen, and a read that
  // missed bytes, ask for).
  Result<request::SyncReply> sync();
  // For `cairn stats`: refreshes done, models learnt from other daemons, the interval.
  nlohmann::json stats() const;

 private:
  Result<RefreshReport> refresh_once();
  void loop();

  Parts p_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t refreshes_ = 0;
  uint64_t models_added_ = 0;
  uint64_t models_removed_ = 0;
  uint64_t failures_ = 0;
  std::thread thread_;
};

}  // namespace cairn
