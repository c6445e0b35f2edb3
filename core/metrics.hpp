// Metrics in the Prometheus and OpenMetrics text exposition formats, without a registry: functions
// that append one metric family at a time to a string, and a latency histogram that many threads
// record into without a lock. The caller owns its values and writes every family when asked
// (daemon/engine_metrics.cpp, daemon/request_metrics.cpp); docs/metrics.md lists cairnd's.
//
// The two formats differ only in details, all handled here:
//   kPrometheus   text/plain; version=0.0.4 (what node_exporter's textfile collector and
//                 `promtool check metrics` read): a counter's HELP and TYPE lines name its sample,
//                 `<name>_total`; no UNIT line; no end marker.
//   kOpenMetrics  application/openmetrics-text; version=1.0.0 (what Prometheus asks for first): a
//                 counter's family is `<name>` and its sample `<name>_total`; `# UNIT` lines; the
//                 exposition ends with `# EOF` (append_eof).
// Names and label names are the caller's constants and are not checked: a family name matches
// [a-zA-Z_:][a-zA-Z0-9_:]*, is given without `_total`, and ends with `_<unit>` when it has a unit.
// Label values are any UTF-8 text; they are escaped here.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::metrics {

enum class Format { kPrometheus, kOpenMetrics };
enum class Type { kCounter, kGauge, kHistogram };

// The Content-Type header of an exposition in `format`.
std::string_view content_type(Format format);
// The format to answer an HTTP request with this Accept header: OpenMetrics when it names
// application/openmetrics-text (with any q-value above 0), else Prometheus text.
Format negotiate(std::string_view accept);

struct Label {
  std::string_view name;
  std::string_view value;
};
using Labels = std::span<const Label>;

// What the HELP, TYPE and UNIT lines say about a family.
struct Family {
  std::string_view name;  // without `_total`; ends with `_<unit>` when unit is set
  Type type;
  std::string_view unit;  // "bytes", "seconds", ...; "" = none
  std::string_view help;  // one line of plain text
};

// The counts of a histogram at one moment. counts[i] is the number of observations in bucket i
// alone (not cumulative): at most bounds[i] and above bounds[i-1]; counts has one more entry than
// bounds, the observations above every bound.
struct HistogramSnapshot {
  std::vector<double> bounds;    // ascending, finite
  std::vector<uint64_t> counts;  // bounds.size() + 1 entries
  double sum = 0;
};

// Appends the family's HELP, TYPE and (OpenMetrics, with a unit) UNIT lines.
void append_header(std::string& out, Format format, const Family& family);
// Appends one sample of a counter (`<name>_total`) or gauge (`<name>`) family. REQUIRES: the
// family's header was the last one appended.
void append_sample(std::string& out, const Family& family, Labels labels, uint64_t value);
void append_sample(std::string& out, const Family& family, Labels labels, double value);
// Appends one histogram of a histogram family: `<name>_bucket` for every bound and `+Inf`, with
// cumulative counts, then `<name>_count` (the `+Inf` bucket's count) and `<name>_sum`. `le` follows
// `labels`. REQUIRES: the family's header was the last one appended; h.counts.size() ==
// h.bounds.size() + 1.
void append_histogram(std::string& out, const Family& family, Labels labels, const HistogramSnapshot& h);
// Appends `# EOF` in OpenMetrics (an exposition's last line); nothing in Prometheus text.
void append_eof(std::string& out, Format format);

// A label value escaped for the text formats: backslash, double quote and line feed become \\, \"
// and \n; everything else is copied.
std::string escape_label_value(std::string_view value);
// A sample value or bound: integers without a fraction ("3"), others in the shortest form that
// reads back exactly ("0.25", "1e-05"), and "+Inf", "-Inf", "NaN".
std::string format_value(double value);

// Durations recorded from any number of threads without a lock: one relaxed atomic counter per
// bucket and an atomic sum of nanoseconds, so that a record costs a clock read by the caller, a
// scan of the bounds and two atomic additions. A snapshot taken while records land may see one in
// the sum and not yet in its bucket (or the reverse); every count is exact once records stop.
class LatencyHistogram {
 public:
  // Upper bounds in seconds, from 100 us (a request answered from memory) to 60 s (a large commit
  // at durability global).
  static constexpr std::array<double, 17> kBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,    0.25,    0.5,    1,     2.5,    5,     10,   60};

  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  void record(std::chrono::nanoseconds took);
  HistogramSnapshot snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace cairn::metrics
