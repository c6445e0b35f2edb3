// The stack of every thread of this process, as text, without a debugger: what the request
// watchdog (watchdog.hpp) writes to the log when a request is stuck.
//
// How: each thread (from /proc/self/task) is sent a dedicated real-time signal (SIGRTMIN + 5) with
// tgkill, one at a time; its handler writes backtrace_symbols_fd() into a memory file that the
// caller then reads and demangles. The handler only calls backtrace() (preloaded before the first
// signal, so it does not allocate), backtrace_symbols_fd() and write(): async-signal-safe in
// practice on glibc. A thread that does not answer within 1 s (stopped, or in an uninterruptible
// sleep) is listed without its stack. The signal is installed with SA_RESTART, but a blocking call
// that the kernel never restarts (epoll_wait, nanosleep, a receive with a timeout) returns EINTR
// in the signalled thread: callers of those already retry on EINTR.
//
// Function names need the executable's symbols exported (cairnd links with -rdynamic); otherwise
// frames read binary(+offset), which addr2line resolves.
//
// Thread-safety: may be called from any thread; calls are serialized. Never from a signal handler.
#pragma once

#include <string>

namespace cairn {

// One block per thread: "thread TID (NAME):" and its frames, innermost first. The calling thread
// is listed as "(this thread: the caller)" and io_uring's kernel workers (iou-wrk-*, iou-sqp-*) as
// such, without a stack. If the signal is in use by someone else, says so instead.
std::string dump_thread_stacks();

}  // namespace cairn
