// The DRAM tier: chunks resident in the shared-memory arena.
//
// Each resident chunk has an extent in the arena, a pin count and a dirty flag (not yet in the
// repository). A pinned chunk never moves or leaves (clients hold zero-copy views of it); a dirty
// one never leaves. When space is short, allocate() evicts clean, unpinned chunks in the order the
// eviction policy prefers; when nothing can go it fails with kNoSpace.
//
// Loading from a lower tier is coordinated so that a chunk wanted by many readers at once is read
// once: claim() hands the load to the first caller and makes the others wait for it.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/hash.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "policy/eviction.hpp"
#include "tiers/dram/arena.hpp"
#include "tiers/tier.hpp"

namespace cairn {

class DramTier {
 public:
  // Creates the arena and starts backing it with memory in the background (MADV_POPULATE_WRITE,
  // 64 MiB at a time), so that loads and writes do not pay a page fault per 4 KiB later: the tier's
  // capacity is memory the node gives to cairn. backpressure_timeout: how long allocate() waits
  // for the flusher when dirty chunks stand in the way (0: kNoSpace at once).
  static Result<std::unique_ptr<DramTier>> create(
      uint64_t capacity, std::unique_ptr<EvictionPolicy> policy, const std::string& name,
      std::chrono::milliseconds backpressure_timeout = std::chrono::milliseconds(0));
  ~DramTier();
  // Bytes of the arena backed with memory so far (== arena_size() once the background pass is done,
  // or less on kernels without MADV_POPULATE_WRITE).
  uint64_t prefaulted_bytes() const { return prefaulted_.load(); }
  bool prefault_finished() const { return prefault_done_.load(); }

  int arena_fd() const { return arena_->fd(); }
  uint64_t arena_size() const { return arena_->capacity(); }
  uint8_t* base() const { return arena_->base(); }

  // Space for bytes that are not (yet) chunks: staging for writes, named tensors, assembled views.
  // Allocations are aligned to 4 KiB (so chunks can go to and from the NVMe tier with direct I/O).
  // Evicts clean, unpinned chunks as needed. When the rest is pinned or open writes, kNoSpace at
  // once, naming the request and what is held; when dirty chunks stand in the way (the flusher
  // will make them clean), waits for it up to the back-pressure timeout given to create (0 fails at
  // once): a writer that outruns the disks is slowed to their pace instead of failing or growing memory.
  Result<uint64_t> allocate(uint64_t nbytes);
  // Called (outside the tier's lock) when free space falls under low_water bytes after an
  // allocation; the tier manager's demoter uses it.
  void set_pressure_hook(uint64_t low_water, std::function<void()> hook);
  uint64_t free_bytes() const;
  // Called whenever a chunk becomes resident (true) or leaves DRAM (false): the peer service tells
  // the group's chunk directory. It runs under the tier's lock: it must only queue, never block or
  // call back into the tier. Set during assembly; an empty function clears it.
  void set_residency_hook(std::function<void(const ChunkHash&, bool resident)> hook);
  // The hashes of every resident chunk now (the peer service re-announces them when homes move).
  std::vector<ChunkHash> resident_chunks() const;

  // For the demoter: picks the policy's next victim among clean, unpinned chunks, pins it and
  // returns (hash, offset, length); nullopt when none can go. Then finish_demotion drops it (unless
  // someone else pinned it meanwhile, when it is only unpinned).
  struct Victim {
    ChunkHash hash;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t accesses = 0;    // reads while it was resident
    uint32_t references = 0;  // live models using it, as last hinted
  };
  std::optional<Victim> take_victim();
  void finish_demotion(const ChunkHash& hash);
  // Pins a resident chunk; nullopt when it is not resident. With length, also its length in bytes.
  std::optional<uint64_t> pin_if_resident(const ChunkHash& hash, uint64_t* length = nullptr);
  // Passes lineage hints to the policy.
  void hint_references(const ChunkHash& hash, uint32_t live_models);
  void hint_refetch_cost(const ChunkHash& hash, double seconds);
  // Passes a workflow's hints to the policy (policy/eviction.hpp: set_expected_use, set_population,
  // set_done). Advice: pinned and dirty chunks stay whatever the policy thinks of them.
  // Each finite hint_expected_use announces one more read (two candidates that will load the same
  // parent chunk are two reads); +inf or NaN withdraws them all. The policy is told the soonest.
  void hint_expected_use(const ChunkHash& hash, double seconds);
  // parent_chance: the chance that the next parent drawn from the population uses the chunk
  // (EvictionPolicy::set_parent_chance); NaN when the population hint had no scores.
  void hint_population(const ChunkHash& hash, bool member,
                       double parent_chance = std::numeric_limits<double>::quiet_NaN());
  void hint_done(const ChunkHash& hash);
  // Whether a model that uses the chunk is being read in a cycle (policy/eviction.hpp: set_cyclic).
  // Kept like the other hints: a chunk that enters later (a read bringing it back) is cyclic too,
  // until hint_cyclic(hash, false).
  void hint_cyclic(const ChunkHash& hash, bool cyclic);
  // A client read the chunk (a lease, not a prefetch): that fulfils its soonest announced read; the
  // policy is told the next one, if any.
  void hint_read(const ChunkHash& hash);
  // Gives back [offset, offset+nbytes) (any aligned sub-range of an allocation).
  void release(uint64_t offset, uint64_t nbytes);

  // The outcome of claim(): the chunk is resident (and now pinned, at offset), or the caller must
  // load it (and then call finish_load or abort_load), or another caller is loading it (call
  // wait_pin later).
  enum class ClaimKind { kResident, kLoad, kLoading };
  struct Claim {
    ClaimKind kind;
    uint64_t offset = 0;
  };
  // Counts a hit (resident) or a miss.
  Claim claim(const ChunkHash& hash);
  // The bytes of a claimed chunk are at [offset, offset+length) (space from allocate()): the chunk
  // becomes resident, clean and pinned once.
  void finish_load(const ChunkHash& hash, uint64_t offset, uint64_t length);
  // The load failed: waiters are woken and will claim again.
  void abort_load(const ChunkHash& hash);
  // Waits until a chunk loaded by someone else is resident and pins it; nullopt if its load failed.
  std::optional<uint64_t> wait_pin(const ChunkHash& hash);

  // A chunk whose bytes a client just wrote at [offset, offset+length). If a copy is resident
  // already, the new range is released and the existing copy used. Either way the chunk is pinned
  // once and its offset returned. dirty: not yet in the repository (a resident clean copy becomes
  // dirty; a dirty one stays dirty whatever `dirty` says). If another caller is loading the chunk
  // (claim returned kLoad), waits until it finishes or aborts the load.
  uint64_t adopt(const ChunkHash& hash, uint64_t offset, uint64_t length, bool dirty);
  void unpin(const ChunkHash& hash);
  void mark_clean(const ChunkHash& hash);
  // The offset of a resident chunk without pinning it (for flushing dirty chunks, which cannot move).
  std::optional<uint64_t> offset_of(const ChunkHash& hash) const;

  TierStats stats() const;

 private:
  struct Resident {
    uint64_t offset;
    uint64_t length;
    uint32_t pins;
    bool dirty;
    uint32_t accesses = 0;    // reads while resident (admission to NVMe)
    uint32_t references = 0;  // live models using it, as last hinted
  };
  DramTier(std::unique_ptr<SharedArena> arena, std::unique_ptr<EvictionPolicy> policy,
           std::chrono::milliseconds backpressure_timeout);
  // Evicts one victim; false when none can go.
  bool evict_one_locked() CAIRN_REQUIRES(mu_);

  std::unique_ptr<SharedArena> arena_;
  std::atomic<bool> stop_prefault_{false};
  std::atomic<uint64_t> prefaulted_{0};
  std::atomic<bool> prefault_done_{false};
  std::thread prefault_;
  mutable cairn::Mutex mu_;
  cairn::CondVar loaded_cv_;
  cairn::CondVar space_cv_;                               // space may have become free
  const std::chrono::milliseconds backpressure_timeout_;  // 0: no waiting (kNoSpace at once)
  uint64_t low_water_ = 0;
  std::function<void()> pressure_hook_;
  std::function<void(const ChunkHash&, bool)> residency_hook_ CAIRN_GUARDED_BY(mu_);
  ArenaAllocator alloc_ CAIRN_GUARDED_BY(mu_);
  std::unique_ptr<EvictionPolicy> policy_ CAIRN_GUARDED_BY(mu_);
  std::unordered_map<ChunkHash, Resident, ChunkHashHasher> chunks_ CAIRN_GUARDED_BY(mu_);
  // What hints said of chunks, resident or not: passed to the policy again when a chunk enters (the
  // policy ignores hints on chunks it does not track). Neutral entries are dropped.
  struct HintTerms {
    bool population = false;
    double parent_chance = std::numeric_limits<double>::quiet_NaN();  // with population; NaN: not known
    bool done = false;
    bool cyclic = false;
    std::vector<int64_t> expected_at_ns;  // the announced reads not yet made, soonest first (steady clock)
  };
  std::unordered_map<ChunkHash, HintTerms, ChunkHashHasher> hinted_ CAIRN_GUARDED_BY(mu_);
  // Passes the chunk's hint terms, if any, to the policy (after track()).
  void reapply_hints_locked(const ChunkHash& hash) CAIRN_REQUIRES(mu_);
  // Tells the policy the chunk's soonest announced read (or none), after
  // dropping the ones overdue by more than a minute (the policy's grace: reads that never came).
  void pass_expected_locked(const ChunkHash& hash, HintTerms& t) CAIRN_REQUIRES(mu_);
  // The chunk's entry, created if missing (bounded: see the .cpp).
  std::unordered_map<ChunkHash, HintTerms, ChunkHashHasher>::iterator hint_entry_locked(const ChunkHash& hash)
      CAIRN_REQUIRES(mu_);
  // Drops the entry when it says nothing.
  void prune_hint_locked(std::unordered_map<ChunkHash, HintTerms, ChunkHashHasher>::iterator it) CAIRN_REQUIRES(mu_);
  std::unordered_set<ChunkHash, ChunkHashHasher> loading_ CAIRN_GUARDED_BY(mu_);
  uint64_t hits_ = 0, misses_ = 0, bytes_in_ = 0, bytes_out_ = 0, dirty_bytes_ = 0, chunk_bytes_ = 0;
  uint64_t backpressure_waits_ = 0;
};

}  // namespace cairn
