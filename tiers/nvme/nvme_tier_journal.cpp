// NvmeTier: keeping the journal in step with the state (appends, drops, compaction).
//
// This is where the journal's ordering rules are kept (the format is journal.hpp's):
//   - the journal's order is the state's order: every change is journalled with jmu held from the
//     change (under mu) to the write, so replay reaches the state the tier had;
//   - a freed extent is reused only once its DEL record is durable: drop_locked puts the extent in the
//     quarantine and only a journal sync (or a compaction, whose new journal has no record of it)
//     hands it back to the allocator, so no record ever names bytes that were overwritten;
//   - after a failed write or sync the journal's tail is unknown (broken), so the next append first
//     rewrites the whole journal from the state: a stale record can never shadow a later one.
// (A PUT written only after its extent is durable is the write path's rule: nvme_tier_write.cpp.)
#include <string>
#include <utility>
#include <vector>

#include "tiers/nvme/extent_io.hpp"
#include "tiers/nvme/journal.hpp"
#include "tiers/nvme/nvme_tier_impl.hpp"

namespace cairn {

using nvme::append_record;
using nvme::hash_payload;
using nvme::put_payload;
using nvme::round_up;

Status NvmeTier::Impl::append(const std::string& records, bool sync, const std::function<void()>& on_durable) {
  cairn::MutexLock jl(jmu);
  return append_locked(records, sync, on_durable);
}

Status NvmeTier::Impl::append_locked(const std::string& records, bool sync, const std::function<void()>& on_durable) {
  std::vector<std::pair<uint64_t, uint64_t>> released;
  if (broken) CAIRN_RETURN_IF_ERROR(compact_locked());
  if (!records.empty()) {
    Status st = journal->pwrite(records.data(), records.size(), jsize);
    if (!st.ok()) {
      broken = true;
      return st;
    }
    jsize += records.size();
  }
  if (sync) {
    {
      cairn::MutexLock l(mu);
      released.swap(quarantine);
    }
    Status st = journal->sync(true);
    if (!st.ok()) {
      broken = true;
      cairn::MutexLock l(mu);
      quarantine.insert(quarantine.end(), released.begin(), released.end());
      return st;
    }
  }
  cairn::MutexLock l(mu);
  for (auto [off, len] : released) alloc->free(off, len);
  if (on_durable) on_durable();
  return Status::OK();
}

void NvmeTier::Impl::drop_locked(const ChunkHash& h, std::string& records) {
  auto it = entries.find(h);
  if (it == entries.end()) return;
  quarantine.emplace_back(it->second.offset, round_up(it->second.length));
  if (it->second.dirty) dirty_bytes -= it->second.length;
  bytes_out += it->second.length;
  entries.erase(it);
  policy->remove(h);
  append_record(records, nvme::kDel, hash_payload(h));
}

std::string NvmeTier::Impl::snapshot_locked() const {
  std::string out;
  for (const auto& [h, e] : entries) append_record(out, nvme::kPut, put_payload(h, e.offset, e.length, e.dirty));
  for (const auto& [id, m] : models)
    append_record(out, nvme::kModel, nvme::model_payload(m.seq, m.id, m.manifest_json));
  return out;
}

Status NvmeTier::Impl::compact() {
  cairn::MutexLock jl(jmu);
  return compact_locked();
}

Status NvmeTier::Impl::compact_locked() {
  std::string snap;
  std::vector<std::pair<uint64_t, uint64_t>> released;
  {
    cairn::MutexLock l(mu);
    snap = snapshot_locked();
    released.swap(quarantine);  // the new journal has no record of them
  }
  std::string tmp = journal_path + ".tmp";
  auto fail = [&](Status st) {
    cairn::MutexLock l(mu);
    quarantine.insert(quarantine.end(), released.begin(), released.end());
    (void)fs->unlink(tmp);
    return st;
  };
  auto f = fs->open(tmp, kCreate | kTruncate);
  if (!f.ok()) return fail(f.status());
  Status st = snap.empty() ? Status::OK() : (*f)->pwrite(snap.data(), snap.size(), 0);
  if (st.ok()) st = (*f)->sync(false);
  if (st.ok()) st = fs->rename(tmp, journal_path);
  if (!st.ok()) return fail(st);
  (void)fs->sync_dir(opt.path);
  journal = std::move(*f);
  jsize = snap.size();
  jlive_hint = snap.size();
  broken = false;
  cairn::MutexLock l(mu);
  for (auto [off, len] : released) alloc->free(off, len);
  return Status::OK();
}

Status NvmeTier::Impl::maybe_compact() {
  uint64_t size, live;
  {
    cairn::MutexLock jl(jmu);
    size = jsize;
    live = jlive_hint;
  }
  if (size < (64ull << 20) || size < 8 * live) return Status::OK();
  return compact();
}

}  // namespace cairn
