#include "daemon/admin.hpp"

#include <chrono>
#include <set>

#include "core/log.hpp"
#include "daemon/request.hpp"
#include "daemon/watchdog.hpp"

namespace cairn {

using nlohmann::json;

Result<json> Admin::list(const request::List& req) {
  const bool all = req.all;
  json models = json::array();
  auto row = [](const ModelManifest& m, const char* durability) {
    json r{{"id", m.id},
           {"parent", m.parent.empty() ? json() : json(m.parent)},
           {"tensors", m.tensors.size()},
           {"bytes", m.logical_bytes()},
           {"created_ns", m.created_ns},
           {"durability", durability}};
    if (m.retired_ns != 0) r["retired"] = true;
    if (m.collected) r["collected"] = true;
    return r;
  };
  // A model moves from pending (or another member's) to the repository: listed once, as the
  // repository has it, while it is in both for a moment. Pending is read first: the flusher drops a
  // model from pending only after the repository has it, so a model moved between the two reads is
  // in the second; read the other way round it would be in neither.
  const auto pending = p_.flusher.pending();
  std::set<std::string> listed;
  for (const auto& id : p_.repo.list()) {
    auto m = p_.repo.get_shared(id);
    if (m.ok() && (all || (*m)->retired_ns == 0)) models.push_back(row(**m, "global"));
    listed.insert(id);
  }
  for (const auto& m : pending)
    if (listed.insert(m->id).second) models.push_back(row(*m, "memory"));
  // Committed on another member of the job, not in the repository yet (as far as this daemon knows).
  if (p_.remote)
    for (const auto& m : p_.remote->all()) {
      if (!listed.insert(m->id).second) continue;
      json r = row(*m, "memory");
      r["peer"] = true;
      models.push_back(std::move(r));
    }
  return json{{"models", std::move(models)}};
}

Result<json> Admin::show(const request::ModelId& req) {
  const std::string& id = req.id;
  std::shared_ptr<const ModelManifest> m = p_.flusher.find(id);
  if (!m && p_.remote) m = p_.remote->find(id);  // committed on another member of the job
  const bool pending = m != nullptr;
  if (!m) {
    auto r = p_.repo.get_shared(id);  // collected models too: their lineage and metadata remain
    if (!r.ok()) return not_found("model '" + id + "' does not exist (see `cairn ls`)");
    m = *r;
  }
  json tensors = json::array();
  for (const auto& t : m->tensors)
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", request::shape_json(t.shape)},
                       {"nbytes", t.nbytes},
                       {"chunks", t.chunks.size()}});
  json children = json::array();
  if (auto d = p_.catalog.descendants(id, 1); d.ok())
    for (const auto& [c, depth] : *d) children.push_back(c);
  json out{{"id", m->id},
           {"parent", m->parent.empty() ? json() : json(m->parent)},
           {"children", std::move(children)},
           {"created_ns", m->created_ns},
           {"durability", pending ? "memory" : "global"},
           {"pack", m->pack},
           {"logical_bytes", m->logical_bytes()},
           {"metadata", m->metadata},
           {"architecture", m->architecture},
           {"tensors", std::move(tensors)}};
  if (m->retired_ns != 0) out["retired_ns"] = m->retired_ns;
  if (m->collected) out["collected"] = true;
  // What it costs in the repository (docs/repository-format.md, "Coded chunks"): absent while the
  // model is not there yet.
  if (!pending) {
    if (auto u = p_.repo.usage(id, Freshness::kCached); u.ok()) {
      uint64_t by_coding[kChunkCodingCount] = {};
      for (const auto& t : m->tensors)
        for (const auto& c : t.chunks) ++by_coding[static_cast<size_t>(c.coding)];
      json codings = json::object();
      for (int i = 0; i < kChunkCodingCount; ++i)
        codings[std::string(chunk_coding_name(static_cast<ChunkCoding>(i)))] = by_coding[i];
      out["storage"] = {{"chunks", u->chunks},
                        {"raw_bytes", u->raw_bytes},
                        {"stored_bytes", u->stored_bytes},
                        {"own_raw_bytes", u->own_raw_bytes},
                        {"own_stored_bytes", u->own_stored_bytes},
                        {"lineage_stored_bytes", u->lineage_stored_bytes},
                        {"ancestors", u->ancestors},
                        {"codings", std::move(codings)}};
    }
  }
  return out;
}

namespace {

// The repository's chunk locations by coding: {"raw": {chunks, bytes, stored}, "planes": ..., "delta": ...}.
json codings_json(const RepositoryStats& rs) {
  json out = json::object();
  for (int i = 0; i < kChunkCodingCount; ++i) {
    const auto& c = rs.codings[static_cast<size_t>(i)];
    out[std::string(chunk_coding_name(static_cast<ChunkCoding>(i)))] = {
        {"chunks", c.chunks}, {"bytes", c.bytes}, {"stored", c.stored}};
  }
  return out;
}

}  // namespace

Result<json> Admin::stats() {
  RepositoryStats rs = p_.repo.stats();
  TierStats dram = p_.dram.stats();
  json moved = p_.tiers.stats();
  const Flusher::Stats fl = p_.flusher.stats();
  TierStats pfs;
  pfs.name = "pfs";
  pfs.enabled = true;
  pfs.used_bytes = rs.stored_bytes;
  pfs.chunks = rs.chunks;
  pfs.hits = moved["reads_from_repository"].get<uint64_t>();
  pfs.bytes_out = moved["bytes_from_repository"].get<uint64_t>();
  pfs.bytes_in = fl.repository_bytes_written;
  TierStats hbm, nvme;
  hbm.name = "hbm";
  nvme.name = "nvme";
  if (p_.nvme) nvme = p_.nvme->stats();
  if (hbm_) hbm = hbm_->stats();
  json tiers{{"hbm", hbm.to_json()}, {"dram", dram.to_json()}, {"nvme", nvme.to_json()}, {"pfs", pfs.to_json()}};
  if (hbm_) {
    tiers["hbm"]["backend"] = hbm_->backend();
    tiers["hbm"]["devices"] = hbm_->device_stats();
  } else {
    tiers["hbm"]["why"] = "no HBM tier: tiers.hbm.capacity is 0 (docs/gpu.md)";
  }
  tiers["nvme"]["path"] = p_.nvme_path;
  if (p_.nvme) tiers["nvme"]["direct_io"] = p_.nvme->direct_io();
  tiers["pfs"]["path"] = p_.repo.dir();
  return json{
      {"tiers", std::move(tiers)},
      {"repository",
       {{"path", p_.repo.dir()},
        {"models", rs.models},
        {"retired", rs.retired},
        {"packs", rs.packs},
        {"chunks", rs.chunks},
        {"logical_bytes", rs.logical_bytes},
        {"physical_bytes", rs.physical_bytes},
        {"stored_bytes", rs.stored_bytes},
        {"codings", codings_json(rs)},
        // Sharing (docs/repository-format.md): files on the PFS, this daemon's writer id,
        // the writers alive, and the group writes of records this daemon made.
        {"files", rs.files},
        {"writer", p_.repo.writer_id()},
        {"writers_alive", rs.writers_alive},
        {"group_syncs", rs.group_syncs}}},
      {"catalog", {{"models", p_.catalog.size()}, {"live", p_.catalog.live()}}},
      {"pending_models", fl.pending_models},
      // What a crash could lose or delay: models not yet in the repository, by stage.
      {"flush",
       {{"pending_models", fl.pending_models},
        {"awaiting_local", fl.awaiting_local},
        {"local_not_global", fl.local_not_global},
        {"repository_write_retries", fl.repository_write_retries},
        {"dirty_dram_bytes", dram.dirty_bytes},
        {"dirty_nvme_bytes", nvme.dirty_bytes}}},
      {"movement", std::move(moved)},
      {"recovery", {{"models_recovered", p_.recovery.models_recovered}, {"models_lost", p_.recovery.models_lost}}},
      {"dirty_bytes", dram.dirty_bytes + nvme.dirty_bytes},
      {"prefetch", p_.prefetcher ? p_.prefetcher->stats() : json::object()},
      {"chunk_size", p_.repo.chunk_size()}};
}

// `cairn rm`: retire. The model leaves queries and `cairn ls`; its bytes stay until `cairn gc`.
Result<json> Admin::remove(const request::ModelId& req) {
  const std::string& id = req.id;
  // A model still on its way to the repository is retired once it is there.
  {
    Watchdog::ClientWait waiting;  // for the flusher, as a commit waits for its durability
    p_.flusher.wait_until_flushed(id);
    // And for its descendants on their way: a gc of another daemon of the repository, which cannot
    // see them, would otherwise remove the retired parent and leave them unwritable (the torture
    // harness lost acknowledged children this way with three daemons).
    p_.flusher.wait_until_descendants_flushed(id);
  }
  // Retired in the repository and in the catalog at once, as far as a gc of this daemon sees:
  // between the two, a gc removed the model just retired and dropped it from the catalog, and the
  // `rm` that had succeeded answered "not in the catalog" (found by the torture harness).
  cairn::ReaderLock gc_lock(p_.gc_mu);
  auto before = p_.repo.get_shared(id);
  Status st = p_.repo.retire(id);
  if (st.code() == StatusCode::kNotFound) return not_found("model '" + id + "' does not exist (see `cairn ls`)");
  CAIRN_RETURN_IF_ERROR(st);
  CAIRN_RETURN_IF_ERROR(p_.catalog.retire(id));
  if (before.ok() && (*before)->retired_ns == 0) p_.references.count(**before, -1);
  if (p_.prefetcher) p_.prefetcher->retired(id);  // no longer read in a cycle
  return json{{"retired", id}};
}

Result<json> Admin::gc(OperationProgress& progress) {
  // Every pending model must be in the repository, so that its references count. First without the
  // lock: the flusher may take long (a slow repository, or writes failing and retried until the
  // fault passes) and no commit or read should wait behind gc meanwhile.
  {
    Watchdog::ClientWait waiting;  // for the flusher, as `flush` does
    drain_reporting(progress, -1);
  }
  progress.begin_phase("deciding what goes", ProgressUnit::kItems, 0);
  // Then what was committed since, with every commit and read held off while gc decides: bounded.
  // Only then: not while gc waits for another member's gc (the repository's lease) nor through the
  // grace before bytes are freed (GcSteps), which held every read of this daemon 5 s and more.
  // gc waits for other processes: for the repository's maintenance lease while another daemon's gc
  // or compaction holds it (up to 30 s), and through the grace other writers get (5 s). Those are
  // waits, not a stuck request (the watchdog reported a gc of a peer group at 30 s); the part
  // that holds this daemon's gc lock is bounded on its own (drain_for below).
  Result<GcReport> collected = [&] {
    // Taken when the repository starts deciding, released once it has decided (or, when deciding
    // failed, as the repository's gc returns). The analysis does not follow a lock across the two
    // callbacks, which Repository::gc calls in that order.
    cairn::WriterLock gc_lock(p_.gc_mu, std::defer_lock);
    GcSteps steps;
    steps.progress = &progress;
    steps.deciding = [&]() CAIRN_NO_THREAD_SAFETY_ANALYSIS -> Status {
      gc_lock.lock();
      if (!p_.flusher.drain_for(std::chrono::seconds(10)))
        return busy(
            "gc: models committed while it waited are still on their way to the repository after 10 s (the "
            "log says why if its writes fail); run gc again");
      return Status::OK();
    };
    steps.decided = [&](const GcReport& r) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
      for (const std::string& id : r.removed) {
        Status s = p_.catalog.erase(id);
        if (!s.ok()) CAIRN_LOG_WARN("gc: dropping '{}' from the catalog: {}", id, s.to_string());
      }
      gc_lock.unlock();
    };
    Watchdog::ClientWait waiting;
    return p_.repo.gc(steps);
  }();
  CAIRN_ASSIGN_OR_RETURN(GcReport r, std::move(collected));
  // And fold the logs of daemons that are gone into a checkpoint (another process compacting: later).
  progress.begin_phase("compacting the logs", ProgressUnit::kItems, 0);
  auto compacted = [&] {
    Watchdog::ClientWait waiting;  // the lease again
    return p_.repo.compact();
  }();
  if (!compacted.ok() && compacted.status().code() != StatusCode::kBusy)
    CAIRN_LOG_WARN("gc: compacting the repository: {}", compacted.status().to_string());
  RepositoryStats rs = p_.repo.stats();
  return json{{"removed", r.removed},
              {"collected", r.collected},
              {"packs_deleted", r.packs_deleted},
              {"bytes_released", r.bytes_released},
              {"bytes_punched", r.bytes_punched},
              {"bytes_unreclaimable", r.bytes_unreclaimable},
              {"physical_bytes", rs.physical_bytes}};
}

Result<json> Admin::fsck(const request::Fsck& req, OperationProgress& progress) {
  const bool verify = req.verify;
  cairn::ReaderLock gc_lock(p_.gc_mu);
  CAIRN_ASSIGN_OR_RETURN(FsckReport r, p_.repo.fsck(verify, &progress));
  auto problems = [](const std::vector<FsckReport::Problem>& v) {
    json out = json::array();
    for (const auto& p : v) {
      json j{{"pack", p.pack}, {"offset", p.offset}, {"length", p.length}, {"detail", p.detail}};
      if (!p.model.empty()) {
        j["model"] = p.model;
        j["tensor"] = p.tensor;
      }
      out.push_back(std::move(j));
    }
    return out;
  };
  return json{{"ok", r.ok()},
              {"models", r.models},
              {"chunks", r.chunks},
              {"bytes_verified", r.bytes_verified},
              {"dangling", problems(r.dangling)},
              {"orphaned", problems(r.orphaned)},
              {"orphaned_bytes", r.orphaned_bytes}};
}

bool Admin::drain_reporting(OperationProgress& progress, int64_t timeout_ms) {
  using SteadyClock = std::chrono::steady_clock;
  const auto deadline =
      timeout_ms < 0 ? SteadyClock::time_point::max() : SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  const uint64_t before = p_.flusher.stats().pending_models;
  progress.begin_phase("writing models to the repository", ProgressUnit::kItems, before);
  for (;;) {
    const auto now = SteadyClock::now();
    if (now >= deadline) return p_.flusher.drain_for(std::chrono::milliseconds(0));
    const auto step = std::min<SteadyClock::duration>(deadline - now, std::chrono::milliseconds(100));
    const bool drained = p_.flusher.drain_for(std::chrono::duration_cast<std::chrono::milliseconds>(step));
    // Models committed meanwhile count too: the total grows with them.
    const uint64_t left = p_.flusher.stats().pending_models;
    const ProgressSnapshot s = progress.snapshot();
    const uint64_t total = std::max(s.total, s.done + left);
    progress.set_total(total);
    progress.set_done(drained ? total : total - left);
    if (drained) return true;
  }
}

Result<json> Admin::flush(const request::Flush& req, OperationProgress& progress) {
  // Blocks until every acknowledged model is in the repository (or the timeout passes).
  const int64_t timeout_ms = req.timeout_ms;
  auto t0 = std::chrono::steady_clock::now();
  const uint64_t before = p_.flusher.stats().pending_models;
  bool done = true;
  {
    Watchdog::ClientWait waiting;
    done = drain_reporting(progress, timeout_ms);
  }
  const uint64_t left = p_.flusher.stats().pending_models;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!done)
    return timed_out("flush: " + std::to_string(left) + " models are still on their way to the repository after " +
                     std::to_string(timeout_ms) + " ms");
  uint64_t dirty = p_.dram.stats().dirty_bytes + (p_.nvme ? p_.nvme->stats().dirty_bytes : 0);
  return json{{"flushed_models", before}, {"pending_models", left}, {"dirty_bytes", dirty}, {"seconds", secs}};
}

}  // namespace cairn
