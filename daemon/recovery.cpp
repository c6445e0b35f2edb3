#include "daemon/recovery.hpp"

#include <unordered_set>

#include "core/log.hpp"
#include "daemon/model_graph.hpp"

namespace cairn {

using nlohmann::json;

Status load_catalog(const RecoveryParts& p) {
  std::unordered_set<std::string> left_out;                // models left out; their descendants are too
  std::vector<std::shared_ptr<const ModelManifest>> live;  // their chunk references, counted at the end
  p.catalog.defer_index();                                 // best_ancestor's index: at its first use
  for (const std::string& id : p.repo.list()) {
    // Another daemon's gc may remove models between the listing and here (children before their
    // parents): a model gone meanwhile is simply not in the catalog. Failing the start for it kept a
    // daemon from restarting beside a group that collects (found by the torture harness).
    auto found = p.repo.get_shared(id);
    if (!found.ok() && found.status().code() == StatusCode::kNotFound) continue;
    CAIRN_ASSIGN_OR_RETURN(auto m, std::move(found));
    std::shared_ptr<const ModelManifest> parent;
    if (!m->parent.empty()) {
      if (left_out.count(m->parent)) {
        CAIRN_LOG_ERROR("model '{}' descends from '{}', which is left out of the catalog: it is left out too", id,
                        m->parent);
        left_out.insert(id);
        continue;
      }
      auto pf = p.repo.get_shared(m->parent);
      if (!pf.ok() && pf.status().code() == StatusCode::kNotFound) {
        if (p.repo.contains(id))  // a child written after another daemon's gc removed its parent
          CAIRN_LOG_ERROR(
              "model '{}' names parent '{}', which is not in the repository: it is left out of the "
              "catalog (its bytes stay readable through the repository; `cairn fsck` lists it)",
              id, m->parent);
        left_out.insert(id);
        continue;
      }
      CAIRN_ASSIGN_OR_RETURN(parent, std::move(pf));
    }
    CAIRN_RETURN_IF_ERROR(p.catalog.add(m->id, m->parent, graph_for(p.catalog, *m, nullptr, parent.get()), m->metadata,
                                        m->retired_ns != 0));
    p.clock.observe(m->created_ns);
    if (m->retired_ns == 0) live.push_back(std::move(m));
  }
  p.references.count_all(live);
  return Status::OK();
}

RecoveryReport recover_from_nvme(const RecoveryParts& p) {
  RecoveryReport report;
  NvmeTier* nvme = p.nvme;
  if (!nvme) return report;
  const auto& found = nvme->open_report();
  // Chunks whose CLEAN record was lost in the crash.
  for (const ChunkHash& h : nvme->dirty_chunks())
    if (p.repo.locate(h)) nvme->mark_clean(h);
  for (const auto& rec : found.pending) {
    json j = json::parse(rec.manifest_json, nullptr, false);
    auto parsed = j.is_discarded() ? Result<ModelManifest>(corruption("not JSON")) : manifest_from_json(j, false);
    if (!parsed.ok()) {
      CAIRN_LOG_ERROR("burst buffer: model '{}' committed `local` has an unreadable record ({}); it is lost", rec.id,
                      parsed.status().to_string());
      ++report.models_lost;
      (void)nvme->model_done(rec.id);
      continue;
    }
    auto m = std::make_shared<ModelManifest>(std::move(parsed).value());
    if (p.repo.contains(m->id)) {  // it reached the repository; only the DONE record was lost
      (void)nvme->model_done(m->id);
      continue;
    }
    std::string missing;
    for (const auto& t : m->tensors)
      for (const auto& c : t.chunks)
        if (missing.empty() && !nvme->contains(c.hash) && !p.repo.locate(c.hash))
          missing = "tensor '" + t.name + "' chunk " + c.hash.hex();
    std::shared_ptr<const ModelManifest> parent;
    if (missing.empty() && !m->parent.empty()) {
      auto pm = p.models.find(m->parent);
      if (pm.ok())
        parent = *pm;
      else
        missing = "its parent '" + m->parent + "'";
    }
    if (!missing.empty()) {
      CAIRN_LOG_ERROR("burst buffer: model '{}' committed `local` cannot be recovered: {} has no intact copy", m->id,
                      missing);
      ++report.models_lost;
      (void)nvme->model_done(m->id);
      continue;
    }
    Flusher::Entry entry{m, 0, false, true, true};
    Status added = p.flusher.enqueue(std::move(entry), [&]() -> Status {
      CAIRN_RETURN_IF_ERROR(
          p.catalog.add(m->id, m->parent, graph_for(p.catalog, *m, nullptr, parent.get()), m->metadata));
      p.clock.observe(m->created_ns);
      p.references.count(*m, +1);
      return Status::OK();
    });
    if (!added.ok()) {
      CAIRN_LOG_ERROR("burst buffer: model '{}': {}", m->id, added.to_string());
      continue;
    }
    ++report.models_recovered;
    CAIRN_LOG_INFO(
        "burst buffer: recovered model '{}' (committed `local` before a crash); writing it to the repository", m->id);
  }
  return report;
}

}  // namespace cairn
