#include "tiers/dram/dram_tier.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "core/log.hpp"
#include "policy/hint_policy.hpp"

namespace cairn {

Result<std::unique_ptr<DramTier>> DramTier::create(uint64_t capacity, std::unique_ptr<EvictionPolicy> policy,
                                                   const std::string& name,
                                                   std::chrono::milliseconds backpressure_timeout) {
  CAIRN_ASSIGN_OR_RETURN(auto arena, SharedArena::create(capacity, name));
  CAIRN_LOG_INFO("DRAM arena: {} bytes, {}", arena->capacity(), arena->pages());
  return std::unique_ptr<DramTier>(new DramTier(std::move(arena), std::move(policy), backpressure_timeout));
}

DramTier::DramTier(std::unique_ptr<SharedArena> arena, std::unique_ptr<EvictionPolicy> policy,
                   std::chrono::milliseconds backpressure_timeout)
    : arena_(std::move(arena)),
      backpressure_timeout_(backpressure_timeout),
      alloc_(arena_->capacity(), 4096),
      policy_(std::move(policy)) {
  prefault_ = std::thread([this] {
    constexpr uint64_t kStep = 64ull << 20;
    for (uint64_t off = 0; off < arena_->capacity() && !stop_prefault_; off += kStep) {
      uint64_t n = std::min(kStep, arena_->capacity() - off);
      if (::madvise(arena_->base() + off, n, kMadvPopulateWrite) != 0) break;  // EINVAL before Linux 5.14: lazily
      prefaulted_ += n;
    }
    prefault_done_ = true;
  });
}

DramTier::~DramTier() {
  stop_prefault_ = true;
  if (prefault_.joinable()) prefault_.join();
}

bool DramTier::evict_one_locked() {
  auto victim = policy_->pick_victim([this](const ChunkHash& h) CAIRN_REQUIRES(mu_) {
    auto it = chunks_.find(h);
    return it != chunks_.end() && it->second.pins == 0 && !it->second.dirty;
  });
  if (!victim) return false;
  auto it = chunks_.find(*victim);
  alloc_.free(it->second.offset, it->second.length);
  bytes_out_ += it->second.length;
  chunk_bytes_ -= it->second.length;
  chunks_.erase(it);
  policy_->remove(*victim);
  if (residency_hook_) residency_hook_(*victim, false);
  return true;
}

Result<uint64_t> DramTier::allocate(uint64_t nbytes) {
  cairn::MutexLock lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + backpressure_timeout_;
  bool waited = false;
  for (;;) {
    if (auto off = alloc_.allocate(nbytes)) {
      bool pressure = pressure_hook_ && alloc_.free_bytes() < low_water_;
      auto hook = pressure ? pressure_hook_ : nullptr;
      lock.unlock();
      if (hook) hook();
      return *off;
    }
    if (evict_one_locked()) continue;
    if (dirty_bytes_ > 0 && backpressure_timeout_.count() > 0 && nbytes <= alloc_.capacity()) {
      // Dirty chunks become clean as the flusher writes them down: wait for it (back-pressure).
      if (!waited) ++backpressure_waits_;
      waited = true;
      if (pressure_hook_) {
        auto hook = pressure_hook_;
        lock.unlock();
        hook();
        lock.lock();
      }
      if (space_cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
      if (auto off = alloc_.allocate(nbytes)) return *off;
      if (evict_one_locked()) continue;
      return no_space("the DRAM arena could not make room for " + std::to_string(nbytes) + " bytes within " +
                      std::to_string(backpressure_timeout_.count()) + " ms: " + std::to_string(dirty_bytes_) +
                      " bytes are still waiting to be written to a lower tier (the disks are slower than the "
                      "writers; raise tiers.dram.capacity or commit less often)");
    }
    {
      return no_space("the DRAM arena cannot hold " + std::to_string(nbytes) +
                      " more bytes: " + std::to_string(alloc_.used()) + " of " + std::to_string(alloc_.capacity()) +
                      " bytes are pinned by readers, dirty, or held by named tensors and open writes "
                      "(raise tiers.dram.capacity, or release readers)");
    }
  }
}

void DramTier::release(uint64_t offset, uint64_t nbytes) {
  {
    cairn::MutexLock lock(mu_);
    alloc_.free(offset, nbytes);
  }
  space_cv_.notify_all();
}

void DramTier::set_pressure_hook(uint64_t low_water, std::function<void()> hook) {
  cairn::MutexLock lock(mu_);
  low_water_ = low_water;
  pressure_hook_ = std::move(hook);
}

uint64_t DramTier::free_bytes() const {
  cairn::MutexLock lock(mu_);
  return alloc_.free_bytes();
}

std::optional<DramTier::Victim> DramTier::take_victim() {
  cairn::MutexLock lock(mu_);
  auto victim = policy_->pick_victim([this](const ChunkHash& h) CAIRN_REQUIRES(mu_) {
    auto it = chunks_.find(h);
    return it != chunks_.end() && it->second.pins == 0 && !it->second.dirty;
  });
  if (!victim) return std::nullopt;
  Resident& r = chunks_.at(*victim);
  ++r.pins;
  return Victim{*victim, r.offset, r.length, r.accesses, r.references};
}

void DramTier::finish_demotion(const ChunkHash& hash) {
  {
    cairn::MutexLock lock(mu_);
    auto it = chunks_.find(hash);
    if (it == chunks_.end()) return;
    if (--it->second.pins > 0 || it->second.dirty) return;
    alloc_.free(it->second.offset, it->second.length);
    bytes_out_ += it->second.length;
    chunk_bytes_ -= it->second.length;
    chunks_.erase(it);
    policy_->remove(hash);
    if (residency_hook_) residency_hook_(hash, false);
  }
  space_cv_.notify_all();
}

std::optional<uint64_t> DramTier::pin_if_resident(const ChunkHash& hash, uint64_t* length) {
  cairn::MutexLock lock(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return std::nullopt;
  ++it->second.pins;
  if (length) *length = it->second.length;
  return it->second.offset;
}

void DramTier::hint_references(const ChunkHash& hash, uint32_t live_models) {
  cairn::MutexLock lock(mu_);
  if (auto it = chunks_.find(hash); it != chunks_.end()) it->second.references = live_models;
  policy_->set_references(hash, live_models);
}

void DramTier::hint_refetch_cost(const ChunkHash& hash, double seconds) {
  cairn::MutexLock lock(mu_);
  policy_->set_refetch_cost(hash, seconds);
}

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// Announced reads overdue by more than the policy's default grace are dropped, as the policy does.
const double kExpectedGraceS = HintAwarePolicy::Options{}.expected_use_grace_s;
}  // namespace

void DramTier::hint_expected_use(const ChunkHash& hash, double seconds) {
  cairn::MutexLock lock(mu_);
  auto it = hint_entry_locked(hash);
  std::vector<int64_t>& at = it->second.expected_at_ns;
  if (std::isfinite(seconds)) {
    const int64_t when = add_seconds_ns(steady_ns(), std::max(0.0, seconds));
    at.insert(std::upper_bound(at.begin(), at.end(), when), when);
    // A flood of hints naming one chunk keeps its soonest reads only (each entry is 8 bytes).
    constexpr size_t kMaxAnnounced = 64;
    if (at.size() > kMaxAnnounced) at.resize(kMaxAnnounced);
  } else {
    at.clear();
  }
  pass_expected_locked(hash, it->second);
  prune_hint_locked(it);
}

void DramTier::hint_read(const ChunkHash& hash) {
  cairn::MutexLock lock(mu_);
  auto it = hinted_.find(hash);
  if (it == hinted_.end() || it->second.expected_at_ns.empty()) return;
  it->second.expected_at_ns.erase(it->second.expected_at_ns.begin());
  pass_expected_locked(hash, it->second);
  prune_hint_locked(it);
}

void DramTier::pass_expected_locked(const ChunkHash& hash, HintTerms& t) {
  const int64_t now = steady_ns();
  auto& at = t.expected_at_ns;
  const auto fresh = std::find_if(at.begin(), at.end(), [&](int64_t a) {
    return static_cast<double>(now) - static_cast<double>(a) <= kExpectedGraceS * 1e9;
  });
  at.erase(at.begin(), fresh);
  policy_->set_expected_use(hash, at.empty() ? std::numeric_limits<double>::infinity()
                                             : (static_cast<double>(at.front()) - static_cast<double>(now)) * 1e-9);
}

void DramTier::hint_population(const ChunkHash& hash, bool member, double parent_chance) {
  cairn::MutexLock lock(mu_);
  auto it = hint_entry_locked(hash);
  it->second.population = member;
  it->second.parent_chance = member ? parent_chance : std::numeric_limits<double>::quiet_NaN();
  policy_->set_population(hash, member);
  policy_->set_parent_chance(hash, it->second.parent_chance);
  prune_hint_locked(it);
}

void DramTier::hint_done(const ChunkHash& hash) {
  cairn::MutexLock lock(mu_);
  auto it = hint_entry_locked(hash);
  it->second.done = true;
  policy_->set_done(hash, true);
}

void DramTier::hint_cyclic(const ChunkHash& hash, bool cyclic) {
  cairn::MutexLock lock(mu_);
  auto it = hint_entry_locked(hash);
  it->second.cyclic = cyclic;
  policy_->set_cyclic(hash, cyclic);
  prune_hint_locked(it);
}

std::unordered_map<ChunkHash, DramTier::HintTerms, ChunkHashHasher>::iterator DramTier::hint_entry_locked(
    const ChunkHash& hash) {
  // Hints are advice: past a million hinted chunks the oldest knowledge is simply forgotten.
  constexpr size_t kMaxHinted = 1u << 20;
  if (hinted_.size() >= kMaxHinted && !hinted_.count(hash)) hinted_.clear();
  return hinted_.try_emplace(hash).first;
}

void DramTier::prune_hint_locked(std::unordered_map<ChunkHash, HintTerms, ChunkHashHasher>::iterator it) {
  const HintTerms& t = it->second;
  if (!t.population && !t.done && !t.cyclic && t.expected_at_ns.empty()) hinted_.erase(it);
}

void DramTier::reapply_hints_locked(const ChunkHash& hash) {
  auto it = hinted_.find(hash);
  if (it == hinted_.end()) return;
  if (it->second.population) {
    policy_->set_population(hash, true);
    policy_->set_parent_chance(hash, it->second.parent_chance);
  }
  if (it->second.done) policy_->set_done(hash, true);
  if (it->second.cyclic) policy_->set_cyclic(hash, true);
  // The announced reads stay until clients make them (hint_read): a prefetch landing is not one.
  if (!it->second.expected_at_ns.empty()) {
    pass_expected_locked(hash, it->second);
    prune_hint_locked(it);
  }
}

DramTier::Claim DramTier::claim(const ChunkHash& hash) {
  cairn::MutexLock lock(mu_);
  auto it = chunks_.find(hash);
  if (it != chunks_.end()) {
    ++it->second.pins;
    ++hits_;
    ++it->second.accesses;
    policy_->touch(hash);  // withdraws the policy's expectation: the reads still announced go back
    if (auto h = hinted_.find(hash); h != hinted_.end() && !h->second.expected_at_ns.empty())
      pass_expected_locked(hash, h->second);
    return {ClaimKind::kResident, it->second.offset};
  }
  if (loading_.count(hash)) return {ClaimKind::kLoading, 0};
  ++misses_;
  loading_.insert(hash);
  return {ClaimKind::kLoad, 0};
}

void DramTier::finish_load(const ChunkHash& hash, uint64_t offset, uint64_t length) {
  {
    cairn::MutexLock lock(mu_);
    loading_.erase(hash);
    chunks_[hash] = Resident{offset, length, 1, false};
    chunk_bytes_ += length;
    bytes_in_ += length;
    policy_->track(hash, length);
    reapply_hints_locked(hash);
    if (residency_hook_) residency_hook_(hash, true);
  }
  loaded_cv_.notify_all();
}

void DramTier::abort_load(const ChunkHash& hash) {
  {
    cairn::MutexLock lock(mu_);
    loading_.erase(hash);
  }
  loaded_cv_.notify_all();
}

std::optional<uint64_t> DramTier::wait_pin(const ChunkHash& hash) {
  cairn::MutexLock lock(mu_);
  loaded_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return !loading_.count(hash); });
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return std::nullopt;
  ++it->second.pins;
  ++hits_;
  ++it->second.accesses;
  policy_->touch(hash);
  return it->second.offset;
}

uint64_t DramTier::adopt(const ChunkHash& hash, uint64_t offset, uint64_t length, bool dirty) {
  cairn::MutexLock lock(mu_);
  // Another caller is loading the same bytes: wait for it, so that its finish_load does not
  // replace this copy (leaking it and losing its pin); then share its copy, or keep ours if the
  // load failed.
  loaded_cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return !loading_.count(hash); });
  auto it = chunks_.find(hash);
  if (it != chunks_.end()) {
    alloc_.free(offset, length);
    ++it->second.pins;
    if (dirty && !it->second.dirty) {
      it->second.dirty = true;
      dirty_bytes_ += it->second.length;
    }
    policy_->touch(hash);
    return it->second.offset;
  }
  chunks_[hash] = Resident{offset, length, 1, dirty};
  chunk_bytes_ += length;
  bytes_in_ += length;
  if (dirty) dirty_bytes_ += length;
  policy_->track_written(hash, length);  // a commit's write: enters cold until read (docs/policy.md)
  reapply_hints_locked(hash);
  if (residency_hook_) residency_hook_(hash, true);
  return offset;
}

void DramTier::unpin(const ChunkHash& hash) {
  cairn::MutexLock lock(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end() || it->second.pins == 0) {
    std::fprintf(stderr, "cairn: internal error: unpin of chunk %s that is not pinned\n", hash.hex().c_str());
    std::abort();
  }
  if (--it->second.pins == 0) space_cv_.notify_all();
}

void DramTier::mark_clean(const ChunkHash& hash) {
  cairn::MutexLock lock(mu_);
  auto it = chunks_.find(hash);
  if (it != chunks_.end() && it->second.dirty) {
    it->second.dirty = false;
    dirty_bytes_ -= it->second.length;
    space_cv_.notify_all();
  }
}

std::optional<uint64_t> DramTier::offset_of(const ChunkHash& hash) const {
  cairn::MutexLock lock(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return std::nullopt;
  return it->second.offset;
}

TierStats DramTier::stats() const {
  cairn::MutexLock lock(mu_);
  TierStats s;
  s.name = "dram";
  s.enabled = true;
  s.capacity_bytes = alloc_.capacity();
  s.used_bytes = alloc_.used();
  s.hits = hits_;
  s.misses = misses_;
  s.bytes_in = bytes_in_;
  s.bytes_out = bytes_out_;
  s.chunks = chunks_.size();
  s.dirty_bytes = dirty_bytes_;
  s.backpressure_waits = backpressure_waits_;
  s.pages = arena_->pages();
  s.prefaulted_bytes = static_cast<int64_t>(prefaulted_.load());
  s.prefault_finished = prefault_done_.load();
  for (const auto& [hash, r] : chunks_) {
    const uint64_t held = alloc_.round_up(r.length);  // what the chunk holds of the arena
    s.chunk_bytes += held;
    if (r.pins > 0) s.pinned_bytes += held;
  }
  return s;
}

void DramTier::set_residency_hook(std::function<void(const ChunkHash&, bool)> hook) {
  cairn::MutexLock lock(mu_);
  residency_hook_ = std::move(hook);
}

std::vector<ChunkHash> DramTier::resident_chunks() const {
  cairn::MutexLock lock(mu_);
  std::vector<ChunkHash> out;
  out.reserve(chunks_.size());
  for (const auto& [h, r] : chunks_) out.push_back(h);
  return out;
}

}  // namespace cairn
