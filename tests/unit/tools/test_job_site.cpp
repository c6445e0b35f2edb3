// The site config's `node` key (tools/job_site.hpp): off by default, strict like every other key.
#include <catch2/catch.hpp>

#include "tools/job_site.hpp"

namespace cairn::tool {
namespace {

std::string error_of(const std::string& text) {
  auto r = parse_site_config(text, "site.yaml");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("site config site.yaml") != std::string::npos);
  return r.status().message();
}

TEST_CASE("site config: node.shmem_thp is off unless set, and takes the kernel's four choices", "[job_site]") {
  auto none = parse_site_config("enable: always\n", "site.yaml");
  REQUIRE(none.ok());
  CHECK(none->node_shmem_thp.empty());
  auto empty_node = parse_site_config("node:\n", "site.yaml");
  REQUIRE(empty_node.ok());
  CHECK(empty_node->node_shmem_thp.empty());
  for (const char* v : {"always", "within_size", "advise", "never"}) {
    auto c = parse_site_config(std::string("node: {shmem_thp: ") + v + "}\n", "site.yaml");
    REQUIRE(c.ok());
    CHECK(c->node_shmem_thp == v);
  }
  auto block = parse_site_config("job_dir: /run/x\nnode:\n  shmem_thp: advise\n", "site.yaml");
  REQUIRE(block.ok());
  CHECK(block->node_shmem_thp == "advise");
  CHECK(block->job_dir == "/run/x");
}

TEST_CASE("site config: a bad node section is rejected naming the key", "[job_site]") {
  CHECK(error_of("node: {shmem_thp: sometimes}\n").find("node.shmem_thp: 'sometimes' is not one of always") !=
        std::string::npos);
  CHECK(error_of("node: {shmem_thp: deny}\n").find("node.shmem_thp") != std::string::npos);
  CHECK(error_of("node: {shmem_thp: [advise]}\n").find("node.shmem_thp: must be a single value") != std::string::npos);
  CHECK(error_of("node: {thp: advise}\n").find("unknown key 'node.thp'") != std::string::npos);
  CHECK(error_of("node: advise\n").find("node: must be a mapping") != std::string::npos);
  CHECK(error_of("nodes: {shmem_thp: advise}\n").find("unknown key 'nodes'") != std::string::npos);
}

}  // namespace
}  // namespace cairn::tool
