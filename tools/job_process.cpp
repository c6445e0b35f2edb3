#include "tools/job_process.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace cairn::tool {

using Clock = std::chrono::steady_clock;

std::string parent_of(const std::string& dir) {
  auto slash = dir.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : dir.substr(0, slash);
}

bool is_root() { return ::geteuid() == 0; }

Result<User> lookup_user(const std::string& name) {
  struct passwd pw {
  }, *out = nullptr;
  std::vector<char> buf(16384);
  int rc = name.empty() ? ::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &out)
                        : ::getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &out);
  if (rc != 0 || !out)
    return not_found("user '" + (name.empty() ? std::to_string(::getuid()) : name) + "' is unknown on this node");
  return User{pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir ? pw.pw_dir : "/", pw.pw_shell ? pw.pw_shell : "/bin/sh"};
}

Status make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0 || errno == EEXIST) return Status::OK();
  return errno_status("cannot create '" + path + "'", errno);
}

Status make_dirs(const std::string& path, mode_t mode) {
  if (path.empty() || path == "/") return Status::OK();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return invalid_argument("'" + path + "' exists and is not a directory");
    return Status::OK();
  }
  if (auto s = make_dirs(parent_of(path), mode); !s.ok()) return s;
  return make_dir(path, mode);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_lines(const std::string& path, size_t n) {
  std::string text = read_text(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  size_t pos = text.size();
  for (size_t i = 0; i < n && pos != std::string::npos && pos > 0; ++i) pos = text.rfind('\n', pos - 1);
  std::string tail = pos == std::string::npos ? text : text.substr(pos + 1);
  for (auto& ch : tail)
    if (ch == '\n') ch = ' ';
  return tail.empty() ? "(the log is empty)" : tail;
}

bool socket_answers(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) {
    ::close(fd);
    return false;
  }
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

pid_t read_pidfile(const std::string& path) {
  std::string t = read_text(path);
  long v = std::strtol(t.c_str(), nullptr, 10);
  return v > 1 ? static_cast<pid_t>(v) : 0;
}

Status write_pidfile(const std::string& path, pid_t pid) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return errno_status("cannot write pidfile '" + tmp + "'", errno);
  std::string text = std::to_string(pid) + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0)
    return errno_status("cannot write pidfile '" + path + "'", errno);
  return Status::OK();
}

bool is_our_daemon(pid_t pid, uid_t uid) {
  std::string proc = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (::stat(proc.c_str(), &st) != 0 || st.st_uid != uid) return false;
  std::string stat_text = read_text(proc + "/stat");
  auto close_paren = stat_text.rfind(')');
  if (close_paren != std::string::npos && close_paren + 2 < stat_text.size() && stat_text[close_paren + 2] == 'Z')
    return false;
  char buf[4096];
  ssize_t n = ::readlink((proc + "/exe").c_str(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  std::string exe(buf, static_cast<size_t>(n));
  auto slash = exe.rfind('/');
  std::string base = slash == std::string::npos ? exe : exe.substr(slash + 1);
  return base.rfind("cairnd", 0) == 0;
}

bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::string stat_text = read_text("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat_text.rfind(')');
  return !(close_paren != std::string::npos && close_paren + 2 < stat_text.size() && stat_text[close_paren + 2] == 'Z');
}

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
}  // namespace

void remove_tree(const std::string& dir) { ::nftw(dir.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

Status drop_privileges(const User& u) {
  if (!is_root()) return Status::OK();
  if (u.uid == 0) return permission_denied("refusing to run as root");
  if (::initgroups(u.name.c_str(), u.gid) != 0) return errno_status("initgroups", errno);
  if (::setgid(u.gid) != 0) return errno_status("setgid", errno);
  if (::setuid(u.uid) != 0) return errno_status("setuid", errno);
  if (::getuid() != u.uid || ::geteuid() != u.uid) return permission_denied("could not drop root privileges");
  return Status::OK();
}

AsUser run_as_daemon_user(const User& u, const std::string& socket, double timeout_s,
                          const std::function<bool(v1::Client&, std::string&)>& work) {
  AsUser r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.finished = true;
    r.out = "pipe: " + std::string(std::strerror(errno));
    return r;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    r.finished = true;
    r.out = "fork: " + std::string(std::strerror(errno));
    return r;
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    bool ok = false;
    if (auto s = drop_privileges(u); !s.ok()) {
      out = s.to_string();
    } else if (auto c = connect(socket); !c.ok()) {
      out = c.status().to_string();
    } else {
      ok = work(*c, out);
    }
    for (size_t done = 0; done < out.size();) {
      ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) {
        ok = false;
        break;
      }
      done += static_cast<size_t>(n);
    }
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  bool eof = false;
  while (!eof && Clock::now() < deadline) {
    struct pollfd pfd {
      fds[0], POLLIN, 0
    };
    if (::poll(&pfd, 1, 50) <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0)
      r.out.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR)
      eof = true;
  }
  ::close(fds[0]);
  int status = 0;
  while (Clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      r.finished = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!r.finished) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return r;
  }
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return r;
}

void remove_tree_as(const User& u, const std::string& dir) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (!drop_privileges(u).ok()) ::_exit(1);
    remove_tree(dir);
    ::_exit(0);
  }
  if (pid > 0) ::waitpid(pid, nullptr, 0);
}

}  // namespace cairn::tool
