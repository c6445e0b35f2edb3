// The tier manager: moves chunks between DRAM, the sources below it and the repository.
//
// Where a chunk is: the DRAM tier knows its resident chunks (pins, and "dirty": no copy in any tier
// below, so it may not leave); the NVMe tier knows its own (and which of them the repository lacks);
// the repository knows what it stores. The manager answers the questions that need all of them:
//   - fetch: the fastest intact copy below DRAM, walking an ordered list of chunk sources
//     (tiers/tier.hpp: NVMe, then the repository; a peer or GPU source is one more entry);
//   - readahead: tells each source which of a request's chunks it will be asked for;
//   - write_local: the `local` durability step, chunks whose only copy is in DRAM go to NVMe;
//   - Source: the bytes of a model's chunks for a repository commit, from DRAM or NVMe;
//   - demotion: a background thread keeps DRAM free space above a low-water mark by taking the
//     eviction policy's victims and writing those NVMe lacks (as the admission policy allows) to the
//     burst buffer before dropping them, so a later read finds them on NVMe rather than the PFS;
//     after each commit it also makes room for the next one of the same size (note_commit), so a
//     checkpoint's fill does not share the node with demotion.
// All movement runs on the flusher threads and the demoter, never on a request's thread, except a
// read's fetch of what it needs. It never decides what to evict (policy/ does) and never touches
// models or manifests (the daemon's components do).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/hash.hpp"
#include "core/status.hpp"
#include "policy/eviction.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier.hpp"

namespace cairn {

class TierManager {
 public:
  // nvme may be null (no burst buffer). Starts the demoter when there is one. The fetch order is NVMe
  // (when there is a burst buffer), then `before_repository` when given (the peer group's chunk
  // source in cairnd), then the repository, the last resort.
  TierManager(DramTier& dram, NvmeTier* nvme, Repository& repo, std::unique_ptr<AdmissionPolicy> admission,
              std::unique_ptr<ChunkSource> before_repository = nullptr);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // True when the chunk has no durable copy below DRAM (neither in the repository nor dirty-or-clean
  // on NVMe while the repository lacks it): a chunk a client wrote must then stay in DRAM (dirty)
  // until write_local or the repository commit.
  bool only_in_dram(const ChunkHash& hash) const;

  // The fetch order, by name (tests, `cairn stats`).
  std::vector<std::string> source_names() const;

  // Reads ref's bytes (ref.length) into dst from the first source below DRAM that has an intact
  // copy. A copy that fails its check (kCorruption) or cannot be read is skipped with a warning and
  // the next source asked; the last source's error is returned as it is; when no source has a copy,
  // kCorruption. Bad bytes never stay in dst with OK returned. source (optional) gets the name of
  // the source that served it (valid while the manager lives).
  Status fetch(const ChunkRef& ref, void* dst, const char** source = nullptr);

  // Advice before a read of these chunks: those not resident in DRAM are announced to the source a
  // fetch would take them from (the repository then starts the kernel reading its pack ranges).
  void readahead(std::span<const ChunkRef* const> refs);

  // The `local` step: every chunk in `chunks` that is dirty in DRAM goes to the NVMe tier, durably;
  // then the DRAM copies are clean (they may be evicted; NVMe has them). kNoSpace when the burst
  // buffer is full of data not yet in the repository (the caller then goes to the repository
  // directly). REQUIRES: a burst buffer.
  Status write_local(const std::vector<ChunkRef>& chunks);

  // The bytes of chunks for a repository commit: DRAM copies are pinned, NVMe copies read into
  // memory, until the Source is destroyed. A chunk in neither is fetched into DRAM through the
  // other sources (a peer holding a part of a model assembled across the peer group).
  class Source {
   public:
    explicit Source(TierManager& tm) : tm_(tm) {}
    ~Source();
    Source(const Source&) = delete;
    Source& operator=(const Source&) = delete;
    Result<const void*> get(const ChunkHash& hash, uint64_t length);
    // The chunk's bytes when DRAM holds them (pinned like get's), else kNotFound: nothing is read.
    Result<const void*> resident(const ChunkHash& hash, uint64_t length);
    uint64_t bytes() const { return bytes_; }

   private:
    TierManager& tm_;
    std::vector<ChunkHash> pinned_;
    std::vector<std::unique_ptr<uint8_t[]>> buffers_;
    uint64_t bytes_ = 0;
  };

  // The chunks are in the repository now: clean in every tier.
  void stored_globally(const std::vector<ChunkRef>& chunks);
  // The model that needed these chunks failed to reach the repository and nothing else needs them:
  // those the repository lacks are clean again in DRAM (so they may be evicted) and dropped from NVMe.
  void abandon(const std::vector<ChunkRef>& chunks);

  // A commit wrote `bytes` of tensor data into arena space. Checkpoints recur at about the same
  // size, so the demoter keeps room for the next one: free space up to the largest of the last
  // kRecentCommits commits plus the high-water mark (at most half the arena, at least the
  // high-water mark), made in the background now rather than while the next commit's caller fills
  // arena space. No effect without a burst buffer (no demoter: a request evicts what it needs).
  void note_commit(uint64_t bytes);

  // Per-source read counters and the demoter's work, for `cairn stats`.
  nlohmann::json stats() const;

 private:
  static constexpr size_t kRecentCommits = 4;

  void demoter_loop();
  void demote(uint64_t target_free);
  void wake_demoter();
  // Tells the DRAM policy what re-reading h would cost once it leaves DRAM.
  void note_cost(const ChunkRef& ref);

  DramTier& dram_;
  NvmeTier* nvme_;
  Repository& repo_;
  std::unique_ptr<AdmissionPolicy> admission_;
  uint64_t low_water_ = 0, high_water_ = 0;

  std::mutex demote_mu_;  // one demotion pass at a time
  std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false, stop_ = false;
  std::thread demoter_;
  // The sizes of the last commits (a ring, under mu_) and the free space the demoter makes when it
  // runs: the high-water mark or the room for the next commit, whichever is larger (read lock-free).
  uint64_t recent_commits_[kRecentCommits] = {};
  size_t recent_next_ = 0;
  std::atomic<uint64_t> target_{0};

  // The fetch order and each source's read counters (same index).
  // Inserts a chunk source into the fetch order at `position` (0 = asked first). Construction only.
  void add_source(std::unique_ptr<ChunkSource> source, size_t position);
  struct SourceSlot {
    std::unique_ptr<ChunkSource> source;
    std::unique_ptr<std::atomic<uint64_t>[]> counters;  // reads, bytes, failed checks
  };
  std::vector<SourceSlot> sources_;
  ChunkSource* nvme_source_ = nullptr;        // in sources_ when there is a burst buffer
  ChunkSource* repository_source_ = nullptr;  // in sources_, always last

  std::atomic<uint64_t> demoted_{0}, demoted_bytes_{0}, dropped_{0}, evicted_on_nvme_{0}, local_writes_{0},
      local_write_bytes_{0};
};

}  // namespace cairn
