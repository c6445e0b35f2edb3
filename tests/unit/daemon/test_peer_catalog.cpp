// The job's catalog as one member sees it (daemon/peers/peer_catalog.hpp): what another member's
// announcement and departure do to the lineage catalog, the remote models and the commit clock.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "core/status.hpp"
#include "daemon/catalog.hpp"
#include "daemon/commit_clock.hpp"
#include "daemon/flusher.hpp"
#include "daemon/peers/peer_catalog.hpp"
#include "daemon/references.hpp"
#include "daemon/tickets.hpp"
#include "policy/eviction.hpp"
#include "tiers/dram/dram_tier.hpp"
#include "tiers/pfs/repository.hpp"
#include "tiers/tier_manager.hpp"
#include "unit/temp_dir.hpp"

namespace cairn {
namespace {

// What a PeerCatalog is made from, on a fresh repository, and the catalog itself.
struct PeerCatalogFixture {
  testing::TempDir dir{"cairn-test-peer-catalog"};
  std::unique_ptr<Repository> repo = Repository::open(dir.path + "/repo", 64 * 1024, nullptr, {}).value();
  std::unique_ptr<DramTier> dram = DramTier::create(16ull << 20, make_eviction_policy("lru").value(),
                                                    "cairn-test-peer-catalog-" + std::to_string(::getpid()))
                                       .value();
  TierManager tiers{*dram, nullptr, *repo, make_admission_policy("all").value()};
  TicketBook tickets;
  Catalog catalog;
  ReferenceCounts references{*dram};
  Flusher flusher{*repo, tiers, nullptr, tickets, [](const ModelManifest&) {}};
  CommitClock clock;
  PeerCatalog peers{PeerCatalog::Parts{catalog, references, flusher, *repo, clock}};
};

ModelManifest announced(const std::string& id, int64_t created_ns, const std::string& parent = "") {
  ModelManifest m;
  m.id = id;
  m.parent = parent;
  m.created_ns = created_ns;
  return m;
}

}  // namespace

TEST_CASE("peer catalog: an announced model joins the catalog and moves the commit clock", "[peers][catalog]") {
  PeerCatalogFixture f;
  const int64_t later = f.clock.next() + 1'000'000'000'000;  // a member whose clock runs ahead
  f.peers.add(announced("a", later), "m1");
  f.peers.add(announced("b", later + 1, "a"), "m1");
  CHECK(f.catalog.contains("a"));
  CHECK(f.catalog.contains("b"));
  CHECK(f.peers.remote().member_of("b") == "m1");
  CHECK(f.clock.next() == later + 2);  // stamps here follow the newest model seen
  // Announced again (a second message, or another member racing for the id): the first stays.
  f.peers.add(announced("a", later + 5), "m2");
  CHECK(f.peers.remote().member_of("a") == "m1");
  CHECK(f.peers.remote().find("a")->created_ns == later);
}

TEST_CASE("peer catalog: a member that leaves takes its unflushed models with it", "[peers][catalog]") {
  PeerCatalogFixture f;
  f.peers.add(announced("x", 100), "m1");
  f.peers.add(announced("y", 101), "m2");
  // Only the member that announced a model can take it away.
  f.peers.drop("x", "m2", "which left");
  CHECK(f.catalog.contains("x"));
  f.peers.drop_member("m1");
  CHECK_FALSE(f.catalog.contains("x"));
  CHECK(f.peers.remote().find("x") == nullptr);
  CHECK(f.catalog.contains("y"));
  CHECK(f.peers.remote().size() == 1);
}

TEST_CASE("peer catalog: an announcement of a model removed from the repository since is refused", "[peers][catalog]") {
  PeerCatalogFixture f;
  f.peers.remote().removed("z", 200);      // the repository watch saw it removed at 200
  f.peers.add(announced("z", 150), "m1");  // committed before: a message that came late
  CHECK_FALSE(f.catalog.contains("z"));
  CHECK(f.peers.remote().size() == 0);
  f.peers.add(announced("z", 250), "m1");  // the id committed again since: a new model
  CHECK(f.catalog.contains("z"));
}

}  // namespace cairn
