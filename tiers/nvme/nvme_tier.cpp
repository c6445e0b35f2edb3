#include "tiers/nvme/nvme_tier.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_set>

#include "core/log.hpp"

namespace cairn {

namespace {

constexpr uint64_t kBlock = kDirectAlignment;
constexpr uint32_t kMagic = 0x314a4e43;  // "CNJ1"
constexpr size_t kRecordHeader = 24;     // magic u32, type u32, length u32, reserved u32, checksum u64
constexpr uint32_t kMaxRecordPayload = 64u << 20;
// Reads of a chunk are split so that the device sees several requests at once.
constexpr uint64_t kReadPiece = 1ull << 20;

enum RecordType : uint32_t { kPut = 1, kDel = 2, kClean = 3, kModel = 4, kDone = 5 };

uint64_t round_up(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t record_checksum(uint32_t type, std::string_view payload) {
  std::string buf;
  buf.reserve(payload.size() + 4);
  put_u32(buf, type);
  buf.append(payload);
  return hash64(buf);
}

void append_record(std::string& out, uint32_t type, std::string_view payload) {
  put_u32(out, kMagic);
  put_u32(out, type);
  put_u32(out, static_cast<uint32_t>(payload.size()));
  put_u32(out, 0);
  put_u64(out, record_checksum(type, payload));
  out.append(payload);
}

std::string hash_payload(const ChunkHash& h) {
  std::string p;
  put_u64(p, h.hi);
  put_u64(p, h.lo);
  return p;
}

std::string put_payload(const ChunkHash& h, uint64_t offset, uint64_t length, bool dirty) {
  std::string p = hash_payload(h);
  put_u64(p, offset);
  put_u64(p, length);
  p.push_back(dirty ? 1 : 0);
  return p;
}

// Aligned scratch memory for direct I/O.
struct AlignedBuffer {
  void* p = nullptr;
  explicit AlignedBuffer(uint64_t n) {
    if (n && ::posix_memalign(&p, kBlock, n) != 0) p = nullptr;
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p); }
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBlock == 0; }

}  // namespace

struct NvmeTier::Impl {
  Options opt;
  FileSystem* fs = nullptr;
  std::string data_path, journal_path, lock_path;
  std::unique_ptr<File> data;
  int lock_fd = -1;

  // The journal: appends are serialized; jsize is where the next record goes. Lock order: jmu, then mu.
  std::mutex jmu;
  std::unique_ptr<File> journal;
  uint64_t jsize = 0;
  uint64_t jlive_hint = 0;  // journal bytes of the state at the last compaction
  // An append failed: what the journal holds past its last good record is unknown (a torn record,
  // or whole records that were never made durable and may name extents given out again since). The
  // next append rewrites the journal from the state first.  GUARDED_BY(jmu)
  bool broken = false;

  mutable std::mutex mu;
  std::condition_variable unpinned;  // an entry's pins dropped to 0
  std::condition_variable landed;    // a put finished with its chunks (inflight shrank)
  // Chunks a put is storing right now (between planning and recording): a second put of the same
  // chunk waits for the first instead of storing it twice.
  std::unordered_set<ChunkHash, ChunkHashHasher> inflight;  // GUARDED_BY(mu)
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries;  // GUARDED_BY(mu)
  std::unordered_map<ChunkHash, bool, ChunkHashHasher> doomed;     // pinned entries to drop at unpin (true: corrupt)
  std::unique_ptr<ArenaAllocator> alloc;                           // GUARDED_BY(mu)
  // Extents freed since the last journal sync: reused only once their DEL records are durable.
  std::vector<std::pair<uint64_t, uint64_t>> quarantine;           // GUARDED_BY(mu)
  std::map<std::string, PendingModel> models;                      // GUARDED_BY(mu)
  std::unique_ptr<EvictionPolicy> policy;                          // GUARDED_BY(mu)
  uint64_t hits = 0, misses = 0, bytes_in = 0, bytes_out = 0, dirty_bytes = 0, corrupt = 0;

  // Appends records (and syncs when asked). Sync also releases the quarantine. on_durable, when
  // given, runs once the records are on the device, with jmu and mu held: a put makes its chunks
  // visible there, so a compaction (which snapshots the state under jmu) never misses a chunk whose
  // record it replaces.
  //
  // Every change of the state is journalled with jmu held from the change (under mu) to the write,
  // so the journal's order is the state's order (a DEL never lands after a later PUT of the same
  // chunk) and a sync releases only quarantined extents whose DEL records are already written.
  Status append(const std::string& records, bool sync, const std::function<void()>& on_durable = {}) {
    std::lock_guard jl(jmu);
    return append_locked(records, sync, on_durable);
  }

  // REQUIRES: jmu held.
  Status append_locked(const std::string& records, bool sync, const std::function<void()>& on_durable = {}) {
    std::vector<std::pair<uint64_t, uint64_t>> released;
    if (broken) CAIRN_RETURN_IF_ERROR(compact_locked());
    if (!records.empty()) {
      Status st = journal->pwrite(records.data(), records.size(), jsize);
      if (!st.is_ok()) {
        broken = true;
        return st;
      }
      jsize += records.size();
    }
    if (sync) {
      {
        std::lock_guard l(mu);
        released.swap(quarantine);
      }
      Status st = journal->sync(true);
      if (!st.is_ok()) {
        broken = true;
        std::lock_guard l(mu);
        quarantine.insert(quarantine.end(), released.begin(), released.end());
        return st;
      }
    }
    std::lock_guard l(mu);
    for (auto [off, len] : released) alloc->free(off, len);
    if (on_durable) on_durable();
    return Status::ok();
  }

  // REQUIRES: mu held. Drops an entry (its extent goes to the quarantine) and returns its DEL record.
  void drop_locked(const ChunkHash& h, std::string& records) {
    auto it = entries.find(h);
    if (it == entries.end()) return;
    quarantine.emplace_back(it->second.offset, round_up(it->second.length));
    if (it->second.dirty) dirty_bytes -= it->second.length;
    bytes_out += it->second.length;
    entries.erase(it);
    policy->remove(h);
    append_record(records, kDel, hash_payload(h));
  }

  // The whole state as journal records (for compaction).
  std::string snapshot_locked() const {
    std::string out;
    for (const auto& [h, e] : entries) append_record(out, kPut, put_payload(h, e.offset, e.length, e.dirty));
    for (const auto& [id, m] : models) {
      std::string p;
      put_u64(p, m.seq);
      put_u32(p, static_cast<uint32_t>(m.id.size()));
      p += m.id;
      p += m.manifest_json;
      append_record(out, kModel, p);
    }
    return out;
  }

  // Rewrites the journal as the current state: journal.tmp, sync, rename, directory sync.
  Status compact() {
    std::lock_guard jl(jmu);
    return compact_locked();
  }

  // REQUIRES: jmu held.
  Status compact_locked() {
    std::string snap;
    std::vector<std::pair<uint64_t, uint64_t>> released;
    {
      std::lock_guard l(mu);
      snap = snapshot_locked();
      released.swap(quarantine);  // the new journal has no record of them
    }
    std::string tmp = journal_path + ".tmp";
    auto fail = [&](Status st) {
      std::lock_guard l(mu);
      quarantine.insert(quarantine.end(), released.begin(), released.end());
      (void)fs->unlink(tmp);
      return st;
    };
    auto f = fs->open(tmp, kCreate | kTruncate);
    if (!f.is_ok()) return fail(f.status());
    Status st = snap.empty() ? Status::ok() : (*f)->pwrite(snap.data(), snap.size(), 0);
    if (st.is_ok()) st = (*f)->sync(false);
    if (st.is_ok()) st = fs->rename(tmp, journal_path);
    if (!st.is_ok()) return fail(st);
    (void)fs->sync_dir(opt.path);
    journal = std::move(*f);
    jsize = snap.size();
    jlive_hint = snap.size();
    broken = false;
    std::lock_guard l(mu);
    for (auto [off, len] : released) alloc->free(off, len);
    return Status::ok();
  }

  // One pass of put(): stores what it can; chunks another put is storing go to later.
  Status put_batch(std::span<const Put> chunks, std::vector<Put>& later);

  Status maybe_compact() {
    uint64_t size, live;
    {
      std::lock_guard jl(jmu);
      size = jsize;
      live = jlive_hint;
    }
    if (size < (64ull << 20) || size < 8 * live) return Status::ok();
    return compact();
  }

  // Reads [offset, offset+length) of the data file into dst, with direct I/O where possible.
  Status read_extent(uint64_t offset, void* dst, uint64_t length) {
    if (length == 0) return Status::ok();
    const bool direct = data->direct();
    auto* out = static_cast<uint8_t*>(dst);
    std::vector<IoRequest> reqs;
    auto add_pieces = [&](uint8_t* buf, uint64_t off, uint64_t len) {
      for (uint64_t p = 0; p < len; p += kReadPiece)
        reqs.push_back(IoRequest{buf + p, static_cast<size_t>(std::min(kReadPiece, len - p)), off + p});
    };
    if (!direct) {
      add_pieces(out, offset, length);
      return data->read_many(reqs);
    }
    const uint64_t body = aligned(out) ? length / kBlock * kBlock : 0;
    const uint64_t rest = length - body;
    AlignedBuffer tail(round_up(rest));
    if (rest && !tail.data()) return no_space("no memory for a " + std::to_string(rest) + "-byte read buffer");
    add_pieces(out, offset, body);
    if (rest) add_pieces(tail.data(), offset + body, round_up(rest));
    CAIRN_RETURN_IF_ERROR(data->read_many(reqs));
    if (rest) std::memcpy(out + body, tail.data(), rest);
    return Status::ok();
  }

  // Writes a chunk's bytes at offset (the extent is round_up(length) long).
  Status write_extent(uint64_t offset, const void* src, uint64_t length, std::vector<IoRequest>& reqs,
                      std::vector<std::unique_ptr<AlignedBuffer>>& keep) {
    if (length == 0) return Status::ok();
    auto* in = static_cast<const uint8_t*>(src);
    if (!data->direct()) {
      reqs.push_back(IoRequest{const_cast<uint8_t*>(in), static_cast<size_t>(length), offset});
      return Status::ok();
    }
    const uint64_t body = aligned(in) ? length / kBlock * kBlock : 0;
    const uint64_t rest = length - body;
    if (body) reqs.push_back(IoRequest{const_cast<uint8_t*>(in), static_cast<size_t>(body), offset});
    if (rest) {
      auto buf = std::make_unique<AlignedBuffer>(round_up(rest));
      if (!buf->data()) return no_space("no memory for a " + std::to_string(rest) + "-byte write buffer");
      std::memset(buf->data(), 0, round_up(rest));
      std::memcpy(buf->data(), in + body, rest);
      reqs.push_back(IoRequest{buf->data(), static_cast<size_t>(round_up(rest)), offset + body});
      keep.push_back(std::move(buf));
    }
    return Status::ok();
  }
};

NvmeTier::NvmeTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NvmeTier::~NvmeTier() {
  if (impl_ && impl_->lock_fd >= 0) ::close(impl_->lock_fd);
}

bool NvmeTier::direct_io() const { return impl_->data->direct(); }

Result<std::unique_ptr<NvmeTier>> NvmeTier::open(Options options) {
  auto impl = std::make_unique<Impl>();
  impl->fs = options.fs ? options.fs : &posix_fs();
  uint64_t capacity = options.capacity / kBlock * kBlock;
  if (capacity < (1ull << 20))
    return invalid_argument("tiers.nvme.capacity: " + std::to_string(options.capacity) +
                            " bytes is less than the 1MiB the burst buffer needs (0 disables it)");
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
  if (impl->fs == &posix_fs()) {
    // One daemon per burst buffer: a second one would reuse extents the first one holds.
    impl->lock_fd = ::open(impl->lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (impl->lock_fd < 0) return errno_status("opening " + impl->lock_path, errno);
    if (::flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      ::close(impl->lock_fd);
      impl->lock_fd = -1;
      if (err == EWOULDBLOCK)
        return busy("the burst buffer " + dir + " is in use by another cairnd (set tiers.nvme.path to a directory of its own)");
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
    if (!jf.is_ok()) return jf.status();
    CAIRN_ASSIGN_OR_RETURN(uint64_t jlen, (*jf)->size());
    jbytes.resize(jlen);
    size_t got = 0;
    if (jlen) CAIRN_RETURN_IF_ERROR((*jf)->pread(jbytes.data(), jlen, 0, &got));
    jbytes.resize(got);
  }
  std::unordered_map<ChunkHash, Entry, ChunkHashHasher> entries;
  size_t pos = 0;
  while (pos + kRecordHeader <= jbytes.size()) {
    const char* h = jbytes.data() + pos;
    uint32_t magic = get_u32(h), type = get_u32(h + 4), len = get_u32(h + 8);
    uint64_t sum = get_u64(h + 16);
    if (magic != kMagic || len > kMaxRecordPayload || pos + kRecordHeader + len > jbytes.size()) break;
    std::string_view p(h + kRecordHeader, len);
    if (record_checksum(type, p) != sum) break;
    auto hash_at = [&](size_t o) { return ChunkHash{get_u64(p.data() + o), get_u64(p.data() + o + 8)}; };
    bool ok = true;
    switch (type) {
      case kPut:
        if ((ok = len == 33)) entries[hash_at(0)] = Entry{get_u64(p.data() + 16), get_u64(p.data() + 24), p[32] != 0, 0};
        break;
      case kDel:
        if ((ok = len == 16)) entries.erase(hash_at(0));
        break;
      case kClean:
        if ((ok = len == 16)) {
          auto it = entries.find(hash_at(0));
          if (it != entries.end()) it->second.dirty = false;
        }
        break;
      case kModel: {
        if ((ok = len >= 12)) {
          uint64_t seq = get_u64(p.data());
          uint32_t idlen = get_u32(p.data() + 8);
          if ((ok = 12 + static_cast<uint64_t>(idlen) <= len)) {
            std::string id(p.substr(12, idlen));
            impl->models[id] = PendingModel{seq, id, std::string(p.substr(12 + idlen))};
          }
        }
        break;
      }
      case kDone:
        impl->models.erase(std::string(p));
        break;
      default:
        ok = false;
    }
    if (!ok) break;
    pos += kRecordHeader + len;
  }
  if (pos < jbytes.size()) {
    report.torn_records = 1;
    CAIRN_LOG_WARN("burst buffer {}: the journal ends with {} bytes that are not a complete record (a write "
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
    AlignedBuffer buf(round_up(e.length));
    Status st = buf.data() ? impl->read_extent(e.offset, buf.data(), e.length) : no_space("no memory");
    if (!st.is_ok() || hash_bytes(buf.data(), e.length) != h) {
      ++report.discarded;
      CAIRN_LOG_ERROR("burst buffer {}: chunk {} at [{}, +{}) does not hold its bytes ({}); discarded", dir, h.hex(),
                      e.offset, e.length, st.is_ok() ? "hash mismatch" : st.to_string());
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
  CAIRN_RETURN_IF_ERROR(impl->compact().with_context("rewriting the burst buffer journal"));
  std::unique_ptr<NvmeTier> tier(new NvmeTier(std::move(impl)));
  tier->report_ = std::move(report);
  return tier;
}

Status NvmeTier::put(std::span<const Put> chunks) {
  for (const Put& p : chunks)
    if (p.length == 0)
      return invalid_argument("chunk " + p.hash.hex() + " is empty: a chunk in the burst buffer has at least one byte");
  Impl& im = *impl_;
  std::vector<Put> later;  // chunks another put was storing: stored (or found) once it is done
  Status st = im.put_batch(chunks, later);
  while (st.is_ok() && !later.empty()) {
    {
      std::unique_lock l(im.mu);
      im.landed.wait(l, [&] {
        return std::none_of(later.begin(), later.end(), [&](const Put& p) { return im.inflight.count(p.hash) > 0; });
      });
    }
    std::vector<Put> again;
    st = im.put_batch(later, again);
    later.swap(again);
  }
  return st;
}

Status NvmeTier::Impl::put_batch(std::span<const Put> chunks, std::vector<Put>& later) {
  Impl& im = *this;
  struct Planned {
    const Put* put;
    uint64_t offset = 0;
    bool placed = false;
  };
  std::vector<Planned> planned;
  std::vector<ChunkHash> redirty;  // held clean, asked for dirty
  uint64_t need = 0;
  {
    std::unique_lock l(im.mu);
    std::unordered_set<ChunkHash, ChunkHashHasher> seen;
    for (const Put& p : chunks) {
      if (!seen.insert(p.hash).second) continue;
      auto it = im.entries.find(p.hash);
      for (;;) {
        if (im.inflight.count(p.hash)) break;
        it = im.entries.find(p.hash);
        auto d = im.doomed.find(p.hash);
        if (it == im.entries.end() || d == im.doomed.end()) break;
        if (!d->second) {
          // Removed while being read: its bytes are good, so it simply stays.
          im.doomed.erase(d);
          break;
        }
        // A corrupt copy still being read: once its last reader drops it, store the chunk anew.
        im.unpinned.wait(l);
      }
      if (im.inflight.count(p.hash)) {
        later.push_back(p);
        continue;
      }
      if (it != im.entries.end()) {
        if (p.dirty && !it->second.dirty) redirty.push_back(p.hash);
        continue;
      }
      need += round_up(p.length);
      planned.push_back(Planned{&p});
      im.inflight.insert(p.hash);
    }
  }
  // However this put ends, its chunks are no longer in flight.
  struct Landing {
    Impl& im;
    const std::vector<Planned>& planned;
    ~Landing() {
      {
        std::lock_guard l(im.mu);
        for (const auto& pl : planned) im.inflight.erase(pl.put->hash);
      }
      im.landed.notify_all();
    }
  } landing{im, planned};
  if (!redirty.empty()) {
    // The repository lost them (gc) and a new commit brought them back: their only copy is here.
    std::lock_guard jl(im.jmu);
    std::string rec;
    {
      std::lock_guard l(im.mu);
      for (const ChunkHash& h : redirty) {
        auto it = im.entries.find(h);
        if (it == im.entries.end() || it->second.dirty) continue;
        it->second.dirty = true;
        im.dirty_bytes += it->second.length;
        append_record(rec, kPut, put_payload(h, it->second.offset, it->second.length, true));
      }
    }
    CAIRN_RETURN_IF_ERROR(im.append_locked(rec, false).with_context("writing the burst buffer journal"));
  }
  auto give_back_locked = [&] {
    for (auto& pl : planned)
      if (pl.placed) im.alloc->free(pl.offset, round_up(pl.put->length));
  };

  // Space: allocate, evicting clean unpinned chunks in policy order, only as many as the chunks
  // still to place need. An evicted extent is reusable once its DEL record is durable, so when the
  // evicted (quarantined) and free bytes cover the rest, the records are synced and allocation
  // retried; fragmentation may then need further evictions.
  for (;;) {
    bool release = false, stuck = false;
    {
      std::lock_guard jl(im.jmu);
      std::string dels;  // of the evictions
      std::unique_lock l(im.mu);
      for (size_t i = 0; i < planned.size() && !release && !stuck; ++i) {
        Planned& pl = planned[i];
        if (pl.placed) continue;
        for (;;) {
          if (auto off = im.alloc->allocate(round_up(pl.put->length))) {
            pl.offset = *off;
            pl.placed = true;
            break;
          }
          uint64_t rest = 0, quarantined = 0;
          for (size_t j = i; j < planned.size(); ++j)
            if (!planned[j].placed) rest += round_up(planned[j].put->length);
          for (const auto& q : im.quarantine) quarantined += q.second;
          if (!im.quarantine.empty() && quarantined + im.alloc->free_bytes() >= rest) {
            release = true;
            break;
          }
          auto victim = im.policy->pick_victim([&](const ChunkHash& h) {
            auto it = im.entries.find(h);
            return it != im.entries.end() && !it->second.dirty && it->second.pins == 0 && !im.doomed.count(h);
          });
          if (!victim) {
            (im.quarantine.empty() ? stuck : release) = true;
            break;
          }
          im.drop_locked(*victim, dels);
        }
      }
      l.unlock();
      Status st = im.append_locked(dels, release);
      if (!st.is_ok()) {
        l.lock();
        give_back_locked();
        return st.with_context("writing the burst buffer journal");
      }
    }
    if (!release && !stuck) break;
    if (release) continue;
    uint64_t dirty = 0, reading = 0;
    {
      std::lock_guard l(im.mu);
      give_back_locked();
      dirty = im.dirty_bytes;
      for (const auto& [h, e] : im.entries)
        if (e.pins && !e.dirty) reading += e.length;
    }
    Status st = no_space("the burst buffer " + im.opt.path + " cannot take " + std::to_string(need) + " more bytes: " +
                         std::to_string(dirty) + " of its " + std::to_string(im.opt.capacity) +
                         " bytes hold chunks not yet in the repository and " + std::to_string(reading) +
                         " bytes chunks being read (the flusher frees space as it writes dirty chunks to the "
                         "repository)");
    return st;
  }

  // Write the bytes, make them durable, then record them.
  std::vector<IoRequest> reqs;
  std::vector<std::unique_ptr<AlignedBuffer>> keep;
  Status st;
  for (const auto& pl : planned)
    if (st.is_ok()) st = im.write_extent(pl.offset, pl.put->data, pl.put->length, reqs, keep);
  if (st.is_ok() && !reqs.empty()) st = im.data->write_many(reqs);
  if (st.is_ok() && !planned.empty()) st = im.data->sync(true);
  if (!st.is_ok()) {
    {
      std::lock_guard l(im.mu);
      give_back_locked();  // nothing names these bytes
    }
    return st.with_context("writing to the burst buffer " + im.data_path);
  }
  std::string records;
  for (const auto& pl : planned)
    append_record(records, kPut, put_payload(pl.put->hash, pl.offset, pl.put->length, pl.put->dirty));
  Status js = im.append(records, true, [&] {
    for (const auto& pl : planned) {
      im.entries[pl.put->hash] = Entry{pl.offset, pl.put->length, pl.put->dirty, 0};
      im.policy->track(pl.put->hash, pl.put->length);
      im.bytes_in += pl.put->length;
      if (pl.put->dirty) im.dirty_bytes += pl.put->length;
    }
  });
  if (!js.is_ok()) {
    // The bytes are written but their records may or may not be in the journal. The append marked
    // the journal broken, so it is rewritten from the state (which lacks these chunks) before any
    // other record: the extents can be given out again.
    std::lock_guard l(im.mu);
    give_back_locked();
    return js.with_context("writing the burst buffer journal");
  }
  return im.maybe_compact();
}

Status NvmeTier::put_model(uint64_t seq, const std::string& id, const std::string& manifest_json) {
  std::string p, rec;
  put_u64(p, seq);
  put_u32(p, static_cast<uint32_t>(id.size()));
  p += id;
  p += manifest_json;
  if (p.size() > kMaxRecordPayload)
    return invalid_argument("model '" + id + "': its manifest is larger than a burst buffer record may be");
  append_record(rec, kModel, p);
  std::lock_guard jl(impl_->jmu);
  {
    std::lock_guard l(impl_->mu);
    impl_->models[id] = PendingModel{seq, id, manifest_json};
  }
  return impl_->append_locked(rec, true).with_context("recording model '" + id + "' in the burst buffer");
}

Status NvmeTier::model_done(const std::string& id) {
  std::string rec;
  std::lock_guard jl(impl_->jmu);
  {
    std::lock_guard l(impl_->mu);
    if (!impl_->models.erase(id)) return Status::ok();
  }
  append_record(rec, kDone, id);
  return impl_->append_locked(rec, false);
}

bool NvmeTier::contains(const ChunkHash& hash) const {
  std::lock_guard l(impl_->mu);
  return impl_->entries.count(hash) && !impl_->doomed.count(hash);
}

bool NvmeTier::is_dirty(const ChunkHash& hash) const {
  std::lock_guard l(impl_->mu);
  auto it = impl_->entries.find(hash);
  return it != impl_->entries.end() && it->second.dirty;
}

Status NvmeTier::read(const ChunkHash& hash, void* dst, uint64_t length) {
  Impl& im = *impl_;
  uint64_t offset;
  {
    std::lock_guard l(im.mu);
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
  Status st = im.read_extent(offset, dst, length);
  bool bad = st.is_ok() && hash_bytes(dst, length) != hash;
  bool drop = false;
  {
    std::lock_guard l(im.mu);
    auto it = im.entries.find(hash);
    --it->second.pins;
    if (bad) {
      ++im.corrupt;
      im.doomed[hash] = true;
    }
    if (st.is_ok() && !bad) {
      ++im.hits;
      im.policy->touch(hash);
    }
    drop = it->second.pins == 0 && im.doomed.count(hash);
  }
  if (drop) {
    // The last reader of a removed or corrupt chunk drops it (with jmu, so that its DEL record is
    // journalled in order; a put or remove in between may have settled it already).
    std::lock_guard jl(im.jmu);
    std::string records;
    {
      std::lock_guard l(im.mu);
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
    CAIRN_LOG_ERROR("burst buffer {}: chunk {} at [{}, +{}) does not match its hash; copy dropped", im.data_path,
                    hash.hex(), offset, length);
    return corruption("chunk " + hash.hex() + " in the burst buffer " + im.data_path + " at offset " +
                      std::to_string(offset) + " does not match its hash (the copy was dropped)");
  }
  return st.with_context("reading chunk " + hash.hex() + " from the burst buffer");
}

void NvmeTier::mark_clean(const ChunkHash& hash) {
  std::string rec;
  std::lock_guard jl(impl_->jmu);
  {
    std::lock_guard l(impl_->mu);
    auto it = impl_->entries.find(hash);
    if (it == impl_->entries.end() || !it->second.dirty) return;
    it->second.dirty = false;
    impl_->dirty_bytes -= it->second.length;
  }
  // Not synced: if the record is lost, recovery verifies the chunk as dirty and finds it is in the
  // repository anyway.
  append_record(rec, kClean, hash_payload(hash));
  (void)impl_->append_locked(rec, false);
}

void NvmeTier::remove(const ChunkHash& hash) {
  std::string rec;
  std::lock_guard jl(impl_->jmu);
  {
    std::lock_guard l(impl_->mu);
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
  std::lock_guard l(impl_->mu);
  std::vector<ChunkHash> out;
  for (const auto& [h, e] : impl_->entries)
    if (e.dirty) out.push_back(h);
  return out;
}

TierStats NvmeTier::stats() const {
  std::lock_guard l(impl_->mu);
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
    if (!st.is_ok() && st.code() != StatusCode::kNotFound) return st;
  }
  if (im.lock_fd >= 0) {
    (void)im.fs->unlink(im.lock_path);
    ::close(im.lock_fd);
    im.lock_fd = -1;
  }
  return Status::ok();
}

}  // namespace cairn
