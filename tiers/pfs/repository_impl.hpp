// Repository's internals, shared by the files that implement it. Not for use outside tiers/pfs/.
// Format and protocol: docs/repository-format.md.
//
// Why this shape: Lustre and GPFS are slow at metadata and one repository is opened at once by
// many daemons. So every writer (one per Repository handle that writes) appends to files of its own:
// a manifest log (logs/<wid>-<seq>.log, checksummed records, group commit: one fdatasync per batch)
// and a pack segment (packs/<wid>-<seq>.pack) for small models' new chunks; a model whose new bytes
// reach own_pack_bytes gets a pack of its own, a valid safetensors file. The catalog is rebuilt at
// open from the newest checkpoint (checkpoints/ckpt-<seq>.ckpt, records too) and the logs' tails,
// and kept current by refresh(), which reads the tails of the other writers' logs. Model ids are
// kept unique across writers by claims (coordination.hpp); gc and compaction run under a lease.
//
// Impl owns the repository's state: its directory, the coordination files, this writer's log and
// segment, the read cursors over the other logs, the catalog (models in commit order, lineage, the
// chunk index, the packs and their reference counts, the byte counters) and the cache of packs open
// for reading. The repository is split by concern around it:
//
//   records.{hpp,cpp}               the record codec (no state, no I/O)
//   coordination.{hpp,cpp}          writers, claims, the maintenance lease (files only)
//   manifest.{hpp,cpp}              the manifest, its JSON codec and its checks (no state, no I/O)
//   repo_files.{hpp,cpp}            file names and POSIX helpers, the atomic publish (no state)
//   repository_open.cpp             FORMAT, open, and the catalog's bookkeeping (add, drop, release)
//   repository_migrate.cpp          reading a version-1 repository and migrating it
//   repository_sync.cpp             applying records, refresh, checkpoints and compaction
//   repository_commit.cpp           the write path: plan, data, records, group commit
//   repository_read.cpp             the open-pack cache and read_chunk
//   repository_maintenance.cpp      remove, retire, gc (pack deletion, hole punching) and fsck
//   repository.cpp                  the public Repository, forwarding here
//
// The crash-safety rule all of them keep: a model exists once its commit record is durable in a
// log (or a checkpoint); data is made durable before the record that references it, and freed only
// when no record on disk references it and no writer can still be planning to.
//
// Locks: write_mu_ serializes this handle's changes (plan and data of commits, remove, retire,
// gc); refresh_mu_ serializes reading other logs; sync_mu_ guards the group commit queue; mu_
// guards the catalog; fd_mu_ the open-pack cache alone. Lock order: write_mu_, refresh_mu_, mu_;
// sync_mu_ and fd_mu_ are never held with another.
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.hpp"
#include "core/hash.hpp"
#include "core/sync.hpp"
#include "tiers/pfs/coordination.hpp"
#include "tiers/pfs/records.hpp"
#include "tiers/pfs/repo_files.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

namespace pfs {

// A chunk a commit stores: its bytes, how they are coded, and where they go (repository_commit.cpp).
struct NewChunk {
  ChunkHash hash;
  uint64_t length = 0;
  size_t width = 1;                 // the byte planes of its tensor's dtype (coding_width)
  std::optional<ChunkRef> base;     // the chunk a delta may be coded against (stored whole)
  const void* data = nullptr;       // its raw bytes (the chunk source's)
  const void* base_data = nullptr;  // the base's bytes, when the caller had them in memory
  EncodedChunk coded;               // raw unless coding saved enough
  uint64_t offset = 0;              // absolute, in the pack
  const void* stored() const { return coded.coding == ChunkCoding::kRaw ? data : coded.bytes.data(); }
  uint64_t stored_bytes() const { return coded.coding == ChunkCoding::kRaw ? length : coded.bytes.size(); }
};

}  // namespace pfs

struct Repository::Impl {
  // What the catalog knows of one pack file that some model references.
  struct PackInfo {
    uint64_t data_begin = 0;         // where chunk data may start: 8 + N for safetensors, 64 for segments
    uint64_t refs = 0;               // chunk references from manifests, plus 1 per model that names it as its pack
    std::vector<ChunkHash> indexed;  // chunks with a location (ref or copy) in this pack
    bool missing = false;            // the file was not there when registered (checked after a load)
  };

  // One distinct live chunk, and where it is stored. Usually once; but two live copies happen: two
  // writers storing the same bytes before either saw the other's commit, or a checkpoint's
  // collected model (written as it was before gc) naming a copy gc has freed since, ahead of the
  // model that holds the copy stored later. Every copy a manifest names is counted, and stays live
  // (reclaim) until no manifest names it: counting only the first one let gc punch the second
  // under the models that read it (found by the torture harness).
  struct ChunkCopy {
    ChunkRef ref;
    uint64_t refs = 0;  // (tensor list, tensor, chunk slot) references to this location
  };
  struct ChunkInfo {
    ChunkRef ref;                   // a live location: the one new commits reuse and locate() gives
    uint64_t refs = 0;              // references to ref
    std::vector<ChunkCopy> copies;  // the other live locations (rare)
    // ref is gone: another copy takes its place. False when there is none (the chunk leaves the
    // index).
    bool promote_copy() {
      if (copies.empty()) return false;
      ref = std::move(copies.back().ref);
      refs = copies.back().refs;
      copies.pop_back();
      return true;
    }
  };

  // A record whose model is not known yet (its commit record, or its parent's, is in a log not read
  // far enough yet). Applied when it can be.
  struct Deferred {
    pfs::RecordType type;
    std::string payload;
    std::string log;      // where it came from ("" for a checkpoint)
    uint64_t offset = 0;  // its offset there
  };

  RepositoryOptions options_;
  std::string dir_;
  std::string packs_dir_;
  std::string logs_dir_;
  std::string ckpt_dir_;
  uint64_t chunk_size_ = 0;
  bool writable_ = true;      // false: no permission to write the directory
  FileSystem* fs_ = nullptr;  // pack, log and checkpoint bytes, chunk reads (never null after open)
  std::unique_ptr<pfs::Coordination> coord_;
  std::atomic<uint64_t> tmp_counter_{0};

  // Serializes this handle's changes: plan and data of commits, remove, retire, gc, compaction.
  std::mutex write_mu_;

  // This writer's files (write_mu_; created at the first write).
  std::unique_ptr<File> log_;
  std::string log_name_;
  std::unique_ptr<File> seg_;
  std::string seg_name_;
  uint64_t seg_end_ = 0;
  uint32_t file_seq_ = 0;
  std::chrono::steady_clock::time_point view_time_{};  // when the catalog last caught up with every log

  // Group commit (sync_mu_): records queued by commits, written and synced by one leader at a time.
  std::mutex sync_mu_;
  std::condition_variable sync_cv_;
  std::string queued_;        // record bytes not yet written
  uint64_t queued_gen_ = 0;   // records queued so far
  uint64_t durable_gen_ = 0;  // records durable (or failed: see failed_)
  bool seg_dirty_ = false;    // segment bytes written since the last sync
  bool syncing_ = false;
  std::map<uint64_t, std::pair<uint64_t, Status>> failed_;  // first gen -> (last gen, why)
  uint64_t group_syncs_ = 0;

  std::map<std::string, uint64_t> own_sealed_logs_;  // this writer's earlier logs -> their size
  uint64_t log_written_ = 0;                         // sync_mu_: bytes of the current log written (durable once synced)

  // Reading the logs (refresh_mu_).
  std::mutex refresh_mu_;
  std::map<std::string, uint64_t> read_to_;  // log file -> bytes applied
  std::map<std::string, std::unique_ptr<File>> log_files_;
  std::set<std::string> warned_;   // logs with a torn end already reported
  mutable std::mutex listing_mu_;  // the two listings (a leaf lock)
  mutable pfs::DirListing logs_listing_, ckpt_listing_;
  uint64_t ckpt_seq_ = 0;  // the checkpoint loaded or written last
  bool reload_needed_ = false;
  std::chrono::steady_clock::time_point last_refresh_{};

  // The catalog. Read under a shared lock, changed under an exclusive one.
  mutable SharedMutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> models_ CAIRN_GUARDED_BY(mu_);
  std::vector<std::string> order_ CAIRN_GUARDED_BY(mu_);  // commit order (as this handle learnt of them)
  std::unordered_map<std::string, std::vector<std::string>> children_ CAIRN_GUARDED_BY(mu_);
  std::unordered_map<ChunkHash, ChunkInfo, ChunkHashHasher> chunks_ CAIRN_GUARDED_BY(mu_);
  std::unordered_map<std::string, PackInfo> packs_ CAIRN_GUARDED_BY(mu_);
  // Models holding each shared tensor list (TensorList::identity). A list's chunks are counted in
  // chunks_ and packs_ once, however many models share it: a million metadata-only children of one
  // parent cost a million counter increments here, not a million times the parent's chunk count.
  std::unordered_map<const void*, uint64_t> list_refs_ CAIRN_GUARDED_BY(mu_);
  uint64_t logical_bytes_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t physical_bytes_ CAIRN_GUARDED_BY(mu_) = 0;  // bytes of the distinct chunks some manifest references
  uint64_t stored_bytes_ CAIRN_GUARDED_BY(mu_) = 0;    // what their locations take in the packs (coded)
  using CodingCount = RepositoryStats::Coding;
  std::array<CodingCount, kChunkCodingCount> codings_ CAIRN_GUARDED_BY(mu_){};  // locations by coding
  uint64_t retired_ CAIRN_GUARDED_BY(mu_) = 0;
  int64_t last_created_ns_ CAIRN_GUARDED_BY(mu_) = 0;  // the latest stamp of any model indexed (every writer's)
  int64_t own_last_created_ns_ = 0;  // write_mu_: the latest stamp this handle committed (or was given)
  std::vector<Deferred> deferred_ CAIRN_GUARDED_BY(mu_);  // records waiting for their model (or its parent)
  // What records of other writers changed since the public refresh() last handed it out (every
  // internal refresh adds to it: a claim's, a lookup's, gc's).
  RefreshReport unreported_;
  // Collected models as they were before gc released their data: their children's commit records
  // name the parent's tensors by position. Written to checkpoints as a commit and a collect record.
  std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> collected_base_ CAIRN_GUARDED_BY(mu_);
  std::set<std::string> sealed_;  // files whose writers sealed them

  // Open packs for reading, at most kMaxOpenPacks (repository_read.cpp); shared so a reader keeps
  // using one that was evicted.
  mutable std::mutex fd_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<File>> fds_;
  // The scratch buffers of direct reads (options_.direct_reads: repository_read.cpp), kept for reuse.
  mutable std::mutex scratch_mu_;
  mutable std::vector<std::unique_ptr<AlignedBuffer>> scratch_;

  ~Impl();

  // A fresh temporary file name (kTmpPrefix: files of a commit in progress, or of a crash).
  std::string tmp_name() {
    return std::string(pfs::kTmpPrefix) + coord_->wid() + "-" + std::to_string(tmp_counter_.fetch_add(1));
  }
  const std::string& wid() const { return coord_->wid(); }

  // ---- open (repository_open.cpp) ----

  Status open(const std::string& dir, uint64_t chunk_size);
  // Reads FORMAT (creating a version-2 repository in an empty directory); *version tells which.
  Status init_or_read_format(uint64_t chunk_size, int* version);
  Status write_format(int version);
  Status check_writable();

  // ---- migration (repository_migrate.cpp) ----

  // Migrates a version-1 repository (under the lease): its manifests become a checkpoint, FORMAT
  // says 2, the manifests go. Its packs stay where they are (they are valid in version 2).
  Status migrate_v1();
  // Reads a version-1 repository's manifests (checked as version 1 did).
  Status load_v1(std::vector<std::shared_ptr<ModelManifest>>* out);

  // ---- catalog changes (repository_open.cpp; mu_ held exclusively) ----

  // False (and nothing changed) when a pack it references cannot be registered.
  Status add_model(std::shared_ptr<const ModelManifest> m) CAIRN_REQUIRES(mu_);
  // Registers a pack the catalog has not seen (reading a safetensors pack's prefix).
  Status register_pack(const std::string& pack) CAIRN_REQUIRES(mu_);
  // Returns the packs that no model references any more (already dropped from the catalog).
  std::vector<std::string> drop_model(const std::string& id) CAIRN_REQUIRES(mu_);
  // Drops m's chunk and pack references; appends packs nothing references any more to *dead.
  void release_data(const ModelManifest& m, std::vector<std::string>* dead) CAIRN_REQUIRES(mu_);
  // Adds (sign +1) or removes (-1) a stored location from the byte counters.
  void count_location(const ChunkRef& c, int sign) CAIRN_REQUIRES(mu_);
  // One more reference to the chunk stored at c (a new copy when it is stored elsewhere already).
  void add_chunk_ref(const ChunkRef& c) CAIRN_REQUIRES(mu_);
  // One reference less to the copy at c; a copy nobody references leaves the index.
  void release_chunk_ref(const ChunkRef& c) CAIRN_REQUIRES(mu_);
  void clear_catalog() CAIRN_REQUIRES(mu_);

  // ---- records, refresh, checkpoints (repository_sync.cpp) ----

  // Applies one record (mu_ held exclusively). A record about a model not known yet is deferred.
  // rep (may be null) collects what changed.
  Status apply(pfs::RecordType type, std::string_view payload, const std::string& log, uint64_t offset,
               RefreshReport* rep) CAIRN_REQUIRES(mu_);
  // Retries deferred records until none applies (mu_ held exclusively).
  void apply_deferred(RefreshReport* rep) CAIRN_REQUIRES(mu_);
  // Loads the newest checkpoint and every log (open, and a rebuild). refresh_mu_ held or at open.
  Status load(RefreshReport* rep);
  // Reads the logs' new records (own_too: this writer's logs as well). *reload: logs were compacted
  // away before we read them, so the catalog must be rebuilt. refresh_mu_ held.
  Status read_logs(RefreshReport* rep, bool* reload, bool own_too);
  Status refresh(RefreshReport* rep);
  // Refreshes when the view is older than max_age.
  Status refresh_if_older(std::chrono::milliseconds max_age);
  Status compact(CompactReport* report, bool take_lease,
                 std::chrono::milliseconds lease_wait = std::chrono::seconds(30));
  // bases: collected models as they were before gc (collected_base_).
  Status publish_checkpoint(uint64_t seq, const std::map<std::string, uint64_t>& covers,
                            const std::vector<std::shared_ptr<const ModelManifest>>& models,
                            const std::unordered_map<std::string, std::shared_ptr<const ModelManifest>>& bases = {},
                            const std::vector<Deferred>& carried = {});
  // Reads a checkpoint: its header (seq, covers) and, unless header_only, applies its models.
  Status read_checkpoint(const std::string& name, uint64_t* seq, std::map<std::string, uint64_t>* covers,
                         bool header_only, RefreshReport* rep);
  std::string newest_checkpoint() const;
  // kCorruption naming a model that references a pack file that is missing.
  Status check_packs_present();

  // ---- the write path (repository_commit.cpp) ----

  Status commit_batch(std::vector<ModelManifest>& ms, const Repository::ChunkSource& src, std::vector<Status>* results,
                      const Repository::ChunkSource& resident);
  using NewChunk = pfs::NewChunk;
  // The bytes a pack of its own reserves for its header before the chunks' data (repository_commit.cpp).
  Result<uint64_t> header_room(const ModelManifest& m, const std::vector<NewChunk>& chunks,
                               const std::vector<size_t>& tensor_first, const std::vector<bool>& whole_candidate,
                               const std::map<std::string, std::string>& meta) const;
  // Plans one model, writes its new chunks, adds it to the catalog and returns its record.
  Status stage(ModelManifest& m, const Repository::ChunkSource& src, const Repository::ChunkSource& resident,
               std::string* record);
  // Opens this writer's log and segment (write_mu_ held), rolling over to new ones when full.
  Status ensure_log();
  Status ensure_segment(uint64_t more_bytes);
  // Queues records (write_mu_ held) and returns the generation to wait for.
  uint64_t queue_records(const std::string& bytes, uint64_t count);
  uint64_t queued_gen();
  // Waits until generation gen is durable (leading the group write when nobody is).
  Status wait_durable(uint64_t gen);
  // Appends records and waits for them (remove, retire, gc).
  Status append_durable(const std::string& bytes, uint64_t count);
  // Seals this writer's files (a clean close).
  void seal();

  // ---- reads (repository_read.cpp) ----

  // resident (may be null): where a delta's base may already be in memory.
  Status read_chunk(const ChunkRef& ref, void* dst, const Repository::ChunkSource* resident = nullptr) const;
  // A coded chunk: its stored bytes (and a delta's base) read, decoded into dst and checked.
  Status read_coded(File& file, const ChunkRef& ref, void* dst, const Repository::ChunkSource* resident) const;
  Result<std::shared_ptr<File>> pack_file(const std::string& pack) const;
  // Drops pack from the open-pack cache (before the pack file is deleted).
  void forget_pack_file(const std::string& pack) const;
  std::unique_ptr<AlignedBuffer> take_scratch(uint64_t n) const;
  void give_back_scratch(std::unique_ptr<AlignedBuffer> b) const;
  Status read_direct(File& file, const ChunkRef& ref, void* dst, size_t* got, ChunkHash* hash) const;

  // ---- maintenance (repository_maintenance.cpp) ----

  Status remove(const std::string& id);
  Status retire(const std::string& id);
  // REQUIRES: write_mu_ held. Reads the logs, and rebuilds the view if they were compacted under it.
  Status whole_view_locked();
  Result<GcReport> gc(const GcSteps& steps);
  // After gc's grace: parents it removed whose children other writers committed meanwhile come back
  // as collected models (records written and applied), so the children apply. write_mu_ held.
  Status revive_parents(const std::unordered_map<std::string, std::shared_ptr<const ModelManifest>>& removed_as_was,
                        GcReport* report);
  std::mutex gc_run_mu_;  // one gc at a time: a second would meet this process's own lease (kBusy)
  Result<FsckReport> fsck(bool verify_data, OperationProgress* progress) const;
  // Deletes dead packs and punches the ranges of live packs that no chunk reference covers, in the
  // files no live writer is still appending to.
  void reclaim(const std::vector<std::string>& dead, GcReport* report, OperationProgress* progress = nullptr);
  // Whether another writer of the repository is alive.
  bool others_alive() const;
  // Whether a file of packs/ or logs/ belongs to a writer that may still append to it.
  bool owner_may_append(const std::string& name) const;
};

// Calls f with each pack location a chunk reference keeps live: the chunk's own, and a delta's base.
// f runs in its caller's scope, with its caller's locks held: the analysis checks f's body against
// f's own annotations (a lambda that reads guarded members declares CAIRN_REQUIRES), not this call.
template <class F>
void for_each_location(const ChunkRef& c, F&& f) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  f(c);
  if (c.base) f(*c.base);
}

// The whole of a small file; kNotFound when absent, kCorruption beyond max_bytes.
Status read_small_file(const std::string& path, uint64_t max_bytes, std::string* out);

// A commit record's payload: the manifest's JSON, with tensors equal to the parent's (same position)
// written as their index, or "tensors": "parent" when all are (parent may be null).
std::string encode_commit(const ModelManifest& m, const ModelManifest* parent);
Result<ModelManifest> decode_commit(nlohmann::json j, const ModelManifest* parent);

// The writer id a v2 file name starts with ("w" + 16 hex), or "" (a version-1 pack).
std::string file_writer(const std::string& name);

}  // namespace cairn
