// Where a committed model's manifest is: pending in the flusher (committed, not yet in the
// repository), committed on another member of the job (RemoteModels), or in the repository. The one lookup every component that serves a model uses.
//
// Owns nothing; never blocks on I/O (the repository's manifests are in memory).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/status.hpp"
#include "daemon/flusher.hpp"
#include "daemon/peers/remote_models.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

class ModelDirectory {
 public:
  ModelDirectory(const Flusher& flusher, const Repository& repo, const RemoteModels& remote)
      : flusher_(flusher), repo_(repo), remote_(remote) {}
  // The manifest of a readable model: pending, committed on another member of the job's peer group
  // (not yet in the repository), or in the repository and not collected by gc.
  // kNotFound says which of the two it is not.
  Result<std::shared_ptr<const ModelManifest>> find(const std::string& id) const;
  // The same with the repository's view brought up to date first: for a read that found the
  // model's bytes missing or damaged, which may be a model another daemon's gc removed after this
  // daemon's view last listed it (a shared repository).
  Result<std::shared_ptr<const ModelManifest>> find_fresh(const std::string& id) const;
  // How find_fresh brings the view up to date: the daemon's repository watch (which also applies
  // what it reads to the catalog and the peers' announcements); without one, find_fresh is find.
  void set_refresh(std::function<Status()> refresh) { refresh_ = std::move(refresh); }

 private:
  const Flusher& flusher_;
  const Repository& repo_;
  const RemoteModels& remote_;
  std::function<Status()> refresh_;
};

}  // namespace cairn
