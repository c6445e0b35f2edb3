#include "daemon/commit_clock.hpp"

#include <algorithm>
#include <chrono>

namespace cairn {

void CommitClock::observe(int64_t created_ns) {
  MutexLock lock(mu_);
  last_ns_ = std::max(last_ns_, created_ns);
}

int64_t CommitClock::next() {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  MutexLock lock(mu_);
  last_ns_ = std::max<int64_t>(now, last_ns_ + 1);
  return last_ns_;
}

}  // namespace cairn
