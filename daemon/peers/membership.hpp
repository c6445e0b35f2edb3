// Who is in the peer group: the rendezvous directory and the group's secret (docs/peers.md).
//
// Layout of <rendezvous>/<job>/ (created 0700 by the first member; every member is the job's user):
//   secret                 32 random bytes, mode 0600, created once with O_EXCL by the first member;
//                          a member refuses to join when it is not a regular file of its own user
//                          with mode 0600 (another user could read or have planted it)
//   members/<id>.json      one per live member, written to a temporary name and renamed in place:
//                          {"id", "host", "pid", "address" (the fabric address, hex), "started"}
//                          Its mtime is the member's heartbeat (touched every timeout/4).
// A member is live while its file exists and its heartbeat is younger than the timeout; on the same
// host, also while its pid is alive (a member killed with -9 is gone at the next scan, not after a
// timeout). leave() removes the file; a dead member's stale file is removed by whoever notices.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn {

struct MemberInfo {
  std::string id;    // "m" + 16 hex digits, new at every start
  std::string host;  // gethostname()
  int64_t pid = 0;
  std::string address;  // the fabric address (raw bytes; hex in the file)
  int64_t started = 0;  // unix seconds
  bool operator==(const MemberInfo&) const = default;
};

class Membership {
 public:
  // Joins the group in <rendezvous>/<job>/ (created if missing): reads or creates the secret,
  // publishes this member's file with the given fabric address. kPermission with a clear message
  // when the directory or the secret belongs to another user, the secret's mode is not 0600 or
  // it is not 32 bytes;
  // kInvalidArgument for an empty job, a job id with '/' or NUL, "." or "..", or one over 200
  // characters (naming peers.job), and for a timeout that is not positive.
  static Result<std::unique_ptr<Membership>> join(const std::string& rendezvous, const std::string& job,
                                                  const std::string& fabric_address, std::chrono::milliseconds timeout);
  // Leaves (removes this member's file) unless leave() was called already.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  const MemberInfo& self() const { return self_; }
  const std::string& directory() const { return dir_; }  // <rendezvous>/<job>
  // The group secret (32 bytes).
  const std::string& secret() const { return secret_; }

  // The live members now, this one included, sorted by id. Files that do not parse are skipped
  // with a warning (and removed when older than the timeout); stale members' files are removed.
  // A heartbeat is fresh while |now - mtime| <= timeout (clock skew between hosts must fit in it).
  // After leave(), this member is no longer in the list.
  std::vector<MemberInfo> scan();
  // Touches this member's heartbeat (its file's mtime); rewrites the file if someone removed it.
  // Does nothing after leave().
  Status heartbeat();
  // Removes this member's file.
  void leave();

 private:
  Membership() = default;
  std::string dir_;
  std::string file_;
  std::string secret_;
  MemberInfo self_;
  std::chrono::milliseconds timeout_{10000};
  std::mutex mu_;
  bool left_ = false;
  std::set<std::string> warned_;  // member files already reported as unparsable (warn once each)
};

}  // namespace cairn
