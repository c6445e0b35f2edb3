// The job summary (see job_summary.hpp and docs/slurm.md, "What cairn saved the job").
#include "tools/job_summary.hpp"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include "tools/progress_line.hpp"

namespace cairn::tool {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A summary file is a few hundred bytes; anything much larger is not one.
constexpr size_t kMaxSummaryBytes = 64 * 1024;

std::string utc(int64_t unix_s) {
  std::time_t t = static_cast<std::time_t>(unix_s);
  struct tm tmv {};
  if (!::gmtime_r(&t, &tmv)) return std::to_string(unix_s);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tmv);
  return buf;
}

std::string join(const std::string& where, const char* key) { return where.empty() ? key : where + "." + key; }

// Reads the fields of one JSON object, naming `what` (the file, or the daemon's stats) and the
// field's path in every error.
class Reader {
 public:
  Reader(const json& obj, std::string what, std::string where = "")
      : obj_(obj), what_(std::move(what)), where_(std::move(where)) {}

  // Fails on a field of the object not among `keys` (strict files) and on one of `keys` missing.
  Status exactly(std::initializer_list<const char*> keys) const {
    std::set<std::string> known(keys.begin(), keys.end());
    for (const auto& [k, v] : obj_.items())
      if (!known.count(k)) return bad(join(where_, k.c_str()), "is not a field of a job summary");
    for (const char* k : keys)
      if (!obj_.contains(k)) return bad(join(where_, k), "is missing");
    return Status::OK();
  }

  Result<const json*> field(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return bad(join(where_, key), "is missing");
    return &*it;
  }
  Result<Reader> object(const char* key) const {
    auto f = field(key);
    if (!f.ok()) return f.status();
    if (!(*f)->is_object()) return bad(join(where_, key), "must be an object, not " + type_of(**f));
    return Reader(**f, what_, join(where_, key));
  }
  Result<uint64_t> count(const char* key) const {
    auto f = field(key);
    if (!f.ok()) return f.status();
    if (!(*f)->is_number_unsigned()) return bad(join(where_, key), "must be a non-negative integer, not " + shown(**f));
    return (*f)->get<uint64_t>();
  }
  Result<int64_t> seconds(const char* key) const {
    auto f = field(key);
    if (!f.ok()) return f.status();
    if (!(*f)->is_number_integer() || (*f)->get<int64_t>() < 0)
      return bad(join(where_, key), "must be a non-negative integer (seconds since 1970), not " + shown(**f));
    return (*f)->get<int64_t>();
  }
  Result<double> duration(const char* key) const {
    auto f = field(key);
    if (!f.ok()) return f.status();
    if (!(*f)->is_number() || !std::isfinite((*f)->get<double>()) || (*f)->get<double>() < 0)
      return bad(join(where_, key), "must be a non-negative number of seconds, not " + shown(**f));
    return (*f)->get<double>();
  }
  Result<std::string> text(const char* key, bool may_be_empty) const {
    auto f = field(key);
    if (!f.ok()) return f.status();
    if (!(*f)->is_string()) return bad(join(where_, key), "must be a string, not " + shown(**f));
    std::string s = (*f)->get<std::string>();
    if (s.empty() && !may_be_empty) return bad(join(where_, key), "must not be empty");
    if (s.size() > 256) return bad(join(where_, key), "is longer than 256 bytes");
    return s;
  }

  Status bad(const std::string& path, const std::string& what) const {
    return invalid_argument(what_ + ": field '" + path + "' " + what);
  }

 private:
  static std::string type_of(const json& j) { return j.type_name(); }
  static std::string shown(const json& j) {
    std::string s = j.dump();
    if (s.size() > 40) s = s.substr(0, 40) + "...";
    return s;
  }
  const json& obj_;
  std::string what_, where_;
};

}  // namespace

Result<JobSummary> summary_from_stats(const json& stats, const std::string& job, const std::string& user,
                                      const std::string& host, int64_t stopped_unix) {
  if (!stats.is_object()) return invalid_argument("the daemon's stats are not a JSON object");
  const std::string what = "the daemon's stats";
  Reader root(stats, what);
  if (!stats.contains("usage"))
    return invalid_argument(what + " have no 'usage' (a cairnd older than this cairn tool?): no job summary");
  JobSummary s;
  s.job = job;
  s.user = user;
  s.host = host;
  s.stopped_unix = stopped_unix;
  CAIRN_ASSIGN_OR_RETURN(const Reader usage, root.object("usage"));
  int64_t started_ns = 0;
  CAIRN_ASSIGN_OR_RETURN(started_ns, usage.seconds("started_unix_ns"));
  s.started_unix = started_ns / 1000000000;
  CAIRN_ASSIGN_OR_RETURN(s.models_committed, usage.count("models_committed"));
  CAIRN_ASSIGN_OR_RETURN(s.models_loaded, usage.count("models_opened"));
  CAIRN_ASSIGN_OR_RETURN(s.requests, usage.count("requests"));
  uint64_t wait_ns = 0;
  CAIRN_ASSIGN_OR_RETURN(wait_ns, usage.count("request_wait_ns"));
  s.wait_seconds = static_cast<double>(wait_ns) / 1e9;
  CAIRN_ASSIGN_OR_RETURN(const Reader committed, usage.object("committed_bytes"));
  CAIRN_ASSIGN_OR_RETURN(s.stored_bytes, committed.count("stored"));
  CAIRN_ASSIGN_OR_RETURN(s.deduplicated_bytes, committed.count("deduplicated"));
  CAIRN_ASSIGN_OR_RETURN(s.inherited_bytes, committed.count("inherited"));
  CAIRN_ASSIGN_OR_RETURN(const Reader leased, usage.object("leased_bytes"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_dram, leased.count("dram"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_nvme, leased.count("nvme"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_peers, leased.count("peer"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_repository, leased.count("repository"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_other, leased.count("other"));
  CAIRN_ASSIGN_OR_RETURN(const Reader tiers, root.object("tiers"));
  CAIRN_ASSIGN_OR_RETURN(const Reader pfs, tiers.object("pfs"));
  CAIRN_ASSIGN_OR_RETURN(s.repository_read_bytes, pfs.count("bytes_out"));
  CAIRN_ASSIGN_OR_RETURN(const Reader prefetch, root.object("prefetch"));
  CAIRN_ASSIGN_OR_RETURN(s.prefetched_bytes, prefetch.count("bytes_staged"));
  return s;
}

std::string summary_to_json(const JobSummary& s) {
  ordered_json j;
  j["format"] = JobSummary::kFormat;
  j["version"] = JobSummary::kVersion;
  j["job"] = s.job;
  j["user"] = s.user;
  j["host"] = s.host;
  j["started_unix"] = s.started_unix;
  j["stopped_unix"] = s.stopped_unix;
  j["models"] = ordered_json{{"committed", s.models_committed}, {"loaded", s.models_loaded}};
  j["committed_bytes"] = ordered_json{
      {"stored", s.stored_bytes}, {"deduplicated", s.deduplicated_bytes}, {"inherited", s.inherited_bytes}};
  j["loaded_bytes"] = ordered_json{{"dram", s.loaded_from_dram},
                                   {"nvme", s.loaded_from_nvme},
                                   {"peers", s.loaded_from_peers},
                                   {"repository", s.loaded_from_repository},
                                   {"other", s.loaded_from_other}};
  j["repository_read_bytes"] = s.repository_read_bytes;
  j["prefetched_bytes"] = s.prefetched_bytes;
  j["requests"] = s.requests;
  j["wait_seconds"] = s.wait_seconds;
  return j.dump(2) + "\n";
}

Result<JobSummary> parse_job_summary(std::string_view text, const std::string& source) {
  const std::string what = "job summary " + source;
  if (text.size() > kMaxSummaryBytes)
    return invalid_argument(what + ": " + std::to_string(text.size()) + " bytes, more than a job summary can be (" +
                            std::to_string(kMaxSummaryBytes) + ")");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(what + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(what + ": must be a JSON object, not " + std::string(j.type_name()));
  Reader root(j, what);
  if (auto st = root.exactly({"format", "version", "job", "user", "host", "started_unix", "stopped_unix", "models",
                              "committed_bytes", "loaded_bytes", "repository_read_bytes", "prefetched_bytes",
                              "requests", "wait_seconds"});
      !st.ok())
    return st;
  std::string format;
  CAIRN_ASSIGN_OR_RETURN(format, root.text("format", false));
  if (format != JobSummary::kFormat)
    return root.bad("format", "is '" + format + "', not '" + JobSummary::kFormat + "'");
  uint64_t version = 0;
  CAIRN_ASSIGN_OR_RETURN(version, root.count("version"));
  if (version != static_cast<uint64_t>(JobSummary::kVersion))
    return root.bad("version", "is " + std::to_string(version) + "; this cairn reads version " +
                                   std::to_string(JobSummary::kVersion));
  JobSummary s;
  CAIRN_ASSIGN_OR_RETURN(s.job, root.text("job", false));
  CAIRN_ASSIGN_OR_RETURN(s.user, root.text("user", false));
  CAIRN_ASSIGN_OR_RETURN(s.host, root.text("host", true));
  CAIRN_ASSIGN_OR_RETURN(s.started_unix, root.seconds("started_unix"));
  CAIRN_ASSIGN_OR_RETURN(s.stopped_unix, root.seconds("stopped_unix"));
  if (s.stopped_unix < s.started_unix) return root.bad("stopped_unix", "is before started_unix");
  CAIRN_ASSIGN_OR_RETURN(const Reader models, root.object("models"));
  if (auto st = models.exactly({"committed", "loaded"}); !st.ok()) return st;
  CAIRN_ASSIGN_OR_RETURN(s.models_committed, models.count("committed"));
  CAIRN_ASSIGN_OR_RETURN(s.models_loaded, models.count("loaded"));
  CAIRN_ASSIGN_OR_RETURN(const Reader committed, root.object("committed_bytes"));
  if (auto st = committed.exactly({"stored", "deduplicated", "inherited"}); !st.ok()) return st;
  CAIRN_ASSIGN_OR_RETURN(s.stored_bytes, committed.count("stored"));
  CAIRN_ASSIGN_OR_RETURN(s.deduplicated_bytes, committed.count("deduplicated"));
  CAIRN_ASSIGN_OR_RETURN(s.inherited_bytes, committed.count("inherited"));
  CAIRN_ASSIGN_OR_RETURN(const Reader loaded, root.object("loaded_bytes"));
  if (auto st = loaded.exactly({"dram", "nvme", "peers", "repository", "other"}); !st.ok()) return st;
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_dram, loaded.count("dram"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_nvme, loaded.count("nvme"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_peers, loaded.count("peers"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_repository, loaded.count("repository"));
  CAIRN_ASSIGN_OR_RETURN(s.loaded_from_other, loaded.count("other"));
  CAIRN_ASSIGN_OR_RETURN(s.repository_read_bytes, root.count("repository_read_bytes"));
  CAIRN_ASSIGN_OR_RETURN(s.prefetched_bytes, root.count("prefetched_bytes"));
  CAIRN_ASSIGN_OR_RETURN(s.requests, root.count("requests"));
  CAIRN_ASSIGN_OR_RETURN(s.wait_seconds, root.duration("wait_seconds"));
  return s;
}

std::string summary_table(const JobSummary& s) {
  std::string out;
  auto row = [&](const std::string& label, const std::string& value) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "  %-34s %s\n", label.c_str(), value.c_str());
    out += buf;
  };
  auto pct = [](uint64_t part, uint64_t whole) {
    if (whole == 0) return std::string();
    char buf[32];
    std::snprintf(buf, sizeof buf, " (%.0f%%)", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
    return std::string(buf);
  };
  out += "cairn job " + s.job + " (user " + s.user + (s.host.empty() ? "" : ", host " + s.host) + ")\n";
  out += "daemon from " + utc(s.started_unix) + " to " + utc(s.stopped_unix) + "\n";
  row("models committed", std::to_string(s.models_committed));
  row("models loaded", std::to_string(s.models_loaded));
  const uint64_t committed = s.stored_bytes + s.not_written_bytes();
  row("bytes committed", human_bytes(committed));
  row("  stored (new chunks)", human_bytes(s.stored_bytes) + pct(s.stored_bytes, committed));
  row("  not written: deduplicated", human_bytes(s.deduplicated_bytes) + pct(s.deduplicated_bytes, committed));
  row("  not written: inherited", human_bytes(s.inherited_bytes) + pct(s.inherited_bytes, committed));
  const uint64_t loaded = s.loaded_bytes();
  row("bytes loaded by the job", human_bytes(loaded));
  row("  served from DRAM", human_bytes(s.loaded_from_dram) + pct(s.loaded_from_dram, loaded));
  row("  served from NVMe", human_bytes(s.loaded_from_nvme) + pct(s.loaded_from_nvme, loaded));
  row("  served from peers", human_bytes(s.loaded_from_peers) + pct(s.loaded_from_peers, loaded));
  row("  read from the repository", human_bytes(s.loaded_from_repository) + pct(s.loaded_from_repository, loaded));
  if (s.loaded_from_other)
    row("  served from elsewhere", human_bytes(s.loaded_from_other) + pct(s.loaded_from_other, loaded));
  row("repository bytes read in all", human_bytes(s.repository_read_bytes) + " (prefetch included)");
  row("bytes prefetched", human_bytes(s.prefetched_bytes));
  char wait[96];
  std::snprintf(wait, sizeof wait, "%.3f s over %llu requests", s.wait_seconds,
                static_cast<unsigned long long>(s.requests));
  row("time processes waited on cairn", wait);
  return out;
}

std::string summary_line(const JobSummary& s) {
  char wait[64];
  std::snprintf(wait, sizeof wait, "%.3f s", s.wait_seconds);
  auto models = [](uint64_t n) { return std::to_string(n) + (n == 1 ? " model" : " models"); };
  return "summary: " + models(s.models_committed) + " committed (" + human_bytes(s.stored_bytes) + " stored, " +
         human_bytes(s.deduplicated_bytes) + " deduplicated, " + human_bytes(s.inherited_bytes) +
         " inherited: not written), " + models(s.models_loaded) + " loaded (" + human_bytes(s.loaded_bytes()) + ": " +
         human_bytes(s.loaded_from_dram) + " from DRAM, " + human_bytes(s.loaded_from_nvme) + " from NVMe, " +
         human_bytes(s.loaded_from_peers) + " from peers, " + human_bytes(s.loaded_from_repository) +
         " from the repository), " + human_bytes(s.repository_read_bytes) +
         " read from the repository in all, processes waited " + wait + " over " + std::to_string(s.requests) +
         " requests; `cairn job summary " + s.job + "` shows it";
}

}  // namespace cairn::tool
