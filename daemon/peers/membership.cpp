// The peer group's membership: the rendezvous directory, the group secret and the member files.
#include "daemon/peers/membership.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/log.hpp"
#include "daemon/peers/crypto.hpp"

namespace cairn {

namespace {

using nlohmann::json;

constexpr size_t kSecretBytes = 32;
constexpr size_t kMaxJobLength = 200;
constexpr off_t kMaxMemberFile = 64 * 1024;  // a member file is ~200 bytes; anything larger is junk

std::string mode_octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

Status check_job(const std::string& job) {
  auto bad = [&](const std::string& why) {
    return invalid_argument("peers.job '" + job + "' " + why + ": a job id is one path component");
  };
  if (job.empty()) return invalid_argument("peers.job is empty: the group needs a job id");
  if (job.size() > kMaxJobLength) return bad("is longer than " + std::to_string(kMaxJobLength) + " characters");
  if (job.find('\0') != std::string::npos) return bad("contains a NUL character");
  if (job.find('/') != std::string::npos) return bad("contains '/'");
  if (job == "." || job == "..") return bad("is not a directory name");
  return Status::OK();
}

// mkdir -p with the usual mode (0777 less the umask): the rendezvous directory may be shared.
Status make_parents(const std::string& path) {
  if (path.empty()) return invalid_argument("peers.rendezvous is empty");
  std::string prefix;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    prefix = path.substr(0, next);
    pos = next + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      return errno_status("creating the rendezvous directory " + prefix, errno);
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_status("rendezvous directory " + path, errno);
  if (!S_ISDIR(st.st_mode)) return invalid_argument("peers.rendezvous " + path + " is not a directory");
  return Status::OK();
}

// Creates dir (mode 0700) if missing, then checks it is a directory of this user.
Status make_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno_status("creating " + dir, errno);
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno_status("checking " + dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return permission_denied(dir + " is not a directory (a symbolic link or a file is in its place): remove it");
  }
  if (st.st_uid != ::getuid()) {
    return permission_denied(dir + " belongs to uid " + std::to_string(st.st_uid) + ", not this user (uid " +
                             std::to_string(::getuid()) + "): another user's job cannot be joined");
  }
  if ((st.st_mode & 0022) != 0) {
    CAIRN_LOG_WARN("peers: {} has mode {}: other users can write in the group's directory (chmod 700 it)", dir,
                   mode_octal(st.st_mode));
  }
  return Status::OK();
}

Status write_all(int fd, const std::string& data, const std::string& what) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("writing " + what, errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// Reads up to limit bytes of an open file; false on a read error.
bool read_all(int fd, size_t limit, std::string& out) {
  out.clear();
  char buf[4096];
  while (out.size() < limit) {
    ssize_t n = ::read(fd, buf, std::min(sizeof buf, limit - out.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return true;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

// Reads an existing secret; kNotFound when there is none (yet).
Result<std::string> read_secret(const std::string& path) {
  // O_NONBLOCK: a FIFO planted in place of the secret must not hang the join.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return not_found(path + " does not exist");
    if (err == ELOOP) {
      return permission_denied(path +
                               " is a symbolic link; the group's secret must be a regular file "
                               "(remove the group directory)");
    }
    return errno_status("opening the group's secret " + path, err);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno_status("checking the group's secret " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return permission_denied(path +
                             " is not a regular file; the group's secret must be one (remove the group "
                             "directory)");
  }
  if (st.st_uid != ::getuid()) {
    return permission_denied(path + " belongs to uid " + std::to_string(st.st_uid) + ", not this user (uid " +
                             std::to_string(::getuid()) +
                             "): another user could have planted it; the group's secret must be this user's");
  }
  if ((st.st_mode & 0077) != 0) {
    return permission_denied(path + " has mode " + mode_octal(st.st_mode) +
                             "; the group's secret must be 0600 (chmod 600 it or remove the group directory)");
  }
  if (st.st_size != static_cast<off_t>(kSecretBytes)) {
    return permission_denied(path + " holds " + std::to_string(st.st_size) + " bytes; the group's secret is " +
                             std::to_string(kSecretBytes) + " bytes (remove the group directory)");
  }
  std::string secret;
  if (!read_all(fd, kSecretBytes + 1, secret)) return errno_status("reading the group's secret " + path, errno);
  if (secret.size() != kSecretBytes) {
    return permission_denied(path + " holds " + std::to_string(secret.size()) + " bytes; the group's secret is " +
                             std::to_string(kSecretBytes) + " bytes (remove the group directory)");
  }
  return secret;
}

// Reads the group's secret, or creates it when this is the first member. The secret is written in
// full under a temporary name and then linked in place, so no reader sees a partial secret; when
// the link finds one already there, another member won the race and its secret is read.
Result<std::string> read_or_create_secret(const std::string& dir) {
  const std::string path = dir + "/secret";
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto existing = read_secret(path);
    if (existing.ok() || existing.status().code() != StatusCode::kNotFound) return existing;

    const std::string tmp = dir + "/.secret." + to_hex(random_bytes(8)) + ".tmp";
    int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errno_status("creating the group's secret " + tmp, errno);
    std::string secret = random_bytes(kSecretBytes);
    Status s;
    if (::fchmod(fd, 0600) != 0) s = errno_status("chmod " + tmp, errno);  // whatever the umask
    if (s.ok()) s = write_all(fd, secret, tmp);
    if (s.ok() && ::fsync(fd) != 0) s = errno_status("fsync " + tmp, errno);
    if (::close(fd) != 0 && s.ok()) s = errno_status("closing " + tmp, errno);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    int rc = ::link(tmp.c_str(), path.c_str());
    int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) {
      fsync_dir(dir);
      return secret;
    }
    if (err != EEXIST) return errno_status("publishing the group's secret " + path, err);
    // Another member linked its secret first: read that one on the next round.
  }
  return unavailable(path + " keeps appearing and disappearing: is something removing the group directory?");
}

json member_json(const MemberInfo& m) {
  return json{{"id", m.id}, {"host", m.host}, {"pid", m.pid}, {"address", to_hex(m.address)}, {"started", m.started}};
}

// A member file's content; false when it is not one (the id must also match the file name).
bool parse_member(const std::string& text, const std::string& expected_id, MemberInfo& m) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto str = [&](const char* key, std::string& out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  auto integer = [&](const char* key, int64_t& out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) return false;
    out = it->get<int64_t>();
    return true;
  };
  std::string hex;
  if (!str("id", m.id) || !str("host", m.host) || !integer("pid", m.pid) || !str("address", hex) ||
      !integer("started", m.started)) {
    return false;
  }
  if (m.id != expected_id || m.pid <= 0) return false;
  return from_hex(hex, m.address);
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

bool process_alive(int64_t pid) {
  if (pid <= 0 || pid > static_cast<int64_t>(INT32_MAX)) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::chrono::nanoseconds mtime_of(const struct stat& st) {
  return std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
}

std::chrono::nanoseconds wall_now() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Removes a stale file unless it changed since it was judged (its owner came back meanwhile).
void remove_stale(const std::string& path, const struct stat& judged) {
  struct stat now;
  if (::lstat(path.c_str(), &now) != 0) return;
  if (now.st_ino != judged.st_ino || mtime_of(now) != mtime_of(judged)) return;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    CAIRN_LOG_WARN("peers: removing the stale member file {}: {}", path, errno_status("unlink", errno).message());
  }
}

// Writes this member's file under a temporary name and renames it in place. Called with mu_ held
// (or before the object is shared).
Status publish(const std::string& dir, const std::string& file, const MemberInfo& self) {
  const std::string tmp = dir + "/members/." + self.id + ".tmp";
  int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno_status("creating the member file " + tmp, errno);
  Status s = write_all(fd, member_json(self).dump() + "\n", tmp);
  if (s.ok() && ::fsync(fd) != 0) s = errno_status("fsync " + tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = errno_status("closing " + tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), file.c_str()) != 0) s = errno_status("publishing " + file, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace

Result<std::unique_ptr<Membership>> Membership::join(const std::string& rendezvous, const std::string& job,
                                                     const std::string& fabric_address,
                                                     std::chrono::milliseconds timeout) {
  CAIRN_RETURN_IF_ERROR(check_job(job));
  if (timeout.count() <= 0) {
    return invalid_argument("peers.timeout must be positive, not " + std::to_string(timeout.count()) + "ms");
  }
  std::string root = rendezvous;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  CAIRN_RETURN_IF_ERROR(make_parents(root));
  const std::string dir = root + "/" + job;
  CAIRN_RETURN_IF_ERROR(make_private_dir(dir));
  CAIRN_RETURN_IF_ERROR(make_private_dir(dir + "/members"));
  CAIRN_ASSIGN_OR_RETURN(std::string secret, read_or_create_secret(dir));

  std::unique_ptr<Membership> m(new Membership());
  m->dir_ = dir;
  m->secret_ = std::move(secret);
  m->timeout_ = timeout;
  m->self_.id = "m" + to_hex(random_bytes(8));
  m->self_.host = this_host();
  m->self_.pid = static_cast<int64_t>(::getpid());
  m->self_.address = fabric_address;
  m->self_.started = static_cast<int64_t>(::time(nullptr));
  m->file_ = dir + "/members/" + m->self_.id + ".json";
  Status s = publish(m->dir_, m->file_, m->self_);
  if (!s.ok()) {
    m->left_ = true;  // nothing to remove
    return s;
  }
  return m;
}

Membership::~Membership() { leave(); }

std::vector<MemberInfo> Membership::scan() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MemberInfo> live;
  if (!left_) live.push_back(self_);
  const std::string members = dir_ + "/members";
  DIR* d = ::opendir(members.c_str());
  if (d == nullptr) {
    CAIRN_LOG_WARN("peers: listing {}: {}", members, errno_status("opendir", errno).message());
    return live;
  }
  const auto now = wall_now();
  const auto limit = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_);
  // |now - mtime| <= timeout: a member on a host whose clock runs ahead is not live forever.
  auto fresh = [&](const struct stat& st) {
    auto age = now - mtime_of(st);
    return age <= limit && -age <= limit;
  };
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);

  for (const auto& name : names) {
    if (name == "." || name == "..") continue;
    const std::string path = members + "/" + name;
    struct stat st;
    if (name.front() == '.') {
      // A temporary file a member died writing: removed once it is old.
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 && ::lstat(path.c_str(), &st) == 0 &&
          !fresh(st)) {
        remove_stale(path, st);
      }
      continue;
    }
    if (name.size() <= 5 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    const std::string id = name.substr(0, name.size() - 5);
    if (id == self_.id) continue;  // self_ is already in (heartbeat rewrites a removed file)
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;  // removed meanwhile, or not something to read
    std::string text;
    bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kMaxMemberFile &&
              read_all(fd, static_cast<size_t>(kMaxMemberFile), text);
    ::close(fd);
    if (!ok && ::lstat(path.c_str(), &st) != 0) continue;
    MemberInfo m;
    if (!ok || !parse_member(text, id, m)) {
      if (!fresh(st)) {
        CAIRN_LOG_WARN("peers: removing {}: not a member file, and older than the timeout", path);
        remove_stale(path, st);
        warned_.erase(name);
      } else if (warned_.insert(name).second) {
        CAIRN_LOG_WARN("peers: skipping {}: not a member file", path);
      }
      continue;
    }
    bool alive = fresh(st) && (m.host != self_.host || process_alive(m.pid));
    if (!alive) {
      remove_stale(path, st);
      continue;
    }
    live.push_back(std::move(m));
  }
  std::sort(live.begin(), live.end(), [](const MemberInfo& a, const MemberInfo& b) { return a.id < b.id; });
  return live;
}

Status Membership::heartbeat() {
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return Status::OK();  // a member that left stays gone
  if (::utimensat(AT_FDCWD, file_.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0) return Status::OK();
  int err = errno;
  if (err != ENOENT) return errno_status("touching the member file " + file_, err);
  CAIRN_LOG_WARN("peers: {} was removed (taken for a dead member?): writing it again", file_);
  return publish(dir_, file_, self_);
}

void Membership::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return;
  left_ = true;
  if (::unlink(file_.c_str()) != 0 && errno != ENOENT) {
    CAIRN_LOG_WARN("peers: removing the member file {}: {}", file_, errno_status("unlink", errno).message());
  }
}

}  // namespace cairn
