// The catalog's front: the `query` request (docs/catalog.md) — best_ancestor, ancestors,
// descendants, lca, path, tree, find — decoded by request::decode_query (each error naming the field).
//
// Owns: nothing (the catalog answers, daemon/catalog.hpp). Never does I/O and never changes the
// catalog.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <nlohmann/json.hpp>

#include "core/status.hpp"
#include "daemon/catalog.hpp"
#include "daemon/models.hpp"
#include "daemon/reads.hpp"
#include "daemon/request.hpp"

namespace cairn {

class CatalogQueries {
 public:
  // observer (may be null) hears of each best_ancestor answer's tensors (the prefetcher stages them).
  CatalogQueries(Catalog& catalog, const ModelDirectory& models, ReadObserver* observer = nullptr)
      : catalog_(catalog), models_(models), observer_(observer) {}
  // The `query` request, decoded (request::Query): kNotFound naming a model that does not exist.
  Result<nlohmann::json> query(const request::Query& q);

 private:
  // The best stored ancestor of a graph, with the stored model's tensors of each matching layer.
  Result<nlohmann::json> best_ancestor(const Graph& graph, const MetadataFilter& where);

  Catalog& catalog_;
  const ModelDirectory& models_;
  ReadObserver* observer_;
};

}  // namespace cairn
