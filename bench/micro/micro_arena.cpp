// The DRAM arena's allocator and the arena's start-up (the cases of bench_arena.cpp, with
// baselines).
//
// arena_churn: a steady population of live allocations (the size label) under allocate/free churn
// of log-uniform tensor sizes between 64 B and 16 MiB: each iteration allocates one tensor, first
// freeing random live tensors whenever the population is full or the allocation does not fit (the
// DRAM tier's evict-and-retry). ArenaAllocator hands out offsets in a 64 GiB space and never
// touches memory. Baseline: glibc malloc/free under the same churn (same sizes, same random
// choices) — what the daemon would pay for a general-purpose allocator. malloc writes a chunk
// header into each allocation, so it touches (and faults in) a page per large allocation; it runs
// for populations up to 4096 only (65536 live tensors of ~1.3 MiB on average is ~88 GB of address
// space and more mappings than vm.max_map_count allows). ns per allocate + free.
//
// arena_subrange_free: committing a tensor gives back the duplicate chunks inside its allocation:
// free the middle third now, the ends later. No baseline (malloc cannot free part of a block).
//
// arena_create: SharedArena::create of a 1 GiB arena (memfd, ftruncate, seals, mmap, THP advice)
// and its destruction, against a bare memfd_create + ftruncate + mmap + munmap + close. Neither
// touches the pages.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "bench/micro/micro_common.hpp"
#include "tiers/dram/arena.hpp"

namespace {

constexpr uint64_t kCapacity = uint64_t{64} << 30;
constexpr uint64_t kAlignment = 64;

// Log-uniform sizes: as many 1 KiB tensors as 1 MiB ones, like a model's biases beside its
// weight matrices.
std::vector<uint64_t> mixed_sizes(size_t n, uint64_t min_size, uint64_t max_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(std::log2(static_cast<double>(min_size)),
                                                  std::log2(static_cast<double>(max_size)));
  std::vector<uint64_t> sizes(n);
  for (auto& s : sizes) s = static_cast<uint64_t>(std::exp2(exponent(rng)));
  return sizes;
}

// The two allocators behind one shape: allocate returns a handle (an offset or a pointer).
struct ArenaSide {
  cairn::ArenaAllocator a{kCapacity, kAlignment};
  std::optional<uint64_t> allocate(uint64_t size) { return a.allocate(size); }
  void free(uint64_t handle, uint64_t size) { a.free(handle, size); }
};

struct MallocSide {
  std::optional<uint64_t> allocate(uint64_t size) {
    void* p = std::malloc(size);
    if (p == nullptr) return std::nullopt;
    return reinterpret_cast<uint64_t>(p);
  }
  void free(uint64_t handle, uint64_t) { std::free(reinterpret_cast<void*>(handle)); }
};

struct Live {
  uint64_t handle;
  uint64_t size;
};

template <typename Side>
void free_random(Side& side, std::vector<Live>& live, std::mt19937_64& rng) {
  const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
  side.free(live[i].handle, live[i].size);
  live[i] = live.back();
  live.pop_back();
}

template <typename Side>
void churn(benchmark::State& state, size_t population) {
  const std::vector<uint64_t> sizes = mixed_sizes(1 << 16, 64, 16 << 20, 42);
  Side side;
  std::vector<Live> live;
  live.reserve(population + 1);
  std::mt19937_64 rng(7);
  size_t next = 0;
  bool failed = false;
  auto step = [&] {
    const uint64_t size = sizes[next++ & (sizes.size() - 1)];
    if (live.size() >= population) free_random(side, live, rng);
    std::optional<uint64_t> h;
    while (!(h = side.allocate(size))) {
      if (live.empty()) {
        failed = true;
        return;
      }
      free_random(side, live, rng);
    }
    live.push_back({*h, size});
  };
  // Reach the steady state before timing.
  for (size_t i = 0; i < 4 * population; ++i) step();

  for (auto _ : state) step();

  if (failed) state.SkipWithError("an allocation failed with nothing left to free");
  for (const Live& l : live) side.free(l.handle, l.size);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void subrange_free(benchmark::State& state) {
  const std::vector<uint64_t> sizes = mixed_sizes(1 << 16, 64 << 10, 16 << 20, 43);
  cairn::ArenaAllocator a(kCapacity, kAlignment);
  std::mt19937_64 rng(11);
  std::vector<Live> live;
  size_t next = 0;
  auto free_one = [&] {
    const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
    a.free(live[i].handle, live[i].size);
    live[i] = live.back();
    live.pop_back();
  };
  for (auto _ : state) {
    const uint64_t size = a.round_up(sizes[next++ & (sizes.size() - 1)]);
    auto off = a.allocate(size);
    if (!off) {
      state.SkipWithError("arena full");
      break;
    }
    // Free the middle third now, keep the two ends live for later.
    const uint64_t units = size / kAlignment;
    const uint64_t first = units / 3, count = units / 3;
    if (count > 0) {
      a.free(*off + first * kAlignment, count * kAlignment);
      live.push_back({*off, first * kAlignment});
      live.push_back({*off + (first + count) * kAlignment, (units - first - count) * kAlignment});
    } else {
      live.push_back({*off, size});
    }
    while (live.size() > 8192) free_one();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

constexpr uint64_t kArenaBytes = uint64_t{1} << 30;

void create_cairn(benchmark::State& state) {
  for (auto _ : state) {
    auto arena = cairn::SharedArena::create(kArenaBytes, "cairn-bench-arena");
    if (!arena.ok()) {
      state.SkipWithError(arena.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize((*arena)->base());
  }
}

void create_bare(benchmark::State& state) {
  for (auto _ : state) {
    const int fd = ::memfd_create("cairn-bench-bare", MFD_CLOEXEC);
    void* base = MAP_FAILED;
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(kArenaBytes)) == 0)
      base = ::mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      if (fd >= 0) ::close(fd);
      state.SkipWithError("memfd_create/ftruncate/mmap of 1 GiB failed");
      break;
    }
    benchmark::DoNotOptimize(base);
    ::munmap(base, kArenaBytes);
    ::close(fd);
  }
}

}  // namespace

namespace cairn::bench {

void register_arena_benchmarks() {
  for (size_t population : {size_t{256}, size_t{4096}, size_t{65536}}) {
    const std::string size = std::to_string(population) + "live";
    benchmark::RegisterBenchmark(bench_name("arena_churn", size, "cairn").c_str(), churn<ArenaSide>, population)
        ->UseRealTime();
    if (population <= 4096)
      benchmark::RegisterBenchmark(bench_name("arena_churn", size, "malloc").c_str(), churn<MallocSide>, population)
          ->UseRealTime();
  }
  benchmark::RegisterBenchmark(bench_name("arena_subrange_free", "8192live", "cairn").c_str(), subrange_free)
      ->UseRealTime();
  benchmark::RegisterBenchmark(bench_name("arena_create", size_label(kArenaBytes), "cairn").c_str(), create_cairn)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(bench_name("arena_create", size_label(kArenaBytes), "memfd_mmap").c_str(), create_bare)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace cairn::bench
