// How the processes that share a repository coordinate, through files alone (no server, no
// network): which writers are alive, who is publishing a model id, and who may run maintenance.
// docs/repository-format.md ("Many daemons") gives the protocol and what each guarantee rests on.
//
//   writers/<wid>        one per live writer (a Repository handle that has written): "pid P host H".
//                        Its owner holds an exclusive flock on it while it lives, so the kernel (or
//                        the filesystem's lock manager) tells others at once when it dies. Where
//                        flock is not supported, the owner touches the file's mtime at every refresh
//                        and it counts as dead once the mtime is kDeadAfter old.
//   claims/<idhash>      a model id being published (O_EXCL create): the holder's wid. Removed once
//                        the model's record is durable or the commit failed; a dead holder's claim
//                        is broken by the next claimant.
//   maintenance.lease    held (O_EXCL create, the holder's wid) by the one process running gc,
//                        compaction or migration; a dead holder's lease is broken by the next taker.
//
// Owns the writer file's descriptor and the set of claims this process holds. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "tiers/pfs/repo_files.hpp"

namespace cairn::pfs {

inline constexpr const char* kWritersDir = "writers";
inline constexpr const char* kClaimsDir = "claims";
inline constexpr const char* kLeaseFile = "maintenance.lease";
// Without flock, a writer whose file was not touched for this long counts as dead.
inline constexpr std::chrono::seconds kDeadAfter{60};

class Coordination {
 public:
  explicit Coordination(std::string repo_dir);
  ~Coordination();
  Coordination(const Coordination&) = delete;
  Coordination& operator=(const Coordination&) = delete;

  // This process's writer id: "w" and 16 random hex digits, fixed at construction.
  const std::string& wid() const { return wid_; }

  // Creates and locks writers/<wid> (once; later calls do nothing).
  Status register_writer();
  // Removes writers/<wid> (a clean exit).
  void unregister();
  bool registered() const;
  // Touches writers/<wid> (the liveness signal where flock does not work).
  void heartbeat();
  // Whether the writer is alive. Our own id is alive while registered.
  bool alive(const std::string& wid) const;
  // The writer ids registered under writers/ (alive or not).
  std::vector<std::string> registered_writers() const;
  // Removes writers/<wid> of a dead writer (compaction does, once its files are gone).
  void forget_dead(const std::string& wid);

  // Claims id for publishing. kExists when another live writer is publishing it (the message names
  // it) or when this process holds the claim already.
  Status claim(const std::string& id);
  // Drops this process's claim (missing is fine).
  void release(const std::string& id);
  bool holds(const std::string& id) const;

  // Takes the maintenance lease, waiting up to `wait` for a live holder to finish. kBusy names the
  // holder when it does not.
  Status take_lease(const std::string& what, std::chrono::milliseconds wait);
  void release_lease();

 private:
  std::string claim_path(const std::string& id) const;
  // Creates path with O_EXCL holding our wid. OK; kExists with *holder set; other errors.
  Status create_exclusive(const std::string& path, std::string* holder);
  // Breaks path if it still names dead_holder (rename away, check, delete). True when it is gone.
  bool break_stale(const std::string& path, const std::string& dead_holder);

  std::string dir_;
  std::string wid_;
  mutable std::mutex mu_;
  UniqueFd writer_fd_;
  bool registered_ = false;
  bool flock_works_ = true;
  std::chrono::steady_clock::time_point last_heartbeat_{};
  std::set<std::string> claims_;  // ids this process holds
  bool lease_held_ = false;
};

}  // namespace cairn::pfs
