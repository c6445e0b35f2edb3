#include "daemon/queries.hpp"

#include <algorithm>
#include <map>

#include "core/graph.hpp"
#include "daemon/request.hpp"

namespace cairn {

using nlohmann::json;

Result<json> CatalogQueries::best_ancestor(const Graph& graph, const MetadataFilter& where) {
  GraphHandle compiled = catalog_.compile(graph, /*intern_types=*/false);
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

Result<json> CatalogQueries::query(const request::Query& q) {
  using Op = request::Query::Op;
  const std::string qop = request::query_op_name(q.op);
  auto known = [&](const std::string& id) -> Status {
    if (!catalog_.contains(id))
      return not_found("query '" + qop + "': model '" + id + "' does not exist (see `cairn ls --all`)");
    return Status::OK();
  };
  switch (q.op) {
    case Op::kBestAncestor:
      if (!q.graph)
        return invalid_argument("query 'best_ancestor': missing object field 'graph' (an architecture graph)");
      return best_ancestor(*q.graph, q.where);
    case Op::kAncestors: {
      CAIRN_RETURN_IF_ERROR(known(q.model));
      CAIRN_ASSIGN_OR_RETURN(auto a, catalog_.ancestors(q.model));
      if (q.depth >= 0 && a.size() > static_cast<size_t>(q.depth)) a.resize(static_cast<size_t>(q.depth));
      return json{{"model", q.model}, {"ancestors", a}};
    }
    case Op::kDescendants: {
      CAIRN_RETURN_IF_ERROR(known(q.model));
      CAIRN_ASSIGN_OR_RETURN(auto d, catalog_.descendants(q.model, q.depth));
      json ids = json::array(), depths = json::array();
      for (const auto& [c, k] : d) {
        ids.push_back(c);
        depths.push_back(k);
      }
      return json{{"model", q.model}, {"descendants", std::move(ids)}, {"depths", std::move(depths)}};
    }
    case Op::kLca: {
      CAIRN_RETURN_IF_ERROR(known(q.a));
      CAIRN_RETURN_IF_ERROR(known(q.b));
      CAIRN_ASSIGN_OR_RETURN(auto l, catalog_.lca(q.a, q.b));
      return json{{"models", {q.a, q.b}}, {"lca", l ? json(*l) : json()}};
    }
    case Op::kPath: {
      CAIRN_RETURN_IF_ERROR(known(q.from));
      CAIRN_RETURN_IF_ERROR(known(q.to));
      CAIRN_ASSIGN_OR_RETURN(auto p, catalog_.path(q.from, q.to));
      return json{{"from", q.from}, {"to", q.to}, {"path", p.empty() ? json() : json(p)}};
    }
    case Op::kTree: {
      CAIRN_RETURN_IF_ERROR(known(q.model));
      CAIRN_ASSIGN_OR_RETURN(auto nodes, catalog_.tree(q.model));
      json out = json::array();
      for (const auto& n : nodes)
        out.push_back({{"id", n.id},
                       {"parent", n.parent.empty() ? json() : json(n.parent)},
                       {"score", n.score ? json(*n.score) : json()},
                       {"retired", n.retired}});
      return json{{"model", q.model}, {"tree", std::move(out)}};
    }
    case Op::kFind: {
      CAIRN_ASSIGN_OR_RETURN(auto found, catalog_.find(q.contains_path, q.where, q.limit));
      return json{{"models", found}};
    }
  }
  return internal_error("query '" + qop + "': an op the daemon decoded but does not serve");
}

}  // namespace cairn
