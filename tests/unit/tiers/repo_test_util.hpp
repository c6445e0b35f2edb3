// Helpers shared by the repository's unit tests: temporary repositories, deterministic chunk
// sources, models built from bytes, and file helpers.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/fs.hpp"
#include "core/safetensors.hpp"
#include "tiers/pfs/records.hpp"
#include "tiers/pfs/repository.hpp"
#include "unit/temp_dir.hpp"
#include "unit/test_bytes.hpp"

namespace fs = std::filesystem;
using namespace cairn;

namespace {

// Not every test file uses every helper.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

constexpr uint64_t kChunk = 64 * 1024;  // small chunks so tests see multi-chunk tensors

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("cairn-test-repo") {}
};

using testing::make_bytes;

// Chunk bytes by hash, handed to commit as its ChunkSource; counts what commit asks for.
struct ChunkStore {
  std::unordered_map<ChunkHash, std::string, ChunkHashHasher> chunks;
  std::unordered_map<std::string, std::string> tensors;  // name -> bytes (last one added)
  std::atomic<int> calls{0};
  std::atomic<uint64_t> bytes_asked{0};

  Repository::ChunkSource source() {
    return [this](const ChunkHash& h, uint64_t len) -> Result<const void*> {
      ++calls;
      bytes_asked += len;
      auto it = chunks.find(h);
      if (it == chunks.end() || it->second.size() != len) return not_found("test source: no chunk " + h.hex());
      return static_cast<const void*>(it->second.data());
    };
  }
  void reset_counts() {
    calls = 0;
    bytes_asked = 0;
  }
};

TensorManifest make_tensor(ChunkStore& store, const std::string& name, DType dtype, std::vector<int64_t> shape,
                           const std::string& bytes, uint64_t chunk_size = kChunk) {
  TensorManifest t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.nbytes = bytes.size();
  REQUIRE(tensor_nbytes(dtype, t.shape).value() == bytes.size());
  for (uint64_t off = 0; off < bytes.size(); off += chunk_size) {
    uint64_t n = std::min<uint64_t>(chunk_size, bytes.size() - off);
    std::string piece = bytes.substr(off, n);
    ChunkRef c;
    c.hash = hash_bytes(piece.data(), piece.size());
    c.length = n;
    store.chunks.emplace(c.hash, std::move(piece));
    t.chunks.push_back(c);
  }
  store.tensors[name] = bytes;
  return t;
}

// A U8 tensor of n pseudo-random bytes.
TensorManifest u8_tensor(ChunkStore& store, const std::string& name, size_t n, uint64_t seed) {
  return make_tensor(store, name, DType::kU8, {static_cast<int64_t>(n)}, make_bytes(n, seed));
}

ModelManifest make_model(const std::string& id, const std::string& parent, std::vector<TensorManifest> tensors) {
  ModelManifest m;
  m.id = id;
  m.parent = parent;
  m.tensors = std::move(tensors);
  m.metadata = {{"score", 0.5}, {"task", "test"}};
  return m;
}

// Reads a tensor back chunk by chunk.
std::string read_tensor(const Repository& repo, const TensorManifest& t) {
  std::string out;
  for (const ChunkRef& c : t.chunks) {
    std::string buf(c.length, '\0');
    Status s = repo.read_chunk(c, buf.data());
    INFO(s.to_string());
    REQUIRE(s.ok());
    out += buf;
  }
  return out;
}

void require_model_bytes(const Repository& repo, const std::string& id, const ChunkStore& store) {
  Result<ModelManifest> m = repo.get(id);
  REQUIRE(m.ok());
  for (const TensorManifest& t : m->tensors) {
    INFO("tensor " << t.name);
    REQUIRE(read_tensor(repo, t) == store.tensors.at(t.name));
  }
}

// Every model with new chunks gets a pack of its own (a safetensors file) unless the test asks for
// the shared pack segment (own_pack_bytes > 0).
RepositoryOptions own_packs() {
  RepositoryOptions o;
  o.own_pack_bytes = 0;
  return o;
}

std::unique_ptr<Repository> open_repo(const std::string& dir, uint64_t chunk_size = kChunk,
                                      const RepositoryOptions& options = own_packs()) {
  auto r = Repository::open(dir, chunk_size, nullptr, options);
  INFO(r.status().to_string());
  REQUIRE(r.ok());
  return std::move(r).value();
}

std::set<std::string> files_in(const std::string& dir);

// The one file in dir (its path).
std::string only_file(const std::string& dir);

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::string only_file(const std::string& dir) {
  auto names = files_in(dir);
  INFO("files in " << dir << ": " << names.size());
  REQUIRE(names.size() == 1);
  return dir + "/" + *names.begin();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

bool same_stats(const RepositoryStats& a, const RepositoryStats& b) {
  return a.models == b.models && a.packs == b.packs && a.logical_bytes == b.logical_bytes &&
         a.physical_bytes == b.physical_bytes && a.chunks == b.chunks;
}

// Forks a child that runs child() and exits with its code, kills it with SIGKILL after a random
// delay of up to max_delay_us (at once when no_delay), and reaps it. True when the child had
// finished on its own before the kill (it must then have exited 0).
template <class Child>
bool fork_and_kill(Child child, std::mt19937_64& rng, uint64_t max_delay_us, bool no_delay) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(child());
  if (!no_delay) ::usleep(static_cast<useconds_t>(rng() % max_delay_us));
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status)) return false;
  REQUIRE(WEXITSTATUS(status) == 0);
  return true;
}

#pragma GCC diagnostic pop

}  // namespace
