// What a component that looks models up needs of the repository watch (repository_watch.hpp):
// bringing this daemon's view of the shared repository up to date now, rather than at the next
// periodic refresh. ModelDirectory::find_fresh and the commit path (a parent that another daemon
// published since the last refresh) call it.
#pragma once

#include "core/status.hpp"

namespace cairn {

class RepositoryView {
 public:
  virtual ~RepositoryView() = default;
  // Reads the records other daemons appended since the last refresh and applies them (catalog,
  // reference counts, the peers' announcements). Blocks on the repository's I/O; any thread.
  virtual Status refresh() = 0;
};

}  // namespace cairn
