// Multi-part models: one model written by several clients at once (data-parallel ranks, each with
// its own share of the tensors). A commit request with `part: {index, of, timeout_ms}` is one part
// (docs/protocol.md, "Multi-part models"):
//
//  - The first part to arrive reserves the id (exactly as a commit does: kExists if it is taken)
//    and starts the assembly's clock. Every part names the same parent and the same count.
//  - Each part is validated and its bytes placed in the arena when it arrives (its staging spaces
//    leave the writer's connection, so the writer may go away), but nothing is hashed or visible.
//  - When the last part arrives, all parts are built into one manifest (tensors in part order) and
//    registered as one commit, at the weakest durability any part asked for; every part's ticket
//    follows the model's.
//  - A part missing when the timeout passes (its writer died, or never committed) fails the
//    assembly: every part's ticket gets an error naming the missing parts, their bytes go back to
//    the arena, the id is free again, and nothing of the model was ever visible.
//
// In a peer group with another verified member, the parts may be committed on several members:
// each part is then placed and hashed where it arrives (commit_group_part) and handed to
// GroupParts (daemon/peers/group_parts.hpp), which assembles the model across the group; this
// file also gives GroupParts the id's reservation and the registration of the assembled model.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "daemon/commit_path.hpp"
#include "daemon/peers/group_parts.hpp"
#include "daemon/request.hpp"
#include "daemon/trace_recorder.hpp"
#include "daemon/watchdog.hpp"

namespace cairn {

using nlohmann::json;
using namespace request;
using SteadyClock = std::chrono::steady_clock;

struct CommitPath::Assembly {
  struct Part {
    bool arriving = false;  // a request for it is being validated
    bool arrived = false;   // validated, bytes in the arena
    std::vector<Planned> plan;
    std::vector<Extent> ext;
    Durability target = Durability::kGlobal;
    uint64_t ticket = 0;
  };
  std::string id, parent;
  uint32_t of = 0;
  std::chrono::milliseconds timeout{0};
  SteadyClock::time_point deadline;
  std::vector<Part> parts;
  uint32_t arrived = 0;
  json metadata = json::object();
  json architecture;
  bool failed = false;  // GUARDED_BY(CommitPath::mu_) the reaper took it
  Status error;
};

CommitPath::CommitPath(Parts parts) : p_(std::move(parts)) {
  if (p_.part_transport)
    group_parts_ = std::make_unique<GroupParts>(
        GroupParts::Parts{
            .commits = *this,
            .tickets = p_.tickets,
            .dram = p_.dram,
            .tiers = p_.tiers,
            .flusher = p_.flusher,
            .peer_catalog = *p_.peer_catalog,
            .burst_buffer = p_.burst_buffer,
            .peer_timeout = p_.peer_timeout,
        },
        *p_.part_transport);
}

CommitPath::~CommitPath() {
  std::vector<std::shared_ptr<Assembly>> left;
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
    for (auto& [id, a] : assemblies_) left.push_back(a);
    assemblies_.clear();
  }
  reap_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  for (auto& a : left)
    fail_assembly(
        *a, unavailable("model '" + a->id + "' was not created: the daemon stopped while its parts were arriving"));
}

void CommitPath::unreserve(const std::string& id) {
  cairn::MutexLock lock(mu_);
  committing_.erase(id);
  if (!p_.flusher.contains(id) && !p_.repo.contains(id, Freshness::kCached)) p_.repo.release_claim(id);
}

void CommitPath::release_part_bytes(const std::vector<Planned>& plan, const std::vector<Extent>& ext) {
  for (size_t i = 0; i < plan.size() && i < ext.size(); ++i)
    if (plan[i].source != Planned::kInherit) p_.dram.release(ext[i].offset, ext[i].length);
}

void CommitPath::fail_assembly(Assembly& a, const Status& error) {
  for (auto& part : a.parts) {
    if (!part.arrived) continue;
    release_part_bytes(part.plan, part.ext);
    part.plan.clear();
    part.ext.clear();
    if (part.ticket) p_.tickets.finish(part.ticket, Durability::kMemory, error);
  }
  unreserve(a.id);
}

void CommitPath::reap_loop() {
  cairn::MutexLock lock(mu_);
  while (!stopping_) {
    const auto now = SteadyClock::now();
    auto next = SteadyClock::time_point::max();
    std::vector<std::shared_ptr<Assembly>> expired;
    for (auto it = assemblies_.begin(); it != assemblies_.end();) {
      Assembly& a = *it->second;
      if (a.deadline > now) {
        next = std::min(next, a.deadline);
        ++it;
        continue;
      }
      std::string missing;
      uint32_t n_missing = 0;
      for (uint32_t i = 0; i < a.of; ++i)
        if (!a.parts[i].arrived) missing += (n_missing++ ? ", " : "") + std::to_string(i);
      a.failed = true;
      a.error =
          unavailable("model '" + a.id + "' was not created: part" + (n_missing > 1 ? "s " : " ") + missing + " of " +
                      std::to_string(a.of) + " did not arrive within " + std::to_string(a.timeout.count()) +
                      " ms of the first (a writer died or never committed its part); nothing of the model is "
                      "visible and the parts that came were dropped");
      expired.push_back(it->second);
      it = assemblies_.erase(it);
    }
    if (!expired.empty()) {
      lock.unlock();
      for (auto& a : expired) fail_assembly(*a, a->error);
      lock.lock();
      continue;
    }
    if (next == SteadyClock::time_point::max())
      reap_cv_.wait(lock);
    else
      reap_cv_.wait_until(lock, next);
  }
}

Status CommitPath::reserve_assembly(const std::string& id, const std::string& parent) {
  cairn::MutexLock lock(mu_);
  return reserve_locked(id, parent);
}

Status CommitPath::reserve_locked(const std::string& id, const std::string& parent) {
  const std::string what = "model '" + id + "'";
  if (committing_.count(id) || p_.flusher.contains(id))
    return already_exists(what + " already exists (model ids are immutable; choose a new id)");
  Status claimed = p_.repo.claim(id);
  if (claimed.code() == StatusCode::kExists)
    return already_exists(what + " already exists (model ids are immutable; choose a new id): " + claimed.message());
  CAIRN_RETURN_IF_ERROR(claimed);
  committing_[id] = parent;
  return Status::OK();
}

Result<CommitPath::PlacedPart> CommitPath::place_part(Session& s, const std::vector<uint8_t>& blob, Commit& r) {
  const std::string& id = r.id;
  const std::string& parent = r.parent;
  // Validated against the parent, touching nothing; then its inline bytes placed.
  PlacedPart placed;
  if (!parent.empty()) {
    auto pm = p_.models.find(parent);
    if (!pm.ok()) return not_found("parent model '" + parent + "' of '" + id + "' does not exist");
    placed.parent = *pm;
    if (!p_.catalog.contains(parent) && p_.view) (void)p_.view->refresh();
  }
  auto planned = plan(s, id, r.tensors, false, placed.parent.get(), blob);
  if (!planned.ok())
    return planned.status().with_context("part " + std::to_string(r.part->index) + " of " + std::to_string(r.part->of));
  placed.plan = std::move(planned).value();
  placed.ext.resize(placed.plan.size());
  for (size_t i = 0; i < placed.plan.size(); ++i) {
    Planned& p = placed.plan[i];
    if (p.source != Planned::kInline) continue;
    auto off = p_.dram.allocate(p.desc.nbytes);
    if (!off.ok()) {
      for (size_t j = 0; j < i; ++j)
        if (placed.plan[j].source == Planned::kInline) p_.dram.release(placed.ext[j].offset, placed.ext[j].length);
      return off.status();
    }
    if (p.desc.nbytes) std::memcpy(p_.dram.base() + *off, blob.data() + p.blob_offset, p.desc.nbytes);
    placed.ext[i] = Extent{*off, p.desc.nbytes};
  }
  // The spaces leave the writer's connection: the part's bytes are the assembly's now.
  for (size_t i = 0; i < placed.plan.size(); ++i) {
    if (placed.plan[i].source != Planned::kSpace) continue;
    placed.ext[i] = s.staging[placed.plan[i].space];
    s.staging.erase(placed.plan[i].space);
  }
  return placed;
}

Result<CommitReply> CommitPath::part_reply(Session& s, CommitReply out, uint64_t ticket, bool wait) {
  if (!wait) {
    s.tickets.insert(ticket);
    out.ticket = ticket;
    return out;
  }
  Watchdog::ClientWait waiting;  // for the durability asked for (only the reply follows)
  CAIRN_ASSIGN_OR_RETURN(TicketBook::Outcome t, p_.tickets.wait(ticket, std::chrono::milliseconds(-1)));
  if (!t.error.ok()) return t.error;
  out.reached = t.reached;
  return out;
}

// REQUIRES: r.part (validated by request::decode_commit: index below of, a count and timeout in range,
// no inherit_all).
Result<CommitReply> CommitPath::commit_part(Session& s, Commit& r, const std::vector<uint8_t>& blob) {
  const std::string& id = r.id;
  const std::string& parent = r.parent;
  const uint32_t index = r.part->index, of = r.part->of;
  const std::string what = "model '" + id + "'";
  // Another member of the peer group is there: the parts may be on several members.
  if (group_parts_ && group_parts_->active()) return commit_group_part(s, blob, r);
  const std::string part_name = what + ", part " + std::to_string(index) + " of " + std::to_string(of);

  std::shared_ptr<Assembly> a;
  {
    cairn::MutexLock lock(mu_);
    if (stopping_) return unavailable("the daemon is stopping");
    auto it = assemblies_.find(id);
    if (it != assemblies_.end()) {
      a = it->second;
      if (a->of != of)
        return invalid_argument(part_name + ": an earlier part said the model has " + std::to_string(a->of) + " parts");
      if (a->parent != parent)
        return invalid_argument(part_name + ": parent '" + parent + "' differs from the earlier parts' '" + a->parent +
                                "'");
      if (a->parts[index].arrived || a->parts[index].arriving)
        return invalid_argument(part_name + " was committed twice");
    } else {
      // The first part: the id is reserved (also across the daemons of the repository).
      CAIRN_RETURN_IF_ERROR(reserve_locked(id, parent));
      a = std::make_shared<Assembly>();
      a->id = id;
      a->parent = parent;
      a->of = static_cast<uint32_t>(of);
      a->timeout = std::chrono::milliseconds(r.part->timeout_ms);
      a->deadline = SteadyClock::now() + a->timeout;
      a->parts.resize(of);
      assemblies_[id] = a;
      if (!reaper_.joinable()) reaper_ = std::thread([this] { reap_loop(); });
      reap_cv_.notify_all();
    }
    a->parts[index].arriving = true;
  }
  auto placed = place_part(s, blob, r);
  if (!placed.ok()) {
    cairn::MutexLock lock(mu_);
    a->parts[index].arriving = false;
    return placed.status();
  }
  std::vector<Planned> part_plan = std::move(placed->plan);
  std::vector<Extent> ext = std::move(placed->ext);

  uint64_t ticket = 0;
  bool complete = false;
  {
    cairn::MutexLock lock(mu_);
    if (a->failed) {  // the reaper took it while this part was being validated
      Status error = a->error;
      a->parts[index].arriving = false;
      release_part_bytes(part_plan, ext);
      return error;
    }
    auto& part = a->parts[index];
    part.arriving = false;
    part.arrived = true;
    part.plan = std::move(part_plan);
    part.ext = std::move(ext);
    part.target = r.durability;
    part.ticket = ticket = p_.tickets.create(r.durability, true);
    a->metadata.update(r.metadata);
    if (!r.architecture.is_null() && a->architecture.is_null()) a->architecture = std::move(r.architecture);
    complete = ++a->arrived == a->of;
    if (complete) assemblies_.erase(id);
  }
  if (complete) (void)complete_assembly(*a);  // its outcome reaches every part's ticket

  CommitReply out;
  out.id = id;
  out.part = r.part;
  out.assembled = complete;
  return part_reply(s, std::move(out), ticket, r.wait);
}

Result<CommitReply> CommitPath::commit_group_part(Session& s, const std::vector<uint8_t>& blob, Commit& r) {
  const std::string& id = r.id;
  const uint64_t index = r.part->index, of = r.part->of;
  const std::string what = "model '" + id + "'";
  // A model of that id here (pending, announced by a member, or in the repository): refused at
  // once. A commit of it going on elsewhere is found by the home's claim, and fails the ticket.
  if (p_.models.find(id).ok())
    return already_exists(what + " already exists (model ids are immutable; choose a new id)");
  const auto i32 = static_cast<uint32_t>(index);
  CAIRN_RETURN_IF_ERROR(group_parts_->reserve_part(id, i32, static_cast<uint32_t>(of)));
  auto placed = place_part(s, blob, r);
  if (!placed.ok()) {
    group_parts_->unreserve_part(id, i32);
    return placed.status();
  }
  // Hashed in place and adopted into the DRAM tier: the part's chunks are this member's, pinned
  // until the model reaches the repository or fails, and announced to the chunk directory so the
  // group reads them here.
  const std::vector<Planned>& plan = placed->plan;
  const std::vector<Extent>& ext = placed->ext;
  const uint64_t chunk_size = p_.repo.chunk_size();
  std::vector<std::pair<uint64_t, uint64_t>> to_hash;
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].source != Planned::kInherit)
      for (uint64_t off = 0; off < plan[i].desc.nbytes; off += chunk_size)
        to_hash.emplace_back(ext[i].offset + off, std::min(chunk_size, plan[i].desc.nbytes - off));
  const std::vector<ChunkHash> hashes = hash_ranges(p_.dram.base(), to_hash);
  PartMessage part;
  part.part.id = id;
  part.part.parent = r.parent;
  part.part.metadata = std::move(r.metadata);
  part.part.architecture = std::move(r.architecture);
  part.index = i32;
  part.of = static_cast<uint32_t>(of);
  part.timeout_ms = r.part->timeout_ms;
  part.durability = r.durability;
  std::vector<ChunkRef> pinned;
  size_t k = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Planned& p = plan[i];
    if (p.source == Planned::kInherit) {
      part.part.tensors.push_back(*p.inherited);
      if (p_.trace) p_.trace->inherit(id, *p.inherited);
      continue;
    }
    TensorManifest t{p.name, p.desc.dtype, p.desc.shape, p.desc.nbytes, {}};
    if (t.nbytes == 0) p_.dram.release(ext[i].offset, 0);
    for (uint64_t off = 0; off < t.nbytes; off += chunk_size) {
      const uint64_t len = std::min(chunk_size, t.nbytes - off);
      const ChunkHash h = hashes[k++];
      p_.dram.adopt(h, ext[i].offset + off, len, p_.tiers.only_in_dram(h));
      if (p_.trace) p_.trace->commit(id, h, len);
      ChunkRef ref;
      ref.hash = h;
      ref.length = len;
      pinned.push_back(ref);
      t.chunks.push_back(ref);
    }
    part.part.tensors.push_back(std::move(t));
  }
  const uint64_t ticket = p_.tickets.create(r.durability, true);
  group_parts_->hold(std::move(part), ticket, std::move(pinned));
  CommitReply out;
  out.id = id;
  out.part = r.part;
  return part_reply(s, std::move(out), ticket, r.wait);
}

Status CommitPath::register_assembled(const ModelManifest& model, uint64_t ticket) {
  cairn::ReaderLock gc_lock(p_.gc_mu);
  std::optional<Graph> graph;
  if (!model.architecture.is_null()) {
    auto g = parse_graph(model.architecture);
    if (!g.ok()) return g.status();
    graph = std::move(g).value();
  }
  std::shared_ptr<const ModelManifest> parent_manifest;
  if (!model.parent.empty()) {
    auto pm = p_.models.find(model.parent);
    if (!pm.ok()) return not_found("its parent '" + model.parent + "' does not exist here");
    parent_manifest = *pm;
    if (!p_.catalog.contains(model.parent) && p_.view) (void)p_.view->refresh();
  }
  // Every tensor as it is (chunks hashed by their holders): nothing to hash or adopt here.
  std::vector<Planned> plan(model.tensors.size(), Planned{std::string(), {}, Planned::kInherit});
  for (size_t i = 0; i < plan.size(); ++i) plan[i].inherited = &model.tensors[i];
  const std::vector<Extent> ext(plan.size());
  // Registered as global: no local stage here, which would gather every holder's chunks.
  Build build;
  build.id = model.id;
  build.parent = model.parent;
  build.parent_manifest = parent_manifest.get();
  build.metadata = model.metadata;
  build.architecture = model.architecture;
  build.graph = graph ? &*graph : nullptr;
  build.parts = {{&plan, &ext}};
  build.ticket = ticket;
  build.target = Durability::kGlobal;
  return build_and_register(std::move(build)).status();
}

Status CommitPath::complete_assembly(Assembly& a) {
  auto fail = [&](const Status& error) {
    fail_assembly(a, error);
    return error;
  };
  cairn::ReaderLock gc_lock(p_.gc_mu);
  // The parts together: no tensor twice.
  std::map<std::string, uint32_t> seen;
  for (uint32_t i = 0; i < a.of; ++i)
    for (const auto& p : a.parts[i].plan)
      if (auto [it, fresh] = seen.emplace(p.name, i); !fresh)
        return fail(invalid_argument("model '" + a.id + "' was not created: tensor '" + p.name + "' is in parts " +
                                     std::to_string(it->second) + " and " + std::to_string(i)));
  std::optional<Graph> graph;
  if (!a.architecture.is_null()) {
    auto g = parse_graph(a.architecture);
    if (!g.ok()) return fail(g.status().with_context("model '" + a.id + "' was not created"));
    graph = std::move(g).value();
  }
  std::shared_ptr<const ModelManifest> parent_manifest;
  if (!a.parent.empty()) {
    auto pm = p_.models.find(a.parent);
    if (!pm.ok()) return fail(not_found("model '" + a.id + "' was not created: its parent '" + a.parent + "' is gone"));
    parent_manifest = *pm;
  }
  // The model is registered at the weakest durability any part asked for, with that part's ticket;
  // the others follow it (set before the flusher can see the model).
  uint32_t leader = 0;
  for (uint32_t i = 1; i < a.of; ++i)
    if (a.parts[i].target < a.parts[leader].target) leader = i;
  std::vector<uint64_t> followers;
  for (uint32_t i = 0; i < a.of; ++i)
    if (i != leader) followers.push_back(a.parts[i].ticket);
  p_.tickets.follow(a.parts[leader].ticket, followers);
  std::vector<std::pair<const std::vector<Planned>*, const std::vector<Extent>*>> parts;
  for (const auto& p : a.parts) parts.emplace_back(&p.plan, &p.ext);
  Build build;
  build.id = a.id;
  build.parent = a.parent;
  build.parent_manifest = parent_manifest.get();
  build.metadata = a.metadata;
  build.architecture = a.architecture;
  build.graph = graph ? &*graph : nullptr;
  build.parts = std::move(parts);
  build.ticket = a.parts[leader].ticket;
  build.target = a.parts[leader].target;
  build.forget_ticket_on_error = false;
  auto registered = build_and_register(std::move(build));
  gc_lock.unlock();
  if (!registered.ok()) {
    // Its bytes were adopted (as a failed plain commit's are); the tickets learn why.
    for (uint32_t i = 0; i < a.of; ++i)
      if (i != leader) p_.tickets.finish(a.parts[i].ticket, Durability::kMemory, registered.status());
    unreserve(a.id);
    return registered.status();
  }
  // Visible now: every part has reached memory (and follows the model's flush from here on).
  p_.tickets.reach(a.parts[leader].ticket, Durability::kMemory);
  unreserve(a.id);
  return Status::OK();
}

}  // namespace cairn
