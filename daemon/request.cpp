#include "daemon/request.hpp"

#include <algorithm>
#include <climits>
#include <utility>

#include "daemon/fault_injection.hpp"
#include "daemon/peers/part_messages.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn::request {

using nlohmann::json;

namespace {

// The field readers every decoder uses; each error names the op and the field.

// A required string field.
Result<std::string> get_string(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_string())
    return invalid_argument("request '" + req.value("op", std::string()) + "': missing string field '" + field + "'");
  return it->get<std::string>();
}

// A required string field that must be a valid name (core/dtype.hpp valid_name); `what` names it
// in the error ("a model id").
Result<std::string> get_name(const json& req, const char* field, const char* what) {
  CAIRN_ASSIGN_OR_RETURN(std::string s, get_string(req, field));
  if (!valid_name(s))
    return invalid_argument(std::string(what) + " must be 1.." + std::to_string(kMaxNameBytes) +
                            " bytes of UTF-8 without NUL");
  return s;
}

// A required non-negative integer field.
Result<uint64_t> get_u64(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_number_unsigned())
    return invalid_argument("request '" + req.value("op", std::string()) + "': missing non-negative integer field '" +
                            field + "'");
  return it->get<uint64_t>();
}

// An optional integer field; dflt when absent or not an integer.
int64_t get_i64_or(const json& req, const char* field, int64_t dflt) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_number_integer()) return dflt;
  return it->get<int64_t>();
}

// A tensor's dtype and shape as a request gives them ("dtype", "shape"), and the bytes they need.
// `what` names the tensor in errors ("model 'a', tensor 'w'").
Result<TensorDesc> get_tensor_desc(const json& j, const std::string& what) {
  auto d = j.find("dtype");
  if (d == j.end() || !d->is_string()) return invalid_argument(what + ": missing string field 'dtype'");
  auto dt = dtype_from_name(d->get<std::string>());
  if (!dt) return invalid_argument(what + ": unknown dtype '" + d->get<std::string>() + "'");
  auto s = j.find("shape");
  if (s == j.end() || !s->is_array()) return invalid_argument(what + ": missing array field 'shape'");
  if (s->size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(what + ": " + std::to_string(s->size()) + " dimensions, at most " +
                            std::to_string(kMaxDims));
  TensorDesc t{*dt, {}, 0};
  for (const auto& v : *s) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return invalid_argument(what + ": shape entries must be non-negative integers");
    t.shape.push_back(v.get<int64_t>());
  }
  auto n = tensor_nbytes(t.dtype, t.shape);
  if (!n) return invalid_argument(what + ": shape is too large");
  t.nbytes = *n;
  return t;
}

}  // namespace

json shape_json(const std::vector<int64_t>& shape) {
  json a = json::array();
  for (auto d : shape) a.push_back(d);
  return a;
}

// ---- typed requests ----

namespace {

// An optional boolean field: dflt when absent; an error naming `what` and the field otherwise.
Result<bool> get_bool_or(const json& req, const char* field, bool dflt, const std::string& what) {
  auto it = req.find(field);
  if (it == req.end()) return dflt;
  if (!it->is_boolean()) return invalid_argument(what + ": '" + field + "' must be true or false");
  return it->get<bool>();
}

// The chunk hashes a client computed while it copied a tensor into its staging space: exactly one
// per chunk, each 32 lowercase hex digits.
Result<std::vector<ChunkHash>> client_hashes(const json& j, uint64_t nbytes, uint64_t chunk_size,
                                             const std::string& what) {
  const uint64_t want = chunk_count(nbytes, chunk_size);
  if (!j.is_array() || j.size() != want)
    return invalid_argument(what + ": 'hashes' must be an array of " + std::to_string(want) + " chunk hashes (" +
                            std::to_string(nbytes) + " bytes in chunks of " + std::to_string(chunk_size) + ")");
  std::vector<ChunkHash> out;
  out.reserve(want);
  for (size_t i = 0; i < j.size(); ++i) {
    auto h = j[i].is_string() ? ChunkHash::from_hex(j[i].get_ref<const std::string&>()) : std::nullopt;
    if (!h) return invalid_argument(what + ": hashes[" + std::to_string(i) + "] is not 32 lowercase hex digits");
    out.push_back(*h);
  }
  return out;
}

Result<Part> decode_part(const json& pj, const std::string& what) {
  if (!pj.is_object()) return invalid_argument(what + ": 'part' must be an object {index, of, timeout_ms}");
  CAIRN_ASSIGN_OR_RETURN(uint64_t index, get_u64(pj, "index"));
  CAIRN_ASSIGN_OR_RETURN(uint64_t of, get_u64(pj, "of"));
  uint64_t timeout_ms = kDefaultPartTimeoutMs;
  if (pj.contains("timeout_ms")) {
    CAIRN_ASSIGN_OR_RETURN(timeout_ms, get_u64(pj, "timeout_ms"));
  }
  if (of < 2 || of > kMaxModelParts)
    return invalid_argument(what + ": part.of is " + std::to_string(of) + "; a multi-part model has 2 to " +
                            std::to_string(kMaxModelParts) + " parts");
  if (index >= of)
    return invalid_argument(what + ": part.index " + std::to_string(index) + " is not below part.of " +
                            std::to_string(of));
  if (timeout_ms == 0 || timeout_ms > kMaxPartTimeoutMs)
    return invalid_argument(what + ": part.timeout_ms must be 1 to " + std::to_string(kMaxPartTimeoutMs));
  return Part{static_cast<uint32_t>(index), static_cast<uint32_t>(of), timeout_ms};
}

Result<CommitTensor> decode_commit_tensor(const json& tj, const std::string& id, const Edge& edge) {
  if (!tj.is_object()) return invalid_argument("model '" + id + "': each entry of 'tensors' must be an object");
  CommitTensor t;
  CAIRN_ASSIGN_OR_RETURN(t.name, get_name(tj, "name", "a tensor name"));
  const std::string what = "model '" + id + "', tensor '" + t.name + "'";
  CAIRN_ASSIGN_OR_RETURN(bool inherit, get_bool_or(tj, "inherit", false, what));
  if (inherit) {
    t.source = CommitTensor::Source::kInherit;
    return t;
  }
  CAIRN_ASSIGN_OR_RETURN(t.desc, get_tensor_desc(tj, what));
  if (tj.contains("space")) {
    t.source = CommitTensor::Source::kSpace;
    CAIRN_ASSIGN_OR_RETURN(t.space, get_u64(tj, "space"));
    if (auto h = tj.find("hashes"); h != tj.end()) {
      CAIRN_ASSIGN_OR_RETURN(t.hashes, client_hashes(*h, t.desc.nbytes, edge.chunk_size, what));
    }
    return t;
  }
  if (auto in = tj.find("inline"); in != tj.end()) {
    if (!in->is_array() || in->size() != 2 || !(*in)[0].is_number_unsigned() || !(*in)[1].is_number_unsigned())
      return invalid_argument(what + ": 'inline' must be [offset, length] into the frame's payload");
    t.source = CommitTensor::Source::kInline;
    t.inline_offset = (*in)[0].get<uint64_t>();
    t.inline_length = (*in)[1].get<uint64_t>();
    return t;
  }
  return invalid_argument(what + ": give one of 'space', 'inline' or 'inherit'");
}

// A device field ("device"): absent or null for the first device.
Result<std::optional<int>> get_device(const json& req, const char* op) {
  auto d = req.find("device");
  if (d == req.end() || d->is_null()) return std::optional<int>();
  if (!d->is_number_integer() || d->get<int64_t>() < INT32_MIN || d->get<int64_t>() > INT32_MAX)
    return invalid_argument(std::string("request '") + op + "': field 'device' must be an integer");
  return std::optional<int>(d->get<int>());
}

Result<std::vector<std::string>> get_tensor_names(const json& req, const char* op) {
  auto names = req.find("tensors");
  if (names == req.end() || !names->is_array())
    return invalid_argument(std::string("request '") + op + "': missing array field 'tensors'");
  std::vector<std::string> out;
  out.reserve(names->size());
  for (const auto& nj : *names) {
    if (!nj.is_string()) return invalid_argument(std::string("request '") + op + "': tensor names must be strings");
    out.push_back(nj.get<std::string>());
  }
  return out;
}

// The optional "progress" token of a long request.
Result<ProgressToken> get_progress(const json& req) {
  if (!req.contains("progress")) return ProgressToken{};
  CAIRN_ASSIGN_OR_RETURN(std::string token, get_name(req, "progress", "a progress token"));
  return ProgressToken{std::move(token)};
}

}  // namespace

Result<Allocate> decode_allocate(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(uint64_t n, get_u64(req, "nbytes"));
  return Allocate{n};
}

Result<Free> decode_free(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(uint64_t id, get_u64(req, "space"));
  return Free{id};
}

Result<Commit> decode_commit(const json& req, const Edge& edge) {
  Commit c;
  CAIRN_ASSIGN_OR_RETURN(c.id, get_name(req, "id", "a model id"));
  const std::string what = "model '" + c.id + "'";
  if (auto p = req.find("parent"); p != req.end() && !p->is_null()) {
    CAIRN_ASSIGN_OR_RETURN(c.parent, get_name(req, "parent", "a parent model id"));
  }
  if (auto d = req.find("durability"); d != req.end()) {
    auto target = d->is_string() ? durability_from_name(d->get_ref<const std::string&>()) : std::nullopt;
    if (!target)
      return invalid_argument("durability " + (d->is_string() ? "'" + d->get<std::string>() + "'" : d->dump()) +
                              " is not one of memory, local, global");
    c.durability = *target;
  }
  CAIRN_ASSIGN_OR_RETURN(c.wait, get_bool_or(req, "wait", true, what));
  // "ticket": false (with wait false) keeps no ticket: a pipelining client that has nothing to wait
  // for beyond the reply (durability memory) does not leave one per commit in the ticket book.
  CAIRN_ASSIGN_OR_RETURN(bool ticket, get_bool_or(req, "ticket", true, what));
  c.want_ticket = c.wait || ticket;
  if (auto m = req.find("metadata"); m != req.end()) {
    if (!m->is_object()) return invalid_argument(what + ": metadata must be a JSON object");
    c.metadata = *m;
  }
  if (auto a = req.find("architecture"); a != req.end() && !a->is_null()) {
    auto graph = parse_graph(*a);
    if (!graph.ok()) return graph.status().with_context(what);
    c.architecture = *a;
    c.graph = std::move(graph).value();
  }
  auto tensors = req.find("tensors");
  if (tensors == req.end() || !tensors->is_array()) return invalid_argument(what + ": missing array field 'tensors'");
  CAIRN_ASSIGN_OR_RETURN(c.inherit_all, get_bool_or(req, "inherit_all", false, what));
  if (auto p = req.find("part"); p != req.end()) {
    CAIRN_ASSIGN_OR_RETURN(c.part, decode_part(*p, what));
    if (c.inherit_all)
      return invalid_argument(what + ": inherit_all cannot be used in a part (name each inherited tensor)");
  }
  c.tensors.reserve(tensors->size());
  for (const auto& tj : *tensors) {
    CAIRN_ASSIGN_OR_RETURN(CommitTensor t, decode_commit_tensor(tj, c.id, edge));
    for (const CommitTensor& earlier : c.tensors)
      if (earlier.name == t.name) return invalid_argument(what + ": tensor '" + t.name + "' is given twice");
    c.tensors.push_back(std::move(t));
  }
  if (auto s = req.find("source_header"); s != req.end() && s->is_string()) c.source_header = s->get<std::string>();
  return c;
}

Result<Wait> decode_wait(const json& req) {
  Wait w;
  CAIRN_ASSIGN_OR_RETURN(w.ticket, get_u64(req, "ticket"));
  w.timeout_ms = get_i64_or(req, "timeout_ms", -1);
  return w;
}

json encode(const AllocateReply& r) { return json{{"space", r.space}, {"offset", r.offset}}; }

json encode(const CommitReply& r) {
  json out{{"id", r.id}};
  if (r.part) {
    out["part"] = r.part->index;
    out["of"] = r.part->of;
    out["assembled"] = r.assembled;
  }
  if (r.ticket) out["ticket"] = r.ticket;
  if (r.reached) out["reached"] = durability_name(*r.reached);
  return out;
}

json encode(const WaitReply& r) { return json{{"reached", durability_name(r.reached)}}; }

Result<Open> decode_open(const json& req) {
  Open o;
  CAIRN_ASSIGN_OR_RETURN(o.id, get_name(req, "id", "a model id"));
  CAIRN_ASSIGN_OR_RETURN(o.with_source_header, get_bool_or(req, "with_source_header", false, "request 'open'"));
  return o;
}

Result<Lease> decode_lease(const json& req) {
  Lease l;
  CAIRN_ASSIGN_OR_RETURN(l.id, get_name(req, "id", "a model id"));
  CAIRN_ASSIGN_OR_RETURN(l.contiguous, get_bool_or(req, "contiguous", false, "request 'lease'"));
  CAIRN_ASSIGN_OR_RETURN(l.tensors, get_tensor_names(req, "lease"));
  return l;
}

Result<Lease> decode_lease_device(const json& req) {
  Lease l;
  CAIRN_ASSIGN_OR_RETURN(l.device, get_device(req, "lease_device"));
  CAIRN_ASSIGN_OR_RETURN(l.id, get_name(req, "id", "a model id"));
  CAIRN_ASSIGN_OR_RETURN(l.tensors, get_tensor_names(req, "lease_device"));
  return l;
}

Result<Release> decode_release(const json* leases) {
  if (!leases || !leases->is_array()) return invalid_argument("request 'release': missing array field 'leases'");
  Release r;
  r.leases.reserve(leases->size());
  for (const auto& v : *leases) {
    if (!v.is_number_unsigned()) return invalid_argument("request 'release': lease ids must be non-negative integers");
    r.leases.push_back(v.get<uint64_t>());
  }
  return r;
}

Result<Prefetch> decode_prefetch(const json& req) {
  Prefetch p;
  if (auto all = req.find("all"); all != req.end()) {
    if (!all->is_boolean()) return invalid_argument("request 'prefetch': field 'all' must be true or false");
    p.all = all->get<bool>();
  }
  if (auto limit = req.find("timeout_ms"); p.all && limit != req.end()) {
    if (!limit->is_number_unsigned())
      return invalid_argument("request 'prefetch': field 'timeout_ms' must be a non-negative integer");
    p.timeout_ms = limit->get<uint64_t>();
  }
  if (auto tier = req.find("tier"); tier != req.end()) {
    if (!tier->is_string()) return invalid_argument("request 'prefetch': field 'tier' must be a string");
    if (*tier == "hbm") {
      p.tier = Prefetch::Tier::kHbm;
      CAIRN_ASSIGN_OR_RETURN(p.device, get_device(req, "prefetch"));
    } else if (*tier != "dram") {
      return invalid_argument(
          "prefetch --tier " + tier->get<std::string>() +
          ": cairn prefetches into dram or hbm (the burst buffer is filled by commits at durability "
          "local and by DRAM evictions)");
    }
  }
  CAIRN_ASSIGN_OR_RETURN(p.id, get_name(req, "id", "a model id"));
  CAIRN_ASSIGN_OR_RETURN(p.progress, get_progress(req));
  return p;
}

json encode(const OpenReply& r) {
  const ModelManifest& m = *r.model;
  json tensors = json::array();
  for (const auto& t : m.tensors)
    tensors.push_back(
        {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", shape_json(t.shape)}, {"nbytes", t.nbytes}});
  json out{{"id", m.id}, {"tensors", std::move(tensors)}, {"metadata", m.metadata}, {"created_ns", m.created_ns}};
  out["parent"] = m.parent.empty() ? json() : json(m.parent);
  if (r.with_source_header && m.source_header.size() > 8) out["source_header"] = m.source_header.substr(8);
  return out;
}

json encode(const LeaseReply& r) {
  json leases = json::array();
  for (const auto& g : r.leases) {
    json ex = json::array();
    for (const auto& [offset, length] : g.extents) ex.push_back({offset, length});
    leases.push_back({{"lease", g.lease}, {"extents", std::move(ex)}, {"nbytes", g.nbytes}});
  }
  return json{{"leases", std::move(leases)}, {"created_ns", r.created_ns}};
}

json encode(const LeaseDeviceReply& r) {
  json leases = json::array();
  for (const auto& g : r.leases)
    leases.push_back({{"lease", g.lease},
                      {"device", g.device},
                      {"handle", g.handle},
                      {"slab_bytes", g.slab_bytes},
                      {"offset", g.offset},
                      {"nbytes", g.nbytes},
                      {"hit", g.hit}});
  return json{{"leases", std::move(leases)}, {"created_ns", r.created_ns}, {"backend", r.backend}};
}

json encode(const PrefetchReply& r) {
  json out{{"bytes", r.bytes}};
  if (r.device) {
    out["tier"] = "hbm";
    out["device"] = *r.device;
  }
  return out;
}

json encode(const SyncReply& r) {
  return json{{"added", r.added},
              {"removed", r.removed},
              {"retired", r.retired},
              {"reloaded", r.reloaded},
              {"models", r.models}};
}

Result<PutTensor> decode_put_tensor(const json& req) {
  PutTensor p;
  CAIRN_ASSIGN_OR_RETURN(p.key, get_name(req, "key", "a tensor key"));
  CAIRN_ASSIGN_OR_RETURN(p.desc, get_tensor_desc(req, "tensor '" + p.key + "'"));
  if (req.contains("space")) {
    CAIRN_ASSIGN_OR_RETURN(p.space, get_u64(req, "space"));
  }
  return p;
}

Result<TensorKey> decode_tensor_key(const json& req) {
  TensorKey k;
  CAIRN_ASSIGN_OR_RETURN(k.key, get_name(req, "key", "a tensor key"));
  return k;
}

Result<PollTensor> decode_poll_tensor(const json& req) {
  PollTensor p;
  CAIRN_ASSIGN_OR_RETURN(p.key, get_name(req, "key", "a tensor key"));
  p.timeout_ms = get_i64_or(req, "timeout_ms", 0);
  return p;
}

json encode(const TensorInfoReply& r) {
  return json{{"dtype", dtype_name(r.dtype)}, {"shape", shape_json(r.shape)}, {"nbytes", r.nbytes}};
}

json encode(const TensorLeaseReply& r) {
  json out = encode(r.info);
  out["lease"] = r.lease;
  out["offset"] = r.offset;
  return out;
}

json encode(const PollTensorReply& r) { return json{{"found", r.found}}; }

// ---- administration, progress, fault injection, queries, hints ----

Result<List> decode_list(const json& req) {
  List l;
  CAIRN_ASSIGN_OR_RETURN(l.all, get_bool_or(req, "all", false, "request 'list'"));
  return l;
}

Result<ModelId> decode_model_id(const json& req) {
  ModelId m;
  CAIRN_ASSIGN_OR_RETURN(m.id, get_name(req, "id", "a model id"));
  return m;
}

Result<Tracked> decode_tracked(const json& req) {
  Tracked t;
  CAIRN_ASSIGN_OR_RETURN(t.progress, get_progress(req));
  return t;
}

Result<Fsck> decode_fsck(const json& req) {
  Fsck f;
  CAIRN_ASSIGN_OR_RETURN(f.verify, get_bool_or(req, "verify", true, "request 'fsck'"));
  CAIRN_ASSIGN_OR_RETURN(f.progress, get_progress(req));
  return f;
}

Result<Flush> decode_flush(const json& req) {
  Flush f;
  f.timeout_ms = get_i64_or(req, "timeout_ms", -1);
  CAIRN_ASSIGN_OR_RETURN(f.progress, get_progress(req));
  return f;
}

Result<ProgressQuery> decode_progress(const json& req) {
  ProgressQuery p;
  CAIRN_ASSIGN_OR_RETURN(p.id, get_name(req, "id", "a progress token"));
  return p;
}

Result<Fault> decode_fault(const json& req) {
  auto action = req.find("action");
  if (action == req.end() || !action->is_string())
    return invalid_argument("fault: field 'action' must be one of add, list, clear");
  Fault f;
  if (*action == "list") {
    f.action = Fault::Action::kList;
  } else if (*action == "clear") {
    f.action = Fault::Action::kClear;
  } else if (*action == "add") {
    f.action = Fault::Action::kAdd;
    auto rule = req.find("rule");
    if (rule == req.end())
      return invalid_argument("fault: field 'rule' is missing (an object {op, path, effect, ...})");
    CAIRN_ASSIGN_OR_RETURN(f.rule, parse_fault_rule(*rule));
  } else {
    return invalid_argument("fault: field 'action': " + action->dump(-1, ' ', true).substr(0, 64) +
                            " is not one of add, list, clear");
  }
  return f;
}

namespace {

constexpr std::pair<Query::Op, const char*> kQueryOps[] = {
    {Query::Op::kBestAncestor, "best_ancestor"},
    {Query::Op::kAncestors, "ancestors"},
    {Query::Op::kDescendants, "descendants"},
    {Query::Op::kLca, "lca"},
    {Query::Op::kPath, "path"},
    {Query::Op::kFind, "find"},
    {Query::Op::kTree, "tree"},
};

// A query's model field (a model id); the error names the query op and the field.
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

const char* query_op_name(Query::Op op) {
  for (const auto& [value, name] : kQueryOps)
    if (value == op) return name;
  return "?";
}

Result<Query> decode_query(const json& req) {
  auto qit = req.find("query");
  if (qit == req.end() || !qit->is_object()) return invalid_argument("request 'query': missing object field 'query'");
  const json& q = *qit;
  auto opit = q.find("op");
  if (opit == q.end() || !opit->is_string())
    return invalid_argument(
        "query: missing string field 'op' (best_ancestor, ancestors, descendants, lca, path, find, tree)");
  const std::string qop = opit->get<std::string>();
  Query out;
  bool known = false;
  for (const auto& [value, name] : kQueryOps)
    if (qop == name) {
      out.op = value;
      known = true;
    }
  if (!known)
    return invalid_argument(
        "query op '" + qop +
        "' is not supported (supported: best_ancestor, ancestors, descendants, lca, path, find, tree)");
  switch (out.op) {
    case Query::Op::kBestAncestor: {
      auto git = q.find("graph");
      if (git == q.end() || !git->is_object())
        return invalid_argument("query 'best_ancestor': missing object field 'graph' (an architecture graph)");
      auto g = parse_graph(*git);
      if (!g.ok()) return g.status().with_context("query 'best_ancestor'");
      out.graph = std::move(g).value();
      CAIRN_ASSIGN_OR_RETURN(out.where, query_where(q, qop));
      break;
    }
    case Query::Op::kAncestors:
    case Query::Op::kDescendants: {
      CAIRN_ASSIGN_OR_RETURN(out.model, query_model(q, qop, "model"));
      CAIRN_ASSIGN_OR_RETURN(out.depth, query_depth(q, qop));
      break;
    }
    case Query::Op::kTree: {
      CAIRN_ASSIGN_OR_RETURN(out.model, query_model(q, qop, "model"));
      break;
    }
    case Query::Op::kLca: {
      auto mit = q.find("models");
      if (mit == q.end() || !mit->is_array() || mit->size() != 2 || !(*mit)[0].is_string() || !(*mit)[1].is_string())
        return invalid_argument("query 'lca': 'models' must be an array of two model ids");
      out.a = (*mit)[0].get<std::string>();
      out.b = (*mit)[1].get<std::string>();
      break;
    }
    case Query::Op::kPath: {
      CAIRN_ASSIGN_OR_RETURN(out.from, query_model(q, qop, "from"));
      CAIRN_ASSIGN_OR_RETURN(out.to, query_model(q, qop, "to"));
      break;
    }
    case Query::Op::kFind: {
      auto pit = q.find("contains_path");
      if (pit == q.end() || !pit->is_array() || pit->empty())
        return invalid_argument("query 'find': 'contains_path' must be a non-empty array of layer types");
      for (const auto& t : *pit) {
        if (!t.is_string() || t.get_ref<const std::string&>().empty())
          return invalid_argument("query 'find': 'contains_path' entries must be non-empty strings (layer types)");
        out.contains_path.push_back(t.get<std::string>());
      }
      CAIRN_ASSIGN_OR_RETURN(out.where, query_where(q, qop));
      auto lit = q.find("limit");
      if (lit != q.end() && !lit->is_number_unsigned())
        return invalid_argument("query 'find': 'limit' must be a non-negative integer");
      if (lit != q.end()) out.limit = lit->get<size_t>();
      break;
    }
  }
  return out;
}

Result<Hint> decode_hint(const json& req) {
  auto hit = req.find("hint");
  if (hit == req.end()) return invalid_argument("request 'hint': missing object field 'hint' (docs/policy.md)");
  return parse_hint(*hit);
}

}  // namespace cairn::request
