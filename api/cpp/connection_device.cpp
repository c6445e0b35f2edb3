// Device memory in the client (docs/gpu.md): reads into device buffers, zero-copy device views of
// tensors in the daemon's HBM tier, and tensors added from device memory.
//
// Which way bytes go depends on the daemon and on this process:
//   - the daemon has an HBM tier (it said so in hello): tensors are leased on a device
//     (lease_device), the slab holding them is mapped once per connection through its IPC handle,
//     and a read copies device-to-device from there;
//   - it has none, but this library has CUDA and the process sees a GPU: a read copies
//     host-to-device from the arena (a pinned, registered mapping in the daemon; pageable here);
//   - neither: kUnavailable, naming both reasons.
// A read into a device buffer whose lease_device finds the pool held by other leases (kNoSpace) copies
// from the arena instead, so it still succeeds.
#include <algorithm>
#include <cstring>

#include "api/cpp/connection.hpp"
#include "api/cpp/connection_internal.hpp"

namespace cairn {

using nlohmann::json;

Result<hbm::DeviceMapper*> Connection::device_path(const std::string& what) {
  if (mapper_) return mapper_.get();
  if (!hbm_backend_.empty()) {
    auto m = hbm::open_mapper(hbm_backend_);
    if (!m.ok())
      return m.status().with_context(what + ": the daemon on " + address_ + " keeps its HBM tier on backend '" +
                                     hbm_backend_ + "', which this process cannot use");
    mapper_ = std::move(m).value();
    return mapper_.get();
  }
  auto m = hbm::open_mapper("cuda");
  if (!m.ok())
    return unavailable(what + " (CAIRN_MEM_CUDA) needs device memory, and there is none: the daemon on " + address_ +
                       " has no HBM tier (tiers.hbm.capacity is 0; tiers.hbm.backend: emulated works without a GPU), "
                       "and this process cannot copy to a GPU itself (" +
                       m.status().message() + "); read into host memory (CAIRN_MEM_HOST) instead");
  mapper_ = std::move(m).value();
  return mapper_.get();
}

Result<uint8_t*> Connection::map_slab(const std::string& handle, uint64_t size) {
  if (auto it = slabs_.find(handle); it != slabs_.end()) return it->second.first;
  CAIRN_ASSIGN_OR_RETURN(hbm::DeviceMapper * m, device_path("mapping a device slab"));
  CAIRN_ASSIGN_OR_RETURN(void* p, m->open(handle, size));
  slabs_[handle] = {static_cast<uint8_t*>(p), size};
  return static_cast<uint8_t*>(p);
}

Status Connection::copy_arena_device(hbm::DeviceMapper* dev, int device, void* dev_ptr, uint64_t arena_off, uint64_t n,
                                     bool to_device) {
  const int v = to_device ? 0 : 1;
  uint8_t* base = to_device ? const_cast<uint8_t*>(view_->read_base()) : view_->write_base();
  const uint64_t size = view_->size();
  if (arena_off > size || n > size - arena_off) return invalid_argument("copy outside the arena");
  auto* d = static_cast<uint8_t*>(dev_ptr);
  while (n > 0) {
    // One copy per granule: a copy whose host range spans two registrations is not DMA'd whole.
    const uint64_t g = arena_off / kPinGranule;
    const uint64_t g_end = std::min((g + 1) * kPinGranule, size);
    const uint64_t len = std::min(n, g_end - arena_off);
    {
      std::lock_guard<std::mutex> lock(pin_mu_);
      if (pinned_[v].empty()) pinned_[v].assign((size + kPinGranule - 1) / kPinGranule, 0);
      if (!pinned_[v][g] && !pin_failed_[v]) {
        if (dev->pin_host(base + g * kPinGranule, g_end - g * kPinGranule, to_device).ok())
          pinned_[v][g] = 1;
        else
          pin_failed_[v] = true;  // e.g. a locked-memory limit: the copies still work, pageable
      }
    }
    Status st = to_device ? dev->copy(device, d, base + arena_off, len, hbm::CopyKind::kHostToDevice)
                          : dev->copy(device, base + arena_off, d, len, hbm::CopyKind::kDeviceToHost);
    if (!st.ok()) return st;
    d += len;
    arena_off += len;
    n -= len;
  }
  return Status::OK();
}

Result<std::vector<std::pair<uint64_t, const uint8_t*>>> ConnectionReader::lease_device(
    const std::vector<std::string>& names, int device) {
  for (const auto& name : names)
    if (!find(name)) return not_found("model '" + id_ + "' has no tensor '" + name + "'");
  if (client_.hbm_backend().empty())
    return unavailable("tensor '" + names.front() + "' of model '" + id_ +
                       "' cannot be mapped on a device: the daemon on " + client_.address() +
                       " has no HBM tier (tiers.hbm.capacity is 0; docs/gpu.md); read it into "
                       "host memory, or configure tiers.hbm");
  json req{{"op", "lease_device"}, {"id", id_}, {"tensors", names}};
  if (device >= 0) req["device"] = device;
  CAIRN_ASSIGN_OR_RETURN(json r, client_.call(req));
  const json& ls = r.value("leases", json::array());
  std::vector<uint64_t> ids;
  for (const auto& l : ls) ids.push_back(l.value("lease", uint64_t{0}));
  auto give_back = [&](Status st) {
    (void)client_.release(ids);
    return st;
  };
  if (ls.size() != names.size())
    return give_back(protocol_error("daemon answered a device lease with the wrong number of tensors"));
  if (r.value("created_ns", int64_t{0}) != created_ns_) {
    client_.forget_model(id_);
    return give_back(not_found("model '" + id_ +
                               "' is no longer the model this reader opened (it was deleted and its id " +
                               "committed again); open it again"));
  }
  std::vector<std::pair<uint64_t, const uint8_t*>> out;
  out.reserve(ls.size());
  for (size_t i = 0; i < ls.size(); ++i) {
    const json& l = ls[i];
    const uint64_t slab = l.value("slab_bytes", uint64_t{0}), off = l.value("offset", uint64_t{0}),
                   n = l.value("nbytes", uint64_t{0});
    if (off > slab || n > slab - off) return give_back(protocol_error("daemon leased a device range outside its slab"));
    auto base = client_.map_slab(l.value("handle", std::string()), slab);
    if (!base.ok()) return give_back(base.status().with_context("tensor '" + names[i] + "'"));
    out.emplace_back(ids[i], static_cast<const uint8_t*>(*base + off));
  }
  return out;
}

Result<std::span<const uint8_t>> ConnectionReader::map_device(const std::string& name, int device) {
  CAIRN_ASSIGN_OR_RETURN(auto views, map_many_device({name}, device));
  return views[0];
}

Result<std::vector<std::span<const uint8_t>>> ConnectionReader::map_many_device(const std::vector<std::string>& names,
                                                                                int device) {
  CAIRN_ASSIGN_OR_RETURN(auto leased, lease_device(names, device));
  std::vector<std::span<const uint8_t>> out;
  out.reserve(leased.size());
  for (size_t i = 0; i < leased.size(); ++i) {
    held_.push_back(leased[i].first);
    out.emplace_back(leased[i].second, find(names[i])->nbytes);
  }
  return out;
}

Status ConnectionReader::read_many_to_device(const std::vector<std::string>& names, const std::vector<void*>& dsts,
                                             const std::vector<uint64_t>& dst_bytes) {
  if (names.size() != dsts.size() || names.size() != dst_bytes.size())
    return invalid_argument("names, dsts and dst_bytes differ in length");
  if (names.empty()) return Status::OK();
  for (size_t i = 0; i < names.size(); ++i) CAIRN_RETURN_IF_ERROR(check_buffer(names[i], dst_bytes[i]));
  CAIRN_ASSIGN_OR_RETURN(hbm::DeviceMapper * dev, client_.device_path("reading " + std::to_string(names.size()) +
                                                                      " tensors into device memory"));
  const int device = dev->device_of(dsts[0]);
  if (!client_.hbm_backend().empty()) {
    int on = -1;
    for (int d : client_.hbm_devices())
      if (d == device) on = d;
    auto leased = lease_device(names, on);
    if (leased.ok()) {
      std::vector<hbm::DeviceMapper::CopyOp> ops;
      ops.reserve(names.size());
      for (size_t i = 0; i < names.size(); ++i)
        if (dst_bytes[i]) ops.push_back({dsts[i], (*leased)[i].second, dst_bytes[i]});
      Status st = dev->copy_many(device, ops, hbm::CopyKind::kDeviceToDevice);
      for (const auto& l : *leased) client_.release_later(l.first);
      if (!st.ok()) return st.with_context("copying " + std::to_string(ops.size()) + " tensors on the device");
      return Status::OK();
    }
    // The pool is held by other device leases (all or nothing): each tensor on its own way below.
    if (leased.status().code() != StatusCode::kNoSpace) return leased.status();
  }
  for (size_t i = 0; i < names.size(); ++i) CAIRN_RETURN_IF_ERROR(read_to_device(names[i], dsts[i], dst_bytes[i]));
  return Status::OK();
}

Status ConnectionReader::read_to_device(const std::string& name, void* dst, uint64_t dst_bytes) {
  CAIRN_RETURN_IF_ERROR(check_buffer(name, dst_bytes));
  CAIRN_ASSIGN_OR_RETURN(hbm::DeviceMapper * dev, client_.device_path("reading tensor '" + name + "'"));
  const int device = dev->device_of(dst);
  if (!client_.hbm_backend().empty()) {
    // From the HBM tier: promoted there if it is not yet, then one device-to-device copy. The
    // destination's device when the daemon keeps it, else the daemon's first.
    int on = -1;
    for (int d : client_.hbm_devices())
      if (d == device) on = d;
    auto leased = lease_device({name}, on);
    if (leased.ok()) {
      Status st = dev->copy(device, dst, (*leased)[0].second, dst_bytes, hbm::CopyKind::kDeviceToDevice);
      client_.release_later((*leased)[0].first);
      if (!st.ok()) return st.with_context("copying tensor '" + name + "' on the device");
      return Status::OK();
    }
    // The device's pool is held by leases: the copy still works, from the arena.
    if (leased.status().code() != StatusCode::kNoSpace) return leased.status();
  }
  CAIRN_ASSIGN_OR_RETURN(auto leased, lease({name}, false));
  auto* out = static_cast<uint8_t*>(dst);
  Status st;
  for (const auto& [off, len] : leased[0].extents) {
    st = client_.copy_arena_device(dev, device, out, off, len, /*to_device=*/true);
    if (!st.ok()) {
      st = st.with_context("copying tensor '" + name + "' to the GPU");
      break;
    }
    out += len;
  }
  client_.release_later(leased[0].lease);
  return st;
}

Status ConnectionWriter::add_tensor_device(const std::string& name, const void* data, DType dtype,
                                           const std::vector<int64_t>& shape) {
  CAIRN_RETURN_IF_ERROR(check_name(name));
  uint64_t n;
  CAIRN_RETURN_IF_ERROR(client_detail::check_shape(dtype, shape, &n).with_context("tensor '" + name + "'"));
  if (n > 0 && data == nullptr) return invalid_argument("tensor '" + name + "': data is NULL");
  CAIRN_ASSIGN_OR_RETURN(hbm::DeviceMapper * dev,
                         client_.device_path("adding tensor '" + name + "' from device memory"));
  const int on = n ? dev->device_of(data) : -1;
  if (n && on < 0 && std::strcmp(dev->backend(), "cuda") == 0)
    return invalid_argument(
        "tensor '" + name + "': " + std::to_string(n) +
        " bytes at a pointer that is not CUDA device memory (use cairn_model_add_tensor for host memory)");
  CAIRN_ASSIGN_OR_RETURN(Connection::Space sp, space_for(n));
  // Device-to-host straight into the arena space: once this returns the caller may reuse its buffer.
  Status st = n ? client_.copy_arena_device(dev, on, const_cast<void*>(data),
                                            static_cast<uint64_t>(sp.data - client_.arena_view().write_base()), n,
                                            /*to_device=*/false)
                : Status::OK();
  if (!st.ok()) {
    client_.spaces_to_free_.push_back(sp.id);
    return st.with_context("copying tensor '" + name + "' from the device");
  }
  spaces_.push_back(sp.id);
  tensors_.push_back(json{
      {"name", name}, {"dtype", dtype_name(dtype)}, {"shape", client_detail::shape_json(shape)}, {"space", sp.id}});
  names_[name] = true;
  return Status::OK();
}

}  // namespace cairn
