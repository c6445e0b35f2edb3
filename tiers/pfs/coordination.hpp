// How the processes that share a repository coordinate, through files alone (no server, no
// network): which writers are alive, who is publishing a model id, and who may run maintenance.
// docs/repository-format.md ("Many daemons") gives the protocol and what each guarantee rests on.
//
//   writers/<wid>        one per live writer (a Repository handle that has written): "pid P host H".
//                        Its owner holds an exclusive flock on it while it lives, so the kernel (or
//                        the filesystem's lock manager) tells others at once when it dies. Where
//                        flock is not supported, the owner touches the file's mtime at every refresh
//                        and it counts as dead once the mtime is kDeadAfter old.
//   claims/<wid>.intents one per writer: the model ids it means to publish, appended (no fsync,
//                        no file per id: a create per commit is what parallel filesystems and ext4
//                        are slowest at). "+<hex length>:<id>\n" claims an id, "-<hex length>:<id>\n"
//                        gives it back. A claim stays until withdrawn: once the model's record is
//                        durable, the repository holds the id anyway. A dead writer's claims are void.
//   maintenance.lease    held (O_EXCL create, the holder's wid) by the one process running gc,
//                        compaction or migration; a dead holder's lease is broken by the next taker.
//
// Owns the writer file's descriptor and the set of claims this process holds. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
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

  // Claims id for publishing: appends the claim to our intents file, then reads every other live
  // writer's. kExists when another live writer claimed it first (the message names it) or this
  // process holds the claim already. Two writers claiming at once never both succeed: each writes
  // before it reads, so at least one sees the other's claim; one that sees a rival withdraws, waits
  // a random moment and looks again: if the rival's claim still stands, the rival won.
  Status claim(const std::string& id);
  // The model is in the repository: the claim is done with (it may stand: the id is taken anyway).
  void settle(const std::string& id);
  // Drops this process's claim, withdrawing it (missing is fine).
  void release(const std::string& id);
  bool holds(const std::string& id) const;

  // Takes the maintenance lease, waiting up to `wait` for a live holder to finish. kBusy names the
  // holder when it does not.
  Status take_lease(const std::string& what, std::chrono::milliseconds wait);
  void release_lease();

 private:
  // Appends one intents entry ('+' or '-') to our file.
  Status write_intent(char sign, const std::string& id);
  // Reads the new entries of every other writer's intents file into pending_.
  void read_intents();
  // The live writer (other than us) whose claim on id stands, and the offset of that claim.
  bool rival(const std::string& id, std::string* wid, uint64_t* offset);
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
  UniqueFd intents_fd_;           // claims/<wid>.intents, O_APPEND
  // Other writers' intents files: how far read, and their standing claims (id -> entry offset).
  struct Intents {
    UniqueFd fd;
    uint64_t read_to = 0;
    std::string partial;  // an entry cut by the end of the file so far
    std::unordered_map<std::string, uint64_t> pending;
  };
  std::map<std::string, Intents> others_;  // by wid
  std::mutex read_mu_;                     // serializes read_intents
  DirListing claims_listing_;              // read_mu_
  bool lease_held_ = false;
};

}  // namespace cairn::pfs
