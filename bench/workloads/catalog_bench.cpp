// best_ancestor latency of the catalog's inverted index at 1k, 10k and 100k models, against the two
// ways of answering it without one, on the same models in the same run:
//   scan   the catalog's linear scan (best_ancestor_scan): the candidate compared with every stored
//          graph, EvoStore's method;
//   redis  EvoStore's Redis baseline: each model a Redis set of its layer signatures in a real
//          redis-server started here, the best match found by intersecting the candidate's set with
//          every model's (SINTERCARD, pipelined in batches), ties by score (a Redis hash), then newer.
// Every index answer must equal the scan's (a correctness check: disagreements are printed and the
// exit status is 1); Redis's best match must match as many of the candidate's layers as the index's.
// Also: adds per second (compile + add), heap bytes per model, peak RSS.
//
// Models come from a regularized-evolution run (nas_graphs.hpp); queries are unseen candidates:
// mutations of random stored models, and a few fresh random graphs.
//
// Usage: cairn_bench_catalog [--sizes 1000,10000,100000] [--queries 300] [--redis-queries 20]
//                            [--quick] [--seed 1] [--no-redis] [--json FILE]
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/workloads/nas_graphs.hpp"
#include "core/graph.hpp"
#include "daemon/catalog.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Latency {
  double median_us = 0;
  double p99_us = 0;
  size_t n = 0;
};
Latency summarize(std::vector<double> us) {
  Latency l;
  l.n = us.size();
  if (us.empty()) return l;
  std::sort(us.begin(), us.end());
  l.median_us = us[us.size() / 2];
  l.p99_us = us[static_cast<size_t>(std::ceil(0.99 * static_cast<double>(us.size()))) - 1];
  return l;
}
json to_json(const Latency& l) { return {{"median_us", l.median_us}, {"p99_us", l.p99_us}, {"queries", l.n}}; }

std::string model_id(size_t i) { return "nas-" + std::to_string(i); }

// ---- cleanup: the redis-server we started and its directory go on every exit ----

pid_t g_redis_pid = -1;
fs::path g_tmpdir;

void cleanup() {
  if (g_redis_pid > 0) {
    ::kill(g_redis_pid, SIGTERM);
    int st = 0;
    ::waitpid(g_redis_pid, &st, 0);
    g_redis_pid = -1;
  }
  if (!g_tmpdir.empty()) {
    std::error_code ec;
    fs::remove_all(g_tmpdir, ec);
    g_tmpdir.clear();
  }
}

// On SIGINT or SIGTERM: only async-signal-safe calls, on paths prepared beforehand.
char g_sock_path[256], g_log_path[256], g_dir_path[256];
extern "C" void on_signal(int sig) {
  if (g_redis_pid > 0) {
    ::kill(g_redis_pid, SIGTERM);
    ::waitpid(g_redis_pid, nullptr, 0);
  }
  if (g_dir_path[0]) {
    ::unlink(g_sock_path);
    ::unlink(g_log_path);
    ::rmdir(g_dir_path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "cairn_bench_catalog: %s\n", what.c_str());
  std::exit(1);  // runs cleanup()
}

void check(const cairn::Status& s, const std::string& what) {
  if (!s.ok()) fail(what + ": " + s.to_string());
}

// ---- memory ----

size_t heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = ::mallinfo2();
  return mi.uordblks + mi.hblkhd;
#else
  return 0;
#endif
}
double peak_rss_mib() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

// ---- the machine ----

json machine() {
  json m;
  m["nproc"] = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      m["cpu"] = colon == std::string::npos ? line : line.substr(colon + 2);
      break;
    }
  if (!m.contains("cpu")) m["cpu"] = "unknown";
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemTotal:", 0) == 0)
      m["mem_total_gib"] = std::strtod(line.c_str() + 9, nullptr) / (1024.0 * 1024.0);
  return m;
}

// ---- Redis: EvoStore's baseline ----

std::optional<std::string> find_redis_server() {
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string dir; std::getline(ss, dir, ':');) {
      std::string p = (dir.empty() ? std::string(".") : dir) + "/redis-server";
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
  }
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"})
    if (::access(p, X_OK) == 0) return std::string(p);
  return std::nullopt;
}

class Redis {
 public:
  // Starts redis-server on a Unix socket in dir (no TCP port, no persistence) and connects.
  void start(const std::string& binary, const fs::path& dir) {
    std::string sock = (dir / "redis.sock").string(), log = (dir / "redis.log").string();
    pid_t pid = ::fork();
    if (pid < 0) fail("fork: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // gone with us, however we end
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(binary.c_str(), "redis-server", "--port", "0", "--unixsocket", sock.c_str(), "--save", "", "--appendonly",
              "no", "--dir", dir.c_str(), "--daemonize", "no", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    g_redis_pid = pid;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        g_redis_pid = -1;
        std::ifstream in(log);
        std::stringstream text;
        text << in.rdbuf();
        fail("redis-server exited at start:\n" + text.str());
      }
      if (::access(sock.c_str(), F_OK) == 0) {
        ctx_ = ::redisConnectUnix(sock.c_str());
        if (ctx_ && !ctx_->err) break;
        if (ctx_) ::redisFree(ctx_);
        ctx_ = nullptr;
      }
      if (Clock::now() > deadline) fail("redis-server did not open " + sock + " within 10 s");
      ::usleep(20000);
    }
    reply_free(command({"PING"}));
    std::string info = info_field("server", "redis_version");
    version_ = info.empty() ? "?" : info;
  }

  ~Redis() {
    if (ctx_) ::redisFree(ctx_);
  }

  const std::string& version() const { return version_; }

  // Pipelining: queue commands, then read their replies in order.
  void append(const std::vector<std::string>& args) {
    argv_.clear();
    lens_.clear();
    for (const auto& a : args) {
      argv_.push_back(a.data());
      lens_.push_back(a.size());
    }
    if (::redisAppendCommandArgv(ctx_, static_cast<int>(args.size()), argv_.data(), lens_.data()) != REDIS_OK)
      fail(std::string("redis: ") + ctx_->errstr);
  }
  redisReply* reply() {
    void* r = nullptr;
    if (::redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) fail(std::string("redis: ") + ctx_->errstr);
    auto* rep = static_cast<redisReply*>(r);
    if (rep->type == REDIS_REPLY_ERROR) fail("redis: " + std::string(rep->str, rep->len));
    return rep;
  }
  static void reply_free(redisReply* r) { ::freeReplyObject(r); }
  redisReply* command(const std::vector<std::string>& args) {
    append(args);
    return reply();
  }
  long long integer_reply() {
    redisReply* r = reply();
    long long v = r->integer;
    reply_free(r);
    return v;
  }
  void discard_replies(size_t n) {
    for (size_t i = 0; i < n; ++i) reply_free(reply());
  }

  std::string info_field(const std::string& section, const std::string& field) {
    redisReply* r = command({"INFO", section});
    std::string text(r->str, r->len), value;
    reply_free(r);
    std::stringstream ss(text);
    for (std::string line; std::getline(ss, line);)
      if (line.rfind(field + ":", 0) == 0) {
        value = line.substr(field.size() + 1);
        while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) value.pop_back();
      }
    return value;
  }

 private:
  redisContext* ctx_ = nullptr;
  std::string version_;
  std::vector<const char*> argv_;
  std::vector<size_t> lens_;
};

std::vector<std::string> signature_hexes(const cairn::Graph& g) {
  std::vector<std::string> out;
  for (const auto& [name, sig] : cairn::layer_signatures(g)) out.push_back(sig.hex());
  return out;
}

struct RedisMatch {
  long long model = -1;  // index; -1 when no model shares a signature
  long long shared = 0;  // distinct signatures in common
};

// The best match the way an EvoStore user finds it: the candidate's signatures as a temporary set,
// then SINTERCARD with every model's set (pipelined, kBatch commands per round trip); among the
// models with the most in common, the highest score (HMGET on the scores hash), then the newest.
RedisMatch redis_best(Redis& r, const std::vector<std::string>& candidate, size_t n_models) {
  constexpr size_t kBatch = 1000;
  std::vector<std::string> sadd = {"SADD", "q"};
  sadd.insert(sadd.end(), candidate.begin(), candidate.end());
  r.append({"DEL", "q"});
  r.append(sadd);
  r.discard_replies(2);

  std::vector<long long> shared(n_models);
  std::vector<std::string> cmd = {"SINTERCARD", "2", "q", ""};
  for (size_t b = 0; b < n_models; b += kBatch) {
    size_t e = std::min(n_models, b + kBatch);
    for (size_t i = b; i < e; ++i) {
      cmd[3] = "m:" + model_id(i);
      r.append(cmd);
    }
    for (size_t i = b; i < e; ++i) shared[i] = r.integer_reply();
  }
  RedisMatch best;
  long long most = *std::max_element(shared.begin(), shared.end());
  if (most > 0) {
    std::vector<size_t> tied;
    for (size_t i = 0; i < n_models; ++i)
      if (shared[i] == most) tied.push_back(i);
    best.shared = most;
    best.model = static_cast<long long>(tied.back());
    if (tied.size() > 1) {
      double top = -INFINITY;
      for (size_t b = 0; b < tied.size(); b += kBatch) {
        size_t e = std::min(tied.size(), b + kBatch);
        std::vector<std::string> hmget = {"HMGET", "scores"};
        for (size_t k = b; k < e; ++k) hmget.push_back(model_id(tied[k]));
        redisReply* rep = r.command(hmget);
        for (size_t k = b; k < e; ++k) {
          const redisReply* v = rep->element[k - b];
          double s = v->type == REDIS_REPLY_STRING ? std::strtod(v->str, nullptr) : -INFINITY;
          if (s >= top) {  // >=: ascending indices, so the newest wins a tie
            top = s;
            best.model = static_cast<long long>(tied[k]);
          }
        }
        Redis::reply_free(rep);
      }
    }
  }
  r.append({"DEL", "q"});
  r.discard_replies(1);
  return best;
}

// ---- one catalog size ----

struct Options {
  std::vector<size_t> sizes = {1000, 10000, 100000};
  size_t queries = 300;
  size_t redis_queries = 20;  // above kRedisAllQueries models
  uint64_t seed = 1;
  bool redis = true;
  std::string json_file;
};
constexpr size_t kRedisAllQueries = 10000;  // up to this many models, Redis answers every query
constexpr double kFreshCandidates = 0.1;    // candidates that are fresh random graphs, not mutations

std::string describe(const cairn::BestAncestor& a) {
  char buf[64] = "none";
  if (a.score) std::snprintf(buf, sizeof buf, "%.6f", *a.score);
  return "model '" + a.model + "' matched " + std::to_string(a.matched) + " score " + buf;
}

json run_size(size_t n, const Options& opt, const cairn::bench::NasSpace& space, Redis* redis, size_t* disagreements) {
  using cairn::bench::nas_detail::below;
  using cairn::bench::nas_detail::chance;
  std::fprintf(stderr, "[%zu models] generating, adding%s...\n", n, redis ? " and loading Redis" : "");

  // Which stored models the candidates will mutate: their graphs are kept while the run streams by.
  std::mt19937_64 qrng(opt.seed * 1000003 + n);
  std::vector<long long> cand_parent(opt.queries);
  std::unordered_map<size_t, std::shared_ptr<const cairn::Graph>> kept;
  for (auto& p : cand_parent) {
    p = chance(qrng, kFreshCandidates) ? -1 : static_cast<long long>(below(qrng, n));
    if (p >= 0) kept.emplace(static_cast<size_t>(p), nullptr);
  }

  auto catalog = std::make_unique<cairn::Catalog>();
  cairn::bench::NasEvolution evo(opt.seed, space);
  double t_gen = 0, t_add = 0, t_redis_load = 0, layers = 0;
  size_t pending_replies = 0;
  if (redis) Redis::reply_free(redis->command({"FLUSHALL"}));
  for (size_t i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    auto m = evo.next();
    auto t1 = Clock::now();
    cairn::GraphHandle h = catalog->compile(*m.graph);
    check(catalog->add(model_id(i), m.parent < 0 ? "" : model_id(static_cast<size_t>(m.parent)), std::move(h),
                       json{{"score", m.score}}),
          "adding " + model_id(i));
    auto t2 = Clock::now();
    t_gen += seconds(t1 - t0);
    t_add += seconds(t2 - t1);
    layers += static_cast<double>(m.graph->layers.size());
    if (auto it = kept.find(i); it != kept.end()) it->second = m.graph;
    if (redis) {
      std::vector<std::string> sadd = {"SADD", "m:" + model_id(i)};
      for (auto& hex : signature_hexes(*m.graph)) sadd.push_back(std::move(hex));
      char score[32];
      std::snprintf(score, sizeof score, "%.17g", m.score);
      auto t3 = Clock::now();
      redis->append(sadd);
      redis->append({"HSET", "scores", model_id(i), score});
      pending_replies += 2;
      if (pending_replies >= 1000 || i + 1 == n) {
        redis->discard_replies(pending_replies);
        pending_replies = 0;
      }
      t_redis_load += seconds(Clock::now() - t3);
    }
  }
  if (catalog->size() != n || catalog->live() != n)
    fail("the catalog holds " + std::to_string(catalog->size()) + " models");

  // Unseen candidates.
  std::vector<cairn::Graph> candidates;
  candidates.reserve(opt.queries);
  for (long long p : cand_parent)
    candidates.push_back(p >= 0 ? cairn::bench::mutate(*kept.at(static_cast<size_t>(p)), qrng, space)
                                : cairn::bench::random_graph(qrng, space));
  kept.clear();
  std::vector<cairn::GraphHandle> handles;
  for (const auto& g : candidates) handles.push_back(catalog->compile(g));

  // Index and scan, alternating which goes first.
  std::fprintf(stderr, "[%zu models] %zu queries, index and scan...\n", n, handles.size());
  (void)catalog->best_ancestor(handles[0]);
  (void)catalog->best_ancestor_scan(handles[0]);
  std::vector<double> t_index, t_scan;
  std::vector<cairn::BestAncestor> answers;
  size_t differ = 0;
  double matched_frac = 0;
  for (size_t q = 0; q < handles.size(); ++q) {
    cairn::BestAncestor a, b;
    auto time_index = [&] {
      auto t0 = Clock::now();
      a = catalog->best_ancestor(handles[q]);
      t_index.push_back(micros(Clock::now() - t0));
    };
    auto time_scan = [&] {
      auto t0 = Clock::now();
      b = catalog->best_ancestor_scan(handles[q]);
      t_scan.push_back(micros(Clock::now() - t0));
    };
    if (q % 2 == 0)
      time_index(), time_scan();
    else
      time_scan(), time_index();
    if (!(a == b)) {
      if (differ++ < 10)
        std::fprintf(stderr, "DISAGREEMENT at %zu models, candidate %zu (%s):\n  index: %s\n  scan:  %s\n", n, q,
                     cand_parent[q] >= 0 ? ("a mutation of " + model_id(static_cast<size_t>(cand_parent[q]))).c_str()
                                         : "a fresh random graph",
                     describe(a).c_str(), describe(b).c_str());
    }
    matched_frac += static_cast<double>(a.matched) / static_cast<double>(candidates[q].layers.size());
    answers.push_back(std::move(a));
  }
  *disagreements += differ;

  json out;
  out["models"] = n;
  out["mean_layers"] = layers / static_cast<double>(n);
  out["generate_per_s"] = static_cast<double>(n) / t_gen;
  out["adds_per_s"] = static_cast<double>(n) / t_add;  // compile + add
  out["queries"] = handles.size();
  out["mean_matched_fraction"] = matched_frac / static_cast<double>(handles.size());
  Latency li = summarize(t_index), ls = summarize(t_scan);
  out["index"] = to_json(li);
  out["scan"] = to_json(ls);
  out["scan_vs_index"] = ls.median_us / li.median_us;
  out["index_equals_scan"] = handles.size() - differ;

  if (redis) {
    size_t rq = n <= kRedisAllQueries ? handles.size() : std::min(handles.size(), opt.redis_queries);
    std::fprintf(stderr, "[%zu models] %zu Redis queries...\n", n, rq);
    std::vector<double> t_redis;
    size_t same_matched = 0, same_model = 0, shown = 0;
    for (size_t q = 0; q < rq; ++q) {
      std::vector<std::string> hex = signature_hexes(candidates[q]);
      auto t0 = Clock::now();
      RedisMatch m = redis_best(*redis, hex, n);
      t_redis.push_back(micros(Clock::now() - t0));
      // Redis counts distinct signatures; the index counts the candidate's layers that match.
      size_t layers_matched = 0;
      std::string model = m.model < 0 ? "" : model_id(static_cast<size_t>(m.model));
      if (m.model >= 0) {
        cairn::GraphHandle g = catalog->graph_of(model);
        for (const auto& s : handles[q]->signatures) layers_matched += g && g->contains(s) ? 1 : 0;
      }
      if (layers_matched == answers[q].matched)
        ++same_matched;
      else if (shown++ < 5)
        std::fprintf(stderr,
                     "redis differs at %zu models, candidate %zu: redis %s (%zu layers, %lld signatures), index %s\n",
                     n, q, model.c_str(), layers_matched, m.shared, describe(answers[q]).c_str());
      if (model == answers[q].model) ++same_model;
    }
    Latency lr = summarize(t_redis);
    out["redis"] = to_json(lr);
    out["redis_vs_index"] = lr.median_us / li.median_us;
    out["redis_matched_agrees"] = same_matched;
    out["redis_same_model"] = same_model;
    out["redis_loads_per_s"] = static_cast<double>(n) / t_redis_load;
    out["redis_used_memory_bytes_per_model"] =
        std::strtod(redis->info_field("memory", "used_memory").c_str(), nullptr) / static_cast<double>(n);
  }

  // Memory: the heap the catalog gives back when it goes (the candidates' handles go first).
  handles.clear();
  answers.clear();
  size_t heap_with = heap_in_use();
  catalog.reset();
  size_t heap_without = heap_in_use();
  out["catalog_heap_bytes_per_model"] =
      heap_with > heap_without ? static_cast<double>(heap_with - heap_without) / static_cast<double>(n) : 0.0;
  out["peak_rss_mib"] = peak_rss_mib();
  ::malloc_trim(0);
  return out;
}

std::vector<size_t> parse_sizes(const std::string& s) {
  std::vector<size_t> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    size_t v = std::strtoull(x.c_str(), nullptr, 10);
    if (v == 0) return {};
    out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  bool queries_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc)
      opt.sizes = parse_sizes(argv[++i]);
    else if (a == "--queries" && i + 1 < argc)
      opt.queries = std::strtoull(argv[++i], nullptr, 10), queries_given = true;
    else if (a == "--redis-queries" && i + 1 < argc)
      opt.redis_queries = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--seed" && i + 1 < argc)
      opt.seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--quick") {
      opt.sizes = {1000, 10000};
      if (!queries_given) opt.queries = 100;
    } else if (a == "--no-redis")
      opt.redis = false;
    else if (a == "--json" && i + 1 < argc)
      opt.json_file = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: cairn_bench_catalog [--sizes 1000,10000,100000] [--queries 300] [--redis-queries 20]\n"
                   "                           [--quick] [--seed 1] [--no-redis] [--json FILE]\n");
      return 2;
    }
  }
  if (opt.sizes.empty() || opt.queries == 0 || opt.redis_queries == 0) {
    std::fprintf(stderr, "cairn_bench_catalog: sizes, queries and redis queries must be positive\n");
    return 2;
  }
  std::atexit(cleanup);
  cairn::bench::NasSpace space;

  json out;
  out["machine"] = machine();
  out["seed"] = opt.seed;
  out["queries"] = opt.queries;
  out["space"] = {{"layers", {space.min_layers, space.max_layers}},
                  {"population", space.population},
                  {"sample", space.sample},
                  {"fresh_candidates", kFreshCandidates}};

  std::unique_ptr<Redis> redis;
  std::string redis_note;
  if (!opt.redis) {
    redis_note = "Redis baseline skipped (--no-redis)";
  } else if (auto bin = find_redis_server()) {
    g_tmpdir = fs::temp_directory_path() / ("cairn-bench-catalog-" + std::to_string(::getpid()));
    fs::create_directories(g_tmpdir);
    std::snprintf(g_sock_path, sizeof g_sock_path, "%s", (g_tmpdir / "redis.sock").c_str());
    std::snprintf(g_log_path, sizeof g_log_path, "%s", (g_tmpdir / "redis.log").c_str());
    std::snprintf(g_dir_path, sizeof g_dir_path, "%s", g_tmpdir.c_str());
    ::signal(SIGINT, on_signal);
    ::signal(SIGTERM, on_signal);
    redis = std::make_unique<Redis>();
    redis->start(*bin, g_tmpdir);
    redis_note = "redis-server " + redis->version() + " (" + *bin + ", Unix socket, no persistence)";
    out["redis_server"] = redis->version();
  } else {
    redis_note = "redis-server not found (PATH, /usr/bin, /usr/local/bin): Redis baseline skipped";
  }
  out["redis"] = redis_note;

  size_t disagreements = 0;
  for (size_t n : opt.sizes) out["sizes"].push_back(run_size(n, opt, space, redis.get(), &disagreements));
  redis.reset();
  cleanup();  // stop redis-server now rather than at exit

  const json& m = out["machine"];
  std::printf("catalog best_ancestor: inverted index vs linear scan (EvoStore's method) vs Redis set intersection\n");
  std::printf("machine: %lld CPUs, %s, %.1f GiB\n", m["nproc"].get<long long>(), m["cpu"].get<std::string>().c_str(),
              m.value("mem_total_gib", 0.0));
  std::printf("models: regularized evolution (population %zu, sample %zu, %zu-%zu layers), seed %llu\n",
              space.population, space.sample, space.min_layers, space.max_layers,
              static_cast<unsigned long long>(opt.seed));
  std::printf("queries: %zu unseen candidates per size (%.0f%% mutations of random stored models, the rest fresh)\n",
              opt.queries, 100 * (1 - kFreshCandidates));
  std::printf("redis: %s", redis_note.c_str());
  if (out.contains("redis_server"))
    std::printf("; every query up to %zu models, the first %zu above (p99 of so few is about the max)",
                kRedisAllQueries, opt.redis_queries);
  std::printf("\n\n");
  std::printf("%8s %9s | %17s | %19s %8s | %21s %9s | %11s %13s | %9s %8s\n", "models", "adds/s", "index us med/p99",
              "scan us med/p99", "scan/idx", "redis us med/p99 (q)", "redis/idx", "index=scan", "redis matched",
              "heap B/mod", "peak MiB");
  for (const auto& s : out["sizes"]) {
    char redis_lat[64] = "-", redis_ratio[32] = "-", redis_agree[32] = "-";
    if (s.contains("redis")) {
      std::snprintf(redis_lat, sizeof redis_lat, "%.0f / %.0f (%zu)", s["redis"]["median_us"].get<double>(),
                    s["redis"]["p99_us"].get<double>(), s["redis"]["queries"].get<size_t>());
      std::snprintf(redis_ratio, sizeof redis_ratio, "%.0fx", s["redis_vs_index"].get<double>());
      std::snprintf(redis_agree, sizeof redis_agree, "%zu/%zu", s["redis_matched_agrees"].get<size_t>(),
                    s["redis"]["queries"].get<size_t>());
    }
    char idx[48], scan[48], ratio[32], agree[32];
    std::snprintf(idx, sizeof idx, "%.1f / %.1f", s["index"]["median_us"].get<double>(),
                  s["index"]["p99_us"].get<double>());
    std::snprintf(scan, sizeof scan, "%.0f / %.0f", s["scan"]["median_us"].get<double>(),
                  s["scan"]["p99_us"].get<double>());
    std::snprintf(ratio, sizeof ratio, s["scan_vs_index"].get<double>() < 10 ? "%.1fx" : "%.0fx",
                  s["scan_vs_index"].get<double>());
    std::snprintf(agree, sizeof agree, "%zu/%zu", s["index_equals_scan"].get<size_t>(), s["queries"].get<size_t>());
    std::printf("%8zu %9.0f | %17s | %19s %8s | %21s %9s | %11s %13s | %9.0f %8.0f\n", s["models"].get<size_t>(),
                s["adds_per_s"].get<double>(), idx, scan, ratio, redis_lat, redis_ratio, agree, redis_agree,
                s["catalog_heap_bytes_per_model"].get<double>(), s["peak_rss_mib"].get<double>());
  }
  std::printf(
      "\nadds/s: compile + add, metadata {\"score\"}; heap B/mod: heap the catalog frees when destroyed, per model.\n");
  std::printf(
      "redis matched: queries where Redis's best match matches as many of the candidate's layers as the index's.\n");
  for (const auto& s : out["sizes"]) {
    std::printf(
        "%zu models: %.1f layers/model, candidates match %.0f%% of their layers in their best ancestor; "
        "generated %.0f models/s",
        s["models"].get<size_t>(), s["mean_layers"].get<double>(), 100 * s["mean_matched_fraction"].get<double>(),
        s["generate_per_s"].get<double>());
    if (s.contains("redis"))
      std::printf("; Redis loaded %.0f models/s, %.0f bytes/model, same model as the index %zu/%zu",
                  s["redis_loads_per_s"].get<double>(), s["redis_used_memory_bytes_per_model"].get<double>(),
                  s["redis_same_model"].get<size_t>(), s["redis"]["queries"].get<size_t>());
    std::printf("\n");
  }

  if (!opt.json_file.empty()) {
    std::ofstream f(opt.json_file);
    f << out.dump(2) << "\n";
    if (!f) fail("cannot write " + opt.json_file);
  }
  if (disagreements > 0) {
    std::fprintf(stderr, "cairn_bench_catalog: %zu queries where the index and the scan disagree\n", disagreements);
    return 1;
  }
  return 0;
}
