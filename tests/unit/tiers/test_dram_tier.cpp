// DramTier: chunks resident in the shared arena — allocation, load coordination (claim / finish /
// abort / wait), deduplicating adoption, pinning, dirtiness, LRU eviction and hints to the policy.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "policy/eviction.hpp"
#include "policy/hint_policy.hpp"
#include "tiers/dram/dram_tier.hpp"

namespace cairn {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kArena = 4 * kMiB;
constexpr uint64_t kChunk = kMiB;  // four chunks fill the arena

std::unique_ptr<DramTier> make_tier(uint64_t capacity = kArena) {
  auto t = DramTier::create(capacity, std::make_unique<LruPolicy>(), "cairn-test-dram");
  REQUIRE(t.ok());
  return std::move(t).value();
}

ChunkHash hash_n(uint64_t n) { return ChunkHash{0xC0FFEE, n}; }

// Allocates kChunk bytes, fills them with `fill` and adopts them as chunk h (pinned once).
uint64_t put_chunk(DramTier& tier, const ChunkHash& h, bool dirty, uint8_t fill = 0x5A) {
  auto off = tier.allocate(kChunk);
  REQUIRE(off.ok());
  std::memset(tier.base() + *off, fill, kChunk);
  return tier.adopt(h, *off, kChunk, dirty);
}

// True (with a short pause) when done has not been set: the other thread is still blocked.
bool still_blocked(const std::atomic<bool>& done) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return !done.load();
}

}  // namespace

TEST_CASE("DramTier allocates and releases arena space", "[dram]") {
  auto tier = make_tier();
  REQUIRE(tier->arena_size() == kArena);
  REQUIRE(tier->base() != nullptr);
  REQUIRE(tier->arena_fd() >= 0);
  TierStats s = tier->stats();
  REQUIRE(s.name == "dram");
  REQUIRE(s.enabled);
  REQUIRE(s.capacity_bytes == kArena);
  REQUIRE(s.used_bytes == 0);

  auto a = tier->allocate(1000);
  auto b = tier->allocate(kMiB);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(*a != *b);
  REQUIRE(tier->stats().used_bytes == 4096 + kMiB);  // rounded to the 4 KiB unit (direct I/O alignment)
  // The whole arena is writable.
  std::memset(tier->base() + *b, 0xAB, kMiB);

  tier->release(*a, 1000);
  REQUIRE(tier->stats().used_bytes == kMiB);
  tier->release(*b, kMiB);
  REQUIRE(tier->stats().used_bytes == 0);

  // Nothing to evict: a request larger than the free space fails and names the config key.
  auto all = tier->allocate(kArena);
  REQUIRE(all.ok());
  auto more = tier->allocate(64);
  REQUIRE_FALSE(more.ok());
  REQUIRE(more.status().code() == StatusCode::kNoSpace);
  REQUIRE(more.status().message().find("tiers.dram.capacity") != std::string::npos);
  tier->release(*all, kArena);
  REQUIRE(tier->stats().chunks == 0);
}

TEST_CASE("DramTier claim: a miss is loaded once, then resident and pinned; a second claim hits", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(1);

  auto c1 = tier->claim(h);
  REQUIRE(c1.kind == DramTier::ClaimKind::kLoad);
  REQUIRE(tier->stats().misses == 1);
  REQUIRE(tier->stats().hits == 0);
  REQUIRE_FALSE(tier->offset_of(h).has_value());  // not resident while loading

  auto off = tier->allocate(kChunk);
  REQUIRE(off.ok());
  std::memset(tier->base() + *off, 7, kChunk);
  tier->finish_load(h, *off, kChunk);
  REQUIRE(tier->offset_of(h) == *off);
  TierStats s = tier->stats();
  REQUIRE(s.chunks == 1);
  REQUIRE(s.bytes_in == kChunk);
  REQUIRE(s.dirty_bytes == 0);

  auto c2 = tier->claim(h);
  REQUIRE(c2.kind == DramTier::ClaimKind::kResident);
  REQUIRE(c2.offset == *off);
  REQUIRE(tier->stats().hits == 1);
  REQUIRE(tier->stats().misses == 1);

  // Pinned twice (loader + second claim): the arena cannot be emptied for a full-size request.
  REQUIRE(tier->allocate(kArena).status().code() == StatusCode::kNoSpace);
  tier->unpin(h);
  REQUIRE(tier->allocate(kArena).status().code() == StatusCode::kNoSpace);
  tier->unpin(h);
  // Unpinned and clean: it is evicted to make room.
  auto all = tier->allocate(kArena);
  REQUIRE(all.ok());
  REQUIRE_FALSE(tier->offset_of(h).has_value());
  REQUIRE(tier->stats().bytes_out == kChunk);
  REQUIRE(tier->stats().chunks == 0);
  tier->release(*all, kArena);
}

TEST_CASE("DramTier: a concurrent claimer waits for the loader and gets the loaded chunk", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(2);
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoad);
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoading);
  REQUIRE(tier->stats().misses == 1);  // the waiter is not a second miss

  std::atomic<bool> done{false};
  std::optional<uint64_t> got;
  std::thread waiter([&] {
    got = tier->wait_pin(h);
    done = true;
  });
  CHECK(still_blocked(done));  // CHECK: the thread must be joined either way

  auto off = tier->allocate(kChunk);
  REQUIRE(off.ok());
  tier->finish_load(h, *off, kChunk);
  waiter.join();
  REQUIRE(done);
  REQUIRE(got == *off);
  REQUIRE(tier->stats().hits == 1);

  // Pinned by the loader and by the waiter.
  tier->unpin(h);
  REQUIRE(tier->allocate(kArena).status().code() == StatusCode::kNoSpace);
  tier->unpin(h);
  auto all = tier->allocate(kArena);
  REQUIRE(all.ok());
  tier->release(*all, kArena);
}

TEST_CASE("DramTier: wait_pin returns nullopt when the load is aborted, and the chunk can be claimed again", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(3);
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoad);
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoading);

  std::atomic<bool> done{false};
  std::optional<uint64_t> got = 12345;
  std::thread waiter([&] {
    got = tier->wait_pin(h);
    done = true;
  });
  CHECK(still_blocked(done));  // CHECK: the thread must be joined either way
  tier->abort_load(h);
  waiter.join();
  REQUIRE_FALSE(got.has_value());
  REQUIRE(tier->stats().chunks == 0);

  // The waiter now tries itself.
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoad);
  REQUIRE(tier->stats().misses == 2);
  tier->abort_load(h);
  REQUIRE(tier->stats().used_bytes == 0);
}

TEST_CASE("DramTier adopt deduplicates: a second copy is released and the first one pinned again", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(4);
  auto a = tier->allocate(kChunk);
  REQUIRE(a.ok());
  REQUIRE(tier->adopt(h, *a, kChunk, /*dirty=*/false) == *a);
  REQUIRE(tier->stats().used_bytes == kChunk);
  REQUIRE(tier->stats().bytes_in == kChunk);

  auto b = tier->allocate(kChunk);
  REQUIRE(b.ok());
  REQUIRE(*b != *a);
  REQUIRE(tier->stats().used_bytes == 2 * kChunk);
  REQUIRE(tier->adopt(h, *b, kChunk, /*dirty=*/false) == *a);
  TierStats s = tier->stats();
  REQUIRE(s.used_bytes == kChunk);  // the duplicate range went back
  REQUIRE(s.chunks == 1);
  REQUIRE(s.bytes_in == kChunk);  // a duplicate brings no bytes in
  REQUIRE(s.dirty_bytes == 0);

  // The released range is usable again.
  auto c = tier->allocate(kChunk);
  REQUIRE(c.ok());
  tier->release(*c, kChunk);

  tier->unpin(h);
  tier->unpin(h);
  REQUIRE(tier->stats().used_bytes == kChunk);  // still resident (cached), just evictable
}

TEST_CASE("DramTier evicts clean unpinned chunks in LRU order", "[dram]") {
  auto tier = make_tier();
  std::vector<ChunkHash> h{hash_n(10), hash_n(11), hash_n(12), hash_n(13)};
  std::vector<uint64_t> off;
  for (size_t i = 0; i < h.size(); ++i) {
    off.push_back(put_chunk(*tier, h[i], /*dirty=*/false, static_cast<uint8_t>(i)));
    tier->unpin(h[i]);
  }
  REQUIRE(tier->stats().used_bytes == kArena);
  REQUIRE(tier->stats().chunks == 4);

  // Reading chunk 0 makes it the most recent: LRU order is now 1, 2, 3, 0.
  auto c = tier->claim(h[0]);
  REQUIRE(c.kind == DramTier::ClaimKind::kResident);
  REQUIRE(c.offset == off[0]);
  tier->unpin(h[0]);

  auto x = tier->allocate(kChunk);
  REQUIRE(x.ok());
  REQUIRE(*x == off[1]);
  REQUIRE_FALSE(tier->offset_of(h[1]).has_value());
  REQUIRE(tier->offset_of(h[0]).has_value());
  REQUIRE(tier->offset_of(h[2]).has_value());
  REQUIRE(tier->stats().bytes_out == kChunk);

  auto y = tier->allocate(kChunk);
  REQUIRE(y.ok());
  REQUIRE(*y == off[2]);
  REQUIRE_FALSE(tier->offset_of(h[2]).has_value());
  REQUIRE(tier->offset_of(h[3]).has_value());

  auto z = tier->allocate(kChunk);
  REQUIRE(z.ok());
  REQUIRE(*z == off[3]);
  REQUIRE(tier->offset_of(h[0]) == off[0]);  // the recently read one goes last

  TierStats s = tier->stats();
  REQUIRE(s.chunks == 1);
  REQUIRE(s.bytes_in == 4 * kChunk);
  REQUIRE(s.bytes_out == 3 * kChunk);
  tier->release(*x, kChunk);
  tier->release(*y, kChunk);
  tier->release(*z, kChunk);
}

TEST_CASE("DramTier: each announced read is fulfilled by one read, a later reader's stays", "[dram][hints]") {
  // Two candidates will load chunk 0 (two will_load hints); the first one's read must not make the
  // chunk a victim the second still needs. Chunks 1-3 belong to the live population: they outrank an
  // ordinary chunk, and an expected read outranks them (docs/policy.md, standings).
  auto t = DramTier::create(kArena, std::make_unique<HintAwarePolicy>(), "cairn-test-dram-hints");
  REQUIRE(t.ok());
  DramTier& tier = **t;
  std::vector<ChunkHash> h{hash_n(20), hash_n(21), hash_n(22), hash_n(23)};
  for (const ChunkHash& c : h) {
    put_chunk(tier, c, /*dirty=*/false);
    tier.unpin(c);
  }
  for (size_t i = 1; i < h.size(); ++i) tier.hint_population(h[i], true);
  tier.hint_expected_use(h[0], 5);   // candidate 1
  tier.hint_expected_use(h[0], 50);  // candidate 2
  auto read = [&] {                  // a client's read of chunk 0: the claim, then the lease's notice
    auto c = tier.claim(h[0]);
    REQUIRE(c.kind == DramTier::ClaimKind::kResident);
    tier.unpin(h[0]);
    tier.hint_read(h[0]);
  };
  read();  // candidate 1 reads it; candidate 2's read is still announced
  auto x = tier.allocate(kChunk);
  REQUIRE(x.ok());
  CHECK(tier.offset_of(h[0]).has_value());  // a population chunk went, not the expected one
  read();  // candidate 2 reads it: no read is announced any more, so it is ordinary now
  auto y = tier.allocate(kChunk);
  REQUIRE(y.ok());
  CHECK_FALSE(tier.offset_of(h[0]).has_value());
  int population_left = 0;
  for (size_t i = 1; i < h.size(); ++i) population_left += tier.offset_of(h[i]).has_value();
  CHECK(population_left == 2);
  tier.release(*x, kChunk);
  tier.release(*y, kChunk);
}

TEST_CASE("DramTier never evicts pinned or dirty chunks", "[dram]") {
  auto tier = make_tier();
  const ChunkHash pinned = hash_n(20), dirty1 = hash_n(21), dirty2 = hash_n(22), pinned_dirty = hash_n(23);
  put_chunk(*tier, pinned, false);  // stays pinned
  put_chunk(*tier, dirty1, true);
  tier->unpin(dirty1);
  put_chunk(*tier, dirty2, true);
  tier->unpin(dirty2);
  put_chunk(*tier, pinned_dirty, true);  // stays pinned
  TierStats s = tier->stats();
  REQUIRE(s.used_bytes == kArena);
  REQUIRE(s.dirty_bytes == 3 * kChunk);

  auto r = tier->allocate(kChunk);
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == StatusCode::kNoSpace);
  REQUIRE(r.status().message().find("tiers.dram.capacity") != std::string::npos);
  REQUIRE(tier->stats().chunks == 4);
  REQUIRE(tier->stats().bytes_out == 0);

  // Flushed: the chunk becomes evictable.
  tier->mark_clean(dirty1);
  REQUIRE(tier->stats().dirty_bytes == 2 * kChunk);
  auto r2 = tier->allocate(kChunk);
  REQUIRE(r2.ok());
  REQUIRE_FALSE(tier->offset_of(dirty1).has_value());
  REQUIRE(tier->offset_of(dirty2).has_value());
  REQUIRE(tier->allocate(kChunk).status().code() == StatusCode::kNoSpace);

  // A clean chunk that is still pinned stays; once unpinned it can go.
  tier->unpin(pinned);
  auto r3 = tier->allocate(kChunk);
  REQUIRE(r3.ok());
  REQUIRE_FALSE(tier->offset_of(pinned).has_value());

  // Unpinned but dirty: still never evicted.
  tier->unpin(pinned_dirty);
  REQUIRE(tier->allocate(kChunk).status().code() == StatusCode::kNoSpace);
  tier->mark_clean(pinned_dirty);
  tier->mark_clean(dirty2);
  REQUIRE(tier->stats().dirty_bytes == 0);
  auto r4 = tier->allocate(2 * kChunk);
  REQUIRE(r4.ok());
  REQUIRE(tier->stats().chunks == 0);
  REQUIRE(tier->stats().bytes_out == 4 * kChunk);
  tier->release(*r2, kChunk);
  tier->release(*r3, kChunk);
  tier->release(*r4, 2 * kChunk);
  REQUIRE(tier->stats().used_bytes == 0);
}

TEST_CASE("DramTier adopt(dirty) of a resident clean chunk makes it dirty and unevictable", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(30);
  const uint64_t first = put_chunk(*tier, h, /*dirty=*/false);
  tier->unpin(h);
  REQUIRE(tier->stats().dirty_bytes == 0);

  // The same bytes written again, now as part of a model not yet in the repository.
  auto again = tier->allocate(kChunk);
  REQUIRE(again.ok());
  REQUIRE(tier->adopt(h, *again, kChunk, /*dirty=*/true) == first);
  REQUIRE(tier->stats().dirty_bytes == kChunk);
  REQUIRE(tier->stats().used_bytes == kChunk);
  tier->unpin(h);

  // A clean copy adopted over a dirty one leaves it dirty.
  auto third = tier->allocate(kChunk);
  REQUIRE(third.ok());
  REQUIRE(tier->adopt(h, *third, kChunk, /*dirty=*/false) == first);
  REQUIRE(tier->stats().dirty_bytes == kChunk);
  tier->unpin(h);

  REQUIRE(tier->allocate(kArena).status().code() == StatusCode::kNoSpace);
  tier->mark_clean(h);
  tier->mark_clean(h);  // idempotent
  REQUIRE(tier->stats().dirty_bytes == 0);
  auto all = tier->allocate(kArena);
  REQUIRE(all.ok());
  tier->release(*all, kArena);
}

// Regression: adopt() of a chunk that another caller was loading used to insert its copy, and the
// loader's finish_load() then overwrote the entry — leaking the adopted range and losing its pin, so
// that the loader's later unpin() aborted the daemon ("unpin of chunk ... that is not pinned").
TEST_CASE("DramTier adopt of a chunk being loaded waits for the load and shares the loaded copy", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(40);
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoad);
  auto loaded = tier->allocate(kChunk);
  auto written = tier->allocate(kChunk);
  REQUIRE(loaded.ok());
  REQUIRE(written.ok());

  std::atomic<bool> done{false};
  uint64_t adopted_at = 0;
  std::thread writer([&] {
    adopted_at = tier->adopt(h, *written, kChunk, /*dirty=*/false);
    done = true;
  });
  CHECK(still_blocked(done));  // CHECK: the thread must be joined either way
  tier->finish_load(h, *loaded, kChunk);
  writer.join();

  REQUIRE(adopted_at == *loaded);
  TierStats s = tier->stats();
  REQUIRE(s.chunks == 1);
  REQUIRE(s.used_bytes == kChunk);  // the writer's copy was given back
  REQUIRE(s.bytes_in == kChunk);
  tier->unpin(h);  // the writer's pin
  tier->unpin(h);  // the loader's pin
  auto all = tier->allocate(kArena);
  REQUIRE(all.ok());
  tier->release(*all, kArena);
}

TEST_CASE("DramTier adopt of a chunk whose load is aborted keeps the adopted copy", "[dram]") {
  auto tier = make_tier();
  const ChunkHash h = hash_n(41);
  REQUIRE(tier->claim(h).kind == DramTier::ClaimKind::kLoad);
  auto written = tier->allocate(kChunk);
  REQUIRE(written.ok());

  std::atomic<bool> done{false};
  uint64_t adopted_at = 0;
  std::thread writer([&] {
    adopted_at = tier->adopt(h, *written, kChunk, /*dirty=*/true);
    done = true;
  });
  CHECK(still_blocked(done));  // CHECK: the thread must be joined either way
  tier->abort_load(h);
  writer.join();
  REQUIRE(adopted_at == *written);
  REQUIRE(tier->stats().dirty_bytes == kChunk);
  // A reader that claims now finds it resident.
  auto c = tier->claim(h);
  REQUIRE(c.kind == DramTier::ClaimKind::kResident);
  REQUIRE(c.offset == *written);
  tier->unpin(h);
  tier->unpin(h);
  tier->mark_clean(h);
}

TEST_CASE("DramTier stats count bytes in and out, dirty bytes and chunks", "[dram]") {
  auto tier = make_tier();
  const ChunkHash a = hash_n(50), b = hash_n(51);
  put_chunk(*tier, a, /*dirty=*/true);
  put_chunk(*tier, b, /*dirty=*/false);
  TierStats s = tier->stats();
  REQUIRE(s.chunks == 2);
  REQUIRE(s.bytes_in == 2 * kChunk);
  REQUIRE(s.bytes_out == 0);
  REQUIRE(s.dirty_bytes == kChunk);
  REQUIRE(s.used_bytes == 2 * kChunk);
  REQUIRE(s.hits == 0);
  REQUIRE(s.misses == 0);

  tier->unpin(a);
  tier->unpin(b);
  // Three chunks' worth: b (clean) must go; a (dirty) must stay.
  auto big = tier->allocate(3 * kChunk);
  REQUIRE(big.ok());
  s = tier->stats();
  REQUIRE(s.chunks == 1);
  REQUIRE(s.bytes_out == kChunk);
  REQUIRE(s.dirty_bytes == kChunk);
  REQUIRE(s.used_bytes == 4 * kChunk);
  REQUIRE(tier->offset_of(a).has_value());
  REQUIRE_FALSE(tier->offset_of(b).has_value());

  const nlohmann::json j = s.to_json();
  REQUIRE(j["chunks"] == 1);
  REQUIRE(j["dirty_bytes"] == kChunk);
  REQUIRE(j["capacity_bytes"] == kArena);
  tier->release(*big, 3 * kChunk);
  tier->mark_clean(a);
}

TEST_CASE("DramTier prefaults the arena in the background", "[dram]") {
  auto tier = make_tier();
  for (int i = 0; i < 500 && !tier->prefault_finished(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(tier->prefault_finished());
  REQUIRE(tier->prefaulted_bytes() <= tier->arena_size());
}

TEST_CASE("DramTier: hint_cyclic reaches the policy and survives a chunk leaving and coming back", "[dram][hints]") {
  // Four chunks fill the arena. Cyclic chunks outrank ordinary ones and go newest taken in first
  // (docs/policy.md, "Scan resistance"): the tier must pass the hint on, keep it for a chunk that
  // is not resident, and give it again to a chunk that comes back (track() starts it afresh).
  auto owned = std::make_unique<HintAwarePolicy>();
  HintAwarePolicy& policy = *owned;  // owned by the tier; read here between calls, single-threaded
  auto t = DramTier::create(kArena, std::move(owned), "cairn-test-dram-cyclic");
  REQUIRE(t.ok());
  DramTier& tier = **t;
  std::vector<ChunkHash> h{hash_n(30), hash_n(31), hash_n(32), hash_n(33)};
  for (const ChunkHash& c : h) {  // taken in in this order
    put_chunk(tier, c, /*dirty=*/false);
    tier.unpin(c);
  }
  for (const ChunkHash& c : h) tier.hint_cyclic(c, true);
  for (const ChunkHash& c : h) CHECK(policy.cyclic(c) == std::optional<bool>(true));

  // Room for one more chunk: the newest taken in goes, the first three stay.
  auto x = tier.allocate(kChunk);
  REQUIRE(x.ok());
  CHECK_FALSE(tier.offset_of(h[3]).has_value());
  for (size_t i = 0; i < 3; ++i) CHECK(tier.offset_of(h[i]).has_value());
  CHECK_FALSE(policy.cyclic(h[3]).has_value());  // the policy forgot it with the chunk

  // It comes back (a read loads it): cyclic again, from the tier's hint terms.
  auto c = tier.claim(h[3]);
  REQUIRE(c.kind == DramTier::ClaimKind::kLoad);
  tier.finish_load(h[3], *x, kChunk);
  tier.unpin(h[3]);
  CHECK(policy.cyclic(h[3]) == std::optional<bool>(true));
  // A read that hits keeps it.
  REQUIRE(tier.claim(h[0]).kind == DramTier::ClaimKind::kResident);
  tier.unpin(h[0]);
  CHECK(policy.cyclic(h[0]) == std::optional<bool>(true));

  // Withdrawn from the oldest: it is ordinary now and goes before every cyclic chunk.
  tier.hint_cyclic(h[0], false);
  CHECK(policy.cyclic(h[0]) == std::optional<bool>(false));
  auto y = tier.allocate(kChunk);
  REQUIRE(y.ok());
  CHECK_FALSE(tier.offset_of(h[0]).has_value());
  for (size_t i = 1; i < 4; ++i) CHECK(tier.offset_of(h[i]).has_value());

  // Hinted while not resident: it enters cyclic, and is then the newest cyclic chunk, the first to go.
  tier.hint_cyclic(h[0], true);
  REQUIRE(tier.claim(h[0]).kind == DramTier::ClaimKind::kLoad);
  tier.finish_load(h[0], *y, kChunk);
  tier.unpin(h[0]);
  CHECK(policy.cyclic(h[0]) == std::optional<bool>(true));
  auto z = tier.allocate(kChunk);
  REQUIRE(z.ok());
  CHECK_FALSE(tier.offset_of(h[0]).has_value());
  for (size_t i = 1; i < 4; ++i) CHECK(tier.offset_of(h[i]).has_value());
  tier.release(*z, kChunk);
}

}  // namespace cairn
