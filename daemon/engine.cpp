#include "daemon/engine.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <set>

#include "core/graph.hpp"
#include "core/log.hpp"
#include "core/safetensors.hpp"

namespace cairn {
namespace {

using nlohmann::json;

constexpr int kLevelMemory = 0;
constexpr int kLevelLocal = 1;
constexpr int kLevelGlobal = 2;

// ---- request field readers: each error names the op and the field ----

Result<std::string> get_string(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_string())
    return invalid_argument("request '" + req.value("op", std::string()) + "': missing string field '" + field + "'");
  return it->get<std::string>();
}

Result<std::string> get_name(const json& req, const char* field, const char* what) {
  CAIRN_ASSIGN_OR_RETURN(std::string s, get_string(req, field));
  if (!valid_name(s))
    return invalid_argument(std::string(what) + " must be 1.." + std::to_string(kMaxNameBytes) +
                            " bytes of UTF-8 without NUL");
  return s;
}

Result<uint64_t> get_u64(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_number_unsigned())
    return invalid_argument("request '" + req.value("op", std::string()) + "': missing non-negative integer field '" +
                            field + "'");
  return it->get<uint64_t>();
}

int64_t get_i64_or(const json& req, const char* field, int64_t dflt) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_number_integer()) return dflt;
  return it->get<int64_t>();
}

struct TensorDesc {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

Result<TensorDesc> get_tensor_desc(const json& j, const std::string& what) {
  auto d = j.find("dtype");
  if (d == j.end() || !d->is_string()) return invalid_argument(what + ": missing string field 'dtype'");
  auto dt = dtype_from_name(d->get<std::string>());
  if (!dt) return invalid_argument(what + ": unknown dtype '" + d->get<std::string>() + "'");
  auto s = j.find("shape");
  if (s == j.end() || !s->is_array()) return invalid_argument(what + ": missing array field 'shape'");
  if (s->size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(what + ": " + std::to_string(s->size()) + " dimensions, at most " + std::to_string(kMaxDims));
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

json shape_json(const std::vector<int64_t>& shape) {
  json a = json::array();
  for (auto d : shape) a.push_back(d);
  return a;
}

int durability_level(const std::string& d) {
  if (d == "memory") return 0;
  if (d == "local") return 1;
  if (d == "global") return 2;
  return -1;
}

const char* level_name(int level) {
  static const char* kNames[] = {"memory", "local", "global"};
  return level >= 0 && level <= 2 ? kNames[level] : "none";
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<Engine>> Engine::create(const Config& config, EngineOptions options) {
  CAIRN_ASSIGN_OR_RETURN(auto repo, Repository::open(config.repository, config.chunk_size, options.repository_fs));
  CAIRN_ASSIGN_OR_RETURN(auto policy, make_eviction_policy(config.policy.eviction));
  CAIRN_ASSIGN_OR_RETURN(auto admission, make_admission_policy(config.policy.admission));
  CAIRN_ASSIGN_OR_RETURN(auto dram, DramTier::create(config.tiers.dram.capacity, std::move(policy),
                                                     "cairn-arena-" + std::to_string(::getpid())));
  dram->set_backpressure_timeout(options.backpressure_timeout);
  std::unique_ptr<NvmeTier> nvme;
  if (config.tiers.nvme.capacity > 0) {
    NvmeTier::Options o;
    o.path = config.tiers.nvme.path;
    o.capacity = config.tiers.nvme.capacity;
    o.persistent = config.tiers.nvme.persistent;
    o.fs = options.nvme_fs;
    CAIRN_ASSIGN_OR_RETURN(o.policy, make_eviction_policy(config.policy.eviction));
    auto opened = NvmeTier::open(std::move(o));
    if (!opened.is_ok()) return opened.status().with_context("opening the burst buffer (tiers.nvme.path " + config.tiers.nvme.path + ")");
    nvme = std::move(opened).value();
  }
  std::unique_ptr<Engine> engine(
      new Engine(config, std::move(repo), std::move(dram), std::move(nvme), std::move(admission)));
  CAIRN_RETURN_IF_ERROR(engine->load_catalog());
  engine->recover_from_nvme();
  return engine;
}

GraphHandle Engine::graph_for(const ModelManifest& m, const Graph* parsed, const ModelManifest* parent) {
  if (parsed) return catalog_.compile(*parsed);
  if (!m.architecture.is_null()) {
    auto g = parse_graph(m.architecture);
    if (g.is_ok()) return catalog_.compile(*g);
    CAIRN_LOG_WARN("model '{}': its stored architecture does not parse ({}); using one derived from its tensors", m.id,
                   g.status().to_string());
  }
  // A model with exactly its parent's tensor layout shares its parent's graph (the common case
  // of a metadata-only commit, which then costs no graph work at all). A collected parent has no
  // tensors left, so its children derive their own.
  GraphHandle pg = parent && !parent->collected ? catalog_.graph_of(parent->id) : nullptr;
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
  return catalog_.compile(graph_from_tensors(shapes));
}

Status Engine::load_catalog() {
  for (const std::string& id : repo_->list()) {
    CAIRN_ASSIGN_OR_RETURN(auto m, repo_->get_shared(id));
    std::shared_ptr<const ModelManifest> parent;
    if (!m->parent.empty()) {
      CAIRN_ASSIGN_OR_RETURN(parent, repo_->get_shared(m->parent));
    }
    CAIRN_RETURN_IF_ERROR(
        catalog_.add(m->id, m->parent, graph_for(*m, nullptr, parent.get()), m->metadata, m->retired_ns != 0));
    last_created_ns_ = std::max(last_created_ns_, m->created_ns);
    if (m->retired_ns == 0) {
      std::lock_guard lock(mu_);
      count_references(*m, +1);
    }
  }
  return Status::ok();
}

Engine::Engine(Config config, std::unique_ptr<Repository> repo, std::unique_ptr<DramTier> dram,
               std::unique_ptr<NvmeTier> nvme, std::unique_ptr<AdmissionPolicy> admission)
    : config_(std::move(config)), repo_(std::move(repo)), dram_(std::move(dram)), nvme_(std::move(nvme)) {
  tiers_ = std::make_unique<TierManager>(*dram_, nvme_.get(), *repo_, std::move(admission));
  local_flusher_ = std::thread([this] { local_loop(); });
  global_flusher_ = std::thread([this] { global_loop(); });
}

Engine::~Engine() {
  drain();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  flush_cv_.notify_all();
  named_cv_.notify_all();
  ticket_cv_.notify_all();
  if (local_flusher_.joinable()) local_flusher_.join();
  if (global_flusher_.joinable()) global_flusher_.join();
  tiers_.reset();
  if (nvme_) {
    Status st = nvme_->close();
    if (!st.is_ok()) CAIRN_LOG_ERROR("closing the burst buffer: {}", st.to_string());
  }
}

void Engine::drain() {
  std::unique_lock lock(mu_);
  ticket_cv_.wait(lock, [&] { return pending_.empty(); });
}

bool Engine::drain_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return ticket_cv_.wait_for(lock, timeout, [&] { return pending_.empty(); });
}

void Engine::count_references(const ModelManifest& m, int delta) {
  // REQUIRES: mu_ held.
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks) {
      uint32_t& n = chunk_refs_[c.hash];
      n = delta > 0 ? n + 1 : (n > 0 ? n - 1 : 0);
      dram_->hint_references(c.hash, n);
      if (n == 0) chunk_refs_.erase(c.hash);
    }
}

void Engine::recover_from_nvme() {
  if (!nvme_) return;
  const auto& report = nvme_->open_report();
  // Chunks whose CLEAN record was lost in the crash.
  for (const ChunkHash& h : nvme_->dirty_chunks())
    if (repo_->locate(h)) nvme_->mark_clean(h);
  for (const auto& p : report.pending) {
    json j = json::parse(p.manifest_json, nullptr, false);
    auto parsed = j.is_discarded() ? Result<ModelManifest>(corruption("not JSON")) : manifest_from_json(j, false);
    if (!parsed.is_ok()) {
      CAIRN_LOG_ERROR("burst buffer: model '{}' committed `local` has an unreadable record ({}); it is lost", p.id,
                      parsed.status().to_string());
      ++lost_models_;
      (void)nvme_->model_done(p.id);
      continue;
    }
    auto m = std::make_shared<ModelManifest>(std::move(parsed).value());
    if (repo_->contains(m->id)) {  // it reached the repository; only the DONE record was lost
      (void)nvme_->model_done(m->id);
      continue;
    }
    std::string missing;
    for (const auto& t : m->tensors)
      for (const auto& c : t.chunks)
        if (missing.empty() && !nvme_->contains(c.hash) && !repo_->locate(c.hash))
          missing = "tensor '" + t.name + "' chunk " + c.hash.hex();
    std::shared_ptr<const ModelManifest> parent;
    if (missing.empty() && !m->parent.empty()) {
      auto pm = find_model(m->parent);
      if (pm.is_ok()) parent = *pm;
      else missing = "its parent '" + m->parent + "'";
    }
    if (!missing.empty()) {
      CAIRN_LOG_ERROR("burst buffer: model '{}' committed `local` cannot be recovered: {} has no intact copy", m->id,
                      missing);
      ++lost_models_;
      (void)nvme_->model_done(m->id);
      continue;
    }
    std::lock_guard lock(mu_);
    Status added = catalog_.add(m->id, m->parent, graph_for(*m, nullptr, parent.get()), m->metadata);
    if (!added.is_ok()) {
      CAIRN_LOG_ERROR("burst buffer: model '{}': {}", m->id, added.to_string());
      continue;
    }
    last_created_ns_ = std::max(last_created_ns_, m->created_ns);
    count_references(*m, +1);
    PendingModel pm;
    pm.manifest = m;
    pm.seq = next_seq_++;
    pm.needs_local = false;
    pm.local_done = true;
    pm.on_nvme = true;
    pending_[m->id] = pm;
    flush_order_.push_back(m->id);
    ++recovered_models_;
    CAIRN_LOG_INFO("burst buffer: recovered model '{}' (committed `local` before a crash); writing it to the repository",
                   m->id);
  }
  flush_cv_.notify_all();
}

Response Engine::handle(Session& session, const json& request, std::vector<uint8_t>& blob) {
  Response r;
  std::string op;
  Result<json> result = [&]() -> Result<json> {
    try {
      // The server's decoder guarantees an object with a string "op"; in-process callers may not.
      auto it = request.is_object() ? request.find("op") : request.end();
      if (it == request.end() || !it->is_string())
        return invalid_argument("a request must be a JSON object with a string field 'op'");
      op = it->get<std::string>();
      // Any request may carry leases the client is done with (saving it a round trip).
      if (auto rel = request.find("release"); rel != request.end() && op != "release") {
        auto released = op_release(session, json{{"op", "release"}, {"leases", *rel}});
        if (!released.is_ok()) return released.status();
      }
      return dispatch(session, op, request, blob, r.blob);
    } catch (const std::exception& e) {
      return internal_error(std::string("request '") + op + "' failed: " + e.what());
    }
  }();
  if (!result.is_ok()) {
    r.body = json{{"status", static_cast<int>(result.status().code())}, {"error", result.status().message()}};
    r.blob.clear();
    return r;
  }
  r.body = std::move(result).value();
  r.body["status"] = 0;
  return r;
}

Result<json> Engine::dispatch(Session& s, const std::string& op, const json& req, std::vector<uint8_t>& blob,
                              std::vector<uint8_t>& /*out_blob*/) {
  if (op == "hello") return op_hello(s, req);
  if (op == "allocate") return op_allocate(s, req);
  if (op == "free") return op_free(s, req);
  if (op == "put_tensor") return op_put_tensor(s, req, blob);
  if (op == "tensor_info") return op_tensor_info(req);
  if (op == "lease_tensor") return op_lease_tensor(s, req);
  if (op == "poll_tensor") return op_poll_tensor(req);
  if (op == "delete_tensor") return op_delete_tensor(req);
  if (op == "commit") return op_commit(s, req, blob);
  if (op == "wait") return op_wait(req);
  if (op == "open") return op_open(req);
  if (op == "lease") return op_lease(s, req);
  if (op == "release") return op_release(s, req);
  if (op == "prefetch") return op_prefetch(req);
  if (op == "list") return op_list(req);
  if (op == "show") return op_show(req);
  if (op == "stats") return op_stats(req);
  if (op == "remove") return op_remove(req);
  if (op == "query") return op_query(req);
  if (op == "gc") return op_gc(req);
  if (op == "fsck") return op_fsck(req);
  if (op == "flush") return op_flush(req);
  if (op == "ping") return json::object();
  return invalid_argument("unknown request op '" + op + "' (client and daemon from different releases?)");
}

Result<json> Engine::op_hello(Session& s, const json& /*req*/) {
  if (s.id == 0) s.id = next_session_++;
  return json{{"arena_size", dram_->arena_size()},
              {"chunk_size", repo_->chunk_size()},
              {"pid", static_cast<int64_t>(::getpid())},
              {"session", s.id},
              {"version", "0.1.0"}};
}

// ---- staging space ----

Result<json> Engine::op_allocate(Session& s, const json& req) {
  CAIRN_ASSIGN_OR_RETURN(uint64_t n, get_u64(req, "nbytes"));
  if (n > dram_->arena_size())
    return no_space("a tensor of " + std::to_string(n) + " bytes does not fit the DRAM arena of " +
                    std::to_string(dram_->arena_size()) + " bytes (raise tiers.dram.capacity)");
  CAIRN_ASSIGN_OR_RETURN(uint64_t off, dram_->allocate(n));
  uint64_t id = s.next_id++;
  s.staging[id] = Extent{off, n};
  return json{{"space", id}, {"offset", off}};
}

Result<json> Engine::op_free(Session& s, const json& req) {
  CAIRN_ASSIGN_OR_RETURN(uint64_t id, get_u64(req, "space"));
  auto it = s.staging.find(id);
  if (it == s.staging.end()) return not_found("no staging space " + std::to_string(id) + " in this connection");
  dram_->release(it->second.offset, it->second.length);
  s.staging.erase(it);
  return json::object();
}

// ---- named tensors ----

Result<json> Engine::op_put_tensor(Session& s, const json& req, std::vector<uint8_t>& blob) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  CAIRN_ASSIGN_OR_RETURN(TensorDesc d, get_tensor_desc(req, "tensor '" + key + "'"));
  Extent ext;
  if (req.contains("space")) {
    CAIRN_ASSIGN_OR_RETURN(uint64_t id, get_u64(req, "space"));
    auto it = s.staging.find(id);
    if (it == s.staging.end()) return not_found("no staging space " + std::to_string(id) + " in this connection");
    if (it->second.length != d.nbytes)
      return invalid_argument("tensor '" + key + "': staging space holds " + std::to_string(it->second.length) +
                              " bytes but dtype and shape need " + std::to_string(d.nbytes));
    ext = it->second;
    s.staging.erase(it);
  } else {
    if (blob.size() != d.nbytes)
      return invalid_argument("tensor '" + key + "': " + std::to_string(blob.size()) + " bytes sent but dtype and shape need " +
                              std::to_string(d.nbytes));
    CAIRN_ASSIGN_OR_RETURN(uint64_t off, dram_->allocate(d.nbytes));
    if (d.nbytes) std::memcpy(dram_->base() + off, blob.data(), d.nbytes);
    ext = Extent{off, d.nbytes};
  }
  {
    std::lock_guard lock(mu_);
    auto it = named_.find(key);
    if (it != named_.end()) {
      if (it->second.pins > 0) orphaned_named_.push_back(it->second);
      else dram_->release(it->second.extent.offset, it->second.extent.length);
      named_.erase(it);
    }
    named_.emplace(key, NamedTensor{d.dtype, d.shape, d.nbytes, ext, 0, ++named_generation_});
  }
  named_cv_.notify_all();
  return json::object();
}

Result<json> Engine::op_tensor_info(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  return json{{"dtype", dtype_name(it->second.dtype)}, {"shape", shape_json(it->second.shape)}, {"nbytes", it->second.nbytes}};
}

Result<json> Engine::op_lease_tensor(Session& s, const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  ++it->second.pins;
  uint64_t id = s.next_id++;
  Session::Lease lease;
  lease.named_key = key;
  lease.named_generation = it->second.generation;
  s.leases[id] = std::move(lease);
  return json{{"lease", id},
              {"offset", it->second.extent.offset},
              {"nbytes", it->second.nbytes},
              {"dtype", dtype_name(it->second.dtype)},
              {"shape", shape_json(it->second.shape)}};
}

Result<json> Engine::op_poll_tensor(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  int64_t timeout_ms = get_i64_or(req, "timeout_ms", 0);
  std::unique_lock lock(mu_);
  auto present = [&] { return stopping_ || named_.count(key) > 0; };
  if (timeout_ms < 0) named_cv_.wait(lock, present);
  else named_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), present);
  return json{{"found", named_.count(key) > 0}};
}

Result<json> Engine::op_delete_tensor(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  if (it->second.pins > 0) orphaned_named_.push_back(it->second);
  else dram_->release(it->second.extent.offset, it->second.extent.length);
  named_.erase(it);
  return json::object();
}

// ---- models: commit ----

Result<json> Engine::op_commit(Session& s, const json& req, std::vector<uint8_t>& blob) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::string parent;
  if (req.contains("parent") && !req["parent"].is_null()) {
    CAIRN_ASSIGN_OR_RETURN(parent, get_name(req, "parent", "a parent model id"));
  }
  std::string durability = req.value("durability", std::string("global"));
  int target = durability_level(durability);
  if (target < 0) return invalid_argument("durability '" + durability + "' is not one of memory, local, global");
  bool wait = req.value("wait", true);
  json metadata = req.contains("metadata") ? req["metadata"] : json::object();
  if (!metadata.is_object()) return invalid_argument("model '" + id + "': metadata must be a JSON object");
  json architecture = req.contains("architecture") ? req["architecture"] : json();
  std::optional<Graph> parsed_graph;
  if (!architecture.is_null()) {
    auto graph = parse_graph(architecture);
    if (!graph.is_ok()) return graph.status().with_context("model '" + id + "'");
    parsed_graph = std::move(graph).value();
  }
  auto tensors_it = req.find("tensors");
  if (tensors_it == req.end() || !tensors_it->is_array())
    return invalid_argument("model '" + id + "': missing array field 'tensors'");
  const bool inherit_all = req.value("inherit_all", false);
  // Until the model is registered: gc must not free a chunk this commit references.
  std::shared_lock gc_lock(gc_mu_);

  // Reserve the id so that two concurrent commits of one id cannot both succeed.
  {
    std::lock_guard lock(mu_);
    if (pending_.count(id) || committing_.count(id) || repo_->contains(id))
      return already_exists("model '" + id + "' already exists (model ids are immutable; choose a new id)");
    committing_[id] = parent;
  }
  struct Unreserve {
    Engine* e;
    std::string id;
    ~Unreserve() {
      std::lock_guard lock(e->mu_);
      e->committing_.erase(id);
    }
  } unreserve{this, id};

  std::shared_ptr<const ModelManifest> parent_manifest;
  if (!parent.empty()) {
    auto pm = find_model(parent);
    if (!pm.is_ok()) return not_found("parent model '" + parent + "' of '" + id + "' does not exist");
    parent_manifest = *pm;
  }

  // Pass 1: validate everything, touching nothing.
  struct Planned {
    std::string name;
    TensorDesc desc;
    enum { kSpace, kInline, kInherit } source;
    uint64_t space = 0;
    uint64_t blob_offset = 0;
    const TensorManifest* inherited = nullptr;
  };
  std::vector<Planned> plan;
  std::set<std::string> names;
  std::set<uint64_t> spaces;
  for (const auto& tj : *tensors_it) {
    if (!tj.is_object()) return invalid_argument("model '" + id + "': each entry of 'tensors' must be an object");
    CAIRN_ASSIGN_OR_RETURN(std::string name, get_name(tj, "name", "a tensor name"));
    if (!names.insert(name).second) return invalid_argument("model '" + id + "': tensor '" + name + "' is given twice");
    Planned p{name, {}, Planned::kSpace};
    std::string what = "model '" + id + "', tensor '" + name + "'";
    if (tj.value("inherit", false)) {
      if (!parent_manifest) return invalid_argument(what + ": inherited, but the model has no parent");
      p.inherited = parent_manifest->find(name);
      if (!p.inherited) return not_found(what + ": inherited, but parent '" + parent + "' has no such tensor");
      p.source = Planned::kInherit;
      p.desc = TensorDesc{p.inherited->dtype, p.inherited->shape, p.inherited->nbytes};
    } else {
      CAIRN_ASSIGN_OR_RETURN(p.desc, get_tensor_desc(tj, what));
      if (tj.contains("space")) {
        CAIRN_ASSIGN_OR_RETURN(p.space, get_u64(tj, "space"));
        auto it = s.staging.find(p.space);
        if (it == s.staging.end() || !spaces.insert(p.space).second)
          return not_found(what + ": no staging space " + std::to_string(p.space) + " in this connection");
        if (it->second.length != p.desc.nbytes)
          return invalid_argument(what + ": staging space holds " + std::to_string(it->second.length) +
                                  " bytes but dtype and shape need " + std::to_string(p.desc.nbytes));
      } else if (tj.contains("inline")) {
        const json& in = tj["inline"];
        if (!in.is_array() || in.size() != 2 || !in[0].is_number_unsigned() || !in[1].is_number_unsigned())
          return invalid_argument(what + ": 'inline' must be [offset, length] into the frame's payload");
        p.source = Planned::kInline;
        p.blob_offset = in[0].get<uint64_t>();
        uint64_t len = in[1].get<uint64_t>();
        if (len != p.desc.nbytes || p.blob_offset > blob.size() || len > blob.size() - p.blob_offset)
          return invalid_argument(what + ": inline bytes [" + std::to_string(p.blob_offset) + ", +" + std::to_string(len) +
                                  ") do not match the payload of " + std::to_string(blob.size()) + " bytes or the " +
                                  std::to_string(p.desc.nbytes) + " bytes dtype and shape need");
      } else {
        return invalid_argument(what + ": give one of 'space', 'inline' or 'inherit'");
      }
    }
    plan.push_back(std::move(p));
  }
  if (inherit_all) {
    // Every parent tensor not given explicitly, in the parent's order: a metadata-only commit when
    // nothing else is given.
    if (!parent_manifest) return invalid_argument("model '" + id + "': 'inherit_all' needs a parent");
    for (const TensorManifest& t : parent_manifest->tensors) {
      if (names.count(t.name)) continue;
      Planned p{t.name, TensorDesc{t.dtype, t.shape, t.nbytes}, Planned::kInherit};
      p.inherited = &t;
      plan.push_back(std::move(p));
    }
  }

  // Pass 2: copy inline bytes into the arena (the only step that can still fail before chunks move).
  std::vector<Extent> inline_extents;
  for (auto& p : plan) {
    if (p.source != Planned::kInline) continue;
    auto off = dram_->allocate(p.desc.nbytes);
    if (!off.is_ok()) {
      for (auto& e : inline_extents) dram_->release(e.offset, e.length);
      return off.status();
    }
    if (p.desc.nbytes) std::memcpy(dram_->base() + *off, blob.data() + p.blob_offset, p.desc.nbytes);
    inline_extents.push_back(Extent{*off, p.desc.nbytes});
  }

  // Pass 3: hash in place and adopt the chunks into the DRAM tier (deduplicating).
  auto m = std::make_shared<ModelManifest>();
  m->id = id;
  m->parent = parent;
  m->metadata = metadata;
  m->architecture = architecture;
  if (req.contains("source_header") && req["source_header"].is_string()) {
    std::string js = req["source_header"].get<std::string>();
    std::string prefix(8, '\0');
    uint64_t n = js.size();
    for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    m->source_header = prefix + js;
  }
  const uint64_t chunk_size = repo_->chunk_size();
  // Where each new tensor's bytes are, then every chunk hashed (on several threads when there is
  // much to hash: the hash is the part of a big commit's blocking time that is not the copy).
  std::vector<Extent> tensor_ext(plan.size());
  std::vector<std::pair<uint64_t, uint64_t>> to_hash;  // (arena offset, length)
  {
    size_t inline_index = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      const Planned& p = plan[i];
      if (p.source == Planned::kInherit) continue;
      tensor_ext[i] = p.source == Planned::kSpace ? s.staging[p.space] : inline_extents[inline_index++];
      for (uint64_t off = 0; off < p.desc.nbytes; off += chunk_size)
        to_hash.emplace_back(tensor_ext[i].offset + off, std::min(chunk_size, p.desc.nbytes - off));
    }
  }
  std::vector<ChunkHash> hashes(to_hash.size());
  {
    uint64_t total = 0;
    for (const auto& [o, l] : to_hash) total += l;
    const size_t threads = total >= (64ull << 20) && to_hash.size() > 1
                               ? std::min<size_t>({4, to_hash.size(), std::max(1u, std::thread::hardware_concurrency())})
                               : 1;
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next++) < to_hash.size();)
        hashes[k] = hash_bytes(dram_->base() + to_hash[k].first, to_hash[k].second);
    };
    std::vector<std::thread> helpers;
    for (size_t h = 1; h < threads; ++h) helpers.emplace_back(work);
    work();
    for (auto& th : helpers) th.join();
  }
  size_t hash_index = 0;
  std::vector<ChunkHash> pinned;
  for (size_t pi = 0; pi < plan.size(); ++pi) {
    auto& p = plan[pi];
    if (p.source == Planned::kInherit) {
      m->tensors.push_back(*p.inherited);
      continue;
    }
    const Extent ext = tensor_ext[pi];
    if (p.source == Planned::kSpace) s.staging.erase(p.space);
    TensorManifest t;
    t.name = p.name;
    t.dtype = p.desc.dtype;
    t.shape = p.desc.shape;
    t.nbytes = p.desc.nbytes;
    if (t.nbytes == 0) dram_->release(ext.offset, 0);
    for (uint64_t off = 0; off < t.nbytes; off += chunk_size) {
      uint64_t len = std::min(chunk_size, t.nbytes - off);
      ChunkHash h = hashes[hash_index++];
      bool dirty = tiers_->only_in_dram(h);
      dram_->adopt(h, ext.offset + off, len, dirty);
      pinned.push_back(h);
      ChunkRef ref;
      ref.hash = h;
      ref.length = len;
      if (auto stored = repo_->locate(h)) ref = *stored;
      t.chunks.push_back(ref);
    }
    m->tensors.push_back(std::move(t));
  }

  // Register as pending (visible now) and hand it to the flusher, which writes models in commit
  // order so that a parent always reaches the repository before its children.
  GraphHandle graph = graph_for(*m, parsed_graph ? &*parsed_graph : nullptr, parent_manifest.get());
  uint64_t ticket;
  {
    std::lock_guard lock(mu_);
    Status added = catalog_.add(id, parent, std::move(graph), metadata);
    if (!added.is_ok()) {
      for (const auto& h : pinned) dram_->unpin(h);
      return added.with_context("registering model '" + id + "' in the catalog");
    }
    // The model's identity for client manifest caches: unique per commit, even when an id that gc
    // deleted is used again.
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
    last_created_ns_ = std::max<int64_t>(now, last_created_ns_ + 1);
    m->created_ns = last_created_ns_;
    ticket = next_ticket_++;
    tickets_[ticket] = Ticket{target, kLevelMemory, Status::ok()};
    PendingModel pm;
    pm.manifest = m;
    pm.ticket = ticket;
    pm.seq = next_seq_++;
    // memory and local commits go through the burst buffer (DeepFreeze's levels); a global commit's
    // caller waits for the repository anyway, so its bytes go there directly.
    pm.needs_local = nvme_ && target < kLevelGlobal;
    pending_[id] = pm;
    flush_order_.push_back(id);
    if (pm.needs_local) local_queue_.push_back(id);
    count_references(*m, +1);
  }
  flush_cv_.notify_all();
  for (const auto& h : pinned) dram_->unpin(h);
  gc_lock.unlock();

  json out{{"id", id}};
  if (!wait) {
    // The caller waits later with the ticket; it is forgotten when the connection ends.
    s.tickets.insert(ticket);
    out["ticket"] = ticket;
    out["reached"] = level_name(kLevelMemory);
    return out;
  }
  std::unique_lock lock(mu_);
  ticket_cv_.wait(lock, [&] {
    const Ticket& t = tickets_[ticket];
    return t.reached >= t.target || !t.error.is_ok();
  });
  Ticket t = tickets_[ticket];
  tickets_.erase(ticket);
  if (!t.error.is_ok()) return t.error;
  out["reached"] = level_name(t.reached);
  return out;
}

void Engine::finish_ticket(uint64_t id, int reached, const Status& error) {
  // REQUIRES: mu_ held.
  auto it = tickets_.find(id);
  if (it == tickets_.end()) return;
  it->second.reached = reached;
  it->second.error = error;
}

namespace {
std::vector<ChunkRef> all_chunks(const ModelManifest& m) {
  std::vector<ChunkRef> out;
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks) out.push_back(c);
  return out;
}
}  // namespace

void Engine::local_loop() {
  // Background work: requests (a commit acknowledged at memory, a read) go first on a busy node.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    std::shared_ptr<const ModelManifest> m;
    uint64_t seq = 0;
    {
      std::unique_lock lock(mu_);
      flush_cv_.wait(lock, [&] { return stopping_ || !local_queue_.empty(); });
      if (local_queue_.empty()) return;  // stopping and drained
      const std::string id = local_queue_.front();
      local_queue_.pop_front();
      m = pending_[id].manifest;
      seq = pending_[id].seq;
    }
    // The chunks only DRAM holds go to the burst buffer, then the model's record: after both are on
    // the device the model survives a crash of the daemon.
    Status st = tiers_->write_local(all_chunks(*m));
    if (st.is_ok()) st = nvme_->put_model(seq, m->id, manifest_to_json(*m).dump());
    if (!st.is_ok())
      CAIRN_LOG_WARN("model '{}': the burst buffer did not take it ({}); it goes to the repository directly", m->id,
                     st.to_string());
    {
      std::lock_guard lock(mu_);
      PendingModel& pm = pending_[m->id];
      pm.local_done = true;
      pm.on_nvme = st.is_ok();
      if (st.is_ok()) {
        auto it = tickets_.find(pm.ticket);
        if (it != tickets_.end()) it->second.reached = std::max(it->second.reached, kLevelLocal);
      }
    }
    flush_cv_.notify_all();
    ticket_cv_.notify_all();
  }
}

void Engine::global_loop() {
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    std::shared_ptr<const ModelManifest> m;
    uint64_t ticket = 0;
    bool on_nvme = false;
    {
      // Commit order, so that a parent always reaches the repository before its children; a model
      // still in its local stage holds back the ones after it.
      std::unique_lock lock(mu_);
      auto ready = [&] {
        if (flush_order_.empty()) return false;
        const PendingModel& pm = pending_[flush_order_.front()];
        return !pm.needs_local || pm.local_done;
      };
      flush_cv_.wait(lock, [&] { return (stopping_ && flush_order_.empty()) || ready(); });
      if (flush_order_.empty()) return;  // stopping and drained
      const std::string id = flush_order_.front();
      flush_order_.pop_front();
      m = pending_[id].manifest;
      ticket = pending_[id].ticket;
      on_nvme = pending_[id].on_nvme;
    }
    ModelManifest copy = *m;
    uint64_t new_bytes = 0;
    Status st;
    {
      TierManager::Source source(*tiers_);
      st = repo_->commit(copy, [&](const ChunkHash& h, uint64_t length) -> Result<const void*> {
        new_bytes += length;
        return source.get(h, length);
      });
    }
    if (st.is_ok()) {
      tiers_->stored_globally(all_chunks(copy));
      if (on_nvme) (void)nvme_->model_done(copy.id);
    } else {
      CAIRN_LOG_ERROR("flushing model '{}' to the repository failed: {}", copy.id, st.to_string());
      if (on_nvme) (void)nvme_->model_done(copy.id);
    }
    {
      std::lock_guard lock(mu_);
      pfs_bytes_written_ += st.is_ok() ? new_bytes : 0;
      pending_.erase(copy.id);
      if (!st.is_ok()) {
        // Gone from queries; forgotten unless children (whose flushes fail in turn) name it.
        (void)catalog_.retire(copy.id);
        (void)catalog_.erase(copy.id);
        count_references(copy, -1);
        // The model is gone; chunks no other pending model needs may be evicted again.
        std::set<ChunkHash> still_needed;
        for (const auto& [pid, pm] : pending_)
          for (const auto& t : pm.manifest->tensors)
            for (const auto& c : t.chunks) still_needed.insert(c.hash);
        for (const auto& t : copy.tensors)
          for (const auto& c : t.chunks)
            if (!still_needed.count(c.hash) && !repo_->locate(c.hash)) {
              dram_->mark_clean(c.hash);
              if (nvme_) nvme_->remove(c.hash);
            }
      }
      finish_ticket(ticket, st.is_ok() ? kLevelGlobal : kLevelMemory, st);
    }
    flush_cv_.notify_all();
    ticket_cv_.notify_all();
  }
}

Result<json> Engine::op_wait(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(uint64_t id, get_u64(req, "ticket"));
  int64_t timeout_ms = get_i64_or(req, "timeout_ms", -1);
  std::unique_lock lock(mu_);
  if (!tickets_.count(id)) return not_found("no ticket " + std::to_string(id) + " (already waited for?)");
  auto done = [&] {
    const Ticket& t = tickets_[id];
    return stopping_ || t.reached >= t.target || !t.error.is_ok();
  };
  bool ok = timeout_ms < 0 ? (ticket_cv_.wait(lock, done), true)
                           : ticket_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), done);
  Ticket t = tickets_[id];
  if (!ok || (t.reached < t.target && t.error.is_ok()))
    return timed_out("ticket " + std::to_string(id) + " has reached '" + level_name(t.reached) + "', not '" +
                     level_name(t.target) + "', after " + std::to_string(timeout_ms) + " ms");
  tickets_.erase(id);
  if (!t.error.is_ok()) return t.error;
  return json{{"reached", level_name(t.reached)}};
}

// ---- models: reading ----

Result<std::shared_ptr<const ModelManifest>> Engine::find_model(const std::string& id) const {
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    if (it != pending_.end()) return it->second.manifest;
  }
  auto m = repo_->get_shared(id);
  if (!m.is_ok()) return not_found("model '" + id + "' does not exist (see `cairn ls`)");
  if ((*m)->collected)
    return not_found("model '" + id + "' was retired and its data collected by `cairn gc`; only its lineage remains");
  return std::move(m).value();
}

Result<json> Engine::op_open(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  CAIRN_ASSIGN_OR_RETURN(auto m, find_model(id));
  json tensors = json::array();
  for (const auto& t : m->tensors)
    tensors.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", shape_json(t.shape)}, {"nbytes", t.nbytes}});
  json out{{"id", m->id}, {"tensors", std::move(tensors)}, {"metadata", m->metadata}, {"created_ns", m->created_ns}};
  out["parent"] = m->parent.empty() ? json() : json(m->parent);
  if (req.value("with_source_header", false) && m->source_header.size() > 8)
    out["source_header"] = m->source_header.substr(8);
  return out;
}

void Engine::readahead(const std::vector<const TensorManifest*>& tensors) {
  // Tell the kernel about every repository range a request will read before reading the first, so
  // that the reads find their bytes in flight (measured: cold reads 0.4x -> ~1x a plain sequential
  // read of the pack file, docs/benchmarks.md).
  std::map<std::string, int> fds;
  for (const TensorManifest* t : tensors) {
    for (const ChunkRef& c : t->chunks) {
      if (c.pack.empty() || dram_->offset_of(c.hash) || (nvme_ && nvme_->contains(c.hash))) continue;
      auto [it, added] = fds.emplace(c.pack, -1);
      if (added) it->second = ::open((repo_->dir() + "/packs/" + c.pack).c_str(), O_RDONLY | O_CLOEXEC);
      if (it->second >= 0)
        ::posix_fadvise(it->second, static_cast<off_t>(c.offset), static_cast<off_t>(c.length), POSIX_FADV_WILLNEED);
    }
  }
  for (const auto& [pack, fd] : fds)
    if (fd >= 0) ::close(fd);
}

Status Engine::pin_tensor(const TensorManifest& t, std::vector<ChunkHash>& pinned, std::vector<Extent>& extents) {
  const size_t n = t.chunks.size();
  std::vector<DramTier::Claim> claims(n);
  std::vector<size_t> to_load, to_wait;
  for (size_t i = 0; i < n; ++i) {
    claims[i] = dram_->claim(t.chunks[i].hash);
    if (claims[i].kind == DramTier::ClaimKind::kLoad) to_load.push_back(i);
    else if (claims[i].kind == DramTier::ClaimKind::kLoading) to_wait.push_back(i);
  }
  std::vector<uint64_t> offsets(n, 0);
  std::vector<bool> have(n, false);
  for (size_t i = 0; i < n; ++i)
    if (claims[i].kind == DramTier::ClaimKind::kResident) offsets[i] = claims[i].offset, have[i] = true;

  Status failure;
  auto fail_cleanup = [&](size_t from_load) {
    for (size_t k = from_load; k < to_load.size(); ++k) dram_->abort_load(t.chunks[to_load[k]].hash);
  };
  // Load the missing chunks: into one allocation when the whole tensor is missing, so that it is
  // contiguous in the arena and can be mapped without assembling. Space first (all or nothing),
  // then the reads, several at a time so that reading, checksumming and copying overlap.
  if (!to_load.empty()) {
    const bool whole = to_load.size() == n && n > 1;
    std::vector<uint64_t> load_off(to_load.size());
    std::vector<Extent> granted;
    if (whole) {
      auto off = dram_->allocate(t.nbytes);
      if (!off.is_ok()) failure = off.status();
      else {
        granted.push_back(Extent{*off, t.nbytes});
        for (size_t k = 0; k < to_load.size(); ++k) load_off[k] = *off + to_load[k] * repo_->chunk_size();
      }
    } else {
      for (size_t k = 0; failure.is_ok() && k < to_load.size(); ++k) {
        auto a = dram_->allocate(t.chunks[to_load[k]].length);
        if (!a.is_ok()) failure = a.status();
        else granted.push_back(Extent{*a, t.chunks[to_load[k]].length}), load_off[k] = *a;
      }
    }
    std::vector<Status> results(to_load.size());
    if (failure.is_ok()) {

      auto read_one = [&](size_t k) {
        // The burst buffer's copy when it has one, else the repository's; verified either way.
        results[k] = tiers_->fetch(t.chunks[to_load[k]], dram_->base() + load_off[k]);
      };
      constexpr size_t kParallelReads = 4;
      std::atomic<size_t> next{0};
      auto worker = [&] {
        for (size_t k; (k = next++) < to_load.size();) read_one(k);
      };
      std::vector<std::thread> helpers;
      for (size_t h = 1; h < std::min(kParallelReads, to_load.size()); ++h) helpers.emplace_back(worker);
      worker();
      for (auto& th : helpers) th.join();
      for (const auto& r : results)
        if (failure.is_ok() && !r.is_ok()) failure = r.with_context("tensor '" + t.name + "'");
    }
    if (failure.is_ok()) {
      // (Reads per tier are counted by the tier manager, which knows where each chunk came from.)
      for (size_t k = 0; k < to_load.size(); ++k) {
        size_t i = to_load[k];
        dram_->finish_load(t.chunks[i].hash, load_off[k], t.chunks[i].length);
        offsets[i] = load_off[k];
        have[i] = true;
      }
    } else {
      // Nothing was made resident: give the space back and let waiters try again.
      if (whole) {
        for (size_t k = 0; k < granted.size(); ++k) dram_->release(granted[k].offset, granted[k].length);
      } else {
        for (const auto& g : granted) dram_->release(g.offset, g.length);
      }
      fail_cleanup(0);
    }
  }
  for (size_t i : to_wait) {
    if (!failure.is_ok()) break;
    for (;;) {
      if (auto off = dram_->wait_pin(t.chunks[i].hash)) {
        offsets[i] = *off;
        have[i] = true;
        break;
      }
      // The other loader failed: try ourselves.
      auto c = dram_->claim(t.chunks[i].hash);
      if (c.kind == DramTier::ClaimKind::kResident) {
        offsets[i] = c.offset;
        have[i] = true;
        break;
      }
      if (c.kind == DramTier::ClaimKind::kLoading) continue;
      const ChunkRef& ref0 = t.chunks[i];
      auto a = dram_->allocate(ref0.length);
      Status st = !a.is_ok() ? a.status() : tiers_->fetch(ref0, dram_->base() + *a);
      if (!st.is_ok()) {
        if (a.is_ok()) dram_->release(*a, ref0.length);
        dram_->abort_load(ref0.hash);
        failure = st;
        break;
      }
      dram_->finish_load(ref0.hash, *a, ref0.length);
      offsets[i] = *a;
      have[i] = true;
      break;
    }
  }
  if (!failure.is_ok()) {
    for (size_t i = 0; i < n; ++i)
      if (have[i]) dram_->unpin(t.chunks[i].hash);
    return failure;
  }
  for (size_t i = 0; i < n; ++i) {
    pinned.push_back(t.chunks[i].hash);
    extents.push_back(Extent{offsets[i], t.chunks[i].length});
  }
  return Status::ok();
}

Result<json> Engine::op_lease(Session& s, const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::shared_lock gc_lock(gc_mu_);
  CAIRN_ASSIGN_OR_RETURN(auto m, find_model(id));
  bool contiguous = req.value("contiguous", false);
  auto names = req.find("tensors");
  if (names == req.end() || !names->is_array()) return invalid_argument("request 'lease': missing array field 'tensors'");
  std::vector<const TensorManifest*> wanted;
  for (const auto& nj : *names)
    if (nj.is_string())
      if (const TensorManifest* t = m->find(nj.get<std::string>())) wanted.push_back(t);
  readahead(wanted);
  json leases = json::array();
  std::vector<uint64_t> granted;
  auto undo = [&] {
    for (uint64_t l : granted) {
      release_lease(s.leases[l]);
      s.leases.erase(l);
    }
  };
  for (const auto& nj : *names) {
    if (!nj.is_string()) {
      undo();
      return invalid_argument("request 'lease': tensor names must be strings");
    }
    const TensorManifest* t = m->find(nj.get<std::string>());
    if (!t) {
      undo();
      return not_found("model '" + id + "' has no tensor '" + nj.get<std::string>() + "'");
    }
    Session::Lease lease;
    std::vector<Extent> extents;
    Status st = pin_tensor(*t, lease.pinned_chunks, extents);
    if (!st.is_ok()) {
      undo();
      return st;
    }
    bool consecutive = true;
    for (size_t i = 1; i < extents.size(); ++i)
      if (extents[i].offset != extents[i - 1].offset + extents[i - 1].length) consecutive = false;
    if (contiguous && !consecutive) {
      // Assemble a contiguous copy for a zero-copy view; the chunks stay where they are.
      auto off = dram_->allocate(t->nbytes);
      if (!off.is_ok()) {
        release_lease(lease);
        undo();
        return off.status();
      }
      uint64_t pos = *off;
      for (const auto& e : extents) {
        std::memcpy(dram_->base() + pos, dram_->base() + e.offset, e.length);
        pos += e.length;
      }
      for (const auto& h : lease.pinned_chunks) dram_->unpin(h);
      lease.pinned_chunks.clear();
      lease.owned_extents.push_back(Extent{*off, t->nbytes});
      extents = {Extent{*off, t->nbytes}};
    }
    if (contiguous && consecutive && extents.size() > 1) extents = {Extent{extents.front().offset, t->nbytes}};
    json ex = json::array();
    for (const auto& e : extents) ex.push_back({e.offset, e.length});
    uint64_t lid = s.next_id++;
    s.leases[lid] = std::move(lease);
    granted.push_back(lid);
    leases.push_back({{"lease", lid}, {"extents", std::move(ex)}, {"nbytes", t->nbytes}});
  }
  return json{{"leases", std::move(leases)}, {"created_ns", m->created_ns}};
}

void Engine::release_lease(Session::Lease& lease) {
  for (const auto& h : lease.pinned_chunks) dram_->unpin(h);
  lease.pinned_chunks.clear();
  for (const auto& e : lease.owned_extents) dram_->release(e.offset, e.length);
  lease.owned_extents.clear();
  if (!lease.named_key.empty()) {
    std::lock_guard lock(mu_);
    auto it = named_.find(lease.named_key);
    if (it != named_.end() && it->second.generation == lease.named_generation) {
      --it->second.pins;
    } else {
      for (auto o = orphaned_named_.begin(); o != orphaned_named_.end(); ++o) {
        if (o->generation != lease.named_generation) continue;
        if (--o->pins == 0) {
          dram_->release(o->extent.offset, o->extent.length);
          orphaned_named_.erase(o);
        }
        break;
      }
    }
    lease.named_key.clear();
  }
}

Result<json> Engine::op_release(Session& s, const json& req) {
  auto ids = req.find("leases");
  if (ids == req.end() || !ids->is_array()) return invalid_argument("request 'release': missing array field 'leases'");
  for (const auto& v : *ids) {
    if (!v.is_number_unsigned()) return invalid_argument("request 'release': lease ids must be non-negative integers");
    auto it = s.leases.find(v.get<uint64_t>());
    if (it == s.leases.end()) continue;  // released twice: harmless
    release_lease(it->second);
    s.leases.erase(it);
  }
  return json::object();
}

void Engine::end_session(Session& s) {
  for (auto& [id, lease] : s.leases) release_lease(lease);
  s.leases.clear();
  for (auto& [id, ext] : s.staging) dram_->release(ext.offset, ext.length);
  s.staging.clear();
  std::lock_guard lock(mu_);
  for (uint64_t t : s.tickets) tickets_.erase(t);
  s.tickets.clear();
}

Result<json> Engine::op_prefetch(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::shared_lock gc_lock(gc_mu_);
  CAIRN_ASSIGN_OR_RETURN(auto m, find_model(id));
  uint64_t bytes = 0;
  std::vector<const TensorManifest*> all;
  for (const auto& t : m->tensors) all.push_back(&t);
  readahead(all);
  for (const auto& t : m->tensors) {
    std::vector<ChunkHash> pinned;
    std::vector<Extent> extents;
    CAIRN_RETURN_IF_ERROR(pin_tensor(t, pinned, extents));
    for (const auto& h : pinned) dram_->unpin(h);
    bytes += t.nbytes;
  }
  return json{{"bytes", bytes}};
}

// ---- catalog ----

Result<json> Engine::op_list(const json& req) {
  const bool all = req.value("all", false);
  json models = json::array();
  auto row = [](const ModelManifest& m, const char* durability) {
    json r{{"id", m.id},
           {"parent", m.parent.empty() ? json() : json(m.parent)},
           {"tensors", m.tensors.size()},
           {"bytes", m.logical_bytes()},
           {"created_ns", m.created_ns},
           {"durability", durability}};
    if (m.retired_ns != 0) r["retired"] = true;
    if (m.collected) r["collected"] = true;
    return r;
  };
  for (const auto& id : repo_->list()) {
    auto m = repo_->get_shared(id);
    if (m.is_ok() && (all || (*m)->retired_ns == 0)) models.push_back(row(**m, "global"));
  }
  std::lock_guard lock(mu_);
  for (const auto& [id, pm] : pending_) models.push_back(row(*pm.manifest, "memory"));
  return json{{"models", std::move(models)}};
}

Result<json> Engine::op_show(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  std::shared_ptr<const ModelManifest> m;
  bool pending = false;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    if (it != pending_.end()) {
      m = it->second.manifest;
      pending = true;
    }
  }
  if (!m) {
    auto r = repo_->get_shared(id);  // collected models too: their lineage and metadata remain
    if (!r.is_ok()) return not_found("model '" + id + "' does not exist (see `cairn ls`)");
    m = *r;
  }
  json tensors = json::array();
  for (const auto& t : m->tensors)
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", shape_json(t.shape)},
                       {"nbytes", t.nbytes},
                       {"chunks", t.chunks.size()}});
  json children = json::array();
  if (auto d = catalog_.descendants(id, 1); d.is_ok())
    for (const auto& [c, depth] : *d) children.push_back(c);
  json out{{"id", m->id},
           {"parent", m->parent.empty() ? json() : json(m->parent)},
           {"children", std::move(children)},
           {"created_ns", m->created_ns},
           {"durability", pending ? "memory" : "global"},
           {"pack", m->pack},
           {"logical_bytes", m->logical_bytes()},
           {"metadata", m->metadata},
           {"architecture", m->architecture},
           {"tensors", std::move(tensors)}};
  if (m->retired_ns != 0) out["retired_ns"] = m->retired_ns;
  if (m->collected) out["collected"] = true;
  return out;
}

Result<json> Engine::op_stats(const json& /*req*/) {
  RepositoryStats rs = repo_->stats();
  TierStats dram = dram_->stats();
  json moved = tiers_->stats();
  TierStats pfs;
  pfs.name = "pfs";
  pfs.enabled = true;
  pfs.used_bytes = rs.physical_bytes;
  pfs.chunks = rs.chunks;
  pfs.hits = moved["reads_from_repository"].get<uint64_t>();
  pfs.bytes_out = moved["bytes_from_repository"].get<uint64_t>();
  uint64_t pending_models, awaiting_local = 0, on_nvme = 0;
  {
    std::lock_guard lock(mu_);
    pfs.bytes_in = pfs_bytes_written_;
    pending_models = pending_.size();
    for (const auto& [id, pm] : pending_) {
      if (pm.needs_local && !pm.local_done) ++awaiting_local;
      if (pm.on_nvme) ++on_nvme;
    }
  }
  TierStats hbm, nvme;
  hbm.name = "hbm";
  nvme.name = "nvme";
  if (nvme_) nvme = nvme_->stats();
  json tiers{{"hbm", hbm.to_json()}, {"dram", dram.to_json()}, {"nvme", nvme.to_json()}, {"pfs", pfs.to_json()}};
  tiers["nvme"]["path"] = config_.tiers.nvme.path;
  if (nvme_) tiers["nvme"]["direct_io"] = nvme_->direct_io();
  tiers["pfs"]["path"] = repo_->dir();
  return json{{"tiers", std::move(tiers)},
              {"repository",
               {{"path", repo_->dir()},
                {"models", rs.models},
                {"retired", rs.retired},
                {"packs", rs.packs},
                {"chunks", rs.chunks},
                {"logical_bytes", rs.logical_bytes},
                {"physical_bytes", rs.physical_bytes}}},
              {"catalog", {{"models", catalog_.size()}, {"live", catalog_.live()}}},
              {"pending_models", pending_models},
              // What a crash could lose or delay: models not yet in the repository, by stage.
              {"flush",
               {{"pending_models", pending_models},
                {"awaiting_local", awaiting_local},
                {"local_not_global", on_nvme},
                {"dirty_dram_bytes", dram.dirty_bytes},
                {"dirty_nvme_bytes", nvme.dirty_bytes}}},
              {"movement", std::move(moved)},
              {"recovery", {{"models_recovered", recovered_models_}, {"models_lost", lost_models_}}},
              {"dirty_bytes", dram.dirty_bytes + nvme.dirty_bytes},
              {"chunk_size", repo_->chunk_size()}};
}

// `cairn rm`: retire. The model leaves queries and `cairn ls`; its bytes stay until `cairn gc`.
Result<json> Engine::op_remove(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string id, get_name(req, "id", "a model id"));
  {
    // A model still on its way to the repository is retired once it is there.
    std::unique_lock lock(mu_);
    ticket_cv_.wait(lock, [&] { return stopping_ || !pending_.count(id); });
  }
  auto before = repo_->get_shared(id);
  Status st = repo_->retire(id);
  if (st.code() == StatusCode::kNotFound) return not_found("model '" + id + "' does not exist (see `cairn ls`)");
  CAIRN_RETURN_IF_ERROR(st);
  CAIRN_RETURN_IF_ERROR(catalog_.retire(id));
  if (before.is_ok() && (*before)->retired_ns == 0) {
    std::lock_guard lock(mu_);
    count_references(**before, -1);
  }
  return json{{"retired", id}};
}

Result<json> Engine::op_gc(const json& /*req*/) {
  std::unique_lock gc_lock(gc_mu_);
  drain();  // every pending model is in the repository, so its references count
  CAIRN_ASSIGN_OR_RETURN(GcReport r, repo_->gc());
  for (const std::string& id : r.removed) {
    Status s = catalog_.erase(id);
    if (!s.is_ok()) CAIRN_LOG_WARN("gc: dropping '{}' from the catalog: {}", id, s.to_string());
  }
  RepositoryStats rs = repo_->stats();
  return json{{"removed", r.removed},
              {"collected", r.collected},
              {"packs_deleted", r.packs_deleted},
              {"bytes_released", r.bytes_released},
              {"bytes_punched", r.bytes_punched},
              {"bytes_unreclaimable", r.bytes_unreclaimable},
              {"physical_bytes", rs.physical_bytes}};
}

Result<json> Engine::op_fsck(const json& req) {
  const bool verify = req.value("verify", true);
  std::shared_lock gc_lock(gc_mu_);
  CAIRN_ASSIGN_OR_RETURN(FsckReport r, repo_->fsck(verify));
  auto problems = [](const std::vector<FsckReport::Problem>& v) {
    json out = json::array();
    for (const auto& p : v) {
      json j{{"pack", p.pack}, {"offset", p.offset}, {"length", p.length}, {"detail", p.detail}};
      if (!p.model.empty()) {
        j["model"] = p.model;
        j["tensor"] = p.tensor;
      }
      out.push_back(std::move(j));
    }
    return out;
  };
  return json{{"ok", r.ok()},
              {"models", r.models},
              {"chunks", r.chunks},
              {"bytes_verified", r.bytes_verified},
              {"dangling", problems(r.dangling)},
              {"orphaned", problems(r.orphaned)},
              {"orphaned_bytes", r.orphaned_bytes}};
}

Result<json> Engine::op_flush(const json& req) {
  // Blocks until every acknowledged model is in the repository (or the timeout passes).
  int64_t timeout_ms = get_i64_or(req, "timeout_ms", -1);
  auto t0 = std::chrono::steady_clock::now();
  size_t before;
  {
    std::lock_guard lock(mu_);
    before = pending_.size();
  }
  bool done = true;
  if (timeout_ms < 0) drain();
  else done = drain_for(std::chrono::milliseconds(timeout_ms));
  size_t left;
  {
    std::lock_guard lock(mu_);
    left = pending_.size();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!done)
    return timed_out("flush: " + std::to_string(left) + " models are still on their way to the repository after " +
                     std::to_string(timeout_ms) + " ms");
  uint64_t dirty = dram_->stats().dirty_bytes + (nvme_ ? nvme_->stats().dirty_bytes : 0);
  return json{{"flushed_models", before}, {"pending_models", left}, {"dirty_bytes", dirty}, {"seconds", secs}};
}

// ---- queries (docs/catalog.md) ----

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
  if (!f.is_ok()) return f.status().with_context("query '" + qop + "'");
  return f;
}

}  // namespace

Result<json> Engine::query_best_ancestor(const json& q) {
  auto git = q.find("graph");
  if (git == q.end() || !git->is_object())
    return invalid_argument("query 'best_ancestor': missing object field 'graph' (an architecture graph)");
  auto g = parse_graph(*git);
  if (!g.is_ok()) return g.status().with_context("query 'best_ancestor'");
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
  auto m = find_model(best.model);
  GraphHandle mg = catalog_.graph_of(best.model);
  if (!m.is_ok() || !mg) return out;
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
  out["tensors"] = std::move(tensors);
  return out;
}

Result<json> Engine::op_query(const json& req) {
  auto qit = req.find("query");
  if (qit == req.end() || !qit->is_object()) return invalid_argument("request 'query': missing object field 'query'");
  const json& q = *qit;
  auto opit = q.find("op");
  if (opit == q.end() || !opit->is_string())
    return invalid_argument("query: missing string field 'op' (best_ancestor, ancestors, descendants, lca, path, find, tree)");
  const std::string qop = opit->get<std::string>();
  auto known = [&](const std::string& id) -> Status {
    if (!catalog_.contains(id)) return not_found("query '" + qop + "': model '" + id + "' does not exist (see `cairn ls --all`)");
    return Status::ok();
  };
  if (qop == "best_ancestor") return query_best_ancestor(q);
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
  return invalid_argument("query op '" + qop +
                          "' is not supported (supported: best_ancestor, ancestors, descendants, lca, path, find, tree)");
}

}  // namespace cairn
