// The lineage and architecture catalog (catalog.hpp, docs/catalog.md).
//
// best_ancestor, the reasoning behind the index:
//   Let E be the layers of the query graph G whose signature some live model holds. A layer's
//   signature covers its whole upstream, so a model holding layer j's signature holds those of all
//   layers upstream of j: the set A(M) of G's layers that model M matches is upstream-closed, and
//   so is E. Score(M) = |A(M)|.
//   1. For each j in E, the best-ranked (score, then newest) model holding sig(j) is the first of
//      the posting set of sig(j), which is kept in rank order. Each such model is scored exactly.
//      Every model whose A(M) has a single maximal layer k has A(M) = up(k) and is therefore beaten
//      or tied-and-outranked by the candidate taken from k.
//   2. Models with several maximal layers remain. Keep R = the layers such a model could still
//      match (initially E). While |R| could beat the best found so far, take the maximal layer of R
//      with the smallest posting set, score every model in it, and drop it from R (an unscored
//      model does not hold it, so it matches at most R minus that layer). When |R| equals the best
//      score and R has a single maximal layer, any model matching all of R was covered by step 1.
//   In a NAS run the best match is nearly always found in step 1 and proved in a step or two, so a
//   query costs a few hash lookups and posting-set heads instead of a pass over every model.
#include "daemon/catalog.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <unordered_set>

#include "core/sync.hpp"

namespace cairn {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// MetadataFilter

namespace {

const std::set<std::string>& operators() {
  static const std::set<std::string> ops{"==", "!=", "<", "<=", ">", ">=", "in", "exists"};
  return ops;
}

bool is_operator_object(const json& v) {
  if (!v.is_object() || v.empty()) return false;
  for (const auto& [k, _] : v.items())
    if (k.empty() || !(k[0] == '=' || k[0] == '!' || k[0] == '<' || k[0] == '>' || k == "in" || k == "exists"))
      return false;
  return true;
}

Status check_where(const json& where, const std::string& path, int depth) {
  if (depth > 16) return invalid_argument(path + ": filters nest at most 16 levels");
  if (!where.is_object()) return invalid_argument(path + ": must be an object of metadata keys");
  for (const auto& [key, v] : where.items()) {
    const std::string p = path + "." + key;
    if (is_operator_object(v)) {
      for (const auto& [op, arg] : v.items()) {
        if (!operators().count(op))
          return invalid_argument(p + ": unknown operator '" + op + "' (use ==, !=, <, <=, >, >=, in, exists)");
        if (op == "in" && !arg.is_array()) return invalid_argument(p + ": 'in' takes an array of values");
        if (op == "exists" && !arg.is_boolean()) return invalid_argument(p + ": 'exists' takes true or false");
        if ((op == "<" || op == "<=" || op == ">" || op == ">=") && !arg.is_number() && !arg.is_string())
          return invalid_argument(p + ": '" + op + "' takes a number or a string");
      }
    } else if (v.is_object()) {
      CAIRN_RETURN_IF_ERROR(check_where(v, p, depth + 1));
    }
  }
  return Status::OK();
}

bool values_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// a <op> b for an ordering operator; false when the two cannot be compared.
bool ordered(const json& a, const std::string& op, const json& b) {
  int c;
  if (a.is_number() && b.is_number()) {
    double x = a.get<double>(), y = b.get<double>();
    c = x < y ? -1 : (x > y ? 1 : 0);
  } else if (a.is_string() && b.is_string()) {
    c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
  } else {
    return false;
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

bool match_where(const json& where, const json& meta) {
  for (const auto& [key, v] : where.items()) {
    const json* value = nullptr;
    if (meta.is_object()) {
      auto it = meta.find(key);
      if (it != meta.end()) value = &*it;
    }
    if (is_operator_object(v)) {
      for (const auto& [op, arg] : v.items()) {
        if (op == "exists") {
          if ((value != nullptr) != arg.get<bool>()) return false;
          continue;
        }
        if (op == "!=") {
          if (value && values_equal(*value, arg)) return false;
          continue;
        }
        if (!value) return false;
        if (op == "==") {
          if (!values_equal(*value, arg)) return false;
        } else if (op == "in") {
          if (std::none_of(arg.begin(), arg.end(), [&](const json& x) { return values_equal(*value, x); }))
            return false;
        } else if (!ordered(*value, op, arg)) {
          return false;
        }
      }
    } else if (v.is_object()) {
      if (!value || !value->is_object() || !match_where(v, *value)) return false;
    } else {
      if (!value || !values_equal(*value, v)) return false;
    }
  }
  return true;
}

}  // namespace

Result<MetadataFilter> MetadataFilter::parse(const json& where) {
  MetadataFilter f;
  if (where.is_null()) return f;
  CAIRN_RETURN_IF_ERROR(check_where(where, "where", 0));
  f.where_ = where;
  return f;
}

bool MetadataFilter::matches(const json& metadata) const { return where_.empty() || match_where(where_, metadata); }

bool CompiledGraph::contains(const Signature& s) const {
  return std::binary_search(sorted_signatures.begin(), sorted_signatures.end(), s);
}

// ---------------------------------------------------------------------------------------------
// Catalog::Impl

// Named rather than anonymous: Catalog::Impl (a class with external linkage) holds these types.
namespace catalog_ranks {

constexpr double kNoScore = -std::numeric_limits<double>::infinity();

// A live model's place in a posting set: better ranks sort first.
struct Rank {
  double score;
  uint64_t seq;
  uint32_t slot;
  bool operator<(const Rank& o) const {
    if (score != o.score) return score > o.score;
    return seq > o.seq;
  }
};

bool outranks(size_t count_a, const Rank& a, size_t count_b, const Rank& b) {
  if (count_a != count_b) return count_a > count_b;
  return a < b;
}

}  // namespace catalog_ranks

using catalog_ranks::kNoScore;
using catalog_ranks::outranks;
using catalog_ranks::Rank;

struct Catalog::Impl {
  struct Model {
    std::string id;
    int64_t parent = -1;
    std::vector<uint32_t> children;
    GraphHandle graph;
    json metadata;
    double score = kNoScore;
    uint64_t seq = 0;
    bool retired = false;
    bool used = false;
    Rank rank(uint32_t slot) const { return Rank{score, seq, slot}; }
  };

  mutable SharedMutex mu;
  std::vector<Model> models CAIRN_GUARDED_BY(mu);
  std::vector<uint32_t> free_slots CAIRN_GUARDED_BY(mu);
  std::unordered_map<std::string, uint32_t> by_id CAIRN_GUARDED_BY(mu);
  std::unordered_map<Signature, std::set<Rank>, ChunkHashHasher> postings CAIRN_GUARDED_BY(mu);
  std::map<uint64_t, uint32_t> live_order CAIRN_GUARDED_BY(mu);  // seq -> slot, live models only
  uint64_t next_seq CAIRN_GUARDED_BY(mu) = 1;

  Mutex type_mu;
  std::unordered_map<std::string, uint32_t> type_ids CAIRN_GUARDED_BY(type_mu);

  const Model* find(const std::string& id) const CAIRN_REQUIRES_SHARED(mu) {
    auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : &models[it->second];
  }
  Result<uint32_t> slot_of(const std::string& id) const CAIRN_REQUIRES_SHARED(mu) {
    auto it = by_id.find(id);
    if (it == by_id.end()) return not_found("model '" + id + "' is not in the catalog");
    return it->second;
  }

  // The posting sets are built when first needed after a bulk load (a daemon's start): inserting
  // every layer of 100,000 models one set at a time was most of a restart (6.2 million insertions
  // for children of a 62-layer base), and listing, reading and committing need none of it.
  bool postings_built CAIRN_GUARDED_BY(mu) = true;
  void post(uint32_t slot) CAIRN_REQUIRES(mu) {
    const Model& m = models[slot];
    Rank r = m.rank(slot);
    for (const Signature& s : m.graph->sorted_signatures) postings[s].insert(r);
  }
  void build_postings() CAIRN_REQUIRES(mu) {
    for (uint32_t slot = 0; slot < models.size(); ++slot)
      if (models[slot].used && !models[slot].retired) post(slot);
    postings_built = true;
  }
  void index(uint32_t slot) CAIRN_REQUIRES(mu) {
    if (postings_built) post(slot);
    live_order.emplace(models[slot].seq, slot);
  }
  void unindex(uint32_t slot) CAIRN_REQUIRES(mu) {
    const Model& m = models[slot];
    Rank r = m.rank(slot);
    if (postings_built) {
      for (const Signature& s : m.graph->sorted_signatures) {
        auto it = postings.find(s);
        if (it == postings.end()) continue;
        it->second.erase(r);
        if (it->second.empty()) postings.erase(it);
      }
    }
    live_order.erase(m.seq);
  }

  // The number of layers of g whose signature model m holds.
  static size_t count_matches(const CompiledGraph& g, const CompiledGraph& m) {
    size_t n = 0;
    for (const Signature& s : g.signatures) n += m.contains(s) ? 1 : 0;
    return n;
  }

  BestAncestor describe(const CompiledGraph& g, uint32_t slot) const CAIRN_REQUIRES_SHARED(mu);
};

BestAncestor Catalog::Impl::describe(const CompiledGraph& g, uint32_t slot) const {
  const Model& m = models[slot];
  BestAncestor out;
  out.model = m.id;
  if (m.score != kNoScore) out.score = m.score;
  // Layers of the model by signature, in its order, handed out in order to equal layers of g.
  std::unordered_map<Signature, std::deque<size_t>, ChunkHashHasher> by_sig;
  for (size_t k = 0; k < m.graph->signatures.size(); ++k) by_sig[m.graph->signatures[k]].push_back(k);
  for (size_t j = 0; j < g.signatures.size(); ++j) {
    auto it = by_sig.find(g.signatures[j]);
    if (it == by_sig.end()) continue;
    out.layers.push_back(g.names[j]);
    size_t k = it->second.front();
    if (it->second.size() > 1) it->second.pop_front();  // the last one serves any further repeats
    out.source_layers.push_back(m.graph->names[k]);
  }
  out.matched = out.layers.size();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Catalog

Catalog::Catalog() : impl_(std::make_unique<Impl>()) {}
Catalog::~Catalog() = default;

GraphHandle Catalog::compile(const Graph& g, bool intern_types) {
  auto c = std::make_shared<CompiledGraph>();
  auto sigs = layer_signatures(g);
  std::unordered_map<std::string, uint32_t> index;
  c->names.reserve(g.layers.size());
  for (const Layer& l : g.layers) {
    index.emplace(l.name, static_cast<uint32_t>(c->names.size()));
    c->names.push_back(l.name);
    c->signatures.push_back(sigs.at(l.name));
    std::vector<uint32_t> in;
    in.reserve(l.inputs.size());
    for (const std::string& name : l.inputs) in.push_back(index.at(name));
    c->inputs.push_back(std::move(in));
  }
  {
    MutexLock lock(impl_->type_mu);
    for (const Layer& l : g.layers) {
      if (intern_types) {
        auto [it, _] = impl_->type_ids.try_emplace(l.type, static_cast<uint32_t>(impl_->type_ids.size()));
        c->types.push_back(it->second);
      } else {
        auto it = impl_->type_ids.find(l.type);
        c->types.push_back(it == impl_->type_ids.end() ? kUnknownType : it->second);
      }
    }
  }
  c->tensors = g.tensors;
  c->sorted_signatures = c->signatures;
  std::sort(c->sorted_signatures.begin(), c->sorted_signatures.end());
  c->sorted_signatures.erase(std::unique(c->sorted_signatures.begin(), c->sorted_signatures.end()),
                             c->sorted_signatures.end());
  return c;
}

Status Catalog::add(const std::string& id, const std::string& parent, GraphHandle graph, json metadata, bool retired) {
  if (!graph) return invalid_argument("model '" + id + "': no graph given to the catalog");
  WriterLock lock(impl_->mu);
  if (impl_->by_id.count(id)) return already_exists("model '" + id + "' is already in the catalog");
  int64_t parent_slot = -1;
  if (!parent.empty()) {
    auto it = impl_->by_id.find(parent);
    if (it == impl_->by_id.end())
      return not_found("parent '" + parent + "' of model '" + id + "' is not in the catalog");
    parent_slot = it->second;
  }
  uint32_t slot;
  if (!impl_->free_slots.empty()) {
    slot = impl_->free_slots.back();
    impl_->free_slots.pop_back();
  } else {
    slot = static_cast<uint32_t>(impl_->models.size());
    impl_->models.emplace_back();
  }
  Impl::Model& m = impl_->models[slot];
  m = Impl::Model{};
  m.id = id;
  m.parent = parent_slot;
  m.graph = std::move(graph);
  if (metadata.is_object()) {
    auto s = metadata.find("score");
    if (s != metadata.end() && s->is_number()) {
      double d = s->get<double>();
      if (!std::isnan(d)) m.score = d;
    }
  }
  m.metadata = std::move(metadata);
  m.seq = impl_->next_seq++;
  m.retired = retired;
  m.used = true;
  impl_->by_id.emplace(id, slot);
  if (parent_slot >= 0) impl_->models[static_cast<size_t>(parent_slot)].children.push_back(slot);
  if (!retired) impl_->index(slot);
  return Status::OK();
}

Status Catalog::retire(const std::string& id) {
  WriterLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t slot, impl_->slot_of(id));
  Impl::Model& m = impl_->models[slot];
  if (m.retired) return Status::OK();
  impl_->unindex(slot);
  m.retired = true;
  return Status::OK();
}

Status Catalog::erase(const std::string& id) {
  WriterLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t slot, impl_->slot_of(id));
  Impl::Model& m = impl_->models[slot];
  if (!m.children.empty())
    return busy("model '" + id + "' has " + std::to_string(m.children.size()) + " child model(s) in the catalog");
  if (!m.retired) impl_->unindex(slot);
  if (m.parent >= 0) {
    auto& siblings = impl_->models[static_cast<size_t>(m.parent)].children;
    siblings.erase(std::remove(siblings.begin(), siblings.end(), slot), siblings.end());
  }
  impl_->by_id.erase(id);
  m = Impl::Model{};
  impl_->free_slots.push_back(slot);
  return Status::OK();
}

bool Catalog::contains(const std::string& id) const {
  ReaderLock lock(impl_->mu);
  return impl_->by_id.count(id) > 0;
}

GraphHandle Catalog::graph_of(const std::string& id) const {
  ReaderLock lock(impl_->mu);
  const Impl::Model* m = impl_->find(id);
  return m ? m->graph : nullptr;
}

size_t Catalog::size() const {
  ReaderLock lock(impl_->mu);
  return impl_->by_id.size();
}

size_t Catalog::live() const {
  ReaderLock lock(impl_->mu);
  return impl_->live_order.size();
}

void Catalog::defer_index() {
  WriterLock lock(impl_->mu);
  impl_->postings.clear();
  impl_->postings_built = false;
}

void Catalog::build_index() const {
  {
    ReaderLock lock(impl_->mu);
    if (impl_->postings_built) return;
  }
  WriterLock lock(impl_->mu);
  if (!impl_->postings_built) impl_->build_postings();
}

BestAncestor Catalog::best_ancestor(const GraphHandle& gh, const MetadataFilter& where) const {
  const CompiledGraph& g = *gh;
  const size_t n = g.signatures.size();
  build_index();
  ReaderLock lock(impl_->mu);

  // E: the layers of g some live model holds, with their posting sets.
  std::vector<const std::set<Rank>*> post(n, nullptr);
  std::vector<char> in_r(n, 0);
  size_t r_size = 0;
  for (size_t j = 0; j < n; ++j) {
    auto it = impl_->postings.find(g.signatures[j]);
    if (it != impl_->postings.end()) {
      post[j] = &it->second;
      in_r[j] = 1;
      ++r_size;
    }
  }
  if (r_size == 0) return {};

  // Exact scores of the models looked at, and the best so far.
  std::unordered_map<uint32_t, size_t> scored;
  bool have_best = false;
  size_t best_count = 0;
  Rank best_rank{};
  auto consider = [&](const Rank& r) CAIRN_REQUIRES_SHARED(impl_->mu) {
    auto [it, fresh] = scored.try_emplace(r.slot, 0);
    if (!fresh) return;
    it->second = Impl::count_matches(g, *impl_->models[r.slot].graph);
    if (!have_best || outranks(it->second, r, best_count, best_rank)) {
      have_best = true;
      best_count = it->second;
      best_rank = r;
    }
  };
  const bool filtered = !where.empty();
  auto passes = [&](const Rank& r) CAIRN_REQUIRES_SHARED(impl_->mu) {
    return !filtered || where.matches(impl_->models[r.slot].metadata);
  };

  // Step 1: the best-ranked holder of each layer.
  for (size_t j = 0; j < n; ++j) {
    if (!post[j]) continue;
    for (const Rank& r : *post[j]) {
      if (!passes(r)) continue;
      consider(r);
      break;
    }
  }

  // Step 2: models matching several maximal layers. A layer of R is maximal when no layer of R
  // takes it as an input; count those consumers.
  std::vector<uint32_t> consumers(n, 0);
  for (size_t j = 0; j < n; ++j) {
    if (!in_r[j]) continue;
    for (uint32_t i : g.inputs[j]) consumers[i] += in_r[i] ? 1 : 0;
  }
  std::vector<size_t> maximal;
  for (size_t j = 0; j < n; ++j)
    if (in_r[j] && consumers[j] == 0) maximal.push_back(j);
  while (r_size > 0) {
    if (have_best && r_size < best_count) break;
    if (have_best && r_size == best_count && maximal.size() == 1) break;
    // The maximal layer with the fewest holders.
    size_t pick = 0;
    for (size_t k = 1; k < maximal.size(); ++k)
      if (post[maximal[k]]->size() < post[maximal[pick]]->size()) pick = k;
    size_t j = maximal[pick];
    for (const Rank& r : *post[j])
      if (passes(r)) consider(r);
    // Drop j from R; its inputs may become maximal.
    maximal.erase(maximal.begin() + static_cast<std::ptrdiff_t>(pick));
    in_r[j] = 0;
    --r_size;
    for (uint32_t i : g.inputs[j]) {
      if (!in_r[i]) continue;
      if (--consumers[i] == 0 && std::find(maximal.begin(), maximal.end(), i) == maximal.end()) maximal.push_back(i);
    }
  }
  if (!have_best || best_count == 0) return {};
  return impl_->describe(g, best_rank.slot);
}

BestAncestor Catalog::best_ancestor_scan(const GraphHandle& gh, const MetadataFilter& where) const {
  const CompiledGraph& g = *gh;
  ReaderLock lock(impl_->mu);
  bool have_best = false;
  size_t best_count = 0;
  Rank best_rank{};
  for (const auto& [seq, slot] : impl_->live_order) {
    const Impl::Model& m = impl_->models[slot];
    if (!where.empty() && !where.matches(m.metadata)) continue;
    size_t c = Impl::count_matches(g, *m.graph);
    if (c == 0) continue;
    Rank r = m.rank(slot);
    if (!have_best || outranks(c, r, best_count, best_rank)) {
      have_best = true;
      best_count = c;
      best_rank = r;
    }
  }
  if (!have_best) return {};
  return impl_->describe(g, best_rank.slot);
}

Result<std::vector<std::string>> Catalog::ancestors(const std::string& id) const {
  ReaderLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t slot, impl_->slot_of(id));
  std::vector<std::string> out;
  for (int64_t p = impl_->models[slot].parent; p >= 0; p = impl_->models[static_cast<size_t>(p)].parent)
    out.push_back(impl_->models[static_cast<size_t>(p)].id);
  return out;
}

Result<std::vector<std::pair<std::string, int>>> Catalog::descendants(const std::string& id, int depth) const {
  ReaderLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t slot, impl_->slot_of(id));
  std::vector<std::pair<std::string, int>> out;
  std::deque<std::pair<uint32_t, int>> queue{{slot, 0}};
  while (!queue.empty()) {
    auto [s, d] = queue.front();
    queue.pop_front();
    if (depth >= 0 && d >= depth) continue;
    for (uint32_t c : impl_->models[s].children) {
      out.emplace_back(impl_->models[c].id, d + 1);
      queue.emplace_back(c, d + 1);
    }
  }
  return out;
}

Result<std::optional<std::string>> Catalog::lca(const std::string& a, const std::string& b) const {
  ReaderLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t sa, impl_->slot_of(a));
  CAIRN_ASSIGN_OR_RETURN(uint32_t sb, impl_->slot_of(b));
  std::unordered_set<uint32_t> up;
  for (int64_t p = sa; p >= 0; p = impl_->models[static_cast<size_t>(p)].parent) up.insert(static_cast<uint32_t>(p));
  for (int64_t p = sb; p >= 0; p = impl_->models[static_cast<size_t>(p)].parent)
    if (up.count(static_cast<uint32_t>(p))) return std::optional<std::string>(impl_->models[static_cast<size_t>(p)].id);
  return std::optional<std::string>();
}

Result<std::vector<std::string>> Catalog::path(const std::string& from, const std::string& to) const {
  ReaderLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t sa, impl_->slot_of(from));
  CAIRN_ASSIGN_OR_RETURN(uint32_t sb, impl_->slot_of(to));
  std::unordered_map<uint32_t, size_t> up;  // slot -> distance from `from`
  std::vector<uint32_t> a_chain;
  for (int64_t p = sa; p >= 0; p = impl_->models[static_cast<size_t>(p)].parent) {
    up.emplace(static_cast<uint32_t>(p), a_chain.size());
    a_chain.push_back(static_cast<uint32_t>(p));
  }
  std::vector<uint32_t> b_chain;
  for (int64_t p = sb; p >= 0; p = impl_->models[static_cast<size_t>(p)].parent) {
    auto it = up.find(static_cast<uint32_t>(p));
    if (it != up.end()) {
      std::vector<std::string> out;
      for (size_t k = 0; k <= it->second; ++k) out.push_back(impl_->models[a_chain[k]].id);
      for (auto r = b_chain.rbegin(); r != b_chain.rend(); ++r) out.push_back(impl_->models[*r].id);
      return out;
    }
    b_chain.push_back(static_cast<uint32_t>(p));
  }
  return std::vector<std::string>{};
}

Result<std::vector<Catalog::TreeNode>> Catalog::tree(const std::string& id) const {
  ReaderLock lock(impl_->mu);
  CAIRN_ASSIGN_OR_RETURN(uint32_t slot, impl_->slot_of(id));
  while (impl_->models[slot].parent >= 0) slot = static_cast<uint32_t>(impl_->models[slot].parent);
  std::vector<TreeNode> out;
  std::deque<uint32_t> queue{slot};
  while (!queue.empty()) {
    const Impl::Model& m = impl_->models[queue.front()];
    queue.pop_front();
    TreeNode n;
    n.id = m.id;
    if (m.parent >= 0) n.parent = impl_->models[static_cast<size_t>(m.parent)].id;
    if (m.score != kNoScore) n.score = m.score;
    n.retired = m.retired;
    out.push_back(std::move(n));
    for (uint32_t c : m.children) queue.push_back(c);
  }
  return out;
}

Result<std::vector<std::string>> Catalog::find(const std::vector<std::string>& type_path, const MetadataFilter& where,
                                               size_t limit) const {
  if (type_path.empty()) return invalid_argument("contains_path: give at least one layer type");
  if (type_path.size() > 64) return invalid_argument("contains_path: at most 64 layer types");
  std::vector<uint32_t> want;
  {
    MutexLock lock(impl_->type_mu);
    for (const std::string& t : type_path) {
      auto it = impl_->type_ids.find(t);
      if (it == impl_->type_ids.end()) return std::vector<std::string>{};  // no graph has that type
      want.push_back(it->second);
    }
  }
  const size_t k = want.size();
  const uint64_t full = uint64_t{1} << (k - 1);
  // ends[j] bit p: a chain of types want[0..p] ends at layer j.
  auto holds_chain = [&](const CompiledGraph& g) {
    std::vector<uint64_t> ends(g.types.size(), 0);
    for (size_t j = 0; j < g.types.size(); ++j) {
      uint64_t before = 0;
      for (uint32_t i : g.inputs[j]) before |= ends[i];
      uint64_t e = 0;
      for (size_t p = 0; p < k; ++p)
        if (g.types[j] == want[p] && (p == 0 || (before >> (p - 1) & 1))) e |= uint64_t{1} << p;
      if (e & full) return true;
      ends[j] = e;
    }
    return false;
  };
  ReaderLock lock(impl_->mu);
  std::unordered_map<const CompiledGraph*, bool> seen;
  std::vector<std::string> out;
  for (auto it = impl_->live_order.rbegin(); it != impl_->live_order.rend() && out.size() < limit; ++it) {
    const Impl::Model& m = impl_->models[it->second];
    if (!where.empty() && !where.matches(m.metadata)) continue;
    auto [cached, fresh] = seen.try_emplace(m.graph.get(), false);
    if (fresh) cached->second = holds_chain(*m.graph);
    if (cached->second) out.push_back(m.id);
  }
  return out;
}

}  // namespace cairn
