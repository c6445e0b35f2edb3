#include "daemon/flusher.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/log.hpp"

namespace cairn {

namespace {
std::vector<ChunkRef> all_chunks(const ModelManifest& m) {
  std::vector<ChunkRef> out;
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks) out.push_back(c);
  return out;
}
// A repository write failure that may pass (space freed, a device back): worth retrying.
bool may_pass(const Status& st) {
  switch (st.code()) {
    case StatusCode::kNoSpace:
    case StatusCode::kIo:
    case StatusCode::kBusy:
    case StatusCode::kTimeout:
    case StatusCode::kUnavailable:
    // A chunk read wrong from the burst buffer or a pack: the next read may be right (the tier
    // drops a copy it finds wrong every time, and then the write fails for want of it).
    case StatusCode::kCorruption:
      return true;
    default:
      return false;
  }
}
}  // namespace

Flusher::Flusher(Repository& repo, TierManager& tiers, NvmeTier* nvme, TicketBook& tickets, ForgetFailed forget_failed)
    : repo_(repo), tiers_(tiers), nvme_(nvme), tickets_(tickets), forget_failed_(std::move(forget_failed)) {
  local_thread_ = std::thread([this] { local_loop(); });
  global_thread_ = std::thread([this] { global_loop(); });
}

Flusher::~Flusher() { stop(); }

void Flusher::stop() {
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
  }
  local_cv_.notify_all();
  global_cv_.notify_all();
  progress_cv_.notify_all();
  if (local_thread_.joinable()) local_thread_.join();
  if (global_thread_.joinable()) global_thread_.join();
}

Status Flusher::enqueue(Entry entry, const std::function<Status()>& admit) {
  {
    cairn::MutexLock lock(mu_);
    CAIRN_RETURN_IF_ERROR(admit());
    const std::string id = entry.manifest->id;
    Pending p;
    p.manifest = std::move(entry.manifest);
    p.ticket = entry.ticket;
    p.seq = next_seq_++;
    p.needs_local = entry.needs_local;
    p.local_done = !entry.needs_local && entry.on_nvme;  // a recovered model has done its local stage
    p.on_nvme = entry.on_nvme;
    p.retry = entry.retry;
    pending_[id] = p;
    flush_order_.push_back(id);
    if (p.needs_local) local_queue_.push_back(id);
  }
  // Only the stage that has work is woken (a thread woken for nothing takes a core from the
  // committing client on a small node); the local stage wakes the global one when it is done.
  if (entry.needs_local)
    local_cv_.notify_one();
  else
    global_cv_.notify_one();
  return Status::OK();
}

std::shared_ptr<const ModelManifest> Flusher::find(const std::string& id) const {
  cairn::MutexLock lock(mu_);
  auto it = pending_.find(id);
  return it == pending_.end() ? nullptr : it->second.manifest;
}

bool Flusher::contains(const std::string& id) const {
  cairn::MutexLock lock(mu_);
  return pending_.count(id) > 0;
}

std::vector<std::shared_ptr<const ModelManifest>> Flusher::pending() const {
  cairn::MutexLock lock(mu_);
  std::vector<std::shared_ptr<const ModelManifest>> out;
  out.reserve(pending_.size());
  for (const auto& [id, p] : pending_) out.push_back(p.manifest);
  return out;
}

void Flusher::wait_until_flushed(const std::string& id) {
  cairn::MutexLock lock(mu_);
  progress_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !pending_.count(id); });
}

void Flusher::wait_until_descendants_flushed(const std::string& id) {
  cairn::MutexLock lock(mu_);
  auto descends = [&](const Pending& p) CAIRN_REQUIRES(mu_) {
    // Up the chain of pending parents (a parent already in the repository ends it).
    std::string parent = p.manifest->parent;
    for (size_t steps = 0; !parent.empty() && steps <= pending_.size(); ++steps) {
      if (parent == id) return true;
      auto it = pending_.find(parent);
      if (it == pending_.end()) return false;
      parent = it->second.manifest->parent;
    }
    return false;
  };
  progress_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) {
    if (stopping_) return true;
    for (const auto& [pid, p] : pending_)
      if (descends(p)) return false;
    return true;
  });
}

void Flusher::drain() {
  cairn::MutexLock lock(mu_);
  progress_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return pending_.empty(); });
}

bool Flusher::drain_for(std::chrono::milliseconds timeout) {
  cairn::MutexLock lock(mu_);
  return progress_cv_.wait_for(lock, timeout, [&]() CAIRN_REQUIRES(mu_) { return pending_.empty(); });
}

Flusher::Stats Flusher::stats() const {
  cairn::MutexLock lock(mu_);
  Stats s;
  s.pending_models = pending_.size();
  s.repository_bytes_written = bytes_written_;
  s.repository_write_retries = write_retries_;
  for (const auto& [id, p] : pending_) {
    if (p.needs_local && !p.local_done) ++s.awaiting_local;
    if (p.on_nvme) ++s.local_not_global;
  }
  return s;
}

void Flusher::local_loop() {
  // Background work: requests (a commit acknowledged at memory, a read) go first on a busy node.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    std::shared_ptr<const ModelManifest> m;
    uint64_t seq = 0;
    {
      cairn::MutexLock lock(mu_);
      local_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !local_queue_.empty(); });
      if (local_queue_.empty()) return;  // stopping and drained
      const std::string id = local_queue_.front();
      local_queue_.pop_front();
      m = pending_[id].manifest;
      seq = pending_[id].seq;
    }
    // The chunks only DRAM holds go to the burst buffer, then the model's record: after both are on
    // the device the model survives a crash of the daemon. The chunks of the tensor list the last
    // model written here had (a metadata-only child shares its parent's) are there already.
    const bool written = last_local_ && !m->tensors.empty() && m->tensors.shares_with(last_local_->tensors);
    Status st = written ? Status::OK() : tiers_.write_local(all_chunks(*m));
    if (st.ok()) st = nvme_->put_model(seq, m->id, manifest_to_json(*m).dump());
    if (!st.ok())
      CAIRN_LOG_WARN("model '{}': the burst buffer did not take it ({}); it goes to the repository directly", m->id,
                     st.to_string());
    last_local_ = st.ok() ? m : nullptr;
    {
      cairn::MutexLock lock(mu_);
      Pending& p = pending_[m->id];
      p.local_done = true;
      p.on_nvme = st.ok();
      if (st.ok() && p.ticket) tickets_.reach(p.ticket, Durability::kLocal);
    }
    global_cv_.notify_one();  // its model may be ready for the global stage
  }
}

bool Flusher::stored_list(const TensorList& tensors) const {
  return last_stored_ && !tensors.empty() && tensors.shares_with(last_stored_->tensors);
}

void Flusher::abandon_locked(const ModelManifest& m) {
  std::set<ChunkHash> still_needed;
  for (const auto& [id, p] : pending_)
    for (const auto& t : p.manifest->tensors)
      for (const auto& c : t.chunks) still_needed.insert(c.hash);
  std::vector<ChunkRef> unneeded;
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks)
      if (!still_needed.count(c.hash)) unneeded.push_back(c);
  tiers_.abandon(unneeded);
}

void Flusher::global_loop() {
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  constexpr size_t kMaxBatch = 256;                // models per group commit: one log write and one fdatasync
  constexpr uint64_t kMaxBatchBytes = 4ull << 20;  // new chunk bytes per batch (beyond one model)
  // Between attempts to write models whose last write failed (Entry::retry).
  constexpr std::chrono::milliseconds kMinBackoff{50}, kMaxBackoff{5000};
  std::chrono::milliseconds backoff = kMinBackoff;
  for (;;) {
    struct Item {
      std::shared_ptr<const ModelManifest> m;
      uint64_t ticket = 0;
      bool on_nvme = false;
      bool retry = false;
    };
    std::vector<Item> batch;
    {
      // Commit order, so that a parent always reaches the repository before its children; a model
      // still in its local stage holds back the ones after it. Every ready model at the front goes
      // in one batch (the repository writes their records with one sync).
      cairn::MutexLock lock(mu_);
      auto ready = [&]() CAIRN_REQUIRES(mu_) {
        if (flush_order_.empty()) return false;
        const Pending& p = pending_[flush_order_.front()];
        return !p.needs_local || p.local_done;
      };
      global_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return (stopping_ && flush_order_.empty()) || ready(); });
      if (flush_order_.empty()) return;  // stopping and drained
      // A batch pins the bytes it writes until the repository has them: bound them (metadata-only
      // commits cost none), so a batch never crowds readers out of the arena.
      uint64_t batch_bytes = 0;
      while (batch.size() < kMaxBatch && ready()) {
        const std::string id = flush_order_.front();
        const Pending& p = pending_[id];
        uint64_t new_bytes = 0;
        // A tensor list stored already (a metadata-only child shares its parent's), or counted for
        // an earlier model of this batch, brings no new bytes: no chunk needs looking up.
        if (!stored_list(p.manifest->tensors) &&
            (batch.empty() || !p.manifest->tensors.shares_with(batch.back().m->tensors)))
          for (const auto& t : p.manifest->tensors)
            for (const auto& c : t.chunks)
              if (!repo_.locate(c.hash)) new_bytes += c.length;
        if (!batch.empty() && batch_bytes + new_bytes > kMaxBatchBytes) break;
        batch_bytes += new_bytes;
        flush_order_.pop_front();
        batch.push_back({p.manifest, p.ticket, p.on_nvme, p.retry});
      }
    }
    std::vector<ModelManifest> copies;
    copies.reserve(batch.size());
    for (const Item& it : batch) copies.push_back(*it.m);
    std::vector<Status> results;
    std::unordered_map<ChunkHash, uint64_t, ChunkHashHasher> fetched;  // new bytes, by chunk
    {
      TierManager::Source source(tiers_);
      (void)repo_.commit_batch(
          copies,
          [&](const ChunkHash& h, uint64_t length) -> Result<const void*> {
            fetched[h] = length;
            return source.get(h, length);
          },
          &results,
          // The chunks deltas are coded against, where DRAM holds them (a parent usually).
          [&](const ChunkHash& h, uint64_t length) { return source.resident(h, length); });
    }
    // The bytes each model wrote: its chunks that were fetched (the first model to name one pays).
    std::vector<std::string> retried;  // in commit order
    std::unordered_set<std::string> retried_ids;
    for (size_t i = 0; i < batch.size(); ++i) {
      const ModelManifest& copy = copies[i];
      const Status& st = results[i];
      uint64_t new_bytes = 0;
      if (st.ok()) {
        for (const auto& t : copy.tensors)
          for (const auto& c : t.chunks) {
            auto f = fetched.find(c.hash);
            if (f != fetched.end()) {
              new_bytes += f->second;
              fetched.erase(f);
            }
          }
        // The chunks of a list stored before were marked clean then.
        if (!stored_list(batch[i].m->tensors)) tiers_.stored_globally(all_chunks(copy));
        last_stored_ = batch[i].m;
      } else if ((batch[i].retry && may_pass(st)) || (!copy.parent.empty() && retried_ids.count(copy.parent))) {
        // A child whose parent (earlier in this batch) is written again fails for want of the
        // parent: it waits for it, it is not dropped (the torture harness lost acknowledged
        // children this way while repository writes failed). Also a child committed at `global`
        // whose client waits: its failure was the parent's, which is still pending (the
        // 1,000-kill-point run: the client was told the acknowledged parent was not there).
        cairn::MutexLock lock(mu_);
        if (!stopping_) {
          CAIRN_LOG_ERROR("flushing model '{}' to the repository failed: {}; it stays pending and is written again",
                          copy.id, st.to_string());
          retried.push_back(copy.id);
          retried_ids.insert(copy.id);
          ++write_retries_;
          continue;
        }
      }
      if (!st.ok()) CAIRN_LOG_ERROR("flushing model '{}' to the repository failed: {}", copy.id, st.to_string());
      // A failed model's record stays on the burst buffer: the next start recovers it.
      if (batch[i].on_nvme && st.ok()) (void)nvme_->model_done(copy.id);
      {
        cairn::MutexLock lock(mu_);
        bytes_written_ += new_bytes;
        pending_.erase(copy.id);
        if (!st.ok()) {
          // Gone from queries; forgotten unless children (whose flushes fail in turn) name it.
          forget_failed_(copy);
          abandon_locked(copy);
        }
        // Before anyone who saw the model leave pending_ can ask the ticket.
        if (batch[i].ticket) tickets_.finish(batch[i].ticket, st.ok() ? Durability::kGlobal : Durability::kMemory, st);
      }
    }
    if (!retried.empty()) {
      // Back to the front of the queue, in commit order, after a back-off.
      cairn::MutexLock lock(mu_);
      for (auto it = retried.rbegin(); it != retried.rend(); ++it) flush_order_.push_front(*it);
      backoff = std::min(backoff * 2, kMaxBackoff);
      global_cv_.wait_for(lock, backoff, [&]() CAIRN_REQUIRES(mu_) { return stopping_; });
    } else {
      backoff = kMinBackoff;
    }
    progress_cv_.notify_all();
  }
}

}  // namespace cairn
