// NvmeTier's internals, shared by the files that implement it. Not for use outside tiers/nvme/.
//
// Impl owns the tier's state: the data file and the journal file, the index of chunks (entries),
// the extent allocator, the eviction policy, the pending models and the counters. The tier is split
// by concern around it:
//
//   journal.{hpp,cpp}         the journal's record format and its replay (no state)
//   extent_io.{hpp,cpp}       reading and writing an extent of the data file with direct I/O (no state)
//   nvme_tier_journal.cpp     keeping the journal in step with the state: append, drop, compaction
//   nvme_tier_open.cpp        open and recovery: replay, the allocator rebuilt, dirty chunks verified
//   nvme_tier_write.cpp       put (space, eviction, write, record) and the model records
//   nvme_tier.cpp             read, mark_clean, remove, stats, close
//
// Locks: jmu serializes the journal's appends and compactions; mu guards the index and everything
// else that changes. Lock order: jmu, then mu. I/O on the data file runs with neither held; a
// journal write runs with jmu held (so records land in the order the state changed), never mu.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/sync.hpp"
#include "tiers/nvme/nvme_tier.hpp"

namespace cairn {

struct NvmeTier::Impl {
  Options opt;
  FileSystem* fs = nullptr;
  std::string data_path, journal_path, lock_path;
  std::unique_ptr<File> data;
  int lock_fd = -1;

  // The journal: appends are serialized; jsize is where the next record goes. Lock order: jmu, then mu.
  cairn::Mutex jmu;
  std::unique_ptr<File> journal;
  uint64_t jsize = 0;
  uint64_t jlive_hint = 0;  // journal bytes of the state at the last compaction
  // An append failed: what the journal holds past its last good record is unknown (a torn record,
  // or whole records that were never made durable and may name extents given out again since). The
  // next append rewrites the journal from the state first.
  bool broken CAIRN_GUARDED_BY(jmu) = false;

  mutable cairn::Mutex mu;
  cairn::CondVar unpinned;  // an entry's pins dropped to 0
  cairn::CondVar landed;    // a put finished with its chunks (inflight shrank)
  // Chunks a put is storing right now (between planning and recording): a second put of the same
  // chunk waits for the first instead of storing it twice.
  std::unordered_set<ChunkHash, ChunkHashHasher> inflight CAIRN_GUARDED_BY(mu);
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries CAIRN_GUARDED_BY(mu);
  std::unordered_map<ChunkHash, bool, ChunkHashHasher> doomed;  // pinned entries to drop at unpin (true: corrupt)
  std::unique_ptr<ArenaAllocator> alloc CAIRN_GUARDED_BY(mu);
  // Extents freed since the last journal sync: reused only once their DEL records are durable.
  std::vector<std::pair<uint64_t, uint64_t>> quarantine CAIRN_GUARDED_BY(mu);
  std::map<std::string, PendingModel> models CAIRN_GUARDED_BY(mu);
  std::unique_ptr<EvictionPolicy> policy CAIRN_GUARDED_BY(mu);
  uint64_t hits = 0, misses = 0, bytes_in = 0, bytes_out = 0, dirty_bytes = 0, corrupt = 0;

  // ---- the journal, in step with the state (nvme_tier_journal.cpp) ----

  // Appends records (and syncs when asked). Sync also releases the quarantine. on_durable, when
  // given, runs once the records are on the device, with jmu and mu held: a put makes its chunks
  // visible there, so a compaction (which snapshots the state under jmu) never misses a chunk whose
  // record it replaces.
  //
  // Every change of the state is journalled with jmu held from the change (under mu) to the write,
  // so the journal's order is the state's order (a DEL never lands after a later PUT of the same
  // chunk) and a sync releases only quarantined extents whose DEL records are already written.
  Status append(const std::string& records, bool sync, const std::function<void()>& on_durable = {});
  Status append_locked(const std::string& records, bool sync, const std::function<void()>& on_durable = {})
      CAIRN_REQUIRES(jmu);

  // Drops an entry (its extent goes to the quarantine) and returns its DEL record.
  void drop_locked(const ChunkHash& h, std::string& records) CAIRN_REQUIRES(mu);

  // The whole state as journal records (for compaction).
  std::string snapshot_locked() const CAIRN_REQUIRES(mu);

  // Rewrites the journal as the current state: journal.tmp, sync, rename, directory sync.
  Status compact();
  Status compact_locked() CAIRN_REQUIRES(jmu);
  // Compacts when the journal is at least 64 MiB and 8 times the state it held at the last
  // compaction.
  Status maybe_compact();

  // ---- the write path (nvme_tier_write.cpp) ----

  // One pass of put(): stores what it can; chunks another put is storing go to later.
  Status put_batch(std::span<const Put> chunks, std::vector<Put>& later);
};

}  // namespace cairn
