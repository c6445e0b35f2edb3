// cairn-sim: replays a chunk-level trace (docs/policy.md) against LRU, ARC, S3-FIFO, the lineage
// scorer, the hint-aware scorer, the win-probability bound and Belady's offline reference over a
// range of cache sizes, and prints the hit ratios; or writes a synthetic trace of a workflow
// (--generate).
//
//   cairn-sim TRACE.csv [--sizes 0.125,0.25,0.5] [--policies lru,arc,s3fifo,lineage,hints,bound,belady]
//             [--json OUT]
//   cairn-sim --generate nas|ensemble|sweep|checkpoint --out F.csv [--seed N] [--scale X]
//
// Exit status: 0 on success, 1 on an error (the message names the file, line or option), 2 on bad
// usage.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/version.hpp"
#include "policy/simulator.hpp"
#include "policy/trace.hpp"
#include "policy/trace_gen.hpp"

namespace {

using cairn::Result;
using cairn::SimPolicy;
using cairn::SimResult;
using cairn::Status;
using nlohmann::json;

int fail(const Status& s) {
  std::fprintf(stderr, "cairn-sim: %s\n", s.to_string().c_str());
  return 1;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

Result<std::vector<double>> parse_sizes(const std::string& text) {
  std::vector<double> out;
  for (const std::string& item : split(text)) {
    double v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || end != item.data() + item.size() || item.empty() || !(v > 0) || std::isinf(v))
      return cairn::invalid_argument("--sizes: '" + item +
                                     "' is not a positive fraction of the working set (e.g. 0.25)");
    out.push_back(v);
  }
  return out;
}

Result<std::vector<SimPolicy>> parse_policies(const std::string& text) {
  std::vector<SimPolicy> out;
  for (const std::string& item : split(text)) {
    Result<SimPolicy> p = cairn::parse_sim_policy(item);
    if (!p.ok()) return cairn::invalid_argument("--policies: " + p.status().message());
    out.push_back(*p);
  }
  return out;
}

// The Belady result at the same capacity, if it was run.
const SimResult* belady_at(const std::vector<SimResult>& results, uint64_t capacity) {
  for (const SimResult& r : results)
    if (r.policy == SimPolicy::kBelady && r.capacity_bytes == capacity) return &r;
  return nullptr;
}

void print_table(const std::string& path, const cairn::TraceSummary& s, const std::vector<SimResult>& results) {
  std::printf("trace %s: %llu events, %llu reads of %llu chunks by %llu models, %llu inserts, %llu hints\n",
              path.c_str(), static_cast<unsigned long long>(s.events), static_cast<unsigned long long>(s.accesses),
              static_cast<unsigned long long>(s.chunks_accessed), static_cast<unsigned long long>(s.models),
              static_cast<unsigned long long>(s.inserts), static_cast<unsigned long long>(s.hints));
  const double unbounded =
      s.bytes_requested ? static_cast<double>(s.unbounded_bytes_hit) / static_cast<double>(s.bytes_requested) : 0;
  std::printf("working set %s (distinct bytes read), %s read; a cache that never evicts: byte hit ratio %.3f\n\n",
              human_bytes(s.working_set_bytes).c_str(), human_bytes(s.bytes_requested).c_str(), unbounded);
  // Tier columns only for the tiers the trace names.
  std::vector<int> tiers;
  for (int t = 1; t < cairn::kTraceTierCount; ++t)
    for (const SimResult& r : results)
      if (r.bytes_missed_by_tier[t]) {
        tiers.push_back(t);
        break;
      }
  std::printf("%-7s %-11s %-8s %9s %9s %9s %9s %11s", "size", "capacity", "policy", "hits", "obj_hit", "byte_hit",
              "vs_belady", "fetched");
  for (int t : tiers)
    std::printf(" %11s", (std::string("from_") + cairn::trace_tier_name(static_cast<cairn::TraceTier>(t))).c_str());
  std::printf("\n");
  double last_fraction = -1;
  for (const SimResult& r : results) {
    if (r.fraction != last_fraction && last_fraction >= 0) std::printf("\n");
    last_fraction = r.fraction;
    const SimResult* b = belady_at(results, r.capacity_bytes);
    char vs[16] = "-";
    if (b && b->byte_hit_ratio() > 0) std::snprintf(vs, sizeof vs, "%.3f", r.byte_hit_ratio() / b->byte_hit_ratio());
    std::printf("%-7g %-11s %-8s %9llu %9.3f %9.3f %9s %11s", r.fraction, human_bytes(r.capacity_bytes).c_str(),
                cairn::sim_policy_name(r.policy), static_cast<unsigned long long>(r.hits), r.object_hit_ratio(),
                r.byte_hit_ratio(), vs, human_bytes(r.bytes_missed()).c_str());
    for (int t : tiers) std::printf(" %11s", human_bytes(r.bytes_missed_by_tier[t]).c_str());
    std::printf("\n");
  }
}

json to_json(const std::string& path, const cairn::TraceSummary& s, const std::vector<SimResult>& results) {
  json out;
  out["trace"] = path;
  out["summary"] = {{"events", s.events},
                    {"accesses", s.accesses},
                    {"inserts", s.inserts},
                    {"hints", s.hints},
                    {"models", s.models},
                    {"chunks_accessed", s.chunks_accessed},
                    {"working_set_bytes", s.working_set_bytes},
                    {"bytes_requested", s.bytes_requested},
                    {"unbounded_hits", s.unbounded_hits},
                    {"unbounded_bytes_hit", s.unbounded_bytes_hit}};
  json rows = json::array();
  for (const SimResult& r : results) {
    json tiers;
    for (int t = 0; t < cairn::kTraceTierCount; ++t) {
      const char* name = cairn::trace_tier_name(static_cast<cairn::TraceTier>(t));
      tiers[*name ? name : "unknown"] = r.bytes_missed_by_tier[t];
    }
    json row = {{"policy", cairn::sim_policy_name(r.policy)},
                {"fraction", r.fraction},
                {"capacity_bytes", r.capacity_bytes},
                {"requests", r.requests},
                {"hits", r.hits},
                {"bytes_requested", r.bytes_requested},
                {"bytes_hit", r.bytes_hit},
                {"object_hit_ratio", r.object_hit_ratio()},
                {"byte_hit_ratio", r.byte_hit_ratio()},
                {"bytes_missed", r.bytes_missed()},
                {"bytes_missed_by_tier", tiers},
                {"evictions", r.evictions},
                {"bypassed", r.bypassed}};
    if (const SimResult* b = belady_at(results, r.capacity_bytes); b && b->byte_hit_ratio() > 0)
      row["byte_hit_ratio_vs_belady"] = r.byte_hit_ratio() / b->byte_hit_ratio();
    rows.push_back(std::move(row));
  }
  out["results"] = std::move(rows);
  return out;
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return cairn::errno_status("cannot create " + path, errno);
  f << text;
  f.close();
  if (!f) return cairn::io_error("cannot write " + path);
  return Status::OK();
}

int generate(const std::string& workload, const std::string& out, uint64_t seed, double scale) {
  if (out.empty()) return fail(cairn::invalid_argument("--generate needs --out FILE"));
  cairn::GenerateOptions options;
  options.seed = seed;
  options.scale = scale;
  Result<cairn::Trace> t = cairn::generate_trace(workload, options);
  if (!t.ok()) return fail(t.status());
  Status s = write_file(out, cairn::format_trace(*t));
  if (!s.ok()) return fail(s);
  std::printf("wrote %s: %zu events\n", out.c_str(), t->events.size());
  return 0;
}

int simulate(const std::string& path, const std::string& sizes_text, const std::string& policies_text,
             const std::string& json_out, bool warm_writes) {
  Result<std::vector<double>> sizes = parse_sizes(sizes_text);
  if (!sizes.ok()) return fail(sizes.status());
  Result<std::vector<SimPolicy>> policies = parse_policies(policies_text);
  if (!policies.ok()) return fail(policies.status());
  Result<cairn::Trace> trace = cairn::read_trace_file(path);
  if (!trace.ok()) return fail(trace.status());
  cairn::SimOptions options;
  options.cold_writes = !warm_writes;
  Result<cairn::Simulator> sim = cairn::Simulator::create(*trace, options);
  if (!sim.ok()) return fail(sim.status().with_context(path));
  if (sim->summary().working_set_bytes == 0)
    return fail(cairn::invalid_argument(path + ": the trace reads nothing (no access events): nothing to simulate"));
  const std::vector<SimResult> results = sim->run_fractions(*policies, *sizes);
  print_table(path, sim->summary(), results);
  if (!json_out.empty()) {
    Status s = write_file(json_out, to_json(path, sim->summary(), results).dump(2) + "\n");
    if (!s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cairn-sim — replays a chunk-level trace against eviction policies and Belady's optimum"};
  app.set_version_flag("--version", std::string("cairn-sim ") + cairn::version_string(), "print the version and exit");
  std::string trace, sizes = "0.125,0.25,0.5", policies = "lru,arc,s3fifo,lineage,hints,bound,belady", json_out;
  std::string workload, out;
  uint64_t seed = 1;
  double scale = 1.0;
  app.add_option("TRACE", trace, "trace file (CSV, docs/policy.md \"Trace format\")");
  app.add_option("--sizes", sizes,
                 "cache sizes as fractions of the working set, comma-separated (default: 0.125,0.25,0.5)");
  app.add_option("--policies", policies,
                 "comma-separated: lru, arc, s3fifo, lineage, hints, bound, belady (default: all)");
  app.add_option("--json", json_out, "also write the results as JSON to this file");
  bool warm_writes = false;
  app.add_flag("--warm-writes", warm_writes,
               "replay a commit's written chunks as reads (the policies before cold writes)");
  auto* gen =
      app.add_option("--generate", workload, "write a synthetic trace instead: nas, ensemble, sweep or checkpoint");
  app.add_option("--out", out, "with --generate: the trace file to write");
  app.add_option("--seed", seed, "with --generate: PRNG seed (default: 1)");
  app.add_option("--scale", scale, "with --generate: length multiplier (default: 1)");
  CLI11_PARSE(app, argc, argv);
  if (gen->count() > 0) {
    if (!trace.empty()) return fail(cairn::invalid_argument("give either TRACE or --generate, not both"));
    return generate(workload, out, seed, scale);
  }
  if (trace.empty()) {
    std::fprintf(stderr, "cairn-sim: a TRACE file (or --generate) is required\n%s", app.help().c_str());
    return 2;
  }
  return simulate(trace, sizes, policies, json_out, warm_writes);
}
