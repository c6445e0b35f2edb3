// Fuzzes the catalog's query inputs: a query's "where" filter and "graph". Whatever the bytes, the
// filter parser either accepts (and matching never throws) or names what was wrong; an accepted
// graph gets the same best_ancestor from the index as from the linear scan over a small catalog.
#include <cstdint>
#include <cstdlib>

#include "daemon/catalog.hpp"

namespace {

cairn::Catalog& catalog() {
  static cairn::Catalog* cat = [] {
    auto* c = new cairn::Catalog();
    auto layer = [](const char* name, const char* type, nlohmann::json cfg, std::vector<std::string> in) {
      return nlohmann::json{{"name", name}, {"type", type}, {"config", std::move(cfg)}, {"inputs", std::move(in)}};
    };
    for (int w : {16, 32, 64}) {
      nlohmann::json g{
          {"layers",
           {layer("in", "Input", nlohmann::json::object(), {}), layer("conv", "Conv2d", {{"out_channels", w}}, {"in"}),
            layer("relu", "ReLU", nlohmann::json::object(), {"conv"}),
            layer("skip", "Add", nlohmann::json::object(), {"in", "relu"}),
            layer("fc", "Linear", {{"out_features", 10}}, {"skip"})}}};
      auto parsed = cairn::parse_graph(g);
      if (!parsed.ok()) std::abort();
      (void)c->add("m" + std::to_string(w), "", c->compile(*parsed), {{"score", w / 64.0}, {"tags", {{"w", w}}}});
    }
    return c;
  }();
  return *cat;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  // As a filter.
  auto f = cairn::MetadataFilter::parse(j);
  if (!f.ok()) {
    if (f.status().message().empty()) std::abort();
  } else {
    (void)f->matches(j);
    (void)f->matches(nlohmann::json{{"score", 0.5}, {"tags", {{"w", 16}}}});
  }
  // As a graph.
  auto g = cairn::parse_graph(j);
  if (g.ok()) {
    auto h = catalog().compile(*g, /*intern_types=*/false);
    cairn::MetadataFilter where = f.ok() ? *f : cairn::MetadataFilter{};
    if (!(catalog().best_ancestor(h, where) == catalog().best_ancestor_scan(h, where))) std::abort();
  }
  return 0;
}
