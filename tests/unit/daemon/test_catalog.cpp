// The catalog: best_ancestor from the index against an independent brute force over thousands of
// random NAS-like graphs, lineage queries on deep chains and wide trees, find, metadata filters.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "bench/workloads/nas_graphs.hpp"
#include "daemon/catalog.hpp"

using namespace cairn;
using nlohmann::json;

namespace {

Graph graph_of(const json& j) {
  auto g = parse_graph(j);
  REQUIRE(g.ok());
  return *g;
}

json layer(const std::string& name, const std::string& type, json config, std::vector<std::string> inputs) {
  return json{{"name", name}, {"type", type}, {"config", std::move(config)}, {"inputs", std::move(inputs)}};
}

// The answer by definition, from core's signatures only (no catalog code): for each live model the
// number of layers of g whose signature the model holds; best by (count, score, newer).
struct Brute {
  struct Entry {
    std::string id;
    std::multiset<Signature> sigs;
    double score;
    json meta;
    bool live = true;
  };
  std::vector<Entry> models;  // in insertion order: later = newer
  void add(const std::string& id, const Graph& g, const json& meta) {
    Entry e{id, {}, -INFINITY, meta};
    for (const auto& [name, s] : layer_signatures(g)) e.sigs.insert(s);
    if (meta.contains("score") && meta["score"].is_number()) e.score = meta["score"].get<double>();
    models.push_back(std::move(e));
  }
  std::pair<std::string, size_t> best(const Graph& g, const MetadataFilter& where) const {
    auto gs = layer_signatures(g);
    std::string best_id;
    size_t best_n = 0;
    double best_score = 0;
    size_t best_pos = 0;
    for (size_t i = 0; i < models.size(); ++i) {
      const Entry& m = models[i];
      if (!m.live || !where.matches(m.meta)) continue;
      size_t n = 0;
      for (const auto& [name, s] : gs) n += m.sigs.count(s) ? 1 : 0;
      if (n == 0) continue;
      bool better = best_id.empty() || n > best_n ||
                    (n == best_n && (m.score > best_score || (m.score == best_score && i > best_pos)));
      if (better) {
        best_id = m.id;
        best_n = n;
        best_score = m.score;
        best_pos = i;
      }
    }
    return {best_id, best_n};
  }
};

}  // namespace

TEST_CASE("catalog: best_ancestor from the index equals a brute-force scan on random NAS runs", "[catalog]") {
  for (uint64_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    bench::NasSpace space;
    const size_t n = seed == 1 ? 2000 : 1000;
    bench::NasRun run = bench::evolution(n, seed, space);
    Catalog cat;
    Brute brute;
    std::mt19937_64 rng(seed * 7919);
    for (size_t i = 0; i < n; ++i) {
      json meta = json::object();
      // Coarse scores make ties common (then the newer model must win); some models have none.
      uint64_t r = rng() % 10;
      if (r < 7) meta["score"] = std::round(run.score[i] * 10) / 10;
      if (r == 7) meta["score"] = "not a number";
      meta["tags"] = {{"family", i % 3 == 0 ? "resnet" : "other"}};
      std::string id = "m" + std::to_string(i);
      std::string parent = run.parent[i] >= 0 ? "m" + std::to_string(run.parent[i]) : "";
      REQUIRE(cat.add(id, parent, cat.compile(run.graphs[i]), meta).ok());
      brute.add(id, run.graphs[i], meta);
    }
    // Retire some: they must never be returned.
    for (size_t i = 0; i < n; i += 17) {
      REQUIRE(cat.retire("m" + std::to_string(i)).ok());
      brute.models[i].live = false;
    }
    auto where_score = MetadataFilter::parse(json{{"score", {{">=", 0.5}}}});
    auto where_tag = MetadataFilter::parse(json{{"tags", {{"family", "resnet"}}}});
    REQUIRE(where_score.ok());
    REQUIRE(where_tag.ok());
    const MetadataFilter none;
    size_t nonempty = 0, partial = 0;
    for (int q = 0; q < 120; ++q) {
      // Unseen candidates: mutations of stored graphs (some twice), and fresh random graphs.
      Graph g = q % 10 == 9 ? bench::random_graph(rng, space) : bench::mutate(run.graphs[rng() % n], rng, space);
      if (q % 4 == 0) g = bench::mutate(g, rng, space);
      GraphHandle h = cat.compile(g);
      for (const MetadataFilter* w : {&none, static_cast<const MetadataFilter*>(&*where_score),
                                      static_cast<const MetadataFilter*>(&*where_tag)}) {
        BestAncestor idx = cat.best_ancestor(h, *w);
        BestAncestor scan = cat.best_ancestor_scan(h, *w);
        auto [bid, bn] = brute.best(g, *w);
        INFO("query " << q);
        REQUIRE(idx == scan);
        REQUIRE(idx.model == bid);
        REQUIRE(idx.matched == bn);
        REQUIRE(idx.layers.size() == idx.matched);
        REQUIRE(idx.source_layers.size() == idx.matched);
        if (!idx.model.empty()) ++nonempty;
        if (!idx.model.empty() && idx.matched < g.layers.size()) ++partial;
      }
    }
    CHECK(nonempty > 250);  // the queries exercise real matches, mostly partial ones
    CHECK(partial > 150);
  }
}

TEST_CASE(
    "catalog: a bulk-loaded catalog (index built at first use) with children sharing one graph ranks as a scan says",
    "[catalog]") {
  // Loaded with the index deferred (a daemon's start), children sharing their parent's compiled
  // graph, some retired before the first query: the index built then, and kept up to date after,
  // returns the best-ranked live model that passes the filter, as a scan does.
  bench::NasSpace space;
  const size_t n = 300;
  bench::NasRun run = bench::evolution(n, 5, space);
  Catalog cat;
  cat.defer_index();  // as a daemon's start loads it: the index is built at the first query
  Brute brute;
  std::mt19937_64 rng(4242);
  for (size_t i = 0; i < n; ++i) {
    json meta = {{"score", std::round(run.score[i] * 10) / 10}, {"tags", {{"family", i % 3 ? "other" : "resnet"}}}};
    std::string id = "m" + std::to_string(i);
    std::string parent = run.parent[i] >= 0 ? "m" + std::to_string(run.parent[i]) : "";
    REQUIRE(cat.add(id, parent, cat.compile(run.graphs[i]), meta).ok());
    brute.add(id, run.graphs[i], meta);
    for (size_t k = 0; k < rng() % 4; ++k) {
      json cm = {{"score", static_cast<double>(rng() % 12) / 10}, {"tags", {{"family", rng() % 2 ? "resnet" : "x"}}}};
      std::string cid = id + "/c" + std::to_string(k);
      REQUIRE(cat.add(cid, id, cat.graph_of(id), cm).ok());
      brute.add(cid, run.graphs[i], cm);
    }
  }
  // Retire some parents and some children (a graph's best member going leaves the next one).
  for (size_t e = 0; e < brute.models.size(); e += 7) {
    REQUIRE(cat.retire(brute.models[e].id).ok());
    brute.models[e].live = false;
  }
  auto where_tag = MetadataFilter::parse(json{{"tags", {{"family", "resnet"}}}});
  REQUIRE(where_tag.ok());
  const MetadataFilter none;
  size_t nonempty = 0;
  for (int q = 0; q < 80; ++q) {
    Graph g = bench::mutate(run.graphs[rng() % n], rng, space);
    GraphHandle h = cat.compile(g);
    for (const MetadataFilter* w : {&none, static_cast<const MetadataFilter*>(&*where_tag)}) {
      BestAncestor idx = cat.best_ancestor(h, *w);
      auto [bid, bn] = brute.best(g, *w);
      INFO("query " << q);
      REQUIRE(idx == cat.best_ancestor_scan(h, *w));
      REQUIRE(idx.model == bid);
      REQUIRE(idx.matched == bn);
      if (!idx.model.empty()) ++nonempty;
    }
  }
  CHECK(nonempty > 100);
  // Kept up to date after it was built: a retirement and a new model.
  REQUIRE(cat.retire(brute.models[1].id).ok());
  brute.models[1].live = false;
  GraphHandle h = cat.compile(run.graphs[3]);
  auto [bid, bn] = brute.best(run.graphs[3], none);
  CHECK(cat.best_ancestor(h, none).model == bid);
  CHECK(cat.best_ancestor(h, none).matched == bn);
}

TEST_CASE("catalog: matches, ties, branches, filters and retirement on hand-built graphs", "[catalog]") {
  // stem -> a1 -> a2 -> join <- b1 <- stem ; head <- join
  auto branchy = [](int a_width, int b_width, int head_out) {
    return graph_of(json{
        {"layers",
         {layer("stem", "Conv2d", {{"out_channels", 16}}, {}),
          layer("a1", "Conv2d", {{"out_channels", a_width}}, {"stem"}), layer("a2", "ReLU", json::object(), {"a1"}),
          layer("b1", "Conv2d", {{"out_channels", b_width}, {"kernel_size", 1}}, {"stem"}),
          layer("join", "Add", json::object(), {"a2", "b1"}),
          layer("head", "Linear", {{"out_features", head_out}}, {"join"})}}});
  };
  Catalog cat;
  REQUIRE(cat.add("X", "", cat.compile(branchy(32, 99, 10)), json{{"score", 0.9}}).ok());  // matches stem, a1, a2
  REQUIRE(cat.add("Y", "", cat.compile(branchy(99, 32, 10)), json{{"score", 0.8}}).ok());  // matches stem, b1
  GraphHandle q = cat.compile(branchy(32, 32, 10));
  BestAncestor best = cat.best_ancestor(q);
  CHECK(best.model == "X");
  CHECK(best.matched == 3);
  CHECK(best.layers == std::vector<std::string>{"stem", "a1", "a2"});
  CHECK(best.score == 0.9);
  CHECK(cat.best_ancestor_scan(q) == best);

  // A model holding both branches but a different head matches five layers and wins.
  Graph z = branchy(32, 32, 5);
  // Renamed layers: signatures ignore names, source_layers report the model's own.
  json zj = z.to_json();
  for (auto& l : zj["layers"]) {
    l["name"] = "z_" + l["name"].get<std::string>();
    for (auto& in : l["inputs"]) in = "z_" + in.get<std::string>();
  }
  REQUIRE(cat.add("Z", "X", cat.compile(graph_of(zj)), json{{"score", 0.1}}).ok());
  best = cat.best_ancestor(q);
  CHECK(best.model == "Z");
  CHECK(best.matched == 5);
  CHECK(best.source_layers == std::vector<std::string>{"z_stem", "z_a1", "z_b1", "z_a2", "z_join"});

  // Ties: an equal match goes to the higher score, then to the newer model.
  REQUIRE(cat.add("Z2", "", cat.compile(branchy(32, 32, 5)), json{{"score", 0.1}}).ok());
  CHECK(cat.best_ancestor(q).model == "Z2");  // same score, newer
  REQUIRE(cat.add("Z3", "", cat.compile(branchy(32, 32, 6)), json{{"score", 0.05}}).ok());
  CHECK(cat.best_ancestor(q).model == "Z2");  // newer but lower score
  REQUIRE(cat.add("Z4", "", cat.compile(branchy(32, 32, 7)), json::object()).ok());
  CHECK(cat.best_ancestor(q).model == "Z2");  // no score ranks below any score

  // Filters.
  auto f = MetadataFilter::parse(json{{"score", {{">", 0.5}}}});
  REQUIRE(f.ok());
  CHECK(cat.best_ancestor(q, *f).model == "X");
  f = MetadataFilter::parse(json{{"score", {{">", 5}}}});
  REQUIRE(f.ok());
  CHECK(cat.best_ancestor(q, *f).model.empty());

  // Retired models take no part; erase needs no children.
  REQUIRE(cat.retire("Z2").ok());
  REQUIRE(cat.retire("Z").ok());
  CHECK(cat.best_ancestor(q).model == "Z3");
  CHECK(cat.erase("X").code() == StatusCode::kBusy);
  REQUIRE(cat.erase("Z").ok());
  REQUIRE(cat.erase("X").ok());
  CHECK(cat.best_ancestor(q).model == "Z3");
  CHECK(cat.best_ancestor_scan(q) == cat.best_ancestor(q));
  CHECK(cat.add("Q", "nope", q).code() == StatusCode::kNotFound);
  CHECK(cat.add("Y", "", q).code() == StatusCode::kExists);

  // Nothing in common.
  GraphHandle other = cat.compile(graph_of(json{{"layers", {layer("x", "GRU", {{"hidden", 3}}, {})}}}));
  CHECK(cat.best_ancestor(other).model.empty());
  CHECK(cat.best_ancestor(other).matched == 0);
}

TEST_CASE("catalog: repeated identical layers map in order", "[catalog]") {
  // Two identical parallel layers have one signature; each counts, and maps to a layer of the model.
  auto g = [](const std::string& p) {
    return graph_of(
        json{{"layers",
              {layer(p + "in", "Input", json::object(), {}), layer(p + "l", "ReLU", json::object(), {p + "in"}),
               layer(p + "r", "ReLU", json::object(), {p + "in"}),
               layer(p + "cat", "Concat", json::object(), {p + "l", p + "r"})}}});
  };
  Catalog cat;
  REQUIRE(cat.add("m", "", cat.compile(g("m_"))).ok());
  BestAncestor b = cat.best_ancestor(cat.compile(g("q_")));
  CHECK(b.matched == 4);
  CHECK(b.source_layers == std::vector<std::string>{"m_in", "m_l", "m_r", "m_cat"});
}

TEST_CASE("catalog: lineage on a 10,000-generation chain and a wide tree", "[catalog]") {
  Catalog cat;
  GraphHandle g = cat.compile(graph_of(json{{"layers", {layer("a", "Linear", json::object(), {})}}}));
  const int kDeep = 10000;
  for (int i = 0; i < kDeep; ++i)
    REQUIRE(cat.add("c" + std::to_string(i), i ? "c" + std::to_string(i - 1) : "", g).ok());
  auto anc = cat.ancestors("c9999");
  REQUIRE(anc.ok());
  REQUIRE(anc->size() == 9999);
  CHECK(anc->front() == "c9998");
  CHECK(anc->back() == "c0");
  auto desc = cat.descendants("c0", -1);
  REQUIRE(desc.ok());
  REQUIRE(desc->size() == 9999);
  CHECK(desc->back() == std::make_pair(std::string("c9999"), 9999));
  CHECK(cat.descendants("c0", 3)->size() == 3);
  CHECK(*cat.lca("c5000", "c9999") == std::optional<std::string>("c5000"));
  auto p = cat.path("c9999", "c9990");
  REQUIRE(p.ok());
  CHECK(p->size() == 10);
  CHECK(p->front() == "c9999");
  CHECK(p->back() == "c9990");

  // A wide tree: root with 2,000 children, each with 2 grandchildren.
  REQUIRE(cat.add("root", "", g).ok());
  for (int i = 0; i < 2000; ++i) {
    std::string c = "k" + std::to_string(i);
    REQUIRE(cat.add(c, "root", g).ok());
    REQUIRE(cat.add(c + "a", c, g).ok());
    REQUIRE(cat.add(c + "b", c, g).ok());
  }
  CHECK(cat.descendants("root", 1)->size() == 2000);
  CHECK(cat.descendants("root", -1)->size() == 6000);
  CHECK(*cat.lca("k7a", "k7b") == std::optional<std::string>("k7"));
  CHECK(*cat.lca("k7a", "k1999b") == std::optional<std::string>("root"));
  CHECK(*cat.lca("k7a", "c3") == std::optional<std::string>());  // different trees
  CHECK(*cat.path("k7a", "k8b") == std::vector<std::string>{"k7a", "k7", "root", "k8", "k8b"});
  CHECK(cat.path("k7a", "c3")->empty());
  CHECK(*cat.lca("k7", "k7a") == std::optional<std::string>("k7"));  // a model is its own ancestor
  CHECK(cat.tree("k7a")->size() == 6001);
  CHECK(cat.tree("k7a")->front().id == "root");
  CHECK(cat.ancestors("nope").status().code() == StatusCode::kNotFound);
  CHECK(cat.lca("nope", "k7").status().code() == StatusCode::kNotFound);
}

TEST_CASE("catalog: find by a chain of layer types", "[catalog]") {
  Catalog cat;
  auto chain = [](std::vector<std::string> types) {
    json layers = json::array();
    for (size_t i = 0; i < types.size(); ++i)
      layers.push_back(layer("l" + std::to_string(i), types[i], json::object(),
                             i ? std::vector<std::string>{"l" + std::to_string(i - 1)} : std::vector<std::string>{}));
    return graph_of(json{{"layers", layers}});
  };
  REQUIRE(
      cat.add("cbr", "", cat.compile(chain({"Conv2d", "BatchNorm2d", "ReLU", "Linear"})), json{{"score", 0.95}}).ok());
  REQUIRE(cat.add("cr", "", cat.compile(chain({"Conv2d", "ReLU", "BatchNorm2d"})), json{{"score", 0.99}}).ok());
  REQUIRE(
      cat.add("cbr2", "", cat.compile(chain({"Input", "Conv2d", "BatchNorm2d", "ReLU"})), json{{"score", 0.5}}).ok());
  auto r = cat.find({"Conv2d", "BatchNorm2d", "ReLU"}, {}, 100);
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{"cbr2", "cbr"});  // newest first
  auto f = MetadataFilter::parse(json{{"score", {{">=", 0.9}}}});
  CHECK(*cat.find({"Conv2d", "BatchNorm2d", "ReLU"}, *f, 100) == std::vector<std::string>{"cbr"});
  CHECK(*cat.find({"Conv2d", "BatchNorm2d", "ReLU"}, {}, 1) == std::vector<std::string>{"cbr2"});
  CHECK(cat.find({"LSTM"}, {}, 10)->empty());
  CHECK(*cat.find({"ReLU"}, {}, 10) == std::vector<std::string>{"cbr2", "cr", "cbr"});
  CHECK(cat.find({}, {}, 10).status().code() == StatusCode::kInvalidArgument);
  REQUIRE(cat.retire("cbr").ok());
  CHECK(*cat.find({"Conv2d", "BatchNorm2d", "ReLU"}, {}, 100) == std::vector<std::string>{"cbr2"});
}

TEST_CASE("catalog: metadata filters", "[catalog]") {
  json meta{{"score", 0.93}, {"owner", "ana"}, {"epochs", 12}, {"tags", {{"task", "cifar10"}, {"stage", 2}}}};
  auto m = [&](const json& where) {
    auto f = MetadataFilter::parse(where);
    REQUIRE(f.ok());
    return f->matches(meta);
  };
  CHECK(m(json::object()));
  CHECK(m(json{{"score", {{">=", 0.9}}}}));
  CHECK_FALSE(m(json{{"score", {{">", 0.95}}}}));
  CHECK(m(json{{"score", {{">", 0.9}, {"<", 1}}}}));
  CHECK(m(json{{"owner", "ana"}}));
  CHECK_FALSE(m(json{{"owner", "bob"}}));
  CHECK(m(json{{"epochs", 12.0}}));  // numbers compare as numbers
  CHECK(m(json{{"tags", {{"task", "cifar10"}}}}));
  CHECK_FALSE(m(json{{"tags", {{"task", "imagenet"}}}}));
  CHECK(m(json{{"tags", {{"stage", {{"in", {1, 2, 3}}}}}}}));
  CHECK(m(json{{"owner", {{"!=", "bob"}}}}));
  CHECK(m(json{{"missing", {{"exists", false}}}}));
  CHECK_FALSE(m(json{{"missing", {{">", 1}}}}));
  CHECK_FALSE(m(json{{"owner", {{">", 1}}}}));  // a string is not ordered against a number
  CHECK(m(json{{"owner", {{">=", "an"}}}}));

  auto bad = [](const json& where, const std::string& what) {
    auto f = MetadataFilter::parse(where);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(f.status().message(), Catch::Contains(what));
  };
  bad(json{{"score", {{"=>", 0.9}}}}, "where.score: unknown operator '=>'");
  bad(json{{"tags", {{"stage", {{"in", 3}}}}}}, "where.tags.stage: 'in' takes an array");
  bad(json{{"score", {{">", json::array()}}}}, "where.score: '>' takes a number or a string");
  bad(json::array(), "where: must be an object");
}
