// Writers, claims and the maintenance lease (coordination.hpp). POSIX only: these files are tiny
// and their semantics (O_EXCL, rename, flock) are what the protocol rests on, so they do not go
// through the FileSystem seam.
#include "tiers/pfs/coordination.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
  return Status::OK();
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
  if (registered_) return Status::OK();
  std::string wdir = join_path(dir_, kWritersDir);
  CAIRN_RETURN_IF_ERROR(ensure_dir(wdir));
  // Written and locked under a temporary name, then renamed into place (the lock stays with the
  // inode): nobody ever sees writers/<wid> unlocked while we live.
  std::string path = join_path(wdir, wid_);
  std::string tmp = join_path(wdir, std::string(kTmpPrefix) + wid_);
  UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return errno_status("registering writer " + path, errno);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string text = "pid " + std::to_string(::getpid()) + " host " + host + "\n";
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_status("writing " + path, err);
  }
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      flock_works_ = false;  // liveness by heartbeat (kDeadAfter) instead
      break;
    }
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_status("locking " + path, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_status("registering writer " + path, err);
  }
  writer_fd_ = std::move(fd);
  registered_ = true;
  last_heartbeat_ = std::chrono::steady_clock::now();
  return Status::OK();
}

void Coordination::unregister() {
  std::lock_guard lock(mu_);
  if (!registered_) return;
  // A clean exit: our claims are void from now on (what we committed is in the repository).
  if (intents_fd_.valid()) {
    ::unlink(join_path(join_path(dir_, kClaimsDir), wid_ + ".intents").c_str());
    intents_fd_.reset();
  }
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
  if (!fd.valid()) return false;                                // gone: it exited cleanly (or was forgotten as dead)
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
  ::unlink(join_path(join_path(dir_, kClaimsDir), wid + ".intents").c_str());
  ::unlink(join_path(join_path(dir_, kWritersDir), wid).c_str());
}

Status Coordination::write_intent(char sign, const std::string& id) {
  std::lock_guard lock(mu_);
  if (!intents_fd_.valid()) {
    std::string path = join_path(join_path(dir_, kClaimsDir), wid_ + ".intents");
    intents_fd_ = UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!intents_fd_.valid()) return errno_status("opening " + path, errno);
  }
  char head[24];
  int n = std::snprintf(head, sizeof head, "%c%zx:", sign, id.size());
  std::string entry(head, static_cast<size_t>(n));
  entry += id;
  entry += '\n';
  // One write() with O_APPEND: the entry lands whole, after every earlier one.
  ssize_t w = ::write(intents_fd_.get(), entry.data(), entry.size());
  if (w != static_cast<ssize_t>(entry.size())) return errno_status("writing the intents of writer " + wid_, errno);
  return Status::OK();
}

void Coordination::read_intents() {
  std::lock_guard lock(read_mu_);
  std::string cdir = join_path(dir_, kClaimsDir);
  const std::vector<std::string>& names = claims_listing_.get(cdir);
  for (const std::string& name : names) {
    if (name.size() != 17 + 8 || name.compare(17, 8, ".intents") != 0) continue;
    std::string w = name.substr(0, 17);
    if (w == wid_ || !valid_wid(w)) continue;
    Intents& in = others_[w];
    if (!in.fd.valid()) {
      in.fd = UniqueFd(::open(join_path(cdir, name).c_str(), O_RDONLY | O_CLOEXEC));
      if (!in.fd.valid()) continue;
    }
    struct stat st {};
    if (::fstat(in.fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) <= in.read_to) continue;
    std::string buf(static_cast<size_t>(st.st_size) - in.read_to, '\0');
    size_t got = 0;
    if (!pread_all(in.fd.get(), buf.data(), buf.size(), in.read_to, name, &got).ok()) continue;
    buf.resize(got);
    uint64_t base = in.read_to - in.partial.size();
    std::string text = in.partial + buf;
    in.read_to += got;
    size_t pos = 0;
    for (;;) {
      // "<sign><hex length>:<id>\n"
      size_t colon = text.find(':', pos);
      if (colon == std::string::npos || colon == pos) break;
      char sign = text[pos];
      uint64_t len = 0;
      bool ok = sign == '+' || sign == '-';
      for (size_t k = pos + 1; ok && k < colon; ++k) {
        char c = text[k];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        ok = d >= 0 && len < (1ull << 32);
        len = len << 4 | static_cast<uint64_t>(d < 0 ? 0 : d);
      }
      if (!ok) {  // garbage: nothing after it can be trusted; stop reading this file
        pos = text.size();
        in.read_to = UINT64_MAX / 2;
        break;
      }
      if (colon + 1 + len + 1 > text.size()) break;  // cut by the end of the file: wait for the rest
      std::string id = text.substr(colon + 1, len);
      if (sign == '+')
        in.pending[id] = base + pos;
      else
        in.pending.erase(id);
      pos = colon + 1 + len + 1;
    }
    in.partial = text.substr(std::min(pos, text.size()));
  }
}

bool Coordination::rival(const std::string& id, std::string* wid, uint64_t* offset) {
  std::vector<std::pair<std::string, uint64_t>> holders;
  {
    std::lock_guard lock(read_mu_);
    for (const auto& [w, in] : others_) {
      auto it = in.pending.find(id);
      if (it != in.pending.end()) holders.emplace_back(w, it->second);
    }
  }
  for (const auto& [w, off] : holders)
    if (alive(w)) {
      *wid = w;
      *offset = off;
      return true;
    }
  return false;
}

Status Coordination::claim(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (claims_.count(id)) return already_exists("model '" + id + "' is being committed by this daemon already");
  }
  CAIRN_RETURN_IF_ERROR(register_writer());
  std::string cdir = join_path(dir_, kClaimsDir);
  if (!intents_fd_.valid()) CAIRN_RETURN_IF_ERROR(ensure_dir(cdir));
  std::string seen_wid;
  uint64_t seen_offset = 0;
  thread_local std::minstd_rand jitter(static_cast<unsigned>(std::random_device{}()));
  for (int attempt = 0; attempt < 50; ++attempt) {
    CAIRN_RETURN_IF_ERROR(write_intent('+', id));
    read_intents();
    std::string w;
    uint64_t off = 0;
    if (!rival(id, &w, &off)) {
      std::lock_guard lock(mu_);
      claims_.insert(id);
      return Status::OK();
    }
    CAIRN_RETURN_IF_ERROR(write_intent('-', id));
    // The same claim of the same rival still standing after we stood back: it won.
    if (attempt > 0 && w == seen_wid && off == seen_offset)
      return already_exists("model '" + id + "' is being committed by another daemon of this repository (writer " + w +
                            "); model ids are unique across the repository");
    seen_wid = w;
    seen_offset = off;
    std::this_thread::sleep_for(std::chrono::microseconds(200 + jitter() % 2000));
  }
  return already_exists("model '" + id + "': other daemons keep claiming it at the same moment");
}

void Coordination::release(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (!claims_.erase(id)) return;
  }
  (void)write_intent('-', id);
}

bool Coordination::holds(const std::string& id) const {
  std::lock_guard lock(mu_);
  return claims_.count(id) != 0;
}

void Coordination::settle(const std::string& id) {
  std::lock_guard lock(mu_);
  claims_.erase(id);  // the repository holds the id now; the claim may stand
}

Status Coordination::create_exclusive(const std::string& path, std::string* holder) {
  // Written whole under a temporary name, then linked into place (link fails if the name exists):
  // nobody ever sees the file without its holder in it. The temporary name is this call's own: two
  // threads of one writer (two clients' gc at once, a gc and a compaction) must not share it, or
  // one's unlink makes the other's link fail with ENOENT (the torture harness found this).
  static std::atomic<uint64_t> calls{0};
  std::string tmp = path + ".tmp-" + wid_ + "-" + std::to_string(calls.fetch_add(1));
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return errno_status("creating " + tmp, errno);
    std::string text = wid_ + "\n";
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      int err = errno;
      ::unlink(tmp.c_str());
      return errno_status("writing " + tmp, err);
    }
  }
  int rc = ::link(tmp.c_str(), path.c_str());
  int err = errno;
  ::unlink(tmp.c_str());
  if (rc == 0) return Status::OK();
  if (err == EEXIST) {
    *holder = read_text(path);
    return already_exists(path + " is held by " + (holder->empty() ? std::string("another writer") : *holder));
  }
  return errno_status("creating " + path, err);
}

bool Coordination::break_stale(const std::string& path, const std::string& dead_holder) {
  std::string aside = path + ".tmp-break-" + wid_;
  if (::rename(path.c_str(), aside.c_str()) != 0) return errno == ENOENT;  // someone else broke it
  std::string now = read_text(aside);
  if (now == dead_holder) {
    ::unlink(aside.c_str());
    CAIRN_LOG_WARN("broke {} left by writer {}, which is gone", path, dead_holder.empty() ? "?" : dead_holder);
    return true;
  }
  // A live holder took it in between: put it back (link fails if yet another one exists).
  (void)::link(aside.c_str(), path.c_str());
  ::unlink(aside.c_str());
  return false;
}

Status Coordination::take_lease(const std::string& what, std::chrono::milliseconds wait) {
  CAIRN_RETURN_IF_ERROR(register_writer());
  std::string path = join_path(dir_, kLeaseFile);
  auto deadline = std::chrono::steady_clock::now() + wait;
  std::string holder;
  for (;;) {
    Status s = create_exclusive(path, &holder);
    if (s.ok()) {
      std::lock_guard lock(mu_);
      lease_held_ = true;
      return Status::OK();
    }
    if (s.code() != StatusCode::kExists) return s.with_context(what);
    if (holder == wid_) return busy(what + ": this process is running maintenance on the repository already");
    if (!holder.empty() && !alive(holder)) {
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
