// The repository: the durable home of models, a directory on the parallel filesystem, shared by
// any number of processes (every daemon of a job, and of the user's other jobs).
// Via the FileSystem seam (core/fs.hpp): pack, log, checkpoint and FORMAT writes, read_chunk.
// Claims, lease, scans, remove, gc, fsck: POSIX. The manifest types and their JSON form are in
// manifest.hpp (included here); the implementation's files are listed in repository_impl.hpp.
//
// Layout (docs/repository-format.md, version 2):
//   FORMAT                          "cairn-repository 2\nchunk_size N\n"
//   logs/<wid>-<seq>.log            a writer's manifest log: checksummed records (commit, retire,
//                                   collect, remove), appended with group commit
//   packs/<wid>-<seq>.pack          a writer's pack segment: small models' new chunks, appended
//   packs/<name>.safetensors        a pack of its own for a model with many new bytes (and every
//                                   pack of a migrated version-1 repository): a valid safetensors file
//   checkpoints/ckpt-<seq>.ckpt     the catalog at some point of every log, so open reads only tails
//   writers/, claims/, maintenance.lease   coordination between processes (coordination.hpp)
// A model exists once its commit record is durable. Data is durable before the record that names
// it. Ids are unique across every writer (claims). Other writers' models appear at refresh() (the
// daemon calls it every repository_refresh), and at once when a lookup misses.
//
// Thread-safety: all methods may be called concurrently. Commits of one handle are planned one at a
// time (so two commits never store the same new chunk twice) and made durable together (group
// commit); reads run in parallel with everything.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/progress.hpp"
#include "core/status.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

class FileSystem;

struct RepositoryStats {
  uint64_t models = 0;
  uint64_t packs = 0;
  uint64_t logical_bytes = 0;   // sum over models of their tensor bytes
  uint64_t physical_bytes = 0;  // raw bytes of the distinct chunks stored (each chunk counted once)
  uint64_t stored_bytes = 0;    // what those chunks take in the pack files, coded (<= physical_bytes)
  uint64_t chunks = 0;          // distinct chunks stored
  uint64_t retired = 0;         // models retired and not yet deleted by gc (collected ones included)
  uint64_t files = 0;           // files under the repository directory (packs, logs, checkpoints, ...)
  uint64_t group_syncs = 0;     // group writes of records by this handle (each one fdatasync)
  uint64_t writers_alive = 0;   // writers registered and alive, this one included
  // The stored chunk locations by coding (index: ChunkCoding): how many, their raw bytes, and the
  // bytes they take in the packs. A chunk stored twice counts twice here.
  struct Coding {
    uint64_t chunks = 0;
    uint64_t bytes = 0;
    uint64_t stored = 0;
  };
  std::array<Coding, kChunkCodingCount> codings{};
};

// What one model costs in the repository (Repository::usage): the bytes of the distinct chunk
// locations it references (a delta's base included), those that none of its ancestors references
// (what it added), and those of it and all its ancestors together.
struct ModelUsage {
  std::string id;
  uint64_t logical_bytes = 0;         // its tensors' bytes
  uint64_t chunks = 0;                // distinct locations it references
  uint64_t raw_bytes = 0;             // their raw bytes
  uint64_t stored_bytes = 0;          // what they take in the packs
  uint64_t own_raw_bytes = 0;         // of those, the ones no ancestor references: raw
  uint64_t own_stored_bytes = 0;      // and stored
  uint64_t lineage_stored_bytes = 0;  // it and all its ancestors together, stored
  uint64_t ancestors = 0;             // how many ancestors that counted
};

// What Repository::gc did.
struct GcReport {
  std::vector<std::string> removed;    // retired models whose manifests were deleted
  std::vector<std::string> collected;  // retired models kept (without data) for their descendants' lineage
  uint64_t packs_deleted = 0;
  uint64_t bytes_released = 0;       // by how much stats().physical_bytes fell
  uint64_t bytes_punched = 0;        // blocks freed inside packs still in use (hole punching), measured
  uint64_t bytes_unreclaimable = 0;  // dead bytes left allocated: the filesystem cannot punch holes
};

// Where Repository::gc lets a caller that holds a lock of its own around it (cairnd's gc lock,
// which holds its commits and reads off) hold that lock only while gc decides, not while it waits:
// for another process's maintenance (the lease, up to 30 s), or through the grace before bytes are
// freed (gc_grace while other writers are alive), which a whole peer group's reads would otherwise
// queue behind.
struct GcSteps {
  // Once the maintenance lease is held, before gc reads the logs and decides what goes: the caller
  // takes its lock (and makes sure what it must have in the repository is there). An error ends gc
  // with that error, before anything changed.
  std::function<Status()> deciding;
  // Once the records are durable and the view updated (report.removed and report.collected are
  // final), before the grace and the freeing of bytes: what this process starts from here on sees
  // the view without them, so the caller may let its commits and reads go on. It runs under gc's
  // write lock: it must not call this Repository (what it lets go on may, and waits for the grace).
  std::function<void(const GcReport& report)> decided;
  // Optional: the dead packs reclaimed so far against their number, once gc has decided.
  OperationProgress* progress = nullptr;
};

// What Repository::fsck found.
struct FsckReport {
  struct Problem {
    std::string model;  // "" for orphans
    std::string tensor;
    std::string pack;
    uint64_t offset = 0;
    uint64_t length = 0;
    std::string detail;
  };
  uint64_t models = 0;
  uint64_t chunks = 0;            // chunk references checked
  uint64_t bytes_verified = 0;    // read back and checked against their hashes
  std::vector<Problem> dangling;  // referenced chunks that are missing, truncated or corrupt
  std::vector<Problem> orphaned;  // allocated bytes (or whole pack files) no manifest references
  uint64_t orphaned_bytes = 0;
  bool ok() const { return dangling.empty(); }
};

// Tunables of a Repository handle (the daemon sets them from its config).
struct RepositoryOptions {
  // A model whose new chunks reach this many bytes gets a pack file of its own (a valid
  // safetensors file); smaller ones go into this writer's pack segment. 0: every model its own pack.
  uint64_t own_pack_bytes = 64ull << 20;
  // A pack segment or a log is sealed and a new one started beyond these sizes.
  uint64_t segment_bytes = 1ull << 30;
  uint64_t log_bytes = 256ull << 20;
  // gc frees bytes only this long after the records that made them dead, when other writers are
  // alive (they may be planning a commit against a view older than those records). A committer
  // whose view is older than half of it refreshes before it writes its record.
  std::chrono::milliseconds gc_grace{5000};
  // Open compacts when at least this many logs of writers that are gone are not in a checkpoint.
  size_t compact_after_logs = 16;
  // Packs are read with direct I/O where the filesystem allows it (repository_read.cpp); false:
  // through the page cache (config repository_direct_reads).
  bool direct_reads = true;
  // Chunks are coded as they are written (core/chunk_coding.hpp; config repository_compression):
  // compress: byte planes and zstd; deltas: also against the same chunk of the parent's tensor of
  // the same name, dtype and shape. A chunk that codes to less than coding.min_saving is stored raw.
  bool compress = true;
  bool deltas = true;
  CodingOptions coding;
  size_t coding_threads = 0;  // chunks of a commit coded at once; 0: one per core
};

// What refresh() found: models other writers published, and models removed, since the last one.
struct RefreshReport {
  std::vector<std::shared_ptr<const ModelManifest>> added;
  std::vector<std::string> removed;
  std::vector<std::string> retired;  // became retired or collected (their manifests changed)
  bool reloaded = false;             // the logs were compacted under us: the catalog was rebuilt
};

struct CompactReport {
  uint64_t checkpoint_seq = 0;
  uint64_t models = 0;
  uint64_t logs_deleted = 0;
  uint64_t checkpoints_deleted = 0;
  uint64_t writers_forgotten = 0;
};

// How fresh a lookup's answer must be. kCached answers from what this handle has read of the
// writers' logs and touches no file. kRefreshOnMiss, where the cached answer would be "not here",
// first reads what other writers published since (refresh()) and answers from that: the model or
// chunk may be another writer's that this handle has not read yet (a peer's model, announced
// before the daemon's periodic refresh saw it).
enum class Freshness { kCached, kRefreshOnMiss };

class Repository {
 public:
  // Supplies the bytes of a chunk the repository does not hold yet. The pointer must stay valid
  // until commit returns.
  using ChunkSource = std::function<Result<const void*>(const ChunkHash& hash, uint64_t length)>;

  // Opens (creating if missing) the repository at dir. A new repository records chunk_size; an
  // existing one keeps its own (chunk_size() tells). Rebuilds the catalog from the manifests,
  // removes temporary files and unreferenced packs left by a crash (the writer only). A manifest
  // that does not parse or check, a missing parent, or a missing or truncated pack fails open with
  // kCorruption naming the file; a non-empty directory without FORMAT, or another format version,
  // is kInvalidArgument. fs: where pack and manifest bytes are written and chunks read (see the top
  // of this file); nullptr = posix_fs(). It must outlive the Repository.
  // A version-1 repository (one manifest file per model) is migrated on open when the directory
  // is writable, else refused with a message naming `cairn migrate`.
  static Result<std::unique_ptr<Repository>> open(const std::string& dir, uint64_t chunk_size, FileSystem* fs = nullptr,
                                                  const RepositoryOptions& options = {});
  ~Repository();

  uint64_t chunk_size() const;
  const std::string& dir() const;
  // False when this process may not write the directory (then commit, remove and gc fail).
  bool writable() const;
  // This handle's writer id ("w" + 16 hex digits): its files are named after it.
  const std::string& writer_id() const;

  // Reserves id for a commit of this handle: kExists when a model of that id is in the repository
  // (looked up on the spot in every writer's log) or another live writer is committing it. Commit
  // takes the claim over (and claims by itself when it was not claimed); release_claim gives it
  // back when the commit will not happen.
  Status claim(const std::string& id);
  void release_claim(const std::string& id);
  // Reads what other writers published since the last call (and touches this writer's liveness
  // file). The daemon calls it every repository_refresh; a lookup with Freshness::kRefreshOnMiss
  // that misses calls it too.
  Result<RefreshReport> refresh();
  // Writes a checkpoint of the catalog and deletes the logs it makes unnecessary (logs of writers
  // that are gone), under the maintenance lease.
  Result<CompactReport> compact();
  // Compacts when compact_after_logs logs of writers that are gone are not in a checkpoint yet and
  // nobody else holds the maintenance lease (the daemon's watch calls it now and then). A report
  // with checkpoint_seq 0 when it did nothing.
  Result<CompactReport> compact_if_needed();

  // Makes m durable. REQUIRES: m.id new (else kExists); m.parent "" or an existing model (else
  // kNotFound); every tensor's chunks have hash and length set, consistent with nbytes and
  // chunk_size (else kInvalidArgument). Chunks already stored are referenced, not written; the
  // others are taken from src and written, once each, to the model's new pack. On success m's
  // ChunkRefs, pack and created_ns are filled in. On failure nothing is visible.
  //
  // New chunks are coded (RepositoryOptions::compress); a delta needs the bytes of the chunk it is
  // coded against, a chunk the repository holds: `resident` (optional) gives them when the caller
  // has them in memory (an error or nullptr: it has not), else they are read from the repository.
  Status commit(ModelManifest& m, const ChunkSource& src, const ChunkSource& resident = nullptr);
  // Commits several models with one group write of their records (the flusher's batches). Each
  // model succeeds or fails on its own ((*results)[i]); a model may name an earlier one of the
  // batch as its parent. Returns the first failure, or OK.
  Status commit_batch(std::vector<ModelManifest>& ms, const ChunkSource& src, std::vector<Status>* results,
                      const ChunkSource& resident = nullptr);

  // The lookups of a model, each with its freshness (above).
  bool contains(const std::string& id, Freshness fresh = Freshness::kRefreshOnMiss) const;
  // kNotFound names the id.
  Result<ModelManifest> get(const std::string& id, Freshness fresh = Freshness::kRefreshOnMiss) const;
  // The same without a copy.
  Result<std::shared_ptr<const ModelManifest>> get_shared(const std::string& id,
                                                          Freshness fresh = Freshness::kRefreshOnMiss) const;
  std::vector<std::string> list() const;  // ids, in commit order
  std::vector<std::string> children(const std::string& id) const;
  // Where the chunk is stored, if it is.
  std::optional<ChunkRef> locate(const ChunkHash& hash, Freshness fresh = Freshness::kCached) const;
  // Reads ref's bytes into dst (ref.length bytes) and verifies the hash: a mismatch
  // is kCorruption naming the pack and offset, and dst's contents are then unspecified. Packs are
  // read with direct I/O where the filesystem allows it (repository_read.cpp).
  Status read_chunk(const ChunkRef& ref, void* dst) const;
  // The same; a delta's base is taken from `resident` when the caller holds it in memory (checked
  // against its hash; otherwise read from the repository like any chunk).
  Status read_chunk(const ChunkRef& ref, void* dst, const ChunkSource& resident) const;
  // True when packs are opened for direct I/O (the page cache is bypassed where the filesystem
  // allows it, so asking the kernel to read ahead into it would only cost a second read).
  bool direct_reads() const;
  // Deletes a model. kNotFound if absent; kBusy if it has descendants (they need its lineage).
  // Packs whose chunks no remaining model references are deleted at once.
  Status remove(const std::string& id);

  // Marks a model retired (durably: its manifest is rewritten). Its data stays until gc. Retiring
  // a retired model does nothing. kNotFound if absent.
  Status retire(const std::string& id);
  // Deletes retired models that have no descendants left (children first), keeps the others as
  // collected manifests without tensors, deletes packs no manifest references and punches holes
  // over the dead ranges of packs still in use. Crash-safe at every step: manifests change before
  // data is freed, and only bytes no manifest on disk references are ever freed.
  // Steps (optional): where gc calls back, for a caller with a lock of its own (GcSteps). Gcs of
  // one Repository run one at a time (a second waits for the first).
  Result<GcReport> gc(const GcSteps& steps = {});
  // Checks every chunk reference (pack present, range inside it, and with verify_data the bytes
  // against their hash) and reports allocated bytes and pack files nothing references.
  // progress (optional): the chunk references checked (with verify_data: the bytes read) against
  // the total, then the pack files scanned for orphans.
  Result<FsckReport> fsck(bool verify_data, OperationProgress* progress = nullptr) const;

  RepositoryStats stats() const;
  // What one model costs: its chunks' raw and stored bytes, what it added over its ancestors, and
  // what it and its ancestors take together (ModelUsage). kNotFound names the id.
  Result<ModelUsage> usage(const std::string& id, Freshness fresh = Freshness::kRefreshOnMiss) const;

 private:
  // The model, or nullptr; with kRefreshOnMiss, refreshing once when it is not in the catalog.
  std::shared_ptr<const ModelManifest> find(const std::string& id, Freshness fresh) const;
  struct Impl;
  explicit Repository(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
