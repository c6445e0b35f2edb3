// Tests for the engine's metrics (engine_metrics.cpp, request_metrics.cpp) and the metrics exporter
// (metrics_exporter.cpp, metrics_http.cpp): what a scrape says before and after a commit and a
// read, the HTTP endpoint's answers, the textfile, and the startup errors that name their key.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/metrics_exporter.hpp"
#include "unit/daemon/engine_util.hpp"

namespace cairn {
namespace {

using namespace engine_test;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The value of the sample `series` (name and labels exactly as written) in an exposition; -1 when
// there is none.
double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One HTTP exchange on a new connection to 127.0.0.1:port: sends `request` as is, returns all
// that comes back until the server closes.
std::string http(uint16_t port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::string get(uint16_t port, const std::string& path, const std::string& headers = "") {
  return http(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + headers + "\r\n");
}

TEST_CASE("metrics: off by default, and the stats families are rendered on request all the same", "[metrics]") {
  TempDir dir;
  auto e = make_engine(dir.repo());
  CHECK(e->metrics_exporter() == nullptr);
  const std::string text = e->metrics_text(metrics::Format::kPrometheus);
  CHECK(contains(text, "# TYPE cairn_dram_hits_total counter\n"));
  CHECK(sample(text, "cairn_dram_capacity_bytes") == static_cast<double>(e->dram().stats().capacity_bytes));
  CHECK(contains(text, "cairn_build_info{version=\""));
  // No request is recorded while metrics are off.
  CHECK_FALSE(contains(text, "cairn_request_duration_seconds_bucket"));
  CHECK_FALSE(contains(text, "# EOF"));
  CHECK(contains(e->metrics_text(metrics::Format::kOpenMetrics), "\n# EOF\n"));
}

TEST_CASE("metrics: a commit and a read move the counters, the latency histograms and commits by durability",
          "[metrics]") {
  TempDir dir;
  const std::string textfile = dir.path + "/cairn.prom";
  auto e = make_engine(dir.repo(), [&](Config& c) { c.metrics.textfile = textfile; });
  REQUIRE(e->metrics_exporter() != nullptr);
  CHECK(e->metrics_exporter()->port() == 0);  // no endpoint
  Session s;
  ok(*e, s, {{"op", "hello"}});
  const std::string before = e->metrics_text(metrics::Format::kPrometheus);
  CHECK(sample(before, "cairn_dram_hits_total") == 0);
  CHECK(sample(before, "cairn_commits_total{durability=\"global\"}") == 0);

  const auto bytes = pattern(3 * kChunk + 100, 1);
  commit_inline(*e, s, "m1", "", {{"w", bytes}});
  commit_inline(*e, s, "m2", "", {{"w", pattern(100, 2)}}, {}, "memory");
  CHECK(read_tensor(*e, s, "m1", "w") == bytes);
  fails(*e, s, {{"op", "open"}, {"id", "nope"}}, StatusCode::kNotFound);
  e->drain();

  const std::string after = e->metrics_text(metrics::Format::kPrometheus);
  INFO(after);
  CHECK(sample(after, "cairn_dram_hits_total") >= 4);  // the 4 chunks of m1
  CHECK(sample(after, "cairn_dram_admitted_bytes_total") >= static_cast<double>(bytes.size()));
  CHECK(sample(after, "cairn_repository_written_bytes_total") >= static_cast<double>(bytes.size()));
  CHECK(sample(after, "cairn_repository_read_bytes_total") == 0);  // served from DRAM
  CHECK(sample(after, "cairn_repository_models") == 2);
  CHECK(sample(after, "cairn_commits_total{durability=\"global\"}") == 1);
  CHECK(sample(after, "cairn_commits_total{durability=\"memory\"}") == 1);
  CHECK(sample(after, "cairn_commits_total{durability=\"local\"}") == 0);
  CHECK(sample(after, "cairn_request_duration_seconds_count{op=\"commit\"}") == 2);
  CHECK(sample(after, "cairn_request_duration_seconds_bucket{op=\"commit\",le=\"+Inf\"}") == 2);
  CHECK(sample(after, "cairn_request_duration_seconds_sum{op=\"commit\"}") > 0);
  CHECK(sample(after, "cairn_request_duration_seconds_count{op=\"lease\"}") == 1);
  CHECK(sample(after, "cairn_request_duration_seconds_count{op=\"open\"}") == 1);
  CHECK(sample(after, "cairn_request_errors_total{op=\"open\",code=\"not_found\"}") == 1);
  CHECK_FALSE(contains(after, "cairn_request_errors_total{op=\"commit\""));
  // Buckets are cumulative.
  double last = 0;
  for (double b : metrics::LatencyHistogram::kBounds) {
    std::string le = metrics::format_value(b);
    if (le.find_first_of(".e") == std::string::npos) le += ".0";
    const double v = sample(after, "cairn_request_duration_seconds_bucket{op=\"commit\",le=\"" + le + "\"}");
    CHECK(v >= last);
    last = v;
  }
  CHECK(last <= 2);
  // An unknown op is counted as one.
  fails(*e, s, {{"op", "frobnicate"}}, StatusCode::kInvalidArgument);
  const std::string later = e->metrics_text(metrics::Format::kPrometheus);
  CHECK(sample(later, "cairn_request_errors_total{op=\"unknown\",code=\"invalid_argument\"}") == 1);

  // The textfile was written at start, in Prometheus text; it is removed when the engine stops.
  const std::string file = read_file(textfile);
  CHECK(contains(file, "# TYPE cairn_dram_hits_total counter\n"));
  CHECK_FALSE(contains(file, "# EOF"));
  e.reset();
  CHECK_FALSE(std::filesystem::exists(textfile));
}

TEST_CASE("metrics: the textfile is rewritten every interval, by rename", "[metrics]") {
  TempDir dir;
  const std::string textfile = dir.path + "/cairn.prom";
  auto e = make_engine(dir.repo(), [&](Config& c) {
    c.metrics.textfile = textfile;
    c.metrics.interval = "50ms";
  });
  Session s;
  commit_inline(*e, s, "m1", "", {{"w", pattern(1000, 3)}});
  // Within a few intervals the file shows the commit.
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    seen = sample(read_file(textfile), "cairn_commits_total{durability=\"global\"}") == 1;
    if (!seen) ::usleep(10000);
  }
  CHECK(seen);
  // A reader never sees part of a file: every read while it is rewritten is complete.
  for (int i = 0; i < 50; ++i) {
    const std::string text = read_file(textfile);
    REQUIRE(contains(text, "# TYPE cairn_build_info gauge\n"));
    REQUIRE(sample(text, "cairn_commits_total{durability=\"global\"}") == 1);
    ::usleep(7000);
  }
  // Stopped, it leaves nothing behind: neither the file nor a temporary one.
  e->metrics_exporter()->stop();
  for (const auto& entry : std::filesystem::directory_iterator(dir.path))
    CHECK(entry.path().filename().string().rfind("cairn.prom", 0) == std::string::npos);
}

TEST_CASE("metrics: the HTTP endpoint serves GET /metrics and refuses the rest", "[metrics]") {
  TempDir dir;
  auto e = make_engine(dir.repo(), [](Config& c) { c.metrics.listen = "127.0.0.1:0"; });
  REQUIRE(e->metrics_exporter() != nullptr);
  const uint16_t port = e->metrics_exporter()->port();
  REQUIRE(port != 0);

  std::string r = get(port, "/metrics");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(contains(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  CHECK(contains(r, "# TYPE cairn_dram_hits_total counter\n"));
  CHECK_FALSE(contains(r, "# EOF"));
  // A query string is ignored.
  CHECK(get(port, "/metrics?x=1").rfind("HTTP/1.1 200 OK\r\n", 0) == 0);

  r = get(port, "/metrics", "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(contains(r, "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"));
  CHECK(contains(r, "# TYPE cairn_dram_hits counter\n"));
  CHECK(r.size() >= 6);
  CHECK(r.substr(r.size() - 6) == "# EOF\n");

  CHECK(get(port, "/").rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
  CHECK(get(port, "/metrics/x").rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
  r = http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi");
  CHECK(r.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
  CHECK(contains(r, "Allow: GET\r\n"));
  CHECK(http(port, "DELETE /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 405 Method Not Allowed\r\n", 0) == 0);
  CHECK(http(port, "this is not http\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);

  // Two requests on one kept-alive connection.
  r = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(contains(r, "HTTP/1.1 404 Not Found\r\n"));

  // Requests to the engine show in the next scrape.
  Session s;
  ok(*e, s, {{"op", "ping"}});
  CHECK(sample(get(port, "/metrics"), "cairn_request_duration_seconds_count{op=\"ping\"}") == 1);
}

TEST_CASE("metrics: an address in use or a textfile that cannot be written fails at start, naming the key",
          "[metrics]") {
  TempDir dir;
  // Hold a port.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  Config c;
  c.repository = dir.repo();
  c.tiers.dram.capacity = kArenaBytes;
  c.metrics.listen = taken;
  auto r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  INFO(r.status().to_string());
  CHECK(r.status().message().rfind("metrics.listen: cannot listen on '" + taken + "': ", 0) == 0);
  CHECK(contains(r.status().message(), "in use"));
  ::close(fd);

  c.metrics.listen = "";
  c.metrics.textfile = dir.path + "/no/such/dir/cairn.prom";
  r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().rfind("metrics.textfile: ", 0) == 0);
  CHECK(contains(r.status().message(), "no/such/dir"));

  // A config built in code is checked as a config file would be.
  c.metrics.textfile = dir.path + "/cairn.prom";
  c.metrics.interval = "0";
  r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "metrics.interval: '0' is not a positive duration (such as 500ms, 10s or 2m)");
  c.metrics.interval = "15s";
  c.metrics.listen = "localhost";
  r = Engine::create(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().rfind("metrics.listen: 'localhost' has no port", 0) == 0);
}

}  // namespace
}  // namespace cairn
