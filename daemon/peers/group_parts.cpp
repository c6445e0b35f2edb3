// Multi-part models across the members of a peer group (group_parts.hpp).
#include "daemon/peers/group_parts.hpp"

#include <algorithm>
#include <utility>

#include "core/log.hpp"
#include "daemon/commit_path.hpp"
#include "daemon/flusher.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

using json = nlohmann::json;

namespace {

std::string quoted(const std::string& id) { return "model '" + id + "'"; }

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

// "model 'X' was not created: parts 1, 2 of 4 were lost: <why>; nothing of the model is visible ..."
// ("$them" in why: "it" or "them").
Status parts_lost(const std::string& id, const std::vector<uint32_t>& parts, size_t of, std::string why) {
  for (size_t at; (at = why.find("$them")) != std::string::npos;) why.replace(at, 5, parts.size() > 1 ? "them" : "it");
  return unavailable(quoted(id) + " was not created: " + part_list(parts) + " of " + std::to_string(of) +
                     (parts.size() > 1 ? " were" : " was") + " lost: " + why +
                     "; nothing of the model is visible and the other parts were dropped");
}

Status failed_because(const std::string& id, const Status& why) {
  return Status(why.code(), quoted(id) + " was not created: " + why.message());
}

}  // namespace

GroupParts::GroupParts(Parts parts, Transport transport) : p_(parts), t_(std::move(transport)) {
  worker_ = std::thread([this] { worker_loop(); });
  io_ = std::thread([this] {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !io_tasks_.empty(); });
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
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (io_.joinable()) io_.join();
  std::map<uint64_t, std::thread> waiters;
  {
    std::lock_guard lock(mu_);
    waiters.swap(waiters_);
  }
  for (auto& [ticket, th] : waiters)
    if (th.joinable()) th.join();
}

void GroupParts::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void GroupParts::worker_loop() {
  std::unique_lock lock(mu_);
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
    if (next == Clock::time_point::max()) cv_.wait(lock);
    else cv_.wait_until(lock, next);
  }
}

Status GroupParts::send(const std::string& member, PeerMsg type, json body) {
  if (member == t_.self()) {
    post([this, type, body = std::move(body), member] { handle(type, body, member); });
    return Status::ok();
  }
  Status st = t_.send(member, type, std::move(body));
  if (!st.is_ok()) CAIRN_LOG_WARN("peers: {} message to {}: {}", peer_msg_name(type), member, st.to_string());
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
    if (m.is_ok()) {
      step(std::move(m).value());
      return Status::ok();
    }
    return m.status();
  };
  Status bad;
  switch (type) {
    case PeerMsg::kPart: bad = run(decode_part, [&](PartMessage m) { on_part(std::move(m), from); }); break;
    case PeerMsg::kPartState: bad = run(decode_part_state, [&](PartStateMessage m) { on_state(m, from); }); break;
    case PeerMsg::kAssemble:
      bad = run(decode_assemble, [&](AssembleMessage m) { on_assemble(std::move(m), from, false); });
      break;
    case PeerMsg::kPartAck: bad = run(decode_part_ack, [&](PartAckMessage m) { on_ack(m, from); }); break;
    default: return;
  }
  if (bad.is_ok()) return;
  {
    std::lock_guard lock(mu_);
    ++bad_messages_;
  }
  CAIRN_LOG_WARN("peers: member {} sent a message this daemon cannot read (dropped): {}", from, bad.message());
}

// ---- holder: a writer's part arrives here ----

Status GroupParts::reserve_part(const std::string& id, uint32_t index, uint32_t of) {
  std::lock_guard lock(mu_);
  Held& h = held_[id];
  if (h.registered) {
    return already_exists(quoted(id) + " already exists: its parts were assembled (model ids are immutable; choose a "
                                       "new id)");
  }
  if (h.parts.count(index) || h.placing.count(index))
    return invalid_argument(quoted(id) + ", part " + std::to_string(index) + " of " + std::to_string(of) +
                            " was committed twice");
  h.placing.insert(index);
  return Status::ok();
}

void GroupParts::unreserve_part(const std::string& id, uint32_t index) {
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return;
    it->second.placing.erase(index);
    if (it->second.placing.empty() && it->second.parts.empty()) held_.erase(it);
  }
  cv_.notify_all();
}

void GroupParts::hold(PartMessage part, uint64_t ticket, std::vector<ChunkRef> pinned) {
  const std::string id = part.part.id;
  const uint32_t index = part.index;
  const std::string home_now = t_.home(id);
  // A part may reach the home up to its timeout after the first; then messages and the
  // registration: past this, the home or the registrar is presumed gone.
  const auto deadline = Clock::now() + std::chrono::milliseconds(part.timeout_ms) + 2 * p_.peer_timeout +
                        std::chrono::seconds(2);
  std::string home;
  {
    std::lock_guard lock(mu_);
    Held& h = held_[id];
    if (h.home.empty()) h.home = home_now;
    home = h.home;
    h.placing.erase(index);
    h.parts[index] = HeldPart{ticket, part.durability, std::move(pinned)};
    h.deadline = std::max(h.deadline, deadline);
    ++parts_held_;
  }
  post([this, id, index, home, body = encode_part(part)]() mutable {
    Status st = send(home, PeerMsg::kPart, std::move(body));
    if (!st.is_ok()) fail_held(id, failed_because(id, st.with_context("sending part " + std::to_string(index) +
                                                                      " to member " + home + ", its home")),
                               {index});
  });
  cv_.notify_all();
}

// ---- home: the parts are collected ----

void GroupParts::on_part(PartMessage m, const std::string& from) {
  const std::string id = m.part.id;
  const std::string name = quoted(id) + ", part " + std::to_string(m.index) + " of " + std::to_string(m.of);
  auto reject = [&](const Status& st) {
    send_state(from, PartStateMessage{id, PartPhase::kFailed, "", DurabilityLevel::kMemory, {m.index}, st});
  };
  auto it = assemblies_.find(id);
  if (it != assemblies_.end()) {
    const Assembly& a = it->second;
    if (a.of != m.of)
      return reject(invalid_argument(name + ": an earlier part said the model has " + std::to_string(a.of) + " parts"));
    if (a.parent != m.part.parent)
      return reject(invalid_argument(name + ": parent '" + m.part.parent + "' differs from the earlier parts' '" +
                                     a.parent + "'"));
    if (a.parts[m.index]) return reject(invalid_argument(name + " was committed twice"));
  } else {
    // The first part here: the id is reserved for the job (the shared repository's claim), and the
    // first part's timeout counts.
    Status reserved = p_.commits.reserve_assembly(id, m.part.parent);
    if (!reserved.is_ok()) return reject(reserved);
    Assembly a;
    a.parent = m.part.parent;
    a.of = m.of;
    a.timeout_ms = m.timeout_ms;
    a.deadline = Clock::now() + std::chrono::milliseconds(m.timeout_ms);
    a.parts.resize(m.of);
    std::lock_guard lock(mu_);
    it = assemblies_.emplace(id, std::move(a)).first;
  }
  Fragment f{from, m.part.tensors, m.durability, 0};
  for (const TensorManifest& t : f.tensors) f.bytes += t.nbytes;
  bool complete_now = false;
  {
    std::lock_guard lock(mu_);
    Assembly& a = it->second;
    a.parts[m.index] = std::move(f);
    a.holders.insert(from);
    if (m.part.metadata.is_object()) a.metadata.update(m.part.metadata);
    if (!m.part.architecture.is_null() && a.architecture.is_null()) a.architecture = m.part.architecture;
    complete_now = ++a.arrived == a.of;
  }
  if (!complete_now) return;
  Assembly a;
  {
    std::lock_guard lock(mu_);
    a = std::move(it->second);
    assemblies_.erase(it);
  }
  complete(id, std::move(a));
}

void GroupParts::complete(const std::string& id, Assembly a) {
  // One manifest: the parts' tensors in part order, no name twice.
  ModelManifest model;
  model.id = id;
  model.parent = a.parent;
  model.metadata = a.metadata;
  model.architecture = a.architecture;
  std::vector<TensorManifest> tensors;
  std::map<std::string, uint32_t> seen;
  DurabilityLevel target = DurabilityLevel::kGlobal;
  std::map<std::string, uint64_t> bytes;  // per holder
  std::vector<std::string> part_holders;
  for (uint32_t i = 0; i < a.of; ++i) {
    const Fragment& f = *a.parts[i];
    target = std::min(target, f.durability);
    bytes[f.holder] += f.bytes;
    part_holders.push_back(f.holder);
    for (const TensorManifest& t : f.tensors) {
      if (auto [at, fresh] = seen.emplace(t.name, i); !fresh)
        return fail_assembly(id, a,
                             invalid_argument(quoted(id) + " was not created: tensor '" + t.name + "' is in parts " +
                                              std::to_string(at->second) + " and " + std::to_string(i)));
      tensors.push_back(t);
    }
  }
  model.tensors = std::move(tensors);
  // The registrar: the holder of the most bytes (ties: this member, then the smallest id), so the
  // fewest bytes move when the model is written to the repository.
  const std::string self = t_.self();
  std::string registrar;
  uint64_t most = 0;
  for (const auto& [holder, n] : bytes)
    if (registrar.empty() || n > most || (n == most && holder == self)) registrar = holder, most = n;
  AssembleMessage am{std::move(model), target, std::move(part_holders)};
  if (registrar != self) {
    // It claims the id for itself; the claim goes back first (one live writer holds a claim).
    p_.commits.release_assembly(id);
    Status sent = send(registrar, PeerMsg::kAssemble, encode_assemble(am));
    if (sent.is_ok()) {
      CAIRN_LOG_INFO("peers: {}: its {} parts are in; member {}, which holds the most of its bytes, registers it",
                     quoted(id), a.of, registrar);
      for (const std::string& h : am.holders())
        if (h != registrar)
          send_state(h, PartStateMessage{id, PartPhase::kDelegated, registrar, DurabilityLevel::kMemory, {}, {}});
      return;
    }
    // Too large for one message, or the registrar just left: registered here instead.
    CAIRN_LOG_WARN("peers: {} is registered by its home instead of member {}: {}", quoted(id), registrar,
                   sent.to_string());
    return on_assemble(std::move(am), self, false);
  }
  on_assemble(std::move(am), self, true);
}

void GroupParts::fail_assembly(const std::string& id, const Assembly& a, const Status& error) {
  CAIRN_LOG_WARN("peers: {}", error.message());
  for (const std::string& h : a.holders)
    send_state(h, PartStateMessage{id, PartPhase::kFailed, "", DurabilityLevel::kMemory, {}, error});
  p_.commits.release_assembly(id);
  std::lock_guard lock(mu_);
  ++failed_;
}

// ---- registrar: the model is registered, and followed to the repository ----

void GroupParts::on_assemble(AssembleMessage m, const std::string& from, bool reserved) {
  const std::string id = m.model.id;
  Checking c{std::move(m), from, {}, Clock::now() + p_.peer_timeout};
  if (!reserved) {
    Status r = p_.commits.reserve_assembly(id, c.assembly.model.parent);
    if (!r.is_ok()) {
      // Not reserved here: nothing to give back.
      CAIRN_LOG_WARN("peers: {} (sent by its home, member {})", r.message(), from);
      for (const std::string& h : c.assembly.holders())
        send_state(h, PartStateMessage{id, PartPhase::kFailed, "", DurabilityLevel::kMemory, {}, r});
      std::lock_guard lock(mu_);
      ++failed_;
      return;
    }
  }
  // Does every holder still hold its parts? One that died while the others arrived, before the
  // group noticed, fails the model here, before anything of it is visible.
  const std::string self = t_.self();
  for (const std::string& h : c.assembly.holders()) {
    if (h != self) {
      c.waiting.insert(h);
      continue;
    }
    bool held = false;
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(id);
      held = it != held_.end() && !it->second.parts.empty();
    }
    if (!held)
      return fail_check(id, c, unavailable(quoted(id) + " was not created: the parts committed here were dropped "
                                                          "meanwhile"));
  }
  if (c.waiting.empty()) return register_model(std::move(c));
  const std::set<std::string> ask = c.waiting;
  {
    std::lock_guard lock(mu_);
    checking_[id] = std::move(c);
  }
  for (const std::string& h : ask)
    send_state(h, PartStateMessage{id, PartPhase::kCheck, "", DurabilityLevel::kMemory, {}, {}});
}

void GroupParts::fail_check(const std::string& id, const Checking& c, const Status& error) {
  CAIRN_LOG_WARN("peers: {}", error.message());
  for (const std::string& h : c.assembly.holders())
    send_state(h, PartStateMessage{id, PartPhase::kFailed, "", DurabilityLevel::kMemory, {}, error});
  p_.commits.release_assembly(id);
  std::lock_guard lock(mu_);
  ++failed_;
}

void GroupParts::register_model(Checking c) {
  const AssembleMessage& m = c.assembly;
  const std::string id = m.model.id;
  const std::vector<std::string> holders = m.holders();
  const uint64_t ticket = p_.tickets.create(DurabilityLevel::kGlobal);
  Status registered = p_.commits.register_assembled(m.model, ticket);
  p_.commits.release_assembly(id);  // the flusher holds the id from here on (or it is free again)
  if (!registered.is_ok()) {
    const Status error = failed_because(id, registered);
    CAIRN_LOG_WARN("peers: {}", error.message());
    for (const std::string& h : holders)
      send_state(h, PartStateMessage{id, PartPhase::kFailed, "", DurabilityLevel::kMemory, {}, error});
    std::lock_guard lock(mu_);
    ++failed_;
    return;
  }
  CAIRN_LOG_INFO("peers: {} assembled from {} parts on {} member(s), {} tensors", quoted(id), m.part_holders.size(),
                 holders.size(), m.model.tensors.size());
  {
    std::lock_guard lock(mu_);
    registered_[id] = Registered{ticket, holders, {}, false, false, m.durability};
    ++assembled_;
    // Waits for the model to reach the repository (or fail), then tells the worker.
    waiters_[ticket] = std::thread([this, id, ticket] {
      auto out = p_.tickets.wait(ticket, std::chrono::milliseconds(-1));
      TicketBook::Outcome o;
      if (out.is_ok()) o = *out;
      post([this, id, o] { on_flushed(id, o); });
    });
  }
  for (const std::string& h : holders)
    send_state(h, PartStateMessage{id, PartPhase::kMemory, "", m.durability, {}, {}});
}

void GroupParts::on_flushed(const std::string& id, TicketBook::Outcome o) {
  Registered r;
  std::thread waiter;
  {
    std::lock_guard lock(mu_);
    auto it = registered_.find(id);
    if (it == registered_.end()) return;
    r = std::move(it->second);
    registered_.erase(it);
    auto w = waiters_.find(r.ticket);
    if (w != waiters_.end()) {
      waiter = std::move(w->second);
      waiters_.erase(w);
    }
  }
  if (waiter.joinable()) waiter.join();  // it posted this and returned
  if (!o.done) return;                   // the daemon is stopping
  PartStateMessage m{id, PartPhase::kGlobal, "", DurabilityLevel::kMemory, {}, {}};
  if (o.error.is_ok()) {
    for (const std::string& h : r.holders) send_state(h, m);
    return;
  }
  // Gone here (the flusher dropped it): the holders' tickets fail, and every member drops it
  // from its view of the job's catalog (it was announced).
  m.phase = PartPhase::kFailed;
  m.error = Status(o.error.code(), quoted(id) + " is lost: it could not be written to the repository: " +
                                       o.error.message());
  std::set<std::string> to(r.holders.begin(), r.holders.end());
  for (const std::string& member : t_.members()) to.insert(member);
  for (const std::string& member : to) send_state(member, m);
}

void GroupParts::on_ack(const PartAckMessage& m, const std::string& from) {
  if (m.what == AckOf::kHeld) {
    auto it = checking_.find(m.model);
    if (it == checking_.end() || !it->second.waiting.count(from)) return;
    Checking c;
    {
      std::lock_guard lock(mu_);
      if (m.ok) {
        it->second.waiting.erase(from);
        if (!it->second.waiting.empty()) return;
      }
      c = std::move(it->second);
      checking_.erase(it);
    }
    if (!m.ok) {
      std::vector<uint32_t> parts;
      for (uint32_t i = 0; i < c.assembly.part_holders.size(); ++i)
        if (c.assembly.part_holders[i] == from) parts.push_back(i);
      return fail_check(m.model, c,
                        parts_lost(m.model, parts, c.assembly.part_holders.size(),
                                   "member " + from + ", which held $them, dropped $them meanwhile"));
    }
    return register_model(std::move(c));
  }
  auto it = registered_.find(m.model);
  if (it == registered_.end()) return;
  Registered& r = it->second;
  if (std::find(r.holders.begin(), r.holders.end(), from) == r.holders.end()) return;
  {
    std::lock_guard lock(mu_);
    if (m.ok) r.local_done.insert(from);
    else r.local_failed = true;
    if (r.local_failed || r.local_reported || r.local_done.size() != r.holders.size()) return;
    r.local_reported = true;
  }
  // Every part is on its own holder's burst buffer.
  for (const std::string& h : r.holders)
    send_state(h, PartStateMessage{m.model, PartPhase::kLocal, "", DurabilityLevel::kMemory, {}, {}});
}

// ---- holder: what the home and the registrar report ----

void GroupParts::on_state(const PartStateMessage& m, const std::string& from) {
  if (m.phase == PartPhase::kFailed) {
    // A model the sender registered and announced is gone from the job's catalog (harmless when
    // it never was: only an entry of that member is dropped).
    if (m.parts.empty() && p_.drop_remote) p_.drop_remote(m.model, from);
    return fail_held(m.model, m.error, m.parts);
  }
  if (m.phase == PartPhase::kCheck) {
    bool held = false;
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(m.model);
      held = it != held_.end() && !it->second.parts.empty() && !it->second.registered;
    }
    (void)send(from, PeerMsg::kPartAck, encode_part_ack(PartAckMessage{m.model, AckOf::kHeld, held}));
    return;
  }
  std::vector<HeldPart> parts;
  std::vector<ChunkRef> chunks;
  bool write = false;
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(m.model);
    if (it == held_.end()) return;
    Held& h = it->second;
    switch (m.phase) {
      case PartPhase::kDelegated:
        if (!h.registered) h.registrar = m.registrar;
        return;
      case PartPhase::kMemory:
        if (h.registered) return;
        h.registered = true;
        h.registrar = from;
        h.target = m.target;
        write = m.target < DurabilityLevel::kGlobal;
        for (const auto& [i, p] : h.parts) {
          parts.push_back(p);
          chunks.insert(chunks.end(), p.chunks.begin(), p.chunks.end());
        }
        break;
      case PartPhase::kLocal:
        for (const auto& [i, p] : h.parts) parts.push_back(p);
        break;
      case PartPhase::kGlobal:
        for (auto& [i, p] : h.parts) parts.push_back(std::move(p));
        held_.erase(it);
        break;
      default: return;
    }
  }
  switch (m.phase) {
    case PartPhase::kMemory:
      // Visible in the group (the registrar announced it before this message).
      for (const HeldPart& p : parts) p_.tickets.reach(p.ticket, DurabilityLevel::kMemory);
      if (write && p_.burst_buffer) {
        {
          std::lock_guard lock(mu_);
          io_tasks_.push_back([this, id = m.model, chunks = std::move(chunks), from] { write_local(id, chunks, from); });
        }
        cv_.notify_all();
      } else if (write) {
        (void)send(from, PeerMsg::kPartAck, encode_part_ack(PartAckMessage{m.model, AckOf::kLocal, false}));
      }
      break;
    case PartPhase::kLocal:
      for (const HeldPart& p : parts) p_.tickets.reach(p.ticket, DurabilityLevel::kLocal);
      break;
    case PartPhase::kGlobal:
      for (const HeldPart& p : parts) {
        p_.tickets.finish(p.ticket, DurabilityLevel::kGlobal, Status::ok());
        release_chunks(p.chunks, true);
      }
      cv_.notify_all();
      break;
    default: break;
  }
}

void GroupParts::write_local(const std::string& id, std::vector<ChunkRef> chunks, const std::string& registrar) {
  Status st = p_.tiers.write_local(chunks);
  if (!st.is_ok())
    CAIRN_LOG_WARN("peers: the parts of {} held here did not go to the burst buffer: {}", quoted(id), st.to_string());
  (void)send(registrar, PeerMsg::kPartAck, encode_part_ack(PartAckMessage{id, AckOf::kLocal, st.is_ok()}));
}

void GroupParts::fail_held(const std::string& id, const Status& error, const std::vector<uint32_t>& which) {
  std::vector<HeldPart> gone;
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return;
    Held& h = it->second;
    if (which.empty()) {
      for (auto& [i, p] : h.parts) gone.push_back(std::move(p));
      h.parts.clear();
    } else {
      for (uint32_t i : which)
        if (auto p = h.parts.find(i); p != h.parts.end()) {
          gone.push_back(std::move(p->second));
          h.parts.erase(p);
        }
    }
    if (h.parts.empty() && h.placing.empty()) held_.erase(it);
  }
  if (!gone.empty()) CAIRN_LOG_WARN("peers: {}", error.message());
  for (const HeldPart& p : gone) {
    p_.tickets.finish(p.ticket, DurabilityLevel::kMemory, error);
    release_chunks(p.chunks, false);
  }
  cv_.notify_all();
}

void GroupParts::release_chunks(const std::vector<ChunkRef>& chunks, bool stored) {
  if (stored) {
    p_.tiers.stored_globally(chunks);
  } else {
    // Those a pending model or another held part still needs stay as they are (dirty).
    std::set<ChunkHash> needed;
    for (const auto& m : p_.flusher.pending())
      for (const auto& t : m->tensors)
        for (const auto& c : t.chunks) needed.insert(c.hash);
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, h] : held_)
        for (const auto& [i, p] : h.parts)
          for (const auto& c : p.chunks) needed.insert(c.hash);
    }
    std::vector<ChunkRef> unneeded;
    for (const ChunkRef& c : chunks)
      if (!needed.count(c.hash)) unneeded.push_back(c);
    p_.tiers.abandon(unneeded);
  }
  for (const ChunkRef& c : chunks) p_.dram.unpin(c.hash);
}

// ---- faults ----

void GroupParts::member_gone(const std::string& member) {
  post([this, member] {
    std::vector<std::pair<std::string, Status>> lost;
    std::vector<std::pair<std::string, Assembly>> assemblies;
    std::vector<std::pair<std::string, Checking>> checks;
    {
      std::lock_guard lock(mu_);
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
      take_if(assemblies_, [&](const Assembly& a) { return a.holders.count(member) > 0; }, assemblies);
      take_if(checking_, [&](const Checking& c) { return c.waiting.count(member) > 0; }, checks);
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
    std::lock_guard lock(mu_);
    take_if(assemblies_, [&](const Assembly& a) { return a.deadline <= now; }, expired);
    take_if(checking_, [&](const Checking& c) { return c.deadline <= now; }, unanswered);
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
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    for (const auto& [id, h] : held_)
      if (!h.parts.empty()) return false;
    return true;
  });
}

json GroupParts::status() const {
  std::lock_guard lock(mu_);
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
