// The node ready for a job: kernel settings the site config asks for (`node:`, docs/slurm.md),
// applied by the prolog (root) before the job's daemon starts and restored by the epilog of the
// last cairn job on the node.
//
// The one setting: node.shmem_thp, written to <sysfs>/kernel/mm/transparent_hugepage/shmem_enabled
// (`advise` gives the daemon's DRAM arena 2 MiB pages: docs/tiering.md). <sysfs> is /sys, or
// $CAIRN_TEST_SYSFS_ROOT when set: a test hook, so that tests change a file of their own instead
// of the kernel's setting; sites never set it.
//
// State: <job_dir>/node-settings.json (root, 0600) records the value found before the first job
// changed it, the value applied, and the jobs that use it; <job_dir>/node-settings.lock (root,
// 0600) is held with flock(LOCK_EX) across every read-modify-write of the state and the setting,
// so the prologs and epilogs of jobs that start and end at once on one node see each other.
//
// REQUIRES: root (the functions write sysfs and root-only files); the caller checks.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"

namespace cairn::tool {

struct NodeState {
  std::string previous;           // shmem_enabled before the first job applied `applied`
  std::string applied;            // what the prolog wrote
  std::vector<std::string> jobs;  // jobs that applied it and have not run their epilog
};

// The file of the shared-memory THP setting (under /sys or $CAIRN_TEST_SYSFS_ROOT).
std::string shmem_thp_path();

// The state file's JSON text, and its strict parser: an object with exactly "previous",
// "applied" (each a word of shmem_enabled's choices) and "jobs" (an array of non-empty strings).
std::string node_state_to_json(const NodeState& s);
Result<NodeState> parse_node_state(std::string_view text, const std::string& source);

// The prolog's step for `job`: under the lock, records the job and, for the first job, the
// current value, and writes `wanted` when the setting differs. Returns a line for the job log.
Result<std::string> apply_node_settings(const std::string& job_dir, const std::string& job, const std::string& wanted);

// The epilog's step for `job`: under the lock, drops the job from the state, and every recorded
// job for which `still_running` is false (a job whose epilog never ran); when none is left,
// writes back the previous value (unless someone changed the setting since: then it is left as
// it is and the line says so) and removes the state. Returns a line for the job log ("" when the
// node has no state: nothing was applied).
Result<std::string> restore_node_settings(const std::string& job_dir, const std::string& job,
                                          const std::function<bool(const std::string&)>& still_running);

}  // namespace cairn::tool
