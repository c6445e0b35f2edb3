// ReadCycles: finds, from the reads alone, the models being read in a cycle that does not fit in
// DRAM (an ensemble whose members load one base model over and over, out of step). The prefetcher
// owns one and passes what it finds to the DRAM tier as cyclic hints (DramTier::hint_cyclic), so
// that the hint-aware policy keeps a stable part of such a model resident and hit on every round,
// instead of recency pushing each chunk out just before its next read (docs/policy.md, "Cycles in
// the daemon").
//
// The rule: a model becomes cyclic at a lease of it that had to read into DRAM a chunk of a tensor
// that an earlier lease of the model (by any session) had leased, that lease having ended before
// this one began. That chunk was resident and pinned at the earlier read and has been evicted
// since: the model is read again and does not fit. It stays cyclic until a `done` hint names it,
// it is retired, or no lease of it ends for `idle_ns` (120 s); every chunk it uses is marked,
// resident or not. State is one time per tensor read, per model: a lease that hits everything
// costs one lookup and one store per tensor, nothing per chunk.
//
// Owns: the per-model read times and, for each cyclic model, the list of its distinct chunks.
// Not thread-safe: the owner serializes calls. Times are steady-clock nanoseconds, passed in.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/hash.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

class ReadCycles {
 public:
  struct Options {
    int64_t idle_ns = 120'000'000'000;    // a model no lease of which ended for this long is forgotten
    size_t max_models = size_t{1} << 16;  // past this many, the models that are not cyclic are forgotten
  };
  // What the caller passes on to the DRAM tier: chunks to mark cyclic, and chunks to unmark (those
  // of models that stopped being cyclic, less the chunks a cyclic model still uses).
  struct Change {
    std::vector<ChunkHash> mark, unmark;
  };

  ReadCycles() : ReadCycles(Options{}) {}
  explicit ReadCycles(Options options) : options_(options) {}

  // A lease of m's tensors began at started_ns and ended at now_ns; loaded[i]: the chunks of
  // tensors[i] it read into DRAM (empty: the lease says nothing of DRAM, as a device lease; it only
  // keeps m from going idle). Also forgets the idle models (at most once a second).
  // REQUIRES: tensors point into m.tensors; loaded is empty or loaded.size() == tensors.size().
  Change read(const ModelManifest& m, const std::vector<const TensorManifest*>& tensors,
              const std::vector<uint32_t>& loaded, int64_t started_ns, int64_t now_ns);
  // Forgets model `id` (named by a `done` hint, or retired).
  Change forget(const std::string& id);
  // Forgets the models no lease of which ended since now_ns - idle_ns.
  Change expire(int64_t now_ns);

  bool cyclic(const std::string& id) const;
  size_t cyclic_models() const;
  uint64_t found() const { return found_; }  // how many times a model became cyclic

 private:
  struct Model {
    std::vector<int64_t> read_ns;  // per tensor of the manifest: when a lease of it last ended (0: never)
    int64_t last_ns = 0;           // when a lease of the model last ended
    int64_t created_ns = 0;        // of the manifest read_ns belongs to
    bool cyclic = false;
    std::vector<ChunkHash> chunks;  // when cyclic: the model's distinct chunks
  };
  using Map = std::unordered_map<std::string, Model>;
  // Erases the model; when it was cyclic, adds to out.unmark the chunks no other cyclic model uses.
  void drop(Map::iterator it, Change& out);

  Options options_;
  Map models_;
  int64_t last_expire_ns_ = 0;
  uint64_t found_ = 0;
};

}  // namespace cairn
