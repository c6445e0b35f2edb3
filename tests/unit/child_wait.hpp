// Waiting for a child process in a test without hanging the test run: a forked copy of a
// multi-threaded test binary that blocks (on a lock another thread held at the fork) is killed at a
// deadline, and the test fails saying so, instead of the whole binary waiting until ctest's timeout.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>

namespace cairn::testing {

// Reaps child `pid` and returns its wait status; after `timeout` kills it with SIGKILL, reaps it and
// fails the test.
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    REQUIRE(r >= 0);
    if (r == pid) return status;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("child process " << pid << " did not end within " << timeout.count() << " ms; killed");
    }
    ::usleep(2000);
  }
}

}  // namespace cairn::testing
