#include "daemon/engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <mutex>
#include <optional>

#include "core/log.hpp"
#include "core/version.hpp"
#include "core/wire.hpp"
#include "daemon/model_graph.hpp"
#include "daemon/recovery.hpp"
#include "daemon/request.hpp"
#include "daemon/trace_recorder.hpp"

namespace cairn {

using nlohmann::json;

// ---- assembly ----

Result<std::unique_ptr<Engine>> Engine::create(const Config& config, EngineOptions options) {
  log_to_stderr_by_default();
  if (!parse_duration(config.repository_refresh))
    return invalid_argument("repository_refresh: '" + config.repository_refresh +
                            "' is not a duration (a number and ms, s or m, such as 250ms or 1s; 0 = off)");
  auto watchdog_bound = parse_duration(config.watchdog);
  if (!watchdog_bound)
    return invalid_argument("watchdog: '" + config.watchdog +
                            "' is not a duration (a number and ms, s or m, such as 30s or 10m; 0 = off)");
  // Fault injection (fault_injection.hpp): one injector over the real filesystem, under the
  // repository and the burst buffer alike (a test that gives its own file systems keeps them).
  std::unique_ptr<FaultyFileSystem> faulty;
  if (config.debug.fault_injection) {
    faulty = std::make_unique<FaultyFileSystem>(posix_fs());
    if (!options.repository_fs) options.repository_fs = faulty.get();
    if (!options.nvme_fs) options.nvme_fs = faulty.get();
    CAIRN_LOG_WARN("fault injection is enabled (debug.fault_injection): `cairn fault add` can make the repository "
                   "and the burst buffer fail, lose or corrupt data; never use this daemon for data you need");
  }
  const auto opening = std::chrono::steady_clock::now();
  RepositoryOptions repo_options;
  repo_options.direct_reads = config.repository_direct_reads;
  repo_options.compress = config.repository_compression != "off";
  repo_options.deltas = config.repository_compression == "deltas";
  CAIRN_ASSIGN_OR_RETURN(auto repo,
                         Repository::open(config.repository, config.chunk_size, options.repository_fs, repo_options));
  const auto opened_repo = std::chrono::steady_clock::now();
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
  std::unique_ptr<TraceRecorder> trace;
  if (!config.policy.trace.empty()) {
    auto opened = TraceRecorder::open(config.policy.trace);
    if (!opened.is_ok()) return opened.status().with_context("policy.trace");
    trace = std::move(opened).value();
  }
  std::optional<MetricsExporter::Options> metrics_options;
  if (MetricsExporter::enabled(config)) {
    CAIRN_ASSIGN_OR_RETURN(metrics_options, MetricsExporter::options_from(config));
  }
  if (config.compute.enabled) {
    auto t = parse_duration(config.compute.start_timeout);
    if (!t || t->count() <= 0)
      return invalid_argument("compute.start_timeout: '" + config.compute.start_timeout +
                              "' is not a positive duration (such as 30s or 2m)");
  }
  std::unique_ptr<Engine> engine(new Engine(config, std::move(faulty), *watchdog_bound, std::move(repo), std::move(dram),
                                            std::move(nvme), std::move(admission), std::move(trace)));
  // The GPU tier (docs/gpu.md): after the arena, which it registers with each device for DMA.
  if (config.tiers.hbm.capacity > 0) {
    if (config.tiers.hbm.backend == "emulated") hbm::remove_stale_emulated_segments();
    HbmTier::Options ho;
    ho.backend = config.tiers.hbm.backend;
    ho.devices = resolve_hbm_devices(config.tiers.hbm.devices);
    ho.capacity = config.tiers.hbm.capacity;
    ho.eviction = config.policy.eviction;
    CAIRN_ASSIGN_OR_RETURN(engine->hbm_, HbmTier::open(ho, engine->dram_->base(), engine->dram_->arena_size()));
    engine->reads_->set_hbm(engine->hbm_.get());
    engine->admin_->set_hbm(engine->hbm_.get());
  }
  // The job's peer group: one more chunk source, after the NVMe tier and before the repository.
  PeerGroup group = resolve_peer_group(config);
  if (!group.job.empty()) {
#ifdef CAIRN_HAVE_LIBFABRIC
    auto timeout = parse_duration(config.peers.timeout);
    if (!timeout || timeout->count() <= 0)
      return invalid_argument("peers.timeout: '" + config.peers.timeout + "' is not a positive duration (such as 500ms or 10s)");
    PeerService::Options po;
    po.job = group.job;
    po.rendezvous = group.rendezvous;
    po.provider = config.peers.provider;
    po.address = config.peers.address;
    po.expect = config.peers.expect;
    po.timeout = *timeout;
    Engine* e = engine.get();
    po.on_model = [e](ModelManifest m, const std::string& member) { e->add_peer_model(std::move(m), member); };
    po.on_member_gone = [e](const std::string& member) {
      e->drop_peer_models(member);
      if (e->group_parts_) e->group_parts_->member_gone(member);
    };
    // Multi-part models whose parts are on several members (group_parts.hpp).
    GroupParts::Transport transport;
    transport.active = [e] { return e->peers_ && e->peers_->has_members(); };
    transport.self = [e] { return e->peers_ ? e->peers_->self() : std::string(); };
    transport.home = [e](const std::string& id) { return e->peers_ ? e->peers_->model_home(id) : std::string(); };
    transport.send = [e](const std::string& member, PeerMsg type, json body) {
      return e->peers_ ? e->peers_->send_part_message(member, type, std::move(body))
                       : unavailable("the peer group is not running");
    };
    transport.members = [e] { return e->peers_ ? e->peers_->verified_members() : std::vector<std::string>(); };
    engine->group_parts_ = std::make_unique<GroupParts>(
        GroupParts::Parts{*engine->commits_, engine->tickets_, *engine->dram_, *engine->tiers_, *engine->flusher_,
                          engine->nvme_ != nullptr, *timeout,
                          [e](const std::string& id, const std::string& member) {
                            e->drop_peer_model(id, member, "which assembled it from parts, could not write it to "
                                                           "the repository: it is gone");
                          }},
        std::move(transport));
    po.on_parts = [e](PeerMsg type, json body, const std::string& member) {
      if (e->group_parts_) e->group_parts_->on_message(type, std::move(body), member);
    };
    po.on_stage = [e](const std::string& model) -> Result<uint64_t> {
      return e->reads_->stage_model(model);
    };
    auto started = PeerService::start(po, *engine->dram_);
    if (!started.is_ok()) return started.status();
    engine->peers_ = std::move(started).value();
    engine->tiers_->add_source(engine->peers_->source(), engine->tiers_->source_names().size() - 1);
    engine->commits_->set_group_parts(engine->group_parts_.get());
#else
    return unavailable("peers.job is '" + group.job + "' but this cairnd was built without libfabric (CAIRN_WITH_LIBFABRIC=OFF); set peers.job: none");
#endif
  }
  RecoveryParts parts{*engine->repo_,    engine->catalog_, engine->references_, *engine->flusher_,
                      *engine->commits_, *engine->models_, engine->nvme_.get()};
  const auto cataloguing = std::chrono::steady_clock::now();
  CAIRN_RETURN_IF_ERROR(load_catalog(parts));
  const auto catalogued = std::chrono::steady_clock::now();
  engine->recovery_ = recover_from_nvme(parts);
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  CAIRN_LOG_INFO("start: repository opened in {} ms, tiers in {} ms, catalog of {} models built in {} ms, burst "
                 "buffer recovered in {} ms",
                 ms(opened_repo - opening), ms(cataloguing - opened_repo), engine->catalog_.size(),
                 ms(catalogued - cataloguing), ms(std::chrono::steady_clock::now() - catalogued));
  engine->watch_ = std::make_unique<RepositoryWatch>(
      RepositoryWatch::Parts{*engine->repo_, engine->catalog_, engine->references_, *engine->commits_,
                             &engine->remote_},
      *parse_duration(config.repository_refresh));
  engine->commits_->set_catalog_refresh([e = engine.get()] { (void)e->watch_->sync(); });
  // A read that failed on missing bytes looks at the repository again, through the watch, so that
  // a peer's announcement of a model removed since is dropped too.
  engine->models_->set_refresh([e = engine.get()] { return e->watch_->sync().status(); });
  // Metrics for monitoring: last, once every component they read is up.
  if (metrics_options) {
    CAIRN_ASSIGN_OR_RETURN(engine->metrics_,
                           MetricsExporter::start(std::move(*metrics_options), [e = engine.get()](metrics::Format f) {
                             return e->metrics_text(f);
                           }));
  }
  return engine;
}

Engine::Engine(Config config, std::unique_ptr<FaultyFileSystem> faulty, std::chrono::milliseconds watchdog_bound,
               std::unique_ptr<Repository> repo, std::unique_ptr<DramTier> dram, std::unique_ptr<NvmeTier> nvme,
               std::unique_ptr<AdmissionPolicy> admission, std::unique_ptr<TraceRecorder> trace)
    : config_(std::move(config)),
      request_metrics_(MetricsExporter::enabled(config_) ? std::make_unique<RequestMetrics>(ops_in_table_order())
                                                          : nullptr),
      metrics_job_(resolve_peer_group(config_).job),
      started_unix_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count()),
      watchdog_(watchdog_bound),
      faulty_fs_(std::move(faulty)),
      faults_(faulty_fs_.get()),
      repo_(std::move(repo)),
      dram_(std::move(dram)),
      nvme_(std::move(nvme)),
      tiers_(std::make_unique<TierManager>(*dram_, nvme_.get(), *repo_, std::move(admission))),
      trace_(std::move(trace)),
      references_(*dram_),
      named_(*dram_) {
  // A model whose repository write failed is gone: out of the catalog and the reference counts.
  flusher_ = std::make_unique<Flusher>(*repo_, *tiers_, nvme_.get(), tickets_, [this](const ModelManifest& m) {
    (void)catalog_.retire(m.id);
    (void)catalog_.erase(m.id);
    references_.count(m, -1);
  });
  models_ = std::make_unique<ModelDirectory>(*flusher_, *repo_, remote_);
  commits_ = std::make_unique<CommitPath>(CommitPath::Parts{*dram_, *tiers_, *repo_, catalog_, *flusher_, references_,
                                                            tickets_, *models_, gc_mu_, nvme_ != nullptr,
                                                            trace_.get(),
                                                            [this](const ModelManifest& m) {
                                                              if (peers_) peers_->announce_model(m);
                                                            },
                                                            &usage_});
  reads_ = std::make_unique<Reads>(
      Reads::Parts{*dram_, *tiers_, named_, *models_, gc_mu_, repo_->chunk_size(), &usage_});
  const uint64_t budget =
      config_.policy.prefetch_budget ? config_.policy.prefetch_budget : dram_->arena_size() / 4;
  prefetcher_ = std::make_unique<Prefetcher>(
      Prefetcher::Parts{*dram_, *reads_, *models_, config_.policy.prefetch, budget, trace_.get(), nvme_.get()});
  reads_->set_observer(prefetcher_.get());
  reads_->set_trace(trace_.get());
  admin_ = std::make_unique<Admin>(Admin::Parts{*repo_, catalog_, *flusher_, references_, *dram_, nvme_.get(), *tiers_,
                                                config_.tiers.nvme.path, recovery_, gc_mu_, prefetcher_.get(),
                                                &remote_});
  queries_ = std::make_unique<CatalogQueries>(catalog_, *models_, prefetcher_.get());
  compute_ = std::make_unique<ComputeWorker>(config_, config_.socket.empty() ? wire::default_socket_path()
                                                                             : config_.socket);
}

Engine::~Engine() {
  if (metrics_) metrics_->stop();  // first: its threads read every component
  compute_->stop();  // the worker is a client of this daemon
  if (peers_) peers_->stop_staging();  // other members' `prefetch --all` read through reads_
  if (watch_) watch_->stop();
  prefetcher_->stop();
  // Parts held here for a model another member registered: until it is in the repository (or
  // fails, or that member leaves), so a clean exit does not take them with it.
  if (group_parts_ && !group_parts_->drain_for(std::chrono::minutes(10)))
    CAIRN_LOG_WARN("exiting with parts of multi-part models held here that did not reach the repository");
  drain();
  flusher_->stop();
  named_.stop();
  tickets_.stop();
  if (group_parts_) group_parts_->stop();
  tiers_.reset();
  if (nvme_) {
    Status st = nvme_->close();
    if (!st.is_ok()) CAIRN_LOG_ERROR("closing the burst buffer: {}", st.to_string());
  }
}

void Engine::drain() { flusher_->drain(); }

bool Engine::drain_for(std::chrono::milliseconds timeout) { return flusher_->drain_for(timeout); }

// ---- the dispatch table: every request op and the component that serves it ----

struct Engine::Op {
  const char* name;
  Handler handler;
};

namespace {

// A typed reply encoded for the wire (request.hpp); a Status alone answers an empty object.
template <class Reply>
Result<json> encoded(Result<Reply> reply) {
  if (!reply.is_ok()) return reply.status();
  return request::encode(*reply);
}
Result<json> encoded(const Status& st) {
  if (!st.is_ok()) return st;
  return json::object();
}

}  // namespace

// Each typed op is decode (request.hpp) -> the component's method -> encode; the others still hand
// the component the request's JSON.
const std::vector<Engine::Op>& Engine::table() {
  using B = std::vector<uint8_t>;
  static const std::vector<Op> kOps = {
      // connection (engine.cpp)
      {"hello", [](Engine& e, Session& s, const json&, B&) { return e.hello(s); }},
      {"ping", [](Engine&, Session&, const json&, B&) -> Result<json> { return json::object(); }},
      // staging space and commits (commit_path.cpp)
      {"allocate", [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_allocate(r));
         return encoded(e.commits_->allocate(s, q));
       }},
      {"free", [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_free(r));
         return encoded(e.commits_->free(s, q));
       }},
      {"commit", [](Engine& e, Session& s, const json& r, B& b) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_commit(r, {e.repo_->chunk_size()}));
         return encoded(e.commits_->commit(s, std::move(q), b));
       }},
      {"wait", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_wait(r));
         return encoded(e.commits_->wait(q));
       }},
      // named tensors (named_tensors.cpp)
      {"put_tensor", [](Engine& e, Session& s, const json& r, B& b) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_put_tensor(r));
         return encoded(e.named_.put(s, q, b));
       }},
      {"tensor_info", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tensor_key(r));
         return encoded(e.named_.info(q));
       }},
      {"lease_tensor", [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tensor_key(r));
         return encoded(e.named_.lease(s, q));
       }},
      {"poll_tensor", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_poll_tensor(r));
         return request::encode(e.named_.poll(q));
       }},
      {"delete_tensor", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tensor_key(r));
         return encoded(e.named_.remove(q));
       }},
      // reads (reads.cpp)
      {"open", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_open(r));
         return encoded(e.reads_->open(q));
       }},
      {"lease", [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_lease(r));
         return encoded(e.reads_->lease(s, q));
       }},
      {"release", [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         auto leases = r.find("leases");
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_release(leases == r.end() ? nullptr : &*leases));
         e.reads_->release(s, q);
         return json::object();
       }},
      {"lease_device", [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_lease_device(r));
         return encoded(e.reads_->lease_device(s, q));
       }},
      {"prefetch", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_prefetch(r));
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(r));
         return e.prefetch(q, tracked.progress());
       }},
      // administration (admin.cpp) and queries (queries.cpp)
      {"list", [](Engine& e, Session&, const json& r, B&) { return e.admin_->list(r); }},
      {"show", [](Engine& e, Session&, const json& r, B&) { return e.admin_->show(r); }},
      {"stats", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(json out, e.admin_->stats(r));
         out["compute"] = e.compute_->status();
         out["watchdog"] = e.watchdog_.stats();
         out["leases"] = e.reads_->lease_stats();
         out["usage"] = e.usage_.to_json();
         out["usage"]["started_unix_ns"] = e.started_unix_ns_;
         out["fault_injection"] = {{"enabled", e.faults_.enabled()},
                                   {"rules", e.faulty_fs_ ? e.faulty_fs_->rules().size() : 0},
                                   {"injected", e.faulty_fs_ ? e.faulty_fs_->injected() : 0}};
         return out;
       }},
      {"fault", [](Engine& e, Session&, const json& r, B&) { return e.faults_.handle(r); }},
      {"remove", [](Engine& e, Session&, const json& r, B&) { return e.admin_->remove(r); }},
      // The long ones publish their progress under the token in "progress" (progress_board.cpp).
      {"gc", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(r));
         return e.admin_->gc(r, tracked.progress());
       }},
      {"fsck", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(r));
         return e.admin_->fsck(r, tracked.progress());
       }},
      {"flush", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(r));
         return e.admin_->flush(r, tracked.progress());
       }},
      {"sync", [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(r));
         tracked.progress().begin_phase("reading the records of other daemons", ProgressUnit::kItems, 0);
         return encoded(e.watch_->sync());
       }},
      {"progress", [](Engine& e, Session&, const json& r, B&) { return e.progress_.query(r); }},
      {"peers", [](Engine& e, Session&, const json&, B&) -> Result<json> {
         if (!e.peers_) return json{{"enabled", false}, {"members", json::array()}};
         json out = e.peers_->status();
         if (e.group_parts_) out["parts"] = e.group_parts_->status();
         return out;
       }},
      {"query", [](Engine& e, Session&, const json& r, B&) { return e.queries_->query(r); }},
      // the near-data compute worker (compute.cpp)
      {"compute", [](Engine& e, Session&, const json& r, B&) { return e.compute_->attach(r); }},
      // hints (prefetcher.cpp)
      {"hint", [](Engine& e, Session&, const json& r, B&) { return e.prefetcher_->hint(r); }},
  };
  return kOps;
}

std::vector<std::string> Engine::ops_in_table_order() {
  std::vector<std::string> out;
  for (const Op& op : table()) out.emplace_back(op.name);
  return out;
}

std::vector<std::string> Engine::ops() {
  std::vector<std::string> out = ops_in_table_order();
  std::sort(out.begin(), out.end());
  return out;
}

size_t Engine::op_slot(const std::string& op) {
  const auto& ops = table();
  for (size_t i = 0; i < ops.size(); ++i)
    if (op == ops[i].name) return i;
  return ops.size();
}

Result<json> Engine::dispatch(Session& s, size_t slot, const std::string& op, const json& req,
                              std::vector<uint8_t>& blob) {
  if (slot < table().size()) return table()[slot].handler(*this, s, req, blob);
  return invalid_argument("unknown request op '" + op + "' (client and daemon from different releases?)");
}

Response Engine::handle(Session& session, const json& request, std::vector<uint8_t>& blob) {
  const auto started = std::chrono::steady_clock::now();
  Response r;
  std::string op;
  size_t slot = table().size();
  Result<json> result = [&]() -> Result<json> {
    try {
      // The server's decoder guarantees an object with a string "op"; in-process callers may not.
      auto it = request.is_object() ? request.find("op") : request.end();
      if (it == request.end() || !it->is_string())
        return invalid_argument("a request must be a JSON object with a string field 'op'");
      op = it->get<std::string>();
      slot = op_slot(op);
      // Any request may carry leases the client is done with (saving it a round trip).
      if (auto rel = request.find("release"); rel != request.end() && op != "release") {
        CAIRN_ASSIGN_OR_RETURN(auto released, request::decode_release(&*rel));
        reads_->release(session, released);
      }
      Watchdog::Request tracked(watchdog_, op, {session.id, session.client_pid});
      return dispatch(session, slot, op, request, blob);
    } catch (const std::exception& e) {
      return internal_error(std::string("request '") + op + "' failed: " + e.what());
    }
  }();
  const auto took = std::chrono::steady_clock::now() - started;
  usage_.request_served(std::chrono::duration_cast<std::chrono::nanoseconds>(took));
  if (request_metrics_) record_request(slot, request, result.status().code(), took);
  if (!result.is_ok()) {
    r.body = json{{"status", static_cast<int>(result.status().code())}, {"error", result.status().message()}};
    r.blob.clear();
    return r;
  }
  r.body = std::move(result).value();
  r.body["status"] = 0;
  return r;
}

void Engine::release_leases(Session& s) { reads_->end_session(s); }

void Engine::end_session(Session& s) {
  reads_->end_session(s);
  commits_->end_session(s);
}

Result<json> Engine::hello(Session& s) {
  if (s.id == 0) s.id = next_session_++;
  json out{{"arena_size", dram_->arena_size()},
           {"chunk_size", repo_->chunk_size()},
           {"pid", static_cast<int64_t>(::getpid())},
           {"session", s.id},
           {"version", version()}};
  if (hbm_) out["hbm"] = json{{"backend", hbm_->backend()}, {"devices", hbm_->devices()}};
  return out;
}

void Engine::add_peer_model(ModelManifest model, const std::string& member) {
  // Known already: published and seen here, or (a race of ids is settled by the repository's claim)
  // one of this daemon's own.
  if (catalog_.contains(model.id) || flusher_->contains(model.id)) return;
  // Removed from the repository since it was committed (a message that came late): gone.
  if (remote_.removed_after(model.id, model.created_ns)) return;
  auto m = std::make_shared<const ModelManifest>(std::move(model));
  std::shared_ptr<const ModelManifest> parent;
  if (!m->parent.empty())
    if (auto p = models_->find(m->parent); p.is_ok()) parent = *p;
  Status added = catalog_.add(m->id, m->parent, graph_for(catalog_, *m, nullptr, parent.get()), m->metadata);
  if (!added.is_ok()) {
    CAIRN_LOG_WARN("model '{}' of peer {}: {}", m->id, member, added.to_string());
    return;
  }
  commits_->observe_created(m->created_ns);
  references_.count(*m, +1);
  remote_.put(std::move(m), member);
}

Result<json> Engine::prefetch(const request::Prefetch& req, OperationProgress& progress) {
  if (!req.all) return encoded(reads_->prefetch(req, &progress));
  const std::string& id = req.id;
  CAIRN_RETURN_IF_ERROR(models_->find(id).status());  // unknown here: nobody is asked
  json members = json::array();
  if (!peers_) {
    CAIRN_ASSIGN_OR_RETURN(json local, encoded(reads_->prefetch(req, &progress)));
    local["members"] = std::move(members);
    local["peers"] = false;
    return local;
  }
  // The others and this daemon at once: they fetch from each other as the chunks arrive.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(req.timeout_ms.value_or(uint64_t{600000}));
  auto t0 = std::chrono::steady_clock::now();
  // The other members' answers, counted while this member prefetches; shown once it has finished
  // (its own bytes are the first phase).
  struct Answers {
    std::mutex mu;
    size_t asked = 0, answered = 0;
    bool shown = false;  // GUARDED_BY(mu)
  } answers;
  auto on_answer = [&answers, &progress](size_t asked, size_t answered) {
    std::lock_guard lock(answers.mu);
    answers.asked = asked;
    answers.answered = answered;
    if (!answers.shown) return;
    progress.set_total(asked);
    progress.set_done(answered);
  };
  auto remote = std::async(std::launch::async,
                           [this, &id, deadline, &on_answer] { return peers_->stage_all(id, deadline, on_answer); });
  Result<json> local = encoded(reads_->prefetch(req, &progress));
  const double local_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard lock(answers.mu);
    progress.begin_phase("other members prefetched", ProgressUnit::kItems, answers.asked);
    progress.set_done(answers.answered);
    answers.shown = true;
  }
  {
    Watchdog::ClientWait waiting;  // for the other members, at most timeout_ms
    members = remote.get();
  }
  const double all_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!local.is_ok()) return local.status().with_context("prefetch --all: this member");
  json out = *local;
  out["seconds"] = local_s;
  out["all_seconds"] = all_s;
  bool ok = true;
  for (const auto& m : members) ok = ok && m.value("ok", false);
  out["all_ok"] = ok;
  out["members"] = std::move(members);
  out["peers"] = true;
  return out;
}

void Engine::drop_peer_models(const std::string& member) {
  for (const std::string& id : remote_.of_member(member))
    drop_peer_model(id, member,
                    "which left the group before writing it to the repository: it is gone (commit at durability local "
                    "or global to survive a member)");
}

void Engine::drop_peer_model(const std::string& id, const std::string& member, const std::string& why) {
  auto m = remote_.find(id);
  if (!m || remote_.member_of(id) != member || !remote_.erase(id)) return;
  // Published before the member left: the repository serves it (get looks the id up on a miss).
  if (repo_->get_shared(id).is_ok()) return;
  (void)catalog_.retire(id);
  (void)catalog_.erase(id);
  references_.count(*m, -1);
  CAIRN_LOG_WARN("model '{}' was committed on peer {}, {}", id, member, why);
}

}  // namespace cairn
