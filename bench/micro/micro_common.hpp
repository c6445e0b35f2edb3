// Shared helpers of cairn_bench_micro (bench/micro/*.cpp).
//
// Naming: every benchmark is registered as "<family>/<size>/<system>", where system is "cairn" for
// cairn's code and the baseline's name otherwise (memcpy, bare_socket, malloc, ...). The two sides
// of a comparison share family and size and run one after the other, so bench/micro/ratios.py can
// pair them from one run's JSON output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cairn::bench {

// "64KiB", "16MiB", "1GiB", or the number of bytes when not a whole KiB.
std::string size_label(uint64_t bytes);

// "<family>/<size>/<system>".
std::string bench_name(const std::string& family, const std::string& size, const std::string& system);

// n pseudo-random bytes (deterministic in seed); every page is written, so the buffer is faulted in.
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed);

// Each family's file registers its benchmarks; main calls these in this order before the run.
void register_safetensors_benchmarks();
void register_hash_benchmarks();
void register_arena_benchmarks();
void register_wire_benchmarks();
void register_dram_read_benchmarks();
void register_metrics_benchmarks();

// Stops the in-process engine + server that the DRAM-read benchmarks start on first use (a no-op
// when none was started) and removes its temporary repository. Called by main after the run.
void stop_resident_daemon();

}  // namespace cairn::bench
