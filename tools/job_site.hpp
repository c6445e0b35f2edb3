// The site config of the job lifecycle (/etc/cairn/site.yaml): what the Slurm prolog/epilog, the
// PBS hook and `cairn job start|stop` read to decide whether a job gets a daemon and how to run it.
// Every key is documented in docs/slurm.md. Parsing is strict: an unknown key or a bad value is an
// error naming the key.
#pragma once

#include <string>

#include "core/status.hpp"

namespace cairn::tool {

struct SiteConfig {
  enum class Enable { kOptIn, kAlways, kNever };
  enum class OnFailure { kContinue, kDrain };

  Enable enable = Enable::kOptIn;      // opt-in: the job's comment contains "cairn"
  std::string repository;              // cairnd's `repository` ("" = ~/cairn-repo of the job user)
  std::string job_dir = "/run/cairn";  // parent of the per-job directories
  std::string daemon_yaml;             // the `daemon:` mapping as YAML text ("" = none): any cairnd config
  double drain_timeout_s = 300;        // the epilog's flush deadline
  double start_timeout_s = 30;         // how long the prolog waits for the socket to answer
  double stop_timeout_s = 60;          // after SIGTERM, how long before SIGKILL
  OnFailure on_failure = OnFailure::kContinue;
  bool keep_job_dir = false;  // keep <job_dir>/<job id> after the job (logs, config)
  // node.shmem_thp: the value the prolog writes to the kernel's shared-memory transparent huge
  // pages setting (/sys/kernel/mm/transparent_hugepage/shmem_enabled) before the daemon starts,
  // restored by the epilog of the node's last cairn job (tools/job_node.hpp). "" = leave it.
  std::string node_shmem_thp;
  std::string source;  // the file it came from ("" = built-in defaults)
};

// The fixed places the site config is read from: `<prefix>/etc/cairn/site.yaml` beside the
// installed tool when it exists (an installation in a prefix, e.g. Spack's), else
// /etc/cairn/site.yaml. `prefix` is the directory above the tool's bin/.
std::string default_site_path(const std::string& prefix);

// Parses the YAML text of a site config. `source` names it in messages.
Result<SiteConfig> parse_site_config(const std::string& text, const std::string& source);
// Reads and parses a file; a missing file gives the defaults (enable: opt-in, ...).
Result<SiteConfig> load_site_config(const std::string& path);

// "30s", "500ms", "2m", "1h", "45" (seconds). nullopt-like: returns < 0 when malformed.
double parse_duration_seconds(const std::string& text);

}  // namespace cairn::tool
