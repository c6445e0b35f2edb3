// Reads: a client opens a model and leases its tensors, which are then in the DRAM arena that the
// client maps, pinned until released. Requests: open, lease, release, prefetch (docs/protocol.md,
// "Reading models"); also the release of lease_tensor pins and of everything at a session's end.
//
// A lease pins every chunk of its tensors: resident chunks at once; missing ones are claimed, read
// through the tier manager (the fastest intact copy below DRAM) into one allocation when the whole
// tensor is missing, several at a time across all the tensors of the request, and a chunk wanted
// by several readers is read once. A
// `contiguous` lease of scattered chunks gets an assembled copy owned by the lease.
//
// Owns: nothing but the leases it records in sessions. Never writes models, never changes what
// the repository or the burst buffer hold.
//
// Thread-safety: every method may be called from any thread; a Session by one thread at a time.
// Lock order: the gc lock (shared) is held while a request reads repository data.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/progress.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/models.hpp"
#include "daemon/named_tensors.hpp"
#include "daemon/request.hpp"
#include "daemon/session.hpp"
#include "daemon/usage_counters.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/hbm/hbm_tier.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

class TraceRecorder;

// How a lease found its chunks, for an observer that looks for reads that do not fit (a model read
// again after its chunks left DRAM).
struct LeasedRead {
  int64_t started_ns = 0;        // steady clock, before the lease claimed its first chunk
  std::vector<uint32_t> loaded;  // per leased tensor: chunks this lease read into DRAM (neither
                                 // resident nor being read by another request when it claimed them);
                                 // empty when the lease says nothing of DRAM (a device lease)
};

// What reads reveal about what will be read next (the prefetcher listens). Called on the request's
// thread after the request's own work; must not block.
class ReadObserver {
 public:
  virtual ~ReadObserver() = default;
  virtual void opened(const ModelManifest& m) = 0;
  // A lease of these tensors of m succeeded; read.loaded has one entry per tensor, in order, or none.
  virtual void leased(const ModelManifest& m, const std::vector<const TensorManifest*>& tensors,
                      const LeasedRead& read) = 0;
  // A best_ancestor answer named these tensors of `model` for the caller to transfer.
  virtual void matched(const std::string& model, const std::vector<std::string>& tensors) = 0;
};

class Reads {
 public:
  struct Parts {
    DramTier& dram;
    TierManager& tiers;
    NamedTensors& named;  // lease_tensor pins end through release
    const ModelDirectory& models;
    cairn::SharedMutex& gc_mu;  // held shared while repository data is read
    uint64_t chunk_size;
    UsageCounters* usage = nullptr;    // counts opens and the bytes leased to clients (null: none)
    HbmTier* hbm = nullptr;            // the GPU tier (null: none; device leases fail kUnavailable)
    ReadObserver* observer = nullptr;  // told what each read reveals (null: nobody listens)
    TraceRecorder* trace = nullptr;    // records each chunk access (policy.trace; null: none)
  };
  explicit Reads(Parts parts) : p_(parts), hbm_(parts.hbm), observer_(parts.observer), trace_(parts.trace) {}

  // `open`: the model (kNotFound names the id).
  Result<request::OpenReply> open(const request::Open& r);
  // `lease`: every tensor of r pinned in DRAM, one lease each, recorded in the session.
  Result<request::LeaseReply> lease(Session& s, const request::Lease& r);
  // `release` (and the `release` field of any request): ends the session's leases of those ids.
  void release(Session& s, const request::Release& r);
  // `prefetch` (r.all aside: the engine asks the peer group): into DRAM, or with Tier::kHbm into
  // the HBM tier (prefetch_device). progress (optional): the model's bytes made resident against
  // its size.
  Result<request::PrefetchReply> prefetch(const request::Prefetch& r, OperationProgress* progress = nullptr);
  // Every chunk of the model resident in DRAM, nothing left pinned; the model's bytes.
  Result<uint64_t> stage_model(const std::string& id, OperationProgress* progress = nullptr);
  // Device leases (daemon/reads_device.cpp, docs/gpu.md): tensors resident in the HBM tier, pinned
  // there until released; the reply names each tensor's slab handle and offset, which the client
  // maps (zero-copy, through CUDA IPC or the emulated device's segments). kUnavailable without an
  // HBM tier.
  Result<request::LeaseDeviceReply> lease_device(Session& s, const request::Lease& r);
  // Every tensor of a model into the HBM tier of `device` (absent: the first), nothing left pinned.
  Result<request::PrefetchReply> prefetch_device(const std::string& id, std::optional<int> device);
  // One tensor into the HBM tier of the first device, nothing left pinned (the prefetcher's path for
  // will_load hints with tier hbm). kUnavailable without an HBM tier.
  Status stage_device(const std::string& model, const TensorManifest& t);
  // Ends every lease of the session.
  void end_session(Session& s);

  // Makes every chunk of t resident without leasing it (the prefetcher's path: the same verified
  // fetch as a lease, nothing stays pinned). Holds the gc lock shared while it reads.
  Status stage(const std::string& model, const TensorManifest& t);
  // What the clients' leases hold of the arena now: {"leases", "chunk_pins", "owned_bytes"} (the
  // leases that hold chunks or a contiguous copy; `stats` reports it as "leases"). With every
  // client gone all three are 0; arena space pinned beyond them is held by something else.
  nlohmann::json lease_stats() const;

 private:
  // The chunks of one tensor, pinned, and where they are (one extent per chunk, in order).
  struct PinnedTensor {
    std::vector<ChunkHash> pinned;
    std::vector<Extent> extents;
    uint32_t loaded = 0;  // chunks this request read into DRAM (LeasedRead::loaded)
  };
  // Makes every chunk of these tensors (of `model`) resident and pinned; out gets one entry per
  // tensor. The missing chunks of all the tensors are read through one pool (daemon/reads_pin.cpp).
  // All or nothing: on failure nothing stays pinned. Records each chunk's access in the trace, with
  // the tier that served it (prefetch: staged by the prefetcher, not read by a client). Under the gc
  // lock (shared): gc must not free the chunks it reads.
  Status pin_tensors(std::span<const TensorManifest* const> tensors, const std::string& model, bool prefetch,
                     std::vector<PinnedTensor>& out) CAIRN_REQUIRES_SHARED(p_.gc_mu);
  // What a read of `model` that failed on missing or damaged bytes tells its client. With a shared
  // repository, another daemon's gc may have removed the model after this daemon's view last listed
  // it, and freed its bytes: then "not found", as a read a moment later would be told (the torture
  // harness's peer group found "corrupt data ... restore the pack from a copy" instead). A model
  // still there keeps the failure.
  Status explain_failure(const std::string& model, const Status& failure) const;
  // Tells the sources below DRAM which chunks of these tensors are about to be read.
  void readahead(const std::vector<const TensorManifest*>& tensors);
  void release_lease(Session::Lease& lease);
  // Keeps lease_stats: +1 when a lease is stored in its session, -1 when a stored one is released
  // (drop_lease: count, then release_lease, which counts nothing as it also undoes leases never stored).
  void count_lease(const Session::Lease& lease, int sign);
  void drop_lease(Session::Lease& lease);
  // The device a request names (absent: the first of tiers.hbm.devices); `op` names the request in
  // errors.
  Result<int> device_of(std::optional<int> device, const char* op) const;
  // Makes `tensors` resident on `device`; for each, its placement (pinned there when pin, else left
  // unpinned). All or nothing when pin. Under the gc lock (shared), as pin_tensors.
  Status place_on_device(const std::string& model, std::span<const TensorManifest* const> tensors, int device, bool pin,
                         std::vector<HbmTier::Placement>& out) CAIRN_REQUIRES_SHARED(p_.gc_mu);

  Parts p_;
  HbmTier* const hbm_;
  ReadObserver* const observer_;
  TraceRecorder* const trace_;
  std::atomic<int64_t> arena_leases_{0}, lease_chunk_pins_{0}, lease_owned_bytes_{0};
};

}  // namespace cairn
