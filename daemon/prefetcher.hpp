// The prefetcher: acts on hints (daemon/hints.hpp) and on what reads reveal, staging chunks into
// DRAM ahead of need and telling the eviction policy what the workflow will want. Request: hint
// (docs/policy.md). Modes (policy.prefetch): none (hints only steer eviction), hints (also stage
// what will_load and sequence announce), lineage (also a model's ancestors when it is opened and
// the matching tensors of a best_ancestor answer).
//
// Staging runs on one background thread (nice 10, below every request; started by start()), one
// tensor at a time, through Reads::stage (the same verified fetch path a lease takes), and only
// within a budget: bytes staged and not yet read stay under policy.prefetch_budget, and staging
// never takes the arena's free space under its reserve, so it evicts nothing a request still needs
// and never touches pinned or dirty data. A hint naming unknown models is accepted (advice), its unknown
// ids listed in the answer and logged.
//
// Reads also tell it which models are read in a cycle that does not fit in DRAM (ReadCycles): it
// marks their chunks cyclic in the DRAM tier until the model is declared done, retired or idle.
//
// Owns: the job queue and its thread, the population and sequence a workflow announced, the set of
// chunks it staged that no read has used yet, the cycle detector, and its counters. Never serves a
// read and never writes a model.
//
// Thread-safety: every method may be called from any thread. Lock order: mu_ and cycles_mu_ are
// leaves, never held together, except that the DRAM tier's lock is taken inside either (policy
// hints).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/hints.hpp"
#include "daemon/models.hpp"
#include "daemon/read_cycles.hpp"
#include "daemon/reads.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/nvme/nvme_tier.hpp"

namespace cairn {

class TraceRecorder;

class Prefetcher final : public ReadObserver {
 public:
  struct Parts {
    DramTier& dram;
    const ModelDirectory& models;
    std::string mode;          // none | hints | lineage
    uint64_t budget = 0;       // bytes staged and not yet read, at most
    TraceRecorder* trace;      // may be null
    NvmeTier* nvme = nullptr;  // the burst buffer, if any: its policy gets the eviction hints too
  };
  // Idle until start(): hints are taken and reads observed, nothing is staged.
  explicit Prefetcher(Parts parts);
  ~Prefetcher() override;
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The `hint` request, its hint parsed (request::decode_hint).
  Result<nlohmann::json> hint(const Hint& h);
  // ReadObserver: what reads reveal.
  void opened(const ModelManifest& m) override;
  // Also the cycle detector's input: a model read again after its chunks left DRAM becomes cyclic.
  void leased(const ModelManifest& m, const std::vector<const TensorManifest*>& tensors,
              const LeasedRead& read) override;
  void matched(const std::string& model, const std::vector<std::string>& tensors) override;
  // The model was retired (`rm`): it is no longer read in a cycle.
  void retired(const std::string& id);
  // The model was committed (registered): when the last population hint named it with scores (a
  // driver may name a member before storing it), its chunks take their parent chances now.
  void committed(const ModelManifest& m);

  // Counters for `cairn stats` ("prefetch").
  nlohmann::json stats();
  // Starts the staging thread, which stages through `reads` (the same verified fetch as a lease).
  // Reads and the prefetcher know each other (reads tell it what they reveal, as its ReadObserver;
  // it stages through them), so it is made first and started once reads are made. REQUIRES: called
  // once, before requests are served; reads outlives stop().
  void start(Reads& reads);
  // Blocks until the queue is empty and nothing is being staged (tests, benchmarks).
  void idle();
  // Drops queued work and joins the thread. Idempotent.
  void stop();

 private:
  // A hint's per-chunk terms, to every tier's policy (DRAM, and NVMe when there is one).
  void hint_expected_use(const ChunkHash& hash, double seconds);
  void hint_population(const ChunkHash& hash, bool member, double parent_chance);
  void hint_done(const ChunkHash& hash);
  // What the cycle detector found, to the DRAM tier (under cycles_mu_: marks stay in order).
  void apply_cycles_locked(const ReadCycles::Change& change) CAIRN_REQUIRES(cycles_mu_);
  // Passes every chunk of the scored population's members their chance to be read by the next
  // load: over the members using the chunk, the member's chance to be the next parent times the
  // share of loads so far that read the chunk's position (its index among the model's chunks, in
  // manifest order; 1 before any load). Returns the members that do not exist.
  std::vector<std::string> apply_parent_chances(const std::vector<std::string>& members,
                                                const std::vector<double>& chances);
  struct Job {
    std::string model;
    std::vector<std::string> tensors;  // empty: all
    std::string reason;                // will_load, sequence, ancestor, match
    bool hbm = false;                  // also into the HBM tier (a will_load hint with tier hbm)
  };
  void loop();
  void stage(const Job& job);
  void stage_device(const ModelManifest& m, const Job& job);
  void enqueue(Job job);
  // Forgets staged chunks that left DRAM unread (counted wasted).
  void prune_locked() CAIRN_REQUIRES(mu_);
  // Applies fn to every chunk of the models that exist (of the named tensors only, when `tensors`
  // is not empty; names a model lacks are skipped); returns the ids that do not exist.
  std::vector<std::string> for_chunks(const std::vector<std::string>& ids,
                                      const std::function<void(const ChunkRef&)>& fn,
                                      const std::vector<std::string>& tensors = {});

  Parts p_;
  Reads* reads_ = nullptr;  // set by start(), before the thread that uses it
  uint64_t reserve_;        // free arena bytes staging never goes under

  mutable cairn::Mutex mu_;
  cairn::CondVar cv_, idle_cv_;
  std::deque<Job> queue_ CAIRN_GUARDED_BY(mu_);
  bool busy_ CAIRN_GUARDED_BY(mu_) = false, stopping_ = false;
  std::set<std::string> population_ CAIRN_GUARDED_BY(mu_);
  // The last population hint with scores, members in its order with their chances (empty: none).
  std::vector<std::string> scored_members_ CAIRN_GUARDED_BY(mu_);
  std::vector<double> member_chances_ CAIRN_GUARDED_BY(mu_);
  // Leases so far, and how many of them read the chunk at position j of the model they read.
  uint64_t loads_ CAIRN_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> reads_at_ CAIRN_GUARDED_BY(mu_);
  std::vector<std::string> sequence_ CAIRN_GUARDED_BY(mu_);
  uint32_t ahead_ CAIRN_GUARDED_BY(mu_) = 2;
  size_t sequence_next_ CAIRN_GUARDED_BY(mu_) = 0;  // first not yet staged
  std::unordered_map<ChunkHash, uint64_t, ChunkHashHasher> staged_
      CAIRN_GUARDED_BY(mu_);  // staged, not yet read: bytes
  uint64_t staged_bytes_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t hints_ = 0, unknown_ = 0, jobs_ = 0, chunks_staged_ = 0, bytes_staged_ = 0, chunks_used_ = 0,
           chunks_wasted_ CAIRN_GUARDED_BY(mu_) = 0, skipped_budget_ = 0, failures_ = 0, dropped_ = 0;
  uint64_t tensors_to_hbm_ CAIRN_GUARDED_BY(mu_) = 0, hbm_skipped_ = 0;  // will_load hints with tier hbm
  static constexpr size_t kMaxQueued = 4096;
  cairn::Mutex cycles_mu_;
  ReadCycles cycles_ CAIRN_GUARDED_BY(cycles_mu_);
  std::thread thread_;
};

}  // namespace cairn
