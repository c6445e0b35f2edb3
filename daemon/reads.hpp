// Reads: a client opens a model and leases its tensors, which are then in the DRAM arena that the
// client maps, pinned until released. Requests: open, lease, release, prefetch (docs/protocol.md,
// "Reading models"); also the release of lease_tensor pins and of everything at a session's end.
//
// A lease pins every chunk of a tensor: resident chunks at once; missing ones are claimed, read
// through the tier manager (the fastest intact copy below DRAM) into one allocation when the whole
// tensor is missing, several at a time, and a chunk wanted by several readers is read once. A
// `contiguous` lease of scattered chunks gets an assembled copy owned by the lease.
//
// Owns: nothing but the leases it records in sessions. Never writes models, never changes what
// the repository or the burst buffer hold.
//
// Thread-safety: every method may be called from any thread; a Session by one thread at a time.
// Lock order: the gc lock (shared) is held while a request reads repository data.
#pragma once

#include <shared_mutex>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.hpp"
#include "daemon/models.hpp"
#include "daemon/named_tensors.hpp"
#include "daemon/session.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

class Reads {
 public:
  struct Parts {
    DramTier& dram;
    TierManager& tiers;
    NamedTensors& named;  // lease_tensor pins end through release
    const ModelDirectory& models;
    std::shared_mutex& gc_mu;
    uint64_t chunk_size;
  };
  explicit Reads(Parts parts) : p_(parts) {}

  Result<nlohmann::json> open(const nlohmann::json& req);
  Result<nlohmann::json> lease(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> release(Session& s, const nlohmann::json& req);
  Result<nlohmann::json> prefetch(const nlohmann::json& req);
  // Ends every lease of the session.
  void end_session(Session& s);

 private:
  // Makes every chunk of t resident and pinned; fills the extents (one per chunk, in order). On
  // failure nothing stays pinned.
  Status pin_tensor(const TensorManifest& t, std::vector<ChunkHash>& pinned, std::vector<Extent>& extents);
  // Tells the sources below DRAM which chunks of these tensors are about to be read.
  void readahead(const std::vector<const TensorManifest*>& tensors);
  void release_lease(Session::Lease& lease);

  Parts p_;
};

}  // namespace cairn
