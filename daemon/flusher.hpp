// The flusher: takes committed models from DRAM to the burst buffer and the repository, in the
// background, in commit order (so a parent always reaches the repository before its children).
//
// Two stages, one thread each:
//   local  — a model committed at `memory` or `local` while there is a burst buffer: the chunks only
//            DRAM holds, then the model's record, go to NVMe (it then survives kill -9 of cairnd);
//   global — every model: its new chunks and its manifest go to the repository; a model still in its
//            local stage holds back the ones after it.
// Each stage tells the ticket book the level a model reached. A model acknowledged before it reached
// the repository (memory, local, or a commit that did not wait) whose repository write fails with ENOSPC, EIO, busy or
// a timeout stays pending and is written again after a back-off (100 ms doubling to 5 s) until it succeeds: an
// acknowledged model is never dropped for a fault that may pass. Any other model whose repository write fails (a
// `global` commit, whose client gets the error; a permanent error) is gone: the flusher finishes its ticket with the
// error and tells the engine (forget_failed) to drop it from the catalog and the reference counts. Its record on the
// burst buffer, if any, stays there, so the next start recovers it.
//
// Owns: the pending models (committed, not yet in the repository), both queues, the two threads,
// and the lock and condition variables for them. Never validates or hashes (the commit path does)
// and never reads for clients (reads does).
//
// Thread-safety: every method may be called from any thread. Lock order: mu_ is taken before the
// catalog's, the reference counts', the tiers' and the ticket book's locks (enqueue's admit and
// forget_failed run with it held; tickets are told a level under it, so a thread that saw a model
// leave the pending set finds its ticket finished).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/tickets.hpp"
#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

class Flusher {
 public:
  // Called with the flusher's lock held when a model's repository write failed.
  using ForgetFailed = std::function<void(const ModelManifest&)>;

  // nvme: the burst buffer, or null. Starts both threads.
  Flusher(Repository& repo, TierManager& tiers, NvmeTier* nvme, TicketBook& tickets, ForgetFailed forget_failed);
  // stop().
  ~Flusher();
  Flusher(const Flusher&) = delete;
  Flusher& operator=(const Flusher&) = delete;

  struct Entry {
    std::shared_ptr<const ModelManifest> manifest;
    uint64_t ticket = 0;       // 0: none (a recovered model)
    bool needs_local = false;  // goes through the local stage first
    bool on_nvme = false;      // already recorded on the burst buffer (a recovered model)
    // Acknowledged before the repository has it (durability memory or local, a commit that did not
    // wait, or recovered): a
    // repository write that fails for a reason that may pass (no space, I/O, busy, timeout) is
    // retried, the model staying pending, instead of dropping an acknowledged model.
    bool retry = false;
  };
  // Makes a committed model pending and queues it. admit() runs first, under the flusher's lock, so
  // that whatever it registers (the catalog entry, the commit stamp) and the pending model appear to
  // every other thread as one step; if it fails nothing is queued and its error is returned.
  Status enqueue(Entry entry, const std::function<Status()>& admit);

  // The pending model of that id, or null.
  std::shared_ptr<const ModelManifest> find(const std::string& id) const;
  bool contains(const std::string& id) const;
  // Every pending model, by id.
  std::vector<std::shared_ptr<const ModelManifest>> pending() const;
  // Waits until the model is no longer pending (in the repository, or failed), or stopping.
  void wait_until_flushed(const std::string& id);
  // Blocks until no pending model descends from id (a child, a grandchild, ... still on its way to
  // the repository): `rm` waits for them, so that a gc of any daemon sees the retired model's
  // descendants in the repository and keeps it (collected) instead of removing a parent whose
  // acknowledged child could then never be written.
  void wait_until_descendants_flushed(const std::string& id);
  // Blocks until no model is pending.
  void drain();
  // The same with a limit: false when models are still pending after timeout.
  bool drain_for(std::chrono::milliseconds timeout);

  struct Stats {
    uint64_t pending_models = 0;
    uint64_t awaiting_local = 0;    // local stage not done
    uint64_t local_not_global = 0;  // recorded on the burst buffer, not yet in the repository
    uint64_t repository_bytes_written = 0;
    uint64_t repository_write_retries = 0;  // failed repository writes of acknowledged models, retried
  };
  Stats stats() const;

  // Lets both threads finish what is queued, then joins them. Idempotent.
  void stop();

 private:
  struct Pending {
    std::shared_ptr<const ModelManifest> manifest;
    uint64_t ticket = 0;
    uint64_t seq = 0;  // commit order, the burst buffer's record order
    bool needs_local = false;
    bool local_done = false;
    bool on_nvme = false;  // recorded in the burst buffer's journal
    bool retry = false;    // Entry::retry
  };
  void local_loop();
  void global_loop();
  // After a failed repository write of m: its chunks no pending model needs may be evicted again.
  void abandon_locked(const ModelManifest& m) CAIRN_REQUIRES(mu_);
  // Whether `tensors` is the list of the model the global stage stored last (the same vector, not
  // equal contents): its chunks are in the repository and marked clean. Global thread only.
  bool stored_list(const TensorList& tensors) const;

  Repository& repo_;
  TierManager& tiers_;
  NvmeTier* nvme_;
  TicketBook& tickets_;
  ForgetFailed forget_failed_;

  mutable cairn::Mutex mu_;
  cairn::CondVar local_cv_;     // work for the local stage, or stopping
  cairn::CondVar global_cv_;    // work for the global stage, or stopping
  cairn::CondVar progress_cv_;  // a model left pending_
  std::map<std::string, Pending> pending_ CAIRN_GUARDED_BY(mu_);
  std::deque<std::string> flush_order_ CAIRN_GUARDED_BY(mu_);  // pending models in commit order
  std::deque<std::string> local_queue_ CAIRN_GUARDED_BY(mu_);  // those waiting for the local stage
  uint64_t next_seq_ CAIRN_GUARDED_BY(mu_) = 1;
  uint64_t bytes_written_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t write_retries_ CAIRN_GUARDED_BY(mu_) = 0;  // repository writes retried
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  // The last model the global stage wrote to the repository, held so that its tensor list's
  // identity stays its own (stored_list). Global thread only.
  std::shared_ptr<const ModelManifest> last_stored_;
  // The last model the local stage wrote to the burst buffer (chunks and record), held for the same
  // reason. Local thread only.
  std::shared_ptr<const ModelManifest> last_local_;
  std::thread local_thread_, global_thread_;
};

}  // namespace cairn
