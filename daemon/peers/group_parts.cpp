// Multi-part models across the members of a peer group (group_parts.hpp): the threads, the messages
// handed to the roles, the faults (members that leave, deadlines), exit and status. The roles' steps
// are in group_parts_holder.cpp and group_parts_assembly.cpp (home and registrar).
#include "daemon/peers/group_parts.hpp"

#include <algorithm>
#include <utility>

#include "core/log.hpp"

namespace cairn {

using json = nlohmann::json;

namespace {

// "part 2" / "parts 0, 3"
std::string part_list(const std::vector<uint32_t>& parts) {
  std::string out = parts.size() == 1 ? "part " : "parts ";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + std::to_string(parts[i]);
  return out;
}

// Moves the entries of `map` that `pred` picks to `out`.
template <class Map, class Pred>
void take_if(Map& map, Pred pred, std::vector<std::pair<std::string, typename Map::mapped_type>>& out) {
  for (auto it = map.begin(); it != map.end();) {
    if (!pred(it->second)) {
      ++it;
      continue;
    }
    out.emplace_back(it->first, std::move(it->second));
    it = map.erase(it);
  }
}

}  // namespace

std::string GroupParts::quoted(const std::string& id) { return "model '" + id + "'"; }

Status GroupParts::parts_lost(const std::string& id, const std::vector<uint32_t>& parts, size_t of, std::string why) {
  for (size_t at; (at = why.find("$them")) != std::string::npos;) why.replace(at, 5, parts.size() > 1 ? "them" : "it");
  return unavailable(quoted(id) + " was not created: " + part_list(parts) + " of " + std::to_string(of) +
                     (parts.size() > 1 ? " were" : " was") + " lost: " + why +
                     "; nothing of the model is visible and the other parts were dropped");
}

Status GroupParts::failed_because(const std::string& id, const Status& why) {
  return Status(why.code(), quoted(id) + " was not created: " + why.message());
}

GroupParts::GroupParts(Parts parts, PartTransport& transport) : p_(parts), t_(transport) {
  worker_ = std::thread([this] { worker_loop(); });
  io_ = std::thread([this] {
    cairn::MutexLock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !io_tasks_.empty(); });
      if (stopping_) return;
      auto task = std::move(io_tasks_.front());
      io_tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  });
}

GroupParts::~GroupParts() { stop(); }

void GroupParts::stop() {
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (io_.joinable()) io_.join();
  std::map<uint64_t, std::thread> waiters;
  {
    cairn::MutexLock lock(mu_);
    waiters.swap(waiters_);
  }
  for (auto& [ticket, th] : waiters)
    if (th.joinable()) th.join();
}

void GroupParts::post(std::function<void()> task) {
  {
    cairn::MutexLock lock(mu_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void GroupParts::worker_loop() {
  cairn::MutexLock lock(mu_);
  for (;;) {
    if (stopping_) return;
    if (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      continue;
    }
    auto next = Clock::time_point::max();
    for (const auto& [id, a] : assemblies_) next = std::min(next, a.deadline);
    for (const auto& [id, c] : checking_) next = std::min(next, c.deadline);
    for (const auto& [id, h] : held_)
      if (!h.registered && !h.parts.empty()) next = std::min(next, h.deadline);
    if (next <= Clock::now()) {
      lock.unlock();
      check_deadlines();
      lock.lock();
      continue;
    }
    if (next == Clock::time_point::max())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, next);
  }
}

Status GroupParts::send(const std::string& member, PeerMsg type, json body) {
  if (member == t_.self()) {
    post([this, type, body = std::move(body), member] { handle(type, body, member); });
    return Status::OK();
  }
  Status st = t_.send(member, type, std::move(body));
  if (!st.ok()) CAIRN_LOG_WARN("peers: {} message to {}: {}", peer_msg_name(type), member, st.to_string());
  return st;
}

void GroupParts::send_state(const std::string& member, PartStateMessage m) {
  (void)send(member, PeerMsg::kPartState, encode_part_state(m));
}

void GroupParts::on_message(PeerMsg type, json body, const std::string& member) {
  post([this, type, body = std::move(body), member] { handle(type, body, member); });
}

void GroupParts::handle(PeerMsg type, const json& body, const std::string& from) {
  // Decoded, then handed to its role; a body that does not decode is dropped and logged.
  auto run = [&](auto decode, auto step) {
    auto m = decode(body);
    if (m.ok()) {
      step(std::move(m).value());
      return Status::OK();
    }
    return m.status();
  };
  Status bad;
  switch (type) {
    case PeerMsg::kPart:
      bad = run(decode_part, [&](PartMessage m) { on_part(std::move(m), from); });
      break;
    case PeerMsg::kPartState:
      bad = run(decode_part_state, [&](PartStateMessage m) { on_state(m, from); });
      break;
    case PeerMsg::kAssemble:
      bad = run(decode_assemble, [&](AssembleMessage m) { on_assemble(std::move(m), from, false); });
      break;
    case PeerMsg::kPartAck:
      bad = run(decode_part_ack, [&](PartAckMessage m) { on_ack(m, from); });
      break;
    default:
      return;
  }
  if (bad.ok()) return;
  {
    cairn::MutexLock lock(mu_);
    ++bad_messages_;
  }
  CAIRN_LOG_WARN("peers: member {} sent a message this daemon cannot read (dropped): {}", from, bad.message());
}

// ---- faults ----

void GroupParts::member_gone(const std::string& member) {
  post([this, member] {
    std::vector<std::pair<std::string, Status>> lost;
    std::vector<std::pair<std::string, Assembly>> assemblies;
    std::vector<std::pair<std::string, Checking>> checks;
    {
      cairn::MutexLock lock(mu_);
      for (const auto& [id, h] : held_) {
        if (h.parts.empty()) continue;
        if (!h.registered && (h.home == member || h.registrar == member))
          lost.emplace_back(id, unavailable(quoted(id) + " was not created: member " + member +
                                            ", which was assembling it, left the group; the parts committed here "
                                            "were dropped and nothing of the model is visible"));
        else if (h.registered && h.registrar == member)
          lost.emplace_back(id, unavailable(quoted(id) + " is lost: member " + member +
                                            ", which registered it, left the group before it reached the repository "
                                            "(commit at durability global for a model to survive a member)"));
      }
      // (Only the worker, this thread, changes these two: taken out here, failed below.)
      take_if(
          assemblies_, [&](const Assembly& a) { return a.holders.count(member) > 0; }, assemblies);
      take_if(
          checking_, [&](const Checking& c) { return c.waiting.count(member) > 0; }, checks);
    }
    const std::string why = "member " + member + ", which held $them, left the group";
    for (const auto& [id, c] : checks) {
      std::vector<uint32_t> parts;
      for (uint32_t i = 0; i < c.assembly.part_holders.size(); ++i)
        if (c.assembly.part_holders[i] == member) parts.push_back(i);
      fail_check(id, c, parts_lost(id, parts, c.assembly.part_holders.size(), why));
    }
    for (const auto& [id, error] : lost) fail_held(id, error);
    for (const auto& [id, a] : assemblies) {
      std::vector<uint32_t> parts;
      for (uint32_t i = 0; i < a.of; ++i)
        if (a.parts[i] && a.parts[i]->holder == member) parts.push_back(i);
      fail_assembly(id, a, parts_lost(id, parts, a.of, why));
    }
  });
}

void GroupParts::check_deadlines() {
  const auto now = Clock::now();
  std::vector<std::pair<std::string, Assembly>> expired;
  std::vector<std::pair<std::string, Checking>> unanswered;
  std::vector<std::pair<std::string, std::string>> silent;  // (model, its home)
  {
    cairn::MutexLock lock(mu_);
    take_if(
        assemblies_, [&](const Assembly& a) { return a.deadline <= now; }, expired);
    take_if(
        checking_, [&](const Checking& c) { return c.deadline <= now; }, unanswered);
    for (const auto& [id, h] : held_)
      if (!h.registered && !h.parts.empty() && h.deadline <= now) silent.emplace_back(id, h.home);
  }
  for (const auto& [id, c] : unanswered) {
    std::vector<uint32_t> parts;
    std::string who;
    for (uint32_t i = 0; i < c.assembly.part_holders.size(); ++i)
      if (c.waiting.count(c.assembly.part_holders[i])) parts.push_back(i);
    for (const std::string& m : c.waiting) who += (who.empty() ? "" : ", ") + m;
    fail_check(id, c,
               parts_lost(id, parts, c.assembly.part_holders.size(),
                          "member(s) " + who + " holding $them did not answer in time (left the group?)"));
  }
  for (const auto& [id, a] : expired) {
    std::vector<uint32_t> missing;
    for (uint32_t i = 0; i < a.of; ++i)
      if (!a.parts[i]) missing.push_back(i);
    fail_assembly(id, a,
                  unavailable(quoted(id) + " was not created: " + part_list(missing) + " of " + std::to_string(a.of) +
                              " did not arrive within " + std::to_string(a.timeout_ms) +
                              " ms of the first (a writer or its daemon died, or never committed its part); nothing "
                              "of the model is visible and the parts that came were dropped"));
  }
  for (const auto& [id, home] : silent)
    fail_held(id, unavailable(quoted(id) + " was not created: no word from member " + home +
                              ", its home, in time (it may have left the group); the parts committed here were "
                              "dropped"));
}

// ---- exit, status ----

bool GroupParts::drain_for(std::chrono::milliseconds timeout) {
  cairn::MutexLock lock(mu_);
  return cv_.wait_for(lock, timeout, [&]() CAIRN_REQUIRES(mu_) {
    for (const auto& [id, h] : held_)
      if (!h.parts.empty()) return false;
    return true;
  });
}

json GroupParts::status() const {
  cairn::MutexLock lock(mu_);
  uint64_t parts = 0;
  for (const auto& [id, h] : held_) parts += h.parts.size();
  return json{{"parts_held", parts},
              {"models_held", held_.size()},
              {"assembling", assemblies_.size() + checking_.size()},
              {"registered", registered_.size()},
              {"parts_received", parts_held_},
              {"assembled", assembled_},
              {"failed", failed_},
              {"bad_messages", bad_messages_}};
}

}  // namespace cairn
