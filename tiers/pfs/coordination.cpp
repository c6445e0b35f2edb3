// Writers, claims and the maintenance lease (coordination.hpp). POSIX only: these files are tiny
// and their semantics (O_EXCL, rename, flock) are what the protocol rests on, so they do not go
// through the FileSystem seam.
#include "tiers/pfs/coordination.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <thread>

#include "core/hash.hpp"
#include "core/log.hpp"

namespace cairn::pfs {
namespace {

std::string random_wid() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(::getpid()) << 17;
  v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[20];
  std::snprintf(buf, sizeof buf, "w%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string read_text(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  char buf[256];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return {};
  std::string s(buf, static_cast<size_t>(n));
  size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

bool valid_wid(const std::string& w) {
  if (w.size() != 17 || w[0] != 'w') return false;
  for (size_t i = 1; i < w.size(); ++i)
    if (!((w[i] >= '0' && w[i] <= '9') || (w[i] >= 'a' && w[i] <= 'f'))) return false;
  return true;
}

Status ensure_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("creating directory " + path, errno);
  return Status::ok();
}

}  // namespace

Coordination::Coordination(std::string repo_dir) : dir_(std::move(repo_dir)), wid_(random_wid()) {}

Coordination::~Coordination() {
  std::set<std::string> held;
  {
    std::lock_guard lock(mu_);
    held = claims_;
  }
  for (const std::string& id : held) release(id);
  release_lease();
  unregister();
}

Status Coordination::register_writer() {
  std::lock_guard lock(mu_);
  if (registered_) return Status::ok();
  std::string wdir = join_path(dir_, kWritersDir);
  CAIRN_RETURN_IF_ERROR(ensure_dir(wdir));
  std::string path = join_path(wdir, wid_);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return errno_status("registering writer " + path, errno);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string text = "pid " + std::to_string(::getpid()) + " host " + host + "\n";
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return errno_status("writing " + path, errno);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      flock_works_ = false;  // liveness by heartbeat (kDeadAfter) instead
      break;
    }
    return errno_status("locking " + path, errno);
  }
  writer_fd_ = std::move(fd);
  registered_ = true;
  last_heartbeat_ = std::chrono::steady_clock::now();
  return Status::ok();
}

void Coordination::unregister() {
  std::lock_guard lock(mu_);
  if (!registered_) return;
  ::unlink(join_path(join_path(dir_, kWritersDir), wid_).c_str());
  writer_fd_.reset();
  registered_ = false;
}

bool Coordination::registered() const {
  std::lock_guard lock(mu_);
  return registered_;
}

void Coordination::heartbeat() {
  std::lock_guard lock(mu_);
  if (!registered_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_heartbeat_ < kDeadAfter / 6) return;
  ::futimens(writer_fd_.get(), nullptr);
  last_heartbeat_ = now;
}

bool Coordination::alive(const std::string& wid) const {
  {
    std::lock_guard lock(mu_);
    if (wid == wid_) return registered_;
  }
  if (!valid_wid(wid)) return false;
  std::string path = join_path(join_path(dir_, kWritersDir), wid);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;  // gone: it exited cleanly (or was forgotten as dead)
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return false;  // nobody holds it
  if (errno == EWOULDBLOCK) return true;
  // No flock here: the heartbeat decides.
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return true;
  auto age = std::chrono::system_clock::now().time_since_epoch() -
             (std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec));
  return age < kDeadAfter;
}

std::vector<std::string> Coordination::registered_writers() const {
  std::vector<std::string> names, out;
  (void)list_dir(join_path(dir_, kWritersDir), &names, nullptr);
  for (std::string& n : names)
    if (valid_wid(n)) out.push_back(std::move(n));
  return out;
}

void Coordination::forget_dead(const std::string& wid) {
  if (!valid_wid(wid) || wid == wid_ || alive(wid)) return;
  ::unlink(join_path(join_path(dir_, kWritersDir), wid).c_str());
}

std::string Coordination::claim_path(const std::string& id) const {
  return join_path(join_path(dir_, kClaimsDir), hash_bytes(id.data(), id.size()).hex());
}

Status Coordination::create_exclusive(const std::string& path, std::string* holder) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    int err = errno;
    if (err == EEXIST) {
      *holder = read_text(path);
      return already_exists(path + " is held by " + (holder->empty() ? std::string("another writer") : *holder));
    }
    return errno_status("creating " + path, err);
  }
  std::string text = wid_ + "\n";
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    int err = errno;
    ::unlink(path.c_str());
    return errno_status("writing " + path, err);
  }
  return Status::ok();
}

bool Coordination::break_stale(const std::string& path, const std::string& dead_holder) {
  std::string aside = path + ".tmp-break-" + wid_;
  if (::rename(path.c_str(), aside.c_str()) != 0) return errno == ENOENT;  // someone else broke it
  std::string now = read_text(aside);
  if (now == dead_holder || now.empty()) {
    ::unlink(aside.c_str());
    CAIRN_LOG_WARN("broke {} left by writer {}, which is gone", path, dead_holder.empty() ? "?" : dead_holder);
    return true;
  }
  // A live holder took it in between: put it back (link fails if yet another one exists).
  (void)::link(aside.c_str(), path.c_str());
  ::unlink(aside.c_str());
  return false;
}

Status Coordination::claim(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (claims_.count(id)) return already_exists("model '" + id + "' is being committed by this daemon already");
  }
  CAIRN_RETURN_IF_ERROR(register_writer());
  std::string cdir = join_path(dir_, kClaimsDir);
  CAIRN_RETURN_IF_ERROR(ensure_dir(cdir));
  std::string path = claim_path(id);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::string holder;
    Status s = create_exclusive(path, &holder);
    if (s.is_ok()) {
      std::lock_guard lock(mu_);
      claims_.insert(id);
      return Status::ok();
    }
    if (s.code() != StatusCode::kExists) return s;
    if (holder == wid_) {
      // Ours, left by a commit of this process that failed after the claim: take it over.
      std::lock_guard lock(mu_);
      claims_.insert(id);
      return Status::ok();
    }
    if (alive(holder))
      return already_exists("model '" + id + "' is being committed by another daemon of this repository (writer " +
                            holder + "); model ids are unique across the repository");
    break_stale(path, holder);
  }
  return already_exists("model '" + id + "': its claim file " + path + " keeps being taken by other daemons");
}

void Coordination::release(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (!claims_.erase(id)) return;
  }
  ::unlink(claim_path(id).c_str());
}

bool Coordination::holds(const std::string& id) const {
  std::lock_guard lock(mu_);
  return claims_.count(id) != 0;
}

Status Coordination::take_lease(const std::string& what, std::chrono::milliseconds wait) {
  CAIRN_RETURN_IF_ERROR(register_writer());
  std::string path = join_path(dir_, kLeaseFile);
  auto deadline = std::chrono::steady_clock::now() + wait;
  std::string holder;
  for (;;) {
    Status s = create_exclusive(path, &holder);
    if (s.is_ok()) {
      std::lock_guard lock(mu_);
      lease_held_ = true;
      return Status::ok();
    }
    if (s.code() != StatusCode::kExists) return s.with_context(what);
    if (holder == wid_) return busy(what + ": this process is running maintenance on the repository already");
    if (!alive(holder)) {
      break_stale(path, holder);
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return busy(what + ": writer " + holder + " is running maintenance (gc, compaction or migration) on " + dir_ +
                  "; retry when it is done");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Coordination::release_lease() {
  {
    std::lock_guard lock(mu_);
    if (!lease_held_) return;
    lease_held_ = false;
  }
  ::unlink(join_path(dir_, kLeaseFile).c_str());
}

}  // namespace cairn::pfs
