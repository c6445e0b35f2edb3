// cairn_bench_micro's main: Google Benchmark's, with a shorter default minimum time, and the
// in-process daemon of the DRAM-read benchmarks stopped after the run.
//
// Google Benchmark 1.7 defaults to 0.5 s per benchmark; the 58 benchmarks here run at 0.2 s each
// (about 28 s in all on 2 cores) unless --benchmark_min_time is given (1.7 takes seconds as a plain
// number: --benchmark_min_time=0.01 runs the whole binary in about 5 s, for bench/run --quick).
// No benchmark sets MinTime() itself, since in 1.7 that would override the flag.
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench/micro/micro_common.hpp"

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool min_time_given = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_min_time", 20) == 0) min_time_given = true;
  std::string default_min_time = "--benchmark_min_time=0.2";
  if (!min_time_given) args.insert(args.begin() + 1, default_min_time.data());
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);

  cairn::bench::register_safetensors_benchmarks();
  cairn::bench::register_hash_benchmarks();
  cairn::bench::register_arena_benchmarks();
  cairn::bench::register_wire_benchmarks();
  cairn::bench::register_dram_read_benchmarks();
  cairn::bench::register_metrics_benchmarks();
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  cairn::bench::stop_resident_daemon();
  return 0;
}
