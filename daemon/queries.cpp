#include "daemon/queries.hpp"

#include <algorithm>
#include <map>

#include "core/graph.hpp"

namespace cairn {

using nlohmann::json;

namespace {

Result<std::string> query_model(const json& q, const std::string& qop, const char* field) {
  auto it = q.find(field);
  if (it == q.end() || !it->is_string())
    return invalid_argument("query '" + qop + "': missing string field '" + field + "' (a model id)");
  return it->get<std::string>();
}

// A query's optional "depth": -1 (all generations) when absent.
Result<int> query_depth(const json& q, const std::string& qop) {
  auto it = q.find("depth");
  if (it == q.end()) return -1;
  if (!it->is_number_integer())
    return invalid_argument("query '" + qop + "': 'depth' must be an integer (omit it for all generations)");
  return static_cast<int>(std::clamp<int64_t>(it->get<int64_t>(), -1, INT32_MAX));
}

Result<MetadataFilter> query_where(const json& q, const std::string& qop) {
  auto it = q.find("where");
  if (it == q.end()) return MetadataFilter{};
  auto f = MetadataFilter::parse(*it);
  if (!f.ok()) return f.status().with_context("query '" + qop + "'");
  return f;
}

}  // namespace

Result<json> CatalogQueries::best_ancestor(const json& q) {
  auto git = q.find("graph");
  if (git == q.end() || !git->is_object())
    return invalid_argument("query 'best_ancestor': missing object field 'graph' (an architecture graph)");
  auto g = parse_graph(*git);
  if (!g.ok()) return g.status().with_context("query 'best_ancestor'");
  CAIRN_ASSIGN_OR_RETURN(MetadataFilter where, query_where(q, "best_ancestor"));
  GraphHandle compiled = catalog_.compile(*g, /*intern_types=*/false);
  BestAncestor best = catalog_.best_ancestor(compiled, where);
  json out{{"model", best.model.empty() ? json() : json(best.model)},
           {"matched", best.matched},
           {"layers", best.layers},
           {"score", best.score ? json(*best.score) : json()},
           {"tensors", json::array()}};
  if (best.model.empty()) return out;
  // The stored model's tensors of each matching layer, for the caller to transfer.
  auto m = models_.find(best.model);
  GraphHandle mg = catalog_.graph_of(best.model);
  if (!m.ok() || !mg) return out;
  std::map<std::string, std::vector<std::string>> by_layer;
  for (const TensorManifest& t : (*m)->tensors) {
    auto it = mg->tensors.find(t.name);
    by_layer[it != mg->tensors.end() ? it->second : t.name.substr(0, t.name.rfind('.'))].push_back(t.name);
  }
  json tensors = json::array();
  for (size_t k = 0; k < best.layers.size(); ++k) {
    auto it = by_layer.find(best.source_layers[k]);
    tensors.push_back({{"layer", best.layers[k]},
                       {"from", best.source_layers[k]},
                       {"tensors", it == by_layer.end() ? json::array() : json(it->second)}});
  }
  if (observer_) {
    std::vector<std::string> names;
    for (const auto& layer : tensors)
      for (const auto& n : layer["tensors"]) names.push_back(n.get<std::string>());
    observer_->matched(best.model, names);
  }
  out["tensors"] = std::move(tensors);
  return out;
}

Result<json> CatalogQueries::query(const json& req) {
  auto qit = req.find("query");
  if (qit == req.end() || !qit->is_object()) return invalid_argument("request 'query': missing object field 'query'");
  const json& q = *qit;
  auto opit = q.find("op");
  if (opit == q.end() || !opit->is_string())
    return invalid_argument(
        "query: missing string field 'op' (best_ancestor, ancestors, descendants, lca, path, find, tree)");
  const std::string qop = opit->get<std::string>();
  auto known = [&](const std::string& id) -> Status {
    if (!catalog_.contains(id))
      return not_found("query '" + qop + "': model '" + id + "' does not exist (see `cairn ls --all`)");
    return Status::OK();
  };
  if (qop == "best_ancestor") return best_ancestor(q);
  if (qop == "ancestors") {
    CAIRN_ASSIGN_OR_RETURN(std::string id, query_model(q, qop, "model"));
    CAIRN_RETURN_IF_ERROR(known(id));
    CAIRN_ASSIGN_OR_RETURN(int depth, query_depth(q, qop));
    CAIRN_ASSIGN_OR_RETURN(auto a, catalog_.ancestors(id));
    if (depth >= 0 && a.size() > static_cast<size_t>(depth)) a.resize(static_cast<size_t>(depth));
    return json{{"model", id}, {"ancestors", a}};
  }
  if (qop == "descendants") {
    CAIRN_ASSIGN_OR_RETURN(std::string id, query_model(q, qop, "model"));
    CAIRN_RETURN_IF_ERROR(known(id));
    CAIRN_ASSIGN_OR_RETURN(int depth, query_depth(q, qop));
    CAIRN_ASSIGN_OR_RETURN(auto d, catalog_.descendants(id, depth));
    json ids = json::array(), depths = json::array();
    for (const auto& [c, k] : d) {
      ids.push_back(c);
      depths.push_back(k);
    }
    return json{{"model", id}, {"descendants", std::move(ids)}, {"depths", std::move(depths)}};
  }
  if (qop == "lca") {
    auto mit = q.find("models");
    if (mit == q.end() || !mit->is_array() || mit->size() != 2 || !(*mit)[0].is_string() || !(*mit)[1].is_string())
      return invalid_argument("query 'lca': 'models' must be an array of two model ids");
    std::string a = (*mit)[0], b = (*mit)[1];
    CAIRN_RETURN_IF_ERROR(known(a));
    CAIRN_RETURN_IF_ERROR(known(b));
    CAIRN_ASSIGN_OR_RETURN(auto l, catalog_.lca(a, b));
    return json{{"models", {a, b}}, {"lca", l ? json(*l) : json()}};
  }
  if (qop == "path") {
    CAIRN_ASSIGN_OR_RETURN(std::string from, query_model(q, qop, "from"));
    CAIRN_ASSIGN_OR_RETURN(std::string to, query_model(q, qop, "to"));
    CAIRN_RETURN_IF_ERROR(known(from));
    CAIRN_RETURN_IF_ERROR(known(to));
    CAIRN_ASSIGN_OR_RETURN(auto p, catalog_.path(from, to));
    return json{{"from", from}, {"to", to}, {"path", p.empty() ? json() : json(p)}};
  }
  if (qop == "tree") {
    CAIRN_ASSIGN_OR_RETURN(std::string id, query_model(q, qop, "model"));
    CAIRN_RETURN_IF_ERROR(known(id));
    CAIRN_ASSIGN_OR_RETURN(auto nodes, catalog_.tree(id));
    json out = json::array();
    for (const auto& n : nodes)
      out.push_back({{"id", n.id},
                     {"parent", n.parent.empty() ? json() : json(n.parent)},
                     {"score", n.score ? json(*n.score) : json()},
                     {"retired", n.retired}});
    return json{{"model", id}, {"tree", std::move(out)}};
  }
  if (qop == "find") {
    auto pit = q.find("contains_path");
    if (pit == q.end() || !pit->is_array() || pit->empty())
      return invalid_argument("query 'find': 'contains_path' must be a non-empty array of layer types");
    std::vector<std::string> types;
    for (const auto& t : *pit) {
      if (!t.is_string() || t.get_ref<const std::string&>().empty())
        return invalid_argument("query 'find': 'contains_path' entries must be non-empty strings (layer types)");
      types.push_back(t.get<std::string>());
    }
    CAIRN_ASSIGN_OR_RETURN(MetadataFilter where, query_where(q, qop));
    auto lit = q.find("limit");
    if (lit != q.end() && !lit->is_number_unsigned())
      return invalid_argument("query 'find': 'limit' must be a non-negative integer");
    size_t limit = lit == q.end() ? 1000 : lit->get<size_t>();
    CAIRN_ASSIGN_OR_RETURN(auto found, catalog_.find(types, where, limit));
    return json{{"models", found}};
  }
  return invalid_argument(
      "query op '" + qop +
      "' is not supported (supported: best_ancestor, ancestors, descendants, lca, path, find, tree)");
}

}  // namespace cairn
