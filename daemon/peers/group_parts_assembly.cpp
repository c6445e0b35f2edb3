// Multi-part models across a peer group (group_parts.hpp): the home, which collects the parts and
// builds the one manifest, and the registrar, which checks the holders, registers the model and
// follows it to the repository.
#include <algorithm>
#include <utility>

#include "core/log.hpp"
#include "daemon/commit_path.hpp"
#include "daemon/peers/group_parts.hpp"

namespace cairn {

using json = nlohmann::json;

// ---- home: the parts are collected ----

void GroupParts::on_part(PartMessage m, const std::string& from) {
  const std::string id = m.part.id;
  const std::string name = quoted(id) + ", part " + std::to_string(m.index) + " of " + std::to_string(m.of);
  auto reject = [&](const Status& st) {
    send_state(from, PartStateMessage{id, PartPhase::kFailed, "", Durability::kMemory, {m.index}, st});
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
    if (!reserved.ok()) return reject(reserved);
    Assembly a;
    a.parent = m.part.parent;
    a.of = m.of;
    a.timeout_ms = m.timeout_ms;
    a.deadline = Clock::now() + std::chrono::milliseconds(m.timeout_ms);
    a.parts.resize(m.of);
    cairn::MutexLock lock(mu_);
    it = assemblies_.emplace(id, std::move(a)).first;
  }
  Fragment f{from, m.part.tensors, m.durability, 0};
  for (const TensorManifest& t : f.tensors) f.bytes += t.nbytes;
  bool complete_now = false;
  {
    cairn::MutexLock lock(mu_);
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
    cairn::MutexLock lock(mu_);
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
  Durability target = Durability::kGlobal;
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
    if (sent.ok()) {
      CAIRN_LOG_INFO("peers: {}: its {} parts are in; member {}, which holds the most of its bytes, registers it",
                     quoted(id), a.of, registrar);
      for (const std::string& h : am.holders())
        if (h != registrar)
          send_state(h, PartStateMessage{id, PartPhase::kDelegated, registrar, Durability::kMemory, {}, {}});
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
    send_state(h, PartStateMessage{id, PartPhase::kFailed, "", Durability::kMemory, {}, error});
  p_.commits.release_assembly(id);
  cairn::MutexLock lock(mu_);
  ++failed_;
}

// ---- registrar: the model is registered, and followed to the repository ----

void GroupParts::on_assemble(AssembleMessage m, const std::string& from, bool reserved) {
  const std::string id = m.model.id;
  Checking c{std::move(m), from, {}, Clock::now() + p_.peer_timeout};
  if (!reserved) {
    Status r = p_.commits.reserve_assembly(id, c.assembly.model.parent);
    if (!r.ok()) {
      // Not reserved here: nothing to give back.
      CAIRN_LOG_WARN("peers: {} (sent by its home, member {})", r.message(), from);
      for (const std::string& h : c.assembly.holders())
        send_state(h, PartStateMessage{id, PartPhase::kFailed, "", Durability::kMemory, {}, r});
      cairn::MutexLock lock(mu_);
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
      cairn::MutexLock lock(mu_);
      auto it = held_.find(id);
      held = it != held_.end() && !it->second.parts.empty();
    }
    if (!held)
      return fail_check(id, c,
                        unavailable(quoted(id) + " was not created: the parts committed here were dropped "
                                                 "meanwhile"));
  }
  if (c.waiting.empty()) return register_model(std::move(c));
  const std::set<std::string> ask = c.waiting;
  {
    cairn::MutexLock lock(mu_);
    checking_[id] = std::move(c);
  }
  for (const std::string& h : ask)
    send_state(h, PartStateMessage{id, PartPhase::kCheck, "", Durability::kMemory, {}, {}});
}

void GroupParts::fail_check(const std::string& id, const Checking& c, const Status& error) {
  CAIRN_LOG_WARN("peers: {}", error.message());
  for (const std::string& h : c.assembly.holders())
    send_state(h, PartStateMessage{id, PartPhase::kFailed, "", Durability::kMemory, {}, error});
  p_.commits.release_assembly(id);
  cairn::MutexLock lock(mu_);
  ++failed_;
}

void GroupParts::register_model(Checking c) {
  const AssembleMessage& m = c.assembly;
  const std::string id = m.model.id;
  const std::vector<std::string> holders = m.holders();
  const uint64_t ticket = p_.tickets.create(Durability::kGlobal);
  Status registered = p_.commits.register_assembled(m.model, ticket);
  p_.commits.release_assembly(id);  // the flusher holds the id from here on (or it is free again)
  if (!registered.ok()) {
    const Status error = failed_because(id, registered);
    CAIRN_LOG_WARN("peers: {}", error.message());
    for (const std::string& h : holders)
      send_state(h, PartStateMessage{id, PartPhase::kFailed, "", Durability::kMemory, {}, error});
    cairn::MutexLock lock(mu_);
    ++failed_;
    return;
  }
  CAIRN_LOG_INFO("peers: {} assembled from {} parts on {} member(s), {} tensors", quoted(id), m.part_holders.size(),
                 holders.size(), m.model.tensors.size());
  {
    cairn::MutexLock lock(mu_);
    registered_[id] = Registered{ticket, holders, {}, false, false, m.durability};
    ++assembled_;
    // Waits for the model to reach the repository (or fail), then tells the worker.
    waiters_[ticket] = std::thread([this, id, ticket] {
      auto out = p_.tickets.wait(ticket, std::chrono::milliseconds(-1));
      TicketBook::Outcome o;
      if (out.ok()) o = *out;
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
    cairn::MutexLock lock(mu_);
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
  PartStateMessage m{id, PartPhase::kGlobal, "", Durability::kMemory, {}, {}};
  if (o.error.ok()) {
    for (const std::string& h : r.holders) send_state(h, m);
    return;
  }
  // Gone here (the flusher dropped it): the holders' tickets fail, and every member drops it
  // from its view of the job's catalog (it was announced).
  m.phase = PartPhase::kFailed;
  m.error =
      Status(o.error.code(), quoted(id) + " is lost: it could not be written to the repository: " + o.error.message());
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
      cairn::MutexLock lock(mu_);
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
    cairn::MutexLock lock(mu_);
    if (m.ok)
      r.local_done.insert(from);
    else
      r.local_failed = true;
    if (r.local_failed || r.local_reported || r.local_done.size() != r.holders.size()) return;
    r.local_reported = true;
  }
  // Every part is on its own holder's burst buffer.
  for (const std::string& h : r.holders)
    send_state(h, PartStateMessage{m.model, PartPhase::kLocal, "", Durability::kMemory, {}, {}});
}

}  // namespace cairn
