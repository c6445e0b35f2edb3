// The job summary (tools/job_summary.hpp): built from a daemon's stats, written and read back, and
// garbage rejected with the field that was wrong.
#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/job_summary.hpp"

namespace cairn::tool {
namespace {

using nlohmann::json;

// The parts of a `stats` response a summary reads (docs/protocol.md), plus some it ignores.
json stats_response() {
  return json::parse(R"({
    "usage": {"requests": 42, "request_wait_ns": 1500000000, "models_committed": 3, "models_opened": 2,
              "committed_bytes": {"stored": 1000, "deduplicated": 300, "inherited": 200},
              "leased_bytes": {"dram": 700, "nvme": 50, "peer": 25, "repository": 125, "other": 0},
              "started_unix_ns": 1700000000123456789},
    "tiers": {"pfs": {"bytes_out": 4096, "bytes_in": 9}, "dram": {"hits": 3}},
    "prefetch": {"bytes_staged": 512, "hints": 1},
    "watchdog": {"in_flight": 1}
  })");
}

JobSummary sample() {
  auto s = summary_from_stats(stats_response(), "1234", "alice", "node7", 1700000100);
  REQUIRE(s.ok());
  return *s;
}

TEST_CASE("job summary: built from stats, written as JSON and read back the same", "[job_summary]") {
  JobSummary s = sample();
  CHECK(s.started_unix == 1700000000);
  CHECK(s.models_committed == 3);
  CHECK(s.models_loaded == 2);
  CHECK(s.not_written_bytes() == 500);
  CHECK(s.loaded_bytes() == 900);
  CHECK(s.loaded_from_peers == 25);
  CHECK(s.repository_read_bytes == 4096);
  CHECK(s.prefetched_bytes == 512);
  CHECK(s.requests == 42);
  CHECK(s.wait_seconds == Approx(1.5));

  const std::string text = summary_to_json(s);
  json j = json::parse(text);
  CHECK(j["format"] == "cairn-job-summary");
  CHECK(j["version"] == 1);
  CHECK(j["loaded_bytes"]["peers"] == 25);
  auto back = parse_job_summary(text, "f.json");
  REQUIRE(back.ok());
  CHECK(summary_to_json(*back) == text);

  const std::string table = summary_table(s);
  CHECK(table.find("cairn job 1234 (user alice, host node7)") != std::string::npos);
  CHECK(table.find("models committed") != std::string::npos);
  CHECK(table.find("1.500 s over 42 requests") != std::string::npos);
  CHECK(table.find("served from DRAM") != std::string::npos);
  CHECK(summary_line(s).find("3 models committed") != std::string::npos);
  CHECK(summary_line(s).find("`cairn job summary 1234`") != std::string::npos);
}

TEST_CASE("job summary: stats without usage or with a malformed field give no summary", "[job_summary]") {
  json no_usage = stats_response();
  no_usage.erase("usage");
  auto r = summary_from_stats(no_usage, "1", "u", "h", 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("'usage'") != std::string::npos);

  json bad = stats_response();
  bad["usage"]["leased_bytes"]["nvme"] = -1;
  r = summary_from_stats(bad, "1", "u", "h", 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("usage.leased_bytes.nvme") != std::string::npos);

  bad = stats_response();
  bad["tiers"].erase("pfs");
  r = summary_from_stats(bad, "1", "u", "h", 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("tiers.pfs") != std::string::npos);
}

// Parses `text` and requires a failure whose message names `needle`.
void rejected(const std::string& text, const std::string& needle) {
  auto r = parse_job_summary(text, "/run/cairn/9.summary.json");
  INFO(text);
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("/run/cairn/9.summary.json") != std::string::npos);
  CHECK(r.status().message().find(needle) != std::string::npos);
}

// The sample's JSON with one change made by `edit`.
std::string edited(const std::function<void(json&)>& edit) {
  json j = json::parse(summary_to_json(sample()));
  edit(j);
  return j.dump();
}

TEST_CASE("job summary: garbage is rejected naming what was wrong", "[job_summary]") {
  rejected("", "not valid JSON");
  rejected("{\"format\": \"cairn-job-summary\"", "not valid JSON");
  rejected(summary_to_json(sample()) + "x", "not valid JSON");
  rejected("[1, 2]", "must be a JSON object");
  rejected(std::string(70000, ' '), "more than a job summary can be");
  rejected(edited([](json& j) { j["format"] = "something-else"; }), "field 'format'");
  rejected(edited([](json& j) { j["version"] = 2; }), "field 'version' is 2");
  rejected(edited([](json& j) { j.erase("requests"); }), "field 'requests' is missing");
  rejected(edited([](json& j) { j["colour"] = "red"; }), "field 'colour' is not a field");
  rejected(edited([](json& j) { j["models"]["deleted"] = 1; }), "field 'models.deleted' is not a field");
  rejected(edited([](json& j) { j["models"].erase("loaded"); }), "field 'models.loaded' is missing");
  rejected(edited([](json& j) { j["models"] = 3; }), "field 'models' must be an object");
  rejected(edited([](json& j) { j["loaded_bytes"]["dram"] = -5; }),
           "field 'loaded_bytes.dram' must be a non-negative integer");
  rejected(edited([](json& j) { j["loaded_bytes"]["nvme"] = 1.5; }),
           "field 'loaded_bytes.nvme' must be a non-negative integer");
  rejected(edited([](json& j) { j["committed_bytes"]["stored"] = "12"; }), "field 'committed_bytes.stored'");
  rejected(edited([](json& j) { j["wait_seconds"] = -0.5; }), "field 'wait_seconds'");
  rejected(edited([](json& j) { j["wait_seconds"] = "slow"; }), "field 'wait_seconds'");
  rejected(edited([](json& j) { j["job"] = ""; }), "field 'job' must not be empty");
  rejected(edited([](json& j) { j["user"] = 7; }), "field 'user' must be a string");
  rejected(edited([](json& j) { j["started_unix"] = -1; }), "field 'started_unix'");
  rejected(edited([](json& j) { j["stopped_unix"] = 5; }), "field 'stopped_unix' is before started_unix");
}

}  // namespace
}  // namespace cairn::tool
