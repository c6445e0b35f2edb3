// A small NAS-style run against a running cairnd, as scripts/demo shows it.
//
// Regularized evolution over ResNet-18-shaped models (the tensor names and shapes of torchvision's
// resnet18 state_dict): each candidate loads its parent, changes a few layers (re-initialises two
// convolutions with their batch norms, and the classifier), declares every other tensor inherited
// and is stored with its parent. Beside it, the same models are written the way people do today,
// one safetensors file per model, and read back with plain reads, so the two can be compared in
// the same run.
//
// Usage: cairn_nas_demo [--candidates N] [--baseline-dir DIR] [--json]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cairn/client.hpp"
#include "core/safetensors.hpp"
#include "core/wire.hpp"

namespace {

namespace cn = cairn::v1;
using cairn::DType;
using Clock = std::chrono::steady_clock;

struct Param {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string layer;  // what a mutation re-initialises together
};

// torchvision resnet18().state_dict(): names and shapes.
std::vector<Param> resnet18() {
  std::vector<Param> ps;
  auto bn = [&](const std::string& p, int64_t c, const std::string& layer) {
    for (const char* s : {"weight", "bias", "running_mean", "running_var"})
      ps.push_back({p + "." + s, DType::kF32, {c}, layer});
    ps.push_back({p + ".num_batches_tracked", DType::kI64, {}, layer});
  };
  ps.push_back({"conv1.weight", DType::kF32, {64, 3, 7, 7}, "conv1"});
  bn("bn1", 64, "conv1");
  int64_t in = 64;
  for (int stage = 1; stage <= 4; ++stage) {
    int64_t out = 64LL << (stage - 1);
    for (int block = 0; block < 2; ++block) {
      std::string p = "layer" + std::to_string(stage) + "." + std::to_string(block);
      int64_t cin = block == 0 ? in : out;
      ps.push_back({p + ".conv1.weight", DType::kF32, {out, cin, 3, 3}, p + ".conv1"});
      bn(p + ".bn1", out, p + ".conv1");
      ps.push_back({p + ".conv2.weight", DType::kF32, {out, out, 3, 3}, p + ".conv2"});
      bn(p + ".bn2", out, p + ".conv2");
      if (block == 0 && stage > 1) {
        ps.push_back({p + ".downsample.0.weight", DType::kF32, {out, cin, 1, 1}, p + ".downsample"});
        bn(p + ".downsample.1", out, p + ".downsample");
      }
    }
    in = out;
  }
  ps.push_back({"fc.weight", DType::kF32, {1000, 512}, "fc"});
  ps.push_back({"fc.bias", DType::kF32, {1000}, "fc"});
  return ps;
}

uint64_t nbytes(const Param& p) { return *cairn::tensor_nbytes(p.dtype, p.shape); }

void fill(std::vector<uint8_t>& buf, std::mt19937_64& rng) {
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(buf.data() + i, &v, 8);
  }
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string human(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1ull << 20));
  return buf;
}

int die(const cairn::Status& s) {
  std::fprintf(stderr, "cairn_nas_demo: %s\n", s.to_string().c_str());
  return 1;
}

int die(const cn::Status& s) {
  std::fprintf(stderr, "cairn_nas_demo: %s\n", s.message().c_str());
  return 1;
}

// The daemon's statistics (cairn_request {"op":"stats"}).
cn::Result<nlohmann::json> stats(cn::Client& c) {
  auto r = c.request(R"({"op":"stats"})");
  if (!r) return r.status();
  return nlohmann::json::parse(*r);
}

}  // namespace

int main(int argc, char** argv) {
  int candidates = 32;
  std::string baseline_dir;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--candidates" && i + 1 < argc)
      candidates = std::max(2, std::atoi(argv[++i]));
    else if (a == "--baseline-dir" && i + 1 < argc)
      baseline_dir = argv[++i];
    else if (a == "--json")
      as_json = true;
    else {
      std::fprintf(stderr, "usage: cairn_nas_demo [--candidates N] [--baseline-dir DIR] [--json]\n");
      return 2;
    }
  }
  if (baseline_dir.empty())
    baseline_dir = std::filesystem::temp_directory_path() / ("cairn-nas-baseline-" + std::to_string(::getpid()));
  std::filesystem::create_directories(baseline_dir);

  auto client = cn::Client::connect();
  if (!client) return die(client.status());
  cn::Client& c = *client;
  auto stats0 = stats(c);
  if (!stats0) return die(stats0.status());

  const std::vector<Param> params = resnet18();
  std::vector<std::string> layers;
  for (const auto& p : params)
    if (p.layer != "fc" && std::find(layers.begin(), layers.end(), p.layer) == layers.end()) layers.push_back(p.layer);
  uint64_t model_bytes = 0;
  for (const auto& p : params) model_bytes += nbytes(p);

  std::mt19937_64 rng(2026);
  const std::string run = "nas-" + std::to_string(::getpid()) + "-";
  struct Member {
    std::string id;
    double score;
  };
  std::deque<Member> population;
  const size_t kPopulation = 8, kSample = 3;
  std::vector<double> cairn_copy_ms, cairn_map_ms, file_read_ms, store_ms, file_write_ms;
  uint64_t naive_bytes = 0, inherited_bytes = 0;
  std::vector<uint8_t> buf, readback(model_bytes), file_buf(model_bytes + (1 << 20));
  std::fill(readback.begin(), readback.end(), 0);
  std::fill(file_buf.begin(), file_buf.end(), 0);

  for (int n = 0; n < candidates; ++n) {
    std::string id = run + std::to_string(n);
    std::string parent;
    if (!population.empty()) {
      // Tournament: the best of a random sample of the population is the parent.
      double best = -1;
      for (size_t k = 0; k < std::min(kSample, population.size()); ++k) {
        const Member& m = population[rng() % population.size()];
        if (m.score > best) best = m.score, parent = m.id;
      }
      // Load the parent: a copy into a user buffer, a zero-copy map, and the one-file baseline.
      auto t0 = Clock::now();
      auto reader = c.model_open(parent);
      if (!reader) return die(reader.status());
      auto tensors = reader->tensors();
      if (!tensors) return die(tensors.status());
      uint64_t pos = 0;
      std::vector<std::string> names;
      std::vector<void*> dsts;
      std::vector<size_t> sizes;
      for (const auto& t : *tensors) {
        names.push_back(t.name);
        dsts.push_back(readback.data() + pos);
        sizes.push_back(t.nbytes);
        pos += t.nbytes;
      }
      if (auto st = reader->read(names, dsts, sizes); !st) return die(st);
      cairn_copy_ms.push_back(ms(Clock::now() - t0));
      t0 = Clock::now();
      auto views = reader->map(names);
      if (!views) return die(views.status());
      cairn_map_ms.push_back(ms(Clock::now() - t0));
      reader->close();

      std::string file = baseline_dir + "/" + parent + ".safetensors";
      t0 = Clock::now();
      int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return die(cairn::errno_status(file, errno));
      // Into a reused buffer, as cairn's read above: both measure the read, not page faults.
      file_buf.resize(std::filesystem::file_size(file));
      if (auto st = cairn::wire::read_full(fd, file_buf.data(), file_buf.size()); !st.ok()) return die(st);
      ::close(fd);
      file_read_ms.push_back(ms(Clock::now() - t0));
    }

    // Build the candidate: mutate two convolution layers and the classifier; inherit the rest.
    std::vector<std::string> mutated{"fc"};
    if (!parent.empty())
      while (mutated.size() < 3) {
        const std::string& l = layers[rng() % layers.size()];
        if (std::find(mutated.begin(), mutated.end(), l) == mutated.end()) mutated.push_back(l);
      }
    double score = std::uniform_real_distribution<double>(0.5, 0.95)(rng);
    auto t0 = Clock::now();
    auto writer = c.model_create(id, parent);
    if (!writer) return die(writer.status());
    cn::Writer& w = *writer;
    std::vector<cairn::safetensors::TensorEntry> entries;
    std::vector<std::vector<uint8_t>> file_data;
    for (const auto& p : params) {
      bool changed = parent.empty() || std::find(mutated.begin(), mutated.end(), p.layer) != mutated.end();
      buf.resize(nbytes(p));
      if (changed) {
        fill(buf, rng);
        if (auto st = w.add_tensor(p.name, buf.data(), static_cast<cairn_dtype>(p.dtype), p.shape); !st) return die(st);
      } else {
        if (auto st = w.inherit_tensor(p.name); !st) return die(st);
        inherited_bytes += buf.size();
      }
      entries.push_back({p.name, p.dtype, p.shape, 0, 0});
      file_data.push_back(changed ? buf : std::vector<uint8_t>());
    }
    (void)w.set_metadata(nlohmann::json{{"score", score}, {"generation", n}, {"mutated", mutated}}.dump());
    if (auto st = w.commit(CAIRN_DURABILITY_GLOBAL); !st) return die(st);
    store_ms.push_back(ms(Clock::now() - t0));

    // The baseline: the whole model in its own safetensors file (the inherited tensors come from
    // the parent's file, which is what a user would have in memory after loading it).
    auto header = cairn::safetensors::build_header(entries, nullptr);
    if (!header.ok()) return die(header.status());
    std::vector<uint8_t> parent_file;
    if (!parent.empty()) {
      std::string pf = baseline_dir + "/" + parent + ".safetensors";
      parent_file.resize(std::filesystem::file_size(pf));
      int fd = ::open(pf.c_str(), O_RDONLY | O_CLOEXEC);
      (void)cairn::wire::read_full(fd, parent_file.data(), parent_file.size());
      ::close(fd);
    }
    t0 = Clock::now();
    std::string file = baseline_dir + "/" + id + ".safetensors";
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return die(cairn::errno_status(file, errno));
    (void)cairn::wire::write_full(fd, header->data(), header->size());
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!file_data[i].empty()) {
        (void)cairn::wire::write_full(fd, file_data[i].data(), file_data[i].size());
      } else {
        // Same offsets in the parent's file: same layout, same header size.
        (void)cairn::wire::write_full(fd, parent_file.data() + header->size() + entries[i].begin, entries[i].nbytes());
      }
    }
    ::fsync(fd);
    ::close(fd);
    file_write_ms.push_back(ms(Clock::now() - t0));
    naive_bytes += std::filesystem::file_size(file);

    population.push_back({id, score});
    if (population.size() > kPopulation) population.pop_front();  // regularized: the oldest dies
  }

  auto stats1 = stats(c);
  if (!stats1) return die(stats1.status());
  const auto& r0 = (*stats0)["repository"];
  const auto& r1 = (*stats1)["repository"];
  uint64_t physical = r1["physical_bytes"].get<uint64_t>() - r0["physical_bytes"].get<uint64_t>();
  uint64_t logical = r1["logical_bytes"].get<uint64_t>() - r0["logical_bytes"].get<uint64_t>();
  const auto& dram = (*stats1)["tiers"]["dram"];
  const auto& pfs = (*stats1)["tiers"]["pfs"];
  std::filesystem::remove_all(baseline_dir);

  nlohmann::json out{{"candidates", candidates},
                     {"model_bytes", model_bytes},
                     {"logical_bytes", logical},
                     {"cairn_physical_bytes", physical},
                     {"one_file_per_model_bytes", naive_bytes},
                     {"inherited_bytes", inherited_bytes},
                     {"median_store_ms", median(store_ms)},
                     {"median_file_write_fsync_ms", median(file_write_ms)},
                     {"median_load_copy_ms", median(cairn_copy_ms)},
                     {"median_load_map_ms", median(cairn_map_ms)},
                     {"median_file_read_ms", median(file_read_ms)},
                     {"dram_hits", dram["hits"]},
                     {"dram_misses", dram["misses"]},
                     {"pfs_chunk_reads", pfs["hits"]}};
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf(
      "NAS-style run: %d candidates of ResNet-18 shape (%zu tensors, %s each); each changes 3 layers of its parent\n",
      candidates, params.size(), human(model_bytes).c_str());
  std::printf("  bytes stored   cairn repository %10s | one safetensors file per model %10s  (%.1fx smaller)\n",
              human(physical).c_str(), human(naive_bytes).c_str(),
              physical ? static_cast<double>(naive_bytes) / static_cast<double>(physical) : 0.0);
  std::printf("  store (median) cairn commit, global %7.1f ms | file write + fsync %7.1f ms\n", median(store_ms),
              median(file_write_ms));
  std::printf(
      "  load parent    cairn read into buffer %5.1f ms | zero-copy map %5.2f ms | file read (page cache) %5.1f ms\n",
      median(cairn_copy_ms), median(cairn_map_ms), median(file_read_ms));
  std::printf("  tiers          DRAM hits %llu, misses %llu; chunks read from the repository %llu\n",
              static_cast<unsigned long long>(dram["hits"].get<uint64_t>()),
              static_cast<unsigned long long>(dram["misses"].get<uint64_t>()),
              static_cast<unsigned long long>(pfs["hits"].get<uint64_t>()));
  return 0;
}
