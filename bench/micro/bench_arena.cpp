// ArenaAllocator under allocate/free churn of mixed tensor sizes, and SharedArena start-up.
//
// The churn benchmarks hold a steady population of live allocations (the argument) in a 64 GiB
// offset space (the allocator never touches memory, so the space can be larger than the node):
// each iteration allocates one tensor of a log-uniform size between 64 B and 16 MiB, freeing
// random live tensors first whenever the population is full or the allocation does not fit (the
// DRAM tier's evict-and-retry). The number of free extents, and with it the depth of the trees,
// grows with the population. items_per_second counts allocate + free pairs.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tiers/dram/arena.hpp"

namespace {

constexpr uint64_t kCapacity = uint64_t{64} << 30;
constexpr uint64_t kAlignment = 64;

struct Live {
  uint64_t offset;
  uint64_t size;
};

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

void free_random(cairn::ArenaAllocator& a, std::vector<Live>& live, std::mt19937_64& rng) {
  const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
  a.free(live[i].offset, live[i].size);
  live[i] = live.back();
  live.pop_back();
}

void BM_AllocFreeChurn(benchmark::State& state) {
  const auto population = static_cast<size_t>(state.range(0));
  const std::vector<uint64_t> sizes = mixed_sizes(1 << 16, 64, 16 << 20, 42);
  cairn::ArenaAllocator a(kCapacity, kAlignment);
  std::vector<Live> live;
  live.reserve(population + 1);
  std::mt19937_64 rng(7);
  size_t next = 0;
  auto step = [&] {
    const uint64_t size = sizes[next++ & (sizes.size() - 1)];
    if (live.size() >= population) free_random(a, live, rng);
    std::optional<uint64_t> off;
    while (!(off = a.allocate(size))) free_random(a, live, rng);
    live.push_back({*off, size});
  };
  // Reach the steady state before timing.
  for (size_t i = 0; i < 4 * population; ++i) step();

  for (auto _ : state) step();

  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["free_extents"] = static_cast<double>(a.free_extent_count());
  state.counters["used_GiB"] =
      static_cast<double>(a.used()) / static_cast<double>(uint64_t{1} << 30);
}
BENCHMARK(BM_AllocFreeChurn)->Arg(256)->Arg(4096)->Arg(65536);

// Committing a tensor gives back the duplicate chunks inside its allocation: free a sub-range,
// then later the rest in pieces.
void BM_SubRangeFree(benchmark::State& state) {
  const std::vector<uint64_t> sizes = mixed_sizes(1 << 16, 64 << 10, 16 << 20, 43);
  cairn::ArenaAllocator a(kCapacity, kAlignment);
  std::mt19937_64 rng(11);
  std::vector<Live> live;
  size_t next = 0;
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
    while (live.size() > 8192) free_random(a, live, rng);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SubRangeFree);

// A daemon starts with its arena: creating and mapping a 1 GiB memfd must not touch the pages.
void BM_SharedArenaCreate1GiB(benchmark::State& state) {
  for (auto _ : state) {
    auto arena = cairn::SharedArena::create(uint64_t{1} << 30, "cairn-bench-arena");
    if (!arena.is_ok()) {
      state.SkipWithError(arena.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize((*arena)->base());
  }
}
BENCHMARK(BM_SharedArenaCreate1GiB)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
