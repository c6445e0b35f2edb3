// What the tiers and the commit durability levels cost, against physical limits measured in the same
// run on the same machine (median of N repeats):
//
//   1. commit: blocking time of a large commit at durability `memory`, from the moment the client
//      starts asking for arena space and writing the tensor bytes into it until Writer::commit
//      returns with the memory acknowledgement. Baselines: memcpy of the same bytes into a
//      pre-faulted buffer, and write()+fsync of the same bytes to a file on the repository's
//      filesystem. The time until the model reaches `global` (the `flush` request returns) is
//      reported for information.
//   2. NVMe reads: models committed `local`, the daemon restarted with tiers.nvme.persistent so that
//      DRAM is empty and the burst buffer full, then read back through the client (read into a user
//      buffer, and zero-copy map). `stats` must show every byte came from NVMe, none from the
//      repository. Baseline: an O_DIRECT sequential read (4 MiB reads, one at a time) of a file of the
//      same size in the burst buffer's directory.
//   3. DRAM hits: a resident model read into a user buffer and mapped, against memcpy between two
//      pre-faulted buffers. The map is measured as its latency, then as map + copy-out and map + a
//      scan of every byte (a zero-copy read has no bandwidth of its own).
//
// Runs real engines and servers in-process on temporary directories and talks to them through the
// public C++ client (cairn/client.hpp over libcairn.so) over the Unix socket, exactly as an
// application does.
//
// Usage: cairn_bench_tiers [--repeats R] [--commit-mib N] [--nvme-mib N] [--dram-hit-mib N]
//                          [--dir DIR] [--only commit|nvme|dram] [--quick] [--json FILE]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cairn/client.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "daemon/engine.hpp"
#include "daemon/server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kAlign = 4096;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "cairn_bench_tiers: %s\n", what.c_str());
  std::exit(1);
}

void check(const cairn::Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.to_string());
}

void check(const cairn::v1::Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.message());
}

template <typename T>
T value_or_die(cairn::Result<T> r, const char* what) {
  check(r.status(), what);
  return std::move(r).value();
}

template <typename T>
T value_or_die(cairn::v1::Result<T> r, const char* what) {
  check(r.status(), what);
  return std::move(*r);
}

// Commit options: durability d, waited for or not (then the model is visible when the call returns).
cairn_commit_options commit_options(cairn_durability d, bool wait) {
  cairn_commit_options o = CAIRN_COMMIT_OPTIONS_INIT;
  o.durability = d;
  o.wait = wait ? 1 : 0;
  return o;
}

// Page-aligned, pre-faulted memory (usable with O_DIRECT).
struct Buffer {
  uint8_t* p = nullptr;
  uint64_t n = 0;
  explicit Buffer(uint64_t bytes) : n(bytes) {
    void* q = nullptr;
    if (::posix_memalign(&q, kAlign, std::max<uint64_t>(bytes, kAlign)) != 0) die("out of memory");
    p = static_cast<uint8_t*>(q);
    std::memset(p, 1, n);  // fault every page in before anything is timed
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return p; }
};

// splitmix64: incompressible bytes, several GB/s.
void fill_random(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
}

// Makes every 4 KiB page (and so every chunk) of p differ from any earlier version.
void stamp(uint8_t* p, uint64_t n, uint64_t tag) {
  for (uint64_t i = 0; i + 16 <= n; i += kAlign) {
    std::memcpy(p + i, &tag, 8);
    std::memcpy(p + i + 8, &i, 8);
  }
}

uint64_t scan(const uint8_t* p, uint64_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    a += v[0], b += v[1], c += v[2], d += v[3];
  }
  return a + b + c + d;
}

long minor_faults_this_thread() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Mean length of the runs of physically consecutive pages backing [p, p+n) (bytes), from
// /proc/self/pagemap; 0 when the page frame numbers are hidden (not root). A direct-I/O request
// carries at most max_segments runs, so memory in 4 KiB runs makes small device requests.
double physical_run_bytes(const uint8_t* p, uint64_t n) {
  const long page = ::sysconf(_SC_PAGESIZE);
  int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / static_cast<uint64_t>(page);
  const uint64_t pages = n / static_cast<uint64_t>(page);
  std::vector<uint64_t> e(pages);
  ssize_t got = ::pread(fd, e.data(), pages * 8, static_cast<off_t>(first * 8));
  ::close(fd);
  if (got != static_cast<ssize_t>(pages * 8)) return 0;
  uint64_t runs = 0, prev = 0;
  for (uint64_t i = 0; i < pages; ++i) {
    uint64_t pfn = e[i] & ((1ull << 55) - 1);
    if (!(e[i] >> 63) || pfn == 0) return 0;  // not present, or frame numbers hidden
    if (i == 0 || pfn != prev + 1) ++runs;
    prev = pfn;
  }
  return runs ? static_cast<double>(pages * static_cast<uint64_t>(page)) / static_cast<double>(runs) : 0;
}

// ---- the machine ----

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

uint64_t meminfo_kib(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10);
  return 0;
}

std::string fs_type(const std::string& path) {
  struct statfs s {};
  if (::statfs(path.c_str(), &s) != 0) return "unknown";
  switch (static_cast<uint64_t>(s.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794c7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0x2FC12FC1:
      return "zfs";
    case 0xF2F52010:
      return "f2fs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0x65735546:
      return "fuse";
    default: {
      char b[32];
      std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(s.f_type));
      return b;
    }
  }
}

// ---- an engine + server + client in this process ----

struct Daemon {
  std::unique_ptr<cairn::Engine> engine;
  std::unique_ptr<cairn::Server> server;
  cairn::v1::Client client;

  explicit Daemon(const cairn::Config& config) {
    engine = value_or_die(cairn::Engine::create(config), "starting the engine");
    // A daemon starts at the job's prologue, long before the first commit: let it back its arena.
    while (!engine->dram().prefault_finished()) ::usleep(1000);
    server = value_or_die(cairn::Server::start(*engine, config.socket), "starting the server");
    client = value_or_die(cairn::v1::Client::connect(config.socket), "connecting");
  }
  ~Daemon() {
    client = cairn::v1::Client();
    if (server) server->stop();
    server.reset();
    engine.reset();  // drains: every model reaches the repository; a persistent burst buffer is kept
  }
  json stats() { return json::parse(value_or_die(client.request(R"({"op":"stats"})"), "stats")); }
  double flush() {
    auto t0 = Clock::now();
    check(client.request(R"({"op":"flush"})").status(), "flush");
    return seconds(Clock::now() - t0);
  }
};

cairn::Config base_config(const fs::path& dir, const std::string& tag) {
  cairn::Config c;
  c.repository = (dir / ("repo-" + tag)).string();
  c.socket = (dir / (tag + ".sock")).string();
  c.log.level = "warn";
  return c;
}

std::vector<std::string> tensor_names(const std::string& prefix, uint64_t n) {
  std::vector<std::string> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(prefix + std::to_string(i) + ".weight");
  return v;
}

// ---- 1. commit at durability memory ----

json bench_commit(const fs::path& dir, uint64_t bytes, uint64_t tensors, int repeats) {
  const uint64_t tensor_bytes = bytes / tensors;
  bytes = tensor_bytes * tensors;
  cairn::Config config = base_config(dir, "commit");
  config.tiers.dram.capacity = 3 * bytes + 64 * kMiB;
  config.tiers.nvme.path = (dir / "nvme-commit").string();
  config.tiers.nvme.capacity = 2 * bytes + 256 * kMiB;
  Daemon d(config);
  auto names = tensor_names("layer", tensors);

  Buffer src(bytes), dst(bytes);
  fill_random(src.data(), bytes, 11);
  const std::string file = (dir / "write-fsync-baseline.bin").string();

  // One cairn commit: returns (total, fill, commit request, minor faults while filling).
  struct CommitTimes {
    double total, fill, request;
    long faults;
    cairn::v1::Ticket ticket;
    double allocate = 0;  // arena space only: the allocate requests, of `fill`
  };
  // own_buffer: the caller hands add_tensor its own buffer (a new user's first path: the library
  // copies and hashes); else it writes into arena space from add_tensor_space (the daemon hashes
  // at commit).
  // sealed (arena space only): each tensor is sealed once written (Writer::seal_tensor), so
  // the client hashes it while the next is written and the commit reads nothing again.
  auto cairn_commit = [&](cairn::v1::Client& client, const std::string& id, bool own_buffer, bool sealed = false) {
    auto w = value_or_die(client.model_create(id), "create");
    long f0 = minor_faults_this_thread();
    double allocate = 0;
    auto t0 = Clock::now();
    for (uint64_t t = 0; t < tensors; ++t) {
      const std::vector<int64_t> shape{static_cast<int64_t>(tensor_bytes)};
      if (own_buffer) {
        check(w.add_tensor(names[t], src.data() + t * tensor_bytes, CAIRN_DTYPE_U8, shape), "add_tensor");
        continue;
      }
      const auto a0 = Clock::now();
      void* p = value_or_die(w.add_tensor_space(names[t], CAIRN_DTYPE_U8, shape), "add_tensor_space");
      allocate += seconds(Clock::now() - a0);
      std::memcpy(p, src.data() + t * tensor_bytes, tensor_bytes);
      if (sealed) check(w.seal_tensor(names[t]), "seal_tensor");
    }
    auto t1 = Clock::now();
    long f1 = minor_faults_this_thread();
    auto ticket = value_or_die(w.commit(commit_options(CAIRN_DURABILITY_MEMORY, /*wait=*/false)), "commit");
    auto t2 = Clock::now();
    return CommitTimes{seconds(t2 - t0), seconds(t1 - t0), seconds(t2 - t1), f1 - f0, std::move(ticket), allocate};
  };

  // The first commit on a fresh connection (not in the median): the client's mapping of the arena
  // has no page table entries yet, so writing into arena space faults on every page.
  stamp(src.data(), bytes, 0xfeed);
  CommitTimes cold_space = cairn_commit(d.client, "first-on-connection", false);
  d.flush();
  // The same from the caller's own buffer, on a connection of its own: once here, and once more in
  // each repeat below (the figure is the median: one sample alone is as noisy as the machine).
  std::vector<double> t_first_own;
  auto first_own_commit = [&](const std::string& id, uint64_t stamp_seed) {
    auto fresh = value_or_die(cairn::v1::Client::connect(config.socket), "connecting a new client");
    stamp(src.data(), bytes, stamp_seed);
    CommitTimes c = cairn_commit(fresh, id, true);
    check(c.ticket.wait(-1), "wait");
    t_first_own.push_back(c.total);
    d.flush();
  };
  first_own_commit("first-on-connection-own-buffer", 0xbeef);
  // Steady state, as in a long-running job: the client's mapping of the whole arena is populated
  // (arena space for one tensor of all free space, MADV_POPULATE_WRITE over it, the writer aborted).
  {
    // Free space can shrink between reading it and asking for it (the flusher, the demoter): ask
    // for less until one extent fits; this only warms the client's page tables.
    auto w = value_or_die(d.client.model_create("pre-fault"), "create");
    uint64_t want = d.engine->dram().free_bytes() / kAlign * kAlign;
    auto space = [&] {
      return w.add_tensor_space("all-" + std::to_string(want), CAIRN_DTYPE_U8, {static_cast<int64_t>(want)});
    };
    auto got = space();
    while (!got.ok() && want > 64 * kMiB) {
      want = want / 2 / kAlign * kAlign;
      got = space();
    }
    auto* all = static_cast<uint8_t*>(value_or_die(std::move(got), "arena space to pre-fault the client mapping"));
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;
#endif
    if (::madvise(all, want, MADV_POPULATE_WRITE) != 0)
      for (uint64_t i = 0; i < want; i += kAlign) all[i] = 0;
    w.abort();
  }
  const uint64_t demoted0 = d.stats()["movement"].value("demoted_bytes", uint64_t{0});

  std::vector<double> t_allocate;        // arena space: the allocate requests of the fill
  std::vector<double> t_memcpy_tensors;  // memcpy tensor by tensor into the pre-faulted buffer
  std::vector<double> t_memcpy, t_write, t_total, t_fill, t_request, t_global, t_own, t_own_request, t_sealed,
      t_sealed_request;
  std::vector<long> faults;
  for (int r = 0; r < repeats; ++r) {
    stamp(src.data(), bytes, 0x1000 + static_cast<uint64_t>(r));  // new bytes: no deduplication

    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    t_memcpy.push_back(seconds(Clock::now() - t0));
    // The same bytes copied as the arena-space writer copies them, one memcpy per tensor: glibc
    // copies one 1 GiB call faster than 8 calls of 128 MiB (another strategy for the largest sizes).
    t0 = Clock::now();
    for (uint64_t t = 0; t < tensors; ++t)
      std::memcpy(dst.data() + t * tensor_bytes, src.data() + t * tensor_bytes, tensor_bytes);
    t_memcpy_tensors.push_back(seconds(Clock::now() - t0));

    t0 = Clock::now();
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) die("creating " + file + ": " + std::strerror(errno));
    for (uint64_t off = 0; off < bytes;) {
      ssize_t n = ::write(fd, src.data() + off, std::min<uint64_t>(bytes - off, 64 * kMiB));
      if (n <= 0) die("writing " + file + ": " + std::strerror(errno));
      off += static_cast<uint64_t>(n);
    }
    if (::fsync(fd) != 0) die("fsync of " + file + ": " + std::strerror(errno));
    ::close(fd);
    t_write.push_back(seconds(Clock::now() - t0));
    ::unlink(file.c_str());

    CommitTimes c = cairn_commit(d.client, "checkpoint-" + std::to_string(r), false);
    double to_global = d.flush();  // every pending model in the repository: repeats do not overlap
    check(c.ticket.wait(-1), "wait");
    stamp(src.data(), bytes, 0x2000 + static_cast<uint64_t>(r));
    CommitTimes o = cairn_commit(d.client, "own-buffer-" + std::to_string(r), true);
    d.flush();
    check(o.ticket.wait(-1), "wait");
    t_own.push_back(o.total);
    t_own_request.push_back(o.request);
    stamp(src.data(), bytes, 0x3000 + static_cast<uint64_t>(r));
    CommitTimes sl = cairn_commit(d.client, "sealed-" + std::to_string(r), false, true);
    d.flush();
    check(sl.ticket.wait(-1), "wait");
    t_sealed.push_back(sl.total);
    t_sealed_request.push_back(sl.request);
    first_own_commit("first-on-connection-own-buffer-" + std::to_string(r), 0x4000 + static_cast<uint64_t>(r));
    t_total.push_back(c.total);
    t_fill.push_back(c.fill);
    t_allocate.push_back(c.allocate);
    t_request.push_back(c.request);
    t_global.push_back(c.total + to_global);
    faults.push_back(c.faults);
  }
  json st = d.stats();
  const double gb = static_cast<double>(bytes) / 1e9;
  json out;
  out["bytes"] = bytes;
  out["tensors"] = tensors;
  out["first_commit_on_connection_s"] = cold_space.total;
  out["first_commit_on_connection_fill_s"] = cold_space.fill;
  out["first_commit_on_connection_minor_faults"] = cold_space.faults;
  out["first_commit_own_buffer_s"] = median(t_first_own);
  out["first_commit_own_buffer_connections"] = t_first_own.size();
  out["commit_own_buffer_s"] = median(t_own);
  out["commit_own_buffer_request_s"] = median(t_own_request);
  out["commit_own_buffer_vs_memcpy"] = median(t_own) / median(t_memcpy);
  out["commit_sealed_s"] = median(t_sealed);
  out["commit_sealed_request_s"] = median(t_sealed_request);
  out["commit_sealed_vs_memcpy"] = median(t_sealed) / median(t_memcpy);
  out["demoted_bytes_during_repeats"] = st["movement"].value("demoted_bytes", uint64_t{0}) - demoted0;
  out["dram_capacity"] = config.tiers.dram.capacity;
  out["nvme_capacity"] = config.tiers.nvme.capacity;
  out["measured"] =
      "from the first allocate request for arena space (add_tensor_space) through writing the bytes "
      "into it until ModelWriter::commit(memory, wait=false) returns with the memory acknowledgement";
  out["memcpy_s"] = median(t_memcpy);
  out["memcpy_GBps"] = gb / median(t_memcpy);
  out["write_fsync_s"] = median(t_write);
  out["write_fsync_GBps"] = gb / median(t_write);
  out["commit_memory_s"] = median(t_total);
  out["commit_memory_GBps"] = gb / median(t_total);
  out["commit_fill_s"] = median(t_fill);
  out["commit_allocate_s"] = median(t_allocate);
  out["memcpy_per_tensor_s"] = median(t_memcpy_tensors);
  out["commit_sealed_vs_memcpy_per_tensor"] = median(t_sealed) / median(t_memcpy_tensors);
  out["commit_request_s"] = median(t_request);
  out["commit_vs_memcpy"] = median(t_total) / median(t_memcpy);
  out["goal_commit_vs_memcpy_max"] = 1.2;
  // Met only on every path: the caller's own buffer (first commit on a connection included) and
  // arena space written tensor by tensor, each sealed once written. Arena space never sealed is
  // reported beside them: its bytes are hashed at commit, one more pass over them.
  out["goal_met"] = std::max({median(t_sealed), median(t_own), median(t_first_own)}) / median(t_memcpy) <= 1.2;
  out["speedup_vs_write_fsync"] = median(t_write) / median(t_total);
  out["until_global_s"] = median(t_global);
  out["fill_minor_faults"] = faults;
  out["samples"] = {
      {"memcpy_s", t_memcpy},         {"write_fsync_s", t_write},      {"commit_memory_s", t_total},
      {"commit_fill_s", t_fill},      {"commit_request_s", t_request}, {"until_global_s", t_global},
      {"commit_own_buffer_s", t_own}, {"commit_sealed_s", t_sealed},   {"first_commit_own_buffer_s", t_first_own}};
  out["movement"] = st["movement"];
  return out;
}

// ---- 2. reads served from the NVMe tier ----

json bench_nvme(const fs::path& dir, uint64_t total, uint64_t dram, uint64_t model_bytes, uint64_t tensors,
                int repeats) {
  const uint64_t tensor_bytes = model_bytes / tensors;
  model_bytes = tensor_bytes * tensors;
  const uint64_t models = std::max<uint64_t>(1, total / model_bytes);
  total = models * model_bytes;
  cairn::Config config = base_config(dir, "nvme");
  config.tiers.dram.capacity = dram;
  config.tiers.nvme.path = (dir / "nvme").string();
  config.tiers.nvme.capacity = std::max<uint64_t>(2 * total, 256 * kMiB);
  config.tiers.nvme.persistent = true;
  auto names = tensor_names("block", tensors);
  auto model_id = [](uint64_t i) { return "nvme-model-" + std::to_string(i); };

  Buffer src(total), dst(total);
  for (uint64_t i = 0; i < models; ++i) fill_random(src.data() + i * model_bytes, model_bytes, 1000 + i);

  // Store the models at durability local, then stop the daemon cleanly: the persistent burst buffer
  // keeps them; the repository has them too.
  {
    Daemon d(config);
    for (uint64_t i = 0; i < models; ++i) {
      auto w = value_or_die(d.client.model_create(model_id(i)), "create");
      for (uint64_t t = 0; t < tensors; ++t)
        check(w.add_tensor(names[t], src.data() + i * model_bytes + t * tensor_bytes, CAIRN_DTYPE_U8,
                           {static_cast<int64_t>(tensor_bytes)}),
              "add_tensor");
      check(w.commit(CAIRN_DURABILITY_LOCAL), "commit local");
    }
  }
  // A fresh daemon: DRAM empty, the burst buffer holding every model.
  Daemon d(config);
  json st0 = d.stats();
  if (st0["tiers"]["nvme"].value("chunks", uint64_t{0}) == 0)
    die("the burst buffer is empty after the restart (tiers.nvme.persistent not honoured?)");
  const bool direct_io = st0["tiers"]["nvme"].value("direct_io", false);

  // The baseline's file: same bytes, same directory, written with O_DIRECT and fsync'd.
  const std::string file = (dir / "nvme" / "odirect-baseline.bin").string();
  bool baseline_direct = true;
  {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EINVAL) {  // a filesystem without direct I/O (tmpfs): buffered, cache dropped
      baseline_direct = false;
      fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (fd < 0) die("creating " + file + ": " + std::strerror(errno));
    for (uint64_t off = 0; off < total;) {
      ssize_t n = ::pwrite(fd, src.data() + off, std::min<uint64_t>(total - off, 4 * kMiB), static_cast<off_t>(off));
      if (n <= 0) die("writing " + file + ": " + std::strerror(errno));
      off += static_cast<uint64_t>(n);
    }
    if (::fsync(fd) != 0) die("fsync of " + file);
    ::close(fd);
  }

  // A reader per model; a reader that mapped is closed (ending its leases) and opened again, which
  // the client's cache of model descriptions serves without a request.
  std::vector<cairn::v1::Reader> readers;
  for (uint64_t i = 0; i < models; ++i) readers.push_back(value_or_die(d.client.model_open(model_id(i)), "open"));
  std::vector<std::vector<void*>> dsts(models);
  const std::vector<size_t> dst_bytes(tensors, tensor_bytes);
  for (uint64_t i = 0; i < models; ++i)
    for (uint64_t t = 0; t < tensors; ++t) dsts[i].push_back(dst.data() + i * model_bytes + t * tensor_bytes);

  auto moved = [&](const char* key) { return d.stats()["movement"].value(key, uint64_t{0}); };
  std::vector<double> t_plain, t_read, t_map;
  bool all_from_nvme = true;
  uint64_t stray_repository_bytes = 0, stray_dram_bytes = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    // Baseline: O_DIRECT, 4 MiB reads one after another.
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | (baseline_direct ? O_DIRECT : 0));
    if (fd < 0) die("opening " + file + ": " + std::strerror(errno));
    if (!baseline_direct) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    auto t0 = Clock::now();
    for (uint64_t off = 0; off < total;) {
      ssize_t n = ::pread(fd, dst.data() + off, std::min<uint64_t>(total - off, 4 * kMiB), static_cast<off_t>(off));
      if (n <= 0) die("reading " + file + ": " + std::strerror(errno));
      off += static_cast<uint64_t>(n);
    }
    t_plain.push_back(seconds(Clock::now() - t0));
    ::close(fd);
    sink = sink + dst.data()[r];

    // cairn: read every model into the user buffer, one model at a time. DRAM holds only a few of
    // them, so each pass finds the model it wants evicted and fetches it from NVMe.
    uint64_t nvme0 = moved("bytes_from_nvme"), repo0 = moved("bytes_from_repository");
    std::memset(dst.data(), 0, total);
    t0 = Clock::now();
    for (uint64_t i = 0; i < models; ++i) check(readers[i].read(names, dsts[i], dst_bytes), "read from NVMe");
    t_read.push_back(seconds(Clock::now() - t0));
    uint64_t nvme1 = moved("bytes_from_nvme"), repo1 = moved("bytes_from_repository");
    if (std::memcmp(dst.data(), src.data(), total) != 0) die("bytes read back from the NVMe tier differ");

    // cairn: map (zero-copy lease) every model, one at a time, releasing each before the next.
    double map_s = 0;
    for (uint64_t i = 0; i < models; ++i) {
      t0 = Clock::now();
      auto views = value_or_die(readers[i].map(names), "map from NVMe");
      map_s += seconds(Clock::now() - t0);
      if (r == 0)
        for (uint64_t t = 0; t < tensors; ++t)
          if (std::memcmp(views[t].data, src.data() + i * model_bytes + t * tensor_bytes, tensor_bytes) != 0)
            die("bytes mapped from the NVMe tier differ");
      t0 = Clock::now();
      readers[i].close();
      map_s += seconds(Clock::now() - t0);
      readers[i] = value_or_die(d.client.model_open(model_id(i)), "open");
    }
    t_map.push_back(map_s);
    uint64_t nvme2 = moved("bytes_from_nvme"), repo2 = moved("bytes_from_repository");
    if (nvme1 - nvme0 != total || nvme2 - nvme1 != total || repo1 != repo0 || repo2 != repo1) all_from_nvme = false;
    stray_repository_bytes += repo2 - repo0;
    stray_dram_bytes += 2 * total - std::min(2 * total, nvme2 - nvme0);
  }
  check(d.client.request(R"({"op":"ping"})").status(), "ping");  // sends the last deferred release
  json st = d.stats();
  const double gb = static_cast<double>(total) / 1e9;
  json out;
  out["bytes"] = total;
  out["models"] = models;
  out["model_bytes"] = model_bytes;
  out["tensors_per_model"] = tensors;
  out["dram_capacity"] = dram;
  out["nvme_capacity"] = config.tiers.nvme.capacity;
  out["nvme_direct_io"] = direct_io;
  out["baseline_direct_io"] = baseline_direct;
  out["odirect_read_GBps"] = gb / median(t_plain);
  out["read_GBps"] = gb / median(t_read);
  out["read_vs_odirect"] = median(t_plain) / median(t_read);
  out["map_GBps"] = gb / median(t_map);
  out["map_vs_odirect"] = median(t_plain) / median(t_map);
  out["goal_vs_odirect_min"] = 0.9;
  out["goal_met"] = median(t_plain) / median(t_read) >= 0.9 && median(t_plain) / median(t_map) >= 0.9;
  out["all_bytes_from_nvme"] = all_from_nvme;
  // Why the two may differ on a VM disk: how contiguous the destination memory is.
  out["arena_physical_run_bytes"] = physical_run_bytes(d.engine->dram().base(), d.engine->dram().arena_size());
  out["baseline_buffer_physical_run_bytes"] = physical_run_bytes(dst.data(), total);
  out["bytes_from_repository_during_reads"] = stray_repository_bytes;
  out["bytes_not_from_nvme_during_reads"] = stray_dram_bytes;
  out["samples"] = {{"odirect_read_s", t_plain}, {"read_s", t_read}, {"map_s", t_map}};
  out["movement"] = st["movement"];
  out["nvme_tier"] = st["tiers"]["nvme"];
  return out;
}

// ---- 3. DRAM hits ----

json bench_dram(const fs::path& dir, uint64_t bytes, uint64_t tensors, int repeats) {
  const uint64_t tensor_bytes = bytes / tensors;
  bytes = tensor_bytes * tensors;
  cairn::Config config = base_config(dir, "dram");
  config.tiers.dram.capacity = 3 * bytes + 64 * kMiB;
  Daemon d(config);
  auto names = tensor_names("layer", tensors);
  Buffer src(bytes), dst(bytes), user(bytes);
  fill_random(src.data(), bytes, 77);
  {
    auto w = value_or_die(d.client.model_create("resident"), "create");
    for (uint64_t t = 0; t < tensors; ++t)
      check(w.add_tensor(names[t], src.data() + t * tensor_bytes, CAIRN_DTYPE_U8, {static_cast<int64_t>(tensor_bytes)}),
            "add_tensor");
    check(w.commit(CAIRN_DURABILITY_GLOBAL), "commit");
  }
  // Closed after each map (ending its leases) and opened again, from the client's cache of model
  // descriptions (no request).
  auto reader = value_or_die(d.client.model_open("resident"), "open");
  std::vector<void*> dsts;
  const std::vector<size_t> dst_bytes(tensors, tensor_bytes);
  for (uint64_t t = 0; t < tensors; ++t) dsts.push_back(user.data() + t * tensor_bytes);
  uint64_t hits0 = d.stats()["tiers"]["dram"].value("hits", uint64_t{0});

  // The first read on this connection touches arena pages its read-only mapping has not mapped yet.
  long f0 = minor_faults_this_thread();
  auto t0 = Clock::now();
  check(reader.read(names, dsts, dst_bytes), "first read");
  double first_read_s = seconds(Clock::now() - t0);
  long first_read_faults = minor_faults_this_thread() - f0;
  if (std::memcmp(user.data(), src.data(), bytes) != 0) die("bytes read from DRAM differ");

  std::vector<double> t_memcpy, t_memcpy_tensors, t_read, t_map, t_map_copy, t_map_scan, t_scan;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    t_memcpy.push_back(seconds(Clock::now() - t0));
    sink = sink + dst.data()[r];
    // The same bytes copied as the map + copy-out below copies them, one memcpy per tensor from a
    // private buffer: glibc picks its strategy by size (non-temporal stores only above a threshold
    // it derives from the cache size), so a tensor-sized call can be slower than one big call.
    t0 = Clock::now();
    for (uint64_t t = 0; t < tensors; ++t)
      std::memcpy(dst.data() + t * tensor_bytes, src.data() + t * tensor_bytes, tensor_bytes);
    t_memcpy_tensors.push_back(seconds(Clock::now() - t0));

    t0 = Clock::now();
    sink = sink + scan(src.data(), bytes);
    t_scan.push_back(seconds(Clock::now() - t0));

    t0 = Clock::now();
    check(reader.read(names, dsts, dst_bytes), "read");
    t_read.push_back(seconds(Clock::now() - t0));

    // Map latency: the lease request, no byte touched.
    t0 = Clock::now();
    auto views = value_or_die(reader.map(names), "map");
    double map_s = seconds(Clock::now() - t0);
    t_map.push_back(map_s);
    // Map, then copy the bytes out into the user buffer (what a framework that needs its own
    // tensor storage does).
    t0 = Clock::now();
    for (uint64_t t = 0; t < tensors; ++t) std::memcpy(dsts[t], views[t].data, views[t].nbytes);
    t_map_copy.push_back(map_s + seconds(Clock::now() - t0));
    // Map, then read every byte in place (what an inference that uses the mapping directly does).
    t0 = Clock::now();
    for (const auto& v : views) sink = sink + scan(static_cast<const uint8_t*>(v.data), v.nbytes);
    t_map_scan.push_back(map_s + seconds(Clock::now() - t0));
    reader.close();
    reader = value_or_die(d.client.model_open("resident"), "open");
  }
  if (std::memcmp(user.data(), src.data(), bytes) != 0) die("bytes copied out of the mapping differ");
  uint64_t hits1 = d.stats()["tiers"]["dram"].value("hits", uint64_t{0});
  json st = d.stats();
  reader.close();
  const double gb = static_cast<double>(bytes) / 1e9;
  json out;
  out["bytes"] = bytes;
  out["tensors"] = tensors;
  out["memcpy_GBps"] = gb / median(t_memcpy);
  out["scan_private_buffer_GBps"] = gb / median(t_scan);
  out["read_GBps"] = gb / median(t_read);
  out["read_vs_memcpy"] = median(t_memcpy) / median(t_read);
  out["first_read_GBps"] = gb / first_read_s;
  out["first_read_minor_faults"] = first_read_faults;
  out["map_latency_ms"] = median(t_map) * 1e3;
  out["map_copy_GBps"] = gb / median(t_map_copy);
  out["map_copy_vs_memcpy"] = median(t_memcpy) / median(t_map_copy);
  out["memcpy_per_tensor_GBps"] = gb / median(t_memcpy_tensors);
  out["map_scan_GBps"] = gb / median(t_map_scan);
  out["map_scan_vs_scan"] = median(t_scan) / median(t_map_scan);
  out["dram_hits"] = hits1 - hits0;
  out["movement"] = st["movement"];
  out["samples"] = {{"memcpy_s", t_memcpy},    {"memcpy_per_tensor_s", t_memcpy_tensors},
                    {"scan_s", t_scan},        {"read_s", t_read},
                    {"map_s", t_map},          {"map_copy_s", t_map_copy},
                    {"map_scan_s", t_map_scan}};
  return out;
}

const char* verdict(bool met) { return met ? "met" : "NOT met"; }

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  bool quick = false, keep = false;
  uint64_t commit_mib = 1024, nvme_mib = 512, dram_hit_mib = 256;
  std::string json_path, dir_arg, only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc)
      repeats = std::max(1, std::atoi(argv[++i]));
    else if (a == "--commit-mib" && i + 1 < argc)
      commit_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--nvme-mib" && i + 1 < argc)
      nvme_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dram-hit-mib" && i + 1 < argc)
      dram_hit_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dir" && i + 1 < argc)
      dir_arg = argv[++i];
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--quick")
      quick = true;
    else if (a == "--keep")
      keep = true;  // leave the directories (burst buffer, repositories) for a look
    else {
      std::fprintf(stderr,
                   "usage: cairn_bench_tiers [--repeats R] [--commit-mib N] [--nvme-mib N] [--dram-hit-mib N] "
                   "[--dir DIR] [--only commit|nvme|dram] [--quick] [--json FILE]\n");
      return 2;
    }
  }
  (void)cairn::init_logging("warn", "");  // the engine's warnings (a failed flush, a corrupt copy) still show
  if (quick) {
    repeats = std::min(repeats, 2);
    commit_mib = std::min<uint64_t>(commit_mib, 128);
    nvme_mib = std::min<uint64_t>(nvme_mib, 64);
    dram_hit_mib = std::min<uint64_t>(dram_hit_mib, 32);
  }
  fs::path parent = dir_arg.empty() ? fs::temp_directory_path() : fs::path(dir_arg);
  fs::path dir = parent / ("cairn-bench-tiers-" + std::to_string(::getpid()));
  fs::create_directories(dir);

  // Memory: the commit part holds the arena (3x), the source and the memcpy target.
  const uint64_t avail = meminfo_kib("MemAvailable") * 1024;
  const uint64_t need = (5 * commit_mib + 512) * kMiB;
  std::string memory_note;
  if (avail && need > avail) {
    uint64_t fit = (avail / kMiB - 512) / 5;
    commit_mib = std::max<uint64_t>(64, fit / 64 * 64);
    memory_note = "commit size lowered to " + std::to_string(commit_mib) + " MiB: only " +
                  std::to_string(avail / kMiB) + " MiB of memory available";
    std::fprintf(stderr, "cairn_bench_tiers: %s\n", memory_note.c_str());
  }

  json machine{{"cpu", cpu_model()},
               {"cores", std::thread::hardware_concurrency()},
               {"memory_bytes", meminfo_kib("MemTotal") * 1024},
               {"memory_available_bytes", avail},
               {"bench_dir", dir.string()},
               {"bench_dir_fs", fs_type(dir.string())}};
  std::printf("cairn_bench_tiers: median of %d repeats%s\n", repeats, quick ? " (--quick)" : "");
  std::printf("machine: %s, %u cores, %.1f GiB memory (%.1f available), bench dir %s on %s\n",
              machine["cpu"].get<std::string>().c_str(), std::thread::hardware_concurrency(),
              static_cast<double>(machine["memory_bytes"].get<uint64_t>()) / (1 << 30),
              static_cast<double>(avail) / (1 << 30), dir.c_str(), machine["bench_dir_fs"].get<std::string>().c_str());
  if (!memory_note.empty()) std::printf("note: %s\n", memory_note.c_str());
  std::fflush(stdout);

  json out{{"machine", machine}, {"repeats", repeats}, {"quick", quick}};

  // 1.
  if (only.empty() || only == "commit") {
    json c = bench_commit(dir, commit_mib * kMiB, 8, repeats);
    out["commit"] = c;
    std::printf("\n1. commit of %.0f MiB (%llu tensors of fresh random bytes) at durability memory\n",
                c["bytes"].get<double>() / kMiB, static_cast<unsigned long long>(c["tensors"].get<uint64_t>()));
    std::printf(
        "   (timed: first allocate of arena space + writing the bytes into it + commit until the memory ack)\n");
    std::printf("   %-46s %9s %9s %s\n", "", "time", "GB/s", "ratio");
    std::printf("   %-46s %7.1f ms %7.2f   baseline\n", "memcpy into a pre-faulted buffer",
                c["memcpy_s"].get<double>() * 1e3, c["memcpy_GBps"].get<double>());
    if (c.contains("memcpy_per_tensor_s"))
      std::printf("   %-46s %7.1f ms %7.2f   %.2fx memcpy\n", "memcpy, one call per tensor (as into arena space)",
                  c["memcpy_per_tensor_s"].get<double>() * 1e3,
                  c["bytes"].get<double>() / 1e9 / c["memcpy_per_tensor_s"].get<double>(),
                  c["memcpy_per_tensor_s"].get<double>() / c["memcpy_s"].get<double>());
    std::printf("   %-46s %7.1f ms %7.2f   %.2fx memcpy\n",
                ("write()+fsync of a file (" + machine["bench_dir_fs"].get<std::string>() + ")").c_str(),
                c["write_fsync_s"].get<double>() * 1e3, c["write_fsync_GBps"].get<double>(),
                c["write_fsync_s"].get<double>() / c["memcpy_s"].get<double>());
    std::printf("   %-46s %7.1f ms %7.2f   %.2fx memcpy\n", "cairn commit from the caller's buffers (add_tensor)",
                c["commit_own_buffer_s"].get<double>() * 1e3,
                c["bytes"].get<double>() / 1e9 / c["commit_own_buffer_s"].get<double>(),
                c["commit_own_buffer_vs_memcpy"].get<double>());
    std::printf("   %-46s %7.1f ms\n", "  of which: the commit request (adopt)",
                c["commit_own_buffer_request_s"].get<double>() * 1e3);
    std::printf("   %-46s %7.1f ms   %.2fx memcpy (median of %d new connections)\n",
                "  the same, first commit on a fresh connection", c["first_commit_own_buffer_s"].get<double>() * 1e3,
                c["first_commit_own_buffer_s"].get<double>() / c["memcpy_s"].get<double>(),
                c["first_commit_own_buffer_connections"].get<int>());
    std::printf("   %-46s %7.1f ms %7.2f   %.2fx memcpy, %.1fx faster than write+fsync\n",
                "cairn commit written into arena space", c["commit_memory_s"].get<double>() * 1e3,
                c["commit_memory_GBps"].get<double>(), c["commit_vs_memcpy"].get<double>(),
                c["speedup_vs_write_fsync"].get<double>());
    std::printf("   %-46s %7.1f ms\n", "  of which: allocate + write into arena space",
                c["commit_fill_s"].get<double>() * 1e3);
    if (c.contains("commit_allocate_s"))
      std::printf("   %-46s %7.1f ms\n", "    of which: the allocate requests",
                  c["commit_allocate_s"].get<double>() * 1e3);
    std::printf("   %-46s %7.1f ms\n", "  of which: the commit request (hash, adopt)",
                c["commit_request_s"].get<double>() * 1e3);
    std::printf("   %-46s %7.1f ms %7.2f   %.2fx memcpy\n", "cairn commit into arena space, each tensor sealed",
                c["commit_sealed_s"].get<double>() * 1e3,
                c["bytes"].get<double>() / 1e9 / c["commit_sealed_s"].get<double>(),
                c["commit_sealed_vs_memcpy"].get<double>());
    std::printf("   %-46s %7.1f ms\n", "  of which: the commit request (adopt)",
                c["commit_sealed_request_s"].get<double>() * 1e3);
    std::printf("   %-46s %7.1f ms   (for information: through NVMe to the repository)\n",
                "cairn commit until global (flush returns)", c["until_global_s"].get<double>() * 1e3);
    std::printf("   minor page faults while writing into arena space, per repeat: %s (client mapping pre-populated)\n",
                c["fill_minor_faults"].dump().c_str());
    std::printf("   %-46s %7.1f ms   %.2fx memcpy (%ld page faults: client mapping of the arena cold)\n",
                "  the same, first commit on a fresh connection", c["first_commit_on_connection_s"].get<double>() * 1e3,
                c["first_commit_on_connection_s"].get<double>() / c["memcpy_s"].get<double>(),
                c["first_commit_on_connection_minor_faults"].get<long>());
    std::printf("   goal: every path <= 1.2x memcpy (arena space: each tensor sealed): %s\n",
                verdict(c["goal_met"].get<bool>()));
    std::printf("   the demoter wrote %.0f MiB of older checkpoints' chunks to NVMe during the repeats\n",
                c["demoted_bytes_during_repeats"].get<double>() / kMiB);
    std::fflush(stdout);
  }

  // 2.
  if (only.empty() || only == "nvme") {
    const uint64_t nvme_total = nvme_mib * kMiB;
    const uint64_t dram_small = quick ? 16 * kMiB : 128 * kMiB;
    const uint64_t model_bytes = dram_small / 2;
    json n = bench_nvme(dir, nvme_total, dram_small, model_bytes, 2, repeats);
    out["nvme"] = n;
    std::printf(
        "\n2. reads served from the NVMe tier: %.0f MiB in %llu models of %.0f MiB, DRAM %.0f MiB, one model at a "
        "time\n",
        n["bytes"].get<double>() / kMiB, static_cast<unsigned long long>(n["models"].get<uint64_t>()),
        n["model_bytes"].get<double>() / kMiB, n["dram_capacity"].get<double>() / kMiB);
    std::printf("   (burst buffer direct I/O: %s; every byte from NVMe, none from the repository: %s)\n",
                n["nvme_direct_io"].get<bool>() ? "yes" : "NO (page cache)",
                n["all_bytes_from_nvme"].get<bool>() ? "yes" : "NO");
    std::printf("   %-46s %7.2f GB/s  baseline\n", "O_DIRECT sequential read, 4 MiB at a time",
                n["odirect_read_GBps"].get<double>());
    std::printf("   %-46s %7.2f GB/s  %.2fx O_DIRECT (goal >= 0.9: %s)\n", "cairn read into a user buffer (from NVMe)",
                n["read_GBps"].get<double>(), n["read_vs_odirect"].get<double>(),
                verdict(n["read_vs_odirect"].get<double>() >= 0.9));
    std::printf("   %-46s %7.2f GB/s  %.2fx O_DIRECT (goal >= 0.9: %s)\n", "cairn map, zero-copy lease (from NVMe)",
                n["map_GBps"].get<double>(), n["map_vs_odirect"].get<double>(),
                verdict(n["map_vs_odirect"].get<double>() >= 0.9));
    std::printf(
        "   physically contiguous runs of the destination memory: DRAM arena %.0f KiB, baseline buffer %.0f KiB\n"
        "   (0 = unknown; a direct-I/O request holds at most the device's max_segments runs)\n",
        n["arena_physical_run_bytes"].get<double>() / 1024,
        n["baseline_buffer_physical_run_bytes"].get<double>() / 1024);
    std::fflush(stdout);
  }

  // 3.
  if (only.empty() || only == "dram") {
    json h = bench_dram(dir, dram_hit_mib * kMiB, 8, repeats);
    out["dram"] = h;
    std::printf("\n3. DRAM hits: a resident model of %.0f MiB (%llu tensors)\n", h["bytes"].get<double>() / kMiB,
                static_cast<unsigned long long>(h["tensors"].get<uint64_t>()));
    std::printf("   %-46s %7.2f GB/s  baseline\n", "memcpy between pre-faulted buffers",
                h["memcpy_GBps"].get<double>());
    std::printf("   %-46s %7.2f GB/s  %.2fx memcpy\n", "cairn read into a user buffer", h["read_GBps"].get<double>(),
                h["read_vs_memcpy"].get<double>());
    std::printf("   %-46s %7.2f GB/s  (%lld minor page faults: client mapping cold)\n",
                "  the first read on a connection", h["first_read_GBps"].get<double>(),
                static_cast<long long>(h["first_read_minor_faults"].get<long>()));
    std::printf("   %-46s %7.3f ms for the whole model (no byte touched)\n", "cairn map latency",
                h["map_latency_ms"].get<double>());
    std::printf("   %-46s %7.2f GB/s  %.2fx memcpy\n", "cairn map + copy out into a user buffer",
                h["map_copy_GBps"].get<double>(), h["map_copy_vs_memcpy"].get<double>());
    std::printf("   %-46s %7.2f GB/s  %.2fx scanning a private buffer (%.2f GB/s)\n",
                "cairn map + scan every byte in place", h["map_scan_GBps"].get<double>(),
                h["map_scan_vs_scan"].get<double>(), h["scan_private_buffer_GBps"].get<double>());
  }

  if (keep)
    std::printf("\nkept %s\n", dir.c_str());
  else
    fs::remove_all(dir);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) die("writing " + json_path);
  }
  return 0;
}
