#include "daemon/request_metrics.hpp"

#include <cctype>

namespace cairn {
namespace {

using metrics::Family;
using metrics::Label;
using metrics::Type;

constexpr Family kDuration{"cairn_request_duration_seconds", Type::kHistogram, "seconds",
                           "Time from a request's arrival at the engine to its response, by op (the count is the "
                           "number of requests; a commit's includes the wait for its durability)"};
constexpr Family kErrors{"cairn_request_errors", Type::kCounter, "",
                         "Requests answered with an error, by op and status code"};
constexpr Family kCommits{"cairn_commits", Type::kCounter, "",
                          "Models committed, by the durability the commit asked for"};

// "not_found" for CAIRN_ERR_NOT_FOUND.
std::string code_label(size_t code) {
  const char* name = status_code_name(static_cast<int>(code));
  std::string s = name ? name : "unknown";
  for (std::string_view prefix : {"CAIRN_ERR_", "CAIRN_"}) {
    if (s.rfind(prefix, 0) == 0) {
      s.erase(0, prefix.size());
      break;
    }
  }
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The common labels followed by `extra`.
std::vector<Label> with(metrics::Labels common, std::initializer_list<Label> extra) {
  std::vector<Label> out(common.begin(), common.end());
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

}  // namespace

RequestMetrics::RequestMetrics(std::vector<std::string> ops)
    : ops_(std::move(ops)), slots_(std::make_unique<Slot[]>(ops_.size() + 1)) {}

RequestMetrics::~RequestMetrics() = default;

void RequestMetrics::record(size_t slot, StatusCode code, std::chrono::nanoseconds took) {
  Slot& s = slots_[slot < ops_.size() ? slot : ops_.size()];
  s.latency.record(took);
  const auto c = static_cast<size_t>(code);
  s.by_code[c < kCodes ? c : static_cast<size_t>(StatusCode::kInternal)].fetch_add(1, std::memory_order_relaxed);
}

void RequestMetrics::record_commit(Durability asked) {
  const auto i = static_cast<size_t>(asked);
  if (i < commits_.size()) commits_[i].fetch_add(1, std::memory_order_relaxed);
}

void RequestMetrics::append(std::string& out, metrics::Format format, metrics::Labels common) const {
  auto op_name = [&](size_t i) { return i < ops_.size() ? std::string_view(ops_[i]) : std::string_view("unknown"); };
  metrics::append_header(out, format, kDuration);
  for (size_t i = 0; i <= ops_.size(); ++i) {
    metrics::HistogramSnapshot h = slots_[i].latency.snapshot();
    uint64_t n = 0;
    for (uint64_t c : h.counts) n += c;
    if (n == 0) continue;
    metrics::append_histogram(out, kDuration, with(common, {{"op", op_name(i)}}), h);
  }
  metrics::append_header(out, format, kErrors);
  for (size_t i = 0; i <= ops_.size(); ++i) {
    for (size_t c = 1; c < kCodes; ++c) {
      const uint64_t n = slots_[i].by_code[c].load(std::memory_order_relaxed);
      if (n == 0) continue;
      const std::string code = code_label(c);
      metrics::append_sample(out, kErrors, with(common, {{"op", op_name(i)}, {"code", code}}), n);
    }
  }
  metrics::append_header(out, format, kCommits);
  for (Durability d : {Durability::kMemory, Durability::kLocal, Durability::kGlobal}) {
    metrics::append_sample(out, kCommits, with(common, {{"durability", durability_name(d)}}),
                           commits_[static_cast<size_t>(d)].load(std::memory_order_relaxed));
  }
}

}  // namespace cairn
