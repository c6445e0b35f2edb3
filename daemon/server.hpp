// The local server: a Unix-domain socket in front of an Engine.
//
// One thread accepts; each connection gets a thread that reads a request frame, lets the engine
// handle it, and writes the response. Only processes of the daemon's own uid may connect (checked
// with SO_PEERCRED). One daemon per socket: a lock file beside the socket (flock) is held for the
// daemon's lifetime, so a second daemon fails at once with a message naming the first one's pid.
//
// A connection's thread notices that its client is gone when it reads the next request, so a client
// killed while a request of its waits (gc behind another daemon's, rm or wait for a flush, flush,
// fsck, sync, prefetch) would keep its leases pinned until that request returns. While such a
// request runs, a hang-up watcher (one thread, epoll on those connections) releases the session's
// leases as soon as the client hangs up; those requests never touch the leases.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/engine.hpp"

namespace cairn {

// The socket path for a config: its `socket` key if set, else wire::default_socket_path().
std::string socket_path_for(const Config& config);

class Server {
 public:
  // Takes the lock file, creates the socket's directory (mode 0700 when cairn creates it; an
  // existing directory must belong to this uid and not be writable by others) and listens.
  static Result<std::unique_ptr<Server>> start(Engine& engine, const std::string& socket_path);
  // Stops (if running) and removes the socket and lock file.
  ~Server();

  // Stops accepting, lets each connection finish the request it is serving, closes them all and
  // joins the threads. Idempotent.
  void stop();
  const std::string& path() const { return path_; }

 private:
  Server(Engine& engine, std::string path, int listen_fd, int lock_fd);
  void accept_loop();
  void serve(int fd, uint64_t conn_id, pid_t client_pid);
  // The hang-up watcher: begin_wait before a request that may wait and never touches the session's
  // leases, end_wait after it; hangup_loop releases the leases of a client that hangs up between.
  bool begin_wait(int fd, uint64_t conn_id, Session& session);
  void end_wait(int fd, uint64_t conn_id);
  void hangup_loop();
  void stop_hangups();

  Engine& engine_;
  const std::string path_;
  int listen_fd_;
  int lock_fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  mutable cairn::Mutex mu_;
  std::map<uint64_t, int> conns_ CAIRN_GUARDED_BY(mu_);  // id -> fd
  std::map<uint64_t, std::thread> threads_ CAIRN_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ CAIRN_GUARDED_BY(mu_);  // threads to join
  uint64_t next_conn_ = 1;
  int epoll_fd_ = -1;  // the hang-up watcher's; -1: none (then leases wait)
  int wake_fd_ = -1;   // eventfd: the watcher stops
  std::thread hangups_;
  std::map<uint64_t, Session*> waiting_ CAIRN_GUARDED_BY(mu_);  // connections in a waiting request
  bool hangups_stopped_ CAIRN_GUARDED_BY(mu_) = false;
};

}  // namespace cairn
