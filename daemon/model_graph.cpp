#include "daemon/model_graph.hpp"

#include "core/log.hpp"

namespace cairn {

GraphHandle graph_for(Catalog& catalog, const ModelManifest& m, const Graph* parsed, const ModelManifest* parent) {
  if (parsed) return catalog.compile(*parsed);
  if (!m.architecture.is_null()) {
    auto g = parse_graph(m.architecture);
    if (g.ok()) return catalog.compile(*g);
    CAIRN_LOG_WARN("model '{}': its stored architecture does not parse ({}); using one derived from its tensors", m.id,
                   g.status().to_string());
  }
  // A model with exactly its parent's tensor layout shares its parent's graph (the common case
  // of a metadata-only commit, which then costs no graph work at all). A collected parent has no
  // tensors left, so its children derive their own.
  GraphHandle pg = parent && !parent->collected ? catalog.graph_of(parent->id) : nullptr;
  if (pg && m.tensors.shares_with(parent->tensors)) return pg;
  if (pg && parent->tensors.size() == m.tensors.size()) {
    bool same = true;
    for (size_t i = 0; same && i < m.tensors.size(); ++i) {
      const TensorManifest &a = m.tensors[i], &b = parent->tensors[i];
      same = a.name == b.name && a.dtype == b.dtype && a.shape == b.shape;
    }
    if (same) return pg;
  }
  std::vector<TensorShape> shapes;
  shapes.reserve(m.tensors.size());
  for (const TensorManifest& t : m.tensors) shapes.push_back({t.name, t.dtype, t.shape});
  return catalog.compile(graph_from_tensors(shapes));
}

}  // namespace cairn
