#include "daemon/repository_watch.hpp"

#include <cctype>
#include <optional>

#include "core/log.hpp"
#include "daemon/model_graph.hpp"

namespace cairn {

using nlohmann::json;

RepositoryWatch::RepositoryWatch(Parts parts, std::chrono::milliseconds interval) : p_(parts), interval_(interval) {}

void RepositoryWatch::start() {
  if (interval_.count() > 0) thread_ = std::thread([this] { loop(); });
}

Status RepositoryWatch::refresh() { return refresh_once().status(); }

RepositoryWatch::~RepositoryWatch() { stop(); }

void RepositoryWatch::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RepositoryWatch::loop() {
  constexpr uint64_t kCompactEvery = 60;  // refreshes
  uint64_t ticks = 0;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, interval_, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    Result<RefreshReport> r = refresh_once();
    if (!r.ok()) CAIRN_LOG_WARN("refreshing the repository: {}", r.status().to_string());
    // Now and then, fold the logs of daemons that are gone into a checkpoint.
    if (++ticks % kCompactEvery == 0) {
      auto c = p_.repo.compact_if_needed();
      if (!c.ok())
        CAIRN_LOG_WARN("compacting the repository: {}", c.status().to_string());
      else if (c->checkpoint_seq != 0)
        CAIRN_LOG_INFO("compacted the repository: checkpoint {}, {} logs folded in", c->checkpoint_seq,
                       c->logs_deleted);
    }
    lock.lock();
  }
}

Result<RefreshReport> RepositoryWatch::refresh_once() {
  std::lock_guard lock(mu_);
  Result<RefreshReport> r = p_.repo.refresh();
  ++refreshes_;
  if (!r.ok()) {
    ++failures_;
    return r;
  }
  // Parents come before their children in `added` (the repository applies them in that order).
  for (const auto& m : r->added) {
    // A model a peer announced is in the repository now: served from here from now on (its catalog
    // entry and reference counts came with the announcement).
    if (p_.remote) p_.remote->erase(m->id);
    if (p_.catalog.contains(m->id)) continue;
    std::shared_ptr<const ModelManifest> parent;
    if (!m->parent.empty()) {
      auto pm = p_.repo.get_shared(m->parent);
      if (pm.ok()) parent = *pm;
    }
    Status s = p_.catalog.add(m->id, m->parent, graph_for(p_.catalog, *m, nullptr, parent.get()), m->metadata,
                              m->retired_ns != 0);
    if (!s.ok()) {
      CAIRN_LOG_WARN("model '{}' of another daemon: {}", m->id, s.to_string());
      continue;
    }
    p_.clock.observe(m->created_ns);
    if (m->retired_ns == 0) p_.references.count(*m, +1);
    ++models_added_;
  }
  for (const std::string& id : r->retired) (void)p_.catalog.retire(id);
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const std::string& id : r->removed) {
    // Removed and then committed again within one report (a gc keeps, collected, a parent whose
    // child another daemon committed meanwhile): what counts is the repository's state now.
    if (p_.repo.contains(id)) continue;
    if (p_.catalog.contains(id)) {
      (void)p_.catalog.retire(id);
      (void)p_.catalog.erase(id);
      ++models_removed_;
    }
    // A peer's announcement of it, here from before (read after the removal) or late, is stale.
    if (p_.remote) (void)p_.remote->removed(id, now_ns);
  }
  return r;
}

Result<request::SyncReply> RepositoryWatch::sync() {
  CAIRN_ASSIGN_OR_RETURN(RefreshReport r, refresh_once());
  return request::SyncReply{r.added.size(), r.removed.size(), r.retired.size(), r.reloaded, p_.repo.stats().models};
}

json RepositoryWatch::stats() const {
  std::lock_guard lock(mu_);
  return json{{"refresh_interval_ms", interval_.count()},
              {"refreshes", refreshes_},
              {"models_from_other_daemons", models_added_},
              {"models_removed_by_other_daemons", models_removed_},
              {"failures", failures_}};
}

}  // namespace cairn
