// cairnd's configuration: YAML (yaml-cpp), validated, with an embedded default and environment
// overrides. Every key is documented in docs/config.md.
//
// Order of precedence: the embedded default (configs/default.yaml, compiled in) < the file given
// with --config < CAIRN_<SECTION>_<KEY> environment variables (the key path upper-cased and joined
// with '_': CAIRN_TIERS_DRAM_CAPACITY, CAIRN_REPOSITORY, CAIRN_LOG_LEVEL).
// Unknown keys and bad values are rejected with the key's path in the message
// ("tiers.dram.capacity: '12 parsecs' is not a size (examples: 512MiB, 2GiB, 1073741824)").
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn {

struct TierConfig {
  uint64_t capacity = 0;         // bytes; 0 = tier disabled (hbm, nvme)
  std::string path;              // nvme: directory of the burst buffer
  std::vector<int> devices;      // hbm: CUDA device ordinals
  std::string backend = "cuda";  // hbm: device backend, cuda | emulated (tiers/hbm/device.hpp)
  bool persistent = false;       // nvme: keep contents across a clean exit
};

struct Config {
  std::string socket;  // "" = $CAIRN_SOCKET, then the default path
  std::string repository = "./cairn-repo";
  uint64_t chunk_size = 16ull << 20;
  std::string repository_refresh = "1s";          // how often other daemons' commits are read: "250ms", "1s", "0"
  bool repository_direct_reads = true;            // packs read with O_DIRECT where the filesystem allows it
  std::string repository_compression = "deltas";  // chunks coded as they reach the repository: deltas, planes, off
  struct {
    TierConfig hbm, dram, nvme;
  } tiers;
  struct {
    std::string eviction = "lru";    // lru | lineage | hints
    std::string prefetch = "hints";  // none | hints | lineage
    std::string admission = "all";   // all | reuse (which clean chunks leaving DRAM go to NVMe)
    uint64_t prefetch_budget = 0;    // bytes staged ahead and not yet read; 0 = a quarter of the arena
    std::string trace;               // "" = off; else a CSV file of chunk accesses (docs/policy.md)
  } policy;
  struct {
    std::string job;                       // group id; "" = $SLURM_JOB_ID, else $PBS_JOBID, else no peers; "none" = off
    std::string rendezvous;                // directory every node sees; "" = <repository>/.peers
    std::string provider = "tcp;ofi_rxm";  // libfabric provider
    std::string address;                   // address or interface to bind; "" = the host name's address
    uint64_t expect = 0;                   // members to wait for at start; 0 = whoever is there
    std::string timeout = "10s";           // a peer silent this long is gone: "500ms", "10s"
  } peers;
  struct {
    bool enabled = false;          // the near-data compute worker (docs/near.md)
    std::string python;            // "" = $CAIRN_PYTHON, else the build's Python, else python3
    std::string listen;            // "" = only <socket>.compute; "HOST:PORT" also TCP (other nodes)
    uint64_t memory = 1ull << 30;  // the worker's budget for batches (it picks its batch size)
    uint64_t cache = 0;            // activation cache budget; 0 = a quarter of the DRAM arena
    std::string start_timeout = "60s";
  } compute;
  struct {
    std::string level = "info";  // trace | debug | info | warn | error | off
    std::string file;            // "" = stderr
  } log;
  // Metrics for monitoring (docs/metrics.md); both off by default.
  struct {
    std::string listen;            // "" = off; "HOST:PORT": an HTTP endpoint serving GET /metrics
    std::string textfile;          // "" = off; a file rewritten every `interval` (node_exporter)
    std::string interval = "15s";  // how often the textfile is rewritten: "15s", "1m"
  } metrics;
  // A client request running longer than this is reported with every thread's stack
  // (daemon/watchdog.hpp): "60s", "10m"; "0" = no watchdog.
  std::string watchdog = "10m";
  struct {
    bool fault_injection = false;  // the `fault` request may inject filesystem faults (tests only)
  } debug;

  // The effective config as YAML (what `cairnd --print-config` shows).
  std::string to_yaml() const;
};

// The text of configs/default.yaml, compiled in.
const char* default_config_yaml();

// Parses "512MiB", "2GiB", "1.5GiB", "64KiB", "10MB", "1073741824" (bytes). nullopt if malformed.
std::optional<uint64_t> parse_size(const std::string& text);
// Parses a duration: a number and ms, s or m ("250ms", "10s", "2m"), or "0" (off). nullopt when
// malformed. The config's duration keys are checked with it when the config is read.
std::optional<std::chrono::milliseconds> parse_duration(const std::string& text);
// The normal form of a duration, which parse_duration reads back: the largest unit that holds it
// whole ("90000ms" -> "90s", "600s" -> "10m"), "0" for zero. A duration key holds its value in this
// form once the config is read, so --print-config shows one spelling for one duration.
std::string format_duration(std::chrono::milliseconds d);

// A TCP address to listen on: a host name or IPv4 address, or an IPv6 address in brackets, and a
// port ("127.0.0.1:9464", "node01:9464", "[::1]:9464", "0.0.0.0:9464"; port 0 = one the system
// picks). The config's address keys are checked with it when the config is read; the message of a
// malformed address says what is wrong and carries no key.
struct HostPort {
  std::string host;  // without the brackets of an IPv6 address
  uint16_t port = 0;
};
Result<HostPort> parse_host_port(const std::string& text);

// Builds the config: embedded default, then the YAML text of a file (if path is non-empty), then
// the environment `env` (normally environ; injectable for tests). Expands ${VAR}, ${VAR:-default}
// and $USER-style references in string values from env.
Result<Config> load_config(const std::string& path, const std::map<std::string, std::string>& env);
// As above, with YAML text instead of a file path (source names it in messages).
Result<Config> load_config_text(const std::string& yaml_text, const std::string& source,
                                const std::map<std::string, std::string>& env);
// Checks a config built in code (not read by load_config) as load_config checks its values: every
// duration, choice and address key; the message names the key's path ("watchdog: 'banana' is not a
// duration ..."). A config load_config returned passes. The engine checks its config with it when
// it is opened.
Status check_config(const Config& config);
// The process environment as a map.
std::map<std::string, std::string> process_env();

}  // namespace cairn
