// The processes and files of a batch job's daemon, for `cairn job` (tools/job.cpp): the job's user
// looked up, privileges dropped to it, work run as that user in a child process with a deadline,
// pidfiles, the checks that a pid is a live cairnd of a user, directory trees made and removed.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "core/status.hpp"
#include "tools/public_client.hpp"

namespace cairn::tool {

struct User {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string name, home, shell;
};

// The user named (the caller when empty); kNotFound when the node does not know it.
Result<User> lookup_user(const std::string& name);
bool is_root();
// Drops root to user u (its groups, gid, uid); refuses u = root. A no-op when not root.
Status drop_privileges(const User& u);

// "/a/b" -> "/a"; "/a" and "a" -> "/".
std::string parent_of(const std::string& dir);
// mkdir (an existing directory is fine); make_dirs makes the missing parents too.
Status make_dir(const std::string& path, mode_t mode);
Status make_dirs(const std::string& path, mode_t mode);
// The whole file ("" when it cannot be read); the last n lines of it on one line, for a log message.
std::string read_text(const std::string& path);
std::string last_lines(const std::string& path, size_t n);
// Removes a directory tree without following symbolic links; remove_tree_as does it in a child
// process as user u (root never follows what the user may have placed in it).
void remove_tree(const std::string& dir);
void remove_tree_as(const User& u, const std::string& dir);

// Whether a Unix socket at path accepts a connection.
bool socket_answers(const std::string& path);
// The pid a pidfile names (0 when missing or malformed); written atomically (rename).
pid_t read_pidfile(const std::string& path);
Status write_pidfile(const std::string& path, pid_t pid);
// Whether pid is a live cairnd owned by uid (a pidfile may be stale and its pid reused).
bool is_our_daemon(pid_t pid, uid_t uid);
// Whether pid exists and is not a zombie.
bool alive(pid_t pid);

// What a child process that ran as the daemon's user answered.
struct AsUser {
  bool finished = false;  // false: it did not finish by the deadline and was killed
  bool ok = false;        // it exited 0
  std::string out;        // what it wrote
};

// Runs `work` in a child process as user u (cairnd serves only its own uid): the child connects to
// `socket`, calls work with the client and writes what work returns to a pipe; it exits 0 when
// work says ok. The parent reads the pipe as it comes and kills the child at the deadline.
AsUser run_as_daemon_user(const User& u, const std::string& socket, double timeout_s,
                          const std::function<bool(v1::Client&, std::string&)>& work);

}  // namespace cairn::tool
