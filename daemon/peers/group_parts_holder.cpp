// Multi-part models across a peer group (group_parts.hpp): the holder's side. A writer's part is
// placed and hashed where it arrives (CommitPath::commit_group_part), held here and described to the
// model's home; then its tickets follow what the home and the registrar report, and its chunks go
// back once the model is in the repository or failed.
#include <algorithm>
#include <utility>

#include "core/log.hpp"
#include "daemon/flusher.hpp"
#include "daemon/peers/group_parts.hpp"
#include "daemon/peers/peer_catalog.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/tier_manager.hpp"

namespace cairn {

using json = nlohmann::json;

// ---- holder: a writer's part arrives here ----

Status GroupParts::reserve_part(const std::string& id, uint32_t index, uint32_t of) {
  cairn::MutexLock lock(mu_);
  Held& h = held_[id];
  if (h.registered) {
    return already_exists(quoted(id) +
                          " already exists: its parts were assembled (model ids are immutable; choose a "
                          "new id)");
  }
  if (h.parts.count(index) || h.placing.count(index))
    return invalid_argument(quoted(id) + ", part " + std::to_string(index) + " of " + std::to_string(of) +
                            " was committed twice");
  h.placing.insert(index);
  return Status::OK();
}

void GroupParts::unreserve_part(const std::string& id, uint32_t index) {
  {
    cairn::MutexLock lock(mu_);
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
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(part.timeout_ms) + 2 * p_.peer_timeout + std::chrono::seconds(2);
  std::string home;
  {
    cairn::MutexLock lock(mu_);
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
    if (!st.ok())
      fail_held(id,
                failed_because(
                    id, st.with_context("sending part " + std::to_string(index) + " to member " + home + ", its home")),
                {index});
  });
  cv_.notify_all();
}

// ---- holder: what the home and the registrar report ----

void GroupParts::on_state(const PartStateMessage& m, const std::string& from) {
  if (m.phase == PartPhase::kFailed) {
    // A model the sender registered and announced is gone from the job's catalog (harmless when
    // it never was: only an entry of that member is dropped).
    if (m.parts.empty())
      p_.peer_catalog.drop(m.model, from,
                           "which assembled it from parts, could not write it to the repository: it is gone");
    return fail_held(m.model, m.error, m.parts);
  }
  if (m.phase == PartPhase::kCheck) {
    bool held = false;
    {
      cairn::MutexLock lock(mu_);
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
    cairn::MutexLock lock(mu_);
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
        write = m.target < Durability::kGlobal;
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
      default:
        return;
    }
  }
  switch (m.phase) {
    case PartPhase::kMemory:
      // Visible in the group (the registrar announced it before this message).
      for (const HeldPart& p : parts) p_.tickets.reach(p.ticket, Durability::kMemory);
      if (write && p_.burst_buffer) {
        {
          cairn::MutexLock lock(mu_);
          io_tasks_.push_back(
              [this, id = m.model, chunks = std::move(chunks), from] { write_local(id, chunks, from); });
        }
        cv_.notify_all();
      } else if (write) {
        (void)send(from, PeerMsg::kPartAck, encode_part_ack(PartAckMessage{m.model, AckOf::kLocal, false}));
      }
      break;
    case PartPhase::kLocal:
      for (const HeldPart& p : parts) p_.tickets.reach(p.ticket, Durability::kLocal);
      break;
    case PartPhase::kGlobal:
      for (const HeldPart& p : parts) {
        p_.tickets.finish(p.ticket, Durability::kGlobal, Status::OK());
        release_chunks(p.chunks, true);
      }
      cv_.notify_all();
      break;
    default:
      break;
  }
}

void GroupParts::write_local(const std::string& id, std::vector<ChunkRef> chunks, const std::string& registrar) {
  Status st = p_.tiers.write_local(chunks);
  if (!st.ok())
    CAIRN_LOG_WARN("peers: the parts of {} held here did not go to the burst buffer: {}", quoted(id), st.to_string());
  (void)send(registrar, PeerMsg::kPartAck, encode_part_ack(PartAckMessage{id, AckOf::kLocal, st.ok()}));
}

void GroupParts::fail_held(const std::string& id, const Status& error, const std::vector<uint32_t>& which) {
  std::vector<HeldPart> gone;
  {
    cairn::MutexLock lock(mu_);
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
    p_.tickets.finish(p.ticket, Durability::kMemory, error);
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
      cairn::MutexLock lock(mu_);
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

}  // namespace cairn
