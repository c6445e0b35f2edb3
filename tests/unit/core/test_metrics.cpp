// Tests for core/metrics: the text exposition encoder (headers in both formats, escaping, counter
// and gauge samples, histograms with cumulative buckets, +Inf, _count and _sum, # EOF), content
// negotiation, and the lock-free latency histogram.
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/metrics.hpp"

namespace cairn::metrics {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Family kHits{"cairn_dram_hits", Type::kCounter, "", "Chunk reads served from the DRAM tier"};
constexpr Family kUsed{"cairn_dram_used_bytes", Type::kGauge, "bytes", "Bytes the DRAM tier holds"};
constexpr Family kLatency{"cairn_request_duration_seconds", Type::kHistogram, "seconds", "Request latency"};

TEST_CASE("metrics: a counter's header names its sample in Prometheus text, its family in OpenMetrics", "[metrics]") {
  std::string prom;
  append_header(prom, Format::kPrometheus, kHits);
  append_sample(prom, kHits, {}, uint64_t{42});
  CHECK(prom ==
        "# HELP cairn_dram_hits_total Chunk reads served from the DRAM tier\n"
        "# TYPE cairn_dram_hits_total counter\n"
        "cairn_dram_hits_total 42\n");
  std::string om;
  append_header(om, Format::kOpenMetrics, kHits);
  append_sample(om, kHits, {}, uint64_t{42});
  append_eof(om, Format::kOpenMetrics);
  CHECK(om ==
        "# HELP cairn_dram_hits Chunk reads served from the DRAM tier\n"
        "# TYPE cairn_dram_hits counter\n"
        "cairn_dram_hits_total 42\n"
        "# EOF\n");
}

TEST_CASE("metrics: a gauge with a unit gets a UNIT line in OpenMetrics only", "[metrics]") {
  const Label job[] = {{"job_id", "1234"}};
  std::string prom;
  append_header(prom, Format::kPrometheus, kUsed);
  append_sample(prom, kUsed, job, uint64_t{1} << 40);
  append_eof(prom, Format::kPrometheus);  // nothing in Prometheus text
  CHECK(prom ==
        "# HELP cairn_dram_used_bytes Bytes the DRAM tier holds\n"
        "# TYPE cairn_dram_used_bytes gauge\n"
        "cairn_dram_used_bytes{job_id=\"1234\"} 1099511627776\n");
  std::string om;
  append_header(om, Format::kOpenMetrics, kUsed);
  CHECK(om ==
        "# HELP cairn_dram_used_bytes Bytes the DRAM tier holds\n"
        "# TYPE cairn_dram_used_bytes gauge\n"
        "# UNIT cairn_dram_used_bytes bytes\n");
}

TEST_CASE("metrics: counters keep every digit of a 64-bit count", "[metrics]") {
  std::string out;
  append_sample(out, kHits, {}, UINT64_MAX);
  CHECK(out == "cairn_dram_hits_total 18446744073709551615\n");
}

TEST_CASE("metrics: label values escape backslash, double quote and line feed", "[metrics]") {
  CHECK(escape_label_value("plain-1.2_x") == "plain-1.2_x");
  CHECK(escape_label_value("a\\b") == "a\\\\b");
  CHECK(escape_label_value("say \"hi\"") == "say \\\"hi\\\"");
  CHECK(escape_label_value("two\nlines") == "two\\nlines");
  CHECK(escape_label_value("tab\there, UTF-8 \xc3\xa9") == "tab\there, UTF-8 \xc3\xa9");
  CHECK(escape_label_value("") == "");
  const Label labels[] = {{"job_id", "j\"1\\\n"}, {"op", "commit"}};
  std::string out;
  append_sample(out, kUsed, labels, uint64_t{7});
  CHECK(out == "cairn_dram_used_bytes{job_id=\"j\\\"1\\\\\\n\",op=\"commit\"} 7\n");
}

TEST_CASE("metrics: HELP text escapes backslash and line feed; OpenMetrics the double quote too", "[metrics]") {
  const Family f{"cairn_x", Type::kGauge, "", "a \\ b\nc \"d\""};
  std::string prom;
  append_header(prom, Format::kPrometheus, f);
  CHECK(prom == "# HELP cairn_x a \\\\ b\\nc \"d\"\n# TYPE cairn_x gauge\n");
  std::string om;
  append_header(om, Format::kOpenMetrics, f);
  CHECK(om == "# HELP cairn_x a \\\\ b\\nc \\\"d\\\"\n# TYPE cairn_x gauge\n");
}

TEST_CASE("metrics: values are written exactly and specials by their names", "[metrics]") {
  CHECK(format_value(0) == "0");
  CHECK(format_value(3) == "3");
  CHECK(format_value(0.25) == "0.25");
  CHECK(format_value(1e-05) == "1e-05");
  CHECK(format_value(1700000000.5) == "1700000000.5");
  CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_value(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  std::string out;
  append_sample(out, kUsed, {}, 0.5);
  CHECK(out == "cairn_dram_used_bytes 0.5\n");
}

TEST_CASE("metrics: a histogram's buckets are cumulative and end with +Inf, _count and _sum", "[metrics]") {
  HistogramSnapshot h;
  h.bounds = {0.001, 0.01, 1};
  h.counts = {2, 0, 3, 1};  // per bucket; the last: above every bound
  h.sum = 4.5;
  const Label labels[] = {{"op", "commit"}};
  std::string out;
  append_header(out, Format::kPrometheus, kLatency);
  append_histogram(out, kLatency, labels, h);
  CHECK(out ==
        "# HELP cairn_request_duration_seconds Request latency\n"
        "# TYPE cairn_request_duration_seconds histogram\n"
        "cairn_request_duration_seconds_bucket{op=\"commit\",le=\"0.001\"} 2\n"
        "cairn_request_duration_seconds_bucket{op=\"commit\",le=\"0.01\"} 2\n"
        "cairn_request_duration_seconds_bucket{op=\"commit\",le=\"1.0\"} 5\n"
        "cairn_request_duration_seconds_bucket{op=\"commit\",le=\"+Inf\"} 6\n"
        "cairn_request_duration_seconds_count{op=\"commit\"} 6\n"
        "cairn_request_duration_seconds_sum{op=\"commit\"} 4.5\n");
  // Without labels, `le` is the only one.
  std::string bare;
  append_histogram(bare, kLatency, {}, HistogramSnapshot{{2}, {0, 0}, 0});
  CHECK(bare ==
        "cairn_request_duration_seconds_bucket{le=\"2.0\"} 0\n"
        "cairn_request_duration_seconds_bucket{le=\"+Inf\"} 0\n"
        "cairn_request_duration_seconds_count 0\n"
        "cairn_request_duration_seconds_sum 0\n");
}

TEST_CASE("metrics: the OpenMetrics histogram header has its unit", "[metrics]") {
  std::string out;
  append_header(out, Format::kOpenMetrics, kLatency);
  CHECK(out ==
        "# HELP cairn_request_duration_seconds Request latency\n"
        "# TYPE cairn_request_duration_seconds histogram\n"
        "# UNIT cairn_request_duration_seconds seconds\n");
}

TEST_CASE("metrics: content types and negotiation", "[metrics]") {
  CHECK(content_type(Format::kPrometheus) == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(content_type(Format::kOpenMetrics) == "application/openmetrics-text; version=1.0.0; charset=utf-8");
  // What Prometheus 2.x sends.
  CHECK(negotiate("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                  "text/plain;version=0.0.4;q=0.5,*/*;q=0.1") == Format::kOpenMetrics);
  CHECK(negotiate("text/plain;version=0.0.4;q=0.9, application/openmetrics-text; version=1.0.0; q=0.5") ==
        Format::kOpenMetrics);
  CHECK(negotiate("") == Format::kPrometheus);
  CHECK(negotiate("*/*") == Format::kPrometheus);
  CHECK(negotiate("text/plain") == Format::kPrometheus);
  CHECK(negotiate("application/openmetrics-text;q=0") == Format::kPrometheus);
  CHECK(negotiate("application/openmetrics-text; q=0.0, text/plain") == Format::kPrometheus);
  CHECK(negotiate("application/openmetrics-textual") == Format::kPrometheus);
}

TEST_CASE("metrics: the latency histogram puts a duration in the first bucket whose bound it does not exceed",
          "[metrics]") {
  LatencyHistogram h;
  h.record(microseconds(50));              // <= 0.0001
  h.record(microseconds(100));             // == 0.0001: le is inclusive
  h.record(microseconds(101));             // <= 0.00025
  h.record(milliseconds(30));              // <= 0.05
  h.record(seconds(61));                   // above every bound
  h.record(std::chrono::nanoseconds(-5));  // a clock that went back counts as 0
  HistogramSnapshot s = h.snapshot();
  REQUIRE(s.bounds.size() == LatencyHistogram::kBounds.size());
  REQUIRE(s.counts.size() == s.bounds.size() + 1);
  auto count_at = [&](double bound) {
    for (size_t i = 0; i < s.bounds.size(); ++i)
      if (s.bounds[i] == bound) return s.counts[i];
    FAIL("no bound " << bound);
    return uint64_t{0};
  };
  CHECK(count_at(0.0001) == 3);
  CHECK(count_at(0.00025) == 1);
  CHECK(count_at(0.05) == 1);
  CHECK(s.counts.back() == 1);
  uint64_t total = 0;
  for (uint64_t c : s.counts) total += c;
  CHECK(total == 6);
  CHECK(s.sum == Approx(0.00005 + 0.0001 + 0.000101 + 0.03 + 61));
}

TEST_CASE("metrics: the latency histogram counts every record from many threads", "[metrics]") {
  LatencyHistogram h;
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kEach; ++i) h.record(microseconds((i % 7) * 300 + t));
    });
  for (auto& t : threads) t.join();
  HistogramSnapshot s = h.snapshot();
  uint64_t total = 0;
  for (uint64_t c : s.counts) total += c;
  CHECK(total == uint64_t{kThreads} * kEach);
  // Encoded, the +Inf bucket and _count both say so.
  std::string out;
  append_histogram(out, kLatency, {}, s);
  CHECK(out.find("cairn_request_duration_seconds_bucket{le=\"+Inf\"} 80000\n") != std::string::npos);
  CHECK(out.find("cairn_request_duration_seconds_count 80000\n") != std::string::npos);
}

}  // namespace
}  // namespace cairn::metrics
