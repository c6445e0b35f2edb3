// Opening a repository: the FORMAT file (a version-1 repository is migrated), the catalog load
// (the newest checkpoint and the logs' tails, repository_sync.cpp), and the catalog's bookkeeping
// (a model added, dropped, or its data released), which every other part uses.
//
// Open deletes nothing another process may be writing: what a crash leaves (temporary files, data
// no record names, a torn record at the end of a dead writer's log) is inert, and gc removes it
// under the maintenance lease once its writer is known to be gone.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/safetensors.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using pfs::AtomicFileWriter;
using pfs::ends_with;
using pfs::fsync_dir;
using pfs::join_path;
using pfs::kMaxChunkSize;
using pfs::kTmpPrefix;
using pfs::list_dir;
using pfs::pread_all;
using pfs::quote;
using pfs::starts_with;
using pfs::UniqueFd;

constexpr std::string_view kFormatMagic = "cairn-repository";
using pfs::kFormatVersion;
constexpr const char* kFormatFile = "FORMAT";
constexpr const char* kLockFile = "LOCK";  // version 1's writer lock: ignored

// mkdir -p with mode 0755 for the directories it creates.
Status make_dirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    cur = path.substr(0, next);
    pos = next + 1;
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("creating directory " + cur, errno);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_status("checking directory " + path, errno);
  if (!S_ISDIR(st.st_mode)) return invalid_argument(path + " exists and is not a directory");
  return Status::OK();
}

}  // namespace

// The whole file; kNotFound (errno_status maps ENOENT) when absent.
Status read_small_file(const std::string& path, uint64_t max_bytes, std::string* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("opening " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("checking " + path, errno);
  if (!S_ISREG(st.st_mode)) return corruption(path + " is not a regular file");
  auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    return corruption(path + " is " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
                      " a file of its kind may hold");
  out->assign(size, '\0');
  size_t got = 0;
  CAIRN_RETURN_IF_ERROR(pread_all(fd.get(), out->data(), out->size(), 0, path, &got));
  out->resize(got);
  return Status::OK();
}

// ---- open: FORMAT ----

Status Repository::Impl::check_writable() {
  if (writable_) return Status::OK();
  return permission_denied("repository " + dir_ + " is not writable by this process; it can be read, not changed");
}

Status Repository::Impl::write_format(int version) {
  std::string content(kFormatMagic);
  content.append(" ").append(std::to_string(version)).append("\nchunk_size ").append(std::to_string(chunk_size_));
  content.append("\n");
  std::vector<iovec> iov{{content.data(), content.size()}};
  bool replacing = fs_->exists(join_path(dir_, kFormatFile));
  return AtomicFileWriter::publish(*fs_, dir_, kFormatFile, iov, tmp_name(), replacing);
}

Status Repository::Impl::init_or_read_format(uint64_t chunk_size, int* version) {
  std::string path = join_path(dir_, kFormatFile);
  std::string text;
  Status s = read_small_file(path, 4096, &text);
  if (s.code() == StatusCode::kNotFound) {
    CAIRN_RETURN_IF_ERROR(check_writable());
    if (chunk_size == 0 || chunk_size > kMaxChunkSize)
      return invalid_argument("chunk size " + std::to_string(chunk_size) + " for new repository " + dir_ +
                              " must be 1.." + std::to_string(kMaxChunkSize) + " bytes");
    std::vector<std::string> names;
    CAIRN_RETURN_IF_ERROR(list_dir(dir_, &names));
    for (const std::string& n : names) {
      if (n == kLockFile) continue;
      if (starts_with(n, kTmpPrefix) || n == kFormatFile) continue;  // another process creating it too
      return invalid_argument("directory " + dir_ + " is not empty (it holds " + quote(n) +
                              ") and has no FORMAT file, so it is not a cairn repository; give an "
                              "empty or new directory");
    }
    chunk_size_ = chunk_size;
    // Two processes creating one repository at once: the last rename wins and both read it back.
    CAIRN_RETURN_IF_ERROR(write_format(kFormatVersion));
    text.clear();
    CAIRN_RETURN_IF_ERROR(read_small_file(path, 4096, &text));
  } else {
    CAIRN_RETURN_IF_ERROR(s);
  }
  // "cairn-repository <version>\nchunk_size <n>\n"
  std::string_view rest = text;
  auto take_line = [&rest](std::string_view* line) {
    size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) return false;
    *line = rest.substr(0, nl);
    rest.remove_prefix(nl + 1);
    return true;
  };
  auto parse_u64 = [](std::string_view digits, uint64_t* out) {
    if (digits.empty() || digits.size() > 19) return false;
    uint64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    *out = v;
    return true;
  };
  std::string_view line1, line2;
  std::string bad = "repository format file " + path + " is not a cairn FORMAT file (expected \"" +
                    std::string(kFormatMagic) + " " + std::to_string(kFormatVersion) + "\\nchunk_size N\\n\"); is " +
                    dir_ + " a cairn repository?";
  std::string magic_prefix(kFormatMagic);
  magic_prefix.append(" ");
  if (!take_line(&line1) || !starts_with(line1, magic_prefix)) return corruption(bad);
  uint64_t v = 0;
  if (!parse_u64(line1.substr(kFormatMagic.size() + 1), &v)) return corruption(bad);
  if (v < 1 || v > static_cast<uint64_t>(kFormatVersion))
    return invalid_argument("repository " + dir_ + " has format version " + std::to_string(v) +
                            "; this cairn reads version " + std::to_string(kFormatVersion) +
                            " (and migrates versions 1 and 2) only — use a matching cairn");
  uint64_t cs = 0;
  if (!take_line(&line2) || !starts_with(line2, "chunk_size ") || !parse_u64(line2.substr(11), &cs) || cs == 0 ||
      cs > kMaxChunkSize || !rest.empty())
    return corruption(bad);
  chunk_size_ = cs;
  *version = static_cast<int>(v);
  return Status::OK();
}

Status Repository::Impl::open(const std::string& dir, uint64_t chunk_size) {
  log_to_stderr_by_default();
  if (dir.empty()) return invalid_argument("repository directory: empty path");
  dir_ = dir;
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  packs_dir_ = join_path(dir_, pfs::kPacksDir);
  logs_dir_ = join_path(dir_, pfs::kLogsDir);
  ckpt_dir_ = join_path(dir_, pfs::kCheckpointsDir);
  coord_ = std::make_unique<pfs::Coordination>(dir_);
  CAIRN_RETURN_IF_ERROR(make_dirs(dir_));
  writable_ = ::access(dir_.c_str(), W_OK) == 0;
  int version = 0;
  CAIRN_RETURN_IF_ERROR(init_or_read_format(chunk_size, &version));
  if (version == 1) {
    if (!writable_)
      return invalid_argument("repository " + dir_ +
                              " has format version 1 (a file per model) and this process cannot migrate it (the "
                              "directory is not writable); run `cairn migrate " +
                              dir_ + "` as its owner");
    CAIRN_RETURN_IF_ERROR(migrate_v1());
    version = 2;
  }
  // Version 3 adds coded chunks and nothing else: a version-2 repository is a valid version 3, so
  // migrating it is saying so (atomically). From then on an older cairn refuses it, rather than
  // misreading a coded chunk. A process that cannot write reads it as it is.
  if (version == 2 && writable_)
    CAIRN_RETURN_IF_ERROR(write_format(kFormatVersion).with_context("migrating " + dir_ + " to version 3"));
  if (writable_) {
    bool created = false;
    for (const std::string& sub :
         {packs_dir_, logs_dir_, ckpt_dir_, join_path(dir_, pfs::kWritersDir), join_path(dir_, pfs::kClaimsDir)}) {
      if (::mkdir(sub.c_str(), 0755) == 0) {
        created = true;
      } else if (errno != EEXIST) {
        return errno_status("creating directory " + sub, errno);
      }
    }
    if (created) CAIRN_RETURN_IF_ERROR(fsync_dir(dir_));
  }
  {
    std::lock_guard lock(refresh_mu_);
    CAIRN_RETURN_IF_ERROR(load(nullptr));
    WriterLock clock(mu_);
    unreported_ = RefreshReport{};  // the caller reads the catalog it opened with
  }
  // A migration that died after FORMAT said 2 leaves version 1's manifests behind; they are in
  // the checkpoint, so they go.
  if (writable_ && fs_->exists(join_path(dir_, pfs::kManifestsDir)) &&
      coord_->take_lease("removing version 1 manifests", std::chrono::milliseconds(0)).ok()) {
    (void)fs_->remove_all(join_path(dir_, pfs::kManifestsDir));
    coord_->release_lease();
  }
  // Many logs of writers that are gone: fold them into a checkpoint now, so the next open is fast.
  if (writable_ && options_.compact_after_logs > 0) {
    size_t dead_logs = 0;
    {
      std::lock_guard lock(refresh_mu_);
      for (const auto& [name, off] : read_to_)
        if (!owner_may_append(name)) ++dead_logs;
    }
    if (dead_logs >= options_.compact_after_logs) {
      CompactReport ignored;
      Status s = compact(&ignored, /*take_lease=*/true);
      if (!s.ok() && s.code() != StatusCode::kBusy) return s.with_context("compacting at open");
    }
  }
  return Status::OK();
}

Repository::Impl::~Impl() {
  if (log_ || seg_) seal();
}

void Repository::Impl::clear_catalog() {
  models_.clear();
  list_refs_.clear();
  order_.clear();
  children_.clear();
  chunks_.clear();
  packs_.clear();
  logical_bytes_ = 0;
  physical_bytes_ = 0;
  stored_bytes_ = 0;
  codings_ = {};
  retired_ = 0;
  last_created_ns_ = 0;
}

Status Repository::Impl::register_pack(const std::string& pack) {
  if (packs_.count(pack)) return Status::OK();
  PackInfo info;
  if (ends_with(pack, pfs::kSegmentSuffix)) {
    info.data_begin = pfs::kSegmentHeaderBytes;
  } else {
    std::string path = join_path(packs_dir_, pack);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      int err = errno;
      if (err == ENOENT) {
        // Replaying a log, a model that a later record removes may name a pack gc deleted: only
        // packs still referenced once the load is done must exist (load() checks).
        info.missing = true;
        packs_.emplace(pack, std::move(info));
        return Status::OK();
      }
      return errno_status("opening pack " + path, err);
    }
    uint8_t prefix[8] = {};
    size_t got = 0;
    CAIRN_RETURN_IF_ERROR(pread_all(fd.get(), prefix, sizeof prefix, 0, path, &got));
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = n << 8 | prefix[b];
    if (got < 8 || n > safetensors::kMaxHeaderBytes)
      return corruption("pack " + path + " does not start with a safetensors header; restore it");
    info.data_begin = 8 + n;
  }
  packs_.emplace(pack, std::move(info));
  return Status::OK();
}

// ---- the catalog's bookkeeping (mu_ held exclusively) ----

Status Repository::Impl::add_model(std::shared_ptr<const ModelManifest> m) {
  // A tensor list other models already hold is counted already.
  const void* list = m->tensors.identity();
  auto lit = list ? list_refs_.find(list) : list_refs_.end();
  const bool first = lit == list_refs_.end() || lit->second == 0;
  if (!m->pack.empty()) CAIRN_RETURN_IF_ERROR(register_pack(m->pack));
  if (first)
    for (const TensorManifest& t : m->tensors)
      for (const ChunkRef& c : t.chunks) {
        CAIRN_RETURN_IF_ERROR(register_pack(c.pack));
        if (c.base) CAIRN_RETURN_IF_ERROR(register_pack(c.base->pack));
      }
  if (list) ++list_refs_[list];
  const std::string& id = m->id;
  order_.push_back(id);
  if (!m->parent.empty()) children_[m->parent].push_back(id);
  logical_bytes_ += m->logical_bytes();
  if (!m->pack.empty()) packs_.at(m->pack).refs++;
  for (const TensorManifest& t : first ? m->tensors : TensorList()) {
    for (const ChunkRef& c : t.chunks) {
      // A delta's base counts as one more reference of the model: it stays while the delta does.
      for_each_location(c, [&](const ChunkRef& at) CAIRN_REQUIRES(mu_) {
        packs_.at(at.pack).refs++;
        add_chunk_ref(at);
      });
    }
  }
  if (m->retired_ns != 0) ++retired_;
  last_created_ns_ = std::max(last_created_ns_, m->created_ns);
  models_.emplace(id, std::move(m));
  return Status::OK();
}

std::vector<std::string> Repository::Impl::drop_model(const std::string& id) {
  std::vector<std::string> dead;
  auto mit = models_.find(id);
  if (mit == models_.end()) return dead;
  std::shared_ptr<const ModelManifest> m = mit->second;
  models_.erase(mit);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  children_.erase(id);
  if (!m->parent.empty()) {
    auto cit = children_.find(m->parent);
    if (cit != children_.end()) {
      auto& v = cit->second;
      v.erase(std::remove(v.begin(), v.end(), id), v.end());
      if (v.empty()) children_.erase(cit);
    }
  }
  if (m->retired_ns != 0) --retired_;
  release_data(*m, &dead);
  return dead;
}

namespace {

bool same_place(const ChunkRef& a, const ChunkRef& b) { return a.offset == b.offset && a.pack == b.pack; }

}  // namespace

void Repository::Impl::count_location(const ChunkRef& c, int sign) {
  const auto d = static_cast<uint64_t>(static_cast<int64_t>(sign));  // +1 or -1 (mod 2^64)
  physical_bytes_ += d * c.length;
  stored_bytes_ += d * c.stored_bytes();
  CodingCount& k = codings_[static_cast<size_t>(c.coding)];
  k.chunks += d;
  k.bytes += d * c.length;
  k.stored += d * c.stored_bytes();
}

void Repository::Impl::add_chunk_ref(const ChunkRef& c) {
  auto [it, inserted] = chunks_.try_emplace(c.hash);
  ChunkInfo& info = it->second;
  if (inserted) {
    info.ref = c;
    info.refs = 1;
    packs_.at(c.pack).indexed.push_back(c.hash);
    count_location(c, +1);
    return;
  }
  if (same_place(info.ref, c)) {
    ++info.refs;
    return;
  }
  for (ChunkCopy& copy : info.copies)
    if (same_place(copy.ref, c)) {
      ++copy.refs;
      return;
    }
  info.copies.push_back({c, 1});
  packs_.at(c.pack).indexed.push_back(c.hash);
  count_location(c, +1);
}

void Repository::Impl::release_chunk_ref(const ChunkRef& c) {
  auto it = chunks_.find(c.hash);
  if (it == chunks_.end()) return;
  ChunkInfo& info = it->second;
  if (same_place(info.ref, c)) {
    if (info.refs > 0 && --info.refs > 0) return;
    count_location(info.ref, -1);
    if (!info.promote_copy()) chunks_.erase(it);
    return;
  }
  for (auto k = info.copies.begin(); k != info.copies.end(); ++k)
    if (same_place(k->ref, c)) {
      if (k->refs > 0 && --k->refs > 0) return;
      count_location(k->ref, -1);
      info.copies.erase(k);
      return;
    }
}

void Repository::Impl::release_data(const ModelManifest& m, std::vector<std::string>* dead) {
  logical_bytes_ -= m.logical_bytes();
  auto release_pack = [&](const std::string& name) CAIRN_REQUIRES(mu_) {
    auto pit = packs_.find(name);
    if (pit == packs_.end()) return;
    if (--pit->second.refs > 0) return;
    // No manifest references the pack any more, so none of its copies is referenced either; drop
    // whatever the index still holds there (it would be a counting error).
    for (const ChunkHash& h : pit->second.indexed) {
      auto cit = chunks_.find(h);
      if (cit == chunks_.end()) continue;
      ChunkInfo& info = cit->second;
      for (auto k = info.copies.begin(); k != info.copies.end();) {
        if (k->ref.pack == name) {
          count_location(k->ref, -1);
          k = info.copies.erase(k);
        } else {
          ++k;
        }
      }
      if (info.ref.pack == name) {
        count_location(info.ref, -1);
        if (!info.promote_copy()) chunks_.erase(cit);
      }
    }
    packs_.erase(pit);
    dead->push_back(name);
  };
  // The list's chunks are released with the last model that holds it.
  bool last = true;
  if (const void* list = m.tensors.identity()) {
    auto lit = list_refs_.find(list);
    if (lit != list_refs_.end() && --lit->second > 0)
      last = false;
    else if (lit != list_refs_.end())
      list_refs_.erase(lit);
  }
  if (last)
    for (const TensorManifest& t : m.tensors) {
      for (const ChunkRef& c : t.chunks) {
        for_each_location(c, [&](const ChunkRef& at) CAIRN_REQUIRES(mu_) {
          release_chunk_ref(at);
          release_pack(at.pack);
        });
      }
    }
  if (!m.pack.empty()) release_pack(m.pack);
}

}  // namespace cairn
