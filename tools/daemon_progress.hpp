// Shows the progress of one long daemon request (gc, fsck, flush, sync, prefetch) on a ProgressLine.
//
// The request carries a token in its "progress" field (request_fields() adds it); while it runs, a
// thread of this object asks the daemon for that token's progress (the `progress` request) on a
// connection of its own, ten times a second, and draws what it gets. A daemon that does not know the
// `progress` request (an older release) is asked no further; the command still works.
//
// Thread-safety: construct, start, stop from one thread; the line is touched only by the polling
// thread between start() and stop().
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/sync.hpp"
#include "tools/progress_line.hpp"

namespace cairn::tool {

class DaemonProgress {
 public:
  explicit DaemonProgress(ProgressLine& line);
  ~DaemonProgress() { stop(); }

  // Adds the token to a request when the line is enabled.
  void add_token(nlohmann::json& request) const;
  // The token a request carries: "" when the line is disabled (no progress to ask for).
  std::string token() const;
  // Starts polling (nothing when the line is off).
  void start();
  // Stops polling and joins the thread; the line is the caller's again.
  void stop();
  // Snapshots drawn so far.
  int snapshots() const { return snapshots_.load(); }

 private:
  void poll();

  ProgressLine& line_;
  std::string token_;
  std::thread thread_;
  cairn::Mutex mu_;
  cairn::CondVar cv_;
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  std::atomic<int> snapshots_{0};
};

}  // namespace cairn::tool
