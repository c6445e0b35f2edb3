// The request watchdog: tracks every client request in flight and reports, once, any that has run
// longer than a bound (the `watchdog` config key) — an error in the log naming the request, its
// age and its client, followed by the stack of every thread of the daemon (thread_stacks.hpp) —
// so that a deadlock or a hung device shows itself with the evidence to diagnose it.
//
// Time a request spends in a wait its client asked for does not count: a commit waiting for its
// durability level, `wait` on a ticket, `flush`, `poll_tensor` with a timeout, `rm`/`gc` waiting
// for the flusher, `prefetch --all` waiting for the other members. Such waits depend on the size
// of the model and the speed of the repository, not on a lock; the request's clock restarts when
// the wait ends. Code marks those waits with a ClientWait on the request's thread.
//
// Owns: the table of requests in flight, its lock, and the watchdog thread (none when the bound is
// 0; requests are tracked either way, for stats()).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/sync.hpp"

namespace cairn {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // bound: the age past which a request is reported; 0 = never (no thread).
  explicit Watchdog(std::chrono::milliseconds bound);
  // Stops and joins the thread.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Who sent a request, for the report.
  struct Client {
    uint64_t session = 0;  // the connection's session id (0 before hello)
    int64_t pid = 0;       // the client process (0: unknown, an in-process caller)
  };

  // One request in flight, from construction to destruction, on the thread that serves it.
  class Request {
   public:
    Request(Watchdog& w, std::string op, Client client);
    ~Request();
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

   private:
    Watchdog& w_;
    uint64_t id_;
    Request* outer_;  // a request served inside another on the same thread (none today)
    friend class Watchdog;
  };

  // Marks the current thread's request (if any) as waiting for something its client asked for,
  // for the scope's life; the request's age restarts when the scope ends.
  class ClientWait {
   public:
    ClientWait();
    ~ClientWait();
    ClientWait(const ClientWait&) = delete;
    ClientWait& operator=(const ClientWait&) = delete;

   private:
    Request* request_;
  };

  // {bound_s, in_flight, waiting, oldest_s, stuck_reported, stuck_now}: oldest_s is the age of
  // the oldest request in flight that is not in a client's wait (0 when none).
  nlohmann::json stats() const;
  std::chrono::milliseconds bound() const { return bound_; }
  // Requests reported stuck so far.
  uint64_t reported() const;

 private:
  struct Entry {
    std::string op;
    Client client;
    Clock::time_point start;
    bool waiting = false;
    bool reported = false;
  };
  void loop();
  // Reports every request past the bound not reported yet; returns how many.
  size_t check(Clock::time_point now);

  const std::chrono::milliseconds bound_;
  mutable cairn::Mutex mu_;
  cairn::CondVar cv_;
  std::map<uint64_t, Entry> in_flight_ CAIRN_GUARDED_BY(mu_);
  uint64_t next_id_ CAIRN_GUARDED_BY(mu_) = 1;
  uint64_t reported_ CAIRN_GUARDED_BY(mu_) = 0;
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cairn
