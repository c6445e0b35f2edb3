// The repository: the durable home of models, a directory on the parallel filesystem.
// Via the FileSystem seam (core/fs.hpp): pack/manifest/FORMAT writes, read_chunk. Lock, scan, remove, gc, fsck: POSIX.
// The manifest types and their JSON form are in manifest.hpp (included here); the implementation's
// files are listed in repository_impl.hpp.
//
// Layout (docs/repository-format.md):
//   FORMAT                         "cairn-repository 1\nchunk_size N\n"
//   packs/<idhash>-<unique>.safetensors
//                                  one per committed model holding only the chunks that were new
//                                  when it was committed; a valid safetensors file
//   manifests/<idhash>.json        one per model: tensors -> chunk hashes -> (pack, offset, length)
// A model exists once its manifest is in place. Both files are written to a temporary name,
// fsync'd, renamed into place, and the directory fsync'd, so a crash leaves either the old state or
// the new one; stray temporary files and packs that no manifest references are removed at open.
// The catalog (models, lineage, chunk index, reference counts) lives in memory and is rebuilt from
// the manifests at open.
//
// Thread-safety: all methods may be called concurrently. Commits are serialized with each other
// (so two commits never store the same new chunk twice); reads run in parallel with everything.
//
// Processes: one writer, any number of readers. open() takes an exclusive flock() on <dir>/LOCK;
// the process that gets it is the writer (it cleans up after crashes, commits and removes). A
// Repository opened while another open file description holds the lock is read-only: it sees the
// models committed before its open, and commit/remove return kBusy naming the writer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

class FileSystem;

struct RepositoryStats {
  uint64_t models = 0;
  uint64_t packs = 0;
  uint64_t logical_bytes = 0;   // sum over models of their tensor bytes
  uint64_t physical_bytes = 0;  // chunk bytes held in pack files (each chunk stored once)
  uint64_t chunks = 0;          // distinct chunks stored
  uint64_t retired = 0;         // models retired and not yet deleted by gc (collected ones included)
};

// What Repository::gc did.
struct GcReport {
  std::vector<std::string> removed;    // retired models whose manifests were deleted
  std::vector<std::string> collected;  // retired models kept (without data) for their descendants' lineage
  uint64_t packs_deleted = 0;
  uint64_t bytes_released = 0;         // by how much stats().physical_bytes fell
  uint64_t bytes_punched = 0;          // blocks freed inside packs still in use (hole punching), measured
  uint64_t bytes_unreclaimable = 0;    // dead bytes left allocated: the filesystem cannot punch holes
};

// What Repository::fsck found.
struct FsckReport {
  struct Problem {
    std::string model;   // "" for orphans
    std::string tensor;
    std::string pack;
    uint64_t offset = 0;
    uint64_t length = 0;
    std::string detail;
  };
  uint64_t models = 0;
  uint64_t chunks = 0;                 // chunk references checked
  uint64_t bytes_verified = 0;         // read back and checked against their hashes
  std::vector<Problem> dangling;       // referenced chunks that are missing, truncated or corrupt
  std::vector<Problem> orphaned;       // allocated bytes (or whole pack files) no manifest references
  uint64_t orphaned_bytes = 0;
  bool ok() const { return dangling.empty(); }
};

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
  static Result<std::unique_ptr<Repository>> open(const std::string& dir, uint64_t chunk_size,
                                                  FileSystem* fs = nullptr);
  ~Repository();

  uint64_t chunk_size() const;
  const std::string& dir() const;
  // False when another process (or another Repository in this one) held the write lock at open:
  // then commit and remove return kBusy, and open did no crash cleanup.
  bool writable() const;

  // Makes m durable. REQUIRES: m.id new (else kExists); m.parent "" or an existing model (else
  // kNotFound); every tensor's chunks have hash and length set, consistent with nbytes and
  // chunk_size (else kInvalidArgument). Chunks already stored are referenced, not written; the
  // others are taken from src and written, once each, to the model's new pack. On success m's
  // ChunkRefs, pack and created_ns are filled in. On failure nothing is visible.
  Status commit(ModelManifest& m, const ChunkSource& src);

  bool contains(const std::string& id) const;
  Result<ModelManifest> get(const std::string& id) const;  // kNotFound names the id
  // The same without a copy.
  Result<std::shared_ptr<const ModelManifest>> get_shared(const std::string& id) const;
  std::vector<std::string> list() const;                   // ids, in commit order
  std::vector<std::string> children(const std::string& id) const;
  // Where the chunk is stored, if it is.
  std::optional<ChunkRef> locate(const ChunkHash& hash) const;
  // Reads ref's bytes into dst (ref.length bytes) with one pread and verifies the hash: a mismatch
  // is kCorruption naming the pack and offset, and dst's contents are then unspecified.
  Status read_chunk(const ChunkRef& ref, void* dst) const;
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
  Result<GcReport> gc();
  // Checks every chunk reference (pack present, range inside it, and with verify_data the bytes
  // against their hash) and reports allocated bytes and pack files nothing references.
  Result<FsckReport> fsck(bool verify_data) const;

  RepositoryStats stats() const;

 private:
  struct Impl;
  explicit Repository(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
