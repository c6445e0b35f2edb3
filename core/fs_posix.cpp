// The POSIX implementation of the filesystem seam (core/fs.hpp): posix_fs(), with O_DIRECT and,
// where built with liburing, io_uring batches.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

#include "core/fs.hpp"
#include "core/fs_internal.hpp"

#ifdef CAIRN_HAVE_LIBURING
#include <liburing.h>
#endif

namespace cairn {
namespace {

using fs_internal::at;
using fs_internal::short_read;
using fs_internal::strip_slashes;

bool aligned(uint64_t v) { return v % kDirectAlignment == 0; }

// For O_DIRECT files: names what is misaligned, so the caller can fix the right thing.
Status check_direct(const std::string& path, const void* buf, size_t len, uint64_t offset, const char* op) {
  std::string bad;
  if (!aligned(reinterpret_cast<uintptr_t>(buf))) bad += "buffer address";
  if (!aligned(len)) bad += std::string(bad.empty() ? "" : ", ") + "length " + std::to_string(len);
  if (!aligned(offset)) bad += std::string(bad.empty() ? "" : ", ") + "offset " + std::to_string(offset);
  if (bad.empty()) return Status::OK();
  return invalid_argument(std::string(op) + " " + at(path, offset) + ": direct I/O needs the " + bad +
                          " to be a multiple of " + std::to_string(kDirectAlignment) + " bytes");
}

// ---------------------------------------------------------------------------------------------
// POSIX.

Status pwrite_fd(int fd, const std::string& path, const void* buf, size_t len, uint64_t offset) {
  const auto* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, p + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("writing " + at(path, offset + done), errno);
    }
    if (n == 0) return io_error("writing " + at(path, offset + done) + ": the write made no progress");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// direct: the file is O_DIRECT. There a read that stops short of a block boundary stopped at the
// end of the file (a file whose length is not a multiple of the block, or one still being
// appended): reading on from that misaligned offset would fail with EINVAL, not return 0.
Status pread_fd(int fd, const std::string& path, void* buf, size_t len, uint64_t offset, size_t* got,
                bool direct = false) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      *got = done;
      return errno_status("reading " + at(path, offset + done), errno);
    }
    if (n == 0) break;  // end of file
    done += static_cast<size_t>(n);
    if (direct && (offset + done) % kDirectAlignment != 0) break;  // end of file
  }
  *got = done;
  return Status::OK();
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path, bool direct) : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~PosixFile() override {
#ifdef CAIRN_HAVE_LIBURING
    for (auto& r : idle_rings_) ::io_uring_queue_exit(&r->ring);
#endif
    ::close(fd_);
  }
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }

  Status pwrite(const void* buf, size_t len, uint64_t offset) override {
    if (direct_) CAIRN_RETURN_IF_ERROR(check_direct(path_, buf, len, offset, "writing"));
    return pwrite_fd(fd_, path_, buf, len, offset);
  }

  Status pread(void* buf, size_t len, uint64_t offset, size_t* got) override {
    *got = 0;
    if (direct_) CAIRN_RETURN_IF_ERROR(check_direct(path_, buf, len, offset, "reading"));
    return pread_fd(fd_, path_, buf, len, offset, got, direct_);
  }

  Status write_many(std::span<const IoRequest> reqs) override { return many(reqs, /*write=*/true); }
  Status read_many(std::span<const IoRequest> reqs) override { return many(reqs, /*write=*/false); }

  Status sync(bool data_only) override {
    while ((data_only ? ::fdatasync(fd_) : ::fsync(fd_)) != 0) {
      if (errno == EINTR) continue;
      return errno_status("syncing " + path_, errno);
    }
    return Status::OK();
  }

  Status allocate(uint64_t offset, uint64_t len) override {
    if (len == 0) return Status::OK();
    // posix_fallocate would emulate on filesystems without fallocate by writing zeros, which on a
    // burst buffer is the very traffic we reserve space to avoid; the caller gets the error instead.
    while (::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(len)) != 0) {
      if (errno == EINTR) continue;
      return errno_status("reserving " + std::to_string(len) + " bytes of " + at(path_, offset), errno);
    }
    return Status::OK();
  }

  Status truncate(uint64_t size) override {
    while (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      if (errno == EINTR) continue;
      return errno_status("truncating " + path_ + " to " + std::to_string(size) + " bytes", errno);
    }
    return Status::OK();
  }

  Result<uint64_t> size() override {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return errno_status("checking the size of " + path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  Status many(std::span<const IoRequest> reqs, bool write) {
    if (direct_) {
      for (const IoRequest& r : reqs)
        CAIRN_RETURN_IF_ERROR(check_direct(path_, r.buf, r.len, r.offset, write ? "writing" : "reading"));
    }
#ifdef CAIRN_HAVE_LIBURING
    // One request: a plain pread/pwrite is cheaper than setting up a ring.
    if (reqs.size() > 1) {
      if (std::unique_ptr<Ring> ring = acquire_ring()) {
        bool ring_failed = false;
        Status st = many_uring(ring->ring, reqs, write, &ring_failed);
        release_ring(std::move(ring), ring_failed);
        return st;
      }
    }
#endif
    return many_loop(reqs, write);
  }

  Status many_loop(std::span<const IoRequest> reqs, bool write) {
    for (const IoRequest& r : reqs) {
      if (write) {
        CAIRN_RETURN_IF_ERROR(pwrite_fd(fd_, path_, r.buf, r.len, r.offset));
      } else {
        size_t got = 0;
        CAIRN_RETURN_IF_ERROR(pread_fd(fd_, path_, r.buf, r.len, r.offset, &got, direct_));
        if (got != r.len) return short_read(path_, r, got);
      }
    }
    return Status::OK();
  }

#ifdef CAIRN_HAVE_LIBURING
  static constexpr unsigned kQueueDepth = 32;
  // A completion's res is an int: keep each submission well below 2 GiB.
  static constexpr size_t kMaxPiece = size_t{1} << 30;

  // Callers of one file (a burst buffer's readers, one per chunk being loaded) each take a ring of
  // their own, so that their batches are in flight together instead of one after another behind
  // one ring's lock. Rings are made on demand up to kMaxRings and kept for reuse.
  static constexpr size_t kMaxRings = 8;
  struct Ring {
    io_uring ring{};
  };

  // A ring of the caller's own, or null when io_uring cannot be used (old kernel, seccomp, io_uring
  // disabled by sysctl: then the plain loop is used for good).
  std::unique_ptr<Ring> acquire_ring() {
    std::unique_lock lock(rings_mu_);
    for (;;) {
      if (rings_refused_) return nullptr;
      if (!idle_rings_.empty()) {
        std::unique_ptr<Ring> r = std::move(idle_rings_.back());
        idle_rings_.pop_back();
        return r;
      }
      if (rings_made_ < kMaxRings) break;
      rings_idle_.wait(lock);
    }
    ++rings_made_;
    lock.unlock();
    auto r = std::make_unique<Ring>();
    if (::io_uring_queue_init(kQueueDepth, &r->ring, 0) == 0) return r;
    lock.lock();
    --rings_made_;
    // The first ring refused: io_uring is not available. A later one refused (a limit on locked
    // memory or on rings): this caller uses the plain loop, and the rings already made stay in use.
    if (rings_made_ == 0) rings_refused_ = true;
    rings_idle_.notify_one();
    return nullptr;
  }

  // A ring whose submission failed was torn down by give_up_ring: io_uring is not used again.
  void release_ring(std::unique_ptr<Ring> r, bool failed) {
    std::lock_guard lock(rings_mu_);
    if (failed) {
      --rings_made_;
      rings_refused_ = true;
    } else {
      idle_rings_.push_back(std::move(r));
    }
    rings_idle_.notify_one();
  }

  // On the caller's own ring: keeps up to kQueueDepth transfers in flight; a short completion puts
  // the request back with what is left of it. On the first error no new transfer is started, but
  // those in flight are waited for: their buffers belong to the caller, who may free them once we
  // return.
  Status many_uring(io_uring& ring, std::span<const IoRequest> reqs, bool write, bool* ring_failed) {
    std::vector<size_t> done(reqs.size(), 0);
    std::deque<size_t> todo;
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].len > 0) todo.push_back(i);
    Status first_error;
    unsigned in_flight = 0;
    auto fail = [&first_error](Status s) {
      if (first_error.ok()) first_error = std::move(s);
    };
    while (in_flight > 0 || (first_error.ok() && !todo.empty())) {
      while (first_error.ok() && !todo.empty() && in_flight < kQueueDepth) {
        io_uring_sqe* sqe = ::io_uring_get_sqe(&ring);
        if (sqe == nullptr) break;
        size_t i = todo.front();
        todo.pop_front();
        const IoRequest& r = reqs[i];
        char* p = static_cast<char*>(r.buf) + done[i];
        auto n = static_cast<unsigned>(std::min(r.len - done[i], kMaxPiece));
        if (write) {
          ::io_uring_prep_write(sqe, fd_, p, n, r.offset + done[i]);
        } else {
          ::io_uring_prep_read(sqe, fd_, p, n, r.offset + done[i]);
        }
        ::io_uring_sqe_set_data64(sqe, i);
        ++in_flight;
      }
      int rc = ::io_uring_submit_and_wait(&ring, 1);
      if (rc < 0) {
        if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
        fail(errno_status(std::string(write ? "writing " : "reading ") + path_ + " through io_uring", -rc));
        give_up_ring(ring, in_flight);
        *ring_failed = true;
        return first_error;
      }
      io_uring_cqe* cqe = nullptr;
      while (::io_uring_peek_cqe(&ring, &cqe) == 0 && cqe != nullptr) {
        auto i = static_cast<size_t>(::io_uring_cqe_get_data64(cqe));
        int res = cqe->res;
        ::io_uring_cqe_seen(&ring, cqe);
        --in_flight;
        const IoRequest& r = reqs[i];
        if (res < 0) {
          if (res == -EINTR || res == -EAGAIN) {
            todo.push_front(i);
            continue;
          }
          fail(errno_status(std::string(write ? "writing " : "reading ") + at(path_, r.offset + done[i]), -res));
          continue;
        }
        if (res == 0) {
          if (write) {
            fail(io_error("writing " + at(path_, r.offset + done[i]) + ": the write made no progress"));
          } else {
            fail(short_read(path_, r, done[i]));
          }
          continue;
        }
        done[i] += static_cast<size_t>(res);
        if (done[i] < r.len) todo.push_front(i);  // a short transfer: the rest goes again
      }
    }
    return first_error;
  }

  // After the ring itself failed: waits for the transfers in flight (their buffers are the
  // caller's), then tears the ring down; later batches use the plain loop.
  static void give_up_ring(io_uring& ring, unsigned in_flight) {
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = ::io_uring_wait_cqe(&ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      ::io_uring_cqe_seen(&ring, cqe);
      --in_flight;
    }
    ::io_uring_queue_exit(&ring);
  }

  std::mutex rings_mu_;
  std::condition_variable rings_idle_;
  std::vector<std::unique_ptr<Ring>> idle_rings_;  // guarded by rings_mu_
  size_t rings_made_ = 0;                          // guarded by rings_mu_: idle and in use
  bool rings_refused_ = false;                     // guarded by rings_mu_
#endif

  const int fd_;
  const std::string path_;
  const bool direct_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<File>> open(const std::string& path, unsigned flags) override {
    int oflags = O_CLOEXEC;
    oflags |= (flags & (kReadWrite | kCreate)) ? O_RDWR : O_RDONLY;
    if (flags & kCreate) oflags |= O_CREAT;
    if ((flags & kCreate) && (flags & kExclusive)) oflags |= O_EXCL;
    if (flags & kTruncate) oflags |= O_TRUNC;
    bool direct = (flags & kDirect) != 0;
    int fd = -1;
    while (true) {
      fd = ::open(path.c_str(), oflags | (direct ? O_DIRECT : 0), 0644);
      if (fd >= 0) break;
      if (errno == EINTR) continue;
      // tmpfs and some FUSE and network filesystems refuse O_DIRECT: use the page cache there and
      // say so through direct().
      if (errno == EINVAL && direct) {
        direct = false;
        continue;
      }
      if (errno == EEXIST) return already_exists("creating " + path + ": it exists already");
      return errno_status("opening " + path, errno);
    }
    return std::unique_ptr<File>(new PosixFile(fd, path, direct));
  }

  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return errno_status("renaming " + from + " to " + to, errno);
    return Status::OK();
  }

  Status unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return errno_status("deleting " + path, errno);
    return Status::OK();
  }

  Status sync_dir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_status("opening directory " + dir + " to sync it", errno);
    Status s;
    while (::fsync(fd) != 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL || errno == EROFS) break;  // filesystems that cannot sync directories
      s = errno_status("syncing directory " + dir, errno);
      break;
    }
    ::close(fd);
    return s;
  }

  Status make_dirs(const std::string& dir, bool private_dir) override {
    if (dir.empty()) return invalid_argument("creating a directory: empty path");
    std::string path = strip_slashes(dir);
    size_t pos = 0;
    while (pos <= path.size()) {
      size_t next = path.find('/', pos);
      if (next == std::string::npos) next = path.size();
      std::string cur = path.substr(0, next);
      pos = next + 1;
      if (cur.empty()) continue;
      mode_t mode = (private_dir && next == path.size()) ? 0700 : 0755;
      if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return errno_status("creating directory " + cur, errno);
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno_status("checking directory " + path, errno);
    if (!S_ISDIR(st.st_mode)) return invalid_argument(path + " exists and is not a directory");
    return Status::OK();
  }

  Result<std::vector<std::string>> list(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return errno_status("listing directory " + dir, errno);
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n != "." && n != "..") names.emplace_back(n);
      errno = 0;
    }
    int err = errno;
    ::closedir(d);
    if (err != 0) return errno_status("listing directory " + dir, err);
    std::sort(names.begin(), names.end());
    return names;
  }

  bool exists(const std::string& path) override {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
  }

  Status remove_all(const std::string& dir) override {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) {
      if (errno == ENOENT) return Status::OK();
      return errno_status("removing " + dir, errno);
    }
    if (S_ISDIR(st.st_mode)) {
      CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> names, list(dir));
      for (const std::string& n : names) CAIRN_RETURN_IF_ERROR(remove_all(dir + "/" + n));
      if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) return errno_status("removing directory " + dir, errno);
      return Status::OK();
    }
    if (::unlink(dir.c_str()) != 0 && errno != ENOENT) return errno_status("removing " + dir, errno);
    return Status::OK();
  }
};

}  // namespace

FileSystem& posix_fs() {
  static PosixFileSystem* fs = new PosixFileSystem();  // never destroyed: usable from static destructors
  return *fs;
}

}  // namespace cairn
