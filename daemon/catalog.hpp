// The lineage and architecture catalog: what cairn knows about every model besides its bytes —
// its parent, its metadata and its architecture graph as layer signatures — and the queries over it
// (docs/catalog.md): best ancestor of a new graph, ancestors/descendants/lca/path, find by a chain of
// layer types.
//
// best_ancestor is answered from an inverted index (signature -> the live models holding it, kept in
// tie-break order), not by comparing the candidate with every stored graph as EvoStore does; the
// linear scan is kept as best_ancestor_scan, the reference the index is tested and measured against.
//
// The catalog is pure memory: the engine fills it from the repository's manifests at start and keeps
// it current on commit, retire and gc.
//
// Thread-safety: every method may be called concurrently (a shared mutex inside).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/graph.hpp"
#include "core/status.hpp"

namespace cairn {

// A filter on model metadata, as given in a query's "where":
//   {"score": {">=": 0.9}, "tags": {"task": "cifar10"}, "owner": "ana"}
// A key whose value is an object of operators (==, !=, <, <=, >, >=, in, exists) compares the
// metadata value; a key whose value is another object matches a nested object the same way; any
// other value must be equal. Numbers compare as numbers; ordering operators on non-numbers compare
// strings, and are false for a missing key or a value of another type.
class MetadataFilter {
 public:
  MetadataFilter() = default;
  // kInvalidArgument naming the offending key or operator ("where.score: unknown operator '=>'").
  static Result<MetadataFilter> parse(const nlohmann::json& where);
  bool matches(const nlohmann::json& metadata) const;
  bool empty() const { return where_.empty(); }

 private:
  nlohmann::json where_ = nlohmann::json::object();
};

// An architecture compiled for the catalog: layers in topological order with their signatures,
// interned type names and input indices (no configs). Shared by every model with the same graph.
struct CompiledGraph {
  std::vector<std::string> names;
  std::vector<Signature> signatures;
  std::vector<uint32_t> types;                 // interned type ids (Catalog-wide)
  std::vector<std::vector<uint32_t>> inputs;   // indices into the above
  std::map<std::string, std::string> tensors;  // explicit tensor -> layer entries
  std::vector<Signature> sorted_signatures;    // distinct, sorted (membership tests)
  bool contains(const Signature& s) const;
};
using GraphHandle = std::shared_ptr<const CompiledGraph>;

struct BestAncestor {
  std::string model;                       // "" when no live model shares a layer (or passes where)
  size_t matched = 0;                      // layers of the query graph that match
  std::vector<std::string> layers;         // those layers' names, in the query graph's order
  std::vector<std::string> source_layers;  // for each, the name of the matching layer in the model
  std::optional<double> score;             // the model's metadata "score", if numeric
  bool operator==(const BestAncestor&) const = default;
};

class Catalog {
 public:
  Catalog();
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // Compiles a parsed graph (parse_graph or graph_from_tensors). Interns its type names when
  // intern_types (graphs of stored models); a query's graph leaves the type table alone, so that
  // queries never grow the daemon's memory (its unknown types get kUnknownType).
  GraphHandle compile(const Graph& g, bool intern_types = true);
  static constexpr uint32_t kUnknownType = UINT32_MAX;

  // Adds a model. kExists if id is known; kNotFound if parent is neither "" nor known. A retired
  // model takes part in lineage queries only.
  Status add(const std::string& id, const std::string& parent, GraphHandle graph,
             nlohmann::json metadata = nlohmann::json::object(), bool retired = false);
  // Takes the model out of best_ancestor and find (it stays in lineage). kNotFound if unknown.
  Status retire(const std::string& id);
  // Forgets a model. kBusy if it has children; kNotFound if unknown.
  Status erase(const std::string& id);

  bool contains(const std::string& id) const;
  GraphHandle graph_of(const std::string& id) const;  // nullptr if unknown
  size_t size() const;                                // models, retired included
  // Before a bulk load (a daemon's start): best_ancestor's index is built at its first use, not
  // model by model. build_index() builds it now (best_ancestor calls it).
  void defer_index();
  void build_index() const;
  size_t live() const;

  // The live model sharing the most layers with g (a layer matches when its signature occurs in
  // the model, which implies its whole upstream matches); ties go to the higher metadata "score"
  // (a model without a numeric score ranks below any score), then to the newer model.
  BestAncestor best_ancestor(const GraphHandle& g, const MetadataFilter& where = {}) const;
  // The same answer by comparing g with every live model (EvoStore's method): the reference.
  BestAncestor best_ancestor_scan(const GraphHandle& g, const MetadataFilter& where = {}) const;

  // Parent first, root last. kNotFound names the id.
  Result<std::vector<std::string>> ancestors(const std::string& id) const;
  // Breadth first, with each model's distance from id (1 = child); depth < 0 means unlimited.
  Result<std::vector<std::pair<std::string, int>>> descendants(const std::string& id, int depth) const;
  // The lowest common ancestor (a model counts as its own ancestor); nullopt if the two are in
  // different trees.
  Result<std::optional<std::string>> lca(const std::string& a, const std::string& b) const;
  // The models on the tree path from `from` to `to`, both included (up to their lca, then down);
  // empty if they are in different trees.
  Result<std::vector<std::string>> path(const std::string& from, const std::string& to) const;
  // The whole lineage tree that holds id (from its root down), parents before children.
  struct TreeNode {
    std::string id;
    std::string parent;  // "" for the root
    std::optional<double> score;
    bool retired = false;
  };
  Result<std::vector<TreeNode>> tree(const std::string& id) const;
  // Live models whose graph holds a chain of layers with these types (each layer an input of the
  // next), passing where; newest first, at most limit.
  Result<std::vector<std::string>> find(const std::vector<std::string>& type_path, const MetadataFilter& where,
                                        size_t limit) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
