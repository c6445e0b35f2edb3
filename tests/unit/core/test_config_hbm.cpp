// tiers.hbm.backend (docs/gpu.md): its default, its values, the environment override and the
// to_yaml() round trip.
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "core/config.hpp"

namespace cairn {

TEST_CASE("config: tiers.hbm.backend is cuda by default, emulated on request, nothing else", "[config][hbm]") {
  const std::map<std::string, std::string> none;
  auto d = load_config_text("", "test.yaml", none);
  REQUIRE(d.ok());
  CHECK(d->tiers.hbm.backend == "cuda");
  CHECK(d->tiers.hbm.capacity == 0);  // the default config: no HBM tier

  auto e = load_config_text("tiers: {hbm: {capacity: 1GiB, backend: emulated, devices: [0, 1]}}\n", "test.yaml", none);
  REQUIRE(e.ok());
  CHECK(e->tiers.hbm.backend == "emulated");
  CHECK(e->tiers.hbm.capacity == (1ull << 30));

  auto bad = load_config_text("tiers: {hbm: {backend: opencl}}\n", "test.yaml", none);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("tiers.hbm.backend") != std::string::npos);
  CHECK(bad.status().message().find("emulated") != std::string::npos);

  auto env = load_config_text("", "test.yaml", {{"CAIRN_TIERS_HBM_BACKEND", "emulated"}});
  REQUIRE(env.ok());
  CHECK(env->tiers.hbm.backend == "emulated");

  auto again = load_config_text(e->to_yaml(), "round-trip.yaml", none);
  REQUIRE(again.ok());
  CHECK(again->tiers.hbm.backend == "emulated");
  CHECK(again->tiers.hbm.devices == e->tiers.hbm.devices);
}

}  // namespace cairn
