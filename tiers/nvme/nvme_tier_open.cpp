// NvmeTier: open and recovery.
//
// open() takes the directory's lock, then rebuilds the state a previous daemon left from the
// journal alone, trusting a record only as far as the crash-safety rules make it trustworthy:
//   - replay stops at the first record that is not whole and valid: a torn tail is cut off;
//   - an extent that lies outside the data file or overlaps another is discarded (the allocator is
//     rebuilt from the extents that remain: the rest of the file, including extents torn by a crash
//     before their PUT was written, is free space);
//   - every dirty chunk (its only durable copy is here) is read back and checked against its hash;
//     one whose bytes do not match is discarded. Clean chunks are checked when read.
// The journal is then rewritten compactly, so it says exactly what the tier holds.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/sync.hpp"
#include "tiers/nvme/extent_io.hpp"
#include "tiers/nvme/journal.hpp"
#include "tiers/nvme/nvme_tier_impl.hpp"

namespace cairn {

using nvme::kBlock;
using nvme::round_up;

Result<std::unique_ptr<NvmeTier>> NvmeTier::open(Options options) {
  auto impl = std::make_unique<Impl>();
  impl->fs = options.fs ? options.fs : &posix_fs();
  uint64_t capacity = options.capacity / kBlock * kBlock;
  if (capacity < (1ull << 20))
    return invalid_argument("tiers.nvme.capacity: " + std::to_string(options.capacity) +
                            " bytes is less than the 1MiB the burst buffer needs (0 disables it)");
  // Nothing else sees the tier until it is returned; the state is built under its lock all the same
  // (so the lock annotations hold), and the lock is dropped before the compaction takes it again.
  cairn::MutexLock state_lock(impl->mu);
  if (!options.policy) options.policy = std::make_unique<LruPolicy>();
  impl->policy = std::move(options.policy);
  impl->opt = std::move(options);
  impl->opt.capacity = capacity;
  FileSystem& fs = *impl->fs;
  const std::string& dir = impl->opt.path;
  CAIRN_RETURN_IF_ERROR(fs.make_dirs(dir, true).with_context("tiers.nvme.path"));
  impl->data_path = dir + "/data";
  impl->journal_path = dir + "/journal";
  impl->lock_path = dir + "/LOCK";
  if (is_posix(*impl->fs)) {
    // One daemon per burst buffer: a second one would reuse extents the first one holds.
    impl->lock_fd = ::open(impl->lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (impl->lock_fd < 0) return errno_status("opening " + impl->lock_path, errno);
    if (::flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      ::close(impl->lock_fd);
      impl->lock_fd = -1;
      if (err == EWOULDBLOCK)
        return busy("the burst buffer " + dir +
                    " is in use by another cairnd (set tiers.nvme.path to a directory of its own)");
      return errno_status("locking " + impl->lock_path, err);
    }
  }
  CAIRN_ASSIGN_OR_RETURN(impl->data, fs.open(impl->data_path, kCreate | kDirect));
  CAIRN_ASSIGN_OR_RETURN(uint64_t data_size, impl->data->size());
  // Sparse: blocks are allocated as extents are written, so an idle tier costs no space.
  if (data_size != capacity) CAIRN_RETURN_IF_ERROR(impl->data->truncate(std::max(capacity, data_size)));
  impl->alloc = std::make_unique<ArenaAllocator>(capacity, kBlock);

  // Replay the journal.
  OpenReport report;
  std::string jbytes;
  {
    auto jf = fs.open(impl->journal_path, kCreate);
    if (!jf.ok()) return jf.status();
    CAIRN_ASSIGN_OR_RETURN(uint64_t jlen, (*jf)->size());
    jbytes.resize(jlen);
    size_t got = 0;
    if (jlen) CAIRN_RETURN_IF_ERROR((*jf)->pread(jbytes.data(), jlen, 0, &got));
    jbytes.resize(got);
  }
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries;
  // The records' chunks go to entries, their models straight to the tier's.
  class Replay final : public nvme::JournalHandler {
   public:
    Replay(std::unordered_map<ChunkHash, Entry, ChunkHashHasher>& chunks, std::map<std::string, PendingModel>& models)
        : entries_(chunks), models_(models) {}
    void put(const ChunkHash& h, uint64_t offset, uint64_t length, bool dirty) override {
      entries_[h] = Entry{offset, length, dirty, 0};
    }
    void del(const ChunkHash& h) override { entries_.erase(h); }
    void clean(const ChunkHash& h) override {
      auto it = entries_.find(h);
      if (it != entries_.end()) it->second.dirty = false;
    }
    void model(uint64_t seq, std::string_view id_bytes, std::string_view manifest_json) override {
      std::string id(id_bytes);
      models_[id] = PendingModel{seq, id, std::string(manifest_json)};
    }
    void done(std::string_view id) override { models_.erase(std::string(id)); }

   private:
    std::unordered_map<ChunkHash, Entry, ChunkHashHasher>& entries_;
    std::map<std::string, PendingModel>& models_;
  } replay(entries, impl->models);
  const size_t pos = nvme::replay_journal(jbytes, replay);
  if (pos < jbytes.size()) {
    report.torn_records = 1;
    CAIRN_LOG_WARN(
        "burst buffer {}: the journal ends with {} bytes that are not a complete record (a write "
        "cut short by a crash); ignoring them",
        dir, jbytes.size() - pos);
  }

  // Rebuild the allocator: every recorded extent that lies inside the file and overlaps no other
  // is taken; the rest of the file is free.
  std::vector<std::pair<uint64_t, ChunkHash>> by_offset;
  for (const auto& [h, e] : entries) by_offset.emplace_back(e.offset, h);
  std::sort(by_offset.begin(), by_offset.end());
  uint64_t end_prev = 0;
  std::vector<std::pair<uint64_t, uint64_t>> taken;
  for (const auto& [off, h] : by_offset) {
    const Entry& e = entries[h];
    const bool fits = e.offset % kBlock == 0 && e.length <= capacity && e.offset <= capacity - round_up(e.length);
    if (!fits || e.offset < end_prev || e.length == 0) {
      ++report.discarded;
      CAIRN_LOG_WARN("burst buffer {}: chunk {} at [{}, +{}) lies outside the data file or overlaps another; discarded",
                     dir, h.hex(), e.offset, e.length);
      entries.erase(h);
      continue;
    }
    taken.emplace_back(e.offset, round_up(e.length));
    end_prev = e.offset + round_up(e.length);
  }
  if (auto all = impl->alloc->allocate(capacity); all) {
    uint64_t cur = 0;
    for (auto [off, len] : taken) {
      if (off > cur) impl->alloc->free(cur, off - cur);
      cur = off + len;
    }
    if (cur < capacity) impl->alloc->free(cur, capacity - cur);
  }
  impl->entries = std::move(entries);

  // Verify the chunks whose only durable copy is here. Clean ones are verified when read.
  std::vector<ChunkHash> bad;
  for (const auto& [h, e] : impl->entries) {
    if (!e.dirty) continue;
    nvme::AlignedBuffer buf(round_up(e.length));
    Status st = buf.data() ? nvme::read_extent(*impl->data, e.offset, buf.data(), e.length) : no_space("no memory");
    if (!st.ok() || hash_bytes(buf.data(), e.length) != h) {
      ++report.discarded;
      CAIRN_LOG_ERROR("burst buffer {}: chunk {} at [{}, +{}) does not hold its bytes ({}); discarded", dir, h.hex(),
                      e.offset, e.length, st.ok() ? "hash mismatch" : st.to_string());
      bad.push_back(h);
    } else {
      ++report.dirty_chunks;
    }
  }
  for (const auto& h : bad) {
    const Entry& e = impl->entries[h];
    impl->alloc->free(e.offset, round_up(e.length));
    impl->entries.erase(h);
  }
  report.chunks = impl->entries.size();
  for (const auto& [h, e] : impl->entries) {
    impl->policy->track(h, e.length);
    if (e.dirty) impl->dirty_bytes += e.length;
  }
  for (const auto& [id, m] : impl->models) report.pending.push_back(m);
  std::sort(report.pending.begin(), report.pending.end(),
            [](const PendingModel& a, const PendingModel& b) { return a.seq < b.seq; });

  // Start from a compact journal that says exactly what the tier holds.
  state_lock.unlock();
  CAIRN_RETURN_IF_ERROR(impl->compact().with_context("rewriting the burst buffer journal"));
  std::unique_ptr<NvmeTier> tier(new NvmeTier(std::move(impl)));
  tier->report_ = std::move(report);
  return tier;
}

}  // namespace cairn
