// Reads into device memory (daemon/reads.hpp, docs/gpu.md): device leases and prefetch --tier hbm.
//
// A tensor goes to the HBM tier from DRAM: its chunks are pinned in the arena (through the same
// verified fetch as any read: pin_tensors), copied host-to-device into one entry of the device's
// pool (the arena is registered for DMA), and unpinned in DRAM. A device lease pins the entry in
// HBM until the client releases it or its connection ends, so a client that dies leaks nothing.
#include "daemon/reads.hpp"
#include "daemon/request.hpp"

namespace cairn {

using nlohmann::json;
using namespace request;

namespace {

std::vector<ChunkHash> hashes_of(const TensorManifest& t) {
  std::vector<ChunkHash> out;
  for (const auto& c : t.chunks) out.push_back(c.hash);
  return out;
}

std::string device_list(const std::vector<int>& d) {
  std::string s;
  for (int x : d) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

Result<int> Reads::device_of(std::optional<int> d, const char* op) const {
  if (!hbm_)
    return unavailable(std::string("request '") + op +
                       "': this daemon has no HBM tier (tiers.hbm.capacity is 0), so nothing is kept in device "
                       "memory; set tiers.hbm.capacity (and tiers.hbm.backend: emulated on a machine without a GPU), "
                       "or read into host memory");
  if (!d) return hbm_->devices().front();
  const int device = *d;
  if (!hbm_->has_device(device))
    return invalid_argument("device " + std::to_string(device) + " is not one of this daemon's HBM devices (" +
                            device_list(hbm_->devices()) + "; tiers.hbm.devices)");
  return device;
}

Status Reads::place_on_device(const std::string& model, std::span<const TensorManifest* const> tensors, int device,
                              bool pin, std::vector<HbmTier::Placement>& out) {
  out.assign(tensors.size(), HbmTier::Placement{});
  std::vector<char> have(tensors.size(), 0);
  auto undo = [&] {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (have[i]) hbm_->unpin(device, HbmTier::key_of(hashes_of(*tensors[i])));
  };
  // Hits first; the misses' chunks are then pinned in DRAM in one stream of reads.
  std::vector<const TensorManifest*> missing;
  std::vector<size_t> missing_at;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (auto p = hbm_->pin_if_resident(device, HbmTier::key_of(hashes_of(*tensors[i])))) {
      out[i] = *p, have[i] = 1;
    } else {
      missing.push_back(tensors[i]), missing_at.push_back(i);
    }
  }
  Status st;
  if (!missing.empty()) {
    std::vector<PinnedTensor> pins;
    st = pin_tensors(missing, model, !pin, pins);
    for (size_t k = 0; st.ok() && k < missing.size(); ++k) {
      HbmTier::HostExtents src;
      for (const auto& e : pins[k].extents) src.emplace_back(p_.dram.base() + e.offset, e.length);
      auto placed = hbm_->acquire(device, HbmTier::key_of(hashes_of(*missing[k])), src);
      if (!placed.ok())
        st = placed.status().with_context("tensor '" + missing[k]->name + "'");
      else
        out[missing_at[k]] = *placed, have[missing_at[k]] = 1;
    }
    for (const auto& pt : pins)
      for (const auto& h : pt.pinned) p_.dram.unpin(h);
  }
  if (!st.ok() || !pin) undo();
  return st;
}

Result<LeaseDeviceReply> Reads::lease_device(Session& s, const request::Lease& r) {
  CAIRN_ASSIGN_OR_RETURN(int device, device_of(r.device, "lease_device"));
  cairn::ReaderLock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(r.id));
  std::vector<const TensorManifest*> order;
  order.reserve(r.tensors.size());
  for (const std::string& name : r.tensors) {
    const TensorManifest* t = m->find(name);
    if (!t) return not_found("model '" + r.id + "' has no tensor '" + name + "'");
    order.push_back(t);
  }
  std::vector<HbmTier::Placement> placed;
  CAIRN_RETURN_IF_ERROR(place_on_device(m->id, order, device, true, placed));
  LeaseDeviceReply out;
  out.leases.reserve(order.size());
  out.created_ns = m->created_ns;
  out.backend = hbm_->backend();
  for (size_t i = 0; i < order.size(); ++i) {
    Session::Lease lease;
    lease.hbm_device = device;
    lease.hbm_key = HbmTier::key_of(hashes_of(*order[i]));
    const uint64_t lid = s.next_id++;
    s.leases[lid] = std::move(lease);
    out.leases.push_back(LeaseDeviceReply::Granted{lid, device, placed[i].handle, placed[i].slab_size, placed[i].offset,
                                                   order[i]->nbytes, placed[i].hit});
  }
  if (observer_) observer_->leased(*m, order, LeasedRead{});  // says nothing of what DRAM held
  return out;
}

Result<PrefetchReply> Reads::prefetch_device(const std::string& id, std::optional<int> d) {
  CAIRN_ASSIGN_OR_RETURN(int device, device_of(d, "prefetch"));
  cairn::ReaderLock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(id));
  uint64_t bytes = 0;
  // One tensor at a time: a model larger than the pool still passes through it (the last stay).
  for (const auto& t : m->tensors) {
    const TensorManifest* one[] = {&t};
    std::vector<HbmTier::Placement> placed;
    CAIRN_RETURN_IF_ERROR(place_on_device(m->id, one, device, false, placed));
    bytes += t.nbytes;
  }
  return PrefetchReply{bytes, device};
}

Status Reads::stage_device(const std::string& model, const TensorManifest& t) {
  CAIRN_ASSIGN_OR_RETURN(int device, device_of(std::nullopt, "hint"));
  cairn::ReaderLock gc_lock(p_.gc_mu);
  const TensorManifest* one[] = {&t};
  std::vector<HbmTier::Placement> placed;
  return place_on_device(model, one, device, false, placed);
}

}  // namespace cairn
