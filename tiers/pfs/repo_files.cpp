// The repository's file helpers (repo_files.hpp): quoting, pack names, and the POSIX calls that
// read, list, sync and publish files.
//
// The crash-safety of every file the repository writes (FORMAT, packs, manifests) rests on
// AtomicFileWriter::publish: a file appears under its final name only once its bytes are durable,
// and a failure leaves no file behind.
#include "tiers/pfs/repo_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "core/fs.hpp"

namespace cairn::pfs {
namespace {

constexpr size_t kMaxPackNameBytes = 255;  // NAME_MAX

}  // namespace

std::string quote(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out = "'";
  out += s.substr(0, kMax);
  if (s.size() > kMax) out += "...";
  out += "'";
  return out;
}

bool valid_pack_name(std::string_view s) {
  if (s.size() <= kPackSuffix.size() || s.size() > kMaxPackNameBytes) return false;
  if (s.front() == '.' || !(ends_with(s, kPackSuffix) || ends_with(s, kSegmentSuffix))) return false;
  for (char c : s) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status pread_all(int fd, void* dst, size_t size, uint64_t offset, const std::string& path, size_t* got) {
  auto* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      *got = done;
      return errno_status("reading " + path, errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  *got = done;
  return Status::OK();
}

Status fsync_dir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("opening directory " + path + " to sync it", errno);
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) break;  // filesystems that cannot sync directories
    return errno_status("syncing directory " + path, errno);
  }
  return Status::OK();
}

Status list_dir(const std::string& path, std::vector<std::string>* names, bool* missing) {
  names->clear();
  if (missing) *missing = false;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) {
    if (errno == ENOENT && missing) {
      *missing = true;
      return Status::OK();
    }
    return errno_status("listing directory " + path, errno);
  }
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names->emplace_back(n);
    errno = 0;
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return errno_status("listing directory " + path, err);
  std::sort(names->begin(), names->end());
  return Status::OK();
}

Status AtomicFileWriter::publish(FileSystem& fs, const std::string& dir, const std::string& final_name,
                                 const std::vector<iovec>& pieces, const std::string& tmp_name, bool replacing) {
  std::string tmp = join_path(dir, tmp_name);
  std::string final_path = join_path(dir, final_name);
  Status s = write_synced(fs, tmp, pieces);
  if (s.ok()) s = fs.rename(tmp, final_path);
  if (!s.ok()) {
    (void)fs.unlink(tmp);  // best effort: the next open of the repository removes stray temporaries
    return s;
  }
  s = fs.sync_dir(dir);
  if (!s.ok() && !replacing) (void)fs.unlink(final_path);
  return s;
}

Status AtomicFileWriter::write_synced(FileSystem& fs, const std::string& path, const std::vector<iovec>& pieces) {
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<File> f, fs.open(path, kCreate | kExclusive));
  // One batch: the pieces are large (whole chunks) and go out together where io_uring allows it.
  std::vector<IoRequest> reqs;
  reqs.reserve(pieces.size());
  uint64_t offset = 0;
  for (const iovec& p : pieces) {
    if (p.iov_len == 0) continue;
    reqs.push_back({p.iov_base, p.iov_len, offset});
    offset += p.iov_len;
  }
  CAIRN_RETURN_IF_ERROR(f->write_many(reqs));
  return f->sync(/*data_only=*/false);
}

const std::vector<std::string>& DirListing::get(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    names_.clear();
    mtime_ns_ = -1;
    return names_;
  }
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  constexpr int64_t kTrustAfterNs = 2'000'000'000;  // mtimes younger than this are listed anyway
  if (mtime == mtime_ns_ && now_ns - mtime > kTrustAfterNs) return names_;
  names_.clear();
  if (!list_dir(dir, &names_, nullptr).ok()) names_.clear();
  mtime_ns_ = mtime;
  return names_;
}

}  // namespace cairn::pfs
