// The text exposition formats (Prometheus 0.0.4 and OpenMetrics 1.0.0) and the latency histogram.
#include "core/metrics.hpp"

#include <charconv>
#include <cmath>

namespace cairn::metrics {
namespace {

constexpr std::string_view kPrometheusType = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view kOpenMetricsType = "application/openmetrics-text; version=1.0.0; charset=utf-8";

std::string_view type_name(Type type) {
  switch (type) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "unknown";
}

// HELP text: backslash and line feed escaped; OpenMetrics escapes the double quote too.
void append_help(std::string& out, Format format, std::string_view help) {
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && format == Format::kOpenMetrics) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// `{a="x",b="y"}` (with `le` last when given), or nothing for no labels.
void append_labels(std::string& out, Labels labels, std::string_view le = {}) {
  if (labels.empty() && le.empty()) return;
  out += '{';
  bool first = true;
  for (const Label& l : labels) {
    if (!first) out += ',';
    first = false;
    out += l.name;
    out += "=\"";
    out += escape_label_value(l.value);
    out += '"';
  }
  if (!le.empty()) {
    if (!first) out += ',';
    out += "le=\"";
    out += le;
    out += '"';
  }
  out += '}';
}

void append_uint(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// A bucket bound as the `le` label writes it: a float with a fraction or an exponent ("1.0",
// "0.25"), the canonical form OpenMetrics asks for and Prometheus text reads alike.
std::string format_bound(double bound) {
  std::string s = format_value(bound);
  if (std::isfinite(bound) && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

void append_line(std::string& out, std::string_view name, std::string_view suffix, Labels labels, std::string_view le,
                 std::string_view value) {
  out += name;
  out += suffix;
  append_labels(out, labels, le);
  out += ' ';
  out += value;
  out += '\n';
}

}  // namespace

std::string_view content_type(Format format) {
  return format == Format::kOpenMetrics ? kOpenMetricsType : kPrometheusType;
}

Format negotiate(std::string_view accept) {
  // Media ranges separated by ',', each with ';'-separated parameters.
  size_t start = 0;
  while (start <= accept.size()) {
    size_t end = accept.find(',', start);
    if (end == std::string_view::npos) end = accept.size();
    std::string_view range = accept.substr(start, end - start);
    const size_t semi = range.find(';');
    std::string_view type = range.substr(0, semi);
    while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
    while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
    if (type == "application/openmetrics-text") {
      // q=0 means "not acceptable".
      bool refused = false;
      if (semi != std::string_view::npos) {
        std::string_view params = range.substr(semi);
        for (size_t q = params.find("q="); q != std::string_view::npos; q = params.find("q=", q + 2)) {
          if (q > 0 && params[q - 1] != ';' && params[q - 1] != ' ') continue;
          std::string_view v = params.substr(q + 2);
          v = v.substr(0, v.find(';'));
          while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
          refused = v.find_first_not_of("0.") == std::string_view::npos;
        }
      }
      if (!refused) return Format::kOpenMetrics;
    }
    start = end + 1;
  }
  return Format::kPrometheus;
}

void append_header(std::string& out, Format format, const Family& family) {
  // Prometheus text names a counter's family after its sample.
  const std::string_view suffix =
      family.type == Type::kCounter && format == Format::kPrometheus ? std::string_view("_total") : std::string_view();
  out += "# HELP ";
  out += family.name;
  out += suffix;
  out += ' ';
  append_help(out, format, family.help);
  out += "\n# TYPE ";
  out += family.name;
  out += suffix;
  out += ' ';
  out += type_name(family.type);
  out += '\n';
  if (format == Format::kOpenMetrics && !family.unit.empty()) {
    out += "# UNIT ";
    out += family.name;
    out += ' ';
    out += family.unit;
    out += '\n';
  }
}

void append_sample(std::string& out, const Family& family, Labels labels, uint64_t value) {
  std::string text;
  append_uint(text, value);
  append_line(out, family.name, family.type == Type::kCounter ? "_total" : "", labels, {}, text);
}

void append_sample(std::string& out, const Family& family, Labels labels, double value) {
  append_line(out, family.name, family.type == Type::kCounter ? "_total" : "", labels, {}, format_value(value));
}

void append_histogram(std::string& out, const Family& family, Labels labels, const HistogramSnapshot& h) {
  uint64_t cumulative = 0;
  std::string count;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    count.clear();
    append_uint(count, cumulative);
    append_line(out, family.name, "_bucket", labels, format_bound(h.bounds[i]), count);
  }
  if (h.counts.size() > h.bounds.size()) cumulative += h.counts[h.bounds.size()];
  count.clear();
  append_uint(count, cumulative);
  append_line(out, family.name, "_bucket", labels, "+Inf", count);
  append_line(out, family.name, "_count", labels, {}, count);
  append_line(out, family.name, "_sum", labels, {}, format_value(h.sum));
}

void append_eof(std::string& out, Format format) {
  if (format == Format::kOpenMetrics) out += "# EOF\n";
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

void LatencyHistogram::record(std::chrono::nanoseconds took) {
  static constexpr auto kBoundsNs = [] {
    std::array<int64_t, kBounds.size()> ns{};
    for (size_t i = 0; i < kBounds.size(); ++i) ns[i] = static_cast<int64_t>(kBounds[i] * 1e9 + 0.5);
    return ns;
  }();
  const int64_t t = took.count() < 0 ? 0 : took.count();
  size_t i = 0;
  while (i < kBoundsNs.size() && t > kBoundsNs[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(t), std::memory_order_relaxed);
}

HistogramSnapshot LatencyHistogram::snapshot() const {
  HistogramSnapshot s;
  s.bounds.assign(kBounds.begin(), kBounds.end());
  s.counts.reserve(counts_.size());
  for (const auto& c : counts_) s.counts.push_back(c.load(std::memory_order_relaxed));
  s.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

}  // namespace cairn::metrics
