// The catalog's graph for a model: the glue between manifests (tiers/pfs) and the catalog's
// compiled graphs (daemon/catalog.hpp), used at commit, at load and at recovery.
#pragma once

#include "core/graph.hpp"
#include "daemon/catalog.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

// m's architecture (parsed: already parsed, or null), else its parent's graph when m has exactly
// the parent's tensors (a metadata-only commit costs no graph work), else one derived from its
// tensor names. parent: the parent's manifest, null for a root.
GraphHandle graph_for(Catalog& catalog, const ModelManifest& m, const Graph* parsed, const ModelManifest* parent);

}  // namespace cairn
