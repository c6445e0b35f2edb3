// Tickets: how a caller that committed without waiting later waits for the durability it needs
// (DeepFreeze/VELOC's asynchronous checkpoints). The commit path creates a ticket per commit; the
// flusher reports the levels each model reaches; `wait` (and a commit that waits) blocks on it.
//
// Owns: the ticket table, its lock and condition variable. Never does I/O and never waits for
// anything but its own condition.
//
// Thread-safety: every method may be called from any thread. Lock order: a leaf (nothing is called
// while its lock is held).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/durability.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"

namespace cairn {

class TicketBook {
 public:
  // A new ticket for a commit that asked for `target`; it has reached `memory`. A part of a
  // multi-part model has reached nothing yet (`assembling`): its first reach or finish says so.
  uint64_t create(Durability target, bool assembling = false);
  // The model reached at least `level` (levels only rise).
  void reach(uint64_t id, Durability level);
  // The flusher is done with the model: it reached `level` (global, or memory when error is set).
  void finish(uint64_t id, Durability level, const Status& error);

  struct Outcome {
    Durability reached = Durability::kMemory;
    Durability target = Durability::kMemory;
    Status error;
    bool done = false;  // reached >= target, or an error
  };
  // Waits until the ticket is done, or timeout passes (negative: forever), or stop() was called.
  // A done ticket is consumed. kNotFound for an unknown (or consumed) ticket.
  Result<Outcome> wait(uint64_t id, std::chrono::milliseconds timeout);
  // The tickets of a multi-part model's parts follow the ticket the model was registered with:
  // every level `leader` reaches and its finish apply to them too (also after the leader itself was
  // waited for or forgotten).
  void follow(uint64_t leader, std::vector<uint64_t> followers);
  // Forgets tickets (their connection ended before waiting for them).
  void forget(const std::set<uint64_t>& ids);
  // Wakes every waiter for good (the daemon is stopping).
  void stop();

 private:
  struct Ticket {
    Durability target = Durability::kGlobal;
    Durability reached = Durability::kMemory;
    Status error;
    bool assembling = false;  // a part: not even memory until the model is registered
  };
  cairn::Mutex mu_;
  cairn::CondVar cv_;
  std::unordered_map<uint64_t, Ticket> tickets_ CAIRN_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::vector<uint64_t>> followers_ CAIRN_GUARDED_BY(mu_);  // leader -> part tickets
  uint64_t next_ CAIRN_GUARDED_BY(mu_) = 1;
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
};

}  // namespace cairn
