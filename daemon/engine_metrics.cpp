// The engine's metrics for monitoring (docs/metrics.md): what `stats` reports, in the text
// exposition formats, and the recording of every request's latency and status.
//
// The values are read through the same calls as the `stats` request (Admin::stats and the others
// the dispatch table adds), so a scrape and `cairn stats --json` taken together agree.
#include <chrono>
#include <string>
#include <vector>

#include "core/metrics.hpp"
#include "core/version.hpp"
#include "daemon/engine.hpp"

namespace cairn {
namespace {

using metrics::Family;
using metrics::Label;
using metrics::Type;
using nlohmann::json;

// A non-negative integer field of a stats object (0 when absent or not a number).
uint64_t count_of(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer()) return it->get<int64_t>() < 0 ? 0 : static_cast<uint64_t>(it->get<int64_t>());
  const double d = it->get<double>();
  return d > 0 ? static_cast<uint64_t>(d) : 0;
}

// The object field `key` of a stats object (an empty object when absent).
const json& field(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it == j.end() ? kEmpty : *it;
}

// Writes families of one sample each, every sample with the common labels.
class Writer {
 public:
  Writer(std::string& out, metrics::Format format, metrics::Labels common)
      : out_(out), format_(format), common_(common) {}

  void counter(const std::string& name, const char* unit, const std::string& help, uint64_t value) {
    one({name, Type::kCounter, unit, help}, value);
  }
  void gauge(const std::string& name, const char* unit, const std::string& help, uint64_t value) {
    one({name, Type::kGauge, unit, help}, value);
  }
  void gauge(const std::string& name, const char* unit, const std::string& help, double value) {
    const Family f{name, Type::kGauge, unit, help};
    metrics::append_header(out_, format_, f);
    metrics::append_sample(out_, f, common_, value);
  }
  // A gauge of value 1 whose labels carry the information (`cairn_build_info`).
  void info(const std::string& name, const std::string& help, std::initializer_list<Label> labels) {
    const Family f{name, Type::kGauge, "", help};
    std::vector<Label> all(common_.begin(), common_.end());
    all.insert(all.end(), labels.begin(), labels.end());
    metrics::append_header(out_, format_, f);
    metrics::append_sample(out_, f, all, uint64_t{1});
  }

 private:
  void one(const Family& f, uint64_t value) {
    metrics::append_header(out_, format_, f);
    metrics::append_sample(out_, f, common_, value);
  }

  std::string& out_;
  const metrics::Format format_;
  const metrics::Labels common_;
};

// One tier's families: cairn_<tier>_... from its `stats` entry (tiers.<tier>).
void append_tier(Writer& w, const std::string& tier, const json& t, const std::string& what) {
  const std::string p = "cairn_" + tier + "_";
  w.gauge(p + "capacity_bytes", "bytes", "Bytes the " + what + " may hold", count_of(t, "capacity_bytes"));
  w.gauge(p + "used_bytes", "bytes", "Bytes the " + what + " holds", count_of(t, "used_bytes"));
  w.gauge(p + "chunks", "", "Chunks the " + what + " holds", count_of(t, "chunks"));
  w.counter(p + "hits", "", "Chunk reads served from the " + what, count_of(t, "hits"));
  w.counter(p + "misses", "", "Chunk lookups the " + what + " could not serve", count_of(t, "misses"));
  w.counter(p + "admitted_bytes", "bytes", "Chunk bytes that entered the " + what, count_of(t, "bytes_in"));
  w.counter(p + "evicted_bytes", "bytes", "Chunk bytes that left the " + what + " (evicted or demoted)",
            count_of(t, "bytes_out"));
  if (tier != "hbm")
    w.gauge(p + "dirty_bytes", "bytes", "Bytes in the " + what + " not yet in the repository",
            count_of(t, "dirty_bytes"));
}

}  // namespace

void Engine::record_request(size_t slot, const json& request, StatusCode code,
                            std::chrono::steady_clock::duration took) {
  request_metrics_->record(slot, code, std::chrono::duration_cast<std::chrono::nanoseconds>(took));
  static const size_t kCommit = op_slot("commit");
  if (slot != kCommit || code != StatusCode::kOk) return;
  auto d = request.find("durability");
  if (d == request.end()) {
    request_metrics_->record_commit(Durability::kGlobal);  // the protocol's default
  } else if (d->is_string()) {
    if (auto level = durability_from_name(d->get<std::string>())) request_metrics_->record_commit(*level);
  }
}

std::string Engine::metrics_text(metrics::Format format) {
  std::vector<Label> common;
  if (!metrics_job_.empty()) common.push_back({"job_id", metrics_job_});
  std::string out;
  Writer w(out, format, common);

  w.info("cairn_build_info", "The cairnd build serving these metrics (value 1)", {{"version", version()}});
  w.gauge("cairn_start_time_seconds", "seconds", "When this daemon started, in seconds since the Unix epoch",
          static_cast<double>(started_unix_ns_) / 1e9);

  // The tiers and the repository, as `stats` reports them.
  auto stats = admin_->stats();
  if (stats.ok()) {
    const json& s = *stats;
    const json& tiers = field(s, "tiers");
    static const std::pair<const char*, const char*> kTiers[] = {
        {"hbm", "GPU memory tier"}, {"dram", "DRAM tier"}, {"nvme", "NVMe burst buffer"}};
    for (const auto& [tier, what] : kTiers) {
      const json& t = field(tiers, tier);
      if (t.value("enabled", false)) append_tier(w, tier, t, what);
    }
    const json& dram = field(tiers, "dram");
    w.gauge("cairn_dram_pinned_bytes", "bytes", "DRAM tier bytes pinned by leases, staging and flushing",
            count_of(dram, "pinned_bytes"));
    w.counter("cairn_dram_backpressure_waits", "",
              "Allocations in the DRAM tier that waited for dirty data to be written down",
              count_of(dram, "backpressure_waits"));
    // The repository (tiers.pfs and repository).
    const json& pfs = field(tiers, "pfs");
    w.counter("cairn_repository_read_bytes", "bytes", "Chunk bytes read from the repository",
              count_of(pfs, "bytes_out"));
    w.counter("cairn_repository_written_bytes", "bytes", "Chunk bytes written to the repository",
              count_of(pfs, "bytes_in"));
    w.counter("cairn_repository_chunk_reads", "", "Chunks read from the repository", count_of(pfs, "hits"));
    const json& repo = field(s, "repository");
    w.gauge("cairn_repository_chunks", "", "Chunks in the repository", count_of(repo, "chunks"));
    w.gauge("cairn_repository_models", "", "Models in the repository", count_of(repo, "models"));
    w.gauge("cairn_repository_logical_bytes", "bytes", "Bytes of every model in the repository, counted per model",
            count_of(repo, "logical_bytes"));
    w.gauge("cairn_repository_physical_bytes", "bytes", "Bytes the repository stores (each chunk once)",
            count_of(repo, "physical_bytes"));
    w.gauge("cairn_repository_stored_bytes", "bytes",
            "Bytes the repository's chunks take in its pack files, coded (each chunk once)",
            count_of(repo, "stored_bytes"));
    const json& flush = field(s, "flush");
    w.gauge("cairn_flush_pending_models", "", "Models acknowledged and not yet in the repository",
            count_of(flush, "pending_models"));
    w.gauge("cairn_flush_awaiting_local_models", "", "Pending models not yet on the burst buffer",
            count_of(flush, "awaiting_local"));
    w.gauge("cairn_flush_local_not_global_models", "", "Pending models on the burst buffer, not yet in the repository",
            count_of(flush, "local_not_global"));
    w.counter("cairn_flush_write_retries", "", "Repository writes of acknowledged models that failed and were retried",
              count_of(flush, "repository_write_retries"));
    const json& prefetch = field(s, "prefetch");
    w.gauge("cairn_prefetch_queued_jobs", "", "Prefetch jobs waiting to be staged", count_of(prefetch, "queued"));
    w.counter("cairn_prefetch_staged_bytes", "bytes", "Bytes staged ahead of reads by the prefetcher",
              count_of(prefetch, "bytes_staged"));
    w.counter("cairn_hints", "", "Hints received from workflows", count_of(prefetch, "hints"));
  }

  // Requests in flight and leases (the dispatch table's additions to `stats`).
  const json watchdog = watchdog_.stats();
  w.gauge("cairn_requests_in_flight", "", "Client requests being served", count_of(watchdog, "in_flight"));
  w.counter("cairn_watchdog_stuck_requests", "", "Requests reported stuck by the watchdog",
            count_of(watchdog, "stuck_reported"));
  w.gauge("cairn_leases", "", "Read leases clients hold", count_of(reads_->lease_stats(), "leases"));

  // The job's peer group.
  if (peers_) {
    const json p = peers_->status();
    uint64_t verified = 0;
    if (auto m = p.find("members"); m != p.end() && m->is_array())
      for (const auto& member : *m) verified += member.value("state", std::string()) == "verified" ? 1 : 0;
    w.gauge("cairn_peer_members", "", "Other daemons of the job's peer group this daemon talks to", verified);
    w.counter("cairn_peer_sent_bytes", "bytes", "Chunk bytes sent to other members of the peer group",
              count_of(p, "served_bytes"));
    w.counter("cairn_peer_received_bytes", "bytes", "Chunk bytes received from other members of the peer group",
              count_of(p, "fetched_bytes"));
    w.counter("cairn_peer_timeouts", "", "Peer requests that timed out", count_of(p, "timeouts"));
  }

  if (request_metrics_) request_metrics_->append(out, format, common);
  metrics::append_eof(out, format);
  return out;
}

}  // namespace cairn
