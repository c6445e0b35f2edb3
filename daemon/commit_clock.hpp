// The commit stamps: each model's created_ns, the wall clock at its registration, strictly after
// every stamp this daemon has handed out or seen (models loaded from the repository, recovered from
// the burst buffer, announced by peers, published by other daemons). A client's manifest cache keys
// on (id, created_ns), so an id that gc deleted and a commit used again gets a new stamp.
//
// Owns: the last stamp. Thread-safety: every method may be called from any thread; mu_ is a leaf
// (CommitPath takes it inside the flusher's admit step).
#pragma once

#include <cstdint>

#include "core/sync.hpp"

namespace cairn {

class CommitClock {
 public:
  // A model stamped created_ns exists: later stamps follow it.
  void observe(int64_t created_ns);
  // The next stamp: the wall clock in ns since the epoch, or one more than the last stamp when the
  // clock has not passed it.
  int64_t next();

 private:
  Mutex mu_;
  int64_t last_ns_ CAIRN_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn
