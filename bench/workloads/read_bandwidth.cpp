// Read bandwidth of cairn's DRAM tier and repository, against the physical limits measured in the
// same run: memcpy of the same bytes, and a plain sequential read of the same pack file.
//
// Runs a real engine and server in-process on a temporary repository and talks to it through the
// client library over the Unix socket, exactly as an application does.
//
// Usage: cairn_bench_read [--mib N] [--repeats R] [--json]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cairn/client.hpp"
#include "core/config.hpp"
#include "core/wire.hpp"
#include "daemon/engine.hpp"
#include "daemon/server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void check(const cairn::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "cairn_bench_read: %s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

void check(const cairn::v1::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "cairn_bench_read: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

template <typename T>
T value_or_die(cairn::v1::Result<T> r, const char* what) {
  check(r.status(), what);
  return std::move(*r);
}

// Evicts a file from the page cache: drop_caches when allowed (root), else fadvise.
std::string drop_cache(const std::vector<std::string>& files) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd >= 0 && ::write(fd, "3\n", 2) == 2) {
    ::close(fd);
    return "drop_caches";
  }
  if (fd >= 0) ::close(fd);
  for (const auto& f : files) {
    int ffd = ::open(f.c_str(), O_RDONLY);
    if (ffd >= 0) {
      ::posix_fadvise(ffd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(ffd);
    }
  }
  return "fadvise_dontneed";
}

uint64_t consume(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    sum += v;
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 256;
  int repeats = 7;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc)
      mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--repeats" && i + 1 < argc)
      repeats = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json")
      as_json = true;
    else {
      std::fprintf(stderr, "usage: cairn_bench_read [--mib N] [--repeats R] [--json]\n");
      return 2;
    }
  }
  const uint64_t kTensors = 8;
  const uint64_t tensor_bytes = (mib << 20) / kTensors;
  const uint64_t total = tensor_bytes * kTensors;

  fs::path dir = fs::temp_directory_path() / ("cairn-bench-read-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  cairn::Config config;
  config.repository = (dir / "repo").string();
  config.socket = (dir / "cairnd.sock").string();
  config.tiers.dram.capacity = 3 * total + (64ull << 20);

  std::vector<uint8_t> src(total), dst(total);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= src.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(src.data() + i, &v, 8);
  }
  std::fill(dst.begin(), dst.end(), 1);  // fault the pages in before timing

  nlohmann::json out;
  std::vector<std::string> names;
  std::vector<void*> dsts;  // the model read into one user buffer, tensor after tensor
  std::vector<size_t> dst_bytes;
  for (uint64_t t = 0; t < kTensors; ++t) {
    names.push_back("layer" + std::to_string(t) + ".weight");
    dsts.push_back(dst.data() + t * tensor_bytes);
    dst_bytes.push_back(tensor_bytes);
  }
  {
    auto engine = cairn::Engine::create(config);
    check(engine.status(), "starting the engine");
    while (!(*engine)->dram().prefault_finished()) ::usleep(1000);
    auto server = cairn::Server::start(**engine, config.socket);
    check(server.status(), "starting the server");
    auto client = value_or_die(cairn::v1::Client::connect(config.socket), "connecting");
    {
      auto w = value_or_die(client.model_create("bench"), "create");
      for (uint64_t t = 0; t < kTensors; ++t)
        check(
            w.add_tensor(names[t], src.data() + t * tensor_bytes, CAIRN_DTYPE_U8, {static_cast<int64_t>(tensor_bytes)}),
            "add_tensor");
      check(w.commit(CAIRN_DURABILITY_GLOBAL), "commit");
    }

    std::vector<double> t_memcpy, t_read, t_map, t_map_consume, t_memcpy_consume;
    volatile uint64_t sink = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), total);
      t_memcpy.push_back(seconds(Clock::now() - t0));
      sink = sink + dst[static_cast<size_t>(r)];

      t0 = Clock::now();
      sink = sink + consume(src.data(), total);
      t_memcpy_consume.push_back(seconds(Clock::now() - t0));

      // A reader per repeat, its views ended by close (the model's description is cached: the open
      // sends no request).
      auto reader = value_or_die(client.model_open("bench"), "open");
      t0 = Clock::now();
      check(reader.read(names, dsts, dst_bytes), "read");
      t_read.push_back(seconds(Clock::now() - t0));

      t0 = Clock::now();
      auto views = value_or_die(reader.map(names), "map");
      t_map.push_back(seconds(Clock::now() - t0));
      t0 = Clock::now();
      for (const auto& v : views) sink = sink + consume(static_cast<const uint8_t*>(v.data), v.nbytes);
      t_map_consume.push_back(seconds(Clock::now() - t0) + t_map.back());
      reader.close();
    }
    if (std::memcmp(dst.data(), src.data(), total) != 0) {
      std::fprintf(stderr, "cairn_bench_read: data read back differs\n");
      return 1;
    }
    double gb = static_cast<double>(total) / 1e9;
    out["bytes"] = total;
    out["memcpy_GBps"] = gb / median(t_memcpy);
    out["dram_read_GBps"] = gb / median(t_read);
    out["dram_read_vs_memcpy"] = median(t_memcpy) / median(t_read);
    out["map_ms"] = median(t_map) * 1e3;
    out["map_and_scan_GBps"] = gb / median(t_map_consume);
    out["scan_private_buffer_GBps"] = gb / median(t_memcpy_consume);
    out["map_and_scan_vs_memcpy"] = median(t_memcpy) / median(t_map_consume);
    out["map_and_scan_vs_scan"] = median(t_memcpy_consume) / median(t_map_consume);
    client = cairn::v1::Client();
    (*server)->stop();
  }

  // Cold: a new engine on the same repository (empty DRAM), page cache dropped before each read.
  std::vector<std::string> packs;
  for (const auto& e : fs::directory_iterator(dir / "repo" / "packs")) packs.push_back(e.path().string());
  std::vector<double> t_cold, t_cold_buffered, t_plain;
  std::string method;
  std::vector<uint8_t> file_buf(total + (1 << 20));
  // One cold read through a fresh engine: packs read with direct I/O (the default) or through the
  // page cache (repository_direct_reads: false).
  auto cold_read = [&](bool direct) {
    cairn::Config c = config;
    c.repository_direct_reads = direct;
    auto engine = cairn::Engine::create(c);
    check(engine.status(), "restarting the engine");
    // A daemon starts at the job's prologue, long before reads: let it finish backing its arena.
    while (!(*engine)->dram().prefault_finished()) ::usleep(1000);
    auto server = cairn::Server::start(**engine, c.socket);
    check(server.status(), "restarting the server");
    auto client = value_or_die(cairn::v1::Client::connect(c.socket), "connecting");
    auto reader = value_or_die(client.model_open("bench"), "open");
    method = drop_cache(packs);
    auto t0 = Clock::now();
    check(reader.read(names, dsts, dst_bytes), "cold read");
    const double t = seconds(Clock::now() - t0);
    if (std::memcmp(dst.data(), src.data(), total) != 0) {
      std::fprintf(stderr, "cairn_bench_read: cold data read back differs\n");
      std::exit(1);
    }
    std::fill(dst.begin(), dst.end(), 1);
    reader.close();
    client = cairn::v1::Client();
    (*server)->stop();
    return t;
  };
  for (int r = 0; r < std::max(3, repeats); ++r) {  // the disk is the noisiest part: every repeat
    method = drop_cache(packs);
    auto t0 = Clock::now();
    uint64_t read_bytes = 0;
    for (const auto& p : packs) {
      int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      uint64_t size = fs::file_size(p);
      if (size > file_buf.size()) file_buf.resize(size);
      check(cairn::wire::read_full(fd, file_buf.data(), size), "plain read");
      ::close(fd);
      read_bytes += size;
    }
    t_plain.push_back(seconds(Clock::now() - t0));
    t_cold.push_back(cold_read(true));
    t_cold_buffered.push_back(cold_read(false));
  }
  double gb = static_cast<double>(total) / 1e9;
  out["cache_drop"] = method;
  out["plain_pack_read_GBps"] = gb / median(t_plain);
  out["cold_read_GBps"] = gb / median(t_cold);
  out["cold_read_vs_plain_read"] = median(t_plain) / median(t_cold);
  out["cold_read_buffered_GBps"] = gb / median(t_cold_buffered);
  out["cold_samples"] = {{"plain_read_s", t_plain}, {"cold_read_s", t_cold}, {"cold_read_buffered_s", t_cold_buffered}};
  fs::remove_all(dir);

  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("read bandwidth, %.0f MiB model of %llu tensors, median of %d runs\n",
              static_cast<double>(total) / (1 << 20), static_cast<unsigned long long>(kTensors), repeats);
  std::printf("  memcpy (baseline)                      %7.2f GB/s\n", out["memcpy_GBps"].get<double>());
  std::printf("  cairn read into a user buffer (DRAM)   %7.2f GB/s   %.2fx memcpy\n",
              out["dram_read_GBps"].get<double>(), out["dram_read_vs_memcpy"].get<double>());
  std::printf("  cairn zero-copy map                    %7.3f ms for the whole model\n", out["map_ms"].get<double>());
  std::printf("  map + scan every byte                  %7.2f GB/s   %.2fx memcpy, %.2fx scanning a private buffer\n",
              out["map_and_scan_GBps"].get<double>(), out["map_and_scan_vs_memcpy"].get<double>(),
              out["map_and_scan_vs_scan"].get<double>());
  std::printf("  plain read of the pack file (cold)     %7.2f GB/s   (page cache: %s)\n",
              out["plain_pack_read_GBps"].get<double>(), method.c_str());
  std::printf("  cairn cold read from the repository    %7.2f GB/s   %.2fx plain read\n",
              out["cold_read_GBps"].get<double>(), out["cold_read_vs_plain_read"].get<double>());
  std::printf("  the same through the page cache        %7.2f GB/s\n", out["cold_read_buffered_GBps"].get<double>());
  return 0;
}
