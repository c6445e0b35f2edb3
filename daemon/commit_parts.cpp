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
#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "daemon/commit_path.hpp"
#include "daemon/request.hpp"

namespace cairn {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct CommitPath::Assembly {
  struct Part {
    bool arriving = false;  // a request for it is being validated
    bool arrived = false;   // validated, bytes in the arena
    std::vector<Planned> plan;
    std::vector<Extent> ext;
    DurabilityLevel target = DurabilityLevel::kGlobal;
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

namespace {
constexpr uint64_t kMaxParts = 65536;
constexpr uint64_t kDefaultPartTimeoutMs = 60000;
constexpr uint64_t kMaxPartTimeoutMs = 24ull * 3600 * 1000;
}  // namespace

CommitPath::~CommitPath() {
  std::vector<std::shared_ptr<Assembly>> left;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& [id, a] : assemblies_) left.push_back(a);
    assemblies_.clear();
  }
  reap_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  for (auto& a : left) fail_assembly(*a, unavailable("model '" + a->id + "' was not created: the daemon stopped while its parts were arriving"));
}

size_t CommitPath::assembling() const {
  std::lock_guard lock(mu_);
  return assemblies_.size();
}

void CommitPath::unreserve(const std::string& id) {
  std::lock_guard lock(mu_);
  committing_.erase(id);
  if (!p_.flusher.contains(id) && !p_.repo.contains_cached(id)) p_.repo.release_claim(id);
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
    if (part.ticket) p_.tickets.finish(part.ticket, DurabilityLevel::kMemory, error);
  }
  unreserve(a.id);
}

void CommitPath::reap_loop() {
  std::unique_lock lock(mu_);
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
      a.error = unavailable("model '" + a.id + "' was not created: part" + (n_missing > 1 ? "s " : " ") + missing +
                          " of " + std::to_string(a.of) + " did not arrive within " + std::to_string(a.timeout.count()) +
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
    if (next == SteadyClock::time_point::max()) reap_cv_.wait(lock);
    else reap_cv_.wait_until(lock, next);
  }
}

Result<json> CommitPath::commit_part(Session& s, const json& req, std::vector<uint8_t>& blob, const std::string& id,
                                     const std::string& parent, DurabilityLevel target, bool wait, const json& metadata,
                                     const json& architecture, const json& tensors, bool inherit_all) {
  const json& pj = req["part"];
  const std::string what = "model '" + id + "'";
  if (!pj.is_object()) return invalid_argument(what + ": 'part' must be an object {index, of, timeout_ms}");
  CAIRN_ASSIGN_OR_RETURN(uint64_t index, request::get_u64(pj, "index"));
  CAIRN_ASSIGN_OR_RETURN(uint64_t of, request::get_u64(pj, "of"));
  uint64_t timeout_ms = kDefaultPartTimeoutMs;
  if (pj.contains("timeout_ms")) {
    CAIRN_ASSIGN_OR_RETURN(timeout_ms, request::get_u64(pj, "timeout_ms"));
  }
  if (of < 2 || of > kMaxParts)
    return invalid_argument(what + ": part.of is " + std::to_string(of) + "; a multi-part model has 2 to " +
                            std::to_string(kMaxParts) + " parts");
  if (index >= of)
    return invalid_argument(what + ": part.index " + std::to_string(index) + " is not below part.of " + std::to_string(of));
  if (timeout_ms == 0 || timeout_ms > kMaxPartTimeoutMs)
    return invalid_argument(what + ": part.timeout_ms must be 1 to " + std::to_string(kMaxPartTimeoutMs));
  if (inherit_all) return invalid_argument(what + ": inherit_all cannot be used in a part (name each inherited tensor)");
  const std::string part_name = what + ", part " + std::to_string(index) + " of " + std::to_string(of);

  std::shared_ptr<Assembly> a;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return unavailable("the daemon is stopping");
    auto it = assemblies_.find(id);
    if (it != assemblies_.end()) {
      a = it->second;
      if (a->of != of)
        return invalid_argument(part_name + ": an earlier part said the model has " + std::to_string(a->of) + " parts");
      if (a->parent != parent)
        return invalid_argument(part_name + ": parent '" + parent + "' differs from the earlier parts' '" + a->parent + "'");
      if (a->parts[index].arrived || a->parts[index].arriving)
        return invalid_argument(part_name + " was committed twice");
    } else {
      if (committing_.count(id) || p_.flusher.contains(id))
        return already_exists(what + " already exists (model ids are immutable; choose a new id)");
      Status claimed = p_.repo.claim(id);
      if (claimed.code() == StatusCode::kExists)
        return already_exists(what + " already exists (model ids are immutable; choose a new id): " + claimed.message());
      CAIRN_RETURN_IF_ERROR(claimed);
      committing_[id] = parent;
      a = std::make_shared<Assembly>();
      a->id = id;
      a->parent = parent;
      a->of = static_cast<uint32_t>(of);
      a->timeout = std::chrono::milliseconds(timeout_ms);
      a->deadline = SteadyClock::now() + a->timeout;
      a->parts.resize(of);
      assemblies_[id] = a;
      if (!reaper_.joinable()) reaper_ = std::thread([this] { reap_loop(); });
      reap_cv_.notify_all();
    }
    a->parts[index].arriving = true;
  }
  auto not_arriving = [&] {
    std::lock_guard lock(mu_);
    a->parts[index].arriving = false;
  };

  // Validate this part against the parent, touching nothing; then place its inline bytes.
  std::shared_ptr<const ModelManifest> parent_manifest;
  if (!parent.empty()) {
    auto pm = p_.models.find(parent);
    if (!pm.is_ok()) {
      not_arriving();
      return not_found("parent model '" + parent + "' of '" + id + "' does not exist");
    }
    parent_manifest = *pm;
    if (!p_.catalog.contains(parent) && refresh_catalog_) refresh_catalog_();
  }
  auto planned = plan(s, id, tensors, false, parent_manifest.get(), blob);
  if (!planned.is_ok()) {
    not_arriving();
    return planned.status().with_context("part " + std::to_string(index) + " of " + std::to_string(of));
  }
  std::vector<Planned> part_plan = std::move(planned).value();
  std::vector<Extent> ext(part_plan.size());
  for (size_t i = 0; i < part_plan.size(); ++i) {
    Planned& p = part_plan[i];
    if (p.source == Planned::kInline) {
      auto off = p_.dram.allocate(p.desc.nbytes);
      if (!off.is_ok()) {
        for (size_t j = 0; j < i; ++j)
          if (part_plan[j].source == Planned::kInline) p_.dram.release(ext[j].offset, ext[j].length);
        not_arriving();
        return off.status();
      }
      if (p.desc.nbytes) std::memcpy(p_.dram.base() + *off, blob.data() + p.blob_offset, p.desc.nbytes);
      ext[i] = Extent{*off, p.desc.nbytes};
    }
  }
  // The spaces leave the writer's connection: the part's bytes are the assembly's now.
  for (size_t i = 0; i < part_plan.size(); ++i) {
    if (part_plan[i].source != Planned::kSpace) continue;
    ext[i] = s.staging[part_plan[i].space];
    s.staging.erase(part_plan[i].space);
  }

  uint64_t ticket = 0;
  bool complete = false;
  {
    std::lock_guard lock(mu_);
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
    part.target = target;
    part.ticket = ticket = p_.tickets.create(target, true);
    if (metadata.is_object()) a->metadata.update(metadata);
    if (!architecture.is_null() && a->architecture.is_null()) a->architecture = architecture;
    complete = ++a->arrived == a->of;
    if (complete) assemblies_.erase(id);
  }
  if (complete) (void)complete_assembly(*a);  // its outcome reaches every part's ticket

  json out{{"id", id}, {"part", index}, {"of", of}, {"assembled", complete}};
  if (!wait) {
    s.tickets.insert(ticket);
    out["ticket"] = ticket;
    return out;
  }
  CAIRN_ASSIGN_OR_RETURN(TicketBook::Outcome t, p_.tickets.wait(ticket, std::chrono::milliseconds(-1)));
  if (!t.error.is_ok()) return t.error;
  out["reached"] = durability_name(t.reached);
  return out;
}

Status CommitPath::complete_assembly(Assembly& a) {
  auto fail = [&](const Status& error) {
    fail_assembly(a, error);
    return error;
  };
  std::shared_lock gc_lock(p_.gc_mu);
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
    if (!g.is_ok()) return fail(g.status().with_context("model '" + a.id + "' was not created"));
    graph = std::move(g).value();
  }
  std::shared_ptr<const ModelManifest> parent_manifest;
  if (!a.parent.empty()) {
    auto pm = p_.models.find(a.parent);
    if (!pm.is_ok())
      return fail(not_found("model '" + a.id + "' was not created: its parent '" + a.parent + "' is gone"));
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
  auto registered = build_and_register(a.id, a.parent, parent_manifest.get(), a.metadata, a.architecture,
                                       graph ? &*graph : nullptr, parts, "", a.parts[leader].ticket,
                                       a.parts[leader].target, false);
  gc_lock.unlock();
  if (!registered.is_ok()) {
    // Its bytes were adopted (as a failed plain commit's are); the tickets learn why.
    for (uint32_t i = 0; i < a.of; ++i)
      if (i != leader) p_.tickets.finish(a.parts[i].ticket, DurabilityLevel::kMemory, registered.status());
    unreserve(a.id);
    return registered.status();
  }
  // Visible now: every part has reached memory (and follows the model's flush from here on).
  p_.tickets.reach(a.parts[leader].ticket, DurabilityLevel::kMemory);
  unreserve(a.id);
  return Status::ok();
}

}  // namespace cairn
