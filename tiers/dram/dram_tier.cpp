#include "tiers/dram/dram_tier.hpp"

#include <sys/mman.h>

#include <cstdlib>

namespace cairn {

Result<std::unique_ptr<DramTier>> DramTier::create(uint64_t capacity, std::unique_ptr<EvictionPolicy> policy,
                                                   const std::string& name) {
  CAIRN_ASSIGN_OR_RETURN(auto arena, SharedArena::create(capacity, name));
  return std::unique_ptr<DramTier>(new DramTier(std::move(arena), std::move(policy)));
}

DramTier::DramTier(std::unique_ptr<SharedArena> arena, std::unique_ptr<EvictionPolicy> policy)
    : arena_(std::move(arena)), alloc_(arena_->capacity(), 64), policy_(std::move(policy)) {
  prefault_ = std::thread([this] {
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older kernels say EINVAL and pages fault lazily
#endif
    constexpr uint64_t kStep = 64ull << 20;
    for (uint64_t off = 0; off < arena_->capacity() && !stop_prefault_; off += kStep) {
      uint64_t n = std::min(kStep, arena_->capacity() - off);
      if (::madvise(arena_->base() + off, n, MADV_POPULATE_WRITE) != 0) break;
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
  auto victim = policy_->pick_victim([this](const ChunkHash& h) {
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
  return true;
}

Result<uint64_t> DramTier::allocate(uint64_t nbytes) {
  std::lock_guard lock(mu_);
  for (;;) {
    if (auto off = alloc_.allocate(nbytes)) return *off;
    if (!evict_one_locked()) {
      return no_space("the DRAM arena cannot hold " + std::to_string(nbytes) + " more bytes: " +
                      std::to_string(alloc_.used()) + " of " + std::to_string(alloc_.capacity()) +
                      " bytes are pinned by readers, dirty, or held by named tensors and open writes "
                      "(raise tiers.dram.capacity, or release readers)");
    }
  }
}

void DramTier::release(uint64_t offset, uint64_t nbytes) {
  std::lock_guard lock(mu_);
  alloc_.free(offset, nbytes);
}

DramTier::Claim DramTier::claim(const ChunkHash& hash) {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(hash);
  if (it != chunks_.end()) {
    ++it->second.pins;
    ++hits_;
    policy_->touch(hash);
    return {ClaimKind::kResident, it->second.offset};
  }
  if (loading_.count(hash)) return {ClaimKind::kLoading, 0};
  ++misses_;
  loading_.insert(hash);
  return {ClaimKind::kLoad, 0};
}

void DramTier::finish_load(const ChunkHash& hash, uint64_t offset, uint64_t length) {
  {
    std::lock_guard lock(mu_);
    loading_.erase(hash);
    chunks_[hash] = Resident{offset, length, 1, false};
    chunk_bytes_ += length;
    bytes_in_ += length;
    policy_->track(hash, length);
  }
  loaded_cv_.notify_all();
}

void DramTier::abort_load(const ChunkHash& hash) {
  {
    std::lock_guard lock(mu_);
    loading_.erase(hash);
  }
  loaded_cv_.notify_all();
}

std::optional<uint64_t> DramTier::wait_pin(const ChunkHash& hash) {
  std::unique_lock lock(mu_);
  loaded_cv_.wait(lock, [&] { return !loading_.count(hash); });
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return std::nullopt;
  ++it->second.pins;
  ++hits_;
  policy_->touch(hash);
  return it->second.offset;
}

uint64_t DramTier::adopt(const ChunkHash& hash, uint64_t offset, uint64_t length, bool dirty) {
  std::unique_lock lock(mu_);
  // Another caller is loading the same bytes: wait for it, so that its finish_load does not
  // replace this copy (leaking it and losing its pin); then share its copy, or keep ours if the
  // load failed.
  loaded_cv_.wait(lock, [&] { return !loading_.count(hash); });
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
  policy_->track(hash, length);
  return offset;
}

void DramTier::unpin(const ChunkHash& hash) {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end() || it->second.pins == 0) {
    std::fprintf(stderr, "cairn: internal error: unpin of chunk %s that is not pinned\n", hash.hex().c_str());
    std::abort();
  }
  --it->second.pins;
}

void DramTier::mark_clean(const ChunkHash& hash) {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(hash);
  if (it != chunks_.end() && it->second.dirty) {
    it->second.dirty = false;
    dirty_bytes_ -= it->second.length;
  }
}

std::optional<uint64_t> DramTier::offset_of(const ChunkHash& hash) const {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return std::nullopt;
  return it->second.offset;
}

TierStats DramTier::stats() const {
  std::lock_guard lock(mu_);
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
  return s;
}

}  // namespace cairn
