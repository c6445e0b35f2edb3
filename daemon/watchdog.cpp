#include "daemon/watchdog.hpp"

#include <algorithm>
#include <vector>

#include "core/log.hpp"
#include "daemon/thread_stacks.hpp"

namespace cairn {

namespace {
thread_local Watchdog::Request* tl_request = nullptr;

double seconds(Watchdog::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Watchdog::Watchdog(std::chrono::milliseconds bound) : bound_(bound) {
  if (bound_.count() > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Watchdog::Request::Request(Watchdog& w, std::string op, Client client) : w_(w), outer_(tl_request) {
  cairn::MutexLock lock(w_.mu_);
  id_ = w_.next_id_++;
  w_.in_flight_.emplace(id_, Entry{std::move(op), client, Clock::now()});
  tl_request = this;
}

Watchdog::Request::~Request() {
  tl_request = outer_;
  cairn::MutexLock lock(w_.mu_);
  w_.in_flight_.erase(id_);
}

Watchdog::ClientWait::ClientWait() : request_(tl_request) {
  if (request_ == nullptr) return;
  cairn::MutexLock lock(request_->w_.mu_);
  auto it = request_->w_.in_flight_.find(request_->id_);
  if (it != request_->w_.in_flight_.end()) it->second.waiting = true;
}

Watchdog::ClientWait::~ClientWait() {
  if (request_ == nullptr) return;
  cairn::MutexLock lock(request_->w_.mu_);
  auto it = request_->w_.in_flight_.find(request_->id_);
  if (it == request_->w_.in_flight_.end()) return;
  it->second.waiting = false;
  it->second.start = Clock::now();
}

nlohmann::json Watchdog::stats() const {
  const auto now = Clock::now();
  cairn::MutexLock lock(mu_);
  uint64_t waiting = 0, stuck = 0;
  Clock::duration oldest{0};
  for (const auto& [id, e] : in_flight_) {
    if (e.waiting) {
      ++waiting;
      continue;
    }
    if (e.reported) ++stuck;
    oldest = std::max(oldest, now - e.start);
  }
  return {{"bound_s", seconds(bound_)},  {"in_flight", in_flight_.size()}, {"waiting", waiting},
          {"oldest_s", seconds(oldest)}, {"stuck_reported", reported_},    {"stuck_now", stuck}};
}

uint64_t Watchdog::reported() const {
  cairn::MutexLock lock(mu_);
  return reported_;
}

void Watchdog::loop() {
  // Often enough that a request is reported within a quarter of the bound past it.
  const auto tick =
      std::clamp<std::chrono::milliseconds>(bound_ / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  cairn::MutexLock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, tick, [&]() CAIRN_REQUIRES(mu_) { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    (void)check(Clock::now());
    lock.lock();
  }
}

size_t Watchdog::check(Clock::time_point now) {
  std::vector<std::string> stuck;
  {
    cairn::MutexLock lock(mu_);
    for (auto& [id, e] : in_flight_) {
      if (e.waiting || e.reported || now - e.start <= bound_) continue;
      e.reported = true;
      ++reported_;
      stuck.push_back(
          fmt::format("request '{}' of session {} (client pid {}) has been running for {:.2f} s, past "
                      "the watchdog bound of {:.2f} s",
                      e.op, e.client.session, e.client.pid, seconds(now - e.start), seconds(bound_)));
    }
  }
  if (stuck.empty()) return 0;
  std::string what;
  for (const auto& s : stuck) what += "watchdog: " + s + "\n";
  // One message (and one dump) for every request found stuck at this tick.
  CAIRN_LOG_ERROR("{}watchdog: the stacks of every thread of cairnd follow\n{}", what, dump_thread_stacks());
  return stuck.size();
}

}  // namespace cairn
