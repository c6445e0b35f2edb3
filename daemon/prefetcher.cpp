#include "daemon/prefetcher.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/log.hpp"
#include "daemon/trace_recorder.hpp"

namespace cairn {

using nlohmann::json;

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Prefetcher::Prefetcher(Parts parts) : p_(std::move(parts)), reserve_(p_.dram.arena_size() / 8) {}

void Prefetcher::start(Reads& reads) {
  reads_ = &reads;
  thread_ = std::thread([this] { loop(); });
}

Prefetcher::~Prefetcher() { stop(); }

void Prefetcher::stop() {
  {
    cairn::MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  idle_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::idle() {
  cairn::MutexLock lock(mu_);
  idle_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || (queue_.empty() && !busy_); });
}

std::vector<std::string> Prefetcher::for_chunks(const std::vector<std::string>& ids,
                                                const std::function<void(const ChunkRef&)>& fn,
                                                const std::vector<std::string>& tensors) {
  std::vector<std::string> unknown;
  const std::set<std::string> only(tensors.begin(), tensors.end());
  for (const std::string& id : ids) {
    auto m = p_.models.find(id);
    if (!m.ok()) {
      unknown.push_back(id);
      continue;
    }
    for (const TensorManifest& t : (*m)->tensors) {
      if (!only.empty() && !only.count(t.name)) continue;
      for (const ChunkRef& c : t.chunks) fn(c);
    }
  }
  return unknown;
}

void Prefetcher::enqueue(Job job) {
  if (p_.mode == "none") return;
  {
    cairn::MutexLock lock(mu_);
    if (stopping_) return;
    // Advice, bounded: past kMaxQueued jobs the oldest is dropped (a newer hint knows better).
    if (queue_.size() >= kMaxQueued) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

// One scoring function for DRAM and NVMe: each tier's policy instance gets the same hint terms.
void Prefetcher::hint_expected_use(const ChunkHash& hash, double seconds) {
  p_.dram.hint_expected_use(hash, seconds);
  if (p_.nvme) p_.nvme->hint_expected_use(hash, seconds);
}

void Prefetcher::hint_population(const ChunkHash& hash, bool member, double parent_chance) {
  p_.dram.hint_population(hash, member, parent_chance);
  if (p_.nvme) p_.nvme->hint_population(hash, member, parent_chance);
}

void Prefetcher::hint_done(const ChunkHash& hash) {
  p_.dram.hint_done(hash);
  if (p_.nvme) p_.nvme->hint_done(hash);
}

// DRAM only: the cycle is in what DRAM holds (the burst buffer's policy has no reads to cycle on).
void Prefetcher::apply_cycles_locked(const ReadCycles::Change& change) {
  for (const ChunkHash& h : change.unmark) p_.dram.hint_cyclic(h, false);
  for (const ChunkHash& h : change.mark) p_.dram.hint_cyclic(h, true);
}

std::vector<std::string> Prefetcher::apply_parent_chances(const std::vector<std::string>& members,
                                                          const std::vector<double>& chances) {
  std::vector<double> share;
  {
    cairn::MutexLock lock(mu_);
    share.resize(reads_at_.size());
    for (size_t j = 0; j < reads_at_.size(); ++j)
      share[j] = static_cast<double>(reads_at_[j]) / static_cast<double>(loads_);
  }
  const bool learned = !share.empty();
  // A chunk's chance sums over the members (each is one possible parent: the events are disjoint).
  std::unordered_map<ChunkHash, double, ChunkHashHasher> chance;
  std::vector<ChunkHash> order;  // first use, so that the tiers see chunks in model order
  std::vector<std::string> unknown;
  for (size_t i = 0; i < members.size() && i < chances.size(); ++i) {
    std::unordered_set<ChunkHash, ChunkHashHasher> seen;  // a chunk twice in one model counts once
    size_t position = 0;
    auto u = for_chunks({members[i]}, [&](const ChunkRef& c) {
      const size_t j = position++;
      if (!seen.insert(c.hash).second) return;
      const double q = !learned ? 1.0 : j < share.size() ? share[j] : 0.0;
      auto [it, fresh] = chance.try_emplace(c.hash, 0.0);
      if (fresh) order.push_back(c.hash);
      it->second += chances[i] * q;
    });
    unknown.insert(unknown.end(), u.begin(), u.end());
  }
  for (const ChunkHash& c : order) hint_population(c, true, std::min(1.0, chance[c]));
  return unknown;
}

void Prefetcher::committed(const ModelManifest& m) {
  std::vector<std::string> members;
  std::vector<double> chances;
  {
    cairn::MutexLock lock(mu_);
    if (std::find(scored_members_.begin(), scored_members_.end(), m.id) == scored_members_.end()) return;
    members = scored_members_;
    chances = member_chances_;
  }
  (void)apply_parent_chances(members, chances);
}

void Prefetcher::retired(const std::string& id) {
  cairn::MutexLock lock(cycles_mu_);
  apply_cycles_locked(cycles_.forget(id));
}

Result<json> Prefetcher::hint(const Hint& h) {
  // A will_load scoped to tensors is recorded chunk by chunk below (a replay must expect exactly
  // those chunks); every other hint as one line.
  const bool scoped = h.kind == Hint::Kind::kWillLoad && !h.tensors.empty();
  if (p_.trace && !scoped) p_.trace->hint(h);
  std::vector<std::string> unknown;
  size_t queued = 0;
  switch (h.kind) {
    case Hint::Kind::kWillLoad: {
      // The expectation covers the named tensors only: a child that loads its parent's first layers
      // must not make the whole parent outrank everything else.
      for (const std::string& id : h.models) {
        auto u = for_chunks(
            {id},
            [&](const ChunkRef& c) {
              hint_expected_use(c.hash, h.when_s);
              if (p_.trace && scoped) p_.trace->expect(id, c.hash, c.length, h.when_s);
            },
            h.tensors);
        unknown.insert(unknown.end(), u.begin(), u.end());
      }
      for (const std::string& id : h.models) {
        if (std::find(unknown.begin(), unknown.end(), id) != unknown.end()) continue;
        enqueue(Job{id, h.tensors, "will_load", h.hbm});
        ++queued;
      }
      break;
    }
    case Hint::Kind::kPopulation: {
      std::set<std::string> now(h.models.begin(), h.models.end()), before;
      {
        cairn::MutexLock lock(mu_);
        before.swap(population_);
        population_ = now;
        scored_members_ = h.parent_chance.empty() ? std::vector<std::string>{} : h.models;
        member_chances_ = h.parent_chance;
      }
      std::vector<std::string> left;
      for (const auto& id : before)
        if (!now.count(id)) left.push_back(id);
      const double unknown_chance = std::numeric_limits<double>::quiet_NaN();
      (void)for_chunks(left, [&](const ChunkRef& c) { hint_population(c.hash, false, unknown_chance); });
      if (h.parent_chance.empty()) {
        unknown = for_chunks(h.models, [&](const ChunkRef& c) { hint_population(c.hash, true, unknown_chance); });
        break;
      }
      unknown = apply_parent_chances(h.models, h.parent_chance);
      break;
    }
    case Hint::Kind::kSequence: {
      // Expected use by position: the k-th next model is needed after the k-1 before it.
      size_t k = 0;
      for (const std::string& id : h.models) {
        const double when = static_cast<double>(k++);
        for (auto& u : for_chunks({id}, [&](const ChunkRef& c) { hint_expected_use(c.hash, when); }))
          unknown.push_back(std::move(u));
      }
      std::vector<Job> first;
      {
        cairn::MutexLock lock(mu_);
        sequence_ = h.models;
        ahead_ = h.ahead;
        sequence_next_ = std::min<size_t>(h.ahead, sequence_.size());
        for (size_t i = 0; i < sequence_next_; ++i) first.push_back(Job{sequence_[i], {}, "sequence"});
      }
      for (auto& j : first) {
        enqueue(std::move(j));
        ++queued;
      }
      break;
    }
    case Hint::Kind::kDone: {
      // Chunks a live population model still uses are kept.
      std::set<std::string> population;
      {
        cairn::MutexLock lock(mu_);
        population = population_;
      }
      {
        // A model declared done is not read in a cycle any more.
        cairn::MutexLock lock(cycles_mu_);
        for (const std::string& id : h.models) apply_cycles_locked(cycles_.forget(id));
      }
      std::unordered_set<ChunkHash, ChunkHashHasher> keep;
      (void)for_chunks(std::vector<std::string>(population.begin(), population.end()),
                       [&](const ChunkRef& c) { keep.insert(c.hash); });
      unknown = for_chunks(h.models, [&](const ChunkRef& c) {
        if (!keep.count(c.hash)) hint_done(c.hash);
      });
      break;
    }
  }
  {
    cairn::MutexLock lock(mu_);
    ++hints_;
    unknown_ += unknown.size();
  }
  if (!unknown.empty() && h.kind == Hint::Kind::kPopulation && !h.parent_chance.empty())
    CAIRN_LOG_INFO(
        "hint 'population': {} of {} members do not exist yet (first: '{}'); each takes the hint "
        "when it is committed",
        unknown.size(), h.models.size(), unknown.front().substr(0, 80));
  else if (!unknown.empty())
    CAIRN_LOG_WARN("hint '{}': {} of {} models do not exist (first: '{}'); the hint applies to the others",
                   hint_kind_name(h.kind), unknown.size(), h.models.size(), unknown.front().substr(0, 80));
  return json{{"kind", hint_kind_name(h.kind)},
              {"models", h.models.size() - unknown.size()},
              {"unknown", unknown},
              {"queued", queued}};
}

void Prefetcher::opened(const ModelManifest& m) {
  if (p_.mode != "lineage" || m.parent.empty()) return;
  // The parent of what is being read is the likeliest next read in a search (its siblings derive
  // from it); stage what it does not share with m.
  enqueue(Job{m.parent, {}, "ancestor"});
}

void Prefetcher::matched(const std::string& model, const std::vector<std::string>& tensors) {
  if (p_.mode != "lineage" || tensors.empty()) return;
  enqueue(Job{model, tensors, "match"});
}

void Prefetcher::leased(const ModelManifest& m, const std::vector<const TensorManifest*>& tensors,
                        const LeasedRead& read) {
  {
    // A model read again after its chunks left DRAM is read in a cycle that does not fit.
    cairn::MutexLock lock(cycles_mu_);
    apply_cycles_locked(cycles_.read(m, tensors, read.loaded, read.started_ns, steady_ns()));
  }
  {
    // One more load: which positions of the model (chunk indexes in manifest order) it read.
    std::unordered_set<const TensorManifest*> leased_tensors(tensors.begin(), tensors.end());
    cairn::MutexLock lock(mu_);
    size_t position = 0;
    for (const TensorManifest& t : m.tensors) {
      if (leased_tensors.count(&t)) {
        if (reads_at_.size() < position + t.chunks.size()) reads_at_.resize(position + t.chunks.size(), 0);
        for (size_t k = 0; k < t.chunks.size(); ++k) ++reads_at_[position + k];
      }
      position += t.chunks.size();
    }
    ++loads_;
  }
  // Each chunk read fulfils one announced read of it (a later reader's announcement stays).
  for (const TensorManifest* t : tensors)
    for (const ChunkRef& c : t->chunks) p_.dram.hint_read(c.hash);
  std::vector<Job> next;
  {
    cairn::MutexLock lock(mu_);
    if (!staged_.empty())
      for (const TensorManifest* t : tensors)
        for (const ChunkRef& c : t->chunks)
          if (auto it = staged_.find(c.hash); it != staged_.end()) {
            ++chunks_used_;
            staged_bytes_ -= std::min(staged_bytes_, it->second);
            staged_.erase(it);
          }
    // A read of the sequence's i-th model: keep `ahead` models staged beyond it.
    for (size_t i = 0; i < sequence_.size(); ++i) {
      if (sequence_[i] != m.id) continue;
      const size_t want = std::min(sequence_.size(), i + 1 + ahead_);
      for (; sequence_next_ < want; ++sequence_next_) next.push_back(Job{sequence_[sequence_next_], {}, "sequence"});
      break;
    }
  }
  for (auto& j : next) enqueue(std::move(j));
}

void Prefetcher::loop() {
  // Below every request: a prefetch must never slow a demand read.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    Job job;
    {
      cairn::MutexLock lock(mu_);
      busy_ = false;
      idle_cv_.notify_all();
      cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      ++jobs_;
    }
    stage(job);
  }
}

void Prefetcher::stage(const Job& job) {
  auto m = p_.models.find(job.model);
  if (!m.ok()) return;  // gone since the hint (retired and collected): nothing to do
  for (const TensorManifest& t : (*m)->tensors) {
    if (!job.tensors.empty() && std::find(job.tensors.begin(), job.tensors.end(), t.name) == job.tensors.end())
      continue;
    std::vector<const ChunkRef*> missing;
    uint64_t missing_bytes = 0;
    for (const ChunkRef& c : t.chunks)
      if (!p_.dram.offset_of(c.hash)) missing.push_back(&c), missing_bytes += c.length;
    if (missing.empty()) continue;
    {
      cairn::MutexLock lock(mu_);
      if (stopping_) return;
      if (staged_bytes_ + missing_bytes > p_.budget) prune_locked();
      if (staged_bytes_ + missing_bytes > p_.budget || p_.dram.free_bytes() < missing_bytes + reserve_) {
        ++skipped_budget_;
        continue;
      }
    }
    Status st = reads_->stage(job.model, t);
    cairn::MutexLock lock(mu_);
    if (!st.ok()) {
      ++failures_;
      CAIRN_LOG_WARN("prefetch of model '{}' ({}): {}", job.model, job.reason, st.to_string());
      continue;
    }
    for (const ChunkRef* c : missing)
      if (staged_.emplace(c->hash, c->length).second) {
        ++chunks_staged_;
        bytes_staged_ += c->length;
        staged_bytes_ += c->length;
      }
  }
  if (job.hbm) stage_device(**m, job);
}

void Prefetcher::stage_device(const ModelManifest& m, const Job& job) {
  // Into the HBM tier of the daemon's first device, from DRAM (where the loop above put them).
  // Advice: without an HBM tier, or with its pool held, nothing happens but a count.
  for (const TensorManifest& t : m.tensors) {
    if (!job.tensors.empty() && std::find(job.tensors.begin(), job.tensors.end(), t.name) == job.tensors.end())
      continue;
    Status st = reads_->stage_device(m.id, t);
    cairn::MutexLock lock(mu_);
    if (st.ok())
      ++tensors_to_hbm_;
    else
      ++hbm_skipped_;
  }
}

void Prefetcher::prune_locked() {
  // A staged chunk that left DRAM before any read used it was wasted bandwidth.
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (p_.dram.offset_of(it->first)) {
      ++it;
      continue;
    }
    ++chunks_wasted_;
    staged_bytes_ -= std::min(staged_bytes_, it->second);
    it = staged_.erase(it);
  }
}

json Prefetcher::stats() {
  size_t cyclic_models = 0;
  uint64_t cycles_found = 0;
  {
    cairn::MutexLock lock(cycles_mu_);
    apply_cycles_locked(cycles_.expire(steady_ns()));
    cyclic_models = cycles_.cyclic_models();
    cycles_found = cycles_.found();
  }
  cairn::MutexLock lock(mu_);
  prune_locked();
  return json{{"mode", p_.mode},
              {"budget_bytes", p_.budget},
              {"hints", hints_},
              {"unknown_models", unknown_},
              {"jobs", jobs_},
              {"queued", queue_.size()},
              {"chunks_staged", chunks_staged_},
              {"bytes_staged", bytes_staged_},
              {"chunks_used", chunks_used_},
              {"chunks_wasted", chunks_wasted_},
              {"chunks_unread", staged_.size()},
              {"bytes_unread", staged_bytes_},
              {"skipped_for_budget", skipped_budget_},
              {"dropped_jobs", dropped_},
              {"failures", failures_},
              {"tensors_to_hbm", tensors_to_hbm_},
              {"hbm_skipped", hbm_skipped_},
              {"cyclic_models", cyclic_models},
              {"cycles_found", cycles_found}};
}

}  // namespace cairn
