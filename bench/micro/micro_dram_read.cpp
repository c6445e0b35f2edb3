// DRAM-hit reads through the public C++ client (cairn/client.hpp over libcairn.so) from a real
// engine and server in this process (the same path an application takes: a Unix socket for the
// lease, the shared arena for the bytes).
//
// One model, "resident", holds tensors of 1, 16 and 64 MiB, committed before the first benchmark
// and read once (copy and map) so the client's arena mapping is faulted in. Per tensor size:
//   dram_read   Reader::read_tensor into a pre-faulted user buffer (a lease round trip, a memcpy
//               out of the arena; the release rides on the next request)
//   dram_map    Client::model_open + Reader::map + close (the open is served by the client's cache
//               of model descriptions, no request; a lease round trip, a release round trip; no
//               byte copied). Bytes/s is the tensor's size over that time: how fast the tensor
//               becomes usable.
//   memcpy      memcpy of the same number of bytes between pre-faulted private buffers
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/micro/micro_common.hpp"
#include "cairn/client.hpp"
#include "core/config.hpp"
#include "daemon/engine.hpp"
#include "daemon/server.hpp"

namespace {

namespace fs = std::filesystem;
namespace cn = cairn::v1;

constexpr uint64_t kSizes[] = {uint64_t{1} << 20, uint64_t{16} << 20, uint64_t{64} << 20};

std::string tensor_name(uint64_t bytes) { return "t" + cairn::bench::size_label(bytes); }

struct Resident {
  fs::path dir;
  std::unique_ptr<cairn::Engine> engine;
  std::unique_ptr<cairn::Server> server;
  cn::Client client;
  std::optional<cn::Reader> reader;
  std::string error;  // why it could not start, or empty

  ~Resident() {
    reader.reset();
    client = cn::Client();
    if (server) server->stop();
    server.reset();
    engine.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

std::unique_ptr<Resident> g_resident;

// Starts the daemon and commits the model on first use. Returns null (with the reason in *error)
// when it cannot.
Resident* resident(std::string* error) {
  if (g_resident) {
    *error = g_resident->error;
    return g_resident->error.empty() ? g_resident.get() : nullptr;
  }
  g_resident = std::make_unique<Resident>();
  Resident& r = *g_resident;
  auto fail_with = [&](const std::string& what, const std::string& message) -> Resident* {
    r.error = what + ": " + message;
    *error = r.error;
    return nullptr;
  };
  auto fail = [&](const std::string& what, const cairn::Status& s) { return fail_with(what, s.to_string()); };
  auto fail_v1 = [&](const std::string& what, const cn::Status& s) { return fail_with(what, s.message()); };
  r.dir = fs::temp_directory_path() / ("cairn-bench-micro-" + std::to_string(::getpid()));
  fs::create_directories(r.dir);
  uint64_t total = 0;
  for (uint64_t s : kSizes) total += s;
  cairn::Config config;
  config.repository = (r.dir / "repo").string();
  config.socket = (r.dir / "cairnd.sock").string();
  config.log.level = "warn";
  config.tiers.dram.capacity = 3 * total + (64ull << 20);

  auto engine = cairn::Engine::create(config);
  if (!engine.ok()) return fail("starting the engine", engine.status());
  r.engine = std::move(*engine);
  // A daemon backs its arena at start-up, long before the first read.
  while (!r.engine->dram().prefault_finished()) ::usleep(1000);
  auto server = cairn::Server::start(*r.engine, config.socket);
  if (!server.ok()) return fail("starting the server", server.status());
  r.server = std::move(*server);
  auto client = cn::Client::connect(config.socket);
  if (!client) return fail_v1("connecting", client.status());
  r.client = std::move(*client);
  {
    auto w = r.client.model_create("resident");
    if (!w) return fail_v1("create", w.status());
    for (uint64_t s : kSizes) {
      const std::vector<uint8_t> bytes = cairn::bench::random_bytes(s, s);
      cn::Status st = w->add_tensor(tensor_name(s), bytes.data(), CAIRN_DTYPE_U8, {static_cast<int64_t>(s)});
      if (!st) return fail_v1("add_tensor", st);
    }
    if (cn::Status st = w->commit(CAIRN_DURABILITY_GLOBAL); !st) return fail_v1("commit", st);
  }
  // The first read and map on a connection fault in the client's mappings of the arena.
  for (uint64_t s : kSizes) {
    auto reader = r.client.model_open("resident");
    if (!reader) return fail_v1("open", reader.status());
    std::vector<uint8_t> dst(s);
    cn::Status st = reader->read_tensor(tensor_name(s), dst.data(), s);
    if (!st) return fail_v1("first read", st);
    const std::vector<uint8_t> expected = cairn::bench::random_bytes(s, s);
    if (dst != expected) return fail("first read", cairn::internal_error("bytes differ"));
    auto view = reader->map({tensor_name(s)});
    if (!view) return fail_v1("first map", view.status());
    if (std::memcmp((*view)[0].data, expected.data(), s) != 0)
      return fail("first map", cairn::internal_error("bytes differ"));
  }
  auto reader = r.client.model_open("resident");
  if (!reader) return fail_v1("open", reader.status());
  r.reader.emplace(std::move(*reader));
  return &r;
}

void read_copy(benchmark::State& state, uint64_t size) {
  std::string error;
  Resident* r = resident(&error);
  if (r == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  const std::string name = tensor_name(size);
  std::vector<uint8_t> dst(size, 1);  // faulted in before timing
  for (auto _ : state) {
    cn::Status s = r->reader->read_tensor(name, dst.data(), size);
    if (!s) {
      state.SkipWithError(s.message().c_str());
      break;
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

void read_map(benchmark::State& state, uint64_t size) {
  std::string error;
  Resident* r = resident(&error);
  if (r == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  const std::string name = tensor_name(size);
  for (auto _ : state) {
    auto reader = r->client.model_open("resident");
    auto view = reader ? reader->map({name}) : cn::Result<std::vector<cn::Reader::View>>(reader.status());
    if (!view) {
      state.SkipWithError(view.status().message().c_str());
      break;
    }
    benchmark::DoNotOptimize((*view)[0].data);
    reader->close();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

void copy(benchmark::State& state, uint64_t size) {
  const std::vector<uint8_t> src = cairn::bench::random_bytes(size, 9);
  std::vector<uint8_t> dst(size, 1);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), size);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

}  // namespace

namespace cairn::bench {

void register_dram_read_benchmarks() {
  for (uint64_t size : kSizes) {
    const std::string label = size_label(size);
    benchmark::RegisterBenchmark(bench_name("dram_read", label, "cairn").c_str(), read_copy, size)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(bench_name("dram_read", label, "memcpy").c_str(), copy, size)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(bench_name("dram_map", label, "cairn").c_str(), read_map, size)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(bench_name("dram_map", label, "memcpy").c_str(), copy, size)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

void stop_resident_daemon() { g_resident.reset(); }

}  // namespace cairn::bench
