// Locks that clang's thread-safety analysis can check (-Wthread-safety; the clang build turns it on
// and makes its findings errors). A member is declared with the lock that guards it:
//
//   cairn::Mutex mu_;
//   cairn::CondVar cv_;
//   std::deque<Job> queue_ CAIRN_GUARDED_BY(mu_);
//
//   void push(Job j) {
//     cairn::MutexLock lock(mu_);
//     queue_.push_back(std::move(j));
//   }
//   Job pop() {
//     cairn::MutexLock lock(mu_);
//     cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return !queue_.empty(); });
//     ...
//   }
//
// A function that expects its caller to hold a lock says so with CAIRN_REQUIRES(mu_) (the analysis
// then checks every caller); a predicate handed to CondVar::wait is such a function. The types
// are thin wrappers of the standard ones and cost nothing more; under GCC the annotations are empty.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define CAIRN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CAIRN_THREAD_ANNOTATION(x)
#endif

// A type that is a lock.
#define CAIRN_CAPABILITY(name) CAIRN_THREAD_ANNOTATION(capability(name))
// A type whose objects hold a lock for their lifetime (MutexLock).
#define CAIRN_SCOPED_CAPABILITY CAIRN_THREAD_ANNOTATION(scoped_lockable)
// A member read and written only with the given lock held.
#define CAIRN_GUARDED_BY(lock) CAIRN_THREAD_ANNOTATION(guarded_by(lock))
// A pointer member whose pointee is read and written only with the given lock held.
#define CAIRN_PT_GUARDED_BY(lock) CAIRN_THREAD_ANNOTATION(pt_guarded_by(lock))
// A function called with the given locks held (exclusively, or at least shared).
#define CAIRN_REQUIRES(...) CAIRN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define CAIRN_REQUIRES_SHARED(...) CAIRN_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// A function called without the given locks held (it takes them itself).
#define CAIRN_EXCLUDES(...) CAIRN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define CAIRN_ACQUIRE(...) CAIRN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define CAIRN_ACQUIRE_SHARED(...) CAIRN_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define CAIRN_RELEASE(...) CAIRN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define CAIRN_RELEASE_SHARED(...) CAIRN_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define CAIRN_RELEASE_GENERIC(...) CAIRN_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define CAIRN_TRY_ACQUIRE(...) CAIRN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define CAIRN_RETURN_CAPABILITY(lock) CAIRN_THREAD_ANNOTATION(lock_returned(lock))
// Opts one function out of the analysis; each use says why in a comment.
#define CAIRN_NO_THREAD_SAFETY_ANALYSIS CAIRN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace cairn {

class CondVar;
class MutexLock;

// std::mutex, as a lock the analysis knows.
class CAIRN_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() CAIRN_ACQUIRE() { mu_.lock(); }
  void unlock() CAIRN_RELEASE() { mu_.unlock(); }
  bool try_lock() CAIRN_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction; unlock() and lock() let a scope drop it for a
// while (to call out, or to sleep) and take it again. The lock a CondVar waits with.
class CAIRN_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) CAIRN_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() CAIRN_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() CAIRN_ACQUIRE() { lock_.lock(); }
  void unlock() CAIRN_RELEASE() { lock_.unlock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// std::condition_variable for a MutexLock. The predicates run with the lock held: declare them
// CAIRN_REQUIRES(the mutex) when they read guarded members.
class CondVar {
 public:
  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

  // The analysis cannot follow the lock into the standard library's wait: these bodies are outside
  // it, and the predicates' own annotations say what they need.
  void wait(MutexLock& lock) CAIRN_NO_THREAD_SAFETY_ANALYSIS { cv_.wait(lock.lock_); }
  template <class Pred>
  void wait(MutexLock& lock, Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    cv_.wait(lock.lock_, std::move(pred));
  }
  template <class Rep, class Period>
  std::cv_status wait_for(MutexLock& lock,
                          const std::chrono::duration<Rep, Period>& d) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(lock.lock_, d);
  }
  template <class Rep, class Period, class Pred>
  bool wait_for(MutexLock& lock, const std::chrono::duration<Rep, Period>& d,
                Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(lock.lock_, d, std::move(pred));
  }
  template <class Clock, class Duration>
  std::cv_status wait_until(MutexLock& lock,
                            const std::chrono::time_point<Clock, Duration>& t) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_until(lock.lock_, t);
  }
  template <class Clock, class Duration, class Pred>
  bool wait_until(MutexLock& lock, const std::chrono::time_point<Clock, Duration>& t,
                  Pred pred) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_until(lock.lock_, t, std::move(pred));
  }

 private:
  std::condition_variable cv_;
};

// std::shared_mutex, as a lock the analysis knows: many readers or one writer.
class CAIRN_CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() CAIRN_ACQUIRE() { mu_.lock(); }
  void unlock() CAIRN_RELEASE() { mu_.unlock(); }
  void lock_shared() CAIRN_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() CAIRN_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusively for a scope. Made with std::defer_lock it starts unheld, and
// lock() takes it later; the destructor releases it if it is held.
class CAIRN_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) CAIRN_ACQUIRE(mu) : mu_(mu) { lock(); }
  WriterLock(SharedMutex& mu, std::defer_lock_t) CAIRN_EXCLUDES(mu) : mu_(mu) {}
  ~WriterLock() CAIRN_RELEASE() {
    if (held_) mu_.unlock();
  }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

  void lock() CAIRN_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }
  void unlock() CAIRN_RELEASE() {
    held_ = false;
    mu_.unlock();
  }

 private:
  SharedMutex& mu_;
  bool held_ = false;
};

// Holds a SharedMutex shared for a scope, or until unlock().
class CAIRN_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) CAIRN_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ~ReaderLock() CAIRN_RELEASE() {
    if (held_) mu_.unlock_shared();
  }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

  // Releases it before the scope ends (once).
  void unlock() CAIRN_RELEASE() {
    held_ = false;
    mu_.unlock_shared();
  }

 private:
  SharedMutex& mu_;
  bool held_ = true;
};

}  // namespace cairn
