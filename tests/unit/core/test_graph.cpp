#include <catch2/catch.hpp>
#include <random>

#include "core/graph.hpp"

using namespace cairn;
using nlohmann::json;

namespace {
json conv(const std::string& name, int out, const std::vector<std::string>& inputs, int k = 3) {
  return {
      {"name", name}, {"type", "Conv2d"}, {"config", {{"out_channels", out}, {"kernel_size", k}}}, {"inputs", inputs}};
}
std::string error_of(const json& j) {
  auto g = parse_graph(j);
  REQUIRE_FALSE(g.ok());
  CHECK(g.status().code() == StatusCode::kInvalidArgument);
  return g.status().message();
}
}  // namespace

TEST_CASE("graphs parse, sort topologically and map tensors to layers", "[graph]") {
  json j{{"layers", {conv("b", 64, {"a"}), conv("a", 32, {}), {{"name", "fc"}, {"type", "Linear"}, {"inputs", {"b"}}}}},
         {"tensors", {{"head.w", "fc"}}}};
  auto g = parse_graph(j);
  REQUIRE(g.ok());
  REQUIRE(g->layers.size() == 3);
  CHECK(g->layers[0].name == "a");
  CHECK(g->layers[2].name == "fc");
  CHECK(g->layer_of("head.w") == "fc");
  CHECK(g->layer_of("b.weight") == "b");
  CHECK_FALSE(g->layer_of("zzz.weight").has_value());
  auto again = parse_graph(g->to_json());
  REQUIRE(again.ok());
  CHECK(layer_signatures(*again) == layer_signatures(*g));
}

TEST_CASE("bad graphs get errors naming the culprit", "[graph]") {
  CHECK(error_of(json::array()).find("object") != std::string::npos);
  CHECK(error_of(json{{"layers", {conv("a", 1, {"ghost"})}}}).find("'ghost'") != std::string::npos);
  CHECK(error_of(json{{"layers", {conv("a", 1, {}), conv("a", 2, {})}}}).find("'a' is used twice") !=
        std::string::npos);
  std::string cyc = error_of(
      json{{"layers", {conv("x", 1, {}), conv("a", 1, {"c", "x"}), conv("b", 1, {"a"}), conv("c", 1, {"b"})}}});
  CHECK(cyc.find("cycle") != std::string::npos);
  CHECK(cyc.find("'a'") != std::string::npos);
  CHECK(cyc.find("'b'") != std::string::npos);
  CHECK(cyc.find("'c'") != std::string::npos);
  CHECK(cyc.find("'x'") == std::string::npos);
  CHECK(error_of(json{{"layers", {conv("a", 1, {})}}, {"tensors", {{"w", "nope"}}}}).find("'nope'") !=
        std::string::npos);
  CHECK(error_of(json{{"layers", {{{"name", "a"}}}}}).find("'type'") != std::string::npos);
  CHECK(error_of(json{{"layers", {{{"name", "a"}, {"type", "X"}, {"config", 3}}}}}).find("'config'") !=
        std::string::npos);
  CHECK(error_of(json{{"layers", json::array()}, {"extra", 1}}).find("'extra'") != std::string::npos);
}

TEST_CASE("signatures ignore layer names, key order and number spelling, but not structure", "[graph]") {
  auto g1 = parse_graph(json::parse(R"({"layers":[
      {"name":"stem","type":"Conv2d","config":{"out":64,"k":3,"lr":0.5},"inputs":[]},
      {"name":"body","type":"ReLU","inputs":["stem"]},
      {"name":"head","type":"Linear","config":{"out":10},"inputs":["body"]}]})"));
  auto g2 = parse_graph(json::parse(R"({"layers":[
      {"name":"c0","type":"Conv2d","config":{"lr":5e-1,"k":3.0,"out":64},"inputs":[]},
      {"name":"r0","type":"ReLU","inputs":["c0"]},
      {"name":"fc","type":"Linear","config":{"out":100},"inputs":["r0"]}]})"));
  REQUIRE(g1.ok());
  REQUIRE(g2.ok());
  auto s1 = layer_signatures(*g1), s2 = layer_signatures(*g2);
  CHECK(s1["stem"] == s2["c0"]);
  CHECK(s1["body"] == s2["r0"]);
  CHECK_FALSE(s1["head"] == s2["fc"]);
  // The same layer downstream of a different upstream gets a different signature.
  auto g3 = parse_graph(json::parse(R"({"layers":[
      {"name":"c0","type":"Conv2d","config":{"out":32,"k":3,"lr":0.5}},
      {"name":"r0","type":"ReLU","inputs":["c0"]}]})"));
  CHECK_FALSE(layer_signatures(*g3)["r0"] == s1["body"]);
  // Input order matters (concatenation is not commutative).
  auto g4 = parse_graph(json{
      {"layers", {conv("a", 1, {}), conv("b", 2, {}), {{"name", "cat"}, {"type", "Cat"}, {"inputs", {"a", "b"}}}}}});
  auto g5 = parse_graph(json{
      {"layers", {conv("a", 1, {}), conv("b", 2, {}), {{"name", "cat"}, {"type", "Cat"}, {"inputs", {"b", "a"}}}}}});
  CHECK_FALSE(layer_signatures(*g4)["cat"] == layer_signatures(*g5)["cat"]);
  CHECK(canonical_json(json::parse(R"({"b":[1.0,2.5],"a":{"y":1e2,"x":-0.0}})")) ==
        R"({"a":{"x":0,"y":100},"b":[1,2.5]})");
}

TEST_CASE("a model without a graph gets one layer per tensor-name prefix", "[graph]") {
  std::vector<TensorShape> ts{{"conv1.weight", DType::kF32, {64, 3, 7, 7}},
                              {"bn1.weight", DType::kF32, {64}},
                              {"bn1.bias", DType::kF32, {64}},
                              {"fc.weight", DType::kF32, {10, 64}}};
  Graph g = graph_from_tensors(ts);
  REQUIRE(g.layers.size() == 3);
  CHECK(g.layers[1].name == "bn1");
  CHECK(g.layers[1].inputs == std::vector<std::string>{"conv1"});
  CHECK(g.layer_of("bn1.bias") == "bn1");
  auto other = ts;
  other[3].shape = {100, 64};
  auto s1 = layer_signatures(g), s2 = layer_signatures(graph_from_tensors(other));
  CHECK(s1["bn1"] == s2["bn1"]);
  CHECK_FALSE(s1["fc"] == s2["fc"]);
  REQUIRE(parse_graph(g.to_json()).ok());
}

TEST_CASE("deep chains and random garbage neither overflow nor crash", "[graph]") {
  json layers = json::array();
  for (int i = 0; i < 200000; ++i)
    layers.push_back({{"name", "l" + std::to_string(i)},
                      {"type", "Linear"},
                      {"inputs", i ? json{"l" + std::to_string(i - 1)} : json::array()}});
  auto g = parse_graph(json{{"layers", layers}});
  REQUIRE(g.ok());
  CHECK(layer_signatures(*g).size() == 200000);

  std::mt19937_64 rng(5);
  std::string base =
      R"({"layers":[{"name":"a","type":"Conv2d","config":{"k":3}},{"name":"b","type":"ReLU","inputs":["a"]}],"tensors":{"w":"a"}})";
  for (int i = 0; i < 5000; ++i) {
    std::string s = base;
    for (int k = 0; k < 3; ++k) s[rng() % s.size()] = static_cast<char>(rng() % 128);
    json j = json::parse(s, nullptr, false);
    if (j.is_discarded()) continue;
    auto r = parse_graph(j);
    if (r.ok())
      CHECK(layer_signatures(*r).size() == r->layers.size());
    else
      CHECK_FALSE(r.status().message().empty());
  }
}
