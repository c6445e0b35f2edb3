// The write path. A commit plans which of its chunks are new, writes them (to this writer's pack
// segment, or to a pack of its own when they are many bytes), adds the model to the catalog and
// queues its commit record; the group commit then writes every queued record with one write and
// one fdatasync of the log (after an fdatasync of the segment), so a batch of commits costs one
// sync, not one each.
//
// Crash-safety: chunk bytes are durable before the record that names them (the segment is synced
// before the log in the same group write; a pack of its own is published with AtomicFileWriter
// before its record is queued). A crash leaves at worst bytes no record names (inert; gc punches
// them once the writer is known dead) and a torn record at the end of the log (never
// acknowledged; readers stop before it). A failed group write is cut off the log again
// (ftruncate), its models leave the catalog and their callers get the error.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/safetensors.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;
using pfs::AtomicFileWriter;
using pfs::join_path;
using pfs::kPackSuffix;
using pfs::quote;
using pfs::RecordType;
using pfs::starts_with;

constexpr std::string_view kChunkEntryPrefix = "__chunk__.";
constexpr std::string_view kCodedEntryPrefix = "__coded__.";

std::string seq6(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%06u", v);
  return buf;
}

}  // namespace

// ---- this writer's files ----

Status Repository::Impl::ensure_log() {
  uint64_t written = 0;
  {
    std::lock_guard lock(sync_mu_);
    written = log_written_ + queued_.size();
  }
  if (log_ && written < options_.log_bytes) return Status::OK();
  if (log_) {
    // Roll over: everything queued goes to the old log, then a seal record ends it.
    CAIRN_RETURN_IF_ERROR(wait_durable(queued_gen()));
    json seal = {{"log", log_name_}};
    std::string rec = pfs::encode_record(RecordType::kSeal, seal.dump());
    std::lock_guard lock(sync_mu_);
    if (log_->pwrite(rec.data(), rec.size(), log_written_).ok() && log_->sync(true).ok()) log_written_ += rec.size();
    own_sealed_logs_[log_name_] = log_written_;
    {
      WriterLock clock(mu_);
      sealed_.insert(log_name_);
    }
    log_.reset();
  }
  CAIRN_RETURN_IF_ERROR(coord_->register_writer());
  std::string name = wid() + "-" + seq6(++file_seq_) + std::string(pfs::kLogSuffix);
  CAIRN_ASSIGN_OR_RETURN(auto f, fs_->open(join_path(logs_dir_, name), kCreate | kExclusive));
  // The log's directory entry is durable before any record in it is acknowledged.
  CAIRN_RETURN_IF_ERROR(fs_->sync_dir(logs_dir_).with_context("creating log " + name));
  std::lock_guard lock(sync_mu_);
  log_ = std::move(f);
  log_name_ = name;
  log_written_ = 0;
  return Status::OK();
}

Status Repository::Impl::ensure_segment(uint64_t more_bytes) {
  if (seg_ && (seg_end_ + more_bytes <= options_.segment_bytes || seg_end_ == pfs::kSegmentHeaderBytes))
    return Status::OK();
  if (seg_) {
    // Sealed: its bytes are synced by the records queued so far; no more go in.
    CAIRN_RETURN_IF_ERROR(wait_durable(queued_gen()));
    {
      std::lock_guard lock(sync_mu_);
      if (seg_dirty_) CAIRN_RETURN_IF_ERROR(seg_->sync(true));
      seg_dirty_ = false;
    }
    json seal = {{"pack", seg_name_}};
    CAIRN_RETURN_IF_ERROR(append_durable(pfs::encode_record(RecordType::kSeal, seal.dump()), 1));
    {
      WriterLock clock(mu_);
      sealed_.insert(seg_name_);
    }
    std::lock_guard lock(sync_mu_);
    seg_.reset();
  }
  CAIRN_RETURN_IF_ERROR(coord_->register_writer());
  std::string name = wid() + "-" + seq6(++file_seq_) + std::string(pfs::kSegmentSuffix);
  std::string path = join_path(packs_dir_, name);
  CAIRN_ASSIGN_OR_RETURN(auto f, fs_->open(path, kCreate | kExclusive));
  std::string header = "cairn-pack-segment 2\n" + wid() + "\n";
  header.resize(pfs::kSegmentHeaderBytes, '\n');
  Status s = f->pwrite(header.data(), header.size(), 0);
  if (s.ok()) s = f->sync(true);
  if (s.ok()) s = fs_->sync_dir(packs_dir_);
  if (!s.ok()) {
    (void)fs_->unlink(path);
    return s.with_context("creating pack segment " + path);
  }
  std::lock_guard lock(sync_mu_);
  seg_ = std::move(f);
  seg_name_ = name;
  seg_end_ = pfs::kSegmentHeaderBytes;
  return Status::OK();
}

void Repository::Impl::seal() {
  std::lock_guard wlock(write_mu_);
  if (!log_) return;
  if (!wait_durable(queued_gen()).ok()) return;
  json seal = {{"log", log_name_}};
  if (seg_) seal["pack"] = seg_name_;
  (void)append_durable(pfs::encode_record(RecordType::kSeal, seal.dump()), 1);
}

// ---- group commit ----

uint64_t Repository::Impl::queue_records(const std::string& bytes, uint64_t count) {
  std::lock_guard lock(sync_mu_);
  queued_ += bytes;
  queued_gen_ += count;
  return queued_gen_;
}

uint64_t Repository::Impl::queued_gen() {
  std::lock_guard lock(sync_mu_);
  return queued_gen_;
}

Status Repository::Impl::wait_durable(uint64_t gen) {
  std::unique_lock lock(sync_mu_);
  for (;;) {
    for (const auto& [lo, failure] : failed_)
      if (gen >= lo && gen <= failure.first) return failure.second;
    if (durable_gen_ >= gen && !syncing_) return Status::OK();
    if (durable_gen_ >= gen) return Status::OK();
    if (syncing_) {
      sync_cv_.wait(lock);
      continue;
    }
    // Lead one group write: everything queued so far.
    syncing_ = true;
    std::string bytes = std::move(queued_);
    queued_.clear();
    const uint64_t upto = queued_gen_;
    const bool seg_dirty = seg_dirty_;
    seg_dirty_ = false;
    const uint64_t at = log_written_;
    File* seg = seg_.get();
    File* log = log_.get();
    lock.unlock();
    Status s;
    if (seg_dirty && seg != nullptr) s = seg->sync(true).with_context("syncing pack segment");
    if (s.ok() && !bytes.empty()) {
      if (log == nullptr) {
        s = internal_error("records queued without a log");
      } else {
        s = log->pwrite(bytes.data(), bytes.size(), at);
        if (s.ok()) s = log->sync(true);
        if (!s.ok()) {
          s = s.with_context("writing the repository log " + join_path(logs_dir_, log_name_));
          (void)log->truncate(at);  // readers never see the failed batch
        }
      }
    }
    lock.lock();
    if (s.ok()) {
      log_written_ = at + bytes.size();
      ++group_syncs_;
    } else {
      failed_[durable_gen_ + 1] = {upto, s};
    }
    durable_gen_ = upto;
    syncing_ = false;
    sync_cv_.notify_all();
  }
}

Status Repository::Impl::append_durable(const std::string& bytes, uint64_t count) {
  CAIRN_RETURN_IF_ERROR(ensure_log());
  return wait_durable(queue_records(bytes, count));
}

// ---- commit ----

Status Repository::Impl::commit_batch(std::vector<ModelManifest>& ms, const Repository::ChunkSource& src,
                                      std::vector<Status>* results, const Repository::ChunkSource& resident) {
  results->assign(ms.size(), Status::OK());
  Status first;
  auto fail_all = [&](const Status& s) {
    for (Status& r : *results) r = s;
    return s;
  };
  if (!writable_) return fail_all(check_writable());
  // Plans dedup against the catalog: it must not be older than half the gc grace (gc frees bytes
  // a grace after the records that made them dead).
  Status rs = refresh_if_older(options_.gc_grace / 4);
  if (!rs.ok()) return fail_all(rs.with_context("committing"));
  std::vector<size_t> staged;
  std::vector<bool> claimed_here(ms.size(), false);
  uint64_t gen = 0;
  const auto planned_at = std::chrono::steady_clock::now();
  {
    std::lock_guard wlock(write_mu_);
    Status ls = ensure_log();
    if (!ls.ok()) return fail_all(ls.with_context("committing"));
    std::string records;
    for (size_t i = 0; i < ms.size(); ++i) {
      ModelManifest& m = ms[i];
      Status s;
      if (!coord_->holds(m.id)) {
        s = coord_->claim(m.id);
        if (s.ok()) {
          claimed_here[i] = true;
          bool known = false;
          {
            std::lock_guard rlock(refresh_mu_);
            bool reload = false;
            RefreshReport ignored;
            s = read_logs(&ignored, &reload, /*own_too=*/false);
            if (reload) reload_needed_ = true;
          }
          {
            ReaderLock lock(mu_);
            known = models_.count(m.id) != 0;
          }
          if (s.ok() && known)
            s = already_exists("committing model " + quote(m.id) + ": it is already in repository " + dir_ +
                               "; models are immutable, commit under a new id");
        }
      }
      std::string rec;
      if (s.ok()) s = stage(m, src, resident, &rec);
      if (!s.ok()) {
        (*results)[i] = s;
        if (first.ok()) first = s;
        // The commit will not happen: the id is free again (also when the daemon claimed it).
        if (s.code() != StatusCode::kExists || claimed_here[i]) coord_->release(m.id);
        continue;
      }
      records += rec;
      staged.push_back(i);
    }
    if (!staged.empty()) gen = queue_records(records, staged.size());
  }
  if (staged.empty()) return first;
  Status d = wait_durable(gen);
  if (auto took = std::chrono::steady_clock::now() - planned_at; d.ok() && took > options_.gc_grace / 2)
    CAIRN_LOG_WARN(
        "repository {}: a commit took {} ms from plan to sync, more than half the gc grace ({} ms): the "
        "gc grace assumption did not hold (a gc of another daemon may have freed a chunk it reuses); "
        "raise gc_grace on a filesystem this slow",
        dir_, std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), options_.gc_grace.count());
  if (!d.ok()) {
    WriterLock lock(mu_);
    for (auto it = staged.rbegin(); it != staged.rend(); ++it) drop_model(ms[*it].id);
  }
  for (size_t i : staged) {
    if (!d.ok()) {
      (*results)[i] = d;
      if (first.ok()) first = d;
      coord_->release(ms[i].id);
    } else {
      coord_->settle(ms[i].id);
    }
  }
  return first;
}

namespace {

using pfs::NewChunk;

// Codes a commit's new chunks on worker threads (one per core, or options.coding_threads), in
// order, while the committing thread writes those already coded (wait, ready). A chunk that does
// not code well stays raw; off: every chunk is raw and ready at once.
class ChunkCoder {
 public:
  using Reader = std::function<Status(const ChunkRef&, void*)>;
  ChunkCoder(std::vector<NewChunk>& chunks, const Repository::ChunkSource& resident, Reader read,
             const CodingOptions& options, size_t threads, bool on)
      : read_(std::move(read)), options_(options), chunks_(chunks), done_(chunks.size(), on ? 0 : 1) {
    if (!on || chunks.empty()) return;
    // A base's bytes from the caller when it has them in memory (the daemon's arena usually holds
    // the parent), checked against the base's hash; the others are read from the repository by the
    // worker that codes the chunk.
    if (resident)
      for (NewChunk& nc : chunks) {
        if (!nc.base) continue;
        Result<const void*> r = resident(nc.base->hash, nc.length);
        if (r.ok() && *r != nullptr && hash_bytes(*r, nc.length) == nc.base->hash) nc.base_data = *r;
      }
    if (threads == 0) threads = std::thread::hardware_concurrency();
    threads = std::max<size_t>(1, std::min(threads, chunks.size()));
    for (size_t t = 0; t < threads; ++t) {
      try {
        pool_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        if (pool_.empty()) work();  // no thread to be had: code them all here
        break;
      }
    }
  }
  ~ChunkCoder() {
    for (std::thread& t : pool_) t.join();
  }
  ChunkCoder(const ChunkCoder&) = delete;
  ChunkCoder& operator=(const ChunkCoder&) = delete;

  // Blocks until chunk i is coded.
  void wait(size_t i) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_[i] != 0; });
  }
  bool ready(size_t i) {
    std::lock_guard lock(mu_);
    return done_[i] != 0;
  }

 private:
  void work() {
    std::vector<uint8_t> base;
    for (size_t i; (i = next_.fetch_add(1)) < chunks_.size();) {
      NewChunk& nc = chunks_[i];
      const void* b = nc.base_data;
      if (nc.base && b == nullptr) {
        base.resize(nc.length);
        if (read_(*nc.base, base.data()).ok()) b = base.data();
      }
      nc.coded = encode_chunk(nc.data, nc.length, nc.width, b, options_);
      if (nc.coded.coding == ChunkCoding::kDelta && b == nullptr) nc.coded = EncodedChunk{};
      std::lock_guard lock(mu_);
      done_[i] = 1;
      cv_.notify_all();
    }
  }

  Reader read_;
  CodingOptions options_;
  std::vector<NewChunk>& chunks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> done_;
  std::atomic<size_t> next_{0};
  std::vector<std::thread> pool_;
};

// A pack of its own's entries, once its chunks are coded: a tensor whose new chunks are all of it,
// unrepeated and raw is one entry under its name; every other new chunk an entry of its own.
// tensor_first[t] .. tensor_first[t + 1] are the new chunks tensor t introduced.
std::vector<safetensors::TensorEntry> pack_entries(const ModelManifest& m, const std::vector<NewChunk>& chunks,
                                                   const std::vector<size_t>& tensor_first,
                                                   const std::vector<bool>& whole_candidate, bool bound = false) {
  std::vector<safetensors::TensorEntry> entries;
  const TensorList& tensors = m.tensors;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const size_t first = tensor_first[ti], next = tensor_first[ti + 1];
    if (first == next) continue;
    bool whole = whole_candidate[ti];
    for (size_t q = first; whole && !bound && q < next; ++q) whole = chunks[q].coded.coding == ChunkCoding::kRaw;
    if (whole) {
      const TensorManifest& t = tensors[ti];
      safetensors::TensorEntry e;
      e.name = t.name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      entries.push_back(std::move(e));
      if (!bound) continue;
    }
    for (size_t q = first; q < next; ++q) {
      const NewChunk& nc = chunks[q];
      const bool raw = nc.coded.coding == ChunkCoding::kRaw;
      safetensors::TensorEntry e;
      e.name = std::string(raw ? kChunkEntryPrefix : kCodedEntryPrefix) + nc.hash.hex();
      e.dtype = DType::kU8;
      e.shape = {static_cast<int64_t>(bound ? nc.length : nc.stored_bytes())};
      entries.push_back(std::move(e));
    }
  }
  return entries;
}

}  // namespace

// The bytes a pack of its own keeps for its header before its data (a multiple of 8): the header
// with every new chunk both in a whole-tensor entry (where it may be one) and in an entry of its
// own, at its raw length, is longer than the one its coding will give.
Result<uint64_t> Repository::Impl::header_room(const ModelManifest& m, const std::vector<NewChunk>& chunks,
                                               const std::vector<size_t>& tensor_first,
                                               const std::vector<bool>& whole_candidate,
                                               const std::map<std::string, std::string>& meta) const {
  std::vector<safetensors::TensorEntry> entries = pack_entries(m, chunks, tensor_first, whole_candidate, true);
  Result<std::string> header = safetensors::build_header(entries, &meta);
  if (!header.ok())
    return header.status().with_context("committing model " + quote(m.id) + ": building the pack header");
  return (header->size() + 7) / 8 * 8;
}

Status Repository::Impl::stage(ModelManifest& in, const Repository::ChunkSource& src,
                               const Repository::ChunkSource& resident, std::string* record) {
  const std::string model = "model " + quote(in.id);
  {
    // A child that shares its parent's tensor list (a metadata-only commit) has tensors the
    // repository checked when the parent was committed: only the rest is checked again.
    bool inherited_whole = false;
    if (!in.parent.empty()) {
      ReaderLock lock(mu_);
      auto pit = models_.find(in.parent);
      inherited_whole = pit != models_.end() && !in.tensors.empty() && in.tensors.shares_with(pit->second->tensors);
    }
    Status s;
    if (inherited_whole) {
      ModelManifest head = in;
      head.tensors.clear();
      s = validate_manifest(head, /*with_locations=*/false);
    } else {
      s = validate_manifest(in, /*with_locations=*/false);
      if (s.ok()) s = validate_chunking(in, chunk_size_);
    }
    if (!s.ok()) return s.with_context("committing " + model);
  }
  ModelManifest m = in;
  std::shared_ptr<const ModelManifest> parent;

  // Plan: which chunks are new (each once, in the model's order) and, for each, the chunk it may be
  // coded against: the same byte range of the parent's tensor of the same name, dtype and shape,
  // where that is stored whole (a delta's own base otherwise), so a read costs one extra chunk at
  // most.
  std::vector<NewChunk> new_chunks;
  std::unordered_map<ChunkHash, size_t, ChunkHashHasher> placed;  // hash -> index in new_chunks
  std::vector<bool> whole_candidate;                              // per tensor: every chunk new, none repeated
  std::vector<size_t> tensor_first;  // per tensor: the new chunks it introduced, [first, next tensor's)
  {
    ReaderLock lock(mu_);
    if (models_.count(m.id))
      return already_exists(model + " is already in repository " + dir_ +
                            "; models are immutable, commit under a new id");
    if (!m.parent.empty()) {
      auto pit = models_.find(m.parent);
      if (pit == models_.end())
        return not_found("parent " + quote(m.parent) + " of " + model + " is not in repository " + dir_ +
                         "; commit the parent first");
      parent = pit->second;
    }
    const bool deltas = options_.compress && options_.deltas && parent && !parent->tensors.empty();
    std::unordered_map<std::string_view, const TensorManifest*> parent_by_name;
    auto parent_tensor = [&](size_t ti, const TensorManifest& t) -> const TensorManifest* {
      if (!deltas) return nullptr;
      const TensorList& pts = parent->tensors;
      const TensorManifest* pt = nullptr;
      if (ti < pts.size() && pts[ti].name == t.name) {
        pt = &pts[ti];
      } else {
        if (parent_by_name.empty())
          for (const TensorManifest& x : pts) parent_by_name.emplace(x.name, &x);
        auto it = parent_by_name.find(t.name);
        if (it != parent_by_name.end()) pt = it->second;
      }
      return pt && pt->dtype == t.dtype && pt->shape == t.shape ? pt : nullptr;
    };
    // Read-only walks go through a const reference: a tensor list shared with the parent stays shared.
    const TensorList& tensors = m.tensors;
    whole_candidate.assign(tensors.size(), false);
    tensor_first.assign(tensors.size() + 1, 0);
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      const TensorManifest& t = tensors[ti];
      tensor_first[ti] = new_chunks.size();
      for (const ChunkRef& c : t.chunks) {
        auto it = chunks_.find(c.hash);
        if (it != chunks_.end() && it->second.ref.length != c.length)
          return invalid_argument("committing " + model + ": tensor " + quote(t.name) + " has chunk " + c.hash.hex() +
                                  " of " + std::to_string(c.length) + " bytes, but the repository holds it with " +
                                  std::to_string(it->second.ref.length));
      }
      bool whole = t.nbytes > 0 && t.name != "__metadata__" && !starts_with(t.name, kChunkEntryPrefix) &&
                   !starts_with(t.name, kCodedEntryPrefix);
      if (whole) {
        std::unordered_set<ChunkHash, ChunkHashHasher> own;
        for (const ChunkRef& c : t.chunks)
          if (chunks_.count(c.hash) || placed.count(c.hash) || !own.insert(c.hash).second) {
            whole = false;
            break;
          }
      }
      whole_candidate[ti] = whole;
      const TensorManifest* pt = parent_tensor(ti, t);
      for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
        const ChunkRef& c = t.chunks[ci];
        if (chunks_.count(c.hash) || placed.count(c.hash)) continue;
        NewChunk nc;
        nc.hash = c.hash;
        nc.length = c.length;
        nc.width = coding_width(t.dtype);
        if (pt && ci < pt->chunks.size() && pt->chunks[ci].length == c.length) {
          const ChunkRef& pc = pt->chunks[ci];
          ChunkRef b = pc.coding == ChunkCoding::kDelta && pc.base ? *pc.base : pc;
          if (!b.pack.empty() && b.coding != ChunkCoding::kDelta && !b.base) nc.base = std::move(b);
        }
        placed.emplace(c.hash, new_chunks.size());
        new_chunks.push_back(std::move(nc));
      }
    }
    tensor_first[tensors.size()] = new_chunks.size();
    // Chunks the repository holds already (inherited ones among them) take its location; the
    // others get one in the new pack below, whatever the caller put there.
    auto located = [&](const ChunkRef& c) CAIRN_REQUIRES_SHARED(mu_) {
      auto it = chunks_.find(c.hash);
      if (it != chunks_.end()) return it->second.ref;
      ChunkRef r = c;
      r.pack.clear();
      r.offset = 0;
      r.coding = ChunkCoding::kRaw;
      r.stored = 0;
      r.base.reset();
      return r;
    };
    bool relocate = false;
    for (const TensorManifest& t : tensors)
      for (const ChunkRef& c : t.chunks) relocate = relocate || !(located(c) == c);
    if (relocate)
      for (TensorManifest& t : m.tensors.mut())
        for (ChunkRef& c : t.chunks) c = located(c);
  }

  // The bytes of the new chunks, checked against their hashes.
  if (!new_chunks.empty() && !src)
    return invalid_argument("committing " + model + ": " + std::to_string(new_chunks.size()) +
                            " chunks are new to the repository but no chunk source was given");
  for (NewChunk& nc : new_chunks) {
    Result<const void*> r = src(nc.hash, nc.length);
    if (!r.ok()) return r.status().with_context("committing " + model + ": fetching chunk " + nc.hash.hex());
    if (*r == nullptr)
      return invalid_argument("committing " + model + ": the chunk source gave no bytes for chunk " + nc.hash.hex());
    nc.data = *r;
    if (hash_bytes(nc.data, nc.length) != nc.hash)
      return invalid_argument("committing " + model + ": the bytes given for chunk " + nc.hash.hex() + " (" +
                              std::to_string(nc.length) +
                              " bytes) do not hash to it; the manifest and the data disagree");
  }
  // Coding runs on worker threads (when on) while this thread writes the chunks already coded, in
  // order: the pack's bytes are the new chunks' stored bytes in new_chunks order whatever its
  // entries turn out to be, so a chunk's place is known once those before it are coded.
  ChunkCoder coder(
      new_chunks, resident, [this](const ChunkRef& ref, void* dst) { return read_chunk(ref, dst); }, options_.coding,
      options_.coding_threads, options_.compress);
  uint64_t raw_bytes = 0;
  for (const NewChunk& nc : new_chunks) raw_bytes += nc.length;

  auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // A creation time given by the caller is kept: the daemon stamps a model when it becomes visible,
  // and that stamp is its identity to the readers who opened it before it reached the repository.
  // Restamping it here (because another daemon's later model was seen by a refresh, or because two
  // of this daemon's commits became visible in one order and reached the flusher in the other) made
  // their next read fail as if the id had been deleted and committed again; the torture harness
  // found both. A commit without one (the `cairn` tool without a daemon) takes a stamp after every
  // one this handle has seen or made.
  if (in.created_ns > 0) {
    m.created_ns = in.created_ns;
  } else {
    ReaderLock lock(mu_);
    m.created_ns = std::max<int64_t>(now, std::max(last_created_ns_, own_last_created_ns_) + 1);
  }

  // Metadata that cannot be written as JSON fails the commit before any byte is written.
  try {
    (void)m.metadata.dump();
    (void)m.architecture.dump();
  } catch (const json::exception& e) {
    return invalid_argument("committing " + model + ": metadata or architecture cannot be written as JSON (" +
                            e.what() + "); strings must be valid UTF-8");
  }

  // Where the new chunks go: a pack of their own (a safetensors file) when their raw bytes are
  // many, else the end of this writer's segment. A pack of its own is written under a temporary
  // name with room for its header first, the header last (the entries depend on the coding), then
  // synced and renamed into place.
  const bool own_pack = !new_chunks.empty() && raw_bytes >= options_.own_pack_bytes;
  std::map<std::string, std::string> meta{{"cairn.format", std::to_string(pfs::kFormatVersion)},
                                          {"cairn.model", m.id},
                                          {"cairn.parent", m.parent},
                                          {"cairn.chunk_size", std::to_string(chunk_size_)}};
  std::string pack_name;
  std::unique_ptr<File> own;
  std::string tmp_path;
  uint64_t data_at = 0;  // where the first new chunk goes
  if (own_pack) {
    CAIRN_ASSIGN_OR_RETURN(data_at, header_room(m, new_chunks, tensor_first, whole_candidate, meta));
    pack_name = wid() + "-" + seq6(++file_seq_) + std::string(kPackSuffix);
    tmp_path = join_path(packs_dir_, tmp_name());
    Result<std::unique_ptr<File>> f = fs_->open(tmp_path, kCreate | kExclusive);
    if (!f.ok()) return f.status().with_context("committing " + model + ": writing its pack");
    own = std::move(f).value();
  } else if (!new_chunks.empty()) {
    // Room for the raw bytes: the stored ones are no more.
    CAIRN_RETURN_IF_ERROR(ensure_segment(raw_bytes).with_context("committing " + model));
    data_at = seg_end_;
    pack_name = seg_name_;
  }
  auto fail = [&](const Status& st, const std::string& doing) {
    if (own) {
      own.reset();
      (void)fs_->unlink(tmp_path);  // best effort: the next open of the repository removes stray temporaries
    }
    return st.with_context("committing " + model + ": " + doing);
  };
  const std::string writing = own_pack ? "writing its pack" : "writing to pack segment " + seg_name_;
  File* out = own_pack ? own.get() : seg_.get();
  uint64_t off = data_at;
  {
    // Each run of chunks that are coded goes out as one batch.
    std::vector<IoRequest> batch;
    for (size_t i = 0; i < new_chunks.size(); ++i) {
      coder.wait(i);
      NewChunk& nc = new_chunks[i];
      nc.offset = off;
      off += nc.stored_bytes();
      batch.push_back({const_cast<void*>(nc.stored()), static_cast<size_t>(nc.stored_bytes()), nc.offset});
      if (i + 1 == new_chunks.size() || !coder.ready(i + 1)) {
        Status st = out->write_many(batch);
        if (!st.ok()) return fail(st, writing);
        batch.clear();
      }
    }
  }
  const uint64_t data_bytes = off - data_at;

  // The pack's entries: a tensor whose chunks are all new, unrepeated and stored raw is one entry
  // under its own name; every other new chunk is an entry of its own (__chunk__.<hash> raw,
  // __coded__.<hash> coded).
  if (own_pack) {
    std::vector<safetensors::TensorEntry> entries = pack_entries(m, new_chunks, tensor_first, whole_candidate);
    Result<std::string> header = safetensors::build_header(entries, &meta);
    if (!header.ok()) return fail(header.status(), "building the pack header");
    std::string prefix = std::move(header).value();
    if (prefix.size() > data_at)
      return fail(internal_error("the pack header takes " + std::to_string(prefix.size()) + " bytes, more than the " +
                                 std::to_string(data_at) + " left for it"),
                  "building the pack header");
    // Padded with spaces (as safetensors pads) to end where the data begins.
    prefix.append(data_at - prefix.size(), ' ');
    const uint64_t json_len = data_at - 8;
    for (int b = 0; b < 8; ++b) prefix[static_cast<size_t>(b)] = static_cast<char>(json_len >> (8 * b));
    if (!entries.empty() && data_at + entries.back().end != off)
      return fail(internal_error("pack entries laid out with a size other than their chunks'"),
                  "building the pack header");
    Status st = own->pwrite(prefix.data(), prefix.size(), 0);
    if (st.ok()) st = own->sync(/*data_only=*/false);
    if (st.ok()) {
      own.reset();
      st = fs_->rename(tmp_path, join_path(packs_dir_, pack_name));
      if (st.ok()) {
        st = fs_->sync_dir(packs_dir_);
        if (!st.ok()) (void)fs_->unlink(join_path(packs_dir_, pack_name));
      } else {
        (void)fs_->unlink(tmp_path);
      }
    }
    if (!st.ok()) return fail(st, writing);
  } else if (!new_chunks.empty()) {
    seg_end_ += data_bytes;
    std::lock_guard lock(sync_mu_);
    seg_dirty_ = true;
  }
  own_last_created_ns_ = std::max(own_last_created_ns_, m.created_ns);

  if (!new_chunks.empty())
    for (TensorManifest& t : m.tensors.mut())
      for (ChunkRef& c : t.chunks) {
        auto it = placed.find(c.hash);
        if (it == placed.end()) continue;
        const NewChunk& nc = new_chunks[it->second];
        c.pack = pack_name;
        c.offset = nc.offset;
        c.coding = nc.coded.coding;
        c.stored = nc.coded.coding == ChunkCoding::kRaw ? 0 : nc.coded.bytes.size();
        c.base = nc.coded.coding == ChunkCoding::kDelta ? std::make_shared<const ChunkRef>(*nc.base) : nullptr;
      }
  m.pack = pack_name;
  for (const TensorManifest& t : std::as_const(m.tensors))
    for (const ChunkRef& c : t.chunks)
      if (c.pack.empty()) return internal_error("committing " + model + ": a chunk has no location");

  // The record (the bytes it names are written: a failure from here on leaves them inert).
  std::string payload;
  try {
    payload = encode_commit(m, parent.get());
  } catch (const json::exception& e) {
    return invalid_argument("committing " + model + ": metadata or architecture cannot be written as JSON (" +
                            e.what() + "); strings must be valid UTF-8");
  }

  // In the catalog (visible to this process) now; durable with its record.
  auto shared = std::make_shared<const ModelManifest>(m);
  {
    WriterLock lock(mu_);
    Status s = add_model(shared);
    if (!s.ok()) return s.with_context("committing " + model);
  }
  *record = pfs::encode_record(RecordType::kCommit, payload);
  in = std::move(m);
  return Status::OK();
}

}  // namespace cairn
