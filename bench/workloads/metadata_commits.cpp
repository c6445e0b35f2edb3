// Metadata at scale: how many derived models one client can commit per second when a child inherits
// every tensor of its parent (a metadata-only commit: no byte is copied or written), and how fast
// a model already opened once opens again (the client's manifest cache).
//
// Two ways to commit at durability memory: blocking (each commit waits for its reply: what a
// first-time user committing with wait = 1 gets) and pipelined (wait = 0, pipelined = 1: the client
// sends the next commit without waiting for the reply; the time includes collecting every reply).
// The blocking way also through the C API as a C program writes it (libcairn: cairn_model_create,
// cairn_model_inherit_all, cairn_model_set_metadata, cairn_model_commit with no ticket).
//
// Runs a real engine and server in-process on a temporary repository and talks to it through the
// public C++ client (cairn/client.hpp over libcairn.so) over the Unix socket, as an application
// does. Baselines in the same run: a bare request round trip on the same socket (the floor for any
// commit that asks the daemon), and writing the same manifest as a file with fsync (what a
// one-file-per-model store pays).
//
// With --metrics, also the cost of metrics on the request path (docs/metrics.md): blocking commits
// and bare round trips on an engine with metrics off and on another with them on (metrics.textfile:
// every request's latency recorded in its op's histogram), alternated over 5 rounds so that the
// machine's drift touches both alike; the medians of the rates and of each round's on/off ratio are
// reported.
//
// Usage: cairn_bench_metadata [--models N] [--tensors T] [--quick] [--metrics] [--json FILE]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cairn/cairn.h"
#include "cairn/client.hpp"
#include "core/config.hpp"
#include "daemon/engine.hpp"
#include "daemon/server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void check_c(cairn_status s, const char* what) {
  if (s != CAIRN_OK) {
    std::fprintf(stderr, "cairn_bench_metadata: %s: %s: %s\n", what, cairn_status_string(s), cairn_last_error());
    std::exit(1);
  }
}

namespace cn = cairn::v1;

void check(const cairn::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "cairn_bench_metadata: %s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

void check(const cn::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "cairn_bench_metadata: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

template <typename T>
T value_or_die(cn::Result<T> r, const char* what) {
  check(r.status(), what);
  return std::move(*r);
}

// A bare round trip that touches the engine: the description of a named tensor that does not
// exist (its answer, kNotFound, is expected).
void round_trip(cn::Client& client) {
  auto info = client.tensor_info("bench/none");
  if (info.status().code() != CAIRN_ERR_NOT_FOUND) check(info.status(), "tensor_info");
}

// A metadata-only commit of `id`, child of `parent`, with `meta` (JSON text, "" for none), as
// `opts` say; the ticket (empty when the commit waited).
cn::Ticket commit_inherited(cn::Client& client, const std::string& id, const std::string& parent,
                            const std::string& meta, const cairn_commit_options& opts) {
  auto w = value_or_die(client.model_create(id, parent), "create");
  check(w.inherit_all(), "inherit_all");
  if (!meta.empty()) check(w.set_metadata(meta), "metadata");
  return value_or_die(w.commit(opts), "commit");
}

std::string step_metadata(size_t i) {
  return nlohmann::json{{"score", static_cast<double>(i % 1000) / 1000.0}, {"step", i}}.dump();
}

// The base model: `tensors` tensors of 4 KiB, committed at global.
void commit_base(cn::Client& client, size_t tensors) {
  std::vector<uint8_t> bytes(4096);
  auto w = value_or_die(client.model_create("base"), "create base");
  for (size_t t = 0; t < tensors; ++t) {
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<uint8_t>(t * 31 + k);
    check(w.add_tensor("layer" + std::to_string(t) + ".weight", bytes.data(), CAIRN_DTYPE_U8, {4096}), "add");
  }
  check(w.commit(CAIRN_DURABILITY_GLOBAL), "commit base");
}

// Requests the daemon has served (`stats` "usage"), not counting this `stats` request itself.
uint64_t requests_served(cn::Client& client) {
  auto text = value_or_die(client.request(R"({"op":"stats"})"), "stats");
  return nlohmann::json::parse(text)["usage"]["requests"].get<uint64_t>();
}

cairn_commit_options commit_options(cairn_durability d, bool wait, bool pipelined) {
  cairn_commit_options o = CAIRN_COMMIT_OPTIONS_INIT;
  o.durability = d;
  o.wait = wait ? 1 : 0;
  o.pipelined = pipelined ? 1 : 0;
  return o;
}

// Requests a second on one engine: blocking metadata-only commits at durability memory and bare
// round trips, each `n` times.
struct Rates {
  double commits_per_s = 0;
  double round_trips_per_s = 0;
};

Rates blocking_rates(const cairn::Config& config, size_t n, size_t tensors) {
  auto engine = cairn::Engine::create(config);
  check(engine.status(), "starting the engine");
  while (!(*engine)->dram().prefault_finished()) ::usleep(1000);
  auto server = cairn::Server::start(**engine, config.socket);
  check(server.status(), "starting the server");
  auto client = value_or_die(cn::Client::connect(config.socket), "connecting");
  commit_base(client, tensors);
  const cairn_commit_options memory = commit_options(CAIRN_DURABILITY_MEMORY, true, false);
  Rates r;
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) round_trip(client);
  r.round_trips_per_s = static_cast<double>(n) / seconds(Clock::now() - t0);
  t0 = Clock::now();
  for (size_t i = 0; i < n; ++i)
    commit_inherited(client, "m" + std::to_string(i), i ? "m" + std::to_string(i - 1) : "base", step_metadata(i),
                     memory);
  r.commits_per_s = static_cast<double>(n) / seconds(Clock::now() - t0);
  (*engine)->drain();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t models = 20000, tensors = 62;  // ResNet-18 has 62 parameter tensors
  std::string json_path;
  bool with_metrics = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--models" && i + 1 < argc)
      models = std::stoul(argv[++i]);
    else if (a == "--tensors" && i + 1 < argc)
      tensors = std::stoul(argv[++i]);
    else if (a == "--quick")
      models = 2000;
    else if (a == "--metrics")
      with_metrics = true;
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: cairn_bench_metadata [--models N] [--tensors T] [--quick] [--metrics] [--json FILE]\n");
      return 2;
    }
  }
  fs::path dir = fs::temp_directory_path() / ("cairn-bench-meta-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  cairn::Config config;
  config.repository = (dir / "repo").string();
  config.socket = (dir / "cairnd.sock").string();
  config.tiers.dram.capacity = 256ull << 20;
  nlohmann::json out{{"models", models}, {"tensors_per_model", tensors}};
  {
    auto engine = cairn::Engine::create(config);
    check(engine.status(), "starting the engine");
    while (!(*engine)->dram().prefault_finished()) ::usleep(1000);  // the arena is backed in the background
    auto server = cairn::Server::start(**engine, config.socket);
    check(server.status(), "starting the server");
    auto client = value_or_die(cn::Client::connect(config.socket), "connecting");

    // The base model: T tensors of 4 KiB.
    commit_base(client, tensors);

    // Baseline 1: a bare round trip (a request that touches the engine).
    const size_t rt_n = std::min<size_t>(models, 5000);
    auto t0 = Clock::now();
    for (size_t i = 0; i < rt_n; ++i) round_trip(client);
    double rt_per_s = static_cast<double>(rt_n) / seconds(Clock::now() - t0);

    // cairn: metadata-only commits at durability memory (visible to every process on the node at
    // once; the flusher writes the manifests behind). First the blocking way: one round trip each.
    t0 = Clock::now();
    for (size_t i = 0; i < models; ++i)
      commit_inherited(client, "m" + std::to_string(i), i ? "m" + std::to_string(i - 1) : "base", step_metadata(i),
                       commit_options(CAIRN_DURABILITY_MEMORY, true, false));
    double commit_s = seconds(Clock::now() - t0);
    double commits_per_s = static_cast<double>(models) / commit_s;
    t0 = Clock::now();
    (*engine)->drain();
    double drain_s = seconds(Clock::now() - t0);
    double manifests_per_s = static_cast<double>(models) / (commit_s + drain_s);

    // The same through the C API, on a connection of its own, as a C program writes it.
    double c_commits_per_s = 0;
    {
      cairn_client* c = nullptr;
      check_c(cairn_connect(config.socket.c_str(), &c), "cairn_connect");
      t0 = Clock::now();
      for (size_t i = 0; i < models; ++i) {
        const std::string id = "c" + std::to_string(i), parent = i ? "c" + std::to_string(i - 1) : "base";
        const std::string meta = "{\"score\": " + std::to_string(static_cast<double>(i % 1000) / 1000.0) +
                                 ", \"step\": " + std::to_string(i) + "}";
        cairn_model_writer* w = nullptr;
        check_c(cairn_model_create(c, id.c_str(), parent.c_str(), &w), "cairn_model_create");
        check_c(cairn_model_inherit_all(w), "cairn_model_inherit_all");
        check_c(cairn_model_set_metadata(w, meta.c_str()), "cairn_model_set_metadata");
        check_c(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, nullptr), "cairn_model_commit");
      }
      c_commits_per_s = static_cast<double>(models) / seconds(Clock::now() - t0);
      cairn_disconnect(c);
    }
    (*engine)->drain();

    // Pipelined: each commit returns once its request is written; every ticket is waited at the
    // end, so the time covers all replies (each commit's outcome known).
    std::vector<cn::Ticket> tickets;
    tickets.reserve(models);
    t0 = Clock::now();
    for (size_t i = 0; i < models; ++i)
      tickets.push_back(commit_inherited(client, "q" + std::to_string(i), i ? "q" + std::to_string(i - 1) : "base",
                                         step_metadata(i), commit_options(CAIRN_DURABILITY_MEMORY, false, true)));
    for (auto& t : tickets) check(t.wait(-1), "pipelined commit");
    double pipelined_s = seconds(Clock::now() - t0);
    double pipelined_per_s = static_cast<double>(models) / pipelined_s;
    (*engine)->drain();

    // Durability global: each commit waits for its manifest to be fsync'd into the repository.
    const size_t global_n = std::min<size_t>(models, 500);
    t0 = Clock::now();
    for (size_t i = 0; i < global_n; ++i)
      commit_inherited(client, "g" + std::to_string(i), "base", "",
                       commit_options(CAIRN_DURABILITY_GLOBAL, true, false));
    double global_per_s = static_cast<double>(global_n) / seconds(Clock::now() - t0);

    // Durability global, pipelined: every commit asks for global and the client goes on; the
    // flusher writes what is queued with one fsync per batch (group commit). The time covers every
    // ticket reaching global.
    const size_t gpipe_n = std::min<size_t>(models, 20000);
    std::vector<cn::Ticket> gtickets;
    gtickets.reserve(gpipe_n);
    t0 = Clock::now();
    for (size_t i = 0; i < gpipe_n; ++i)
      gtickets.push_back(commit_inherited(client, "gp" + std::to_string(i), "base", "",
                                          commit_options(CAIRN_DURABILITY_GLOBAL, false, false)));
    for (auto& t : gtickets) check(t.wait(-1), "pipelined commit global");
    double global_pipelined_per_s = static_cast<double>(gpipe_n) / seconds(Clock::now() - t0);

    // Baseline 2: one manifest-sized file per model, written and fsync'd.
    auto m = (*engine)->repository().get_shared("m1");
    check(m.status(), "manifest");
    std::string text = cairn::manifest_to_json(**m).dump();
    fs::create_directories(dir / "files");
    t0 = Clock::now();
    for (size_t i = 0; i < global_n; ++i) {
      std::string p = (dir / "files" / ("m" + std::to_string(i) + ".json")).string();
      int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(fd) != 0) {
        std::perror("baseline file");
        return 1;
      }
      ::close(fd);
    }
    double file_per_s = static_cast<double>(global_n) / seconds(Clock::now() - t0);

    // Opens: the first costs a request, later ones are served by the client's manifest cache.
    // At most the cache's capacity (libcairn keeps 4,096 models' descriptions per connection): a
    // sequential scan over more models than it holds misses every time, as with any FIFO or LRU
    // cache. The requests are the daemon's count (`stats`), each `stats` request itself left out.
    const size_t open_n = std::min<size_t>(models, 4000);
    auto fresh = value_or_die(cn::Client::connect(config.socket), "connecting");
    uint64_t req0 = requests_served(fresh);
    t0 = Clock::now();
    for (size_t i = 0; i < open_n; ++i) check(fresh.model_open("m" + std::to_string(i)).status(), "open");
    double first_open_us = seconds(Clock::now() - t0) / static_cast<double>(open_n) * 1e6;
    uint64_t req1 = requests_served(fresh) - 1;
    t0 = Clock::now();
    for (size_t i = 0; i < open_n; ++i) check(fresh.model_open("m" + std::to_string(i)).status(), "open");
    double cached_open_us = seconds(Clock::now() - t0) / static_cast<double>(open_n) * 1e6;
    uint64_t req2 = requests_served(fresh) - 2;

    std::printf("metadata-only commits (%zu models of %zu inherited tensors, one client, Unix socket):\n", models,
                tensors);
    std::printf("  %-44s %10.0f /s   (%.2fx the round trip)\n", "commit, durability memory, blocking", commits_per_s,
                commits_per_s / rt_per_s);
    std::printf("  %-44s %10.0f /s   (%.2fx the round trip)\n", "commit, durability memory, blocking, C API",
                c_commits_per_s, c_commits_per_s / rt_per_s);
    std::printf("  %-44s %10.0f /s   (%.2fx the round trip)\n", "commit, durability memory, pipelined", pipelined_per_s,
                pipelined_per_s / rt_per_s);
    std::printf("  %-44s %10.0f /s\n", "bare request round trip (floor)", rt_per_s);
    std::printf("  %-44s %10.0f /s   (all %zu in the repository after %.2f s more)\n",
                "manifests reaching the repository", manifests_per_s, models, drain_s);
    std::printf("  %-44s %10.0f /s\n", "commit, durability global (fsync'd)", global_per_s);
    std::printf("  %-44s %10.0f /s   (%zu commits, every ticket at global)\n", "commit, durability global, pipelined",
                global_pipelined_per_s, gpipe_n);
    std::printf("  %-44s %10.0f /s   (cairn global / file: %.2fx)\n", "baseline: write+fsync one manifest file",
                file_per_s, global_per_s / file_per_s);
    std::printf("  %-44s %10.2f us  (%llu requests for %zu opens)\n", "open, first time", first_open_us,
                static_cast<unsigned long long>(req1 - req0), open_n);
    std::printf("  %-44s %10.2f us  (%llu requests for %zu opens)\n", "open, manifest cached in the client",
                cached_open_us, static_cast<unsigned long long>(req2 - req1), open_n);
    out["commits_per_s_memory"] = commits_per_s;
    out["commits_per_s_memory_c"] = c_commits_per_s;
    out["commits_per_s_memory_pipelined"] = pipelined_per_s;
    out["round_trips_per_s"] = rt_per_s;
    out["manifests_per_s_to_repository"] = manifests_per_s;
    out["commits_per_s_global"] = global_per_s;
    out["commits_per_s_global_pipelined"] = global_pipelined_per_s;
    out["file_fsync_per_s"] = file_per_s;
    out["open_first_us"] = first_open_us;
    out["open_cached_us"] = cached_open_us;
    out["open_cached_requests"] = req2 - req1;
  }
  if (with_metrics) {
    // Fresh engines, each on its own repository; off and on alternate.
    constexpr int kRounds = 5;
    const size_t n = std::min<size_t>(models, 5000);
    std::vector<double> commits[2], trips[2];
    for (int round = 0; round < kRounds; ++round) {
      for (int on = 0; on < 2; ++on) {
        const fs::path run = dir / ("metrics-" + std::to_string(round) + "-" + std::to_string(on));
        fs::create_directories(run);
        cairn::Config c = config;
        c.repository = (run / "repo").string();
        c.socket = (run / "cairnd.sock").string();
        if (on) {
          c.metrics.textfile = (run / "cairn.prom").string();
          c.metrics.interval = "1s";
        }
        const Rates r = blocking_rates(c, n, tensors);
        commits[on].push_back(r.commits_per_s);
        trips[on].push_back(r.round_trips_per_s);
        fs::remove_all(run);
      }
    }
    // Each round's on/off ratio compares two runs taken one after the other; their median is what
    // drift of a shared machine disturbs least.
    std::vector<double> c_ratio, t_ratio;
    for (int round = 0; round < kRounds; ++round) {
      c_ratio.push_back(commits[1][round] / commits[0][round]);
      t_ratio.push_back(trips[1][round] / trips[0][round]);
    }
    const double c_off = median(commits[0]), c_on = median(commits[1]);
    const double t_off = median(trips[0]), t_on = median(trips[1]);
    std::printf("metrics on the request path (%zu requests of each kind per round, medians of %d rounds):\n", n,
                kRounds);
    std::printf("  %-44s %10.0f /s off  %10.0f /s on   (on/off %.3f; %+.2f us per request)\n",
                "commit, durability memory, blocking", c_off, c_on, median(c_ratio), (1e6 / c_on - 1e6 / c_off));
    std::printf("  %-44s %10.0f /s off  %10.0f /s on   (on/off %.3f; %+.2f us per request)\n",
                "bare request round trip", t_off, t_on, median(t_ratio), (1e6 / t_on - 1e6 / t_off));
    out["metrics_off_commits_per_s"] = c_off;
    out["metrics_on_commits_per_s"] = c_on;
    out["metrics_commits_on_off_ratio"] = median(c_ratio);
    out["metrics_off_round_trips_per_s"] = t_off;
    out["metrics_on_round_trips_per_s"] = t_on;
    out["metrics_round_trips_on_off_ratio"] = median(t_ratio);
  }
  fs::remove_all(dir);
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
