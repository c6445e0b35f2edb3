// The tier manager's fetch path walks an ordered list of chunk sources (tiers/tier.hpp): the
// built-in order, a source added in front (as a peer or GPU source will be), a copy that fails its
// check, a source that lost its copy, readahead advice, and the per-source counters.
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/hash.hpp"
#include "policy/eviction.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"
#include "unit/temp_dir.hpp"

namespace cairn {
namespace {

constexpr uint64_t kChunk = 64 * 1024;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("cairn-test-tier-manager") {}
};

std::string bytes_of(uint64_t seed) {
  std::string s(kChunk, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& c : s) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

// A source in memory with the ChunkSource contract: verifies what it returns, drops a bad copy.
class MemorySource final : public ChunkSource {
 public:
  const std::string& name() const override { return name_; }
  bool has(const ChunkRef& ref) const override {
    std::lock_guard l(mu_);
    return chunks_.count(ref.hash) > 0;
  }
  Status read(const ChunkRef& ref, void* dst) override {
    std::lock_guard l(mu_);
    ++reads;
    auto it = chunks_.find(ref.hash);
    if (it == chunks_.end()) return not_found("memory source: chunk " + ref.hash.hex() + " is gone");
    std::memcpy(dst, it->second.data(), ref.length);
    if (hash_bytes(dst, ref.length) != ref.hash) {
      chunks_.erase(it);
      return corruption("memory source: chunk " + ref.hash.hex() + " failed its check");
    }
    return Status::OK();
  }
  double cost(uint64_t bytes) const override { return static_cast<double>(bytes) / 1e11; }
  void will_read(std::span<const ChunkRef* const> refs) override {
    std::lock_guard l(mu_);
    for (const ChunkRef* r : refs) advised.push_back(r->hash);
  }
  void put(const ChunkHash& h, std::string bytes) {
    std::lock_guard l(mu_);
    chunks_[h] = std::move(bytes);
  }
  void forget(const ChunkHash& h) {
    std::lock_guard l(mu_);
    chunks_.erase(h);
  }
  int reads = 0;
  std::vector<ChunkHash> advised;

 private:
  mutable std::mutex mu_;
  const std::string name_ = "memory";
  std::map<ChunkHash, std::string> chunks_;
};

struct Fixture {
  TempDir dir;
  std::unique_ptr<Repository> repo;
  std::unique_ptr<DramTier> dram;
  std::unique_ptr<TierManager> tiers;
  ModelManifest model;  // two chunks, stored in the repository
  std::string data[2];

  Fixture() {
    auto r = Repository::open(dir.path + "/repo", kChunk);
    REQUIRE(r.ok());
    repo = std::move(r).value();
    auto d = DramTier::create(8 * kChunk, std::make_unique<LruPolicy>(), "cairn-test-tier-manager");
    REQUIRE(d.ok());
    dram = std::move(d).value();
    tiers = std::make_unique<TierManager>(*dram, nullptr, *repo, nullptr);
    model.id = "m";
    TensorManifest t;
    t.name = "w";
    t.dtype = DType::kU8;
    t.shape = {static_cast<int64_t>(2 * kChunk)};
    t.nbytes = 2 * kChunk;
    for (int i = 0; i < 2; ++i) {
      data[i] = bytes_of(static_cast<uint64_t>(i) + 1);
      ChunkRef c;
      c.hash = hash_bytes(data[i].data(), kChunk);
      c.length = kChunk;
      t.chunks.push_back(c);
    }
    model.tensors.push_back(t);
    REQUIRE(repo->commit(model,
                         [&](const ChunkHash& h, uint64_t) -> Result<const void*> {
                           for (auto& s : data)
                             if (hash_bytes(s.data(), kChunk) == h) return static_cast<const void*>(s.data());
                           return not_found("no such chunk");
                         })
                .ok());
  }
  const ChunkRef& chunk(int i) const { return model.tensors[0].chunks[static_cast<size_t>(i)]; }
};

}  // namespace

TEST_CASE("tier manager: fetch walks the sources in order, first intact copy wins", "[tier_manager]") {
  Fixture f;
  CHECK(f.tiers->source_names() == std::vector<std::string>{"repository"});
  std::string out(kChunk, '\0');

  SECTION("the built-in order reads the repository and counts it") {
    REQUIRE(f.tiers->fetch(f.chunk(0), out.data()).ok());
    CHECK(out == f.data[0]);
    auto s = f.tiers->stats();
    CHECK(s["reads_from_repository"] == 1);
    CHECK(s["bytes_from_repository"] == kChunk);
    CHECK(s["reads_from_nvme"] == 0);  // reported as zero without a burst buffer
  }

  auto mem = std::make_unique<MemorySource>();
  MemorySource* m = mem.get();
  f.tiers.reset();
  f.tiers = std::make_unique<TierManager>(*f.dram, nullptr, *f.repo, nullptr, std::move(mem));
  CHECK(f.tiers->source_names() == std::vector<std::string>{"memory", "repository"});

  SECTION("a source given before the repository serves what it has; the repository the rest") {
    m->put(f.chunk(0).hash, f.data[0]);
    REQUIRE(f.tiers->fetch(f.chunk(0), out.data()).ok());
    CHECK(out == f.data[0]);
    REQUIRE(f.tiers->fetch(f.chunk(1), out.data()).ok());
    CHECK(out == f.data[1]);
    CHECK(m->reads == 1);  // asked only for what it has
    auto s = f.tiers->stats();
    CHECK(s["reads_from_memory"] == 1);
    CHECK(s["reads_from_repository"] == 1);
  }

  SECTION("a copy that fails its check is counted and read from the next source") {
    std::string bad = f.data[0];
    bad[100] ^= 1;
    m->put(f.chunk(0).hash, bad);
    REQUIRE(f.tiers->fetch(f.chunk(0), out.data()).ok());
    CHECK(out == f.data[0]);
    auto s = f.tiers->stats();
    CHECK(s["memory_copies_failed_check"] == 1);
    CHECK(s["reads_from_memory"] == 0);
    CHECK(s["reads_from_repository"] == 1);
    CHECK_FALSE(m->has(f.chunk(0)));  // the source dropped it
  }

  SECTION("a chunk no source has is kCorruption naming it; the last source's own error is returned") {
    ChunkRef ghost;
    ghost.hash = ChunkHash{1, 2};
    ghost.length = kChunk;
    Status st = f.tiers->fetch(ghost, out.data());
    CHECK(st.code() == StatusCode::kCorruption);
    CHECK_THAT(st.message(), Catch::Contains("no intact copy"));
    CHECK(m->reads == 0);
    ChunkRef bad_pack = f.chunk(0);
    bad_pack.pack = "missing.safetensors";
    st = f.tiers->fetch(bad_pack, out.data());
    CHECK_FALSE(st.ok());
  }

  SECTION("readahead tells each source only about the chunks it would serve") {
    m->put(f.chunk(1).hash, f.data[1]);
    std::vector<const ChunkRef*> refs{&f.chunk(0), &f.chunk(1)};
    f.tiers->readahead(refs);
    CHECK(m->advised == std::vector<ChunkHash>{f.chunk(1).hash});
  }
}

}  // namespace cairn
