// The filesystem/device seam (core/fs.hpp): the POSIX implementation, the in-memory one and the
// fault injector.
#include "core/fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#ifdef CAIRN_HAVE_LIBURING
#include <liburing.h>
#endif

namespace cairn {
namespace {

// ---------------------------------------------------------------------------------------------
// Shared helpers.

std::string at(const std::string& path, uint64_t offset) { return path + " at " + std::to_string(offset); }

// The parent directory of a path as the in-memory filesystem sees it ("a/b" -> "a", "/a" -> "/",
// "a" -> "").
std::string parent_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Drops trailing slashes (but keeps "/") so "d/" and "d" name the same directory.
std::string strip_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool aligned(uint64_t v) { return v % kDirectAlignment == 0; }

// For O_DIRECT files: names what is misaligned, so the caller can fix the right thing.
Status check_direct(const std::string& path, const void* buf, size_t len, uint64_t offset, const char* op) {
  std::string bad;
  if (!aligned(reinterpret_cast<uintptr_t>(buf))) bad += "buffer address";
  if (!aligned(len)) bad += std::string(bad.empty() ? "" : ", ") + "length " + std::to_string(len);
  if (!aligned(offset)) bad += std::string(bad.empty() ? "" : ", ") + "offset " + std::to_string(offset);
  if (bad.empty()) return Status::ok();
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
  return Status::ok();
}

Status pread_fd(int fd, const std::string& path, void* buf, size_t len, uint64_t offset, size_t* got) {
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
  }
  *got = done;
  return Status::ok();
}

Status short_read(const std::string& path, const IoRequest& r, size_t got) {
  return io_error("reading " + at(path, r.offset) + ": the file ends after " + std::to_string(got) + " of the " +
                  std::to_string(r.len) + " bytes asked for");
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path, bool direct) : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~PosixFile() override {
#ifdef CAIRN_HAVE_LIBURING
    if (ring_ok_) ::io_uring_queue_exit(&ring_);
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
    return pread_fd(fd_, path_, buf, len, offset, got);
  }

  Status write_many(std::span<const IoRequest> reqs) override { return many(reqs, /*write=*/true); }
  Status read_many(std::span<const IoRequest> reqs) override { return many(reqs, /*write=*/false); }

  Status sync(bool data_only) override {
    while ((data_only ? ::fdatasync(fd_) : ::fsync(fd_)) != 0) {
      if (errno == EINTR) continue;
      return errno_status("syncing " + path_, errno);
    }
    return Status::ok();
  }

  Status allocate(uint64_t offset, uint64_t len) override {
    if (len == 0) return Status::ok();
    // posix_fallocate would emulate on filesystems without fallocate by writing zeros, which on a
    // burst buffer is the very traffic we reserve space to avoid; the caller gets the error instead.
    while (::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(len)) != 0) {
      if (errno == EINTR) continue;
      return errno_status("reserving " + std::to_string(len) + " bytes of " + at(path_, offset), errno);
    }
    return Status::ok();
  }

  Status truncate(uint64_t size) override {
    while (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      if (errno == EINTR) continue;
      return errno_status("truncating " + path_ + " to " + std::to_string(size) + " bytes", errno);
    }
    return Status::ok();
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
      std::lock_guard lock(ring_mu_);
      if (ring_usable()) return many_uring(reqs, write);
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
        CAIRN_RETURN_IF_ERROR(pread_fd(fd_, path_, r.buf, r.len, r.offset, &got));
        if (got != r.len) return short_read(path_, r, got);
      }
    }
    return Status::ok();
  }

#ifdef CAIRN_HAVE_LIBURING
  static constexpr unsigned kQueueDepth = 32;
  // A completion's res is an int: keep each submission well below 2 GiB.
  static constexpr size_t kMaxPiece = size_t{1} << 30;

  // REQUIRES: ring_mu_ held. Sets the ring up on first use; false when the kernel refuses it
  // (old kernel, seccomp, io_uring disabled by sysctl), and then the plain loop is used for good.
  bool ring_usable() {
    if (!ring_tried_) {
      ring_tried_ = true;
      ring_ok_ = ::io_uring_queue_init(kQueueDepth, &ring_, 0) == 0;
    }
    return ring_ok_;
  }

  // REQUIRES: ring_mu_ held. Keeps up to kQueueDepth transfers in flight; a short completion puts
  // the request back with what is left of it. On the first error no new transfer is started, but
  // those in flight are waited for: their buffers belong to the caller, who may free them once we
  // return.
  Status many_uring(std::span<const IoRequest> reqs, bool write) {
    std::vector<size_t> done(reqs.size(), 0);
    std::deque<size_t> todo;
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].len > 0) todo.push_back(i);
    Status first_error;
    unsigned in_flight = 0;
    auto fail = [&first_error](Status s) {
      if (first_error.is_ok()) first_error = std::move(s);
    };
    while (in_flight > 0 || (first_error.is_ok() && !todo.empty())) {
      while (first_error.is_ok() && !todo.empty() && in_flight < kQueueDepth) {
        io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
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
      int rc = ::io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0) {
        if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
        fail(errno_status(std::string(write ? "writing " : "reading ") + path_ + " through io_uring", -rc));
        give_up_ring(in_flight);
        return first_error;
      }
      io_uring_cqe* cqe = nullptr;
      while (::io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
        auto i = static_cast<size_t>(::io_uring_cqe_get_data64(cqe));
        int res = cqe->res;
        ::io_uring_cqe_seen(&ring_, cqe);
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

  // REQUIRES: ring_mu_ held. After the ring itself failed: waits for the transfers in flight (their
  // buffers are the caller's), then tears the ring down; later batches use the plain loop.
  void give_up_ring(unsigned in_flight) {
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = ::io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      ::io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
    }
    ::io_uring_queue_exit(&ring_);
    ring_ok_ = false;
  }

  std::mutex ring_mu_;
  bool ring_tried_ = false;  // guarded by ring_mu_
  bool ring_ok_ = false;     // guarded by ring_mu_
  io_uring ring_{};          // guarded by ring_mu_
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
    return Status::ok();
  }

  Status unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return errno_status("deleting " + path, errno);
    return Status::ok();
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
    return Status::ok();
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
      if (errno == ENOENT) return Status::ok();
      return errno_status("removing " + dir, errno);
    }
    if (S_ISDIR(st.st_mode)) {
      CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> names, list(dir));
      for (const std::string& n : names) CAIRN_RETURN_IF_ERROR(remove_all(dir + "/" + n));
      if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) return errno_status("removing directory " + dir, errno);
      return Status::ok();
    }
    if (::unlink(dir.c_str()) != 0 && errno != ENOENT) return errno_status("removing " + dir, errno);
    return Status::ok();
  }
};

}  // namespace

FileSystem& posix_fs() {
  static PosixFileSystem* fs = new PosixFileSystem();  // never destroyed: usable from static destructors
  return *fs;
}

// ---------------------------------------------------------------------------------------------
// MemoryFileSystem.

// One mutex for everything: the in-memory filesystem is for tests, where simple beats fast.
struct MemoryFileSystem::State {
  struct Node {
    State* owner;
    std::vector<uint8_t> data;
    explicit Node(State* o) : owner(o) {}
    // REQUIRES: owner->mu held (or the State being destroyed). An unlinked file's bytes count
    // until its last File closes, as on a real filesystem.
    ~Node() { owner->used -= data.size(); }
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
  };

  mutable std::mutex mu;
  uint64_t capacity = 0;
  uint64_t used = 0;  // declared before files: nodes update it while the map is destroyed
  std::set<std::string> dirs;
  std::map<std::string, std::shared_ptr<Node>> files;

  bool dir_exists(const std::string& d) const { return d.empty() || d == "/" || dirs.count(d) > 0; }

  // REQUIRES: mu held. Grows (or shrinks) n to size bytes, within the capacity.
  Status resize(Node& n, uint64_t size, const std::string& what) {
    if (size > n.data.size()) {
      uint64_t grow = size - n.data.size();
      if (capacity != 0 && used + grow > capacity)
        return no_space(what + ": the in-memory filesystem holds " + std::to_string(used) + " of its " +
                        std::to_string(capacity) + " bytes; " + std::to_string(grow) + " more do not fit");
      used += grow;
    } else {
      used -= n.data.size() - size;
    }
    n.data.resize(size);
    return Status::ok();
  }
};

namespace {

class MemoryFile final : public File {
 public:
  using State = MemoryFileSystem::State;
  MemoryFile(std::shared_ptr<State> state, std::shared_ptr<State::Node> node, std::string path, bool writable)
      : state_(std::move(state)), node_(std::move(node)), path_(std::move(path)), writable_(writable) {}
  ~MemoryFile() override {
    std::lock_guard lock(state_->mu);
    node_.reset();  // may destroy the node, which updates state_->used
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  const std::string& path() const override { return path_; }
  bool direct() const override { return false; }

  Status pwrite(const void* buf, size_t len, uint64_t offset) override {
    std::lock_guard lock(state_->mu);
    return write_locked(buf, len, offset);
  }

  Status pread(void* buf, size_t len, uint64_t offset, size_t* got) override {
    std::lock_guard lock(state_->mu);
    *got = read_locked(buf, len, offset);
    return Status::ok();
  }

  Status write_many(std::span<const IoRequest> reqs) override {
    std::lock_guard lock(state_->mu);
    for (const IoRequest& r : reqs) CAIRN_RETURN_IF_ERROR(write_locked(r.buf, r.len, r.offset));
    return Status::ok();
  }

  Status read_many(std::span<const IoRequest> reqs) override {
    std::lock_guard lock(state_->mu);
    for (const IoRequest& r : reqs) {
      size_t got = read_locked(r.buf, r.len, r.offset);
      if (got != r.len) return short_read(path_, r, got);
    }
    return Status::ok();
  }

  Status sync(bool) override { return Status::ok(); }

  Status allocate(uint64_t offset, uint64_t len) override {
    std::lock_guard lock(state_->mu);
    CAIRN_RETURN_IF_ERROR(check_writable("reserving space in"));
    if (offset + len > node_->data.size())
      return state_->resize(*node_, offset + len,
                            "reserving " + std::to_string(len) + " bytes of " + at(path_, offset));
    return Status::ok();
  }

  Status truncate(uint64_t size) override {
    std::lock_guard lock(state_->mu);
    CAIRN_RETURN_IF_ERROR(check_writable("truncating"));
    return state_->resize(*node_, size, "truncating " + path_ + " to " + std::to_string(size) + " bytes");
  }

  Result<uint64_t> size() override {
    std::lock_guard lock(state_->mu);
    return static_cast<uint64_t>(node_->data.size());
  }

 private:
  Status check_writable(const char* op) const {
    if (writable_) return Status::ok();
    return errno_status(std::string(op) + " " + path_ + " (opened read-only)", EBADF);
  }

  Status write_locked(const void* buf, size_t len, uint64_t offset) {
    CAIRN_RETURN_IF_ERROR(check_writable("writing"));
    if (len == 0) return Status::ok();
    if (offset + len > node_->data.size())
      CAIRN_RETURN_IF_ERROR(state_->resize(*node_, offset + len, "writing " + at(path_, offset)));
    std::memcpy(node_->data.data() + offset, buf, len);
    return Status::ok();
  }

  size_t read_locked(void* buf, size_t len, uint64_t offset) const {
    if (offset >= node_->data.size()) return 0;
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, node_->data.size() - offset));
    std::memcpy(buf, node_->data.data() + offset, n);
    return n;
  }

  std::shared_ptr<State> state_;
  std::shared_ptr<State::Node> node_;  // reset under state_->mu
  const std::string path_;
  const bool writable_;
};

}  // namespace

MemoryFileSystem::MemoryFileSystem(uint64_t capacity) : state_(std::make_shared<State>()) {
  state_->capacity = capacity;
}

MemoryFileSystem::~MemoryFileSystem() = default;

Result<std::unique_ptr<File>> MemoryFileSystem::open(const std::string& path, unsigned flags) {
  std::lock_guard lock(state_->mu);
  if (state_->dirs.count(path)) return invalid_argument("opening " + path + ": it is a directory");
  auto it = state_->files.find(path);
  std::shared_ptr<State::Node> node;
  if (it == state_->files.end()) {
    if (!(flags & kCreate)) return errno_status("opening " + path, ENOENT);
    if (!state_->dir_exists(parent_of(path)))
      return errno_status("creating " + path + " (directory " + parent_of(path) + ")", ENOENT);
    node = std::make_shared<State::Node>(state_.get());
    state_->files.emplace(path, node);
  } else {
    if ((flags & kCreate) && (flags & kExclusive)) return already_exists("creating " + path + ": it exists already");
    node = it->second;
  }
  bool writable = (flags & (kReadWrite | kCreate)) != 0;
  if ((flags & kTruncate) && writable) {
    state_->used -= node->data.size();
    node->data.clear();
  }
  return std::unique_ptr<File>(new MemoryFile(state_, std::move(node), path, writable));
}

Status MemoryFileSystem::rename(const std::string& from, const std::string& to) {
  std::lock_guard lock(state_->mu);
  auto it = state_->files.find(from);
  if (it == state_->files.end()) {
    if (state_->dirs.count(from))
      return invalid_argument("renaming " + from + ": the in-memory filesystem renames files only");
    return errno_status("renaming " + from + " to " + to, ENOENT);
  }
  if (state_->dirs.count(to)) return errno_status("renaming " + from + " to " + to, EISDIR);
  if (!state_->dir_exists(parent_of(to))) return errno_status("renaming " + from + " to " + to, ENOENT);
  if (from == to) return Status::ok();
  std::shared_ptr<State::Node> node = std::move(it->second);
  state_->files.erase(it);
  state_->files[to] = std::move(node);  // replaces (and may free) what was there, like rename(2)
  return Status::ok();
}

Status MemoryFileSystem::unlink(const std::string& path) {
  std::lock_guard lock(state_->mu);
  auto it = state_->files.find(path);
  if (it == state_->files.end()) {
    if (state_->dirs.count(path)) return errno_status("deleting " + path, EISDIR);
    return errno_status("deleting " + path, ENOENT);
  }
  state_->files.erase(it);  // open Files keep the node (and its bytes) alive
  return Status::ok();
}

Status MemoryFileSystem::sync_dir(const std::string& dir) {
  std::lock_guard lock(state_->mu);
  if (!state_->dir_exists(strip_slashes(dir))) return errno_status("opening directory " + dir + " to sync it", ENOENT);
  return Status::ok();
}

Status MemoryFileSystem::make_dirs(const std::string& dir, bool) {
  if (dir.empty()) return invalid_argument("creating a directory: empty path");
  std::string path = strip_slashes(dir);
  std::lock_guard lock(state_->mu);
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    std::string cur = path.substr(0, next);
    pos = next + 1;
    if (cur.empty()) continue;
    if (state_->files.count(cur)) return invalid_argument(cur + " exists and is not a directory");
    state_->dirs.insert(cur);
  }
  return Status::ok();
}

Result<std::vector<std::string>> MemoryFileSystem::list(const std::string& dir) {
  std::string d = strip_slashes(dir);
  std::lock_guard lock(state_->mu);
  if (!state_->dir_exists(d)) return errno_status("listing directory " + dir, ENOENT);
  std::vector<std::string> names;
  auto add = [&](const std::string& p) {
    if (p != d && parent_of(p) == d) names.push_back(p.substr(d == "/" ? 1 : (d.empty() ? 0 : d.size() + 1)));
  };
  for (const std::string& p : state_->dirs) add(p);
  for (const auto& [p, node] : state_->files) add(p);
  std::sort(names.begin(), names.end());
  return names;
}

bool MemoryFileSystem::exists(const std::string& path) {
  std::string p = strip_slashes(path);
  std::lock_guard lock(state_->mu);
  return state_->files.count(p) > 0 || (!p.empty() && state_->dir_exists(p));
}

Status MemoryFileSystem::remove_all(const std::string& dir) {
  std::string d = strip_slashes(dir);
  std::string prefix = d == "/" ? "/" : d + "/";
  std::lock_guard lock(state_->mu);
  auto under = [&](const std::string& p) { return p == d || p.compare(0, prefix.size(), prefix) == 0; };
  for (auto it = state_->files.begin(); it != state_->files.end();)
    it = under(it->first) ? state_->files.erase(it) : std::next(it);
  for (auto it = state_->dirs.begin(); it != state_->dirs.end();)
    it = under(*it) ? state_->dirs.erase(it) : std::next(it);
  return Status::ok();
}

uint64_t MemoryFileSystem::bytes_used() const {
  std::lock_guard lock(state_->mu);
  return state_->used;
}

// ---------------------------------------------------------------------------------------------
// FaultyFileSystem.
//
// Effects act where they mean something: kShortWrite and kDropWrite on writes, kFlipBit on reads
// (and on writes, where it stores the bytes with one bit flipped); any other pairing (a kFlipBit
// rule on kSync, say) fails the operation as kFail would. kSync rules match File::sync and
// sync_dir; kRename rules match either name. truncate, size, make_dirs, list, exists and
// remove_all are never changed.

struct FaultyFileSystem::State {
  mutable std::mutex mu;
  std::vector<Rule> rules;  // skip and times count down in place
  uint64_t injected = 0;

  // The effect to apply to one operation on path (or on either of two paths), if a rule matches.
  std::optional<Rule> match(Op op, const std::string& path, const std::string& path2 = {}) {
    std::lock_guard lock(mu);
    for (Rule& r : rules) {
      if (r.op != op || r.times == 0) continue;
      if (!r.path_contains.empty() && path.find(r.path_contains) == std::string::npos &&
          (path2.empty() || path2.find(r.path_contains) == std::string::npos))
        continue;
      if (r.skip > 0) {
        --r.skip;  // let this one through; a later rule may still match it
        continue;
      }
      if (r.times > 0) --r.times;
      ++injected;
      return r;
    }
    return std::nullopt;
  }
};

namespace {

using Faulty = FaultyFileSystem;

Status injected_error(const std::string& what, const Faulty::Rule& r) {
  return errno_status(what + " (injected fault)", r.err);
}

struct AlignedDelete {
  void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t(kDirectAlignment)); }
};

// Flips one bit in the middle of buf.
void flip_bit(void* buf, size_t len) {
  if (len == 0) return;
  static_cast<uint8_t*>(buf)[len / 2] ^= 0x10;
}

class FaultyFile final : public File {
 public:
  FaultyFile(std::unique_ptr<File> base, std::shared_ptr<Faulty::State> state)
      : base_(std::move(base)), state_(std::move(state)) {}

  const std::string& path() const override { return base_->path(); }
  bool direct() const override { return base_->direct(); }

  Status pwrite(const void* buf, size_t len, uint64_t offset) override {
    std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kWrite, path());
    if (!r) return base_->pwrite(buf, len, offset);
    return faulty_write(*r, buf, len, offset);
  }

  Status pread(void* buf, size_t len, uint64_t offset, size_t* got) override {
    *got = 0;
    std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kRead, path());
    if (!r) return base_->pread(buf, len, offset, got);
    if (r->effect != Faulty::Effect::kFlipBit) return injected_error("reading " + at(path(), offset), *r);
    CAIRN_RETURN_IF_ERROR(base_->pread(buf, len, offset, got));
    flip_bit(buf, *got);
    return Status::ok();
  }

  // Requests no rule matches go to the base as one batch; the others are handled one by one
  // afterwards. The first error is returned, after every request has been tried (the header
  // allows some requests to have completed on failure).
  Status write_many(std::span<const IoRequest> reqs) override {
    std::vector<IoRequest> plain;
    std::vector<std::pair<IoRequest, Faulty::Rule>> hit;
    for (const IoRequest& q : reqs) {
      std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kWrite, path());
      if (r) {
        hit.emplace_back(q, *r);
      } else {
        plain.push_back(q);
      }
    }
    if (hit.empty()) return base_->write_many(reqs);
    Status first = base_->write_many(plain);
    for (const auto& [q, r] : hit) {
      Status s = faulty_write(r, q.buf, q.len, q.offset);
      if (first.is_ok()) first = s;
    }
    return first;
  }

  Status read_many(std::span<const IoRequest> reqs) override {
    std::vector<IoRequest> plain;
    std::vector<IoRequest> flipped;
    Status first;
    for (const IoRequest& q : reqs) {
      std::optional<Faulty::Rule> r = state_->match(Faulty::Op::kRead, path());
      if (!r) {
        plain.push_back(q);
      } else if (r->effect == Faulty::Effect::kFlipBit) {
        plain.push_back(q);
        flipped.push_back(q);
      } else if (first.is_ok()) {
        first = injected_error("reading " + at(path(), q.offset), *r);
      }
    }
    if (plain.size() == reqs.size() && flipped.empty()) return base_->read_many(reqs);
    Status s = base_->read_many(plain);
    if (s.is_ok()) {
      for (const IoRequest& q : flipped) flip_bit(q.buf, q.len);
    }
    return first.is_ok() ? s : first;
  }

  Status sync(bool data_only) override {
    if (auto r = state_->match(Faulty::Op::kSync, path())) return injected_error("syncing " + path(), *r);
    return base_->sync(data_only);
  }

  Status allocate(uint64_t offset, uint64_t len) override {
    if (auto r = state_->match(Faulty::Op::kAllocate, path()))
      return injected_error("reserving " + std::to_string(len) + " bytes of " + at(path(), offset), *r);
    return base_->allocate(offset, len);
  }

  Status truncate(uint64_t size) override { return base_->truncate(size); }
  Result<uint64_t> size() override { return base_->size(); }

 private:
  Status faulty_write(const Faulty::Rule& r, const void* buf, size_t len, uint64_t offset) {
    const std::string what = "writing " + at(path(), offset);
    switch (r.effect) {
      case Faulty::Effect::kDropWrite:
        return Status::ok();
      case Faulty::Effect::kShortWrite: {
        size_t half = len / 2;
        if (direct()) half -= half % kDirectAlignment;  // the base would refuse a misaligned half
        if (half > 0) CAIRN_RETURN_IF_ERROR(base_->pwrite(buf, half, offset));
        return errno_status(what + ": only " + std::to_string(half) + " of " + std::to_string(len) +
                                " bytes written (injected torn write)",
                            EIO);
      }
      case Faulty::Effect::kFlipBit: {
        // Stores corrupted bytes and leaves the caller's buffer intact. The copy is aligned so
        // that a direct file accepts it.
        std::unique_ptr<uint8_t, AlignedDelete> copy(
            static_cast<uint8_t*>(::operator new(std::max<size_t>(len, 1), std::align_val_t(kDirectAlignment))));
        std::memcpy(copy.get(), buf, len);
        flip_bit(copy.get(), len);
        return base_->pwrite(copy.get(), len, offset);
      }
      case Faulty::Effect::kFail:
        break;
    }
    return injected_error(what, r);
  }

  std::unique_ptr<File> base_;
  std::shared_ptr<Faulty::State> state_;
};

}  // namespace

FaultyFileSystem::FaultyFileSystem(FileSystem& base) : base_(base), state_(std::make_shared<State>()) {}
FaultyFileSystem::~FaultyFileSystem() = default;

void FaultyFileSystem::add(Rule rule) {
  std::lock_guard lock(state_->mu);
  state_->rules.push_back(std::move(rule));
}

void FaultyFileSystem::clear() {
  std::lock_guard lock(state_->mu);
  state_->rules.clear();
}

uint64_t FaultyFileSystem::injected() const {
  std::lock_guard lock(state_->mu);
  return state_->injected;
}

Result<std::unique_ptr<File>> FaultyFileSystem::open(const std::string& path, unsigned flags) {
  if (auto r = state_->match(Op::kOpen, path)) return injected_error("opening " + path, *r);
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<File> f, base_.open(path, flags));
  return std::unique_ptr<File>(new FaultyFile(std::move(f), state_));
}

Status FaultyFileSystem::rename(const std::string& from, const std::string& to) {
  if (auto r = state_->match(Op::kRename, from, to)) return injected_error("renaming " + from + " to " + to, *r);
  return base_.rename(from, to);
}

Status FaultyFileSystem::unlink(const std::string& path) {
  if (auto r = state_->match(Op::kUnlink, path)) return injected_error("deleting " + path, *r);
  return base_.unlink(path);
}

Status FaultyFileSystem::sync_dir(const std::string& dir) {
  if (auto r = state_->match(Op::kSync, dir)) return injected_error("syncing directory " + dir, *r);
  return base_.sync_dir(dir);
}

Status FaultyFileSystem::make_dirs(const std::string& dir, bool private_dir) {
  return base_.make_dirs(dir, private_dir);
}

Result<std::vector<std::string>> FaultyFileSystem::list(const std::string& dir) { return base_.list(dir); }

bool FaultyFileSystem::exists(const std::string& path) { return base_.exists(path); }

Status FaultyFileSystem::remove_all(const std::string& dir) { return base_.remove_all(dir); }

}  // namespace cairn
