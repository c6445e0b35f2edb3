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

Result<json> Reads::open(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(id));
  json tensors = json::array();
  for (const auto& t : m->tensors)
    tensors.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", shape_json(t.shape)}, {"nbytes", t.nbytes}});
  json out{{"id", m->id}, {"tensors", std::move(tensors)}, {"metadata", m->metadata}, {"created_ns", m->created_ns}};
  out["parent"] = m->parent.empty() ? json() : json(m->parent);
  if (req.value("with_source_header", false) && m->source_header.size() > 8)
    out["source_header"] = m->source_header.substr(8);
  if (observer_) observer_->opened(*m);
  if (p_.usage) p_.usage->model_opened();
  return out;
}

void Reads::readahead(const std::vector<const TensorManifest*>& tensors) {
  std::vector<const ChunkRef*> refs;
  for (const TensorManifest* t : tensors)
    for (const ChunkRef& c : t->chunks) refs.push_back(&c);
  p_.tiers.readahead(refs);
}

Result<json> Reads::lease(Session& s, const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::shared_lock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(id));
  bool contiguous = req.value("contiguous", false);
  auto names = req.find("tensors");
  if (names == req.end() || !names->is_array()) return invalid_argument("request 'lease': missing array field 'tensors'");
  std::vector<const TensorManifest*> wanted;
  for (const auto& nj : *names)
    if (nj.is_string())
      if (const TensorManifest* t = m->find(nj.get<std::string>())) wanted.push_back(t);
  readahead(wanted);
  json leases = json::array();
  std::vector<uint64_t> granted;
  auto undo = [&] {
    for (uint64_t l : granted) {
      drop_lease(s.leases[l]);
      s.leases.erase(l);
    }
  };
  // Every named tensor first, then all of them pinned at once (one stream of reads), then a lease each.
  std::vector<const TensorManifest*> order;
  for (const auto& nj : *names) {
    if (!nj.is_string()) return invalid_argument("request 'lease': tensor names must be strings");
    const TensorManifest* t = m->find(nj.get<std::string>());
    if (!t) return not_found("model '" + id + "' has no tensor '" + nj.get<std::string>() + "'");
    order.push_back(t);
  }
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
      if (!off.is_ok()) {
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
    json ex = json::array();
    for (const auto& e : extents) ex.push_back({e.offset, e.length});
    uint64_t lid = s.next_id++;
    count_lease(lease, +1);
    s.leases[lid] = std::move(lease);
    granted.push_back(lid);
    leases.push_back({{"lease", lid}, {"extents", std::move(ex)}, {"nbytes", t->nbytes}});
  }
  if (observer_) observer_->leased(*m, order, read);
  return json{{"leases", std::move(leases)}, {"created_ns", m->created_ns}};
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

Result<json> Reads::release(Session& s, const json& req) {
  auto ids = req.find("leases");
  if (ids == req.end() || !ids->is_array()) return invalid_argument("request 'release': missing array field 'leases'");
  for (const auto& v : *ids) {
    if (!v.is_number_unsigned()) return invalid_argument("request 'release': lease ids must be non-negative integers");
    auto it = s.leases.find(v.get<uint64_t>());
    if (it == s.leases.end()) continue;  // released twice: harmless
    drop_lease(it->second);
    s.leases.erase(it);
  }
  return json::object();
}

void Reads::end_session(Session& s) {
  for (auto& [id, lease] : s.leases) drop_lease(lease);
  s.leases.clear();
}

Status Reads::stage(const std::string& model, const TensorManifest& t) {
  std::shared_lock gc_lock(p_.gc_mu);
  const TensorManifest* one[] = {&t};
  std::vector<PinnedTensor> pins;
  CAIRN_RETURN_IF_ERROR(pin_tensors(one, model, true, pins));
  for (const auto& h : pins[0].pinned) p_.dram.unpin(h);
  return Status::ok();
}

Result<json> Reads::prefetch(const json& req, OperationProgress* progress) {
  if (auto tier = req.find("tier"); tier != req.end()) {
    if (!tier->is_string()) return invalid_argument("request 'prefetch': field 'tier' must be a string");
    if (*tier == "hbm") return prefetch_device(req);
    if (*tier != "dram")
      return invalid_argument("prefetch --tier " + tier->get<std::string>() +
                              ": cairn prefetches into dram or hbm (the burst buffer is filled by commits at durability "
                              "local and by DRAM evictions)");
  }
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::shared_lock gc_lock(p_.gc_mu);
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
  return json{{"bytes", bytes}};
}

}  // namespace cairn
