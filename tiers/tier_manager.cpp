#include "tiers/tier_manager.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/log.hpp"

namespace cairn {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TierManager::TierManager(DramTier& dram, NvmeTier* nvme, Repository& repo, std::unique_ptr<AdmissionPolicy> admission)
    : dram_(dram), nvme_(nvme), repo_(repo), admission_(std::move(admission)) {
  if (!nvme_) return;
  // Demote when less than 1/8 of the arena is free, until 1/4 is: room for a burst of writes or
  // loads without evicting on the request's thread.
  low_water_ = dram_.arena_size() / 8;
  high_water_ = dram_.arena_size() / 4;
  dram_.set_pressure_hook(low_water_, [this] {
    {
      std::lock_guard l(mu_);
      wake_ = true;
    }
    cv_.notify_one();
  });
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

void TierManager::note_cost(const ChunkHash& h, uint64_t bytes, double seconds, bool from_nvme) {
  if (seconds > 0 && bytes >= (64u << 10)) {
    std::atomic<double>& bw = from_nvme ? nvme_bw_ : pfs_bw_;
    double sample = static_cast<double>(bytes) / seconds;
    bw.store(0.8 * bw.load() + 0.2 * sample);
  }
  // Where the chunk would come from once it leaves DRAM.
  const bool below_on_nvme = nvme_ && nvme_->contains(h);
  dram_.hint_refetch_cost(h, static_cast<double>(bytes) / (below_on_nvme ? nvme_bw_.load() : pfs_bw_.load()));
}

Status TierManager::fetch(const ChunkRef& ref, void* dst) {
  if (nvme_ && nvme_->contains(ref.hash)) {
    auto t0 = std::chrono::steady_clock::now();
    Status st = nvme_->read(ref.hash, dst, ref.length);
    if (st.is_ok()) {
      ++nvme_reads_;
      nvme_read_bytes_ += ref.length;
      note_cost(ref.hash, ref.length, seconds_since(t0), true);
      return st;
    }
    if (st.code() == StatusCode::kCorruption) ++nvme_corrupt_;
    // Dropped (corrupt) or evicted meanwhile: the repository has it unless it was dirty.
    CAIRN_LOG_WARN("{}; reading the chunk from the repository instead", st.to_string());
  }
  std::optional<ChunkRef> where = ref.pack.empty() ? repo_.locate(ref.hash) : std::optional<ChunkRef>(ref);
  if (!where) {
    // A recovered model's chunk can have a pack name the repository no longer knows (gc).
    where = repo_.locate(ref.hash);
    if (!where) return corruption("chunk " + ref.hash.hex() + " has no intact copy in any tier");
  }
  auto t0 = std::chrono::steady_clock::now();
  Status st = repo_.read_chunk(*where, dst);
  if (!st.is_ok()) return st;
  ++pfs_reads_;
  pfs_read_bytes_ += ref.length;
  note_cost(ref.hash, ref.length, seconds_since(t0), false);
  return st;
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
  Status st = puts.empty() ? Status::ok() : nvme_->put(puts);
  if (st.is_ok()) {
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

Result<const void*> TierManager::Source::get(const ChunkHash& hash, uint64_t length) {
  bytes_ += length;
  if (auto off = tm_.dram_.pin_if_resident(hash)) {
    pinned_.push_back(hash);
    return static_cast<const void*>(tm_.dram_.base() + *off);
  }
  if (tm_.nvme_) {
    std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[length ? length : 1]);
    if (!buf) return no_space("no memory to stage chunk " + hash.hex() + " for the repository");
    CAIRN_RETURN_IF_ERROR(tm_.nvme_->read(hash, buf.get(), length));
    const void* p = buf.get();
    buffers_.push_back(std::move(buf));
    return p;
  }
  return internal_error("chunk " + hash.hex() + " is neither in DRAM nor in the burst buffer");
}

void TierManager::stored_globally(const std::vector<ChunkRef>& chunks) {
  for (const ChunkRef& c : chunks) {
    if (nvme_) nvme_->mark_clean(c.hash);
    dram_.mark_clean(c.hash);
  }
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
    demote(high_water_);
    l.lock();
  }
}

void TierManager::demote_now() { demote(high_water_); }

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
      c.refetch_cost = static_cast<double>(v->length) / pfs_bw_.load();
      if (!admission_ || admission_->admit(c)) {
        NvmeTier::Put p{v->hash, dram_.base() + v->offset, v->length, false};
        Status st = nvme_->put(std::span<const NvmeTier::Put>(&p, 1));
        written = st.is_ok();
        if (!st.is_ok() && st.code() != StatusCode::kNoSpace)
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
  return {{"reads_from_nvme", nvme_reads_.load()},
          {"bytes_from_nvme", nvme_read_bytes_.load()},
          {"reads_from_repository", pfs_reads_.load()},
          {"bytes_from_repository", pfs_read_bytes_.load()},
          {"nvme_copies_failed_check", nvme_corrupt_.load()},
          {"demoted_chunks", demoted_.load()},
          {"demoted_bytes", demoted_bytes_.load()},
          {"evicted_already_on_nvme", evicted_on_nvme_.load()},
          {"dropped_to_repository_only", dropped_.load()},
          {"local_writes", local_writes_.load()},
          {"local_write_bytes", local_write_bytes_.load()},
          {"nvme_read_bandwidth", nvme_bw_.load()},
          {"repository_read_bandwidth", pfs_bw_.load()}};
}

}  // namespace cairn
