// Opening a repository: the write lock, the FORMAT file, and the catalog scan that rebuilds the
// in-memory catalog from the manifests and recovers from a crash; and the catalog's bookkeeping
// (a model added, dropped, or its data released), which commit and maintenance use too.
//
// Recovery is the writer's alone: it removes the temporary files and the packs no manifest
// references, which are all a crash can leave (see scan). A read-only view never deletes a file
// and never writes FORMAT, a pack or a manifest. Open never repairs a manifest: one that does not
// parse or check fails open with kCorruption naming the file, for an operator to restore.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/safetensors.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;
using pfs::AtomicFileWriter;
using pfs::ends_with;
using pfs::fsync_dir;
using pfs::join_path;
using pfs::kManifestSuffix;
using pfs::kMaxChunkSize;
using pfs::kPackSuffix;
using pfs::kTmpPrefix;
using pfs::list_dir;
using pfs::pread_all;
using pfs::quote;
using pfs::starts_with;
using pfs::UniqueFd;

constexpr std::string_view kFormatMagic = "cairn-repository";
constexpr int kFormatVersion = 1;
constexpr const char* kFormatFile = "FORMAT";
constexpr const char* kLockFile = "LOCK";
constexpr const char* kPacksDir = "packs";
constexpr const char* kManifestsDir = "manifests";
constexpr uint64_t kMaxManifestBytes = 1ull << 30;  // sanity bound when reading a manifest
constexpr int kReaderScanAttempts = 5;

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
  return Status::ok();
}

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
  return Status::ok();
}

// A manifest scan has read, and the file it came from.
struct LoadedModel {
  std::shared_ptr<ModelManifest> m;
  std::string file;
};

}  // namespace

// ---- open: the lock and FORMAT ----

Status Repository::Impl::take_lock() {
  std::string path = join_path(dir_, kLockFile);
  lock_fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd_.valid()) {
    if (errno == EACCES || errno == EROFS || errno == EPERM) {
      writer_ = false;  // a read-only view (no permission to write the repository)
      return Status::ok();
    }
    return errno_status("opening the repository lock file " + path, errno);
  }
  while (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      writer_ = false;
      return Status::ok();
    }
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      // The filesystem has no locks (e.g. Lustre mounted without -o flock): the single-writer
      // rule is then the operator's (docs/repository-format.md).
      writer_ = true;
      return Status::ok();
    }
    return errno_status("locking " + path, errno);
  }
  writer_ = true;
  // Who holds it, for the kBusy messages of read-only views.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string who = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(lock_fd_.get(), 0) == 0) {
    ssize_t ignored = ::pwrite(lock_fd_.get(), who.data(), who.size(), 0);
    (void)ignored;
  }
  return Status::ok();
}

std::string Repository::Impl::writer_description() const {
  std::string who;
  if (read_small_file(join_path(dir_, kLockFile), 4096, &who).is_ok()) {
    while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
  }
  return who.empty() ? std::string("another process") : who;
}

Status Repository::Impl::init_or_read_format(uint64_t chunk_size) {
  std::string path = join_path(dir_, kFormatFile);
  std::string text;
  Status s = read_small_file(path, 4096, &text);
  if (s.code() == StatusCode::kNotFound) {
    if (!writer_)
      return unavailable("repository " + dir_ + " has no FORMAT file yet and " + writer_description() +
                         " holds its write lock (it may be creating it); retry shortly");
    if (chunk_size == 0 || chunk_size > kMaxChunkSize)
      return invalid_argument("chunk size " + std::to_string(chunk_size) + " for new repository " + dir_ +
                              " must be 1.." + std::to_string(kMaxChunkSize) + " bytes");
    std::vector<std::string> names;
    CAIRN_RETURN_IF_ERROR(list_dir(dir_, &names));
    for (const std::string& n : names) {
      if (n == kLockFile) continue;
      if (starts_with(n, kTmpPrefix)) {
        ::unlink(join_path(dir_, n).c_str());
        continue;
      }
      return invalid_argument("directory " + dir_ + " is not empty (it holds " + quote(n) +
                              ") and has no FORMAT file, so it is not a cairn repository; give an "
                              "empty or new directory");
    }
    std::string content = std::string(kFormatMagic) + " " + std::to_string(kFormatVersion) + "\nchunk_size " +
                          std::to_string(chunk_size) + "\n";
    std::vector<iovec> iov{{content.data(), content.size()}};
    CAIRN_RETURN_IF_ERROR(AtomicFileWriter::publish(*fs_, dir_, kFormatFile, iov, tmp_name()));
    chunk_size_ = chunk_size;
    return Status::ok();
  }
  CAIRN_RETURN_IF_ERROR(s);
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
  if (!take_line(&line1) || !starts_with(line1, std::string(kFormatMagic) + " ")) return corruption(bad);
  uint64_t version = 0;
  if (!parse_u64(line1.substr(kFormatMagic.size() + 1), &version)) return corruption(bad);
  if (version != static_cast<uint64_t>(kFormatVersion))
    return invalid_argument("repository " + dir_ + " has format version " + std::to_string(version) +
                            "; this cairn reads version " + std::to_string(kFormatVersion) +
                            " only — use a matching cairn");
  uint64_t cs = 0;
  if (!take_line(&line2) || !starts_with(line2, "chunk_size ") || !parse_u64(line2.substr(11), &cs) || cs == 0 ||
      cs > kMaxChunkSize || !rest.empty())
    return corruption(bad);
  chunk_size_ = cs;
  return Status::ok();
}

Status Repository::Impl::open(const std::string& dir, uint64_t chunk_size) {
  if (dir.empty()) return invalid_argument("repository directory: empty path");
  dir_ = dir;
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  packs_dir_ = join_path(dir_, kPacksDir);
  manifests_dir_ = join_path(dir_, kManifestsDir);
  CAIRN_RETURN_IF_ERROR(make_dirs(dir_));
  CAIRN_RETURN_IF_ERROR(take_lock());
  CAIRN_RETURN_IF_ERROR(init_or_read_format(chunk_size));
  if (writer_) {
    bool created = false;
    for (const std::string& sub : {packs_dir_, manifests_dir_}) {
      if (::mkdir(sub.c_str(), 0755) == 0) {
        created = true;
      } else if (errno != EEXIST) {
        return errno_status("creating directory " + sub, errno);
      }
    }
    if (created) CAIRN_RETURN_IF_ERROR(fsync_dir(dir_));
  }
  for (int attempt = 1;; ++attempt) {
    bool raced = false;
    Status s = scan(&raced);
    if (s.is_ok()) return s;
    clear_catalog();
    if (!raced || attempt >= kReaderScanAttempts) return s;
  }
}

void Repository::Impl::clear_catalog() {
  models_.clear();
  order_.clear();
  children_.clear();
  chunks_.clear();
  packs_.clear();
  logical_bytes_ = 0;
  physical_bytes_ = 0;
  retired_ = 0;
  last_created_ns_ = 0;
}

// ---- the catalog scan ----

// Crash recovery. Every file is renamed into place only once it is durable, and a pack before the
// manifest that references it, so a crash leaves at most: temporary files (.tmp-*); packs that no
// manifest references (a commit that died before its manifest, a remove or gc that died between
// its manifest changes and the pack deletions); and dead ranges inside packs still in use (gc died
// before punching them), which the next gc punches. The writer deletes the first two below. Every
// manifest in place was whole when it was renamed there, so anything else wrong is corruption:
// reported, never repaired.
Status Repository::Impl::scan(bool* raced) {
  *raced = false;
  // 1. Manifests.
  std::vector<std::string> names;
  bool missing = false;
  CAIRN_RETURN_IF_ERROR(list_dir(manifests_dir_, &names, &missing));
  bool removed_manifest_tmp = false;
  std::vector<LoadedModel> loaded;
  std::unordered_map<std::string, size_t> by_id;
  for (const std::string& name : names) {
    std::string path = join_path(manifests_dir_, name);
    if (starts_with(name, kTmpPrefix)) {
      if (writer_ && ::unlink(path.c_str()) == 0) removed_manifest_tmp = true;
      continue;
    }
    if (!ends_with(name, kManifestSuffix)) continue;  // not ours (an editor's backup, say)
    std::string text;
    Status s = read_small_file(path, kMaxManifestBytes, &text);
    if (s.code() == StatusCode::kNotFound && !writer_) {
      *raced = true;
      continue;
    }
    if (!s.is_ok()) return s.code() == StatusCode::kNotFound ? corruption(s.message()) : s;
    const std::string what = "manifest " + path;
    const std::string todo = "; restore it, or move it out of manifests/ to drop that model";
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return corruption(what + " is not valid JSON" + todo);
    Result<ModelManifest> r = manifest_from_json(j);
    if (!r.is_ok()) return corruption(what + ": " + r.status().message() + todo);
    auto m = std::make_shared<ModelManifest>(std::move(r).value());
    if (name != manifest_file(m->id))
      return corruption(what + " holds model " + quote(m->id) + ", whose manifest is named " + manifest_file(m->id) +
                        todo);
    Status cs = validate_chunking(*m, chunk_size_);
    if (!cs.is_ok()) return corruption(what + ": " + cs.message() + todo);
    by_id.emplace(m->id, loaded.size());
    loaded.push_back({std::move(m), path});
  }

  // 2. Lineage: parents exist, no cycles.
  for (const LoadedModel& lm : loaded) {
    const std::string& p = lm.m->parent;
    if (!p.empty() && !by_id.count(p))
      return corruption("manifest " + lm.file + ": model " + quote(lm.m->id) + " has parent " + quote(p) +
                        ", which is not in the repository; restore the parent's manifest");
  }
  {
    std::vector<int> state(loaded.size(), 0);  // 0 new, 1 on the current path, 2 done
    for (size_t i = 0; i < loaded.size(); ++i) {
      std::vector<size_t> path;
      size_t k = i;
      while (state[k] == 0) {
        state[k] = 1;
        path.push_back(k);
        const std::string& p = loaded[k].m->parent;
        if (p.empty()) break;
        k = by_id.at(p);
        if (state[k] == 1)
          return corruption("model " + quote(loaded[k].m->id) +
                            " is its own ancestor (a parent cycle in the manifests)");
      }
      for (size_t q : path) state[q] = 2;
    }
  }

  // 3. Packs: which are referenced, by whom first.
  std::map<std::string, std::string> referenced;  // pack -> first model id
  for (const LoadedModel& lm : loaded) {
    if (!lm.m->pack.empty()) referenced.emplace(lm.m->pack, lm.m->id);
    for (const TensorManifest& t : lm.m->tensors)
      for (const ChunkRef& c : t.chunks) referenced.emplace(c.pack, lm.m->id);
  }
  std::vector<std::string> pack_names;
  bool packs_missing = false;
  CAIRN_RETURN_IF_ERROR(list_dir(packs_dir_, &pack_names, &packs_missing));
  bool removed_pack = false;
  if (writer_) {
    for (const std::string& name : pack_names) {
      bool stray = starts_with(name, kTmpPrefix) || (ends_with(name, kPackSuffix) && !referenced.count(name));
      if (stray && ::unlink(join_path(packs_dir_, name).c_str()) == 0) removed_pack = true;
    }
  }
  std::unordered_map<std::string, PackInfo> packs;
  std::unordered_map<std::string, uint64_t> pack_sizes;
  for (const auto& [pack, first_model] : referenced) {
    std::string path = join_path(packs_dir_, pack);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      int err = errno;
      if (err == ENOENT) {
        if (!writer_) *raced = true;
        return corruption("model " + quote(first_model) + " references pack " + pack + ", which is missing from " +
                          packs_dir_ + "; restore the pack, or remove the model's manifest");
      }
      return errno_status("opening pack " + path, err);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return errno_status("checking pack " + path, errno);
    auto size = static_cast<uint64_t>(st.st_size);
    uint8_t prefix[8] = {};
    size_t got = 0;
    CAIRN_RETURN_IF_ERROR(pread_all(fd.get(), prefix, sizeof prefix, 0, path, &got));
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = n << 8 | prefix[b];
    if (got < 8 || n > safetensors::kMaxHeaderBytes || 8 + n > size)
      return corruption("pack " + path + " (of model " + quote(first_model) +
                        ") does not start with a safetensors header; restore it");
    PackInfo info;
    info.data_begin = 8 + n;
    info.data_bytes = size - info.data_begin;
    packs.emplace(pack, std::move(info));
    pack_sizes.emplace(pack, size);
  }
  // Every chunk lies inside its pack's data section.
  for (const LoadedModel& lm : loaded) {
    for (const TensorManifest& t : lm.m->tensors) {
      for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
        const ChunkRef& c = t.chunks[ci];
        const PackInfo& info = packs.at(c.pack);
        if (c.offset < info.data_begin || c.offset + c.length > pack_sizes.at(c.pack))
          return corruption("model " + quote(lm.m->id) + " tensor " + quote(t.name) + " chunk " + std::to_string(ci) +
                            " lies at [" + std::to_string(c.offset) + ", " + std::to_string(c.offset + c.length) +
                            ") outside the data of pack " + c.pack + " (" + std::to_string(pack_sizes.at(c.pack)) +
                            " bytes); the pack is truncated or the manifest is wrong");
      }
    }
  }
  if (removed_manifest_tmp) CAIRN_RETURN_IF_ERROR(fsync_dir(manifests_dir_));
  if (removed_pack) CAIRN_RETURN_IF_ERROR(fsync_dir(packs_dir_));

  // 4. The catalog, in commit order.
  std::sort(loaded.begin(), loaded.end(), [](const LoadedModel& a, const LoadedModel& b) {
    return a.m->created_ns != b.m->created_ns ? a.m->created_ns < b.m->created_ns : a.m->id < b.m->id;
  });
  std::unique_lock lock(mu_);
  packs_ = std::move(packs);
  for (LoadedModel& lm : loaded) {
    last_created_ns_ = std::max(last_created_ns_, lm.m->created_ns);
    add_model(std::move(lm.m));
  }
  return Status::ok();
}

// ---- the catalog's bookkeeping (mu_ held exclusively) ----

void Repository::Impl::add_model(std::shared_ptr<const ModelManifest> m) {
  const std::string& id = m->id;
  order_.push_back(id);
  if (!m->parent.empty()) children_[m->parent].push_back(id);
  logical_bytes_ += m->logical_bytes();
  if (!m->pack.empty()) packs_.at(m->pack).refs++;
  for (const TensorManifest& t : m->tensors) {
    for (const ChunkRef& c : t.chunks) {
      PackInfo& pack = packs_.at(c.pack);
      pack.refs++;
      auto [it, inserted] = chunks_.try_emplace(c.hash);
      if (inserted) {
        it->second.ref = c;
        pack.indexed.push_back(c.hash);
        physical_bytes_ += c.length;
      }
      it->second.refs++;
    }
  }
  if (m->retired_ns != 0) ++retired_;
  models_.emplace(id, std::move(m));
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

void Repository::Impl::release_data(const ModelManifest& m, std::vector<std::string>* dead) {
  logical_bytes_ -= m.logical_bytes();
  auto erase_chunk = [&](std::unordered_map<ChunkHash, ChunkInfo, ChunkHashHasher>::iterator cit) {
    physical_bytes_ -= cit->second.ref.length;
    chunks_.erase(cit);
  };
  auto release_pack = [&](const std::string& name) {
    auto pit = packs_.find(name);
    if (pit == packs_.end()) return;
    if (--pit->second.refs > 0) return;
    for (const ChunkHash& h : pit->second.indexed) {
      auto cit = chunks_.find(h);
      if (cit != chunks_.end() && cit->second.ref.pack == name) erase_chunk(cit);
    }
    packs_.erase(pit);
    dead->push_back(name);
  };
  for (const TensorManifest& t : m.tensors) {
    for (const ChunkRef& c : t.chunks) {
      auto cit = chunks_.find(c.hash);
      if (cit != chunks_.end() && --cit->second.refs == 0) erase_chunk(cit);
      release_pack(c.pack);
    }
  }
  if (!m.pack.empty()) release_pack(m.pack);
}

}  // namespace cairn
