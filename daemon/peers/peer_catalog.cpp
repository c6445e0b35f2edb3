// The job's catalog of models committed on other members (peer_catalog.hpp).
#include "daemon/peers/peer_catalog.hpp"

#include "core/log.hpp"
#include "daemon/model_graph.hpp"

namespace cairn {

std::shared_ptr<const ModelManifest> PeerCatalog::parent_of(const ModelManifest& m) const {
  if (m.parent.empty()) return nullptr;
  if (auto pending = p_.flusher.find(m.parent)) return pending;
  if (auto remote = remote_.find(m.parent)) return remote;
  auto stored = p_.repo.get_shared(m.parent);
  if (!stored.ok() || (*stored)->collected) return nullptr;
  return std::move(stored).value();
}

void PeerCatalog::add(ModelManifest model, const std::string& member) {
  // Known already: published and seen here, or (a race of ids is settled by the repository's claim)
  // one of this daemon's own.
  if (p_.catalog.contains(model.id) || p_.flusher.contains(model.id)) return;
  // Removed from the repository since it was committed (a message that came late): gone.
  if (remote_.removed_after(model.id, model.created_ns)) return;
  auto m = std::make_shared<const ModelManifest>(std::move(model));
  std::shared_ptr<const ModelManifest> parent = parent_of(*m);
  Status added = p_.catalog.add(m->id, m->parent, graph_for(p_.catalog, *m, nullptr, parent.get()), m->metadata);
  if (!added.ok()) {
    CAIRN_LOG_WARN("model '{}' of peer {}: {}", m->id, member, added.to_string());
    return;
  }
  p_.clock.observe(m->created_ns);
  p_.references.count(*m, +1);
  remote_.put(std::move(m), member);
}

void PeerCatalog::drop_member(const std::string& member) {
  for (const std::string& id : remote_.of_member(member))
    drop(id, member,
         "which left the group before writing it to the repository: it is gone (commit at durability local "
         "or global to survive a member)");
}

void PeerCatalog::drop(const std::string& id, const std::string& member, const std::string& why) {
  auto m = remote_.find(id);
  if (!m || remote_.member_of(id) != member || !remote_.erase(id)) return;
  // Published before the member left: the repository serves it (get looks the id up on a miss).
  if (p_.repo.get_shared(id).ok()) return;
  (void)p_.catalog.retire(id);
  (void)p_.catalog.erase(id);
  p_.references.count(*m, -1);
  CAIRN_LOG_WARN("model '{}' was committed on peer {}, {}", id, member, why);
}

}  // namespace cairn
