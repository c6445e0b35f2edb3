// Tests for coded chunks in the repository (docs/repository-format.md, "Coded chunks"): what is
// stored coded reads back exact through every path (reopen, checkpoints, gc, fsck), deltas keep
// their bases alive, damage is detected, and version-2 repositories are migrated.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "unit/tiers/repo_test_util.hpp"

namespace {

// n F32 weights from N(0, 0.02); with base, the base's values moved by step x N(0, 0.02).
std::string f32_weights(size_t n, uint64_t seed, const std::string* base = nullptr, double step = 1e-3) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::string out(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    float v = d(rng);
    if (base) {
      float b;
      std::memcpy(&b, base->data() + 4 * i, 4);
      v = b + static_cast<float>(step) * v;
    }
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

// A model of two F32 weight tensors (the first spans 3 chunks and ends mid-chunk) and a random U8
// tensor; with base, the weights are a fine-tune of base's and the U8 tensor is the same.
struct Weights {
  std::string w1, w2, u8;
};
Weights make_weights(uint64_t seed, const Weights* base = nullptr) {
  Weights w;
  w.w1 = f32_weights(40000, seed, base ? &base->w1 : nullptr);  // 160,000 bytes: chunks of 64 KiB, 64 KiB, 28,928
  w.w2 = f32_weights(1000, seed + 1, base ? &base->w2 : nullptr);
  w.u8 = base ? base->u8 : make_bytes(3000, seed + 2);
  return w;
}
ModelManifest weights_model(ChunkStore& store, const std::string& id, const std::string& parent, const Weights& w) {
  return make_model(id, parent,
                    {make_tensor(store, "layer1.weight", DType::kF32, {200, 200}, w.w1),
                     make_tensor(store, "layer2.weight", DType::kF32, {1000}, w.w2),
                     make_tensor(store, "embedding.raw", DType::kU8, {3000}, w.u8)});
}

// Each model's tensors by name, as committed (the store's tensors map keeps only the last one).
using Expected = std::map<std::string, std::map<std::string, std::string>>;
void expect(Expected* e, const std::string& id, const Weights& w) {
  (*e)[id] = {{"layer1.weight", w.w1}, {"layer2.weight", w.w2}, {"embedding.raw", w.u8}};
}
void require_exact(const Repository& repo, const Expected& e) {
  for (const auto& [id, tensors] : e) {
    INFO("model " << id);
    Result<ModelManifest> m = repo.get(id);
    REQUIRE(m.ok());
    for (const TensorManifest& t : m->tensors) {
      INFO("tensor " << t.name);
      REQUIRE(read_tensor(repo, t) == tensors.at(t.name));
    }
  }
}

// A trained-looking model "base" and its fine-tune "tune", committed.
struct BaseAndTune {
  Weights w0, w1;
  ModelManifest m0, m1;
};
BaseAndTune commit_base_and_tune(Repository& repo, ChunkStore& store) {
  BaseAndTune b;
  b.w0 = make_weights(1);
  b.m0 = weights_model(store, "base", "", b.w0);
  REQUIRE(repo.commit(b.m0, store.source()).ok());
  b.w1 = make_weights(2, &b.w0);
  b.m1 = weights_model(store, "tune", "base", b.w1);
  REQUIRE(repo.commit(b.m1, store.source()).ok());
  return b;
}

size_t count_coding(const ModelManifest& m, ChunkCoding c) {
  size_t n = 0;
  for (const TensorManifest& t : m.tensors)
    for (const ChunkRef& r : t.chunks) n += r.coding == c;
  return n;
}

}  // namespace

TEST_CASE("weights are stored coded and read back exact, also after reopening", "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  Expected want;
  Weights w = make_weights(1);
  expect(&want, "root", w);
  ModelManifest m = weights_model(store, "root", "", w);
  {
    auto repo = open_repo(tmp.repo());
    REQUIRE(repo->commit(m, store.source()).ok());
    // The float chunks are coded in planes; the random bytes stay raw.
    CHECK(count_coding(m, ChunkCoding::kPlanes) == 4);
    CHECK(count_coding(m, ChunkCoding::kRaw) == 1);
    CHECK(count_coding(m, ChunkCoding::kDelta) == 0);
    for (const ChunkRef& c : m.tensors[0].chunks) CHECK(c.stored < c.length);
    RepositoryStats st = repo->stats();
    CHECK(st.physical_bytes == m.logical_bytes());
    CHECK(st.stored_bytes < st.physical_bytes);
    const auto& planes = st.codings[static_cast<size_t>(ChunkCoding::kPlanes)];
    CHECK(planes.chunks == 4);
    CHECK(planes.bytes == 160000 + 4000);
    CHECK(planes.stored < planes.bytes);
    CHECK(st.codings[static_cast<size_t>(ChunkCoding::kRaw)].stored == 3000);
    require_exact(*repo, want);
    // The own pack is a valid safetensors file: the coded chunks are entries of their own.
    std::string pack = slurp(tmp.repo() + "/packs/" + m.pack);
    CHECK(pack.find("__coded__.") != std::string::npos);
    CHECK(pack.find("\"embedding.raw\"") != std::string::npos);  // raw and whole: under its own name
    CHECK(pack.find("\"layer1.weight\"") == std::string::npos);
  }
  auto repo = open_repo(tmp.repo());
  Result<ModelManifest> got = repo->get("root");
  REQUIRE(got.ok());
  CHECK(*got == m);
  require_exact(*repo, want);
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->dangling.empty());
  CHECK(f->orphaned.empty());
  CHECK(f->bytes_verified == m.logical_bytes());
  CHECK(slurp(tmp.repo() + "/FORMAT") == "cairn-repository 3\nchunk_size 65536\n");
}

TEST_CASE("a fine-tune is stored as deltas against the parent's chunks, never a delta of a delta",
          "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  Expected want;
  auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});  // the shared segment, as the daemon writes
  Weights w0 = make_weights(1);
  ModelManifest m0 = weights_model(store, "base", "", w0);
  REQUIRE(repo->commit(m0, store.source()).ok());
  expect(&want, "base", w0);
  Weights w1 = make_weights(2, &w0);
  ModelManifest m1 = weights_model(store, "tune-1", "base", w1);
  REQUIRE(repo->commit(m1, store.source()).ok());
  expect(&want, "tune-1", w1);
  Weights w2 = make_weights(3, &w1);
  ModelManifest m2 = weights_model(store, "tune-2", "tune-1", w2);
  REQUIRE(repo->commit(m2, store.source()).ok());
  expect(&want, "tune-2", w2);

  // tune-1's float chunks are deltas against base's chunk at the same place; the U8 tensor is
  // base's own chunk (deduplicated).
  REQUIRE(count_coding(m1, ChunkCoding::kDelta) == 4);
  for (size_t ti = 0; ti < 2; ++ti)
    for (size_t ci = 0; ci < m1.tensors[ti].chunks.size(); ++ci) {
      const ChunkRef& c = m1.tensors[ti].chunks[ci];
      REQUIRE(c.base);
      CHECK(*c.base == m0.tensors[ti].chunks[ci]);
      CHECK(c.stored < m0.tensors[ti].chunks[ci].stored);  // smaller than coding alone
    }
  CHECK(m1.tensors[2].chunks[0] == m0.tensors[2].chunks[0]);
  // tune-2's parent holds deltas: tune-2 is coded against their base, base's chunk.
  REQUIRE(count_coding(m2, ChunkCoding::kDelta) == 4);
  for (size_t ci = 0; ci < m2.tensors[0].chunks.size(); ++ci)
    CHECK(*m2.tensors[0].chunks[ci].base == m0.tensors[0].chunks[ci]);
  require_exact(*repo, want);

  Result<ModelUsage> u = repo->usage("tune-2");
  REQUIRE(u.ok());
  CHECK(u->ancestors == 2);
  CHECK(u->logical_bytes == m2.logical_bytes());
  CHECK(u->own_stored_bytes < u->stored_bytes);  // its bases and the U8 chunk are base's
  CHECK(u->lineage_stored_bytes == repo->stats().stored_bytes);
  Result<ModelUsage> u0 = repo->usage("base");
  REQUIRE(u0.ok());
  CHECK(u0->own_stored_bytes == u0->stored_bytes);
  CHECK(u0->ancestors == 0);

  // Deltas survive a checkpoint and a rebuild from it.
  REQUIRE(repo->compact().ok());
  repo.reset();
  repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  require_exact(*repo, want);
  auto got = repo->get("tune-2");
  REQUIRE(got.ok());
  CHECK(*got == m2);
}

TEST_CASE("a delta's base stays while the delta needs it: retire, collect, remove", "[repository][coding][gc]") {
  TempDir tmp;
  ChunkStore store;
  Expected want;
  auto repo = open_repo(tmp.repo());
  auto [w0, w1, m0, m1] = commit_base_and_tune(*repo, store);
  expect(&want, "tune", w1);
  REQUIRE(count_coding(m1, ChunkCoding::kDelta) == 4);
  const uint64_t stored_both = repo->stats().stored_bytes;

  // base retired and collected: its tensors are gone, its chunks are the bases of tune's deltas
  // and stay, whole.
  REQUIRE(repo->retire("base").ok());
  auto gc = repo->gc();
  REQUIRE(gc.ok());
  CHECK(gc->collected == std::vector<std::string>{"base"});
  CHECK(repo->stats().stored_bytes == stored_both);
  require_exact(*repo, want);
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->dangling.empty());
  CHECK(f->orphaned.empty());
  // Also from a checkpoint: the collected model has no tensors left to name the bases.
  REQUIRE(repo->compact().ok());
  repo.reset();
  repo = open_repo(tmp.repo());
  require_exact(*repo, want);
  CHECK(repo->stats().stored_bytes == stored_both);
  auto f2 = repo->fsck(true);
  REQUIRE(f2.ok());
  CHECK(f2->dangling.empty());

  // tune retired too: both go, and with them every byte.
  REQUIRE(repo->retire("tune").ok());
  auto gc2 = repo->gc();
  REQUIRE(gc2.ok());
  RepositoryStats st = repo->stats();
  CHECK(st.models == 0);
  CHECK(st.physical_bytes == 0);
  CHECK(st.stored_bytes == 0);
  CHECK(st.chunks == 0);
  for (const auto& c : st.codings) CHECK(c.chunks == 0);
}

TEST_CASE("a damaged coded chunk is detected, never served", "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  auto repo = open_repo(tmp.repo());
  auto [w0, w1, m0, m1] = commit_base_and_tune(*repo, store);
  SECTION("the delta's own bytes") {
    const ChunkRef c = m1.tensors[0].chunks[1];
    REQUIRE(c.coding == ChunkCoding::kDelta);
    std::string path = tmp.repo() + "/packs/" + c.pack;
    std::string bytes = slurp(path);
    bytes[c.offset + c.stored / 2] ^= 0x40;
    spit(path, bytes);
  }
  SECTION("its base's bytes") {
    const ChunkRef c = m0.tensors[0].chunks[1];
    REQUIRE(c.coding == ChunkCoding::kPlanes);
    std::string path = tmp.repo() + "/packs/" + c.pack;
    std::string bytes = slurp(path);
    bytes[c.offset + c.stored - 3] ^= 0x01;
    spit(path, bytes);
  }
  repo.reset();
  repo = open_repo(tmp.repo(), kChunk, [] {
    RepositoryOptions o = own_packs();
    o.direct_reads = false;  // the damaged bytes, not a cached copy
    return o;
  }());
  const ChunkRef& c = m1.tensors[0].chunks[1];
  std::string buf(c.length, '\0');
  Status s = repo->read_chunk(c, buf.data());
  INFO(s.to_string());
  CHECK(s.code() == StatusCode::kCorruption);
  CHECK_THAT(s.message(), Catch::Contains(c.hash.hex()));
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK_FALSE(f->dangling.empty());
  // The other chunks are intact and read.
  std::string ok(m1.tensors[0].chunks[0].length, '\0');
  CHECK(repo->read_chunk(m1.tensors[0].chunks[0], ok.data()).ok());
}

TEST_CASE("repository options: compression off, planes without deltas", "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  Weights w0 = make_weights(1);
  Weights w1 = make_weights(2, &w0);
  RepositoryOptions o = own_packs();
  SECTION("off") {
    o.compress = false;
    auto repo = open_repo(tmp.repo(), kChunk, o);
    ModelManifest m0 = weights_model(store, "base", "", w0);
    REQUIRE(repo->commit(m0, store.source()).ok());
    ModelManifest m1 = weights_model(store, "tune", "base", w1);
    REQUIRE(repo->commit(m1, store.source()).ok());
    CHECK(count_coding(m1, ChunkCoding::kRaw) == 5);
    CHECK(repo->stats().stored_bytes == repo->stats().physical_bytes);
    // A raw pack is what it was: whole tensors under their names.
    CHECK(slurp(tmp.repo() + "/packs/" + m0.pack).find("\"layer1.weight\"") != std::string::npos);
  }
  SECTION("planes") {
    o.deltas = false;
    auto repo = open_repo(tmp.repo(), kChunk, o);
    ModelManifest m0 = weights_model(store, "base", "", w0);
    REQUIRE(repo->commit(m0, store.source()).ok());
    ModelManifest m1 = weights_model(store, "tune", "base", w1);
    REQUIRE(repo->commit(m1, store.source()).ok());
    CHECK(count_coding(m1, ChunkCoding::kDelta) == 0);
    CHECK(count_coding(m1, ChunkCoding::kPlanes) == 4);
  }
}

TEST_CASE("no delta against a tensor of another shape or dtype", "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  auto repo = open_repo(tmp.repo());
  std::string w = f32_weights(20000, 1);
  std::string tuned = f32_weights(20000, 2, &w);
  ModelManifest m0 = make_model("base", "", {make_tensor(store, "w", DType::kF32, {100, 200}, w)});
  REQUIRE(repo->commit(m0, store.source()).ok());
  ModelManifest m1 = make_model("reshaped", "base", {make_tensor(store, "w", DType::kF32, {200, 100}, tuned)});
  REQUIRE(repo->commit(m1, store.source()).ok());
  CHECK(count_coding(m1, ChunkCoding::kDelta) == 0);
  ModelManifest m2 = make_model("same", "base", {make_tensor(store, "w", DType::kF32, {100, 200}, tuned)});
  // The same bytes as reshaped's: deduplicated against its chunks, whatever their coding.
  REQUIRE(repo->commit(m2, store.source()).ok());
  CHECK(m2.tensors[0].chunks == m1.tensors[0].chunks);
  std::string u = f32_weights(20000, 3, &w);
  ModelManifest m3 = make_model("renamed", "base", {make_tensor(store, "v", DType::kF32, {100, 200}, u)});
  REQUIRE(repo->commit(m3, store.source()).ok());
  CHECK(count_coding(m3, ChunkCoding::kDelta) == 0);
  CHECK(read_tensor(*repo, m3.tensors[0]) == u);
}

TEST_CASE("chunks that split elements (a chunk size that is not a multiple of the width) read back exact",
          "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  const uint64_t chunk = 4100;  // 512.5 F64 elements
  auto repo = open_repo(tmp.repo(), chunk);
  std::string w(5000 * 8, '\0');
  std::mt19937_64 rng(4);
  std::normal_distribution<double> d(0, 0.02);
  for (size_t i = 0; i < 5000; ++i) {
    double v = d(rng);
    std::memcpy(w.data() + 8 * i, &v, 8);
  }
  ModelManifest m = make_model("f64", "",
                               {make_tensor(store, "w", DType::kF64, {5000}, w, chunk),
                                make_tensor(store, "h", DType::kBF16, {7}, w.substr(0, 14), chunk)});
  REQUIRE(repo->commit(m, store.source()).ok());
  CHECK(count_coding(m, ChunkCoding::kPlanes) > 0);
  CHECK(read_tensor(*repo, m.tensors[0]) == w);
  CHECK(read_tensor(*repo, m.tensors[1]) == w.substr(0, 14));
}

TEST_CASE("a version-2 repository is migrated to version 3 and reads back exact", "[repository][coding][migrate]") {
  TempDir tmp;
  ChunkStore store;
  Expected want;
  Weights w0 = make_weights(1);
  Weights w1 = make_weights(2, &w0);
  {
    // What a version-2 cairn wrote: every chunk raw, FORMAT saying 2.
    RepositoryOptions o;
    o.compress = false;
    auto repo = open_repo(tmp.repo(), kChunk, o);
    ModelManifest m0 = weights_model(store, "base", "", w0);
    REQUIRE(repo->commit(m0, store.source()).ok());
    ModelManifest m1 = weights_model(store, "tune", "base", w1);
    REQUIRE(repo->commit(m1, store.source()).ok());
  }
  expect(&want, "base", w0);
  expect(&want, "tune", w1);
  spit(tmp.repo() + "/FORMAT", "cairn-repository 2\nchunk_size 65536\n");
  auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
  CHECK(slurp(tmp.repo() + "/FORMAT") == "cairn-repository 3\nchunk_size 65536\n");
  require_exact(*repo, want);
  // New models of the migrated repository are coded, against raw parents too.
  Weights w2 = make_weights(3, &w1);
  ModelManifest m2 = weights_model(store, "tune-2", "tune", w2);
  REQUIRE(repo->commit(m2, store.source()).ok());
  CHECK(count_coding(m2, ChunkCoding::kDelta) == 4);
  expect(&want, "tune-2", w2);
  require_exact(*repo, want);
  auto f = repo->fsck(true);
  REQUIRE(f.ok());
  CHECK(f->dangling.empty());
  // A newer format is refused, naming the versions.
  repo.reset();
  spit(tmp.repo() + "/FORMAT", "cairn-repository 4\nchunk_size 65536\n");
  auto r = Repository::open(tmp.repo(), kChunk);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("version 4"));
}

TEST_CASE("kill -9 while coded chunks are written: every acknowledged model reads back exact",
          "[repository][coding][crash]") {
  TempDir tmp;
  ChunkStore store;
  Expected want;
  // A chain of fine-tunes, known to parent and child alike (deterministic).
  std::vector<ModelManifest> planned;
  std::vector<Weights> ws;
  ws.push_back(make_weights(100));
  for (int i = 1; i < 60; ++i) ws.push_back(make_weights(100 + static_cast<uint64_t>(i), &ws.back()));
  for (int i = 0; i < 60; ++i) {
    planned.push_back(weights_model(store, "ckpt-" + std::to_string(i), i ? "ckpt-" + std::to_string(i - 1) : "",
                                    ws[static_cast<size_t>(i)]));
    expect(&want, planned.back().id, ws[static_cast<size_t>(i)]);
  }
  { auto init = open_repo(tmp.repo(), kChunk, RepositoryOptions{}); }
  std::mt19937_64 rng(9);
  size_t next = 0;
  std::set<std::string> acked;
  for (int trial = 0; trial < 6 && next < planned.size(); ++trial) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      auto repo = Repository::open(tmp.repo(), kChunk);
      if (!repo.ok()) ::_exit(3);
      for (size_t i = next; i < planned.size(); i += 2) {
        std::vector<ModelManifest> batch{planned[i]};
        if (i + 1 < planned.size()) batch.push_back(planned[i + 1]);
        std::vector<Status> results;
        (void)(*repo)->commit_batch(batch, store.source(), &results);
        for (size_t k = 0; k < batch.size(); ++k)
          if (results[k].ok()) {
            std::string line = batch[k].id + "\n";
            if (::write(fds[1], line.data(), line.size()) < 0) ::_exit(4);
          }
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    ::usleep(static_cast<useconds_t>(2000 + rng() % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    for (size_t p = 0, q; (q = got.find('\n', p)) != std::string::npos; p = q + 1) acked.insert(got.substr(p, q - p));
    auto repo = open_repo(tmp.repo(), kChunk, RepositoryOptions{});
    Expected sure;
    for (const std::string& id : acked) sure[id] = want.at(id);
    require_exact(*repo, sure);
    auto f = repo->fsck(true);
    REQUIRE(f.ok());
    REQUIRE(f->dangling.empty());
    // The next trial goes on after the last model that made it.
    while (next < planned.size() && repo->contains(planned[next].id)) ++next;
  }
  WARN("models acknowledged before the kills: " << acked.size());
}

TEST_CASE("manifest JSON: coded chunks round-trip, inconsistent coding fields are rejected by name",
          "[repository][coding][manifest]") {
  ChunkStore store;
  ModelManifest m = make_model("m", "", {make_tensor(store, "w", DType::kF32, {20000}, f32_weights(20000, 1))});
  m.created_ns = 1;
  ChunkRef& c = m.tensors.mut()[0].chunks[0];
  c.pack = "w0000000000000001-000001.pack";
  c.offset = 64;
  c.coding = ChunkCoding::kDelta;
  c.stored = 100;
  auto b = std::make_shared<ChunkRef>();
  b->hash = hash_bytes("base", 4);
  b->length = c.length;
  b->pack = "w0000000000000001-000001.pack";
  b->offset = 1000;
  b->coding = ChunkCoding::kPlanes;
  b->stored = 500;
  c.base = b;
  ChunkRef& c1 = m.tensors.mut()[0].chunks[1];
  c1.pack = "w0000000000000001-000001.pack";
  c1.offset = 2000;
  nlohmann::json j = manifest_to_json(m);
  Result<ModelManifest> back = manifest_from_json(j);
  INFO(back.status().to_string());
  REQUIRE(back.ok());
  CHECK(*back == m);
  CHECK_FALSE(j["tensors"][0]["chunks"][1].contains("coding"));  // raw: no coding fields
  CHECK_FALSE(j["tensors"][0]["chunks"][0]["base"].contains("length"));

  auto reject = [&](auto change, const std::string& says) {
    nlohmann::json bad = j;
    change(bad["tensors"][0]["chunks"][0]);
    Result<ModelManifest> r = manifest_from_json(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("tensors[0].chunks[0]"));
    CHECK_THAT(r.status().message(), Catch::Contains(says));
  };
  reject([](nlohmann::json& x) { x["coding"] = "zip"; }, "is not a coding");
  reject([](nlohmann::json& x) { x["coding"] = "raw"; }, "is not a coding");
  reject([](nlohmann::json& x) { x.erase("stored"); }, "needs 'stored'");
  reject([](nlohmann::json& x) { x.erase("base"); }, "a delta without a base");
  reject([](nlohmann::json& x) { x["coding"] = "planes"; }, "with a base");
  reject([](nlohmann::json& x) { x["stored"] = 0; }, "without its stored size");
  reject([](nlohmann::json& x) { x["base"]["length"] = 5; }, "unknown field");
  reject([](nlohmann::json& x) { x["base"]["coding"] = "delta"; }, "whose base is a delta");
  reject([](nlohmann::json& x) { x["base"].erase("stored"); }, "needs 'stored'");
  reject([](nlohmann::json& x) { x["base"]["pack"] = "../x"; }, "base.pack");
  reject(
      [](nlohmann::json& x) {
        x.erase("coding");
        x.erase("base");
      },
      "only a coded chunk");
}

TEST_CASE("a delta read takes its base from the caller's memory when it is there, checked", "[repository][coding]") {
  TempDir tmp;
  ChunkStore store;
  auto repo = open_repo(tmp.repo());
  auto [w0, w1, m0, m1] = commit_base_and_tune(*repo, store);
  const ChunkRef& c = m1.tensors[0].chunks[0];
  REQUIRE(c.coding == ChunkCoding::kDelta);
  const std::string want = w1.w1.substr(0, c.length);
  const std::string base = w0.w1.substr(0, c.length);
  std::string out(c.length, '\0');
  int asked = 0;
  SECTION("the base in memory") {
    Repository::ChunkSource resident = [&](const ChunkHash& h, uint64_t n) -> Result<const void*> {
      ++asked;
      CHECK(h == c.base->hash);
      CHECK(n == c.length);
      return static_cast<const void*>(base.data());
    };
    REQUIRE(repo->read_chunk(c, out.data(), resident).ok());
    CHECK(asked == 1);
    CHECK(out == want);
  }
  SECTION("wrong bytes in memory: read from the repository instead") {
    std::string wrong = base;
    wrong[5] ^= 1;
    Repository::ChunkSource resident = [&](const ChunkHash&, uint64_t) -> Result<const void*> {
      ++asked;
      return static_cast<const void*>(wrong.data());
    };
    REQUIRE(repo->read_chunk(c, out.data(), resident).ok());
    CHECK(asked == 1);
    CHECK(out == want);
  }
  SECTION("not in memory") {
    Repository::ChunkSource resident = [&](const ChunkHash&, uint64_t) -> Result<const void*> {
      ++asked;
      return not_found("no");
    };
    REQUIRE(repo->read_chunk(c, out.data(), resident).ok());
    CHECK(out == want);
  }
}
