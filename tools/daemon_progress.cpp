#include "tools/daemon_progress.hpp"

#include <unistd.h>

#include <chrono>
#include <random>

#include "core/progress.hpp"
#include "tools/public_client.hpp"

namespace cairn::tool {

DaemonProgress::DaemonProgress(ProgressLine& line) : line_(line) {
  std::random_device rd;
  token_ = "cairn-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + std::to_string(rd());
}

void DaemonProgress::add_token(nlohmann::json& request) const {
  if (line_.enabled()) request["progress"] = token_;
}

std::string DaemonProgress::token() const { return line_.enabled() ? token_ : std::string(); }

void DaemonProgress::start() {
  if (!line_.enabled() || thread_.joinable()) return;
  thread_ = std::thread([this] { poll(); });
}

void DaemonProgress::stop() {
  if (!thread_.joinable()) return;
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DaemonProgress::poll() {
  auto client = connect();
  if (!client.ok()) return;  // the request itself reports a daemon that is not there
  const nlohmann::json ask{{"op", "progress"}, {"id", token_}};
  cairn::MutexLock lock(mu_);
  for (;;) {
    if (cv_.wait_for(lock, std::chrono::milliseconds(100), [&]() CAIRN_REQUIRES(mu_) { return stopping_; })) return;
    lock.unlock();
    auto r = request(*client, ask);
    lock.lock();
    if (!r.ok()) {
      // Not running (yet, or any more): ask again. Anything else (an older daemon): stop asking.
      if (r.status().code() == StatusCode::kNotFound) continue;
      return;
    }
    auto it = r->find("progress");
    if (it == r->end()) return;
    auto snap = progress_from_json(*it);
    if (!snap.ok()) return;
    line_.update(*snap);
    ++snapshots_;
  }
}

}  // namespace cairn::tool
