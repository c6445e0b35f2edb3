// NvmeTier: the read path and the rest of a running tier's calls (mark_clean, remove, stats, close).
//
// A read pins its entry (pins) so that no eviction reuses the extent while the bytes are copied out,
// and checks them against the chunk's hash: bad bytes are dropped (doomed), never served. A chunk
// removed or found corrupt while pinned is dropped by its last reader.
#include <unistd.h>

#include <string>
#include <vector>

#include "core/log.hpp"
#include "tiers/nvme/extent_io.hpp"
#include "tiers/nvme/journal.hpp"
#include "tiers/nvme/nvme_tier_impl.hpp"

namespace cairn {

using nvme::append_record;
using nvme::hash_payload;

NvmeTier::NvmeTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NvmeTier::~NvmeTier() {
  if (impl_ && impl_->lock_fd >= 0) ::close(impl_->lock_fd);
}

bool NvmeTier::direct_io() const { return impl_->data->direct(); }

bool NvmeTier::contains(const ChunkHash& hash) const {
  cairn::MutexLock l(impl_->mu);
  return impl_->entries.count(hash) && !impl_->doomed.count(hash);
}

void NvmeTier::hint_expected_use(const ChunkHash& hash, double seconds) {
  cairn::MutexLock l(impl_->mu);
  impl_->policy->set_expected_use(hash, seconds);
}

void NvmeTier::hint_population(const ChunkHash& hash, bool member, double parent_chance) {
  cairn::MutexLock l(impl_->mu);
  impl_->policy->set_population(hash, member);
  impl_->policy->set_parent_chance(hash, member ? parent_chance : std::numeric_limits<double>::quiet_NaN());
}

void NvmeTier::hint_done(const ChunkHash& hash) {
  cairn::MutexLock l(impl_->mu);
  impl_->policy->set_done(hash, true);
}

bool NvmeTier::is_dirty(const ChunkHash& hash) const {
  cairn::MutexLock l(impl_->mu);
  auto it = impl_->entries.find(hash);
  return it != impl_->entries.end() && it->second.dirty;
}

Status NvmeTier::read(const ChunkHash& hash, void* dst, uint64_t length) {
  Impl& im = *impl_;
  uint64_t offset;
  {
    cairn::MutexLock l(im.mu);
    auto it = im.entries.find(hash);
    if (it == im.entries.end() || im.doomed.count(hash)) {
      ++im.misses;
      return not_found("chunk " + hash.hex() + " is not in the burst buffer");
    }
    if (it->second.length != length)
      return invalid_argument("chunk " + hash.hex() + " is " + std::to_string(it->second.length) +
                              " bytes in the burst buffer, not " + std::to_string(length));
    ++it->second.pins;
    offset = it->second.offset;
  }
  Status st = nvme::read_extent(*im.data, offset, dst, length);
  bool bad = st.ok() && hash_bytes(dst, length) != hash;
  // A mismatch may be the transfer's, not the device's bytes: read again before judging the copy.
  // Dropping it at the first bad read lost models acknowledged `local` whose only copy was intact
  // (the torture harness, flipped bits injected on burst-buffer reads).
  for (int again = 0; bad && again < 2; ++again) {
    st = nvme::read_extent(*im.data, offset, dst, length);
    bad = st.ok() && hash_bytes(dst, length) != hash;
    if (st.ok() && !bad)
      CAIRN_LOG_WARN("burst buffer {}: chunk {} at [{}, +{}) read wrong once, then right: kept", im.data_path,
                     hash.hex(), offset, length);
  }
  bool drop = false;
  bool bad_and_dropped = false;
  {
    cairn::MutexLock l(im.mu);
    auto it = im.entries.find(hash);
    --it->second.pins;
    bool dropping = false;
    if (bad) {
      ++im.corrupt;
      if (++it->second.bad_reads >= kBadReadsToDrop) {
        im.doomed[hash] = true;
        dropping = true;
      }
    }
    if (st.ok() && !bad) {
      it->second.bad_reads = 0;
      ++im.hits;
      im.policy->touch(hash);
    }
    bad_and_dropped = bad && dropping;
    drop = it->second.pins == 0 && im.doomed.count(hash);
  }
  if (drop) {
    // The last reader of a removed or corrupt chunk drops it (with jmu, so that its DEL record is
    // journalled in order; a put or remove in between may have settled it already).
    cairn::MutexLock jl(im.jmu);
    std::string records;
    {
      cairn::MutexLock l(im.mu);
      auto it = im.entries.find(hash);
      if (it != im.entries.end() && it->second.pins == 0 && im.doomed.count(hash)) {
        im.doomed.erase(hash);
        im.drop_locked(hash, records);
      }
    }
    if (!records.empty()) (void)im.append_locked(records, false);
  }
  im.unpinned.notify_all();
  if (bad) {
    const char* fate = bad_and_dropped ? "the copy was dropped" : "the copy is kept until it is found wrong again";
    CAIRN_LOG_ERROR("burst buffer {}: chunk {} at [{}, +{}) does not match its hash; {}", im.data_path, hash.hex(),
                    offset, length, fate);
    return corruption("chunk " + hash.hex() + " in the burst buffer " + im.data_path + " at offset " +
                      std::to_string(offset) + " does not match its hash (" + fate + ")");
  }
  return st.with_context("reading chunk " + hash.hex() + " from the burst buffer");
}

void NvmeTier::mark_clean(const ChunkHash& hash) {
  std::string rec;
  cairn::MutexLock jl(impl_->jmu);
  {
    cairn::MutexLock l(impl_->mu);
    auto it = impl_->entries.find(hash);
    if (it == impl_->entries.end() || !it->second.dirty) return;
    it->second.dirty = false;
    impl_->dirty_bytes -= it->second.length;
  }
  // Not synced: if the record is lost, recovery verifies the chunk as dirty and finds it is in the
  // repository anyway.
  append_record(rec, nvme::kClean, hash_payload(hash));
  (void)impl_->append_locked(rec, false);
}

void NvmeTier::remove(const ChunkHash& hash) {
  std::string rec;
  cairn::MutexLock jl(impl_->jmu);
  {
    cairn::MutexLock l(impl_->mu);
    auto it = impl_->entries.find(hash);
    if (it == impl_->entries.end()) return;
    if (it->second.pins) {
      impl_->doomed[hash] = false;
      return;
    }
    impl_->drop_locked(hash, rec);
  }
  (void)impl_->append_locked(rec, false);
}

std::vector<ChunkHash> NvmeTier::dirty_chunks() const {
  cairn::MutexLock l(impl_->mu);
  std::vector<ChunkHash> out;
  for (const auto& [h, e] : impl_->entries)
    if (e.dirty) out.push_back(h);
  return out;
}

TierStats NvmeTier::stats() const {
  cairn::MutexLock l(impl_->mu);
  TierStats s;
  s.name = "nvme";
  s.enabled = true;
  s.capacity_bytes = impl_->opt.capacity;
  s.used_bytes = impl_->alloc->used();
  s.hits = impl_->hits;
  s.misses = impl_->misses;
  s.bytes_in = impl_->bytes_in;
  s.bytes_out = impl_->bytes_out;
  s.chunks = impl_->entries.size();
  s.dirty_bytes = impl_->dirty_bytes;
  return s;
}

Status NvmeTier::close() {
  Impl& im = *impl_;
  if (im.opt.persistent) return im.compact().with_context("closing the burst buffer");
  im.data.reset();
  im.journal.reset();
  for (const std::string& p : {im.data_path, im.journal_path, im.journal_path + ".tmp"}) {
    Status st = im.fs->unlink(p);
    if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
  }
  if (im.lock_fd >= 0) {
    (void)im.fs->unlink(im.lock_path);
    ::close(im.lock_fd);
    im.lock_fd = -1;
  }
  return Status::OK();
}

}  // namespace cairn
