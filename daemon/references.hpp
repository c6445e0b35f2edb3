// How many live models reference each chunk: the lineage-aware eviction policy keeps the chunks
// of shared ancestor layers resident (policy/eviction.hpp). Counted on commit, recovery and load
// (+1 per live model), on retire and on a failed flush (-1), and passed on to the DRAM tier.
//
// Owns: the per-chunk counts and their lock. Never does I/O.
//
// Thread-safety: every method may be called from any thread. Lock order: may be called with the
// flusher's lock held; takes the DRAM tier's policy lock inside its own.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/hash.hpp"
#include "core/sync.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

class ReferenceCounts {
 public:
  explicit ReferenceCounts(DramTier& dram) : dram_(dram) {}
  // +1 (delta > 0) or -1 for every chunk reference of m, told to the DRAM policy.
  void count(const ModelManifest& m, int delta);
  // +1 for every chunk reference of every model given (a daemon's start): the same counts as one
  // count() each, summed per shared tensor list first and told to the DRAM policy once per chunk,
  // so 100,000 children inheriting one list cost 100,000 additions, not 100,000 list walks.
  void count_all(const std::vector<std::shared_ptr<const ModelManifest>>& models);

 private:
  DramTier& dram_;
  cairn::Mutex mu_;
  std::unordered_map<ChunkHash, uint32_t, ChunkHashHasher> refs_ CAIRN_GUARDED_BY(mu_);
};

}  // namespace cairn
