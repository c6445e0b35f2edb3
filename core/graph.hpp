// Architecture graphs and stable layer signatures (docs/graph-format.md).
//
// A graph is {"layers": [{"name", "type", "config": {...}, "inputs": [names]}], "tensors": {tensor:
// layer}}. A layer's signature hashes its type, its canonical config (key order and number spelling
// do not matter; its own name does not count) and the signatures of its inputs in order, so identical
// upstream structure gives identical signatures in graphs built independently (DStore/EvoStore).
//
// This is the foundation of the lineage/architecture catalog (best-ancestor queries); the index that
// answers them is built on top of it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"

namespace cairn {

using Signature = ChunkHash;  // 128 bits, xxh3

struct Layer {
  std::string name;
  std::string type;
  nlohmann::json config = nlohmann::json::object();
  std::vector<std::string> inputs;
};

struct Graph {
  std::vector<Layer> layers;                   // in topological order after parse_graph
  std::map<std::string, std::string> tensors;  // tensor -> layer (explicit entries only)
  // The layer a tensor belongs to: the explicit entry, else the name up to its last dot (or the
  // whole name when it has none). nullopt if that layer does not exist.
  std::optional<std::string> layer_of(const std::string& tensor) const;
  const Layer* find(const std::string& name) const;
  nlohmann::json to_json() const;
};

// Parses and validates. Errors (kInvalidArgument) name the culprit: unknown inputs, cycles (the
// layers on it), duplicate names, tensors mapped to unknown layers, wrong field types.
Result<Graph> parse_graph(const nlohmann::json& j);

// One layer per tensor-name prefix (the name up to its last dot), chained in order of first
// appearance; each layer's config records its tensors' suffixes, dtypes and shapes, so models with
// the same layout get the same signatures. For models stored without a graph.
struct TensorShape {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
Graph graph_from_tensors(const std::vector<TensorShape>& tensors);

// The canonical text of a config: keys sorted, no spaces, numbers with an integral value written
// as integers, others with 17 significant digits.
std::string canonical_json(const nlohmann::json& j);

// Signatures of every layer, by name. REQUIRES: g came from parse_graph or graph_from_tensors.
std::map<std::string, Signature> layer_signatures(const Graph& g);

}  // namespace cairn
