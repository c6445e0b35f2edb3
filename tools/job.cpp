// `cairn job start|stop|env|summary` (see job.hpp and docs/slurm.md).
//
// As root (the prolog, the epilog, the PBS hook) the per-job directory <job_dir>/<job id> is made
// for the job's user (mode 0700), the daemon runs as that user (never as root), and the pidfile is
// <job_dir>/<job id>.pid, which only root can write: the epilog signals the pid it names only
// after checking that it is a cairnd of that user. As a user, everything is the user's own: the
// job directory is under the site's job_dir when the user may write there, else under
// /tmp/cairn-<uid>/jobs, and the pidfile is inside it.
//
// `cairn job stop` asks the daemon for its stats before it flushes and stops it, and keeps the
// job summary (tools/job_summary.hpp) beside the job directory as <base>/<job id>.summary.json:
// as root, owned by the job's user and readable by them only (mode 0600) in the root-owned
// job_dir; as a user, in their own base. `cairn job summary JOBID` reads it from there. As root,
// the prolog applies the site's node settings and the epilog restores them (tools/job_node.hpp).
#include "tools/job.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "tools/job_node.hpp"
#include "tools/job_process.hpp"
#include "tools/job_site.hpp"
#include "tools/job_summary.hpp"

namespace cairn::tool {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct JobArgs {
  std::string job, user, comment, site, job_dir, batch;
  bool keep = false;
  bool json = false;  // `summary --json`
};

std::string self_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

Status check_job_id(const std::string& id) {
  if (id.empty())
    return invalid_argument("no job id: give --job, or run inside a Slurm or PBS job (SLURM_JOB_ID, PBS_JOBID)");
  if (id == "." || id == ".." || id.size() > 200)
    return invalid_argument("job id '" + id + "' is not usable as a directory name");
  for (char ch : id)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-' && ch != '[' && ch != ']')
      return invalid_argument("job id '" + id +
                              "' has a character other than letters, digits, '.', '_', '-', '[', ']'");
  return Status::OK();
}

// One line per event: to <job_dir>/cairn-job.log, to syslog (LOG_DAEMON) and to stderr. The
// prolog's and epilog's own output goes nowhere under slurmd, so the file and syslog are what an
// administrator reads.
class JobLog {
 public:
  JobLog(std::string action, std::string job) : action_(std::move(action)), job_(std::move(job)) {
    ::openlog("cairn-job", LOG_PID, LOG_DAEMON);
  }
  void set_file(const std::string& path) { file_ = path; }
  void line(int priority, const std::string& msg) const {
    std::string text = "cairn job " + action_ + ": job " + (job_.empty() ? "?" : job_) + ": " + msg;
    ::syslog(priority, "%s", text.c_str());
    std::fprintf(stderr, "%s\n", text.c_str());
    if (file_.empty()) return;
    int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return;
    char stamp[64];
    std::time_t t = std::time(nullptr);
    struct tm tmv {};
    ::gmtime_r(&t, &tmv);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    std::string out = std::string(stamp) + " " + text + "\n";
    if (::write(fd, out.data(), out.size()) < 0) { /* nothing more to do: syslog has it */
    }
    ::close(fd);
  }
  void info(const std::string& m) const { line(LOG_INFO, m); }
  void error(const std::string& m) const { line(LOG_ERR, m); }

 private:
  std::string action_, job_, file_;
};

// Runs a function when it goes out of scope.
class AtExit {
 public:
  explicit AtExit(std::function<void()> f) : f_(std::move(f)) {}
  ~AtExit() { f_(); }
  AtExit(const AtExit&) = delete;
  AtExit& operator=(const AtExit&) = delete;

 private:
  std::function<void()> f_;
};

// Where a job's files are. Root: <site job_dir>/<id>, pidfile beside it. A user: the site's
// job_dir when writable, else /tmp/cairn-<uid>/jobs.
struct JobPaths {
  std::string base, dir, socket, config, log, pidfile, job_log, summary;
};

JobPaths paths_for(const std::string& base, const std::string& id, bool root_mode) {
  JobPaths p;
  p.base = base;
  p.dir = base + "/" + id;
  p.socket = p.dir + "/cairnd.sock";
  p.config = p.dir + "/cairnd.yaml";
  p.log = p.dir + "/cairnd.log";
  p.pidfile = root_mode ? base + "/" + id + ".pid" : p.dir + "/cairnd.pid";
  p.job_log = base + "/cairn-job.log";
  p.summary = base + "/" + id + ".summary.json";
  return p;
}

std::string user_fallback_base() { return "/tmp/cairn-" + std::to_string(::getuid()) + "/jobs"; }

// The base directory for this caller: root uses the site's job_dir (made 0755 if missing); a user
// uses it only when it exists and is writable.
Result<std::string> job_base(const SiteConfig& site, const JobArgs& a, bool create) {
  if (!a.job_dir.empty()) {
    if (create)
      if (auto s = make_dirs(a.job_dir, is_root() ? 0755 : 0700); !s.ok()) return s;
    return a.job_dir;
  }
  if (is_root()) {
    if (create)
      if (auto s = make_dirs(site.job_dir, 0755); !s.ok()) return s;
    return site.job_dir;
  }
  if (::access(site.job_dir.c_str(), W_OK | X_OK) == 0) return site.job_dir;
  std::string fb = user_fallback_base();
  if (create) {
    if (auto s = make_dirs(fb, 0700); !s.ok()) return s;
    struct stat st {};
    if (::stat(parent_of(fb).c_str(), &st) == 0 && st.st_uid != ::getuid())
      return permission_denied("'" + parent_of(fb) + "' belongs to uid " + std::to_string(st.st_uid) + ", not to you");
  }
  return fb;
}

// The cairnd config for the job: the site's `daemon` mapping with the socket, repository, peer
// group and burst-buffer directory set for this job.
Result<std::string> daemon_config(const SiteConfig& site, const std::string& id, const JobPaths& p, const User& u) {
  YAML::Node d;
  try {
    d = site.daemon_yaml.empty() ? YAML::Node(YAML::NodeType::Map) : YAML::Load(site.daemon_yaml);
    d["socket"] = p.socket;
    if (!site.repository.empty())
      d["repository"] = site.repository;
    else if (!d["repository"])
      d["repository"] = "${HOME}/cairn-repo";
    if (!d["peers"] || !d["peers"]["job"]) d["peers"]["job"] = id;
    // The burst buffer: the site's tiers.nvme.path is the node-local parent; each job gets its own.
    if (d["tiers"] && d["tiers"]["nvme"] && d["tiers"]["nvme"]["path"])
      d["tiers"]["nvme"]["path"] = d["tiers"]["nvme"]["path"].as<std::string>() + "/cairn-" + u.name + "-" + id;
    else
      d["tiers"]["nvme"]["path"] = p.dir + "/nvme";
  } catch (const YAML::Exception& e) {
    return invalid_argument(std::string("site config: daemon: ") + e.what());
  }
  YAML::Emitter out;
  out << d;
  return std::string("# cairnd config for job ") + id + ", written by `cairn job start` from " + site.source + "\n" +
         out.c_str() + "\n";
}

std::map<std::string, std::string> daemon_env(const User& u, const std::string& id, const std::string& batch) {
  std::map<std::string, std::string> env{{"PATH", "/usr/local/bin:/usr/bin:/bin"},
                                         {"HOME", u.home},
                                         {"USER", u.name},
                                         {"LOGNAME", u.name},
                                         {"SHELL", u.shell},
                                         {"CAIRN_JOB_ID", id}};
  if (batch == "slurm") env["SLURM_JOB_ID"] = id;
  if (batch == "pbs") env["PBS_JOBID"] = id;
  if (!is_root()) {  // a user keeps their own environment (TMPDIR, XDG_RUNTIME_DIR, site paths)
    for (const char* k : {"TMPDIR", "XDG_RUNTIME_DIR", "LD_LIBRARY_PATH"})
      if (const char* v = std::getenv(k)) env[k] = v;
  }
  return env;
}

struct StartResult {
  bool started = false;
  std::string socket;
};

Result<StartResult> start_daemon(const SiteConfig& site, const JobArgs& a, const User& u, const std::string& id,
                                 JobLog& log) {
  auto base = job_base(site, a, true);
  if (!base.ok()) return base.status();
  JobPaths p = paths_for(*base, id, is_root());
  log.set_file(p.job_log);

  // Already running (a second `cairn job start` on the node): nothing to do.
  if (pid_t old = read_pidfile(p.pidfile); old && is_our_daemon(old, u.uid) && socket_answers(p.socket)) {
    log.info("cairnd pid " + std::to_string(old) + " already serves " + p.socket);
    return StartResult{true, p.socket};
  }

  if (auto s = make_dir(p.dir, 0700); !s.ok()) return s;
  struct stat st {};
  if (::lstat(p.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalid_argument("'" + p.dir + "' is not a directory");
  if (is_root()) {
    if (::chown(p.dir.c_str(), u.uid, u.gid) != 0 || ::chmod(p.dir.c_str(), 0700) != 0)
      return errno_status("cannot give '" + p.dir + "' to " + u.name, errno);
  } else if (st.st_uid != u.uid) {
    return permission_denied("'" + p.dir + "' belongs to uid " + std::to_string(st.st_uid));
  }
  // The node settings, before the daemon starts and after the job directory exists (which tells
  // another job's epilog that this job runs).
  if (!site.node_shmem_thp.empty()) {
    if (!is_root()) {
      log.info("node: the site config's node settings need root; not applied");
    } else if (auto applied = apply_node_settings(p.base, id, site.node_shmem_thp); !applied.ok()) {
      log.error("node: cannot apply node.shmem_thp '" + site.node_shmem_thp + "': " + applied.status().message() +
                "; the job runs with the node as it is");
    } else if (!applied->empty()) {
      log.info(*applied);
    }
  }
  ::unlink(p.socket.c_str());  // a socket left by a crashed daemon of this job

  auto text = daemon_config(site, id, p, u);
  if (!text.ok()) return text.status();
  auto env = daemon_env(u, id, a.batch);
  // The same checks cairnd makes, here, so that a bad site config is named in the job log at once.
  if (auto c = load_config_text(*text, "the site config's daemon section (" + site.source + ")", env); !c.ok())
    return c.status();
  {
    int fd = ::open(p.config.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return errno_status("cannot write '" + p.config + "'", errno);
    bool ok = ::write(fd, text->data(), text->size()) == static_cast<ssize_t>(text->size());
    if (is_root() && ::fchown(fd, u.uid, u.gid) != 0) ok = false;
    ::close(fd);
    if (!ok) return errno_status("cannot write '" + p.config + "'", errno);
  }
  int logfd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (logfd < 0) return errno_status("cannot open '" + p.log + "'", errno);
  if (is_root() && ::fchown(logfd, u.uid, u.gid) != 0) {
    ::close(logfd);
    return errno_status("cannot give '" + p.log + "' to " + u.name, errno);
  }

  std::string cairnd = self_dir() + "/cairnd";
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg_config = "--config";
  std::vector<char*> argv{cairnd.data(), arg_config.data(), p.config.data(), nullptr};

  const auto t0 = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(logfd);
    return errno_status("fork", errno);
  }
  if (pid == 0) {
    // The daemon: its own session (no terminal, not in the prolog's process group), stdio to the
    // log in the job directory, the job user's identity.
    ::setsid();
    int nullfd = ::open("/dev/null", O_RDONLY);
    if (nullfd >= 0) ::dup2(nullfd, 0);
    ::dup2(logfd, 1);
    ::dup2(logfd, 2);
    ::close_range(3, ~0U, 0);
    ::umask(077);
    if (auto s = drop_privileges(u); !s.ok()) {
      ::dprintf(2, "cairn job start: %s\n", s.to_string().c_str());
      ::_exit(126);
    }
    if (::chdir(p.dir.c_str()) != 0) ::_exit(126);
    ::execve(cairnd.c_str(), argv.data(), envp.data());
    ::dprintf(2, "cairn job start: cannot run %s: %s\n", cairnd.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(logfd);
  if (auto s = write_pidfile(p.pidfile, pid); !s.ok()) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return s;
  }
  const auto deadline = t0 + std::chrono::duration<double>(site.start_timeout_s);
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      ::unlink(p.pidfile.c_str());
      std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                          : "was killed by signal " + std::to_string(WTERMSIG(status));
      return unavailable("cairnd " + how + " before it answered: " + last_lines(p.log, 2));
    }
    if (socket_answers(p.socket)) break;
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ::unlink(p.pidfile.c_str());
      return timed_out("cairnd did not answer on " + p.socket + " within " + std::to_string(site.start_timeout_s) +
                       " s (start_timeout); stopped it. Its log: " + last_lines(p.log, 2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  char msg[128];
  std::snprintf(msg, sizeof msg, " in %.2f s", secs);
  log.info("started cairnd pid " + std::to_string(pid) + " as " + u.name + " on " + p.socket + msg);
  return StartResult{true, p.socket};
}

bool wants_cairn(const SiteConfig& site, const JobArgs& a) {
  if (a.batch.empty()) return true;  // a user's own `cairn job start`
  if (site.enable == SiteConfig::Enable::kNever) return false;
  if (site.enable == SiteConfig::Enable::kAlways) return true;
  std::string c = a.comment;
  for (auto& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return c.find("cairn") != std::string::npos;
}

std::string site_path(const JobArgs& a) { return a.site.empty() ? default_site_path(parent_of(self_dir())) : a.site; }

void fill_defaults(JobArgs& a) {
  if (a.job.empty()) a.job = env_or("SLURM_JOB_ID", env_or("PBS_JOBID"));
  if (a.user.empty() && is_root()) a.user = env_or("SLURM_JOB_USER", env_or("PBS_JOBUSER"));
  if (a.comment.empty()) a.comment = env_or("SLURM_JOB_COMMENT");
}

int cmd_start(JobArgs a) {
  fill_defaults(a);
  JobLog log("start", a.job);
  auto site = load_site_config(site_path(a));
  auto failed = [&](const std::string& why, bool drain) {
    log.error(why + (drain ? "; on_failure: drain (the node will be drained)" : "; the job runs without cairn"));
    return drain ? 1 : 0;
  };
  if (!site.ok()) {
    // Without a readable site config there is no job_dir either: log to the default one.
    SiteConfig defaults;
    if (make_dirs(defaults.job_dir, 0755).ok() && is_root()) log.set_file(defaults.job_dir + "/cairn-job.log");
    return failed(site.status().message(), false);
  }
  if (is_root()) {
    if (make_dirs(site->job_dir, 0755).ok()) log.set_file(site->job_dir + "/cairn-job.log");
  }
  const bool drain = site->on_failure == SiteConfig::OnFailure::kDrain;
  if (auto s = check_job_id(a.job); !s.ok()) return failed(s.message(), drain);
  if (!wants_cairn(*site, a)) return 0;
  if (is_root() && a.user.empty()) return failed("no job user: give --user (or SLURM_JOB_USER)", drain);
  if (!is_root() && !a.user.empty()) {
    auto me = lookup_user("");
    if (me.ok() && me->name != a.user) return failed("only root can start a daemon for another user", drain);
  }
  auto u = lookup_user(is_root() ? a.user : "");
  if (!u.ok()) return failed(u.status().message(), drain);
  if (u->uid == 0) return failed("refusing to run cairnd as root for a root job", drain);
  auto r = start_daemon(*site, a, *u, a.job, log);
  if (!r.ok()) return failed(r.status().message(), drain);
  std::printf("export CAIRN_SOCKET=%s\n", r->socket.c_str());
  return 0;
}

// Flushes the daemon as its user. Returns a line for the log.
std::string flush_as(const User& u, const std::string& socket, double timeout_s, bool& ok) {
  // The flush is bounded by the daemon (timeout_ms); the extra margin covers a daemon that hangs.
  AsUser r = run_as_daemon_user(u, socket, timeout_s + 15, [&](v1::Client& c, std::string& out) {
    json req{{"op", "flush"}, {"timeout_ms", static_cast<int64_t>(timeout_s * 1000)}};
    auto reply = request(c, req);
    if (!reply.ok()) {
      out = reply.status().to_string();
      return false;
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "flushed %llu models to the repository in %.2f s",
                  static_cast<unsigned long long>(reply->value("flushed_models", uint64_t{0})),
                  reply->value("seconds", 0.0));
    out = buf;
    return true;
  });
  ok = r.finished && r.ok;
  if (!r.finished) return "the flush did not finish within drain_timeout; stopping anyway (cairnd drains on SIGTERM)";
  return ok ? r.out : "flush failed: " + r.out;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

// The daemon's summary for the job, from its stats, asked as its user (bounded: 30 s).
Result<JobSummary> summary_as(const User& u, const std::string& socket, const std::string& job) {
  AsUser r = run_as_daemon_user(u, socket, 30, [](v1::Client& c, std::string& out) {
    auto reply = request(c, json{{"op", "stats"}});
    if (!reply.ok()) {
      out = reply.status().to_string();
      return false;
    }
    out = reply->dump();
    return true;
  });
  if (!r.finished) return timed_out("the daemon did not answer `stats` within 30 s");
  if (!r.ok) return unavailable("`stats` failed: " + r.out);
  json stats = json::parse(r.out, nullptr, false);
  if (stats.is_discarded()) return internal_error("the daemon's stats are not valid JSON");
  return summary_from_stats(
      stats, job, u.name, host_name(),
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

// Writes the summary file atomically: mode 0600, owned by the job's user (chown when root).
Status write_summary(const JobPaths& p, const User& u, const JobSummary& summary) {
  const std::string tmp = p.summary + ".tmp";
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno_status("cannot write '" + tmp + "'", errno);
  const std::string text = summary_to_json(summary);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (ok && is_root() && ::fchown(fd, u.uid, u.gid) != 0) ok = false;
  int e = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), p.summary.c_str()) != 0) {
    e = ok ? errno : e;
    ::unlink(tmp.c_str());
    return errno_status("cannot write the job summary '" + p.summary + "'", e);
  }
  return Status::OK();
}

// The job's burst-buffer directory, from the config `cairn job start` wrote ("" when it is to be
// kept: tiers.nvme.persistent, or no config).
std::string nvme_dir_to_remove(const JobPaths& p, const User& u, const std::string& id, const std::string& batch) {
  struct stat st {};
  if (::stat(p.config.c_str(), &st) != 0) return "";
  auto c = load_config(p.config, daemon_env(u, id, batch));
  if (!c.ok() || c->tiers.nvme.persistent) return "";
  return c->tiers.nvme.path;
}

int cmd_stop(JobArgs a) {
  fill_defaults(a);
  JobLog log("stop", a.job);
  auto site_r = load_site_config(site_path(a));
  SiteConfig site;
  if (site_r.ok())
    site = *site_r;
  else
    log.error(site_r.status().message() + "; stopping with the default settings");
  if (auto s = check_job_id(a.job); !s.ok()) {
    log.error(s.message());
    return 0;
  }
  auto base = job_base(site, a, false);
  if (!base.ok()) {
    log.error(base.status().message());
    return 0;
  }
  JobPaths p = paths_for(*base, a.job, is_root());
  struct stat dst {};
  const bool have_dir = ::lstat(p.dir.c_str(), &dst) == 0 && S_ISDIR(dst.st_mode);
  struct stat bst {};
  if (is_root() && ::stat(p.base.c_str(), &bst) == 0) log.set_file(p.job_log);
  // The node settings a prolog applied: once this function is done with the job (whichever way it
  // returns), this job no longer holds them; the last job restores them. Another job runs while its
  // pidfile or its job directory exists (its prolog makes the directory before it applies).
  AtExit restore_node([&] {
    if (!is_root()) return;
    auto running = [&](const std::string& other) {
      JobPaths q = paths_for(p.base, other, true);
      struct stat st {};
      return ::lstat(q.pidfile.c_str(), &st) == 0 || ::lstat(q.dir.c_str(), &st) == 0;
    };
    auto line = restore_node_settings(p.base, a.job, running);
    if (!line.ok())
      log.error("node: " + line.status().message());
    else if (!line->empty())
      log.info(*line);
  });
  pid_t pid = read_pidfile(p.pidfile);
  if (!have_dir && !pid) return 0;  // this job had no daemon here
  // The daemon's user: the owner of the job directory (root mode), else the caller.
  User u;
  if (is_root()) {
    if (!have_dir) {
      log.error("pidfile " + p.pidfile + " without the job directory " + p.dir + "; not signalling anything");
      ::unlink(p.pidfile.c_str());
      return 0;
    }
    struct passwd pw {
    }, *out = nullptr;
    std::vector<char> buf(16384);
    if (::getpwuid_r(dst.st_uid, &pw, buf.data(), buf.size(), &out) == 0 && out)
      u = User{pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir ? pw.pw_dir : "/", "/bin/sh"};
    else
      u = User{dst.st_uid, dst.st_gid, std::to_string(dst.st_uid), "/", "/bin/sh"};
  } else {
    auto me = lookup_user("");
    if (!me.ok()) {
      log.error(me.status().message());
      return 0;
    }
    u = *me;
  }
  const auto t0 = Clock::now();
  if (pid && !is_our_daemon(pid, u.uid)) {
    if (alive(pid))
      log.error("pidfile " + p.pidfile + " names pid " + std::to_string(pid) +
                ", which is not this job's cairnd; not signalled");
    pid = 0;
  }
  if (pid) {
    bool ok = false;
    const bool answers = socket_answers(p.socket);
    // What the daemon did for the job, before the flush: the job log gets a line, the user a file.
    if (answers) {
      auto summary = summary_as(u, p.socket, a.job);
      if (!summary.ok()) {
        log.error("no job summary: " + summary.status().message());
      } else {
        log.info(summary_line(*summary));
        if (auto w = write_summary(p, u, *summary); !w.ok()) log.error(w.message());
      }
    }
    std::string flushed =
        answers ? flush_as(u, p.socket, site.drain_timeout_s, ok) : "the socket does not answer; no flush";
    log.line(ok ? LOG_INFO : LOG_ERR, flushed);
    ::kill(pid, SIGTERM);
    auto deadline = Clock::now() + std::chrono::duration<double>(site.stop_timeout_s);
    while (alive(pid) && Clock::now() < deadline) {
      ::waitpid(pid, nullptr, WNOHANG);  // when this process started it (tests), reap it
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (alive(pid)) {
      log.error("cairnd pid " + std::to_string(pid) + " did not exit within stop_timeout after SIGTERM; SIGKILL");
      ::kill(pid, SIGKILL);
      auto kill_deadline = Clock::now() + std::chrono::seconds(5);
      while (alive(pid) && Clock::now() < kill_deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      char msg[96];
      std::snprintf(msg, sizeof msg, "cairnd pid %d stopped in %.2f s", static_cast<int>(pid),
                    std::chrono::duration<double>(Clock::now() - t0).count());
      log.info(msg);
    }
  }
  ::unlink(p.pidfile.c_str());
  if (have_dir && !(a.keep || site.keep_job_dir)) {
    if (std::string nvme = nvme_dir_to_remove(p, u, a.job, a.batch); !nvme.empty()) remove_tree_as(u, nvme);
    remove_tree(p.dir);
  }
  return 0;
}

// `cairn job summary JOBID`: the summary `cairn job stop` kept, as a table or (--json) as stored.
int cmd_summary(JobArgs a) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "cairn job summary: %s\n", why.c_str());
    return 1;
  };
  if (auto s = check_job_id(a.job); !s.ok()) return fail(s.message());
  auto site_r = load_site_config(site_path(a));
  if (!site_r.ok()) return fail(site_r.status().message());
  std::vector<std::string> bases;
  if (!a.job_dir.empty())
    bases.push_back(a.job_dir);
  else {
    bases.push_back(site_r->job_dir);
    if (!is_root()) bases.push_back(user_fallback_base());
  }
  std::string looked;
  for (const auto& b : bases) {
    JobPaths p = paths_for(b, a.job, is_root());
    looked += (looked.empty() ? "" : ", ") + p.summary;
    struct stat st {};
    if (::lstat(p.summary.c_str(), &st) != 0) continue;
    if (!S_ISREG(st.st_mode)) return fail("'" + p.summary + "' is not a regular file");
    int fd = ::open(p.summary.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == EACCES)
        return fail("'" + p.summary + "' is not yours: a job's summary is readable by its user only");
      return fail(errno_status("cannot read '" + p.summary + "'", errno).message());
    }
    std::string text;
    char buf[8192];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && text.size() <= (1u << 20)) text.append(buf, static_cast<size_t>(n));
    ::close(fd);
    auto summary = parse_job_summary(text, p.summary);
    if (!summary.ok()) return fail(summary.status().message());
    if (summary->job != a.job)
      return fail("'" + p.summary + "' is the summary of job '" + summary->job + "', not of job '" + a.job + "'");
    std::fputs(a.json ? summary_to_json(*summary).c_str() : summary_table(*summary).c_str(), stdout);
    return 0;
  }
  return fail("no summary of job '" + a.job + "' on this node (looked for " + looked +
              "); `cairn job stop` keeps one when it stops a job's daemon");
}

int cmd_env(JobArgs a) {
  fill_defaults(a);
  if (!check_job_id(a.job).ok()) return 0;
  auto site_r = load_site_config(site_path(a));
  SiteConfig site = site_r.ok() ? *site_r : SiteConfig{};
  std::vector<std::string> bases;
  if (!a.job_dir.empty()) bases.push_back(a.job_dir);
  bases.push_back(site.job_dir);
  bases.push_back(user_fallback_base());
  for (const auto& b : bases) {
    JobPaths p = paths_for(b, a.job, false);
    struct stat st {};
    if (::stat(p.socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      std::printf("export CAIRN_SOCKET=%s\n", p.socket.c_str());
      return 0;
    }
  }
  return 0;
}

}  // namespace

void add_job_commands(CLI::App& app, int& rc) {
  auto* job = app.add_subcommand("job",
                                 "start or stop this node's daemon for a batch job, or show what it did for the job "
                                 "(the Slurm prolog and epilog run start and stop; docs/slurm.md)");
  job->require_subcommand(1);
  auto args = std::make_shared<JobArgs>();
  auto common = [&](CLI::App* c) {
    c->add_option("--job", args->job, "job id (default: $SLURM_JOB_ID, else $PBS_JOBID)");
    c->add_option("--site", args->site,
                  "site config (default: <prefix>/etc/cairn/site.yaml if present, else /etc/cairn/site.yaml)");
    c->add_option("--job-dir", args->job_dir, "parent of the per-job directories (default: the site's job_dir)");
  };
  auto* start =
      job->add_subcommand("start", "start cairnd for the job (as root: --user; prints `export CAIRN_SOCKET=...`)");
  common(start);
  start->add_option("--user", args->user, "the job's user (root only; default: $SLURM_JOB_USER)");
  start->add_option("--comment", args->comment, "the job's comment, for enable: opt-in (default: $SLURM_JOB_COMMENT)");
  start
      ->add_option("--batch", args->batch,
                   "called by the batch system's prolog (slurm, pbs): apply the site's `enable`")
      ->check(CLI::IsMember({"slurm", "pbs"}));
  start->callback([&rc, args] { rc = cmd_start(*args); });
  auto* stop =
      job->add_subcommand("stop", "flush the job's cairnd to the repository, stop it, remove the job directory");
  common(stop);
  stop->add_flag("--keep", args->keep, "keep the job directory (config, logs)");
  stop->add_option("--batch", args->batch, "called by the batch system's epilog (slurm, pbs)")
      ->check(CLI::IsMember({"slurm", "pbs"}));
  stop->callback([&rc, args] { rc = cmd_stop(*args); });
  auto* summary = job->add_subcommand(
      "summary", "print what cairn did for a job whose daemon `cairn job stop` stopped on this node");
  summary->add_option("jobid", args->job, "the job id")->required();
  summary->add_option("--site", args->site,
                      "site config (default: <prefix>/etc/cairn/site.yaml if present, else /etc/cairn/site.yaml)");
  summary->add_option("--job-dir", args->job_dir,
                      "where the job's daemon ran (default: the site's job_dir, then /tmp/cairn-<uid>/jobs)");
  summary->add_flag("--json", args->json, "print the summary as JSON (as stored)");
  summary->callback([&rc, args] { rc = cmd_summary(*args); });
  auto* env = job->add_subcommand(
      "env", "print `export CAIRN_SOCKET=...` when the job has a daemon on this node (the task prolog)");
  common(env);
  env->callback([&rc, args] { rc = cmd_env(*args); });
}

}  // namespace cairn::tool
