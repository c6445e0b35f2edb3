#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tiers/dram/arena.hpp"

namespace cairn {
namespace {

constexpr uint64_t kUnit = 64;  // the allocator's default alignment

// ---- running code in a child process (death tests, cross-process mappings) ----

struct ChildOutcome {
  int wait_status = 0;
  bool timed_out = false;
  std::string err;  // what the child wrote to stderr
};

// Runs body() in a forked child whose exit code is body's return value. The child is killed if it
// outlives timeout; its stderr is captured.
ChildOutcome run_in_child(const std::function<int()>& body,
                          std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[1]);
    // Die by the signal itself rather than through the test runner's or a sanitizer's handler,
    // and keep the runner's report (it is still the parent's stdout) quiet.
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS}) ::signal(sig, SIG_DFL);
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);
    ::alarm(static_cast<unsigned>(timeout.count() / 1000 + 1));  // a backstop if the parent dies
    int code = 99;
    try {
      code = body();
    } catch (...) {  // never let the child unwind into the test runner
    }
    ::_exit(code);
  }
  ::close(pipe_fds[1]);
  ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);

  ChildOutcome out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto drain = [&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buf, sizeof buf)) > 0) out.err.append(buf, static_cast<size_t>(n));
  };
  for (;;) {
    drain();
    const pid_t r = ::waitpid(pid, &out.wait_status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &out.wait_status, 0);
      out.timed_out = true;
      break;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    ::poll(&p, 1, 5);
  }
  drain();
  ::close(pipe_fds[0]);
  return out;
}

bool killed_by(const ChildOutcome& o, int sig) {
  return !o.timed_out && WIFSIGNALED(o.wait_status) && WTERMSIG(o.wait_status) == sig;
}
bool exited_with(const ChildOutcome& o, int code) {
  return !o.timed_out && WIFEXITED(o.wait_status) && WEXITSTATUS(o.wait_status) == code;
}

// ---- a reference model: one flag per allocation unit ----

struct FreeRuns {
  size_t count = 0;
  uint64_t largest = 0;  // units
  uint64_t free_units = 0;
};

FreeRuns free_runs(const std::vector<uint8_t>& used_units) {
  FreeRuns r;
  uint64_t run = 0;
  for (uint8_t u : used_units) {
    if (u == 0) {
      if (run == 0) ++r.count;
      ++run;
      ++r.free_units;
      r.largest = std::max(r.largest, run);
    } else {
      run = 0;
    }
  }
  return r;
}

void check_against_model(const ArenaAllocator& a, const std::vector<uint8_t>& used_units) {
  const FreeRuns r = free_runs(used_units);
  REQUIRE(a.free_bytes() == r.free_units * a.alignment());
  REQUIRE(a.used() == a.capacity() - r.free_units * a.alignment());
  REQUIRE(a.free_extent_count() == r.count);  // fully coalesced: one extent per maximal run
  REQUIRE(a.largest_free() == r.largest * a.alignment());
}

// ---- ArenaAllocator ----

TEST_CASE("allocator: basics", "[arena]") {
  ArenaAllocator a(100 * kUnit);
  CHECK(a.capacity() == 100 * kUnit);
  CHECK(a.alignment() == kUnit);
  CHECK(a.used() == 0);
  CHECK(a.free_bytes() == 100 * kUnit);
  CHECK(a.largest_free() == 100 * kUnit);
  CHECK(a.free_extent_count() == 1);

  auto x = a.allocate(10 * kUnit);
  REQUIRE(x);
  CHECK(*x == 0);
  auto y = a.allocate(1);
  REQUIRE(y);
  CHECK(*y == 10 * kUnit);
  CHECK(a.used() == 11 * kUnit);
  CHECK(a.largest_free() == 89 * kUnit);
  CHECK(a.free_extent_count() == 1);

  a.free(*x, 10 * kUnit);
  CHECK(a.used() == kUnit);
  CHECK(a.free_extent_count() == 2);
  a.free(*y, 1);
  CHECK(a.used() == 0);
  CHECK(a.free_extent_count() == 1);
  CHECK(a.largest_free() == a.capacity());
}

TEST_CASE("allocator: an empty arena has nothing to give", "[arena]") {
  ArenaAllocator a(0);
  CHECK(a.free_extent_count() == 0);
  CHECK(a.largest_free() == 0);
  CHECK_FALSE(a.allocate(0));
  CHECK_FALSE(a.allocate(1));
}

TEST_CASE("allocator: rejects a bad geometry at construction", "[arena]") {
  CHECK_THROWS_AS(ArenaAllocator(1024, 0), std::invalid_argument);
  CHECK_THROWS_AS(ArenaAllocator(1024, 48), std::invalid_argument);
  CHECK_THROWS_AS(ArenaAllocator(1000, 64), std::invalid_argument);
  CHECK_NOTHROW(ArenaAllocator(1000, 8));
  CHECK_NOTHROW(ArenaAllocator(7, 1));
}

TEST_CASE("allocator: sizes round up to the alignment, 0 counts as one unit", "[arena]") {
  constexpr uint64_t kPage = 4096;
  ArenaAllocator a(64 * kPage, kPage);
  CHECK(a.round_up(0) == kPage);
  CHECK(a.round_up(1) == kPage);
  CHECK(a.round_up(kPage) == kPage);
  CHECK(a.round_up(kPage + 1) == 2 * kPage);
  CHECK(a.round_up(3 * kPage - 1) == 3 * kPage);

  std::vector<std::pair<uint64_t, uint64_t>> got;
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, kPage - 1, kPage, kPage + 1, 5 * kPage + 7}) {
    auto off = a.allocate(size);
    REQUIRE(off);
    CHECK(*off % kPage == 0);
    got.emplace_back(*off, size);
  }
  CHECK(a.used() == (1 + 1 + 1 + 1 + 2 + 6) * kPage);
  for (auto [off, size] : got) a.free(off, size);
  CHECK(a.used() == 0);
  CHECK(a.free_extent_count() == 1);
}

TEST_CASE("allocator: best fit picks the smallest hole that fits, lowest offset on ties", "[arena]") {
  ArenaAllocator a(100 * kUnit);
  // Layout in units: A[0,10) B[10,15) C[15,35) D[35,38) E[38,46) F[46,48) G[48,56) H[56,58) rest.
  const std::array<uint64_t, 8> sizes = {10, 5, 20, 3, 8, 2, 8, 2};
  std::vector<uint64_t> offs;
  for (uint64_t s : sizes) {
    auto off = a.allocate(s * kUnit);
    REQUIRE(off);
    offs.push_back(*off / kUnit);
  }
  REQUIRE(offs == std::vector<uint64_t>{0, 10, 15, 35, 38, 46, 48, 56});
  // Holes: 10 @0, 20 @15, 8 @38, 8 @48, and the 42-unit tail @58.
  a.free(0, 10 * kUnit);
  a.free(15 * kUnit, 20 * kUnit);
  a.free(38 * kUnit, 8 * kUnit);
  a.free(48 * kUnit, 8 * kUnit);
  CHECK(a.free_extent_count() == 5);
  CHECK(a.largest_free() == 42 * kUnit);

  CHECK(a.allocate(7 * kUnit) == 38 * kUnit);   // an 8-hole; the lower of the two
  CHECK(a.allocate(8 * kUnit) == 48 * kUnit);   // the other 8-hole, exact fit
  CHECK(a.allocate(9 * kUnit) == 0);            // the 10-hole
  CHECK(a.allocate(16 * kUnit) == 15 * kUnit);  // the 20-hole
  CHECK(a.allocate(30 * kUnit) == 58 * kUnit);  // only the tail is large enough
  CHECK(a.allocate(1 * kUnit) == 9 * kUnit);    // the 1-unit leftovers: lowest offset first
  CHECK(a.allocate(1 * kUnit) == 45 * kUnit);
  CHECK(a.allocate(4 * kUnit) == 31 * kUnit);  // 4-unit leftover of the 20-hole beats the tail
  CHECK(a.largest_free() == 12 * kUnit);
}

TEST_CASE("allocator: every free order coalesces back to one extent", "[arena]") {
  // Six blocks that fill the arena exactly, freed in all 720 orders.
  const std::array<uint64_t, 6> sizes = {1, 2, 3, 4, 5, 9};
  const uint64_t capacity = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}) * kUnit;
  std::array<int, 6> order = {0, 1, 2, 3, 4, 5};
  int permutations = 0;
  do {
    ArenaAllocator a(capacity);
    std::vector<uint64_t> offs;
    for (uint64_t s : sizes) {
      auto off = a.allocate(s * kUnit);
      REQUIRE(off);
      offs.push_back(*off);
    }
    REQUIRE(a.free_bytes() == 0);
    REQUIRE_FALSE(a.allocate(0));
    std::vector<uint8_t> used_units(capacity / kUnit, 1);
    for (int i : order) {
      a.free(offs[static_cast<size_t>(i)], sizes[static_cast<size_t>(i)] * kUnit);
      std::fill_n(used_units.begin() + static_cast<std::ptrdiff_t>(offs[static_cast<size_t>(i)] / kUnit),
                  sizes[static_cast<size_t>(i)], uint8_t{0});
      check_against_model(a, used_units);
    }
    REQUIRE(a.free_extent_count() == 1);
    REQUIRE(a.largest_free() == capacity);
    REQUIRE(a.used() == 0);
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  CHECK(permutations == 720);
}

TEST_CASE("allocator: an aligned sub-range of an allocation can be freed on its own", "[arena]") {
  ArenaAllocator a(16 * kUnit);
  auto big = a.allocate(10 * kUnit);
  auto other = a.allocate(6 * kUnit);
  REQUIRE(big == 0);
  REQUIRE(other == 10 * kUnit);
  REQUIRE(a.free_bytes() == 0);

  a.free(3 * kUnit, 3 * kUnit);  // units 3-5 only
  CHECK(a.used() == 13 * kUnit);
  CHECK(a.free_extent_count() == 1);
  CHECK(a.largest_free() == 3 * kUnit);
  CHECK(a.allocate(4 * kUnit) == std::nullopt);

  a.free(0, 3 * kUnit);  // units 0-2: merges with 3-5
  CHECK(a.free_extent_count() == 1);
  CHECK(a.largest_free() == 6 * kUnit);

  a.free(9 * kUnit, 0);  // unit 9 (size 0 is one unit)
  CHECK(a.free_extent_count() == 2);

  a.free(6 * kUnit, 3 * kUnit - 5);  // units 6-8, a size that rounds up; bridges both sides
  CHECK(a.free_extent_count() == 1);
  CHECK(a.largest_free() == 10 * kUnit);
  CHECK(a.used() == 6 * kUnit);

  // The remaining block, freed from the middle outwards.
  a.free(12 * kUnit, kUnit);
  a.free(15 * kUnit, kUnit);
  a.free(13 * kUnit, 2 * kUnit);
  CHECK(a.free_extent_count() == 2);
  a.free(10 * kUnit, 2 * kUnit);
  CHECK(a.free_extent_count() == 1);
  CHECK(a.largest_free() == a.capacity());
  CHECK(a.used() == 0);
}

TEST_CASE("allocator: exhaustion returns nullopt and recovers after a free", "[arena]") {
  ArenaAllocator a(8 * kUnit);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 8; ++i) {
    auto off = a.allocate(kUnit);
    REQUIRE(off);
    offs.push_back(*off);
  }
  CHECK_FALSE(a.allocate(0));
  CHECK_FALSE(a.allocate(1));
  CHECK(a.largest_free() == 0);
  CHECK(a.free_extent_count() == 0);

  // Fragmented: 4 free units in total but no two adjacent.
  for (size_t i = 0; i < 8; i += 2) a.free(offs[i], kUnit);
  CHECK(a.free_bytes() == 4 * kUnit);
  CHECK_FALSE(a.allocate(kUnit + 1));
  CHECK(a.allocate(kUnit) == 0);

  // Sizes no arena can hold, including ones whose rounding would overflow.
  CHECK_FALSE(a.allocate(9 * kUnit));
  CHECK_FALSE(a.allocate(std::numeric_limits<uint64_t>::max()));
  CHECK_FALSE(a.allocate(std::numeric_limits<uint64_t>::max() - kUnit + 2));
}

TEST_CASE("allocator: a bad free aborts with a message", "[arena]") {
  auto expect_abort = [](const std::function<void(ArenaAllocator&)>& misuse, const char* needle) {
    const ChildOutcome o = run_in_child([&] {
      ArenaAllocator a(16 * kUnit);
      (void)a.allocate(4 * kUnit);  // [0, 4)
      (void)a.allocate(4 * kUnit);  // [4, 8)
      a.free(0, 4 * kUnit);         // [0, 4) free again
      misuse(a);
      return 0;  // not reached if the misuse was caught
    });
    INFO("child stderr: " << o.err);
    CHECK(killed_by(o, SIGABRT));
    CHECK(o.err.find("ArenaAllocator::free") != std::string::npos);
    CHECK(o.err.find(needle) != std::string::npos);
  };
  SECTION("double free") {
    expect_abort([](ArenaAllocator& a) { a.free(0, 4 * kUnit); }, "overlaps the free extent [0, 256)");
  }
  SECTION("a range that straddles allocated and free space") {
    expect_abort([](ArenaAllocator& a) { a.free(2 * kUnit, 4 * kUnit); }, "overlaps");
  }
  SECTION("the never-allocated tail") {
    expect_abort([](ArenaAllocator& a) { a.free(12 * kUnit, kUnit); }, "overlaps");
  }
  SECTION("past the end") {
    expect_abort([](ArenaAllocator& a) { a.free(16 * kUnit, kUnit); }, "outside the arena");
    expect_abort([](ArenaAllocator& a) { a.free(15 * kUnit, 2 * kUnit); }, "outside the arena");
    expect_abort([](ArenaAllocator& a) { a.free(15 * kUnit, kUnit + 1); }, "outside the arena");
    expect_abort([](ArenaAllocator& a) { a.free(kUnit, std::numeric_limits<uint64_t>::max()); }, "outside the arena");
  }
  SECTION("a misaligned offset") {
    expect_abort([](ArenaAllocator& a) { a.free(4 * kUnit + 8, kUnit); }, "not a multiple");
  }
}

TEST_CASE("allocator: randomized stress against a bitmap model", "[arena]") {
  constexpr uint64_t kUnits = 16384;
  constexpr int kOps = 200000;
  ArenaAllocator a(kUnits * kUnit);
  std::vector<uint8_t> used_units(kUnits, 0);
  uint64_t model_used_units = 0;
  struct Live {
    uint64_t unit;
    uint64_t units;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(20240611);
  auto uniform = [&](uint64_t lo, uint64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };

  auto random_size = [&]() -> uint64_t {
    const uint64_t pick = uniform(0, 99);
    if (pick < 60) return uniform(0, 4 * kUnit);
    if (pick < 90) return uniform(1, 64 * kUnit);
    return uniform(1, 1024 * kUnit);
  };
  // A byte size that rounds up to exactly `units` units.
  auto bytes_for = [&](uint64_t units) -> uint64_t {
    if (units == 1 && uniform(0, 3) == 0) return 0;
    return uniform((units - 1) * kUnit + 1, units * kUnit);
  };
  auto mark = [&](uint64_t unit, uint64_t units, uint8_t value) {
    for (uint64_t u = unit; u < unit + units; ++u) {
      if (used_units[u] == value) FAIL("unit " << u << " is already " << int{value});
      used_units[u] = value;
    }
    if (value) {
      model_used_units += units;
    } else {
      model_used_units -= units;
    }
  };
  // Frees [first, first + count) units of live[i]; keeps the pieces on either side live.
  auto free_part = [&](size_t i, uint64_t first, uint64_t count) {
    const Live whole = live[i];
    live[i] = live.back();
    live.pop_back();
    a.free((whole.unit + first) * kUnit, bytes_for(count));
    mark(whole.unit + first, count, 0);
    if (first > 0) live.push_back({whole.unit, first});
    if (first + count < whole.units) {
      live.push_back({whole.unit + first + count, whole.units - first - count});
    }
  };

  int failed_allocations = 0;
  int sub_range_frees = 0;
  for (int op = 0; op < kOps; ++op) {
    const bool crowded = model_used_units * 4 > kUnits * 3;
    const bool do_allocate = live.empty() || uniform(0, 99) < (crowded ? 35u : 60u);
    if (do_allocate) {
      const uint64_t size = random_size();
      const uint64_t need = a.round_up(size);
      auto off = a.allocate(size);
      if (!off) {
        ++failed_allocations;
        if (a.largest_free() >= need) FAIL("allocate(" << size << ") failed with a fitting extent");
        if (failed_allocations % 64 == 0 && free_runs(used_units).largest * kUnit >= need) {
          FAIL("allocate(" << size << ") failed but the model has room");
        }
      } else {
        if (*off % kUnit != 0 || *off + need > a.capacity()) FAIL("bad offset " << *off);
        mark(*off / kUnit, need / kUnit, 1);  // fails on overlap with a live allocation
        live.push_back({*off / kUnit, need / kUnit});
      }
    } else {
      const size_t i = static_cast<size_t>(uniform(0, live.size() - 1));
      const uint64_t units = live[i].units;
      if (units >= 2 && uniform(0, 9) < 3) {
        const uint64_t first = uniform(0, units - 1);
        free_part(i, first, uniform(1, units - first));
        ++sub_range_frees;
      } else {
        free_part(i, 0, units);
      }
    }
    if (a.used() != model_used_units * kUnit) FAIL("used() " << a.used() << " at op " << op);
    if (a.free_bytes() != (kUnits - model_used_units) * kUnit) FAIL("free_bytes() at op " << op);
    if (op % 997 == 0) check_against_model(a, used_units);
  }
  check_against_model(a, used_units);
  CHECK(failed_allocations > 0);  // the run did reach exhaustion
  CHECK(sub_range_frees > 1000);

  // Drain in random order, splitting some allocations into pieces.
  while (!live.empty()) {
    const size_t i = static_cast<size_t>(uniform(0, live.size() - 1));
    const uint64_t units = live[i].units;
    if (units >= 3 && uniform(0, 1) == 0) {
      free_part(i, uniform(1, units - 2), 1);
    } else {
      free_part(i, 0, units);
    }
  }
  check_against_model(a, used_units);
  CHECK(a.used() == 0);
  CHECK(a.free_extent_count() == 1);
  CHECK(a.largest_free() == a.capacity());
}

// ---- SharedArena and ArenaView ----

uint64_t page() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

TEST_CASE("shared arena: capacity rounds up to whole pages", "[arena]") {
  auto arena = SharedArena::create(page() + 1, "cairn-test-round");
  REQUIRE(arena.ok());
  CHECK((*arena)->capacity() == 2 * page());
  CHECK((*arena)->fd() >= 0);
  CHECK((*arena)->base() != nullptr);
  CHECK((::fcntl((*arena)->fd(), F_GETFD) & FD_CLOEXEC) != 0);
}

TEST_CASE("shared arena: a zero capacity is rejected", "[arena]") {
  auto arena = SharedArena::create(0, "cairn-test-zero");
  REQUIRE_FALSE(arena.ok());
  CHECK(arena.status().code() == StatusCode::kInvalidArgument);
  CHECK(arena.status().message().find("cairn-test-zero") != std::string::npos);
}

TEST_CASE("shared arena: a 1 GiB arena is created without touching its pages", "[arena]") {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  auto arena = SharedArena::create(kGiB, "cairn-test-lazy");
  REQUIRE(arena.ok());
  REQUIRE((*arena)->capacity() == kGiB);
  std::vector<unsigned char> resident(kGiB / page());
  REQUIRE(::mincore((*arena)->base(), kGiB, resident.data()) == 0);
  CHECK(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }) == 0);
  // Touching both ends works.
  (*arena)->base()[0] = 1;
  (*arena)->base()[kGiB - 1] = 2;
  CHECK((*arena)->base()[kGiB - 1] == 2);
}

TEST_CASE("arena view: the daemon and a client see the same bytes", "[arena]") {
  auto arena = SharedArena::create(1 << 20, "cairn-test-view");
  REQUIRE(arena.ok());
  SharedArena& daemon = **arena;
  const int client_fd = ::dup(daemon.fd());
  REQUIRE(client_fd >= 0);
  auto view = ArenaView::map(client_fd, daemon.capacity());
  REQUIRE(view.ok());
  ArenaView& client = **view;
  CHECK(client.size() == daemon.capacity());
  CHECK(client.read_base() != client.write_base());
  // The view keeps the descriptor it was given (copy-on-write views are mapped from it).
  CHECK(::fcntl(client_fd, F_GETFD) != -1);
  CHECK(::fcntl(daemon.fd(), F_GETFD) != -1);

  const char kFromDaemon[] = "weights written by the daemon";
  std::memcpy(daemon.base() + 4096, kFromDaemon, sizeof kFromDaemon);
  CHECK(std::memcmp(client.read_base() + 4096, kFromDaemon, sizeof kFromDaemon) == 0);

  const char kFromClient[] = "bytes a client wrote into its allocation";
  std::memcpy(client.write_base() + 65536, kFromClient, sizeof kFromClient);
  CHECK(std::memcmp(daemon.base() + 65536, kFromClient, sizeof kFromClient) == 0);
  CHECK(std::memcmp(client.read_base() + 65536, kFromClient, sizeof kFromClient) == 0);

  // The last byte is mapped in all three.
  daemon.base()[daemon.capacity() - 1] = 0x5a;
  CHECK(client.read_base()[client.size() - 1] == 0x5a);

  // Destroying the view closes the descriptor; the daemon's own is untouched.
  view->reset();
  CHECK(::fcntl(client_fd, F_GETFD) == -1);
  CHECK(::fcntl(daemon.fd(), F_GETFD) != -1);
}

TEST_CASE("arena view: copy-on-write views never change the arena and outlive the view", "[arena]") {
  const uint64_t cap = 8ull << 20;
  auto arena = SharedArena::create(cap, "cairn-test-cow");
  REQUIRE(arena.ok());
  uint8_t* base = (*arena)->base();
  for (uint64_t i = 0; i < cap; ++i) base[i] = static_cast<uint8_t>(i * 7 + 1);
  auto view = ArenaView::map(::dup((*arena)->fd()), (*arena)->capacity());
  REQUIRE(view.ok());

  // Not page-aligned, over 1 MiB (populated), and a small one: both see the arena's bytes.
  auto big = (*view)->map_private(4096 + 100, 3ull << 20);
  auto small = (*view)->map_private(5000, 64);
  REQUIRE(big.ok());
  REQUIRE(small.ok());
  CHECK(std::memcmp(*big, base + 4196, 3ull << 20) == 0);
  CHECK(std::memcmp(*small, base + 5000, 64) == 0);
  // A write changes that view only: not the arena, not the shared views, not another private view
  // of the same bytes.
  std::memset(*big, 0xee, 2ull << 20);
  CHECK((*big)[0] == 0xee);
  CHECK(base[4196] == static_cast<uint8_t>(4196 * 7 + 1));
  CHECK((*view)->read_base()[4196] == base[4196]);
  CHECK(std::memcmp(*small, base + 5000, 64) == 0);
  // Bytes nobody wrote still show the arena (the caller holds a lease, so they do not change).
  CHECK(std::memcmp(*big + (2ull << 20), base + 4196 + (2ull << 20), 1ull << 20) == 0);

  // Out of range and empty views are refused with a message.
  auto bad = (*view)->map_private(cap - 10, 20);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("outside the arena") != std::string::npos);
  CHECK_FALSE((*view)->map_private(0, 0).ok());

  // The views outlive the ArenaView they came from, until unmapped.
  view->reset();
  CHECK((*big)[1] == 0xee);
  CHECK((*small)[1] == base[5001]);
  ArenaView::unmap_private(*big, 3ull << 20);
  ArenaView::unmap_private(*small, 64);
}

// Pages of [p, p + n) that have a page-table entry in this process (/proc/self/pagemap bit 63),
// or -1 when pagemap cannot be read.
static long mapped_pages(const uint8_t* p, uint64_t n) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long present = 0;
  for (uint64_t off = 0; off < n; off += 4096) {
    uint64_t entry = 0;
    const off_t at = static_cast<off_t>((reinterpret_cast<uintptr_t>(p) + off) / 4096 * 8);
    if (::pread(fd, &entry, sizeof entry, at) != static_cast<ssize_t>(sizeof entry)) {
      ::close(fd);
      return -1;
    }
    present += static_cast<long>(entry >> 63);
  }
  ::close(fd);
  return present;
}

TEST_CASE("arena view: prefault maps pages once and any range is safe to ask for", "[arena]") {
  const uint64_t cap = 16ull << 20;
  auto arena = SharedArena::create(cap, "cairn-test-prefault");
  REQUIRE(arena.ok());
  std::memset((*arena)->base(), 3, cap);
  auto view = ArenaView::map(::dup((*arena)->fd()), (*arena)->capacity());
  REQUIRE(view.ok());
  ArenaView& v = **view;
  const long before = mapped_pages(v.read_base(), cap);
  if (before < 0) {
    WARN("skipped: /proc/self/pagemap cannot be read here");
    return;
  }
  CHECK(before == 0);  // a fresh mapping
  // Ranges across granules, past the end, empty, tiny: none fails or maps outside the arena.
  v.prefault(1000, 5ull << 20, false);  // granules 0..2
  CHECK(mapped_pages(v.read_base(), 6ull << 20) == static_cast<long>((6ull << 20) / 4096));
  // Granules 3..6 were not asked for (the kernel's fault-around may map a few pages past a range).
  CHECK(mapped_pages(v.read_base() + (6ull << 20), 8ull << 20) < 64);
  v.prefault(cap - 4096, 1ull << 30, false);
  v.prefault(cap + 10, 1ull << 20, true);
  v.prefault(0, 0, true);
  v.prefault(0, 4096, false);  // under 1 MiB: left to fault
  v.prefault(0, cap, true);
  CHECK(mapped_pages(v.write_base(), cap) == static_cast<long>(cap / 4096));
  CHECK(mapped_pages(v.read_base() + (6ull << 20), 8ull << 20) < 64);  // the read-only view is apart
  v.prefault(0, cap, false);
  CHECK(mapped_pages(v.read_base(), cap) == static_cast<long>(cap / 4096));
  uint64_t sum = 0;
  for (uint64_t i = 0; i < cap; i += 4096) sum += v.read_base()[i];
  CHECK(sum == 3 * (cap / 4096));
}

TEST_CASE("arena view: the read-only mapping faults on a write", "[arena]") {
  auto arena = SharedArena::create(1 << 16, "cairn-test-ro");
  REQUIRE(arena.ok());
  auto view = ArenaView::map(::dup((*arena)->fd()), (*arena)->capacity());
  REQUIRE(view.ok());
  const uint8_t* ro = (*view)->read_base();
  const ChildOutcome o = run_in_child([ro] {
    *const_cast<volatile uint8_t*>(ro + 100) = 1;
    return 0;
  });
  INFO("child stderr: " << o.err);
  CHECK(killed_by(o, SIGSEGV));
  CHECK((*arena)->base()[100] == 0);

  // The same write through write_base succeeds.
  const ChildOutcome ok = run_in_child([&view] {
    (*view)->write_base()[100] = 7;
    return 0;
  });
  CHECK(exited_with(ok, 0));
  CHECK((*arena)->base()[100] == 7);
}

TEST_CASE("arena view: a forked process maps the descriptor and shares bytes", "[arena]") {
  auto arena = SharedArena::create(1 << 20, "cairn-test-fork");
  REQUIRE(arena.ok());
  SharedArena& daemon = **arena;
  for (uint64_t i = 0; i < daemon.capacity(); i += 4096) daemon.base()[i] = static_cast<uint8_t>(i >> 12);
  const int fd = daemon.fd();
  const uint64_t size = daemon.capacity();

  const ChildOutcome o = run_in_child([fd, size] {
    auto view = ArenaView::map(::dup(fd), size);
    if (!view.ok()) return 2;
    for (uint64_t i = 0; i < size; i += 4096) {
      if ((*view)->read_base()[i] != static_cast<uint8_t>(i >> 12)) return 3;
    }
    std::memcpy((*view)->write_base() + 8192 + 1, "child", 5);
    return 0;
  });
  INFO("child stderr: " << o.err);
  REQUIRE(exited_with(o, 0));
  CHECK(std::memcmp(daemon.base() + 8192 + 1, "child", 5) == 0);
}

TEST_CASE("arena view: a size that does not match the descriptor is rejected", "[arena]") {
  auto arena = SharedArena::create(1 << 20, "cairn-test-size");
  REQUIRE(arena.ok());
  const uint64_t capacity = (*arena)->capacity();

  for (uint64_t wrong : {capacity + page(), capacity - page(), capacity + 1}) {
    const int fd = ::dup((*arena)->fd());
    REQUIRE(fd >= 0);
    auto view = ArenaView::map(fd, wrong);
    REQUIRE_FALSE(view.ok());
    CHECK(view.status().code() == StatusCode::kProtocol);
    CHECK(view.status().message().find(std::to_string(capacity)) != std::string::npos);
    CHECK(view.status().message().find(std::to_string(wrong)) != std::string::npos);
    CHECK(::fcntl(fd, F_GETFD) == -1);  // closed on failure too
  }

  const int fd = ::dup((*arena)->fd());
  auto empty = ArenaView::map(fd, 0);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == StatusCode::kInvalidArgument);
  CHECK(::fcntl(fd, F_GETFD) == -1);

  auto bad_fd = ArenaView::map(-1, capacity);
  REQUIRE_FALSE(bad_fd.ok());
  CHECK(bad_fd.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("shared arena: the page backing is read from the kernel's shmem THP setting", "[arena]") {
  char tmpl[] = "/tmp/cairn-thp-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  auto write = [](const std::string& path, const char* text) {
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  CHECK(shmem_thp_mode(dir) == "");  // no such files: a kernel without shmem THP
  write(dir + "/shmem_enabled", "always within_size advise [never] deny force\n");
  CHECK(shmem_thp_mode(dir) == "never");
  REQUIRE(::mkdir((dir + "/hugepages-2048kB").c_str(), 0755) == 0);
  write(dir + "/hugepages-2048kB/shmem_enabled", "always [inherit] within_size advise never\n");
  CHECK(shmem_thp_mode(dir) == "never");  // inherit: the global setting
  write(dir + "/hugepages-2048kB/shmem_enabled", "always inherit within_size [advise] never\n");
  CHECK(shmem_thp_mode(dir) == "advise");  // the 2 MiB size's own setting wins
  write(dir + "/shmem_enabled", "garbage without a choice\n");
  write(dir + "/hugepages-2048kB/shmem_enabled", "[inherit]\n");
  CHECK(shmem_thp_mode(dir) == "");
  (void)std::system(("rm -rf " + dir).c_str());

  // The arena says what backs it, on this machine's setting.
  auto arena = SharedArena::create(4u << 20, "cairn-test-pages");
  REQUIRE(arena.ok());
  const std::string mode = shmem_thp_mode();
  const bool huge = mode == "always" || mode == "within_size" || mode == "advise" || mode == "force";
  CHECK((*arena)->huge_pages() == huge);
  CHECK((*arena)->pages().find(huge ? "2 MiB" : "4 KiB") == 0);
}

}  // namespace
}  // namespace cairn
