// The NVMe tier: the node-local burst buffer.
//
// Chunks live in one preallocated data file under tiers.nvme.path, each in an extent aligned to
// 4 KiB, written and read with direct I/O (io_uring batches through the FileSystem seam). A journal
// beside it records what the data file holds, so the tier outlives a daemon crash:
//
//   <path>/data       capacity bytes; extents of chunks, padded to 4 KiB
//   <path>/journal    records: PUT(hash, offset, length, dirty), DEL(hash), CLEAN(hash),
//                     MODEL(seq, id, manifest JSON) and DONE(id); each record carries a checksum
//
// Ordering is what makes it crash-safe. A PUT is journalled only after the extent's bytes are on the
// device (fdatasync), so a record always names complete bytes; an extent torn by a crash has no
// record and is free space at the next start. A freed extent is reused only after its DEL record is
// on the device, so a record never names bytes that were overwritten. A torn record at the end of
// the journal is cut off at open. Every read is checked against the chunk's hash (the chunk id is
// its xxh3-128), and at open the bytes of every dirty chunk (one whose only durable copy is here)
// are verified, so bad bytes are discarded, never served.
//
// dirty: not yet in the repository. A dirty chunk is never evicted; the flusher writes it to the
// repository and then calls mark_clean. A MODEL record is a model committed with durability `local`
// that has not reached the repository: recovery hands these back (pending()) so the daemon finishes
// them.
//
// Thread-safety: every method may be called from any thread. I/O runs outside the index lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"
#include "policy/eviction.hpp"
#include "tiers/dram/arena.hpp"
#include "tiers/tier.hpp"

namespace cairn {

class NvmeTier {
 public:
  struct Options {
    std::string path;
    uint64_t capacity = 0;                   // bytes of the data file (rounded down to 4 KiB)
    bool persistent = false;                 // keep contents at close()
    FileSystem* fs = nullptr;                // nullptr = posix_fs()
    std::unique_ptr<EvictionPolicy> policy;  // nullptr = LRU
  };
  // A model committed `local`, recovered from the journal. seq orders them (commit order).
  struct PendingModel {
    uint64_t seq = 0;
    std::string id;
    std::string manifest_json;
  };
  struct OpenReport {
    uint64_t chunks = 0;        // chunks recovered
    uint64_t dirty_chunks = 0;  // of which not yet in the repository
    uint64_t discarded = 0;     // extents whose bytes did not match their hash
    uint64_t torn_records = 0;  // journal bytes cut off at the end (0 or 1 record)
    std::vector<PendingModel> pending;
  };

  // Opens (creating if missing) the burst buffer at options.path and recovers what a previous
  // daemon left there. kInvalidArgument when capacity is under 1 MiB; the file system's error when
  // the directory or files cannot be created.
  static Result<std::unique_ptr<NvmeTier>> open(Options options);
  ~NvmeTier();

  const OpenReport& open_report() const { return report_; }
  bool direct_io() const;

  // One chunk to store: its hash, bytes and whether the repository lacks it (dirty).
  struct Put {
    ChunkHash hash;
    const void* data = nullptr;
    uint64_t length = 0;
    bool dirty = false;
  };
  // Stores the chunks not held yet (a held clean chunk becomes dirty if dirty is asked), durably:
  // when it returns OK their bytes and records are on the device. Evicts clean, unpinned chunks as
  // needed (policy order); kNoSpace when the rest is dirty or being read. On failure nothing is
  // recorded for the chunks that failed (their extents are free again). kInvalidArgument (and
  // nothing stored) when a chunk is empty: every chunk has at least one byte. A chunk another put is
  // storing at the same time is waited for, not stored twice.
  Status put(std::span<const Put> chunks);
  // Records (durably) a model committed `local`: after a crash, open() returns it in pending.
  Status put_model(uint64_t seq, const std::string& id, const std::string& manifest_json);
  // The model reached the repository (durable with the next journal sync; losing it only makes
  // recovery find the model already in the repository).
  Status model_done(const std::string& id);

  bool contains(const ChunkHash& hash) const;
  bool is_dirty(const ChunkHash& hash) const;
  // A workflow's hints, passed to this tier's policy (policy/eviction.hpp: set_expected_use,
  // set_population, set_done), which is the same scorer as DRAM's (policy.eviction). Advice: only
  // chunks the tier holds now are affected (the policy ignores others; a chunk written here later
  // starts without them), and dirty chunks or chunks being read stay whatever the policy thinks.
  void hint_expected_use(const ChunkHash& hash, double seconds);
  // parent_chance: as DramTier::hint_population.
  void hint_population(const ChunkHash& hash, bool member,
                       double parent_chance = std::numeric_limits<double>::quiet_NaN());
  void hint_done(const ChunkHash& hash);
  // Reads a chunk into dst (length bytes, as stored). kNotFound when not held; kCorruption (naming
  // the extent) when the bytes do not match the hash: the copy is then dropped, so the next read
  // goes to the repository.
  Status read(const ChunkHash& hash, void* dst, uint64_t length);
  // The chunk is in the repository now: it may be evicted.
  void mark_clean(const ChunkHash& hash);
  // Drops a chunk (gc); dirty ones too. Unknown hashes are ignored.
  void remove(const ChunkHash& hash);
  // Chunks held, dirty first (for draining).
  std::vector<ChunkHash> dirty_chunks() const;

  TierStats stats() const;
  // Stops the tier: persistent keeps the contents (journal compacted), else the files are removed.
  // REQUIRES: the caller drained the dirty chunks when it wants them kept elsewhere (close() removes
  // them regardless when not persistent).
  Status close();

  // A copy is dropped as corrupt after this many reads in a row found it wrong: one bad read may be
  // the transfer's (the copy may be a model's only one), a copy wrong every time is the device's.
  static constexpr uint32_t kBadReadsToDrop = 3;

 private:
  struct Entry {
    uint64_t offset = 0;
    uint64_t length = 0;
    bool dirty = false;
    uint32_t pins = 0;
    uint32_t bad_reads = 0;  // reads (each tried three times) whose bytes did not match, in a row
  };
  struct Impl;
  explicit NvmeTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  OpenReport report_;
};

}  // namespace cairn
