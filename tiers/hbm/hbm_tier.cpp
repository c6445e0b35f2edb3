#include "tiers/hbm/hbm_tier.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/log.hpp"

namespace cairn {

namespace {

constexpr uint64_t kDefaultSlab = 1ull << 30;
constexpr uint64_t kAlignment = 4096;  // entries start on 4 KiB: any dtype's alignment, and DMA-friendly

std::vector<int> count_list(const char* v) {
  std::vector<int> out;
  if (!v || !*v) return out;
  std::stringstream ss(v);
  std::string item;
  int n = 0;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    out.push_back(n++);
  }
  return out;
}

}  // namespace

std::vector<int> resolve_hbm_devices(const std::vector<int>& configured) {
  if (!configured.empty()) return configured;
  // Ordinals are as the process sees them: CUDA_VISIBLE_DEVICES (or Slurm's allocation, which sets
  // it for job steps) renumbers the visible GPUs from 0.
  if (auto v = count_list(std::getenv("CUDA_VISIBLE_DEVICES")); !v.empty()) return v;
  if (auto v = count_list(std::getenv("SLURM_JOB_GPUS")); !v.empty()) return v;
  return {0};
}

ChunkHash HbmTier::key_of(const std::vector<ChunkHash>& chunks) {
  if (chunks.size() == 1) return chunks[0];
  std::vector<uint64_t> words;
  for (const auto& h : chunks) words.push_back(h.lo), words.push_back(h.hi);
  return hash_bytes(words.data(), words.size() * sizeof(uint64_t));
}

Result<std::unique_ptr<HbmTier>> HbmTier::open(Options o, void* arena, uint64_t arena_size) {
  if (o.devices.empty()) return invalid_argument("tiers.hbm.devices: no device to use");
  if (o.capacity < 64 * 1024)
    return invalid_argument("tiers.hbm.capacity: " + std::to_string(o.capacity) +
                            " bytes is less than 64KiB per device (0 disables the tier)");
  if (o.slab_size == 0) o.slab_size = std::min(o.capacity, kDefaultSlab);
  o.slab_size = o.slab_size / kAlignment * kAlignment;
  if (o.slab_size == 0 || o.slab_size > o.capacity)
    return invalid_argument("tiers.hbm: slab size " + std::to_string(o.slab_size) + " does not fit the capacity");
  std::unique_ptr<HbmTier> t(new HbmTier(std::move(o)));
  t->arena_ = arena;
  for (int d : t->options_.devices) {
    for (const auto& p : t->pools_)
      if (p->device->ordinal() == d)
        return invalid_argument("tiers.hbm.devices: device " + std::to_string(d) + " is listed twice");
    auto pool = std::make_unique<Pool>();
    auto dev = hbm::open_device(t->options_.backend, d);
    if (!dev.ok())
      return dev.status().with_context("tiers.hbm (backend " + t->options_.backend + ", device " + std::to_string(d) +
                                       ")");
    pool->device = std::move(dev).value();
    CAIRN_ASSIGN_OR_RETURN(pool->policy, make_eviction_policy(t->options_.eviction));
    if (arena && arena_size) {
      // Pinned for DMA; without it copies still work, staged through pageable memory by the driver.
      Status reg = pool->device->register_host(arena, arena_size);
      pool->host_registered = reg.ok();
      if (!reg.ok())
        CAIRN_LOG_WARN(
            "tiers.hbm: the DRAM arena could not be pinned for device {} ({}); copies into HBM will be "
            "slower",
            d, reg.to_string());
    }
    t->pools_.push_back(std::move(pool));
  }
  return t;
}

HbmTier::~HbmTier() {
  for (auto& p : pools_) {
    for (const auto& s : p->slabs) p->device->free_slab(s);
    if (arena_ && p->host_registered) p->device->unregister_host(arena_);
  }
}

HbmTier::Pool* HbmTier::pool_of(int device) const {
  for (size_t i = 0; i < options_.devices.size(); ++i)
    if (options_.devices[i] == device) return pools_[i].get();
  return nullptr;
}

HbmTier::Placement HbmTier::placement_locked(const Pool& p, const Entry& e, bool hit) const {
  Placement out;
  out.device = p.device->ordinal();
  out.handle = p.slabs[e.slab].handle;
  out.slab_size = p.slabs[e.slab].size;
  out.offset = e.offset;
  out.length = e.length;
  out.pointer = p.slabs[e.slab].base + e.offset;
  out.hit = hit;
  return out;
}

Result<std::pair<size_t, uint64_t>> HbmTier::allocate_locked(Pool& p, uint64_t length) {
  const int dev = p.device->ordinal();
  if (length > options_.slab_size)
    return no_space("tiers.hbm: a tensor of " + std::to_string(length) + " bytes does not fit a slab of device " +
                    std::to_string(dev) + " (" + std::to_string(options_.slab_size) +
                    " bytes); raise tiers.hbm.capacity or read it into host memory");
  for (;;) {
    for (size_t s = 0; s < p.allocators.size(); ++s)
      if (auto off = p.allocators[s].allocate(length)) return std::make_pair(s, *off);
    if ((p.slabs.size() + 1) * options_.slab_size <= options_.capacity) {
      CAIRN_ASSIGN_OR_RETURN(hbm::Slab slab, p.device->allocate_slab(options_.slab_size));
      p.slabs.push_back(std::move(slab));
      p.allocators.emplace_back(options_.slab_size, kAlignment);
      continue;
    }
    auto victim = p.policy->pick_victim([&p](const ChunkHash& h) CAIRN_REQUIRES(mu_) {
      auto it = p.entries.find(h);
      return it != p.entries.end() && it->second.pins == 0 && !it->second.loading;
    });
    if (!victim) {
      uint64_t used = 0;
      for (const auto& a : p.allocators) used += a.used();
      return no_space("tiers.hbm: no space for " + std::to_string(length) + " bytes on device " + std::to_string(dev) +
                      ": " + std::to_string(p.pinned_bytes) + " of its " + std::to_string(options_.capacity) +
                      " bytes are held by device leases (" + std::to_string(used) +
                      " in use); close readers that map tensors on the device, or raise tiers.hbm.capacity");
    }
    auto it = p.entries.find(*victim);
    p.allocators[it->second.slab].free(it->second.offset, it->second.length);
    p.bytes_out += it->second.length;
    ++p.evictions;
    p.entries.erase(it);
    p.policy->remove(*victim);
  }
}

std::optional<HbmTier::Placement> HbmTier::pin_if_resident(int device, const ChunkHash& key) {
  Pool* p = pool_of(device);
  if (!p) return std::nullopt;
  cairn::MutexLock lock(mu_);
  for (;;) {
    auto it = p->entries.find(key);
    if (it == p->entries.end()) return std::nullopt;
    if (it->second.loading) {
      loaded_cv_.wait(lock);
      continue;
    }
    if (it->second.pins++ == 0) p->pinned_bytes += it->second.length;
    ++p->hits;
    p->policy->touch(key);
    return placement_locked(*p, it->second, true);
  }
}

Result<HbmTier::Placement> HbmTier::acquire(int device, const ChunkHash& key, const HostExtents& src) {
  Pool* p = pool_of(device);
  if (!p) return invalid_argument("device " + std::to_string(device) + " is not in tiers.hbm.devices");
  uint64_t length = 0;
  for (const auto& [ptr, n] : src) length += n;
  if (auto hit = pin_if_resident(device, key)) return *hit;
  Entry e;
  {
    cairn::MutexLock lock(mu_);
    // Loaded by someone else since the look above: pin theirs.
    while (p->entries.count(key)) {
      Entry& other = p->entries[key];
      if (other.loading) {
        loaded_cv_.wait(lock);
        continue;
      }
      if (other.pins++ == 0) p->pinned_bytes += other.length;
      ++p->hits;
      p->policy->touch(key);
      return placement_locked(*p, other, true);
    }
    CAIRN_ASSIGN_OR_RETURN(auto where, allocate_locked(*p, length));
    e.slab = where.first, e.offset = where.second, e.length = length, e.pins = 1, e.loading = true;
    p->entries[key] = e;
    p->pinned_bytes += length;
    ++p->misses;
  }
  // The copy, outside the lock: every extent started at once, then waited for.
  uint8_t* dst;
  {
    cairn::MutexLock lock(mu_);
    dst = p->slabs[e.slab].base + e.offset;
  }
  Status st;
  std::vector<std::unique_ptr<hbm::Completion>> copies;
  uint64_t pos = 0;
  for (const auto& [ptr, n] : src) {
    auto c = p->device->copy_async(dst + pos, ptr, n, hbm::CopyKind::kHostToDevice);
    if (!c.ok()) {
      st = c.status();
      break;
    }
    copies.push_back(std::move(c).value());
    pos += n;
  }
  for (auto& c : copies) {
    Status w = c->wait();
    if (st.ok()) st = w;
  }
  cairn::MutexLock lock(mu_);
  auto it = p->entries.find(key);
  if (!st.ok()) {
    p->allocators[it->second.slab].free(it->second.offset, it->second.length);
    p->pinned_bytes -= length;
    p->entries.erase(it);
    loaded_cv_.notify_all();
    return st.with_context("loading into device " + std::to_string(device));
  }
  it->second.loading = false;
  p->bytes_in += length;
  p->policy->track(key, length);
  loaded_cv_.notify_all();
  return placement_locked(*p, it->second, false);
}

void HbmTier::unpin(int device, const ChunkHash& key) {
  Pool* p = pool_of(device);
  if (!p) return;
  cairn::MutexLock lock(mu_);
  auto it = p->entries.find(key);
  if (it == p->entries.end() || it->second.pins == 0) return;  // a broken pairing would show in the tests
  if (--it->second.pins == 0) p->pinned_bytes -= it->second.length;
}

bool HbmTier::resident(int device, const ChunkHash& key) const {
  Pool* p = pool_of(device);
  if (!p) return false;
  cairn::MutexLock lock(mu_);
  auto it = p->entries.find(key);
  return it != p->entries.end() && !it->second.loading;
}

Status HbmTier::copy_out(int device, const ChunkHash& key, void* dst, uint64_t length) {
  auto placed = pin_if_resident(device, key);
  if (!placed) return not_found("entry not resident on device " + std::to_string(device));
  Pool* p = pool_of(device);
  Status st = placed->length != length ? invalid_argument("copy_out: wrong length") : Status::OK();
  if (st.ok()) {
    auto c = p->device->copy_async(dst, placed->pointer, length, hbm::CopyKind::kDeviceToHost);
    st = c.ok() ? (*c)->wait() : c.status();
  }
  unpin(device, key);
  return st;
}

TierStats HbmTier::stats() const {
  TierStats s;
  s.name = "hbm";
  s.enabled = true;
  cairn::MutexLock lock(mu_);
  for (const auto& p : pools_) {
    s.capacity_bytes += options_.capacity;
    for (const auto& a : p->allocators) s.used_bytes += a.used();
    s.hits += p->hits;
    s.misses += p->misses;
    s.bytes_in += p->bytes_in;
    s.bytes_out += p->bytes_out;
    s.chunks += p->entries.size();
  }
  return s;
}

nlohmann::json HbmTier::device_stats() const {
  nlohmann::json out = nlohmann::json::array();
  cairn::MutexLock lock(mu_);
  for (const auto& p : pools_) {
    uint64_t used = 0;
    for (const auto& a : p->allocators) used += a.used();
    out.push_back({{"device", p->device->ordinal()},
                   {"capacity_bytes", options_.capacity},
                   {"used_bytes", used},
                   {"pinned_bytes", p->pinned_bytes},
                   {"slabs", p->slabs.size()},
                   {"slab_bytes", options_.slab_size},
                   {"entries", p->entries.size()},
                   {"evictions", p->evictions},
                   {"arena_pinned", p->host_registered}});
  }
  return out;
}

}  // namespace cairn
