// What metrics add to a request (daemon/request_metrics.hpp, docs/metrics.md): Engine::handle,
// with metrics on, reads the clock before and after the request and records the latency and the
// status in the op's slot.
//
// metrics_record: two steady_clock reads and RequestMetrics::record (a histogram bucket, the
// histogram's sum and the status count: three relaxed atomic additions), against the two clock
// reads alone. Sizes: 1thread, and 2threads recording into the same op's slot at once (the worst
// case: both contend for one slot's cache lines).
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench/micro/micro_common.hpp"
#include "daemon/request_metrics.hpp"

namespace {

using Clock = std::chrono::steady_clock;

cairn::RequestMetrics& shared_metrics() {
  static auto* m = new cairn::RequestMetrics(std::vector<std::string>{"hello", "commit", "lease"});
  return *m;
}

void record_cairn(benchmark::State& state) {
  cairn::RequestMetrics& m = shared_metrics();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    m.record(1, cairn::StatusCode::kOk, Clock::now() - t0);
  }
}

void record_clock(benchmark::State& state) {
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto took = Clock::now() - t0;
    benchmark::DoNotOptimize(took);
  }
}

}  // namespace

namespace cairn::bench {

void register_metrics_benchmarks() {
  for (int threads : {1, 2}) {
    const std::string size = std::to_string(threads) + (threads == 1 ? "thread" : "threads");
    benchmark::RegisterBenchmark(bench_name("metrics_record", size, "cairn").c_str(), record_cairn)
        ->Threads(threads)
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("metrics_record", size, "clock").c_str(), record_clock)
        ->Threads(threads)
        ->UseRealTime();
  }
}

}  // namespace cairn::bench
