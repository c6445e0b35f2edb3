// Content hashing: hash_bytes (xxh3-128 of one buffer) and hash_chunks (one hash per 16 MiB chunk,
// as a commit does), against memcpy of the same bytes into a pre-faulted buffer.
//
// memcpy reads and writes every byte, hashing only reads it: on buffers that fit in cache both are
// bound by the core; beyond the last-level cache memcpy moves twice the bytes to and from DRAM.
// hash_bytes is also measured beside libxxhash's own XXH3_128bits, which Debian builds for the
// x86-64 baseline (SSE2): cairn calls its AVX2 or AVX-512 build of the same function where the CPU
// has one (core/hash_simd.hpp), with the same hashes.
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bench/micro/micro_common.hpp"
#include "core/hash.hpp"

namespace {

void hash_bytes(benchmark::State& state, uint64_t size) {
  const std::vector<uint8_t> src = cairn::bench::random_bytes(size, 1);
  for (auto _ : state) {
    cairn::ChunkHash h = cairn::hash_bytes(src.data(), src.size());
    benchmark::DoNotOptimize(h);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

void libxxhash(benchmark::State& state, uint64_t size) {
  const std::vector<uint8_t> src = cairn::bench::random_bytes(size, 1);
  for (auto _ : state) {
    XXH128_hash_t h = XXH3_128bits(src.data(), src.size());
    benchmark::DoNotOptimize(h);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

void hash_chunks(benchmark::State& state, uint64_t size) {
  const std::vector<uint8_t> src = cairn::bench::random_bytes(size, 2);
  for (auto _ : state) {
    auto hashes = cairn::hash_chunks(src.data(), src.size(), cairn::kDefaultChunkSize);
    benchmark::DoNotOptimize(hashes.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
  state.counters["chunks"] = static_cast<double>(cairn::chunk_count(size, cairn::kDefaultChunkSize));
}

void copy(benchmark::State& state, uint64_t size) {
  const std::vector<uint8_t> src = cairn::bench::random_bytes(size, 3);
  std::vector<uint8_t> dst(size, 1);  // faulted in before timing
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), size);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

}  // namespace

namespace cairn::bench {

void register_hash_benchmarks() {
  for (uint64_t size : {uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{16} << 20}) {
    benchmark::RegisterBenchmark(bench_name("hash_bytes", size_label(size), "cairn").c_str(), ::hash_bytes, size)
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("hash_bytes", size_label(size), "memcpy").c_str(), copy, size)
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("hash_bytes", size_label(size), "libxxhash").c_str(), ::libxxhash, size)
        ->UseRealTime();
  }
  for (uint64_t size : {uint64_t{16} << 20, uint64_t{64} << 20}) {
    benchmark::RegisterBenchmark(bench_name("hash_chunks", size_label(size), "cairn").c_str(), ::hash_chunks, size)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(bench_name("hash_chunks", size_label(size), "memcpy").c_str(), copy, size)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace cairn::bench
