// Where a committed model's manifest is: pending in the flusher (committed, not yet in the
// repository), committed on another member of the job (RemoteModels), or in the repository. The one lookup every
// component that serves a model uses.
//
// Owns nothing; never blocks on I/O (the repository's manifests are in memory).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "core/status.hpp"
#include "daemon/flusher.hpp"
#include "daemon/peers/remote_models.hpp"
#include "daemon/repository_view.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

class ModelDirectory {
 public:
  // view (may be null: find_fresh is find): how find_fresh brings the repository's view up to
  // date, the daemon's repository watch (which also applies what it reads to the catalog and the
  // peers' announcements).
  ModelDirectory(const Flusher& flusher, const Repository& repo, const RemoteModels& remote, RepositoryView* view)
      : flusher_(flusher), repo_(repo), remote_(remote), view_(view) {}
  // The manifest of a readable model: pending, committed on another member of the job's peer group
  // (not yet in the repository), or in the repository and not collected by gc.
  // kNotFound says which of the two it is not.
  Result<std::shared_ptr<const ModelManifest>> find(const std::string& id) const;
  // The same with the repository's view brought up to date first: for a read that found the
  // model's bytes missing or damaged, which may be a model another daemon's gc removed after this
  // daemon's view last listed it (a shared repository).
  Result<std::shared_ptr<const ModelManifest>> find_fresh(const std::string& id) const;

 private:
  const Flusher& flusher_;
  const Repository& repo_;
  const RemoteModels& remote_;
  RepositoryView* const view_;
};

}  // namespace cairn
