// MemoryFileSystem (core/fs.hpp): the in-memory filesystem for tests.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "core/fs.hpp"
#include "core/fs_internal.hpp"

namespace cairn {
namespace {

using fs_internal::at;
using fs_internal::short_read;
using fs_internal::strip_slashes;

// The parent directory of a path as the in-memory filesystem sees it ("a/b" -> "a", "/a" -> "/",
// "a" -> "").
std::string parent_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

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
    return Status::OK();
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
    return Status::OK();
  }

  Status write_many(std::span<const IoRequest> reqs) override {
    std::lock_guard lock(state_->mu);
    for (const IoRequest& r : reqs) CAIRN_RETURN_IF_ERROR(write_locked(r.buf, r.len, r.offset));
    return Status::OK();
  }

  Status read_many(std::span<const IoRequest> reqs) override {
    std::lock_guard lock(state_->mu);
    for (const IoRequest& r : reqs) {
      size_t got = read_locked(r.buf, r.len, r.offset);
      if (got != r.len) return short_read(path_, r, got);
    }
    return Status::OK();
  }

  Status sync(bool) override { return Status::OK(); }

  Status allocate(uint64_t offset, uint64_t len) override {
    std::lock_guard lock(state_->mu);
    CAIRN_RETURN_IF_ERROR(check_writable("reserving space in"));
    if (offset + len > node_->data.size())
      return state_->resize(*node_, offset + len,
                            "reserving " + std::to_string(len) + " bytes of " + at(path_, offset));
    return Status::OK();
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
    if (writable_) return Status::OK();
    return errno_status(std::string(op) + " " + path_ + " (opened read-only)", EBADF);
  }

  Status write_locked(const void* buf, size_t len, uint64_t offset) {
    CAIRN_RETURN_IF_ERROR(check_writable("writing"));
    if (len == 0) return Status::OK();
    if (offset + len > node_->data.size())
      CAIRN_RETURN_IF_ERROR(state_->resize(*node_, offset + len, "writing " + at(path_, offset)));
    std::memcpy(node_->data.data() + offset, buf, len);
    return Status::OK();
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
  if (from == to) return Status::OK();
  std::shared_ptr<State::Node> node = std::move(it->second);
  state_->files.erase(it);
  state_->files[to] = std::move(node);  // replaces (and may free) what was there, like rename(2)
  return Status::OK();
}

Status MemoryFileSystem::unlink(const std::string& path) {
  std::lock_guard lock(state_->mu);
  auto it = state_->files.find(path);
  if (it == state_->files.end()) {
    if (state_->dirs.count(path)) return errno_status("deleting " + path, EISDIR);
    return errno_status("deleting " + path, ENOENT);
  }
  state_->files.erase(it);  // open Files keep the node (and its bytes) alive
  return Status::OK();
}

Status MemoryFileSystem::sync_dir(const std::string& dir) {
  std::lock_guard lock(state_->mu);
  if (!state_->dir_exists(strip_slashes(dir))) return errno_status("opening directory " + dir + " to sync it", ENOENT);
  return Status::OK();
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
  return Status::OK();
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
  return Status::OK();
}

uint64_t MemoryFileSystem::bytes_used() const {
  std::lock_guard lock(state_->mu);
  return state_->used;
}

}  // namespace cairn
