#include "tiers/tier_manager.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/log.hpp"
#include "tiers/chunk_sources.hpp"

namespace cairn {

TierManager::TierManager(DramTier& dram, NvmeTier* nvme, Repository& repo, std::unique_ptr<AdmissionPolicy> admission,
                         std::unique_ptr<ChunkSource> before_repository)
    : dram_(dram), nvme_(nvme), repo_(repo), admission_(std::move(admission)) {
  auto repository = std::make_unique<RepositorySource>(repo_, &dram_);
  repository_source_ = repository.get();
  add_source(std::move(repository), 0);
  if (before_repository) add_source(std::move(before_repository), 0);
  if (!nvme_) return;
  auto burst_buffer = std::make_unique<NvmeSource>(*nvme_);
  nvme_source_ = burst_buffer.get();
  add_source(std::move(burst_buffer), 0);
  // Demote when less than 1/8 of the arena is free, until 1/4 is: room for a burst of writes or
  // loads without evicting on the request's thread.
  low_water_ = dram_.arena_size() / 8;
  high_water_ = dram_.arena_size() / 4;
  target_ = high_water_;
  dram_.set_pressure_hook(low_water_, [this] { wake_demoter(); });
  demoter_ = std::thread([this] { demoter_loop(); });
}

TierManager::~TierManager() {
  if (nvme_) dram_.set_pressure_hook(0, nullptr);
  {
    std::lock_guard l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (demoter_.joinable()) demoter_.join();
}

bool TierManager::only_in_dram(const ChunkHash& hash) const {
  if (repo_.locate(hash)) return false;
  return !(nvme_ && nvme_->is_dirty(hash));
}

void TierManager::add_source(std::unique_ptr<ChunkSource> source, size_t position) {
  SourceSlot slot{std::move(source), std::make_unique<std::atomic<uint64_t>[]>(3)};
  position = std::min(position, sources_.size());
  sources_.insert(sources_.begin() + static_cast<std::ptrdiff_t>(position), std::move(slot));
}

std::vector<std::string> TierManager::source_names() const {
  std::vector<std::string> out;
  for (const auto& s : sources_) out.push_back(s.source->name());
  return out;
}

void TierManager::note_cost(const ChunkRef& ref) {
  // Where the chunk would come from once it leaves DRAM: the first source that has it (the last
  // resort when none does yet).
  const ChunkSource* below = sources_.back().source.get();
  for (const auto& s : sources_)
    if (s.source->has(ref)) {
      below = s.source.get();
      break;
    }
  dram_.hint_refetch_cost(ref.hash, below->cost(ref.length));
}

Status TierManager::fetch(const ChunkRef& ref, void* dst, const char** source) {
  for (size_t i = 0; i < sources_.size(); ++i) {
    SourceSlot& slot = sources_[i];
    const bool last = i + 1 == sources_.size();
    if (!last && !slot.source->has(ref)) continue;
    Status st = slot.source->read(ref, dst);
    if (st.ok()) {
      ++slot.counters[0];
      slot.counters[1] += ref.length;
      note_cost(ref);
      if (source) *source = slot.source->name().c_str();
      return st;
    }
    if (st.code() == StatusCode::kCorruption) ++slot.counters[2];
    if (last) return st;
    // Dropped (corrupt) or evicted meanwhile: a source further down has it unless it was dirty.
    // kNotFound is a source declining without a fault (the peer group's directory saying "read it
    // from the repository yourself"): no warning.
    if (st.code() != StatusCode::kNotFound)
      CAIRN_LOG_WARN("{}; reading the chunk from the next source instead", st.to_string());
  }
  return corruption("chunk " + ref.hash.hex() + " has no intact copy in any tier");
}

void TierManager::readahead(std::span<const ChunkRef* const> refs) {
  std::vector<std::vector<const ChunkRef*>> per_source(sources_.size());
  for (const ChunkRef* c : refs) {
    if (dram_.offset_of(c->hash)) continue;
    for (size_t i = 0; i < sources_.size(); ++i)
      if (sources_[i].source->has(*c)) {
        per_source[i].push_back(c);
        break;
      }
  }
  for (size_t i = 0; i < sources_.size(); ++i)
    if (!per_source[i].empty()) sources_[i].source->will_read(per_source[i]);
}

Status TierManager::write_local(const std::vector<ChunkRef>& chunks) {
  std::vector<NvmeTier::Put> puts;
  std::vector<ChunkHash> pinned;
  for (const ChunkRef& c : chunks) {
    if (!only_in_dram(c.hash)) continue;
    auto off = dram_.pin_if_resident(c.hash);
    if (!off) continue;  // not in DRAM: it is below already (dirty chunks never leave DRAM)
    pinned.push_back(c.hash);
    puts.push_back(NvmeTier::Put{c.hash, dram_.base() + *off, c.length, true});
  }
  Status st = puts.empty() ? Status::OK() : nvme_->put(puts);
  if (st.ok()) {
    for (const auto& p : puts) {
      dram_.mark_clean(p.hash);
      ++local_writes_;
      local_write_bytes_ += p.length;
    }
  }
  for (const auto& h : pinned) dram_.unpin(h);
  return st;
}

TierManager::Source::~Source() {
  for (const auto& h : pinned_) tm_.dram_.unpin(h);
}

Result<const void*> TierManager::Source::resident(const ChunkHash& hash, uint64_t length) {
  uint64_t held = 0;
  if (auto off = tm_.dram_.pin_if_resident(hash, &held)) {
    pinned_.push_back(hash);
    if (held >= length) return static_cast<const void*>(tm_.dram_.base() + *off);
  }
  return not_found("chunk " + hash.hex() + " is not in DRAM");
}

Result<const void*> TierManager::Source::get(const ChunkHash& hash, uint64_t length) {
  bytes_ += length;
  if (auto off = tm_.dram_.pin_if_resident(hash)) {
    pinned_.push_back(hash);
    return static_cast<const void*>(tm_.dram_.base() + *off);
  }
  // Sources besides the burst buffer and the repository: a peer group's.
  const bool others = tm_.sources_.size() > (tm_.nvme_ ? 2u : 1u);
  if (tm_.nvme_ && (!others || tm_.nvme_->contains(hash))) {
    std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[length ? length : 1]);
    if (!buf) return no_space("no memory to stage chunk " + hash.hex() + " for the repository");
    CAIRN_RETURN_IF_ERROR(tm_.nvme_->read(hash, buf.get(), length));
    const void* p = buf.get();
    buffers_.push_back(std::move(buf));
    return p;
  }
  // Only another source has it: a peer (a part of a model assembled across the peer group, held
  // where it was written). Read into DRAM as a read would, and pinned like the others.
  if (others) {
    const ChunkRef ref{hash, length, {}, 0};
    for (;;) {
      auto c = tm_.dram_.claim(hash);
      if (c.kind == DramTier::ClaimKind::kResident) {
        pinned_.push_back(hash);
        return static_cast<const void*>(tm_.dram_.base() + c.offset);
      }
      if (c.kind == DramTier::ClaimKind::kLoading) {
        if (auto off = tm_.dram_.wait_pin(hash)) {
          pinned_.push_back(hash);
          return static_cast<const void*>(tm_.dram_.base() + *off);
        }
        continue;  // that load failed: try ourselves
      }
      auto off = tm_.dram_.allocate(length);
      Status st = off.ok() ? tm_.fetch(ref, tm_.dram_.base() + *off) : off.status();
      if (!st.ok()) {
        if (off.ok()) tm_.dram_.release(*off, length);
        tm_.dram_.abort_load(hash);
        return st.with_context("chunk " + hash.hex() +
                               " is neither in DRAM nor in the burst buffer, nor could it be fetched");
      }
      tm_.dram_.finish_load(hash, *off, length);
      pinned_.push_back(hash);
      return static_cast<const void*>(tm_.dram_.base() + *off);
    }
  }
  return internal_error("chunk " + hash.hex() + " is neither in DRAM nor in the burst buffer");
}

void TierManager::stored_globally(const std::vector<ChunkRef>& chunks) {
  for (const ChunkRef& c : chunks) {
    if (nvme_) nvme_->mark_clean(c.hash);
    dram_.mark_clean(c.hash);
  }
}

void TierManager::abandon(const std::vector<ChunkRef>& chunks) {
  for (const ChunkRef& c : chunks) {
    if (repo_.locate(c.hash)) continue;
    dram_.mark_clean(c.hash);
    if (nvme_) nvme_->remove(c.hash);
  }
}

void TierManager::wake_demoter() {
  {
    std::lock_guard l(mu_);
    wake_ = true;
  }
  cv_.notify_one();
}

void TierManager::note_commit(uint64_t bytes) {
  if (!nvme_) return;
  uint64_t target;
  {
    std::lock_guard l(mu_);
    recent_commits_[recent_next_] = bytes;
    recent_next_ = (recent_next_ + 1) % kRecentCommits;
    uint64_t largest = 0;
    for (uint64_t b : recent_commits_) largest = std::max(largest, b);
    // Room for the next commit and the usual margin above it, but never more than half the arena:
    // what stays is the cache the reads hit.
    target = std::max(high_water_, std::min(dram_.arena_size() / 2, largest + high_water_));
    target_ = target;
  }
  if (dram_.free_bytes() < target) wake_demoter();
}

void TierManager::demoter_loop() {
  // Background work: requests come first on a busy node.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  std::unique_lock l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || wake_; });
    if (stop_) return;
    wake_ = false;
    l.unlock();
    demote(target_.load());
    l.lock();
  }
}

void TierManager::demote(uint64_t target_free) {
  std::lock_guard one(demote_mu_);
  while (dram_.free_bytes() < target_free) {
    auto v = dram_.take_victim();
    if (!v) return;
    // A clean DRAM chunk is in the repository or dirty on NVMe; write it down only if NVMe lacks it
    // and the admission policy wants it there.
    bool written = false;
    const bool below = nvme_ && nvme_->contains(v->hash);
    if (nvme_ && !below) {
      AdmissionPolicy::Candidate c;
      c.bytes = v->length;
      c.accesses = v->accesses;
      c.references = v->references;
      c.refetch_cost = repository_source_->cost(v->length);
      if (!admission_ || admission_->admit(c)) {
        NvmeTier::Put p{v->hash, dram_.base() + v->offset, v->length, false};
        Status st = nvme_->put(std::span<const NvmeTier::Put>(&p, 1));
        written = st.ok();
        if (!st.ok() && st.code() != StatusCode::kNoSpace)
          CAIRN_LOG_WARN("demoting chunk {} to the burst buffer failed: {}", v->hash.hex(), st.to_string());
      }
    }
    if (written) {
      ++demoted_;
      demoted_bytes_ += v->length;
    } else if (below) {
      ++evicted_on_nvme_;
    } else {
      ++dropped_;  // only the repository has it now
    }
    dram_.finish_demotion(v->hash);
  }
}

nlohmann::json TierManager::stats() const {
  nlohmann::json out{
      {"demotion_target_bytes", target_.load()},       {"demoted_chunks", demoted_.load()},
      {"demoted_bytes", demoted_bytes_.load()},        {"evicted_already_on_nvme", evicted_on_nvme_.load()},
      {"dropped_to_repository_only", dropped_.load()}, {"local_writes", local_writes_.load()},
      {"local_write_bytes", local_write_bytes_.load()}};
  // Per source: reads served, bytes read, copies that failed their check; the learnt bandwidth.
  for (const auto& s : sources_) {
    const std::string& n = s.source->name();
    out["reads_from_" + n] = s.counters[0].load();
    out["bytes_from_" + n] = s.counters[1].load();
    out[n + "_copies_failed_check"] = s.counters[2].load();
    constexpr uint64_t kGB = 1000000000;
    out[n + "_read_bandwidth"] = static_cast<double>(kGB) / s.source->cost(kGB);  // bytes/s
  }
  // A daemon without a burst buffer reports its counters as zero (clients read them unconditionally).
  for (const char* k : {"reads_from_nvme", "bytes_from_nvme", "nvme_copies_failed_check", "nvme_read_bandwidth"})
    if (!out.contains(k)) out[k] = 0;
  return out;
}

}  // namespace cairn
