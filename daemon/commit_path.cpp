#include "daemon/commit_path.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "core/graph.hpp"
#include "daemon/model_graph.hpp"
#include "daemon/request.hpp"
#include "daemon/trace_recorder.hpp"
#include "daemon/watchdog.hpp"

namespace cairn {

using nlohmann::json;
using namespace request;

// ---- staging space ----

Result<AllocateReply> CommitPath::allocate(Session& s, const Allocate& r) {
  if (r.nbytes > p_.dram.arena_size())
    return no_space("a tensor of " + std::to_string(r.nbytes) + " bytes does not fit the DRAM arena of " +
                    std::to_string(p_.dram.arena_size()) + " bytes (raise tiers.dram.capacity)");
  CAIRN_ASSIGN_OR_RETURN(uint64_t off, p_.dram.allocate(r.nbytes));
  uint64_t id = s.next_id++;
  s.staging[id] = Extent{off, r.nbytes};
  return AllocateReply{id, off};
}

Status CommitPath::free(Session& s, const Free& r) {
  auto it = s.staging.find(r.space);
  if (it == s.staging.end()) return not_found("no staging space " + std::to_string(r.space) + " in this connection");
  p_.dram.release(it->second.offset, it->second.length);
  s.staging.erase(it);
  return Status::OK();
}

void CommitPath::end_session(Session& s) {
  for (auto& [id, ext] : s.staging) p_.dram.release(ext.offset, ext.length);
  s.staging.clear();
  p_.tickets.forget(s.tickets);
  s.tickets.clear();
}

// ---- commit ----

// The client's chunk hashes (decoded with the request) are trusted as the client's bytes are
// (docs/decisions/0001-chunk-hash.md: the users of one daemon and repository are one job's); reads
// from storage verify them as always.
Result<std::vector<CommitPath::Planned>> CommitPath::plan(Session& s, const std::string& id,
                                                          std::vector<CommitTensor>& tensors, bool inherit_all,
                                                          const ModelManifest* parent,
                                                          const std::vector<uint8_t>& blob) {
  std::vector<Planned> plan;
  plan.reserve(tensors.size());
  std::set<uint64_t> spaces;
  for (CommitTensor& t : tensors) {
    Planned p{std::move(t.name), {}, Planned::kSpace};
    auto what = [&] { return "model '" + id + "', tensor '" + p.name + "'"; };
    switch (t.source) {
      case CommitTensor::Source::kInherit:
        if (!parent) return invalid_argument(what() + ": inherited, but the model has no parent");
        p.inherited = parent->find(p.name);
        if (!p.inherited) return not_found(what() + ": inherited, but parent '" + parent->id + "' has no such tensor");
        p.source = Planned::kInherit;
        p.desc = TensorDesc{p.inherited->dtype, p.inherited->shape, p.inherited->nbytes};
        break;
      case CommitTensor::Source::kSpace: {
        p.desc = std::move(t.desc);
        p.space = t.space;
        auto it = s.staging.find(p.space);
        if (it == s.staging.end() || !spaces.insert(p.space).second)
          return not_found(what() + ": no staging space " + std::to_string(p.space) + " in this connection");
        if (it->second.length != p.desc.nbytes)
          return invalid_argument(what() + ": staging space holds " + std::to_string(it->second.length) +
                                  " bytes but dtype and shape need " + std::to_string(p.desc.nbytes));
        p.hashes = std::move(t.hashes);
        break;
      }
      case CommitTensor::Source::kInline: {
        p.desc = std::move(t.desc);
        p.source = Planned::kInline;
        p.blob_offset = t.inline_offset;
        const uint64_t len = t.inline_length;
        if (len != p.desc.nbytes || p.blob_offset > blob.size() || len > blob.size() - p.blob_offset)
          return invalid_argument(what() + ": inline bytes [" + std::to_string(p.blob_offset) + ", +" +
                                  std::to_string(len) + ") do not match the payload of " + std::to_string(blob.size()) +
                                  " bytes or the " + std::to_string(p.desc.nbytes) + " bytes dtype and shape need");
        break;
      }
    }
    plan.push_back(std::move(p));
  }
  if (inherit_all) {
    // Every parent tensor not given explicitly, in the parent's order: a metadata-only commit when
    // nothing else is given.
    if (!parent) return invalid_argument("model '" + id + "': 'inherit_all' needs a parent");
    // An inherited entry only points at the parent's tensor: its name, dtype and shape are the
    // parent's, copied once into the manifest (no per-tensor copies here).
    plan.reserve(plan.size() + parent->tensors.size());  // before the views of the names below
    std::set<std::string_view> named;
    for (const Planned& p : plan) named.insert(p.name);
    for (const TensorManifest& t : parent->tensors) {
      if (!named.empty() && named.count(t.name)) continue;
      Planned p{std::string(), TensorDesc{}, Planned::kInherit};
      p.inherited = &t;
      plan.push_back(std::move(p));
    }
  }
  return plan;
}

// Hashes each (arena offset, length) range of base, on several threads when there is much to hash:
// the hash is the part of a big commit's blocking time that is not the copy.
std::vector<ChunkHash> CommitPath::hash_ranges(const uint8_t* base,
                                               const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::vector<ChunkHash> hashes(ranges.size());
  uint64_t total = 0;
  for (const auto& [o, l] : ranges) total += l;
  const size_t threads = total >= (64ull << 20) && ranges.size() > 1
                             ? std::min<size_t>({4, ranges.size(), std::max(1u, std::thread::hardware_concurrency())})
                             : 1;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next++) < ranges.size();) hashes[k] = hash_bytes(base + ranges[k].first, ranges[k].second);
  };
  std::vector<std::thread> helpers;
  for (size_t h = 1; h < threads; ++h) helpers.emplace_back(work);
  work();
  for (auto& th : helpers) th.join();
  return hashes;
}

// Pass 3 and registration, for a commit and for an assembled multi-part model: hashes the new
// tensors' bytes in place, adopts the chunks into the DRAM tier (deduplicating), builds the manifest
// and hands it to the flusher (visible from now on). The caller holds the gc lock (shared) and the
// id's reservation. On error nothing is registered and `ticket` is forgotten (or, for a multi-part
// model whose parts wait on it, finished with the error).
Result<std::shared_ptr<ModelManifest>> CommitPath::build_and_register(Build b) {
  // Pass 3: hash in place and adopt the chunks into the DRAM tier (deduplicating).
  const std::string& id = b.id;
  const ModelManifest* parent_manifest = b.parent_manifest;
  const uint64_t ticket = b.ticket;
  auto m = std::make_shared<ModelManifest>();
  m->id = b.id;
  m->parent = b.parent;
  m->metadata = std::move(b.metadata);
  m->architecture = std::move(b.architecture);
  if (!b.source_header.empty()) {
    const std::string& js = b.source_header;
    std::string prefix(8, '\0');
    uint64_t n = js.size();
    for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    m->source_header = prefix + js;
  }
  const uint64_t chunk_size = p_.repo.chunk_size();
  // The parts' plans, in order, as one list (a plain commit is one part).
  std::vector<const Planned*> plan;
  std::vector<Extent> tensor_ext;
  for (const auto& [pp, ext] : b.parts)
    for (size_t i = 0; i < pp->size(); ++i) plan.push_back(&(*pp)[i]), tensor_ext.push_back((*ext)[i]);
  // Every new chunk hashed (but those the client hashed while it copied them).
  std::vector<std::pair<uint64_t, uint64_t>> to_hash;  // (arena offset, length)
  for (size_t i = 0; i < plan.size(); ++i) {
    const Planned& p = *plan[i];
    if (p.source == Planned::kInherit || !p.hashes.empty()) continue;
    for (uint64_t off = 0; off < p.desc.nbytes; off += chunk_size)
      to_hash.emplace_back(tensor_ext[i].offset + off, std::min(chunk_size, p.desc.nbytes - off));
  }
  const std::vector<ChunkHash> hashes = hash_ranges(p_.dram.base(), to_hash);
  size_t hash_index = 0;
  std::vector<ChunkHash> pinned;
  // A metadata-only child (every tensor its parent's, in order) shares the parent's tensor list.
  bool all_parent = parent_manifest && !plan.empty() && plan.size() == parent_manifest->tensors.size();
  for (size_t pi = 0; all_parent && pi < plan.size(); ++pi)
    all_parent = plan[pi]->source == Planned::kInherit && plan[pi]->inherited == &parent_manifest->tensors[pi];
  // The bytes of its tensors, for the usage counters: in chunks new here, in chunks this daemon
  // already held (DRAM or repository), in tensors inherited from the parent.
  uint64_t stored_bytes = 0, deduplicated_bytes = 0, inherited_bytes = 0;
  if (all_parent)
    m->tensors = parent_manifest->tensors;
  else
    m->tensors.reserve(plan.size());
  if (all_parent)
    for (const TensorManifest& t : m->tensors) inherited_bytes += t.nbytes;
  if (all_parent && p_.trace)
    for (const TensorManifest& t : m->tensors) p_.trace->inherit(id, t);
  for (size_t pi = 0; pi < plan.size() && !all_parent; ++pi) {
    const Planned& p = *plan[pi];
    if (p.source == Planned::kInherit) {
      inherited_bytes += p.inherited->nbytes;
      m->tensors.push_back(*p.inherited);
      if (p_.trace) p_.trace->inherit(id, *p.inherited);
      continue;
    }
    const Extent ext = tensor_ext[pi];
    TensorManifest t;
    t.name = p.name;
    t.dtype = p.desc.dtype;
    t.shape = p.desc.shape;
    t.nbytes = p.desc.nbytes;
    if (t.nbytes == 0) p_.dram.release(ext.offset, 0);
    for (uint64_t off = 0, k = 0; off < t.nbytes; off += chunk_size, ++k) {
      uint64_t len = std::min(chunk_size, t.nbytes - off);
      ChunkHash h = p.hashes.empty() ? hashes[hash_index++] : p.hashes[k];
      bool dirty = p_.tiers.only_in_dram(h);
      // adopt answers the offset of the copy it keeps: another one when DRAM held the chunk already.
      const bool resident = p_.dram.adopt(h, ext.offset + off, len, dirty) != ext.offset + off;
      pinned.push_back(h);
      if (p_.trace) p_.trace->commit(id, h, len);
      ChunkRef ref;
      ref.hash = h;
      ref.length = len;
      auto stored = p_.repo.locate(h);
      if (stored) ref = *stored;
      (resident || stored ? deduplicated_bytes : stored_bytes) += len;
      t.chunks.push_back(ref);
    }
    m->tensors.push_back(std::move(t));
  }

  // Register as pending (visible now) and hand it to the flusher, which writes models in commit
  // order so that a parent always reaches the repository before its children. memory and local
  // commits go through the burst buffer (DeepFreeze's levels); a global commit's caller waits for
  // the repository anyway, so its bytes go there directly.
  GraphHandle graph = graph_for(p_.catalog, *m, b.graph, parent_manifest);
  // A model acknowledged before the repository has it (durability memory or local, or a commit that
  // does not wait) is retried there, never dropped (flusher.hpp).
  Flusher::Entry entry{m, ticket, p_.burst_buffer && b.target < Durability::kGlobal, false,
                       b.acknowledged_early || b.target < Durability::kGlobal};
  Status registered = p_.flusher.enqueue(std::move(entry), [&]() -> Status {
    Status added = p_.catalog.add(id, m->parent, std::move(graph), m->metadata);
    if (!added.ok()) return added.with_context("registering model '" + id + "' in the catalog");
    m->created_ns = p_.clock.next();
    p_.references.count(*m, +1);
    return Status::OK();
  });
  for (const auto& h : pinned) p_.dram.unpin(h);
  if (!registered.ok()) {
    if (ticket && b.forget_ticket_on_error)
      p_.tickets.forget({ticket});
    else if (ticket)
      p_.tickets.finish(ticket, Durability::kMemory, registered);
    return registered;
  }
  if (p_.committed) p_.committed(*m);
  if (p_.usage) p_.usage->model_committed(stored_bytes, deduplicated_bytes, inherited_bytes);
  // The bytes this commit wrote into arena space: the demoter makes room for the next one now.
  uint64_t written = 0;
  for (const Planned* p : plan)
    if (p->source != Planned::kInherit) written += p->desc.nbytes;
  if (written) p_.tiers.note_commit(written);
  return m;
}

Result<CommitReply> CommitPath::commit(Session& s, Commit r, const std::vector<uint8_t>& blob) {
  // One part of a model written by several clients (daemon/commit_parts.cpp).
  if (r.part) return commit_part(s, r, blob);
  const std::string& id = r.id;
  const std::string& parent = r.parent;
  // Until the model is registered: gc must not free a chunk this commit references.
  cairn::ReaderLock gc_lock(p_.gc_mu);

  // Reserve the id so that two concurrent commits of one id cannot both succeed. A model moves from
  // committing_ to the flusher's pending set to the repository, each entered before the previous is
  // left, so checking them in that order under mu_ cannot miss it.
  // The repository's claim makes the id unique across every daemon that shares the repository: it
  // fails when the id is in the repository (looked up in every daemon's log) or another daemon is
  // committing it. The claim is the repository's until the model is there; a commit that fails
  // before the flusher has it gives it back.
  {
    cairn::MutexLock lock(mu_);
    if (committing_.count(id) || p_.flusher.contains(id))
      return already_exists("model '" + id + "' already exists (model ids are immutable; choose a new id)");
    Status claimed = p_.repo.claim(id);
    if (claimed.code() == StatusCode::kExists)
      return already_exists("model '" + id +
                            "' already exists (model ids are immutable; choose a new id): " + claimed.message());
    CAIRN_RETURN_IF_ERROR(claimed);
    committing_[id] = parent;
  }
  struct Unreserve {
    CommitPath* c;
    std::string id;
    ~Unreserve() {
      cairn::MutexLock lock(c->mu_);
      c->committing_.erase(id);
      if (!c->p_.flusher.contains(id) && !c->p_.repo.contains(id, Freshness::kCached)) c->p_.repo.release_claim(id);
    }
  } unreserve{this, id};

  std::shared_ptr<const ModelManifest> parent_manifest;
  if (!parent.empty()) {
    auto pm = p_.models.find(parent);
    if (!pm.ok()) return not_found("parent model '" + parent + "' of '" + id + "' does not exist");
    parent_manifest = *pm;
    // Published by another daemon since this one's last refresh: into the catalog first.
    if (!p_.catalog.contains(parent) && p_.view) (void)p_.view->refresh();
  }

  // Pass 1: validate everything, touching nothing.
  CAIRN_ASSIGN_OR_RETURN(std::vector<Planned> plan,
                         this->plan(s, id, r.tensors, r.inherit_all, parent_manifest.get(), blob));

  // Pass 2: copy inline bytes into the arena (the only step that can still fail before chunks move).
  std::vector<Extent> inline_extents;
  for (auto& p : plan) {
    if (p.source != Planned::kInline) continue;
    auto off = p_.dram.allocate(p.desc.nbytes);
    if (!off.ok()) {
      for (auto& e : inline_extents) p_.dram.release(e.offset, e.length);
      return off.status();
    }
    if (p.desc.nbytes) std::memcpy(p_.dram.base() + *off, blob.data() + p.blob_offset, p.desc.nbytes);
    inline_extents.push_back(Extent{*off, p.desc.nbytes});
  }

  // Where each new tensor's bytes are; the spaces named are consumed from here on.
  std::vector<Extent> tensor_ext(plan.size());
  {
    size_t inline_index = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      const Planned& p = plan[i];
      if (p.source == Planned::kInherit) continue;
      tensor_ext[i] = p.source == Planned::kSpace ? s.staging[p.space] : inline_extents[inline_index++];
      if (p.source == Planned::kSpace) s.staging.erase(p.space);
    }
  }
  // A waited commit at memory is done once registered: it needs no ticket.
  const bool done_when_registered = r.wait && r.durability == Durability::kMemory;
  const uint64_t ticket = r.want_ticket && !done_when_registered ? p_.tickets.create(r.durability) : 0;
  Build build;
  build.id = id;
  build.parent = parent;
  build.parent_manifest = parent_manifest.get();
  build.metadata = std::move(r.metadata);
  build.architecture = std::move(r.architecture);
  build.graph = r.graph ? &*r.graph : nullptr;
  build.parts = {{&plan, &tensor_ext}};
  build.source_header = std::move(r.source_header);
  build.ticket = ticket;
  build.target = r.durability;
  build.acknowledged_early = !r.wait;
  auto registered = build_and_register(std::move(build));
  if (!registered.ok()) return registered.status();
  gc_lock.unlock();

  CommitReply out;
  out.id = id;
  if (!r.wait) {
    // The caller waits later with the ticket; it is forgotten when the connection ends.
    if (ticket) {
      s.tickets.insert(ticket);
      out.ticket = ticket;
    }
    out.reached = Durability::kMemory;
    return out;
  }
  if (done_when_registered) {
    out.reached = Durability::kMemory;
    return out;
  }
  Watchdog::ClientWait waiting;  // for the durability asked for (only the reply follows)
  CAIRN_ASSIGN_OR_RETURN(TicketBook::Outcome t, p_.tickets.wait(ticket, std::chrono::milliseconds(-1)));
  if (!t.error.ok()) return t.error;
  out.reached = t.reached;
  return out;
}

Result<WaitReply> CommitPath::wait(const Wait& r) {
  Watchdog::ClientWait waiting;  // the client asked to wait (only the reply follows)
  CAIRN_ASSIGN_OR_RETURN(TicketBook::Outcome t, p_.tickets.wait(r.ticket, std::chrono::milliseconds(r.timeout_ms)));
  if (!t.done)
    return timed_out("ticket " + std::to_string(r.ticket) + " has reached '" + durability_name(t.reached) + "', not '" +
                     durability_name(t.target) + "', after " + std::to_string(r.timeout_ms) + " ms");
  if (!t.error.ok()) return t.error;
  return WaitReply{t.reached};
}

}  // namespace cairn
