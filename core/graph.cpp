#include "core/graph.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>

namespace cairn {

using nlohmann::json;

std::optional<std::string> Graph::layer_of(const std::string& tensor) const {
  auto it = tensors.find(tensor);
  std::string layer = it != tensors.end() ? it->second : tensor.substr(0, tensor.rfind('.'));
  if (!find(layer)) return std::nullopt;
  return layer;
}

const Layer* Graph::find(const std::string& name) const {
  for (const auto& l : layers)
    if (l.name == name) return &l;
  return nullptr;
}

json Graph::to_json() const {
  json layers_j = json::array();
  for (const auto& l : layers)
    layers_j.push_back({{"name", l.name}, {"type", l.type}, {"config", l.config}, {"inputs", l.inputs}});
  json out{{"layers", std::move(layers_j)}};
  if (!tensors.empty()) out["tensors"] = tensors;
  return out;
}

Result<Graph> parse_graph(const json& j) {
  if (!j.is_object()) return invalid_argument("graph: not a JSON object");
  for (const auto& [k, v] : j.items())
    if (k != "layers" && k != "tensors")
      return invalid_argument("graph: unknown field '" + k + "' (valid: layers, tensors)");
  auto lit = j.find("layers");
  if (lit == j.end() || !lit->is_array()) return invalid_argument("graph: missing array field 'layers'");
  Graph g;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < lit->size(); ++i) {
    const json& lj = (*lit)[i];
    std::string where = "graph: layers[" + std::to_string(i) + "]";
    if (!lj.is_object()) return invalid_argument(where + " is not an object");
    for (const auto& [k, v] : lj.items())
      if (k != "name" && k != "type" && k != "config" && k != "inputs")
        return invalid_argument(where + ": unknown field '" + k + "' (valid: name, type, config, inputs)");
    auto n = lj.find("name");
    if (n == lj.end() || !n->is_string() || !valid_name(n->get<std::string>()))
      return invalid_argument(where + ": 'name' must be a non-empty UTF-8 string of at most 1024 bytes");
    Layer l;
    l.name = n->get<std::string>();
    where = "graph: layer '" + l.name + "'";
    auto t = lj.find("type");
    if (t == lj.end() || !t->is_string() || t->get<std::string>().empty())
      return invalid_argument(where + ": 'type' must be a non-empty string");
    l.type = t->get<std::string>();
    if (auto c = lj.find("config"); c != lj.end()) {
      if (!c->is_object()) return invalid_argument(where + ": 'config' must be an object");
      l.config = *c;
    }
    if (auto in = lj.find("inputs"); in != lj.end()) {
      if (!in->is_array()) return invalid_argument(where + ": 'inputs' must be an array of layer names");
      for (const auto& x : *in) {
        if (!x.is_string()) return invalid_argument(where + ": 'inputs' must be an array of layer names");
        l.inputs.push_back(x.get<std::string>());
      }
    }
    if (!index.emplace(l.name, g.layers.size()).second)
      return invalid_argument("graph: layer name '" + l.name + "' is used twice");
    g.layers.push_back(std::move(l));
  }
  for (const auto& l : g.layers)
    for (const auto& in : l.inputs)
      if (!index.count(in))
        return invalid_argument("graph: layer '" + l.name + "': input '" + in + "' is not a layer of this graph");

  // Topological order (Kahn's algorithm: iterative, so deep chains cannot overflow the stack),
  // keeping the given order among layers that are ready together.
  const size_t n = g.layers.size();
  std::vector<size_t> pending(n, 0);
  std::vector<std::vector<size_t>> consumers(n);
  for (size_t i = 0; i < n; ++i)
    for (const auto& in : g.layers[i].inputs) {
      ++pending[i];
      consumers[index[in]].push_back(i);
    }
  std::vector<size_t> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) order.push_back(i);
  for (size_t k = 0; k < order.size(); ++k)
    for (size_t c : consumers[order[k]])
      if (--pending[c] == 0) order.push_back(c);
  if (order.size() != n) {
    // Every layer left waits on another layer left: follow inputs until one repeats.
    size_t cur = 0;
    while (pending[cur] == 0) ++cur;
    std::vector<size_t> seen_at(n, SIZE_MAX), path;
    while (seen_at[cur] == SIZE_MAX) {
      seen_at[cur] = path.size();
      path.push_back(cur);
      for (const auto& in : g.layers[cur].inputs)
        if (pending[index[in]] > 0) {
          cur = index[in];
          break;
        }
    }
    std::string cycle;
    for (size_t k = seen_at[cur]; k < path.size(); ++k) cycle = "'" + g.layers[path[k]].name + "' -> " + cycle;
    return invalid_argument("graph: layers " + cycle + "'" + g.layers[path.back()].name + "' form a cycle");
  }
  std::vector<Layer> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(g.layers[i]));
  g.layers = std::move(sorted);

  if (auto tit = j.find("tensors"); tit != j.end()) {
    if (!tit->is_object()) return invalid_argument("graph: 'tensors' must be an object of tensor name -> layer name");
    for (const auto& [tensor, layer] : tit->items()) {
      if (!layer.is_string()) return invalid_argument("graph: tensor '" + tensor + "': the layer must be a string");
      if (!index.count(layer.get<std::string>()))
        return invalid_argument("graph: tensor '" + tensor + "' points to unknown layer '" + layer.get<std::string>() +
                                "'");
      g.tensors[tensor] = layer.get<std::string>();
    }
  }
  return g;
}

Graph graph_from_tensors(const std::vector<TensorShape>& tensors) {
  Graph g;
  std::map<std::string, size_t> index;
  for (const auto& t : tensors) {
    size_t dot = t.name.rfind('.');
    std::string layer = dot == std::string::npos ? t.name : t.name.substr(0, dot);
    std::string suffix = dot == std::string::npos ? "" : t.name.substr(dot + 1);
    auto [it, added] = index.emplace(layer, g.layers.size());
    if (added) {
      Layer l;
      l.name = layer;
      l.type = "tensors";
      l.config = json{{"tensors", json::object()}};
      if (!g.layers.empty()) l.inputs.push_back(g.layers.back().name);
      g.layers.push_back(std::move(l));
    }
    g.layers[it->second].config["tensors"][suffix] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}};
  }
  return g;
}

namespace {
void canonical(const json& j, std::string& out) {
  switch (j.type()) {
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : j.items()) {  // nlohmann's object is a sorted map
        if (!first) out += ',';
        first = false;
        out += json(k).dump();
        out += ':';
        canonical(v, out);
      }
      out += '}';
      break;
    }
    case json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += ',';
        canonical(j[i], out);
      }
      out += ']';
      break;
    }
    case json::value_t::number_float: {
      double d = j.get<double>();
      if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e15) {
        out += std::to_string(static_cast<int64_t>(d));
      } else {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", d);
        out += buf;
      }
      break;
    }
    default:
      out += j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}
}  // namespace

std::string canonical_json(const json& j) {
  std::string out;
  canonical(j, out);
  return out;
}

std::map<std::string, Signature> layer_signatures(const Graph& g) {
  std::map<std::string, Signature> sig;
  for (const auto& l : g.layers) {  // topological: inputs come first
    std::string text = l.type;
    text += '\0';
    text += canonical_json(l.config);
    for (const auto& in : l.inputs) {
      text += '\0';
      text += sig.at(in).hex();
    }
    sig[l.name] = hash_bytes(text.data(), text.size());
  }
  return sig;
}

}  // namespace cairn
