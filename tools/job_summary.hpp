// What cairn saved a batch job: the summary `cairn job stop` writes when it stops the job's daemon
// (into the job log, syslog, and a JSON file that outlives the job directory), and that
// `cairn job summary JOBID [--json]` prints afterwards. docs/slurm.md ("What cairn saved the job")
// documents the file, its place and every field.
//
// The figures come from the daemon's `stats` ("usage", "tiers", "prefetch"; docs/protocol.md),
// taken before the epilog's flush, so they describe what the job's processes asked of it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.hpp"

namespace cairn::tool {

struct JobSummary {
  // The format's name and version, the first fields of the file.
  static constexpr const char* kFormat = "cairn-job-summary";
  static constexpr int kVersion = 1;

  std::string job, user, host;
  int64_t started_unix = 0;  // the daemon's start, seconds since the epoch
  int64_t stopped_unix = 0;  // when `cairn job stop` took the summary
  uint64_t models_committed = 0, models_loaded = 0;
  // Tensor bytes committed: in new chunks, in chunks already held (DRAM or repository), inherited.
  uint64_t stored_bytes = 0, deduplicated_bytes = 0, inherited_bytes = 0;
  // Chunk bytes leased to the job's processes, by the tier that served them.
  uint64_t loaded_from_dram = 0, loaded_from_nvme = 0, loaded_from_peers = 0, loaded_from_repository = 0,
           loaded_from_other = 0;
  uint64_t repository_read_bytes = 0;  // every chunk byte read from the repository (prefetch included)
  uint64_t prefetched_bytes = 0;       // staged ahead of reads by the prefetcher
  uint64_t requests = 0;               // client requests answered
  double wait_seconds = 0;             // the sum of their times: how long processes waited on cairn

  uint64_t loaded_bytes() const {
    return loaded_from_dram + loaded_from_nvme + loaded_from_peers + loaded_from_repository + loaded_from_other;
  }
  uint64_t not_written_bytes() const { return deduplicated_bytes + inherited_bytes; }
};

// The summary of a daemon from its `stats` response. Fails naming the missing or malformed field
// (a cairnd without "usage" is from an older release).
Result<JobSummary> summary_from_stats(const nlohmann::json& stats, const std::string& job, const std::string& user,
                                      const std::string& host, int64_t stopped_unix);

// The JSON text of the file (one object, fields in a fixed order, newline at the end).
std::string summary_to_json(const JobSummary& s);
// Parses that text strictly: one JSON object with exactly the fields summary_to_json writes, of
// the right types (counts non-negative integers); the format name and version must match. Errors
// name `source` and the field that was wrong.
Result<JobSummary> parse_job_summary(std::string_view text, const std::string& source);

// A few lines for a person: what was committed, loaded and from where, what was not written, waits.
std::string summary_table(const JobSummary& s);
// One line for the job log and syslog.
std::string summary_line(const JobSummary& s);

}  // namespace cairn::tool
