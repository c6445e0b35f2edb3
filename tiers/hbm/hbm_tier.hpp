// The HBM tier: tensors resident in GPU memory, one pool per device, behind the device seam
// (tiers/hbm/device.hpp, so the same code runs on CUDA and on the emulated device).
//
// A pool is carved out of large slabs (allocated on demand up to tiers.hbm.capacity; a slab is the
// unit of IPC export, so a client maps a slab once and reaches every tensor in it). The unit of
// residency is an entry: the bytes of one tensor, contiguous, so that a client gets one device
// pointer per tensor. An entry is keyed by the tensor's content (HbmTier::key_of: the chunk hash of
// a one-chunk tensor, else a hash of its chunk hashes), so tensors of different models with the same
// bytes share one copy, as chunks do in DRAM.
//
// Entries are clean copies: their bytes are always in DRAM or a tier below (reads load them from
// the DRAM arena; commits from device memory land in the arena first), so leaving HBM is dropping
// ("evicted to DRAM"). A pinned entry (a client's device lease) never moves or leaves; when space is
// short, acquire() evicts unpinned entries in the order of the eviction policy (the scorer the
// other tiers use, policy.eviction); when the rest is pinned, kNoSpace naming what is held.
//
// Thread-safety: every method may be called from any thread. Copies run outside the lock; an entry
// being loaded is waited for by other acquirers of the same key.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/hash.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "policy/eviction.hpp"
#include "tiers/dram/arena.hpp"
#include "tiers/hbm/device.hpp"
#include "tiers/tier.hpp"

namespace cairn {

class HbmTier {
 public:
  struct Options {
    std::string backend = "cuda";  // tiers.hbm.backend: cuda | emulated
    std::vector<int> devices;      // ordinals (resolved: never empty)
    uint64_t capacity = 0;         // per device, bytes (> 0)
    uint64_t slab_size = 0;        // 0: min(capacity, 1 GiB)
    std::string eviction = "lru";  // policy.eviction
  };
  // Opens every device and registers the DRAM arena [arena, arena+arena_size) with each for DMA
  // (cudaHostRegister; a failure is logged and copies go unpinned). No slab is allocated until needed. kUnavailable
  // (naming why: "no GPU") when a device cannot be opened; kInvalidArgument for a bad option.
  static Result<std::unique_ptr<HbmTier>> open(Options options, void* arena, uint64_t arena_size);
  ~HbmTier();
  HbmTier(const HbmTier&) = delete;
  HbmTier& operator=(const HbmTier&) = delete;

  const std::string& backend() const { return options_.backend; }
  const std::vector<int>& devices() const { return options_.devices; }
  bool has_device(int device) const { return pool_of(device) != nullptr; }
  uint64_t capacity() const { return options_.capacity; }
  uint64_t slab_size() const { return options_.slab_size; }

  // The key of a tensor's entry from its chunk hashes (in order).
  static ChunkHash key_of(const std::vector<ChunkHash>& chunks);

  // Where a pinned entry is: in slab `handle` (of slab_size bytes) at offset, and at `pointer` in
  // this process.
  struct Placement {
    int device = 0;
    std::string handle;
    uint64_t slab_size = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint8_t* pointer = nullptr;
    bool hit = false;  // was resident
  };
  // Host memory (in the registered arena) holding an entry's bytes, in order.
  using HostExtents = std::vector<std::pair<const uint8_t*, uint64_t>>;

  // Pins entry `key` on `device`, which must be one of devices(). When it is not resident, takes
  // space for sum(src lengths) bytes (evicting unpinned entries as the policy orders), copies src
  // host-to-device asynchronously and returns once the copy completed. kNoSpace when the entry
  // cannot fit (larger than a slab, or the rest is pinned), kInvalidArgument for a bad device.
  Result<Placement> acquire(int device, const ChunkHash& key, const HostExtents& src);
  // Pins the entry if it is resident (counts a hit); nullopt otherwise (counts nothing).
  std::optional<Placement> pin_if_resident(int device, const ChunkHash& key);
  // REQUIRES: a pin from acquire or pin_if_resident.
  void unpin(int device, const ChunkHash& key);
  bool resident(int device, const ChunkHash& key) const;
  // Copies a resident entry device-to-host (tests, checks). kNotFound when not resident.
  Status copy_out(int device, const ChunkHash& key, void* dst, uint64_t length);

  // Summed over devices, for `cairn stats`; device_stats() per device (capacity, used, pinned, slabs,
  // whether the arena is pinned for DMA).
  TierStats stats() const;
  nlohmann::json device_stats() const;

 private:
  struct Entry {
    size_t slab = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t pins = 0;
    bool loading = false;
  };
  // A device's state. Everything but `device` is read and written under the tier's mu_ (a member
  // of a nested struct cannot name the outer object's lock for the analysis).
  struct Pool {
    std::unique_ptr<hbm::Device> device;
    std::unique_ptr<EvictionPolicy> policy;
    std::vector<hbm::Slab> slabs;
    std::vector<ArenaAllocator> allocators;  // one per slab
    std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries;
    uint64_t pinned_bytes = 0, hits = 0, misses = 0, bytes_in = 0, bytes_out = 0, evictions = 0;
    bool host_registered = false;  // the DRAM arena is pinned for DMA with this device
  };
  explicit HbmTier(Options options) : options_(std::move(options)) {}
  Pool* pool_of(int device) const;
  // Space for length bytes: (slab, offset), or kNoSpace.
  Result<std::pair<size_t, uint64_t>> allocate_locked(Pool& p, uint64_t length) CAIRN_REQUIRES(mu_);
  Placement placement_locked(const Pool& p, const Entry& e, bool hit) const CAIRN_REQUIRES(mu_);

  Options options_;
  void* arena_ = nullptr;
  std::vector<std::unique_ptr<Pool>> pools_;  // one per device, in options_.devices order
  mutable cairn::Mutex mu_;
  cairn::CondVar loaded_cv_;
};

// tiers.hbm.devices resolved: the configured list, else $CUDA_VISIBLE_DEVICES's count (as ordinals
// 0..n-1), else $SLURM_JOB_GPUS's, else device 0.
std::vector<int> resolve_hbm_devices(const std::vector<int>& configured);

}  // namespace cairn
