// The node settings of the job lifecycle (see job_node.hpp and docs/slurm.md, "The node ready for
// the job").
#include "tools/job_node.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace cairn::tool {
namespace {

using nlohmann::json;

// shmem_enabled's choices that a state file may record (the kernel's list; `deny` and `force`
// are its testing modes, which a node may have been left in).
bool is_shmem_choice(const std::string& w) {
  static const std::set<std::string> kChoices{"always", "within_size", "advise", "never", "deny", "force"};
  return kChoices.count(w) > 0;
}

std::string state_path(const std::string& job_dir) { return job_dir + "/node-settings.json"; }
std::string lock_path(const std::string& job_dir) { return job_dir + "/node-settings.lock"; }

// Holds <job_dir>/node-settings.lock exclusively while it lives.
class NodeLock {
 public:
  static Result<NodeLock> take(const std::string& job_dir) {
    const std::string path = lock_path(job_dir);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return errno_status("cannot open the node settings lock '" + path + "'", errno);
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return errno_status("cannot lock '" + path + "'", e);
    }
    return NodeLock(fd);
  }
  NodeLock(NodeLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  NodeLock& operator=(NodeLock&&) = delete;
  ~NodeLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }

 private:
  explicit NodeLock(int fd) : fd_(fd) {}
  int fd_;
};

Result<std::string> read_small_file(const std::string& path, bool& missing) {
  missing = false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) {
      missing = true;
      return std::string();
    }
    return errno_status("cannot read '" + path + "'", errno);
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < (1u << 20)) out.append(buf, static_cast<size_t>(n));
  int e = errno;
  ::close(fd);
  if (n < 0) return errno_status("cannot read '" + path + "'", e);
  return out;
}

// The word in brackets of a sysfs choice file ("always within_size [advise] never" -> advise). A
// file that holds one known word and nothing else (a plain file standing in for sysfs in a test,
// once written) reads as that word.
Result<std::string> current_choice(const std::string& path) {
  bool missing = false;
  auto text = read_small_file(path, missing);
  if (!text.ok()) return text.status();
  if (missing)
    return not_found("'" + path + "' does not exist (a kernel without shared-memory transparent huge pages?)");
  std::string trimmed = *text;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.pop_back();
  if (is_shmem_choice(trimmed)) return trimmed;
  const size_t open = text->find('['), close = text->find(']', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos)
    return invalid_argument("'" + path + "' names no selected value in brackets: '" + text->substr(0, 80) + "'");
  std::string word = text->substr(open + 1, close - open - 1);
  if (!is_shmem_choice(word))
    return invalid_argument("'" + path + "' selects '" + word + "', which cairn does not know");
  return word;
}

Status write_choice(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno_status("cannot open '" + path + "' to write '" + value + "'", errno);
  const std::string line = value + "\n";
  ssize_t n = ::write(fd, line.data(), line.size());
  int e = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size()))
    return errno_status("cannot write '" + value + "' to '" + path + "'", n < 0 ? e : EIO);
  return Status::OK();
}

// Writes the state atomically (a temporary file renamed over it), root's, mode 0600.
Status write_state(const std::string& job_dir, const NodeState& s) {
  const std::string path = state_path(job_dir), tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno_status("cannot write '" + tmp + "'", errno);
  const std::string text = node_state_to_json(s);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  int e = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    e = ok ? errno : e;
    ::unlink(tmp.c_str());
    return errno_status("cannot write '" + path + "'", e);
  }
  return Status::OK();
}

// The state, or nullopt-like `missing` when there is none.
Result<NodeState> read_state(const std::string& job_dir, bool& missing) {
  const std::string path = state_path(job_dir);
  auto text = read_small_file(path, missing);
  if (!text.ok()) return text.status();
  if (missing) return NodeState{};
  return parse_node_state(*text, path);
}

}  // namespace

std::string shmem_thp_path() {
  const char* root = std::getenv("CAIRN_TEST_SYSFS_ROOT");  // a test hook (job_node.hpp)
  return std::string(root && *root ? root : "/sys") + "/kernel/mm/transparent_hugepage/shmem_enabled";
}

std::string node_state_to_json(const NodeState& s) {
  nlohmann::ordered_json j;
  j["previous"] = s.previous;
  j["applied"] = s.applied;
  j["jobs"] = s.jobs;
  return j.dump(2) + "\n";
}

Result<NodeState> parse_node_state(std::string_view text, const std::string& source) {
  const std::string what = "node settings state " + source;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(what + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(what + ": must be a JSON object");
  for (const auto& [k, v] : j.items())
    if (k != "previous" && k != "applied" && k != "jobs") return invalid_argument(what + ": unknown field '" + k + "'");
  NodeState s;
  for (const char* key : {"previous", "applied"}) {
    auto it = j.find(key);
    if (it == j.end()) return invalid_argument(what + ": field '" + key + "' is missing");
    if (!it->is_string() || !is_shmem_choice(it->get<std::string>()))
      return invalid_argument(what + ": field '" + key +
                              "' must be one of always, within_size, advise, never, deny, force");
    (std::string(key) == "previous" ? s.previous : s.applied) = it->get<std::string>();
  }
  auto jobs = j.find("jobs");
  if (jobs == j.end()) return invalid_argument(what + ": field 'jobs' is missing");
  if (!jobs->is_array()) return invalid_argument(what + ": field 'jobs' must be an array of job ids");
  for (const auto& id : *jobs) {
    if (!id.is_string() || id.get<std::string>().empty() || id.get<std::string>().size() > 200)
      return invalid_argument(what + ": field 'jobs' holds " + id.dump() + ", not a job id");
    s.jobs.push_back(id.get<std::string>());
  }
  return s;
}

Result<std::string> apply_node_settings(const std::string& job_dir, const std::string& job, const std::string& wanted) {
  if (wanted.empty()) return std::string();
  CAIRN_ASSIGN_OR_RETURN(NodeLock lock, NodeLock::take(job_dir));
  const std::string path = shmem_thp_path();
  bool missing = false;
  CAIRN_ASSIGN_OR_RETURN(NodeState state, read_state(job_dir, missing));
  CAIRN_ASSIGN_OR_RETURN(std::string current, current_choice(path));
  if (missing) {
    state.previous = current;
  } else if (state.applied != wanted) {
    // Another job applied another value (the site config changed in between): the setting is
    // that job's until it ends; this one runs with it.
    if (std::find(state.jobs.begin(), state.jobs.end(), job) == state.jobs.end()) state.jobs.push_back(job);
    CAIRN_RETURN_IF_ERROR(write_state(job_dir, state));
    return "node: shmem_enabled stays '" + current + "' (applied by another running job; the site config asks for '" +
           wanted + "')";
  }
  state.applied = wanted;
  if (std::find(state.jobs.begin(), state.jobs.end(), job) == state.jobs.end()) state.jobs.push_back(job);
  // The state first: an epilog that runs after a failed write still finds what to restore.
  CAIRN_RETURN_IF_ERROR(write_state(job_dir, state));
  if (current == wanted) return "node: shmem_enabled is '" + wanted + "' already (" + path + ")";
  CAIRN_RETURN_IF_ERROR(write_choice(path, wanted));
  return "node: shmem_enabled set to '" + wanted + "' (was '" + current + "'; " + path + ")";
}

Result<std::string> restore_node_settings(const std::string& job_dir, const std::string& job,
                                          const std::function<bool(const std::string&)>& still_running) {
  // Without a state file there is nothing to restore: skip the lock (job_dir may not exist).
  struct stat st {};
  if (::lstat(state_path(job_dir).c_str(), &st) != 0 && errno == ENOENT) return std::string();
  CAIRN_ASSIGN_OR_RETURN(NodeLock lock, NodeLock::take(job_dir));
  bool missing = false;
  CAIRN_ASSIGN_OR_RETURN(NodeState state, read_state(job_dir, missing));
  if (missing) return std::string();
  std::vector<std::string> left;
  for (const std::string& j : state.jobs)
    if (j != job && still_running(j)) left.push_back(j);
  const bool was_recorded = left.size() != state.jobs.size();
  if (!left.empty()) {
    state.jobs = left;
    CAIRN_RETURN_IF_ERROR(write_state(job_dir, state));
    return was_recorded ? "node: shmem_enabled stays '" + state.applied + "' for " + std::to_string(left.size()) +
                              " other cairn job(s) on this node"
                        : std::string();
  }
  const std::string path = shmem_thp_path();
  auto current = current_choice(path);
  std::string line;
  if (!current.ok()) {
    line = "node: cannot restore shmem_enabled: " + current.status().message();
  } else if (*current != state.applied) {
    line = "node: shmem_enabled is '" + *current + "', not the '" + state.applied +
           "' cairn applied: someone changed it since; left as it is";
  } else if (*current == state.previous) {
    line = "node: shmem_enabled stays '" + state.previous + "' (it was so before cairn's jobs)";
  } else {
    CAIRN_RETURN_IF_ERROR(write_choice(path, state.previous));
    line = "node: shmem_enabled restored to '" + state.previous + "' (" + path + ")";
  }
  if (::unlink(state_path(job_dir).c_str()) != 0 && errno != ENOENT)
    return errno_status("cannot remove '" + state_path(job_dir) + "'", errno);
  return line;
}

}  // namespace cairn::tool
