// Opening and closing the engine: the one place where cairnd is assembled (docs/architecture.md,
// "Assembly").
//
// Engine::create does it in four steps:
//   1. the config is checked (check_config: what load_config checks, for a config built in code);
//   2. what can fail on the machine is opened, in this order, each from the config alone: the
//      fault injector, the repository, the DRAM arena, the GPU tier (it registers the arena), the
//      burst buffer, the policy trace, the metrics options, the peer group (it registers the arena
//      with the fabric and joins the rendezvous directory, delivering nothing yet);
//   3. the constructor makes every component from those and from the components made before it,
//      each getting what it uses in its constructor (the member order in engine.hpp);
//   4. the threads that act on shared state start: the peer group delivers to its events, the
//      catalog is loaded and the burst buffer recovered, the repository watch starts, then the
//      metrics exporter.
// A failure in any step returns that step's error; what was opened is closed again.
#include <unistd.h>

#include <chrono>
#include <optional>
#include <utility>

#include "core/log.hpp"
#include "core/wire.hpp"
#include "daemon/engine.hpp"
#include "daemon/recovery.hpp"
#include "daemon/trace_recorder.hpp"

namespace cairn {

using nlohmann::json;

struct Engine::Opened {
  Config config;
  std::unique_ptr<FaultyFileSystem> faulty;
  std::chrono::milliseconds watchdog_bound{0};
  std::chrono::milliseconds peer_timeout{0};  // peers.timeout
  std::unique_ptr<Repository> repo;
  std::unique_ptr<DramTier> dram;
  std::unique_ptr<HbmTier> hbm;
  std::unique_ptr<NvmeTier> nvme;
  std::unique_ptr<AdmissionPolicy> admission;
  std::unique_ptr<TraceRecorder> trace;
  std::unique_ptr<PeerService> peers;
};

namespace {

// A config duration key's value. REQUIRES: check_config passed (the value parses).
std::chrono::milliseconds duration_of(const std::string& checked) { return parse_duration(checked).value(); }

// What the peer group tells this daemon, each event to the component that owns it.
class RoutedPeerEvents final : public PeerEvents {
 public:
  RoutedPeerEvents(PeerCatalog& catalog, GroupParts& parts, Reads& reads)
      : catalog_(catalog), parts_(parts), reads_(reads) {}

  void model_announced(ModelManifest model, const std::string& member) override {
    catalog_.add(std::move(model), member);
  }
  void part_message(PeerMsg type, json body, const std::string& member) override {
    parts_.on_message(type, std::move(body), member);
  }
  void member_left(const std::string& member) override {
    catalog_.drop_member(member);
    parts_.member_gone(member);
  }
  Result<uint64_t> stage(const std::string& model) override { return reads_.stage_model(model); }

 private:
  PeerCatalog& catalog_;
  GroupParts& parts_;
  Reads& reads_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const Config& config, EngineOptions options) {
  log_to_stderr_by_default();
  // 1. The config.
  CAIRN_RETURN_IF_ERROR(check_config(config));
  Opened o;
  o.config = config;
  o.watchdog_bound = duration_of(config.watchdog);
  o.peer_timeout = duration_of(config.peers.timeout);

  // 2. What can fail on the machine. Fault injection (fault_injection.hpp): one injector over the
  // real filesystem, under the repository and the burst buffer alike (a test that gives its own
  // file systems keeps them).
  if (config.debug.fault_injection) {
    o.faulty = std::make_unique<FaultyFileSystem>(posix_fs());
    if (!options.repository_fs) options.repository_fs = o.faulty.get();
    if (!options.nvme_fs) options.nvme_fs = o.faulty.get();
    CAIRN_LOG_WARN(
        "fault injection is enabled (debug.fault_injection): `cairn fault add` can make the repository "
        "and the burst buffer fail, lose or corrupt data; never use this daemon for data you need");
  }
  const auto opening = std::chrono::steady_clock::now();
  RepositoryOptions repo_options;
  repo_options.direct_reads = config.repository_direct_reads;
  repo_options.compress = config.repository_compression != "off";
  repo_options.deltas = config.repository_compression == "deltas";
  CAIRN_ASSIGN_OR_RETURN(o.repo,
                         Repository::open(config.repository, config.chunk_size, options.repository_fs, repo_options));
  const auto opened_repo = std::chrono::steady_clock::now();
  CAIRN_ASSIGN_OR_RETURN(auto policy, make_eviction_policy(config.policy.eviction));
  CAIRN_ASSIGN_OR_RETURN(o.admission, make_admission_policy(config.policy.admission));
  CAIRN_ASSIGN_OR_RETURN(o.dram,
                         DramTier::create(config.tiers.dram.capacity, std::move(policy),
                                          "cairn-arena-" + std::to_string(::getpid()), options.backpressure_timeout));
  // The GPU tier (docs/gpu.md): after the arena, which it registers with each device for DMA.
  if (config.tiers.hbm.capacity > 0) {
    if (config.tiers.hbm.backend == "emulated") hbm::remove_stale_emulated_segments();
    HbmTier::Options ho;
    ho.backend = config.tiers.hbm.backend;
    ho.devices = resolve_hbm_devices(config.tiers.hbm.devices);
    ho.capacity = config.tiers.hbm.capacity;
    ho.eviction = config.policy.eviction;
    CAIRN_ASSIGN_OR_RETURN(o.hbm, HbmTier::open(ho, o.dram->base(), o.dram->arena_size()));
  }
  if (config.tiers.nvme.capacity > 0) {
    NvmeTier::Options no;
    no.path = config.tiers.nvme.path;
    no.capacity = config.tiers.nvme.capacity;
    no.persistent = config.tiers.nvme.persistent;
    no.fs = options.nvme_fs;
    CAIRN_ASSIGN_OR_RETURN(no.policy, make_eviction_policy(config.policy.eviction));
    auto opened = NvmeTier::open(std::move(no));
    if (!opened.ok())
      return opened.status().with_context("opening the burst buffer (tiers.nvme.path " + config.tiers.nvme.path + ")");
    o.nvme = std::move(opened).value();
  }
  // A failure from here on closes the burst buffer, as ~Engine would (its files go unless
  // tiers.nvme.persistent).
  auto abandon = [&o](Status failure) {
    if (o.nvme) (void)o.nvme->close();
    return failure;
  };
  if (!config.policy.trace.empty()) {
    auto opened = TraceRecorder::open(config.policy.trace);
    if (!opened.ok()) return abandon(opened.status().with_context("policy.trace"));
    o.trace = std::move(opened).value();
  }
  std::optional<MetricsExporter::Options> metrics_options;
  if (MetricsExporter::enabled(config)) {
    auto checked = MetricsExporter::options_from(config);
    if (!checked.ok()) return abandon(checked.status());
    metrics_options = std::move(checked).value();
  }
  // The job's peer group (peer_service.hpp): one more chunk source, after the NVMe tier and before
  // the repository. Opened here, started in step 4.
  const PeerGroup group = resolve_peer_group(config);
  if (!group.job.empty()) {
#ifdef CAIRN_HAVE_LIBFABRIC
    PeerService::Options po;
    po.job = group.job;
    po.rendezvous = group.rendezvous;
    po.provider = config.peers.provider;
    po.address = config.peers.address;
    po.expect = config.peers.expect;
    po.timeout = o.peer_timeout;
    auto joined = PeerService::open(po, *o.dram);
    if (!joined.ok()) return abandon(joined.status());
    o.peers = std::move(joined).value();
#else
    return abandon(
        unavailable("peers.job is '" + group.job +
                    "' but this cairnd was built without libfabric (CAIRN_WITH_LIBFABRIC=OFF); set peers.job: none"));
#endif
  }

  // 3. The components.
  std::unique_ptr<Engine> engine(new Engine(std::move(o)));
  Engine& e = *engine;

  // 4. The threads that act on shared state. The peer group first: another member's model may
  // join the catalog while it loads, as it may at any time later.
  if (e.peers_) e.peers_->start(*e.peer_events_);
  RecoveryParts parts{*e.repo_, e.catalog_, e.references_, *e.flusher_, e.clock_, *e.models_, e.nvme_.get()};
  const auto cataloguing = std::chrono::steady_clock::now();
  CAIRN_RETURN_IF_ERROR(load_catalog(parts));
  const auto catalogued = std::chrono::steady_clock::now();
  e.recovery_ = recover_from_nvme(parts);
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  CAIRN_LOG_INFO(
      "start: repository opened in {} ms, tiers in {} ms, catalog of {} models built in {} ms, burst "
      "buffer recovered in {} ms",
      ms(opened_repo - opening), ms(cataloguing - opened_repo), e.catalog_.size(), ms(catalogued - cataloguing),
      ms(std::chrono::steady_clock::now() - catalogued));
  e.watch_->start();
  // Metrics for monitoring: last, once every component they read is up.
  if (metrics_options) {
    CAIRN_ASSIGN_OR_RETURN(e.metrics_, MetricsExporter::start(std::move(*metrics_options),
                                                              [&e](metrics::Format f) { return e.metrics_text(f); }));
  }
  return engine;
}

Engine::Engine(Opened o)
    : config_(std::move(o.config)),
      request_metrics_(MetricsExporter::enabled(config_) ? std::make_unique<RequestMetrics>(ops_in_table_order())
                                                         : nullptr),
      metrics_job_(resolve_peer_group(config_).job),
      started_unix_ns_(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count()),
      watchdog_(o.watchdog_bound),
      faulty_fs_(std::move(o.faulty)),
      faults_(faulty_fs_.get()),
      repo_(std::move(o.repo)),
      dram_(std::move(o.dram)),
      hbm_(std::move(o.hbm)),
      nvme_(std::move(o.nvme)),
      peers_(std::move(o.peers)),
      part_transport_(peers_ ? std::make_unique<PeerPartTransport>(*peers_) : nullptr),
      trace_(std::move(o.trace)),
      // The peer group's chunk source: after the burst buffer, before the repository (the last).
      tiers_(std::make_unique<TierManager>(*dram_, nvme_.get(), *repo_, std::move(o.admission),
                                           peers_ ? peers_->source() : nullptr)),
      references_(*dram_),
      named_(*dram_),
      // A model whose repository write failed is gone: out of the catalog and the reference counts.
      flusher_(std::make_unique<Flusher>(*repo_, *tiers_, nvme_.get(), tickets_,
                                         [this](const ModelManifest& m) {
                                           (void)catalog_.retire(m.id);
                                           (void)catalog_.erase(m.id);
                                           references_.count(m, -1);
                                         })),
      peer_catalog_(PeerCatalog::Parts{catalog_, references_, *flusher_, *repo_, clock_}),
      watch_(std::make_unique<RepositoryWatch>(
          RepositoryWatch::Parts{*repo_, catalog_, references_, clock_, &peer_catalog_.remote()},
          duration_of(config_.repository_refresh))),
      // A read that failed on missing bytes looks at the repository again, through the watch, so
      // that a peer's announcement of a model removed since is dropped too.
      models_(std::make_unique<ModelDirectory>(*flusher_, *repo_, peer_catalog_.remote(), watch_.get())),
      commits_(std::make_unique<CommitPath>(CommitPath::Parts{
          .dram = *dram_,
          .tiers = *tiers_,
          .repo = *repo_,
          .catalog = catalog_,
          .flusher = *flusher_,
          .references = references_,
          .tickets = tickets_,
          .models = *models_,
          .clock = clock_,
          .gc_mu = gc_mu_,
          .burst_buffer = nvme_ != nullptr,
          .trace = trace_.get(),
          // The peer group announces each model; the prefetcher gives a population member that
          // a hint named before it was stored its parent chances. (prefetcher_ is made below,
          // before any commit.)
          .committed =
              [this](const ModelManifest& m) {
                if (peers_) peers_->announce_model(m);
                if (prefetcher_) prefetcher_->committed(m);
              },
          .usage = &usage_,
          .view = watch_.get(),
          .part_transport = part_transport_.get(),
          .peer_catalog = &peer_catalog_,
          .peer_timeout = o.peer_timeout,
      })),
      prefetcher_(std::make_unique<Prefetcher>(Prefetcher::Parts{
          .dram = *dram_,
          .models = *models_,
          .mode = config_.policy.prefetch,
          .budget = config_.policy.prefetch_budget ? config_.policy.prefetch_budget : dram_->arena_size() / 4,
          .trace = trace_.get(),
          .nvme = nvme_.get(),
      })),
      reads_(std::make_unique<Reads>(Reads::Parts{
          .dram = *dram_,
          .tiers = *tiers_,
          .named = named_,
          .models = *models_,
          .gc_mu = gc_mu_,
          .chunk_size = repo_->chunk_size(),
          .usage = &usage_,
          .hbm = hbm_.get(),
          .observer = prefetcher_.get(),
          .trace = trace_.get(),
      })),
      admin_(std::make_unique<Admin>(Admin::Parts{
          .repo = *repo_,
          .catalog = catalog_,
          .flusher = *flusher_,
          .references = references_,
          .dram = *dram_,
          .nvme = nvme_.get(),
          .tiers = *tiers_,
          .nvme_path = config_.tiers.nvme.path,
          .recovery = recovery_,
          .gc_mu = gc_mu_,
          .prefetcher = prefetcher_.get(),
          .remote = &peer_catalog_.remote(),
          .hbm = hbm_.get(),
      })),
      queries_(std::make_unique<CatalogQueries>(catalog_, *models_, prefetcher_.get())),
      compute_(std::make_unique<ComputeWorker>(config_,
                                               config_.socket.empty() ? wire::default_socket_path() : config_.socket)),
      peer_events_(peers_ ? std::make_unique<RoutedPeerEvents>(peer_catalog_, *commits_->group_parts(), *reads_)
                          : nullptr) {
  prefetcher_->start(*reads_);
}

Engine::~Engine() {
  if (metrics_) metrics_->stop();      // first: its threads read every component
  compute_->stop();                    // the worker is a client of this daemon
  if (peers_) peers_->stop_staging();  // other members' `prefetch --all` read through reads_
  watch_->stop();
  prefetcher_->stop();
  // Parts held here for a model another member registered: until it is in the repository (or
  // fails, or that member leaves), so a clean exit does not take them with it.
  GroupParts* group_parts = commits_->group_parts();
  if (group_parts && !group_parts->drain_for(std::chrono::minutes(10)))
    CAIRN_LOG_WARN("exiting with parts of multi-part models held here that did not reach the repository");
  drain();
  flusher_->stop();
  named_.stop();
  tickets_.stop();
  if (group_parts) group_parts->stop();
  // The tier manager holds the peer group's chunk source; the peer group's service thread delivers
  // to components declared after it: both go before those components do.
  tiers_.reset();
  peers_.reset();
  if (nvme_) {
    Status st = nvme_->close();
    if (!st.ok()) CAIRN_LOG_ERROR("closing the burst buffer: {}", st.to_string());
  }
}

}  // namespace cairn
