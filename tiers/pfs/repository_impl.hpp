// Repository's internals, shared by the files that implement it. Not for use outside tiers/pfs/.
// Format and protocol: docs/repository-format.md.
//
// Why this shape: Lustre and GPFS are slow at metadata, so a commit creates exactly two files (one
// pack, one manifest) with large sequential writes, and open reads one manifest and one pack prefix
// per model. Everything else (lineage, chunk index, reference counts) is derived in memory.
//
// Impl owns the repository's state: its directory and write lock, the catalog (models in commit
// order, lineage, the chunk index, the packs and their reference counts, the byte counters) and the
// cache of packs open for reading. The repository is split by concern around it:
//
//   manifest.{hpp,cpp}              the manifest, its JSON codec and its checks (no state, no I/O)
//   repo_files.{hpp,cpp}            file names and POSIX helpers, the atomic publish (no state)
//   repository_open.cpp             lock, FORMAT, the catalog scan and crash recovery at open, and
//                                   the catalog's bookkeeping (add, drop, release a model's data)
//   repository_commit.cpp           the write path: a new pack and manifest per commit, and the
//                                   manifest rewrite that retire and gc use
//   repository_read.cpp             the open-pack cache and read_chunk
//   repository_maintenance.cpp      remove, retire, gc (pack deletion, hole punching) and fsck
//   repository.cpp                  the public Repository, forwarding here
//
// The crash-safety rule all of them keep: a model exists once its manifest is in place; data is
// written (and made durable) before the manifest that references it, and freed only after no
// manifest on disk references it. Whatever a crash leaves between the two, open cleans up.
//
// Locks: write_mu_ serializes the operations that change the repository (commit, remove, retire,
// gc); mu_ guards the catalog; fd_mu_ guards the open-pack cache alone. Lock order: write_mu_, then
// mu_. fd_mu_ is never held with mu_. Pack and manifest writes and chunk reads run with mu_
// released.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.hpp"
#include "core/hash.hpp"
#include "tiers/pfs/repo_files.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

struct Repository::Impl {
  // What the catalog knows of one pack file that some model references.
  struct PackInfo {
    uint64_t data_begin = 0;         // 8 + N: where the safetensors data section starts
    uint64_t data_bytes = 0;         // the data section: every chunk written to it, live or not
    uint64_t refs = 0;               // chunk references from manifests, plus 1 for the owning model
    std::vector<ChunkHash> indexed;  // chunks whose index entry points into this pack
  };

  // One distinct live chunk.
  struct ChunkInfo {
    ChunkRef ref;       // its first stored location
    uint64_t refs = 0;  // (model, tensor, chunk slot) references
  };

  std::string dir_;
  std::string packs_dir_;
  std::string manifests_dir_;
  uint64_t chunk_size_ = 0;
  bool writer_ = false;
  pfs::UniqueFd lock_fd_;
  FileSystem* fs_ = nullptr;  // pack and manifest writes, chunk reads (never null after open)
  std::atomic<uint64_t> tmp_counter_{0};

  // Serializes commit, remove, retire and gc; they alone change the catalog after open.
  std::mutex write_mu_;

  // The catalog. Read under a shared lock, changed under an exclusive one (with write_mu_ held).
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> models_;
  std::vector<std::string> order_;  // commit order
  std::unordered_map<std::string, std::vector<std::string>> children_;
  std::unordered_map<ChunkHash, ChunkInfo, ChunkHashHasher> chunks_;
  std::unordered_map<std::string, PackInfo> packs_;
  uint64_t logical_bytes_ = 0;
  uint64_t physical_bytes_ = 0;  // bytes of the distinct chunks some manifest references
  uint64_t retired_ = 0;
  int64_t last_created_ns_ = 0;

  // Open packs for reading, at most kMaxOpenPacks (repository_read.cpp); shared so a reader keeps
  // using one that was evicted.
  mutable std::mutex fd_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<File>> fds_;

  // A fresh temporary file name (kTmpPrefix, so open removes it if a crash leaves it behind).
  std::string tmp_name() {
    return std::string(pfs::kTmpPrefix) + std::to_string(::getpid()) + "-" +
           std::to_string(tmp_counter_.fetch_add(1));
  }
  // The manifest's file name under manifests/: the hash of the id (ids may hold any bytes).
  std::string manifest_file(const std::string& id) const {
    return hash_bytes(id.data(), id.size()).hex() + std::string(pfs::kManifestSuffix);
  }

  // ---- open (repository_open.cpp) ----

  Status open(const std::string& dir, uint64_t chunk_size);
  Status take_lock();
  // Who holds the write lock, from the LOCK file ("another process" when it tells nothing), for
  // the kBusy messages of a read-only view.
  std::string writer_description() const;
  Status init_or_read_format(uint64_t chunk_size);
  // One pass over manifests/ and packs/. *raced: a file vanished under a reader (a writer in
  // another process removed a model); the caller scans again.
  Status scan(bool* raced);

  // ---- catalog changes (repository_open.cpp; mu_ held exclusively) ----

  void add_model(std::shared_ptr<const ModelManifest> m);
  // Returns the packs that no model references any more (already dropped from the catalog).
  std::vector<std::string> drop_model(const std::string& id);
  // Drops m's chunk and pack references; appends packs nothing references any more to *dead.
  void release_data(const ModelManifest& m, std::vector<std::string>* dead);
  void clear_catalog();

  // ---- the write path (repository_commit.cpp) ----

  Status commit(ModelManifest& m, const Repository::ChunkSource& src);
  // Publishes m's manifest atomically (replacing: it replaces the one in place).
  Status write_manifest(const ModelManifest& m, bool replacing);

  // ---- reads (repository_read.cpp) ----

  Status read_chunk(const ChunkRef& ref, void* dst) const;
  Result<std::shared_ptr<File>> pack_file(const std::string& pack) const;
  // Drops pack from the open-pack cache (before the pack file is deleted).
  void forget_pack_file(const std::string& pack) const;

  // ---- maintenance (repository_maintenance.cpp) ----

  Status remove(const std::string& id);
  Status retire(const std::string& id);
  Result<GcReport> gc();
  Result<FsckReport> fsck(bool verify_data) const;
  // Deletes dead packs and punches the ranges of live packs that no chunk reference covers.
  void reclaim(const std::vector<std::string>& dead, GcReport* report);
};

}  // namespace cairn
