// What cairnd counts of the requests it serves, for monitoring (docs/metrics.md): per request op, a
// latency histogram (its count is the number of requests) and the failures by status code; and the
// commits that succeeded, by the durability they asked for. Engine::handle records every request
// when metrics are on (metrics.listen or metrics.textfile).
//
// Owns: one slot of atomics per op of the dispatch table, plus one for unknown ops, sized at
// construction; recording allocates nothing and takes no lock (relaxed atomic additions).
//
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/durability.hpp"
#include "core/metrics.hpp"
#include "core/status.hpp"

namespace cairn {

class RequestMetrics {
 public:
  // ops: the request ops; slot i counts ops[i], slot ops.size() every other op (`unknown`).
  explicit RequestMetrics(std::vector<std::string> ops);
  ~RequestMetrics();
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  // One request of slot `slot` (clamped to the unknown slot) answered with `code` after `took`.
  void record(size_t slot, StatusCode code, std::chrono::nanoseconds took);
  // One commit that succeeded at the durability it asked for.
  void record_commit(Durability asked);

  // Appends cairn_request_duration_seconds (ops served at least once), cairn_request_errors_total
  // (op and code pairs seen at least once) and cairn_commits_total (every durability), each sample
  // with `common` labels first.
  void append(std::string& out, metrics::Format format, metrics::Labels common) const;

 private:
#define CAIRN_REQUEST_METRICS_COUNT_(c_name, cpp_name, message) +1
  static constexpr size_t kCodes = 0 CAIRN_STATUS_LIST(CAIRN_REQUEST_METRICS_COUNT_);
#undef CAIRN_REQUEST_METRICS_COUNT_
  // One op's counters, on cache lines of its own: ops served at once do not contend.
  struct alignas(64) Slot {
    metrics::LatencyHistogram latency;
    std::array<std::atomic<uint64_t>, kCodes> by_code{};
  };
  const std::vector<std::string> ops_;
  std::unique_ptr<Slot[]> slots_;                   // ops_.size() + 1
  std::array<std::atomic<uint64_t>, 3> commits_{};  // by Durability
};

}  // namespace cairn
