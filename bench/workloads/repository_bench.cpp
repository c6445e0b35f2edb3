// The shared repository at scale (format 2, tiers/pfs/repository.hpp), in-process through the
// Repository API: no daemon, no socket.
//
// 1. Metadata-only commits: a child that inherits every tensor of its parent (62 tensors shaped like
//    ResNet-18's, the parent holding real bytes, a small chunk size so each manifest names many
//    chunks) committed with commit_batch in batches of 1, 16 and 256 (one group write and one
//    fdatasync per batch). Baseline in the same run, on the same filesystem: one file per model, as
//    format 1 stored a manifest (write the same manifest JSON to a temporary file, fsync, rename,
//    fsync the directory).
// 2. Scale: N metadata-only models (100,000; --quick 10,000) in batches of 256 into a fresh
//    repository, then the number of files under the repository directory (goal: < 1,000 at
//    100,000 models), the time to reopen it (Repository::open) before and after compact() (goal:
//    < 2 s), and the resident memory the catalog takes per model (VmRSS growth over the commits;
//    goal: 1,000,000 models in < 2 GiB, about 2 KiB per model).
//
// The catalog holds every model's manifest in memory, so the scale phase stops early (and says so)
// when its projected memory would exceed half of MemAvailable.
//
// Usage: cairn_bench_repository [--models N] [--quick] [--chunk-size BYTES] [--dir DIR] [--json FILE]
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/hash.hpp"
#include "tiers/pfs/repository.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using cairn::ModelManifest;
using cairn::Repository;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void die(const std::string& what, const cairn::Status& s) {
  std::fprintf(stderr, "cairn_bench_repository: %s: %s\n", what.c_str(), s.to_string().c_str());
  std::exit(1);
}

void check(const cairn::Status& s, const std::string& what) {
  if (!s.ok()) die(what, s);
}

// A field of /proc/self/status or /proc/meminfo, in bytes (the files give kB).
uint64_t proc_kb_field(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::stoull(line.substr(n + 1)) * 1024;
  return 0;
}
uint64_t rss_bytes() {
  ::malloc_trim(0);  // freed memory goes back to the kernel, so VmRSS tells what is held
  return proc_kb_field("/proc/self/status", "VmRSS");
}

// The filesystem type dir lives on, from /proc/self/mounts (the longest mount point that holds it).
std::string fs_type(const fs::path& dir) {
  std::string path = fs::weakly_canonical(dir).string();
  std::ifstream in("/proc/self/mounts");
  std::string dev, mnt, type, rest, best_type = "unknown";
  size_t best = 0;
  while (in >> dev >> mnt >> type && std::getline(in, rest)) {
    bool under = path == mnt || mnt == "/" || (path.compare(0, mnt.size(), mnt) == 0 && path[mnt.size()] == '/');
    if (under && mnt.size() >= best) best = mnt.size(), best_type = type;
  }
  return best_type;
}

uint64_t count_files(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (!e.is_directory()) ++n;
  return n;
}

// ResNet-18's 62 parameter tensors (torchvision order), float32.
std::vector<std::pair<std::string, std::vector<int64_t>>> resnet18() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  auto bn = [&](const std::string& p, int64_t c) {
    t.push_back({p + ".weight", {c}});
    t.push_back({p + ".bias", {c}});
  };
  t.push_back({"conv1.weight", {64, 3, 7, 7}});
  bn("bn1", 64);
  int64_t in = 64;
  for (int layer = 1; layer <= 4; ++layer) {
    int64_t out = 64ll << (layer - 1);
    for (int b = 0; b < 2; ++b) {
      std::string p = "layer" + std::to_string(layer) + "." + std::to_string(b);
      int64_t cin = b == 0 ? in : out;
      t.push_back({p + ".conv1.weight", {out, cin, 3, 3}});
      bn(p + ".bn1", out);
      t.push_back({p + ".conv2.weight", {out, out, 3, 3}});
      bn(p + ".bn2", out);
      if (b == 0 && layer > 1) {
        t.push_back({p + ".downsample.0.weight", {out, cin, 1, 1}});
        bn(p + ".downsample.1", out);
      }
    }
    in = out;
  }
  t.push_back({"fc.weight", {1000, 512}});
  t.push_back({"fc.bias", {1000}});
  return t;
}

// The parent: real (pseudo-random) bytes, chunked and hashed.
struct Parent {
  std::vector<std::vector<uint8_t>> data;
  ModelManifest manifest;
  std::unordered_map<cairn::ChunkHash, const void*, cairn::ChunkHashHasher> by_hash;
  uint64_t bytes = 0, chunks = 0;

  explicit Parent(uint64_t chunk_size) {
    manifest.id = "base";
    manifest.metadata = {{"arch", "resnet18"}};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (const auto& [name, shape] : resnet18()) {
      int64_t elems = 1;
      for (int64_t d : shape) elems *= d;
      std::vector<uint8_t> buf(static_cast<size_t>(elems) * 4);
      for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(buf.data() + i, &x, 8);
      }
      cairn::TensorManifest t;
      t.name = name;
      t.dtype = cairn::DType::kF32;
      t.shape = shape;
      t.nbytes = buf.size();
      std::vector<cairn::ChunkHash> hs = cairn::hash_chunks(buf.data(), buf.size(), chunk_size);
      for (size_t c = 0; c < hs.size(); ++c) {
        cairn::ChunkRef r;
        r.hash = hs[c];
        r.length = std::min<uint64_t>(chunk_size, buf.size() - c * chunk_size);
        t.chunks.push_back(r);
        by_hash.emplace(hs[c], buf.data() + c * chunk_size);
      }
      bytes += buf.size();
      chunks += hs.size();
      manifest.tensors.push_back(std::move(t));
      data.push_back(std::move(buf));
    }
  }

  Repository::ChunkSource source() const {
    return [this](const cairn::ChunkHash& h, uint64_t) -> cairn::Result<const void*> {
      auto it = by_hash.find(h);
      if (it == by_hash.end()) return cairn::not_found("chunk " + h.hex());
      return it->second;
    };
  }
};

// A metadata-only child of the parent: every tensor inherited.
ModelManifest child(const ModelManifest& parent, const std::string& id, uint64_t i) {
  ModelManifest m;
  m.id = id;
  m.parent = parent.id;
  m.metadata = {{"score", static_cast<double>(i % 1000) / 1000.0}, {"step", i}};
  m.tensors = parent.tensors;
  return m;
}

std::unique_ptr<Repository> open_repo(const fs::path& dir, uint64_t chunk_size, double* took = nullptr) {
  auto t0 = Clock::now();
  auto r = Repository::open(dir.string(), chunk_size);
  if (took) *took = seconds(Clock::now() - t0);
  if (!r.ok()) die("opening " + dir.string(), r.status());
  return std::move(r).value();
}

// Commits n children of parent in batches of `batch`; returns the seconds spent in commit_batch.
double commit_children(Repository& repo, const ModelManifest& parent, const Parent& src, const std::string& prefix,
                       uint64_t n, uint64_t batch, uint64_t first = 0) {
  double spent = 0;
  std::vector<ModelManifest> ms;
  std::vector<cairn::Status> results;
  for (uint64_t i = 0; i < n; i += batch) {
    ms.clear();
    for (uint64_t k = i; k < std::min(n, i + batch); ++k)
      ms.push_back(child(parent, prefix + std::to_string(first + k), k));
    auto t0 = Clock::now();
    cairn::Status s = repo.commit_batch(ms, src.source(), &results);
    spent += seconds(Clock::now() - t0);
    check(s, "commit_batch");
  }
  return spent;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t models = 100000, chunk_size = 64 << 10;
  std::string json_path, dir_arg;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--models" && i + 1 < argc)
      models = std::stoull(argv[++i]);
    else if (a == "--quick")
      quick = true, models = 10000;
    else if (a == "--chunk-size" && i + 1 < argc)
      chunk_size = std::stoull(argv[++i]);
    else if (a == "--dir" && i + 1 < argc)
      dir_arg = argv[++i];
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::fprintf(
          stderr,
          "usage: cairn_bench_repository [--models N] [--quick] [--chunk-size BYTES] [--dir DIR] [--json FILE]\n");
      return 2;
    }
  }
  fs::path base = dir_arg.empty() ? fs::temp_directory_path() : fs::path(dir_arg);
  fs::path dir = base / ("cairn-bench-repo-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fstype = fs_type(dir);
  const uint64_t mem_available = proc_kb_field("/proc/meminfo", "MemAvailable");

  Parent parent(chunk_size);
  nlohmann::json out{{"dir", dir.string()},
                     {"fs_type", fstype},
                     {"chunk_size", chunk_size},
                     {"tensors_per_model", parent.manifest.tensors.size()},
                     {"chunks_per_model", parent.chunks},
                     {"parent_bytes", parent.bytes}};
  std::printf("repository on %s (%s), chunk size %llu KiB; parent: %zu tensors, %.1f MiB, %llu chunks\n", dir.c_str(),
              fstype.c_str(), static_cast<unsigned long long>(chunk_size >> 10), parent.manifest.tensors.size(),
              static_cast<double>(parent.bytes) / (1 << 20), static_cast<unsigned long long>(parent.chunks));

  // ---- 1. commit rate by batch size, and the one-file-per-model baseline ----
  const uint64_t per_batch_models[3][2] = {
      {1, quick ? 200u : 1000u}, {16, quick ? 1024u : 4096u}, {256, quick ? 2048u : 8192u}};
  nlohmann::json rates = nlohmann::json::array();
  std::string sample_json;
  {
    auto repo = open_repo(dir / "rate", chunk_size);
    ModelManifest p = parent.manifest;
    check(repo->commit(p, parent.source()), "committing the parent");
    for (const auto& [batch, n] : per_batch_models) {
      uint64_t syncs0 = repo->stats().group_syncs;
      double s = commit_children(*repo, p, parent, "b" + std::to_string(batch) + "-", n, batch);
      uint64_t syncs = repo->stats().group_syncs - syncs0;
      rates.push_back({{"batch", batch},
                       {"models", n},
                       {"seconds", s},
                       {"commits_per_s", static_cast<double>(n) / s},
                       {"group_syncs", syncs}});
    }
    auto m = repo->get("b1-0");
    check(m.status(), "reading a child back");
    sample_json = cairn::manifest_to_json(*m).dump() + "\n";
  }
  // Format 1: one manifest file per model, published with write + fsync + rename + fsync(dir).
  const uint64_t file_n = per_batch_models[0][1];
  double file_s = 0;
  {
    fs::path mdir = dir / "files" / "manifests";
    fs::create_directories(mdir);
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < file_n; ++i) {
      std::string tmp = (mdir / (".tmp-" + std::to_string(i))).string();
      std::string fin = (mdir / (std::to_string(i) + ".json")).string();
      int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || ::write(fd, sample_json.data(), sample_json.size()) != static_cast<ssize_t>(sample_json.size()) ||
          ::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), fin.c_str()) != 0) {
        std::perror("baseline manifest file");
        return 1;
      }
      int dfd = ::open(mdir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd < 0 || ::fsync(dfd) != 0) {
        std::perror("baseline directory fsync");
        return 1;
      }
      ::close(dfd);
    }
    file_s = seconds(Clock::now() - t0);
  }
  const double file_per_s = static_cast<double>(file_n) / file_s;
  fs::remove_all(dir / "rate");
  fs::remove_all(dir / "files");
  out["commit_rates"] = rates;
  out["file_per_model_commits_per_s"] = file_per_s;
  out["manifest_json_bytes"] = sample_json.size();

  std::printf("\nmetadata-only commits (a child inheriting all %zu tensors, %llu chunk references):\n",
              parent.manifest.tensors.size(), static_cast<unsigned long long>(parent.chunks));
  for (const auto& r : rates)
    std::printf("  %-48s %10.0f /s   (%llu models, %llu fdatasyncs; %.2fx the baseline)\n",
                ("commit_batch, batch " + std::to_string(r["batch"].get<uint64_t>())).c_str(),
                r["commits_per_s"].get<double>(), static_cast<unsigned long long>(r["models"].get<uint64_t>()),
                static_cast<unsigned long long>(r["group_syncs"].get<uint64_t>()),
                r["commits_per_s"].get<double>() / file_per_s);
  std::printf("  %-48s %10.0f /s   (%zu-byte manifest, %llu files)\n", "baseline: one file per model (format 1)",
              file_per_s, sample_json.size(), static_cast<unsigned long long>(file_n));

  // ---- 2. scale: N models, files, reopen before/after compact, memory per model ----
  fs::path sdir = dir / "scale";
  nlohmann::json scale;
  {
    uint64_t rss0 = 0, rss1 = 0, done = 0;
    double commit_s = 0;
    bool capped = false;
    {
      auto repo = open_repo(sdir, chunk_size);
      ModelManifest p = parent.manifest;
      check(repo->commit(p, parent.source()), "committing the parent");
      rss0 = rss_bytes();
      // A first slice tells how much memory a model takes; stop early rather than exhaust memory.
      const uint64_t probe = std::min<uint64_t>(models, 1024);
      commit_s += commit_children(*repo, p, parent, "m", probe, 256);
      done = probe;
      double per_model = static_cast<double>(rss_bytes() - std::min(rss0, rss_bytes())) / static_cast<double>(probe);
      uint64_t target = models;
      if (per_model > 0 && per_model * static_cast<double>(models) > 0.5 * static_cast<double>(mem_available)) {
        target = std::max<uint64_t>(
            probe, static_cast<uint64_t>(0.5 * static_cast<double>(mem_available) / per_model) / 1000 * 1000);
        capped = target < models;
        std::printf("\nscale: %.0f bytes per model in memory: %llu models would need %.1f GiB; stopping at %llu\n",
                    per_model, static_cast<unsigned long long>(models),
                    per_model * static_cast<double>(models) / (1ull << 30), static_cast<unsigned long long>(target));
      }
      commit_s += commit_children(*repo, p, parent, "m", target - done, 256, done);
      done = target;
      rss1 = rss_bytes();
      scale["group_syncs"] = repo->stats().group_syncs;
    }
    const double bytes_per_model = static_cast<double>(rss1 - std::min(rss0, rss1)) / static_cast<double>(done);
    const uint64_t files_before = count_files(sdir);
    double open_before = 0, open_after = 0, compact_s = 0;
    uint64_t open_rss = 0;
    nlohmann::json creport;
    {
      uint64_t r0 = rss_bytes();
      auto repo = open_repo(sdir, chunk_size, &open_before);
      open_rss = rss_bytes() - std::min(r0, rss_bytes());
      if (repo->stats().models != done + 1) {
        std::fprintf(stderr, "cairn_bench_repository: reopened with %llu models, expected %llu\n",
                     static_cast<unsigned long long>(repo->stats().models), static_cast<unsigned long long>(done + 1));
        return 1;
      }
      auto t0 = Clock::now();
      auto c = repo->compact();
      compact_s = seconds(Clock::now() - t0);
      check(c.status(), "compact");
      creport = {
          {"models", c->models}, {"logs_deleted", c->logs_deleted}, {"checkpoints_deleted", c->checkpoints_deleted}};
    }
    const uint64_t files_after = count_files(sdir);
    {
      auto repo = open_repo(sdir, chunk_size, &open_after);
      if (repo->stats().models != done + 1) {
        std::fprintf(stderr, "cairn_bench_repository: after compact, reopened with %llu models, expected %llu\n",
                     static_cast<unsigned long long>(repo->stats().models), static_cast<unsigned long long>(done + 1));
        return 1;
      }
    }
    scale.update({{"models", done},
                  {"models_requested", models},
                  {"capped_by_memory", capped},
                  {"commit_batch", 256},
                  {"commits_per_s", static_cast<double>(done) / commit_s},
                  {"files_before_compact", files_before},
                  {"files_after_compact", files_after},
                  {"open_s_before_compact", open_before},
                  {"open_s_after_compact", open_after},
                  {"compact_s", compact_s},
                  {"compact", creport},
                  {"rss_bytes_per_model", bytes_per_model},
                  {"rss_bytes_per_model_reopened", static_cast<double>(open_rss) / static_cast<double>(done)},
                  {"projected_rss_bytes_1m_models", bytes_per_model * 1e6}});
    std::printf("\nscale: %llu metadata-only models in batches of 256 (%.0f commits/s)%s\n",
                static_cast<unsigned long long>(done), static_cast<double>(done) / commit_s,
                capped ? " [capped: not enough memory for the requested count]" : "");
    std::printf("  %-48s %10llu        (goal: < 1,000 at 100,000 models)\n", "files, after the commits",
                static_cast<unsigned long long>(files_before));
    std::printf("  %-48s %10llu\n", "files, after compact()", static_cast<unsigned long long>(files_after));
    std::printf("  %-48s %10.3f s      (goal: < 2 s)\n", "Repository::open, before compact()", open_before);
    std::printf("  %-48s %10.3f s\n", "compact()", compact_s);
    std::printf("  %-48s %10.3f s      (goal: < 2 s)\n", "Repository::open, after compact()", open_after);
    std::printf("  %-48s %10.0f B      (goal: < ~2 KiB: 1,000,000 models in < 2 GiB)\n",
                "memory per model (VmRSS growth, committing)", bytes_per_model);
    std::printf("  %-48s %10.0f B\n", "memory per model (VmRSS growth, reopening)",
                static_cast<double>(open_rss) / static_cast<double>(done));
    std::printf("  %-48s %10.2f GiB\n", "projected for 1,000,000 models", bytes_per_model * 1e6 / (1ull << 30));
  }
  out["scale"] = scale;
  fs::remove_all(dir);
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
