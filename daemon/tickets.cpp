#include "daemon/tickets.hpp"

namespace cairn {

uint64_t TicketBook::create(Durability target, bool assembling) {
  cairn::MutexLock lock(mu_);
  uint64_t id = next_++;
  tickets_[id] = Ticket{target, Durability::kMemory, Status::OK(), assembling};
  return id;
}

void TicketBook::reach(uint64_t id, Durability level) {
  {
    cairn::MutexLock lock(mu_);
    auto apply = [&](uint64_t t) CAIRN_REQUIRES(mu_) {
      auto it = tickets_.find(t);
      if (it == tickets_.end()) return;
      it->second.reached = std::max(it->second.reached, level);
      it->second.assembling = false;
    };
    apply(id);
    if (auto f = followers_.find(id); f != followers_.end())
      for (uint64_t t : f->second) apply(t);
  }
  cv_.notify_all();
}

void TicketBook::finish(uint64_t id, Durability level, const Status& error) {
  {
    cairn::MutexLock lock(mu_);
    auto apply = [&](uint64_t t) CAIRN_REQUIRES(mu_) {
      auto it = tickets_.find(t);
      if (it == tickets_.end()) return;
      it->second.reached = level;
      it->second.error = error;
      it->second.assembling = false;
    };
    apply(id);
    if (auto f = followers_.find(id); f != followers_.end()) {
      for (uint64_t t : f->second) apply(t);
      followers_.erase(f);
    }
  }
  cv_.notify_all();
}

void TicketBook::follow(uint64_t leader, std::vector<uint64_t> followers) {
  cairn::MutexLock lock(mu_);
  auto& f = followers_[leader];
  f.insert(f.end(), followers.begin(), followers.end());
}

Result<TicketBook::Outcome> TicketBook::wait(uint64_t id, std::chrono::milliseconds timeout) {
  cairn::MutexLock lock(mu_);
  if (!tickets_.count(id)) return not_found("no ticket " + std::to_string(id) + " (already waited for?)");
  auto done = [&]() CAIRN_REQUIRES(mu_) {
    const Ticket& t = tickets_[id];
    return stopping_ || (!t.assembling && t.reached >= t.target) || !t.error.ok();
  };
  if (timeout.count() < 0)
    cv_.wait(lock, done);
  else
    cv_.wait_for(lock, timeout, done);
  const Ticket t = tickets_[id];
  Outcome out{t.reached, t.target, t.error, (!t.assembling && t.reached >= t.target) || !t.error.ok()};
  if (out.done) tickets_.erase(id);
  return out;
}

void TicketBook::forget(const std::set<uint64_t>& ids) {
  cairn::MutexLock lock(mu_);
  for (uint64_t t : ids) tickets_.erase(t);
}

void TicketBook::stop() {
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

}  // namespace cairn
