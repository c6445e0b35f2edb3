#include "daemon/thread_stacks.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

namespace cairn {
namespace {

constexpr int kMaxFrames = 64;
constexpr auto kAnswerTimeout = std::chrono::seconds(1);

// Shared with the handler: the memory file it writes to (-1: not dumping) and the last thread that
// finished writing.
std::atomic<int> g_fd{-1};
std::atomic<pid_t> g_done{0};

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void on_dump_signal(int) {
  const int saved = errno;
  const int fd = g_fd.load();
  if (fd >= 0) {
    void* frames[kMaxFrames];
    const int n = ::backtrace(frames, kMaxFrames);
    // Frame 0 is this handler and frame 1 the signal trampoline: the thread's own frames follow.
    if (n > 2) ::backtrace_symbols_fd(frames + 2, n - 2, fd);
  }
  g_done.store(this_tid());
  errno = saved;
}

int dump_signal() { return SIGRTMIN + 5; }

// Installs the handler once; false (with why) when the signal belongs to someone else.
bool install(std::string* why) {
  static std::once_flag once;
  static bool ok = false;
  static std::string reason;
  std::call_once(once, [] {
    void* warm[2];
    (void)::backtrace(warm, 2);  // loads the unwinder now: the handler must not allocate
    struct sigaction old {};
    ::sigaction(dump_signal(), nullptr, &old);
    if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
      reason = "signal SIGRTMIN+5 already has a handler in this process";
      return;
    }
    struct sigaction sa {};
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (::sigaction(dump_signal(), &sa, nullptr) != 0) {
      reason = std::string("installing the SIGRTMIN+5 handler: ") + std::strerror(errno);
      return;
    }
    ok = true;
  });
  if (!ok) *why = reason;
  return ok;
}

std::vector<pid_t> thread_ids() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long tid = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && tid > 0) out.push_back(static_cast<pid_t>(tid));
  }
  ::closedir(d);
  return out;
}

std::string thread_name(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "?" : name;
}

std::string read_all(int fd) {
  std::string out;
  char buf[8192];
  if (::lseek(fd, 0, SEEK_SET) != 0) return out;
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// "binary(_ZN5cairn3fooEv+0x1a) [0x55d0]" -> "binary(cairn::foo()+0x1a) [0x55d0]".
std::string demangle_line(const std::string& line) {
  const size_t open = line.find('(');
  const size_t plus = line.find('+', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || plus == std::string::npos || plus == open + 1) return line;
  const std::string mangled = line.substr(open + 1, plus - open - 1);
  int status = 0;
  char* name = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || name == nullptr) return line;
  std::string out = line.substr(0, open + 1) + name + line.substr(plus);
  std::free(name);
  return out;
}

std::string demangle(const std::string& text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    out += "    " + demangle_line(text.substr(pos, nl - pos)) + "\n";
    pos = nl + 1;
  }
  return out;
}

}  // namespace

std::string dump_thread_stacks() {
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::string why;
  if (!install(&why)) return "thread stacks unavailable: " + why + "\n";
  static const int fd = ::memfd_create("cairn-stacks", MFD_CLOEXEC);  // kept for the process's life
  if (fd < 0) return std::string("thread stacks unavailable: memfd_create: ") + std::strerror(errno) + "\n";
  const pid_t self = this_tid();
  const pid_t pid = ::getpid();
  std::string out;
  for (pid_t tid : thread_ids()) {
    const std::string name = thread_name(tid);
    const std::string head = "thread " + std::to_string(tid) + " (" + name + "):\n";
    if (tid == self) {
      out += head + "    (this thread: the caller)\n";
      continue;
    }
    if (name.rfind("iou-", 0) == 0) {  // io_uring's workers run in the kernel and take no signals
      out += head + "    (an io_uring kernel worker: no user-space stack)\n";
      continue;
    }
    if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) != 0) break;
    g_done.store(0);
    g_fd.store(fd);
    if (::syscall(SYS_tgkill, pid, tid, dump_signal()) != 0) {
      g_fd.store(-1);
      continue;  // gone meanwhile
    }
    const auto deadline = std::chrono::steady_clock::now() + kAnswerTimeout;
    while (g_done.load() != tid && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    const bool answered = g_done.load() == tid;
    // A late answer writes nothing: the handler reads the descriptor first.
    g_fd.store(-1);
    out += head;
    out +=
        answered ? demangle(read_all(fd)) : "    (did not answer within 1 s: stopped or in an uninterruptible wait)\n";
  }
  (void)::ftruncate(fd, 0);
  return out;
}

}  // namespace cairn
