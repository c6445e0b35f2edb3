// The node settings of the job lifecycle (tools/job_node.hpp), on a stand-in for sysfs named by
// the CAIRN_TEST_SYSFS_ROOT test hook: applied by the first job, kept while another job runs,
// restored by the last, and the state file read strictly.
#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/job_node.hpp"
#include "unit/temp_dir.hpp"

namespace cairn::tool {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// A temporary sysfs with shmem_enabled at `never`, named by CAIRN_TEST_SYSFS_ROOT while it lives,
// and a job_dir beside it.
struct FakeNode {
  testing::TempDir dir{"cairn-test-node"};
  std::string job_dir = dir.path + "/run";
  std::string file = dir.path + "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
  FakeNode() {
    std::filesystem::create_directories(dir.path + "/sys/kernel/mm/transparent_hugepage");
    std::filesystem::create_directories(job_dir);
    write(file, "always within_size advise [never] deny force\n");
    ::setenv("CAIRN_TEST_SYSFS_ROOT", (dir.path + "/sys").c_str(), 1);
  }
  ~FakeNode() { ::unsetenv("CAIRN_TEST_SYSFS_ROOT"); }
  std::string value() const {
    std::string v = read(file);
    while (!v.empty() && v.back() == '\n') v.pop_back();
    return v;
  }
  std::string state() const { return job_dir + "/node-settings.json"; }
  bool has_state() const { return std::filesystem::exists(state()); }
};

bool none_running(const std::string&) { return false; }

TEST_CASE("node settings: the test hook names the file; the first job applies, the last restores", "[job_node]") {
  FakeNode node;
  CHECK(shmem_thp_path() == node.file);
  auto a = apply_node_settings(node.job_dir, "100", "advise");
  REQUIRE(a.ok());
  CHECK(*a == "node: shmem_enabled set to 'advise' (was 'never'; " + node.file + ")");
  CHECK(node.value() == "advise");
  struct stat st {};
  REQUIRE(::stat(node.state().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto b = apply_node_settings(node.job_dir, "101", "advise");
  REQUIRE(b.ok());
  CHECK(b->find("is 'advise' already") != std::string::npos);
  auto state = parse_node_state(read(node.state()), node.state());
  REQUIRE(state.ok());
  CHECK(state->previous == "never");
  CHECK(state->applied == "advise");
  CHECK(state->jobs == std::vector<std::string>{"100", "101"});

  // Job 100 ends while 101 runs: the setting stays.
  auto r = restore_node_settings(node.job_dir, "100", [](const std::string& j) { return j == "101"; });
  REQUIRE(r.ok());
  CHECK(r->find("stays 'advise' for 1 other cairn job") != std::string::npos);
  CHECK(node.value() == "advise");
  // Job 101 ends last: restored, state gone.
  r = restore_node_settings(node.job_dir, "101", none_running);
  REQUIRE(r.ok());
  CHECK(*r == "node: shmem_enabled restored to 'never' (" + node.file + ")");
  CHECK(node.value() == "never");
  CHECK_FALSE(node.has_state());
  // Nothing applied: nothing to say.
  r = restore_node_settings(node.job_dir, "102", none_running);
  REQUIRE(r.ok());
  CHECK(r->empty());
  // Empty wanted: nothing done.
  auto none = apply_node_settings(node.job_dir, "103", "");
  REQUIRE(none.ok());
  CHECK(none->empty());
  CHECK_FALSE(node.has_state());
}

TEST_CASE("node settings: a job whose epilog never ran does not keep the setting forever", "[job_node]") {
  FakeNode node;
  REQUIRE(apply_node_settings(node.job_dir, "200", "advise").ok());
  // Another job's epilog (one that applied nothing) finds 200 gone: the node goes back.
  auto r = restore_node_settings(node.job_dir, "201", none_running);
  REQUIRE(r.ok());
  CHECK(r->find("restored to 'never'") != std::string::npos);
  CHECK(node.value() == "never");
}

TEST_CASE("node settings: a value someone changed since is left alone", "[job_node]") {
  FakeNode node;
  REQUIRE(apply_node_settings(node.job_dir, "300", "advise").ok());
  write(node.file, "[always] within_size advise never deny force\n");
  auto r = restore_node_settings(node.job_dir, "300", none_running);
  REQUIRE(r.ok());
  CHECK(r->find("is 'always', not the 'advise' cairn applied") != std::string::npos);
  CHECK(node.value() == "[always] within_size advise never deny force");
  CHECK_FALSE(node.has_state());
}

TEST_CASE("node settings: a setting already as asked is recorded and left as it was", "[job_node]") {
  FakeNode node;
  write(node.file, "always within_size [advise] never deny force\n");
  auto a = apply_node_settings(node.job_dir, "400", "advise");
  REQUIRE(a.ok());
  CHECK(a->find("already") != std::string::npos);
  auto r = restore_node_settings(node.job_dir, "400", none_running);
  REQUIRE(r.ok());
  CHECK(r->find("stays 'advise' (it was so before") != std::string::npos);
  CHECK(node.value() == "always within_size [advise] never deny force");
}

TEST_CASE("node settings: a missing or unreadable setting and a garbage state are errors naming the file",
          "[job_node]") {
  FakeNode node;
  write(node.file, "no choice here\n");
  auto a = apply_node_settings(node.job_dir, "500", "advise");
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find(node.file) != std::string::npos);
  CHECK(a.status().message().find("no selected value") != std::string::npos);
  CHECK_FALSE(node.has_state());
  std::filesystem::remove(node.file);
  a = apply_node_settings(node.job_dir, "500", "advise");
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("does not exist") != std::string::npos);

  write(node.file, "always within_size advise [never] deny force\n");
  write(node.state(), "{\"previous\": \"never\"");
  a = apply_node_settings(node.job_dir, "501", "advise");
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find(node.state()) != std::string::npos);
  CHECK(node.value() == "always within_size advise [never] deny force");  // not touched
  auto r = restore_node_settings(node.job_dir, "501", none_running);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("not valid JSON") != std::string::npos);
}

TEST_CASE("node settings: the state file is parsed strictly", "[job_node]") {
  auto bad = [](const std::string& text, const std::string& needle) {
    auto r = parse_node_state(text, "state.json");
    INFO(text);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK(r.status().message().find("state.json") != std::string::npos);
    CHECK(r.status().message().find(needle) != std::string::npos);
  };
  bad("", "not valid JSON");
  bad("[]", "must be a JSON object");
  bad(R"({"previous": "never", "applied": "advise"})", "'jobs' is missing");
  bad(R"({"previous": "never", "jobs": []})", "'applied' is missing");
  bad(R"({"previous": "sometimes", "applied": "advise", "jobs": []})", "'previous' must be one of");
  bad(R"({"previous": "never", "applied": 1, "jobs": []})", "'applied' must be one of");
  bad(R"({"previous": "never", "applied": "advise", "jobs": "1"})", "'jobs' must be an array");
  bad(R"({"previous": "never", "applied": "advise", "jobs": [""]})", "not a job id");
  bad(R"({"previous": "never", "applied": "advise", "jobs": [7]})", "not a job id");
  bad(R"({"previous": "never", "applied": "advise", "jobs": [], "extra": 1})", "unknown field 'extra'");
  auto ok = parse_node_state(R"({"previous": "never", "applied": "advise", "jobs": ["1", "2"]})", "s");
  REQUIRE(ok.ok());
  CHECK(ok->jobs.size() == 2);
  CHECK(parse_node_state(node_state_to_json(*ok), "s").ok());
}

TEST_CASE("node settings: prologs and epilogs of many jobs at once end with the node restored", "[job_node]") {
  FakeNode node;
  std::mutex mu;
  std::set<std::string> running;      // jobs between their prolog and their epilog
  std::vector<std::string> failures;  // Catch's assertions are not for several threads at once
  auto failed = [&](const std::string& what) {
    std::lock_guard lock(mu);
    failures.push_back(what);
  };
  std::vector<std::thread> jobs;
  for (int t = 0; t < 8; ++t) {
    jobs.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) {
        const std::string id = std::to_string(t) + "." + std::to_string(k);
        {
          std::lock_guard lock(mu);
          running.insert(id);
        }
        auto a = apply_node_settings(node.job_dir, id, "advise");
        if (!a.ok()) failed(id + " apply: " + a.status().message());
        // This job runs: the setting holds.
        if (std::string v = node.value(); v != "advise") failed(id + " ran with '" + v + "'");
        auto r = restore_node_settings(node.job_dir, id, [&](const std::string& j) {
          std::lock_guard lock(mu);
          return running.count(j) > 0 && j != id;
        });
        if (!r.ok()) failed(id + " restore: " + r.status().message());
        std::lock_guard lock(mu);
        running.erase(id);
      }
    });
  }
  for (auto& j : jobs) j.join();
  CHECK(failures == std::vector<std::string>{});
  CHECK(node.value() == "never");
  CHECK_FALSE(node.has_state());
}

}  // namespace
}  // namespace cairn::tool
