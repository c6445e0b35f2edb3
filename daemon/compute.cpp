#include "daemon/compute.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "core/self_path.hpp"

extern char** environ;

namespace cairn {

using json = nlohmann::json;

namespace {

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

ComputeWorker::ComputeWorker(const Config& config, std::string daemon_socket)
    : enabled_(config.compute.enabled),
      python_config_(config.compute.python),
      listen_config_(config.compute.listen),
      memory_(config.compute.memory),
      cache_(config.compute.cache),
      start_timeout_(parse_duration(config.compute.start_timeout).value_or(std::chrono::seconds(60))),
      daemon_socket_(std::move(daemon_socket)),
      socket_(daemon_socket_ + ".compute") {}

ComputeWorker::~ComputeWorker() { stop(); }

// The interpreter: compute.python, else $CAIRN_PYTHON, else the one cairn was built with while it is
// still there, else python3 from PATH (the same order as `cairn import` of .pt files).
std::string ComputeWorker::python() const {
  if (!python_config_.empty()) return python_config_;
  const char* env = std::getenv("CAIRN_PYTHON");
  if (env && *env) return env;
#ifdef CAIRN_BUILD_PYTHON
  if (::access(CAIRN_BUILD_PYTHON, X_OK) == 0) return CAIRN_BUILD_PYTHON;
#endif
  return "python3";
}

// The cairn Python package: installed beside cairnd (<prefix>/bin/../lib/python3/dist-packages), else
// the package of the source tree cairnd was built from; "" = rely on the interpreter's own path.
std::string ComputeWorker::package_dir() const {
  const std::string dir = executable_dir();
#ifdef CAIRN_INSTALLED_PYTHON_RELDIR
  if (!dir.empty() && is_regular_file(dir + "/" CAIRN_INSTALLED_PYTHON_RELDIR "/cairn/_installed.py"))
    return dir + "/" CAIRN_INSTALLED_PYTHON_RELDIR;
#endif
#ifdef CAIRN_PYTHON_PACKAGE_DIR
  if (is_regular_file(std::string(CAIRN_PYTHON_PACKAGE_DIR) + "/cairn/near_worker.py")) return CAIRN_PYTHON_PACKAGE_DIR;
#endif
  return "";
}

bool ComputeWorker::alive_locked() {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) {
    last_error_ = "the worker (pid " + std::to_string(pid_) + ") " + describe_exit(status);
    CAIRN_LOG_WARN("near-data compute worker: {}; the next request starts a new one", last_error_);
  }
  pid_ = -1;
  listen_.clear();
  return false;
}

Status ComputeWorker::start() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_status("compute worker: pipe", errno);
  const std::string py = python();
  std::vector<std::string> args{
      py,  "-m",       "cairn.near_worker",     "--daemon", daemon_socket_,        "--socket", socket_, "--ready-fd",
      "3", "--memory", std::to_string(memory_), "--cache",  std::to_string(cache_)};
  if (!listen_config_.empty()) {
    args.emplace_back("--listen");
    args.push_back(listen_config_);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // The environment: ours, with the package first on PYTHONPATH, the daemon's socket, and the
  // library this build made when the package is the source tree's.
  std::vector<std::string> env_s;
  const std::string pkg = package_dir();
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    if (kv.rfind("PYTHONPATH=", 0) == 0 || kv.rfind("CAIRN_SOCKET=", 0) == 0) continue;
    env_s.emplace_back(kv);
  }
  const char* pp = std::getenv("PYTHONPATH");
  std::string path = pkg;
  if (pp && *pp) path = path.empty() ? pp : path + ":" + pp;
  if (!path.empty()) env_s.push_back("PYTHONPATH=" + path);
  env_s.push_back("CAIRN_SOCKET=" + daemon_socket_);
#if defined(CAIRN_PYTHON_PACKAGE_DIR) && defined(CAIRN_BUILD_LIBRARY)
  if (pkg == CAIRN_PYTHON_PACKAGE_DIR && !std::getenv("CAIRN_LIBRARY") && is_regular_file(CAIRN_BUILD_LIBRARY))
    env_s.push_back(std::string("CAIRN_LIBRARY=") + CAIRN_BUILD_LIBRARY);
#endif
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 3);  // dup2 clears close-on-exec on fd 3
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, py.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return unavailable("cannot start the near-data compute worker with '" + py + "': " + std::strerror(rc) +
                       " (set compute.python to a Python 3 with PyTorch)");
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++starts_;
  }

  // Wait for its one line: {"socket": ..., "listen": ...}, or for it to exit.
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + start_timeout_;
  bool done = false;
  while (!done) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    char buf[512];
    ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the worker exited or closed the pipe before saying it was ready
    line.append(buf, static_cast<size_t>(got));
    done = line.find('\n') != std::string::npos;
  }
  ::close(fds[0]);
  json ready = done ? json::parse(line.substr(0, line.find('\n')), nullptr, false) : json();
  if (!done || !ready.is_object()) {
    int status = 0;
    std::string why;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      why = describe_exit(status);
    } else {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      why = done ? "sent a malformed ready line" : "was not ready within compute.start_timeout";
    }
    std::lock_guard<std::mutex> lk(mu_);
    last_error_ = "the near-data compute worker ('" + py + " -m cairn.near_worker') " + why +
                  " (its messages are in the daemon's log output)";
    return unavailable(last_error_);
  }
  std::lock_guard<std::mutex> lk(mu_);
  pid_ = pid;
  listen_ = ready.value("listen", std::string());
  last_error_.clear();
  CAIRN_LOG_INFO("near-data compute worker started: pid {}, socket {}{}", pid_, socket_,
                 listen_.empty() ? std::string() : ", listening on " + listen_);
  return Status::OK();
}

Result<json> ComputeWorker::attach() {
  if (!enabled_)
    return unavailable(
        "near-data compute is off in this daemon (set compute.enabled: true in its config, or "
        "CAIRN_COMPUTE_ENABLED=true)");
  std::lock_guard<std::mutex> start_lk(start_mu_);
  bool started = false;
  bool alive;
  {
    std::lock_guard<std::mutex> lk(mu_);
    alive = alive_locked();
  }
  if (!alive) {
    CAIRN_RETURN_IF_ERROR(start());
    started = true;
  }
  std::lock_guard<std::mutex> lk(mu_);
  return json{{"socket", socket_}, {"listen", listen_}, {"pid", pid_}, {"started", started}, {"starts", starts_}};
}

json ComputeWorker::status() {
  std::lock_guard<std::mutex> lk(mu_);
  bool running = alive_locked();
  return json{{"enabled", enabled_},       {"running", running},
              {"pid", running ? pid_ : 0}, {"socket", enabled_ ? socket_ : std::string()},
              {"listen", listen_},         {"starts", starts_},
              {"last_error", last_error_}};
}

void ComputeWorker::stop() {
  std::lock_guard<std::mutex> start_lk(start_mu_);
  std::lock_guard<std::mutex> lk(mu_);
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300; ++i) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace cairn
