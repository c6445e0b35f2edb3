// The near-data compute worker's supervisor (docs/near.md). With `compute.enabled`, the first
// `compute` request starts one worker per daemon: a Python process (`python -m cairn.near_worker`)
// that is a client of this daemon (it maps the arena and reads models and dataset shards like any
// other client), runs a stored model's frozen prefix on dataset shards and hands back activations.
// The reply tells the client where the worker listens (a Unix socket beside the daemon's, and a TCP
// address when `compute.listen` is set, for trainers on other nodes). A worker that has died is
// started again by the next request; the daemon stops it when it stops.
//
// Owns: the worker's pid, its addresses and the pipe it reports readiness on. Never touches the
// arena, models or chunks: the worker does that through the client API.
//
// Thread-safety: every method may be called from any thread. start_mu_ serialises starts (a start
// holds it while the worker imports torch, so concurrent first requests wait for the same worker);
// mu_ guards the state and is never held while waiting, because the starting worker's own
// requests (it is a client of this daemon, and `stats` reports on it) must not wait for the start.
// Lock order: start_mu_, then mu_.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.hpp"
#include "core/status.hpp"

namespace cairn {

class ComputeWorker {
 public:
  // daemon_socket: the socket the worker connects to as a client.
  ComputeWorker(const Config& config, std::string daemon_socket);
  ~ComputeWorker();  // stop()
  ComputeWorker(const ComputeWorker&) = delete;
  ComputeWorker& operator=(const ComputeWorker&) = delete;

  // The `compute` request: starts the worker if it is not running and returns
  // {"socket", "listen", "pid", "started", "starts"}. FAILED with a message naming the config key
  // when compute is off, the interpreter's error when it cannot start.
  Result<nlohmann::json> attach();
  // {"enabled", "running", "pid", "socket", "listen", "starts", "last_error"} for `cairn stats`.
  nlohmann::json status();
  // Stops the worker (SIGTERM, then SIGKILL after 3 s) and reaps it.
  void stop();

 private:
  // REQUIRES: mu_ held.
  bool alive_locked();
  // REQUIRES: start_mu_ held, mu_ not held.
  Status start();
  std::string python() const;
  std::string package_dir() const;

  bool enabled_;
  std::string python_config_;
  std::string listen_config_;
  uint64_t memory_;
  uint64_t cache_;
  std::chrono::milliseconds start_timeout_;
  std::string daemon_socket_;
  std::string socket_;  // the worker's Unix socket: <daemon socket>.compute

  std::mutex start_mu_;
  std::mutex mu_;
  pid_t pid_ = -1;
  std::string listen_;  // the TCP address the worker reported ("" = none)
  uint64_t starts_ = 0;
  std::string last_error_;
};

}  // namespace cairn
