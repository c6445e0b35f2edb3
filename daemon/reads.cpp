#include "daemon/reads.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>

#include "daemon/request.hpp"
#include "daemon/trace_recorder.hpp"

namespace cairn {

using nlohmann::json;
using namespace request;

Result<OpenReply> Reads::open(const Open& r) {
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(r.id));
  if (observer_) observer_->opened(*m);
  if (p_.usage) p_.usage->model_opened();
  return OpenReply{std::move(m), r.with_source_header};
}

void Reads::readahead(const std::vector<const TensorManifest*>& tensors) {
  std::vector<const ChunkRef*> refs;
  for (const TensorManifest* t : tensors)
    for (const ChunkRef& c : t->chunks) refs.push_back(&c);
  p_.tiers.readahead(refs);
}

Result<LeaseReply> Reads::lease(Session& s, const Lease& r) {
  const std::string& id = r.id;
  cairn::ReaderLock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(id));
  // Every named tensor first, then all of them pinned at once (one stream of reads), then a lease each.
  std::vector<const TensorManifest*> order;
  order.reserve(r.tensors.size());
  for (const std::string& name : r.tensors) {
    const TensorManifest* t = m->find(name);
    if (!t) return not_found("model '" + id + "' has no tensor '" + name + "'");
    order.push_back(t);
  }
  readahead(order);
  LeaseReply out;
  out.leases.reserve(order.size());
  out.created_ns = m->created_ns;
  auto undo = [&] {
    for (const auto& g : out.leases) {
      drop_lease(s.leases[g.lease]);
      s.leases.erase(g.lease);
    }
  };
  const bool contiguous = r.contiguous;
  std::vector<PinnedTensor> pins;
  LeasedRead read;
  read.started_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  CAIRN_RETURN_IF_ERROR(pin_tensors(order, m->id, false, pins));
  read.loaded.reserve(pins.size());
  for (const PinnedTensor& pt : pins) read.loaded.push_back(pt.loaded);
  for (size_t ti = 0; ti < order.size(); ++ti) {
    const TensorManifest* t = order[ti];
    Session::Lease lease;
    lease.pinned_chunks = std::move(pins[ti].pinned);
    std::vector<Extent> extents = std::move(pins[ti].extents);
    bool consecutive = true;
    for (size_t i = 1; i < extents.size(); ++i)
      if (extents[i].offset != extents[i - 1].offset + extents[i - 1].length) consecutive = false;
    if (contiguous && !consecutive) {
      // Assemble a contiguous copy for a zero-copy view; the chunks stay where they are.
      auto off = p_.dram.allocate(t->nbytes);
      if (!off.ok()) {
        release_lease(lease);
        for (size_t j = ti + 1; j < pins.size(); ++j)  // pinned, not leased yet
          for (const auto& h : pins[j].pinned) p_.dram.unpin(h);
        undo();
        return off.status();
      }
      uint64_t pos = *off;
      for (const auto& e : extents) {
        std::memcpy(p_.dram.base() + pos, p_.dram.base() + e.offset, e.length);
        pos += e.length;
      }
      for (const auto& h : lease.pinned_chunks) p_.dram.unpin(h);
      lease.pinned_chunks.clear();
      lease.owned_extents.push_back(Extent{*off, t->nbytes});
      extents = {Extent{*off, t->nbytes}};
    }
    if (contiguous && consecutive && extents.size() > 1) extents = {Extent{extents.front().offset, t->nbytes}};
    LeaseReply::Granted g;
    g.extents.reserve(extents.size());
    for (const auto& e : extents) g.extents.emplace_back(e.offset, e.length);
    g.lease = s.next_id++;
    g.nbytes = t->nbytes;
    count_lease(lease, +1);
    s.leases[g.lease] = std::move(lease);
    out.leases.push_back(std::move(g));
  }
  if (observer_) observer_->leased(*m, order, read);
  return out;
}

void Reads::release_lease(Session::Lease& lease) {
  for (const auto& h : lease.pinned_chunks) p_.dram.unpin(h);
  lease.pinned_chunks.clear();
  for (const auto& e : lease.owned_extents) p_.dram.release(e.offset, e.length);
  lease.owned_extents.clear();
  if (!lease.named_key.empty()) {
    p_.named.unpin(lease.named_key, lease.named_generation);
    lease.named_key.clear();
  }
  if (lease.hbm_device >= 0 && hbm_) hbm_->unpin(lease.hbm_device, lease.hbm_key);
  lease.hbm_device = -1;
}

void Reads::count_lease(const Session::Lease& lease, int sign) {
  if (lease.pinned_chunks.empty() && lease.owned_extents.empty()) return;
  int64_t owned = 0;
  for (const auto& e : lease.owned_extents) owned += static_cast<int64_t>(e.length);
  arena_leases_ += sign;
  lease_chunk_pins_ += sign * static_cast<int64_t>(lease.pinned_chunks.size());
  lease_owned_bytes_ += sign * owned;
}

void Reads::drop_lease(Session::Lease& lease) {
  count_lease(lease, -1);
  release_lease(lease);
}

json Reads::lease_stats() const {
  return json{{"leases", arena_leases_.load()},
              {"chunk_pins", lease_chunk_pins_.load()},
              {"owned_bytes", lease_owned_bytes_.load()}};
}

void Reads::release(Session& s, const Release& r) {
  for (uint64_t id : r.leases) {
    auto it = s.leases.find(id);
    if (it == s.leases.end()) continue;  // released twice: harmless
    drop_lease(it->second);
    s.leases.erase(it);
  }
}

void Reads::end_session(Session& s) {
  for (auto& [id, lease] : s.leases) drop_lease(lease);
  s.leases.clear();
}

Status Reads::stage(const std::string& model, const TensorManifest& t) {
  cairn::ReaderLock gc_lock(p_.gc_mu);
  const TensorManifest* one[] = {&t};
  std::vector<PinnedTensor> pins;
  CAIRN_RETURN_IF_ERROR(pin_tensors(one, model, true, pins));
  for (const auto& h : pins[0].pinned) p_.dram.unpin(h);
  return Status::OK();
}

Result<PrefetchReply> Reads::prefetch(const Prefetch& r, OperationProgress* progress) {
  if (r.tier == Prefetch::Tier::kHbm) return prefetch_device(r.id, r.device);
  CAIRN_ASSIGN_OR_RETURN(uint64_t bytes, stage_model(r.id, progress));
  return PrefetchReply{bytes, std::nullopt};
}

Result<uint64_t> Reads::stage_model(const std::string& id, OperationProgress* progress) {
  cairn::ReaderLock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(id));
  uint64_t bytes = 0;
  std::vector<const TensorManifest*> all;
  for (const auto& t : m->tensors) all.push_back(&t);
  if (progress) progress->begin_phase("reading into DRAM", ProgressUnit::kBytes, m->logical_bytes());
  readahead(all);
  // In groups of tensors of at most a quarter of the arena each: one stream of reads per group,
  // and a model larger than the arena still passes through it (the last groups stay).
  const uint64_t group_bytes = std::max<uint64_t>(p_.dram.arena_size() / 4, p_.chunk_size);
  for (size_t first = 0; first < all.size();) {
    size_t last = first;
    uint64_t sum = 0;
    while (last < all.size() && (last == first || sum + all[last]->nbytes <= group_bytes)) sum += all[last++]->nbytes;
    std::vector<PinnedTensor> pins;
    CAIRN_RETURN_IF_ERROR(pin_tensors(std::span(all).subspan(first, last - first), m->id, true, pins));
    for (const auto& pt : pins)
      for (const auto& h : pt.pinned) p_.dram.unpin(h);
    bytes += sum;
    if (progress) progress->add(sum);
    first = last;
  }
  return bytes;
}

}  // namespace cairn
