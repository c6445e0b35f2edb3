// The job's catalog of models committed on other members (daemon/peers/remote_models.hpp): what a
// removal from the repository does to it.
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "daemon/peers/remote_models.hpp"

using cairn::ModelManifest;
using cairn::RemoteModels;

namespace {
std::shared_ptr<const ModelManifest> model(const std::string& id, int64_t created_ns) {
  auto m = std::make_shared<ModelManifest>();
  m->id = id;
  m->created_ns = created_ns;
  return m;
}
}  // namespace

TEST_CASE("remote models: a removal seen by the watch drops the entry committed before it", "[peers][remote]") {
  RemoteModels r;
  REQUIRE(r.put(model("x", 100), "m1"));
  REQUIRE(r.put(model("y", 100), "m1"));
  REQUIRE(r.removed("x", 200));
  CHECK(r.find("x") == nullptr);
  CHECK(r.find("y") != nullptr);
  CHECK(r.size() == 1);
  // Seen removed again (another report): nothing left to drop.
  CHECK_FALSE(r.removed("x", 300));
}

TEST_CASE("remote models: an announcement that comes after the removal is stale", "[peers][remote]") {
  RemoteModels r;
  CHECK_FALSE(r.removed("x", 200));  // the watch saw it removed before any announcement came
  CHECK(r.removed_after("x", 100));  // committed before: a late message
  CHECK(r.removed_after("x", 200));
  CHECK_FALSE(r.removed_after("x", 201));  // the id committed again since: a new model
  CHECK_FALSE(r.removed_after("other", 100));
}

TEST_CASE("remote models: an entry committed after the removal stays", "[peers][remote]") {
  RemoteModels r;
  REQUIRE(r.put(model("x", 500), "m2"));
  CHECK_FALSE(r.removed("x", 400));  // an older model of that id was removed
  CHECK(r.find("x") != nullptr);
  CHECK(r.member_of("x") == "m2");
}

TEST_CASE("remote models: removals are remembered up to a bound, oldest forgotten first", "[peers][remote]") {
  RemoteModels r;
  const size_t n = RemoteModels::kMaxRemoved + 10;
  for (size_t i = 0; i < n; ++i) (void)r.removed("m" + std::to_string(i), 1000);
  for (size_t i = 0; i < 10; ++i) CHECK_FALSE(r.removed_after("m" + std::to_string(i), 1));
  CHECK(r.removed_after("m10", 1));
  CHECK(r.removed_after("m" + std::to_string(n - 1), 1));
}
