// The job's catalog as this member sees it (docs/peers.md, "One catalog per job"): the models other
// members of the peer group committed and announced that this daemon's repository view does not
// have yet. It owns them (RemoteModels) and keeps the lineage catalog and the reference counts in
// step with them:
//   add          a model another member announced joins the catalog, the reference counts and the
//                remote models (unless known here already, or seen removed from the repository since);
//   drop_member  a member that left takes the models it had not written to the repository with it;
//   drop         one such model is gone (its member left; a multi-part model's flush failed there).
// The repository watch drops an entry once the repository has the model (remote()).
//
// Owns: the remote models. Lock order: RemoteModels' lock is a leaf; add and drop take the catalog's
// and the reference counts' locks, never while holding it.
//
// Thread-safety: every method may be called from any thread (the peer service's service thread
// adds and drops; requests read through ModelDirectory and Admin).
#pragma once

#include <memory>
#include <string>

#include "daemon/catalog.hpp"
#include "daemon/commit_clock.hpp"
#include "daemon/flusher.hpp"
#include "daemon/peers/remote_models.hpp"
#include "daemon/references.hpp"
#include "tiers/pfs/manifest.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

class PeerCatalog {
 public:
  struct Parts {
    Catalog& catalog;
    ReferenceCounts& references;
    const Flusher& flusher;  // this daemon's own pending models
    Repository& repo;
    CommitClock& clock;  // told the stamp of each model added
  };
  explicit PeerCatalog(Parts parts) : p_(parts) {}
  PeerCatalog(const PeerCatalog&) = delete;
  PeerCatalog& operator=(const PeerCatalog&) = delete;

  // A model `member` committed and announced. Ignored when known here already (published and
  // seen, or one of this daemon's own) or removed from the repository since it was committed.
  void add(ModelManifest model, const std::string& member);
  // Every model of `member` not in the repository is gone (it left the group).
  void drop_member(const std::string& member);
  // One model `member` committed and announced is gone before it reached the repository; `why`
  // completes the warning "model 'X' was committed on peer M, <why>". Nothing when the entry is
  // not that member's, or the repository has the model.
  void drop(const std::string& id, const std::string& member, const std::string& why);

  // The models themselves, for lookups (ModelDirectory, Admin) and for the repository watch.
  RemoteModels& remote() { return remote_; }
  const RemoteModels& remote() const { return remote_; }

 private:
  // The manifest of the parent of a model being added, wherever it is (null: unknown here).
  std::shared_ptr<const ModelManifest> parent_of(const ModelManifest& m) const;

  Parts p_;
  RemoteModels remote_;
};

}  // namespace cairn
