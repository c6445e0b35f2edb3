// The GPU tier: the device seam (tiers/hbm/device.hpp) and HbmTier (tiers/hbm/hbm_tier.hpp) —
// slabs, asynchronous copies, handles opened by another process, promotion, eviction by the policy,
// pinned entries that never move, capacity and kNoSpace. Every test runs against the emulated
// device, and against CUDA device 0 where a GPU is visible ("skipped: no GPU" otherwise).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tiers/hbm/device.hpp"
#include "tiers/hbm/hbm_tier.hpp"
#include "unit/child_wait.hpp"
#include "unit/test_bytes.hpp"

namespace cairn {
namespace {

constexpr uint64_t kKiB = 1024;

// Runs this test binary again in a child process, only the hidden test case `tag`, with `env` added
// to the environment, and returns its wait status. The child execs at once after fork (a forked copy
// of this multi-threaded process may not take a lock another thread held: the allocator's, the
// logger's); everything it needs is built before the fork. A child still running after `timeout` is
// killed and the test fails (testing::wait_child).
struct SelfRun {
  pid_t pid;
  int status;
};
SelfRun run_self(const char* tag, const std::vector<std::string>& env,
                 std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& e : env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", name = "unit_tiers", filter = tag, warn = "--warn", no_tests = "NoTests";
  char* argv[] = {name.data(), filter.data(), warn.data(), no_tests.data(), nullptr};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execve(self.c_str(), argv, envp.data());
    ::_exit(127);
  }
  return SelfRun{pid, testing::wait_child(pid, timeout)};
}

// The backends to run on here: emulated, and cuda when a GPU is visible.
std::vector<std::string> backends_here() {
  std::vector<std::string> out{"emulated"};
  std::string why;
  if (hbm::cuda_device_count(&why) > 0)
    out.push_back("cuda");
  else
    WARN("cuda backend: skipped: no GPU (" << why << ")");
  return out;
}

std::unique_ptr<HbmTier> make_tier(const std::string& backend, uint64_t capacity, uint64_t slab, void* arena = nullptr,
                                   uint64_t arena_size = 0) {
  HbmTier::Options o;
  o.backend = backend;
  o.devices = {0};
  o.capacity = capacity;
  o.slab_size = slab;
  auto t = HbmTier::open(o, arena, arena_size);
  REQUIRE(t.ok());
  return std::move(t).value();
}

ChunkHash key(uint64_t n) { return ChunkHash{0x4842, n}; }

// The bytes of an entry, read back through the device.
std::string read_back(HbmTier& t, const ChunkHash& k, uint64_t n) {
  std::string out(n, '\0');
  REQUIRE(t.copy_out(0, k, out.data(), n).ok());
  return out;
}

}  // namespace

TEST_CASE("hbm device: slabs, asynchronous copies both ways and device-to-device", "[hbm]") {
  for (const std::string& backend : backends_here()) {
    INFO("backend " << backend);
    auto dev = hbm::open_device(backend, 0);
    REQUIRE(dev.ok());
    CHECK(std::string((*dev)->backend()) == backend);
    auto slab = (*dev)->allocate_slab(1 << 20);
    REQUIRE(slab.ok());
    CHECK(slab->size == (1u << 20));
    CHECK(slab->handle.rfind(backend + ":", 0) == 0);
    const std::string src = testing::make_bytes(300 * kKiB, 7);
    auto up = (*dev)->copy_async(slab->base, src.data(), src.size(), hbm::CopyKind::kHostToDevice);
    REQUIRE(up.ok());
    REQUIRE((*up)->wait().ok());
    CHECK((*up)->done());
    auto dd = (*dev)->copy_async(slab->base + 512 * kKiB, slab->base, src.size(), hbm::CopyKind::kDeviceToDevice);
    REQUIRE(dd.ok());
    REQUIRE((*dd)->wait().ok());
    std::string back(src.size(), '\0');
    auto down = (*dev)->copy_async(back.data(), slab->base + 512 * kKiB, back.size(), hbm::CopyKind::kDeviceToHost);
    REQUIRE(down.ok());
    REQUIRE((*down)->wait().ok());
    CHECK(back == src);
    (*dev)->free_slab(*slab);
  }
}

TEST_CASE("hbm device: another process opens a slab's handle and sees the same bytes", "[hbm]") {
  for (const std::string& backend : backends_here()) {
    INFO("backend " << backend);
    auto dev = hbm::open_device(backend, 0);
    REQUIRE(dev.ok());
    auto slab = (*dev)->allocate_slab(256 * kKiB);
    REQUIRE(slab.ok());
    const std::string src = testing::make_bytes(256 * kKiB, 11);
    auto up = (*dev)->copy_async(slab->base, src.data(), src.size(), hbm::CopyKind::kHostToDevice);
    REQUIRE(up.ok());
    REQUIRE((*up)->wait().ok());
    // A process of its own (CUDA IPC handles cannot be opened by the process that made them, and a
    // forked child cannot use CUDA): this test binary again, running only the hidden case below.
    const int status =
        run_self("[hbm-child]", {"CAIRN_TEST_HBM_BACKEND=" + backend, "CAIRN_TEST_HBM_HANDLE=" + slab->handle,
                                 "CAIRN_TEST_HBM_SIZE=" + std::to_string(slab->size)})
            .status;
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    (*dev)->free_slab(*slab);
  }
}

// The other process of the test above: opens the slab named in the environment and checks its bytes.
TEST_CASE("hbm device: (child) open a handle from another process", "[.hbm-child]") {
  const char* backend = std::getenv("CAIRN_TEST_HBM_BACKEND");
  const char* handle = std::getenv("CAIRN_TEST_HBM_HANDLE");
  const char* size = std::getenv("CAIRN_TEST_HBM_SIZE");
  REQUIRE(backend);
  REQUIRE(handle);
  REQUIRE(size);
  const uint64_t n = std::strtoull(size, nullptr, 10);
  auto m = hbm::open_mapper(backend);
  REQUIRE(m.ok());
  auto p = (*m)->open(handle, n);
  REQUIRE(p.ok());
  std::string seen(n, '\0');
  REQUIRE((*m)->copy(0, seen.data(), *p, n, hbm::CopyKind::kDeviceToHost).ok());
  CHECK(seen == testing::make_bytes(n, 11));
  (*m)->close(*p, n);
}

// The other process of the test below: allocates an emulated slab and exits without freeing it.
TEST_CASE("hbm device: (child) leave an emulated segment behind", "[.hbm-orphan-child]") {
  auto d = hbm::open_device("emulated", 0);
  REQUIRE(d.ok());
  REQUIRE((*d)->allocate_slab(64 * kKiB).ok());
  std::fflush(nullptr);
  ::_exit(0);  // without freeing it, as a daemon killed with -9
}

TEST_CASE("hbm device: bad handles and backends are refused, naming why", "[hbm]") {
  auto m = hbm::open_mapper("emulated");
  REQUIRE(m.ok());
  CHECK((*m)->open("emulated:/not-ours", 4096).status().code() == StatusCode::kInvalidArgument);
  CHECK((*m)->open("cuda:0:00", 4096).status().code() == StatusCode::kInvalidArgument);
  CHECK_FALSE((*m)->open("emulated:/cairn-hbm-1-0-1-gone", 4096).ok());
  auto bad = hbm::open_device("opencl", 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("cuda or emulated") != std::string::npos);
  if (hbm::cuda_device_count() == 0) {
    auto cuda = hbm::open_device("cuda", 0);
    REQUIRE_FALSE(cuda.ok());
    CHECK(cuda.status().code() == StatusCode::kUnavailable);
    CHECK(cuda.status().message().find(hbm::cuda_compiled() ? "no GPU" : "without CUDA") != std::string::npos);
  }
}

TEST_CASE("hbm device: a dead daemon's emulated segments are removed, a live one's kept", "[hbm]") {
  auto dev = hbm::open_device("emulated", 0);
  REQUIRE(dev.ok());
  auto live = (*dev)->allocate_slab(64 * kKiB);
  REQUIRE(live.ok());
  // A segment named after a pid that does not exist: what a daemon killed with -9 leaves (the test
  // binary run again, allocating a slab and exiting without freeing it).
  const SelfRun child = run_self("[hbm-orphan-child]", {});
  REQUIRE(WIFEXITED(child.status));
  REQUIRE(WEXITSTATUS(child.status) == 0);
  const pid_t pid = child.pid;
  const std::string dead = "/dev/shm/cairn-hbm-" + std::to_string(pid) + "-0-1-";
  auto exists_prefix = [](const std::string& prefix) {
    std::string cmd = "ls " + prefix + "* >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  };
  CHECK(exists_prefix(dead));
  CHECK(hbm::remove_stale_emulated_segments() >= 1);
  CHECK_FALSE(exists_prefix(dead));
  auto m = hbm::open_mapper("emulated");
  REQUIRE(m.ok());
  auto p = (*m)->open(live->handle, live->size);
  CHECK(p.ok());
  if (p.ok()) (*m)->close(*p, live->size);
  (*dev)->free_slab(*live);
}

TEST_CASE("hbm tier: a miss promotes, the next acquire hits the same bytes, stats count both", "[hbm]") {
  for (const std::string& backend : backends_here()) {
    INFO("backend " << backend);
    std::string arena = testing::make_bytes(512 * kKiB, 3);
    auto t = make_tier(backend, 1 << 20, 0, arena.data(), arena.size());
    const ChunkHash k = HbmTier::key_of({key(1), key(2)});
    CHECK(k != key(1));
    CHECK(HbmTier::key_of({key(1)}) == key(1));
    // Two host extents (a tensor's chunks) become one contiguous entry.
    HbmTier::HostExtents src{{reinterpret_cast<const uint8_t*>(arena.data()), 100 * kKiB},
                             {reinterpret_cast<const uint8_t*>(arena.data()) + 300 * kKiB, 50 * kKiB}};
    auto a = t->acquire(0, k, src);
    REQUIRE(a.ok());
    CHECK_FALSE(a->hit);
    CHECK(a->length == 150 * kKiB);
    CHECK(a->offset % 4096 == 0);
    CHECK(t->resident(0, k));
    auto b = t->pin_if_resident(0, k);
    REQUIRE(b);
    CHECK(b->hit);
    CHECK(b->pointer == a->pointer);
    CHECK(b->handle == a->handle);
    const std::string want = arena.substr(0, 100 * kKiB) + arena.substr(300 * kKiB, 50 * kKiB);
    CHECK(read_back(*t, k, want.size()) == want);
    TierStats s = t->stats();
    CHECK(s.enabled);
    CHECK(s.misses == 1);
    CHECK(s.hits >= 1);
    CHECK(s.bytes_in == 150 * kKiB);
    CHECK(t->device_stats()[0]["pinned_bytes"] == 150 * kKiB);
    t->unpin(0, k);
    t->unpin(0, k);
    CHECK(t->device_stats()[0]["pinned_bytes"] == 0);
    CHECK(t->resident(0, k));  // unpinned entries stay, as a cache
    CHECK_FALSE(t->pin_if_resident(0, key(99)));
    CHECK(t->acquire(5, k, src).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("hbm tier: when full, unpinned entries are evicted in the policy's order; pinned ones never move", "[hbm]") {
  for (const std::string& backend : backends_here()) {
    INFO("backend " << backend);
    const std::string bytes = testing::make_bytes(100 * kKiB, 5);
    HbmTier::HostExtents src{{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}};
    auto t = make_tier(backend, 256 * kKiB, 0);  // room for two 100 KiB entries
    auto a = t->acquire(0, key(1), src);
    auto b = t->acquire(0, key(2), src);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    // Both pinned (device leases): a third does not fit, and the message says what holds the space.
    auto c = t->acquire(0, key(3), src);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kNoSpace);
    CHECK(c.status().message().find("held by device leases") != std::string::npos);
    CHECK_FALSE(t->resident(0, key(3)));
    // Release 1, touch 2 (still pinned); the third goes where 1 was, 2 does not move.
    t->unpin(0, key(1));
    c = t->acquire(0, key(3), src);
    REQUIRE(c.ok());
    CHECK_FALSE(t->resident(0, key(1)));
    auto b2 = t->pin_if_resident(0, key(2));
    REQUIRE(b2);
    CHECK(b2->offset == b->offset);
    CHECK(read_back(*t, key(2), bytes.size()) == bytes);
    CHECK(t->device_stats()[0]["evictions"] == 1);
    // LRU among the unpinned: 2 was touched after 3, so 3 goes first.
    t->unpin(0, key(2));
    t->unpin(0, key(2));
    t->unpin(0, key(3));
    REQUIRE(t->pin_if_resident(0, key(2)));
    t->unpin(0, key(2));
    REQUIRE(t->acquire(0, key(4), src).ok());
    CHECK_FALSE(t->resident(0, key(3)));
    CHECK(t->resident(0, key(2)));
    CHECK(t->stats().bytes_out == 200 * kKiB);
  }
}

TEST_CASE("hbm tier: slabs are taken as needed up to the capacity; a tensor larger than a slab is kNoSpace", "[hbm]") {
  for (const std::string& backend : backends_here()) {
    INFO("backend " << backend);
    const std::string bytes = testing::make_bytes(200 * kKiB, 9);
    HbmTier::HostExtents src{{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}};
    auto t = make_tier(backend, 512 * kKiB, 256 * kKiB);
    CHECK(t->device_stats()[0]["slabs"] == 0);  // nothing until needed
    auto a = t->acquire(0, key(1), src);
    auto b = t->acquire(0, key(2), src);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->handle != b->handle);
    CHECK(t->device_stats()[0]["slabs"] == 2);
    CHECK(t->acquire(0, key(3), src).status().code() == StatusCode::kNoSpace);
    const std::string big = testing::make_bytes(300 * kKiB, 1);
    auto too_big = t->acquire(0, key(4), {{reinterpret_cast<const uint8_t*>(big.data()), big.size()}});
    REQUIRE_FALSE(too_big.ok());
    CHECK(too_big.status().code() == StatusCode::kNoSpace);
    CHECK(too_big.status().message().find("does not fit a slab") != std::string::npos);
  }
}

TEST_CASE("hbm tier: concurrent acquires of one entry load it once and share it", "[hbm]") {
  for (const std::string& backend : backends_here()) {
    INFO("backend " << backend);
    const std::string bytes = testing::make_bytes(128 * kKiB, 13);
    HbmTier::HostExtents src{{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}};
    auto t = make_tier(backend, 1 << 20, 0);
    std::vector<uint8_t*> seen(8, nullptr);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < seen.size(); ++i)
      threads.emplace_back([&, i] {
        auto p = t->acquire(0, key(7), src);
        if (p.ok()) seen[i] = p->pointer;
      });
    for (auto& th : threads) th.join();
    for (uint8_t* p : seen) CHECK(p == seen[0]);
    CHECK(seen[0] != nullptr);
    CHECK(t->stats().misses == 1);
    CHECK(t->device_stats()[0]["pinned_bytes"] == 128 * kKiB);
    for (size_t i = 0; i < seen.size(); ++i) t->unpin(0, key(7));
    CHECK(t->device_stats()[0]["pinned_bytes"] == 0);
  }
}

TEST_CASE("hbm tier: options are checked; devices default from the environment", "[hbm]") {
  HbmTier::Options o;
  o.backend = "emulated";
  o.devices = {0};
  o.capacity = 1024;
  CHECK(HbmTier::open(o, nullptr, 0).status().code() == StatusCode::kInvalidArgument);
  o.capacity = 1 << 20;
  o.devices = {0, 0};
  CHECK(HbmTier::open(o, nullptr, 0).status().code() == StatusCode::kInvalidArgument);
  o.devices = {0, 1};
  auto two = HbmTier::open(o, nullptr, 0);
  REQUIRE(two.ok());
  CHECK((*two)->has_device(1));
  CHECK_FALSE((*two)->has_device(2));
  CHECK((*two)->stats().capacity_bytes == 2u << 20);
  CHECK(resolve_hbm_devices({3, 1}) == std::vector<int>{3, 1});
  const char* saved = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string keep = saved ? saved : "";
  ::setenv("CUDA_VISIBLE_DEVICES", "2,5,7", 1);
  CHECK(resolve_hbm_devices({}) == std::vector<int>{0, 1, 2});  // renumbered from 0, as CUDA does
  if (saved)
    ::setenv("CUDA_VISIBLE_DEVICES", keep.c_str(), 1);
  else
    ::unsetenv("CUDA_VISIBLE_DEVICES");
}

}  // namespace cairn
