#include "daemon/reads.hpp"

#include <atomic>
#include <cstring>
#include <thread>

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
  return out;
}

void Reads::readahead(const std::vector<const TensorManifest*>& tensors) {
  std::vector<const ChunkRef*> refs;
  for (const TensorManifest* t : tensors)
    for (const ChunkRef& c : t->chunks) refs.push_back(&c);
  p_.tiers.readahead(refs);
}

Status Reads::pin_tensor(const TensorManifest& t, const std::string& model, bool prefetch,
                         std::vector<ChunkHash>& pinned, std::vector<Extent>& extents) {
  DramTier& dram = p_.dram;
  const size_t n = t.chunks.size();
  std::vector<DramTier::Claim> claims(n);
  std::vector<size_t> to_load, to_wait;
  for (size_t i = 0; i < n; ++i) {
    claims[i] = dram.claim(t.chunks[i].hash);
    if (claims[i].kind == DramTier::ClaimKind::kLoad) to_load.push_back(i);
    else if (claims[i].kind == DramTier::ClaimKind::kLoading) to_wait.push_back(i);
  }
  std::vector<uint64_t> offsets(n, 0);
  std::vector<bool> have(n, false);
  std::vector<const char*> served(n, "dram");  // the tier each chunk came from, for the trace
  for (size_t i = 0; i < n; ++i)
    if (claims[i].kind == DramTier::ClaimKind::kResident) offsets[i] = claims[i].offset, have[i] = true;

  Status failure;
  // Load the missing chunks: into one allocation when the whole tensor is missing, so that it is
  // contiguous in the arena and can be mapped without assembling. Space first (all or nothing),
  // then the reads, several at a time so that reading, checksumming and copying overlap.
  if (!to_load.empty()) {
    const bool whole = to_load.size() == n && n > 1;
    std::vector<uint64_t> load_off(to_load.size());
    std::vector<Extent> granted;
    if (whole) {
      auto off = dram.allocate(t.nbytes);
      if (!off.is_ok()) failure = off.status();
      else {
        granted.push_back(Extent{*off, t.nbytes});
        for (size_t k = 0; k < to_load.size(); ++k) load_off[k] = *off + to_load[k] * p_.chunk_size;
      }
    } else {
      for (size_t k = 0; failure.is_ok() && k < to_load.size(); ++k) {
        auto a = dram.allocate(t.chunks[to_load[k]].length);
        if (!a.is_ok()) failure = a.status();
        else granted.push_back(Extent{*a, t.chunks[to_load[k]].length}), load_off[k] = *a;
      }
    }
    std::vector<Status> results(to_load.size());
    std::vector<char> loaded(to_load.size(), 0);
    const bool read_any = failure.is_ok();
    if (read_any) {
      auto read_one = [&](size_t k) {
        const ChunkRef& ref = t.chunks[to_load[k]];
        // The fastest intact copy below DRAM, verified (tiers/tier_manager.hpp).
        results[k] = p_.tiers.fetch(ref, dram.base() + load_off[k], &served[to_load[k]]);
        // Resident at once, not when the whole tensor is in: a reader waiting for this chunk (here,
        // or a peer member that the group's directory told to wait for this daemon's load) has it
        // while the rest still loads. Each chunk owns its sub-range of a whole-tensor allocation.
        if (results[k].is_ok()) {
          dram.finish_load(ref.hash, load_off[k], ref.length);
          loaded[k] = 1;
        }
      };
      constexpr size_t kParallelReads = 4;
      std::atomic<size_t> next{0};
      auto worker = [&] {
        for (size_t k; (k = next++) < to_load.size();) read_one(k);
      };
      std::vector<std::thread> helpers;
      for (size_t h = 1; h < std::min(kParallelReads, to_load.size()); ++h) helpers.emplace_back(worker);
      worker();
      for (auto& th : helpers) th.join();
      for (const auto& r : results)
        if (failure.is_ok() && !r.is_ok()) failure = r.with_context("tensor '" + t.name + "'");
    }
    // (Reads per source are counted by the tier manager, which knows where each chunk came from.)
    if (!read_any) {
      // No space: nothing was read; give back what was granted and let waiters try again.
      for (const auto& g : granted) dram.release(g.offset, g.length);
      for (size_t k : to_load) dram.abort_load(t.chunks[k].hash);
    }
    for (size_t k = 0; read_any && k < to_load.size(); ++k) {
      const size_t i = to_load[k];
      if (loaded[k]) {
        offsets[i] = load_off[k];
        have[i] = true;  // pinned by finish_load; unpinned below if the tensor fails
      } else {
        // Its space goes back (its own allocation, or its sub-range of the tensor's) and waiters
        // try again.
        dram.release(load_off[k], t.chunks[i].length);
        dram.abort_load(t.chunks[i].hash);
      }
    }
  }
  for (size_t i : to_wait) {
    if (!failure.is_ok()) break;
    for (;;) {
      if (auto off = dram.wait_pin(t.chunks[i].hash)) {
        offsets[i] = *off;
        have[i] = true;
        break;
      }
      // The other loader failed: try ourselves.
      auto c = dram.claim(t.chunks[i].hash);
      if (c.kind == DramTier::ClaimKind::kResident) {
        offsets[i] = c.offset;
        have[i] = true;
        break;
      }
      if (c.kind == DramTier::ClaimKind::kLoading) continue;
      const ChunkRef& ref0 = t.chunks[i];
      auto a = dram.allocate(ref0.length);
      Status st = !a.is_ok() ? a.status() : p_.tiers.fetch(ref0, dram.base() + *a, &served[i]);
      if (!st.is_ok()) {
        if (a.is_ok()) dram.release(*a, ref0.length);
        dram.abort_load(ref0.hash);
        failure = st;
        break;
      }
      dram.finish_load(ref0.hash, *a, ref0.length);
      offsets[i] = *a;
      have[i] = true;
      break;
    }
  }
  if (!failure.is_ok()) {
    for (size_t i = 0; i < n; ++i)
      if (have[i]) dram.unpin(t.chunks[i].hash);
    return failure;
  }
  for (size_t i = 0; i < n; ++i) {
    pinned.push_back(t.chunks[i].hash);
    extents.push_back(Extent{offsets[i], t.chunks[i].length});
  }
  if (trace_)
    for (size_t i = 0; i < n; ++i) trace_->access(model, t.chunks[i].hash, t.chunks[i].length, served[i], prefetch);
  return Status::ok();
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
      release_lease(s.leases[l]);
      s.leases.erase(l);
    }
  };
  for (const auto& nj : *names) {
    if (!nj.is_string()) {
      undo();
      return invalid_argument("request 'lease': tensor names must be strings");
    }
    const TensorManifest* t = m->find(nj.get<std::string>());
    if (!t) {
      undo();
      return not_found("model '" + id + "' has no tensor '" + nj.get<std::string>() + "'");
    }
    Session::Lease lease;
    std::vector<Extent> extents;
    Status st = pin_tensor(*t, m->id, false, lease.pinned_chunks, extents);
    if (!st.is_ok()) {
      undo();
      return st;
    }
    bool consecutive = true;
    for (size_t i = 1; i < extents.size(); ++i)
      if (extents[i].offset != extents[i - 1].offset + extents[i - 1].length) consecutive = false;
    if (contiguous && !consecutive) {
      // Assemble a contiguous copy for a zero-copy view; the chunks stay where they are.
      auto off = p_.dram.allocate(t->nbytes);
      if (!off.is_ok()) {
        release_lease(lease);
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
    s.leases[lid] = std::move(lease);
    granted.push_back(lid);
    leases.push_back({{"lease", lid}, {"extents", std::move(ex)}, {"nbytes", t->nbytes}});
  }
  if (observer_) observer_->leased(*m, wanted);
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
}

Result<json> Reads::release(Session& s, const json& req) {
  auto ids = req.find("leases");
  if (ids == req.end() || !ids->is_array()) return invalid_argument("request 'release': missing array field 'leases'");
  for (const auto& v : *ids) {
    if (!v.is_number_unsigned()) return invalid_argument("request 'release': lease ids must be non-negative integers");
    auto it = s.leases.find(v.get<uint64_t>());
    if (it == s.leases.end()) continue;  // released twice: harmless
    release_lease(it->second);
    s.leases.erase(it);
  }
  return json::object();
}

void Reads::end_session(Session& s) {
  for (auto& [id, lease] : s.leases) release_lease(lease);
  s.leases.clear();
}

Status Reads::stage(const std::string& model, const TensorManifest& t) {
  std::shared_lock gc_lock(p_.gc_mu);
  std::vector<ChunkHash> pinned;
  std::vector<Extent> extents;
  CAIRN_RETURN_IF_ERROR(pin_tensor(t, model, true, pinned, extents));
  for (const auto& h : pinned) p_.dram.unpin(h);
  return Status::ok();
}

Result<json> Reads::prefetch(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::shared_lock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(auto m, p_.models.find(id));
  uint64_t bytes = 0;
  std::vector<const TensorManifest*> all;
  for (const auto& t : m->tensors) all.push_back(&t);
  readahead(all);
  for (const auto& t : m->tensors) {
    std::vector<ChunkHash> pinned;
    std::vector<Extent> extents;
    CAIRN_RETURN_IF_ERROR(pin_tensor(t, m->id, true, pinned, extents));
    for (const auto& h : pinned) p_.dram.unpin(h);
    bytes += t.nbytes;
  }
  return json{{"bytes", bytes}};
}

}  // namespace cairn
