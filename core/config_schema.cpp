// The config key schema: the table of every leaf key (path, Config field, constraints) and the
// lookups over it (find_key, names_under, env_name, kind_of).
#include "core/config_schema.hpp"

namespace cairn::config_internal {

// Keys in the order to_yaml() writes them; keys of one section are contiguous.
const std::vector<Key>& schema() {
  static const std::vector<Key> kKeys = {
      {.path = "socket", .field = [](Config& c) -> Field { return &c.socket; }},
      {.path = "repository", .field = [](Config& c) -> Field { return &c.repository; }},
      {.path = "chunk_size",
       .field = [](Config& c) -> Field { return &c.chunk_size; },
       .min_size = 64 * kKiB,
       .max_size = kGiB,
       .power_of_two = true},
      {.path = "repository_refresh",
       .field = [](Config& c) -> Field { return &c.repository_refresh; },
       .duration = Key::Duration::kOrZero},
      {.path = "repository_direct_reads", .field = [](Config& c) -> Field { return &c.repository_direct_reads; }},
      {.path = "repository_compression",
       .field = [](Config& c) -> Field { return &c.repository_compression; },
       .choices = {"deltas", "planes", "off"}},
      {.path = "tiers.hbm.capacity", .field = [](Config& c) -> Field { return &c.tiers.hbm.capacity; }},
      {.path = "tiers.hbm.devices", .field = [](Config& c) -> Field { return &c.tiers.hbm.devices; }},
      {.path = "tiers.hbm.backend",
       .field = [](Config& c) -> Field { return &c.tiers.hbm.backend; },
       .choices = {"cuda", "emulated"}},
      {.path = "tiers.dram.capacity",
       .field = [](Config& c) -> Field { return &c.tiers.dram.capacity; },
       .min_size = kMiB},
      {.path = "tiers.nvme.path", .field = [](Config& c) -> Field { return &c.tiers.nvme.path; }},
      {.path = "tiers.nvme.capacity", .field = [](Config& c) -> Field { return &c.tiers.nvme.capacity; }},
      {.path = "tiers.nvme.persistent", .field = [](Config& c) -> Field { return &c.tiers.nvme.persistent; }},
      {.path = "policy.eviction",
       .field = [](Config& c) -> Field { return &c.policy.eviction; },
       .choices = {"lru", "lineage", "hints"}},
      {.path = "policy.prefetch",
       .field = [](Config& c) -> Field { return &c.policy.prefetch; },
       .choices = {"none", "hints", "lineage"}},
      {.path = "policy.admission",
       .field = [](Config& c) -> Field { return &c.policy.admission; },
       .choices = {"all", "reuse"}},
      {.path = "policy.prefetch_budget", .field = [](Config& c) -> Field { return &c.policy.prefetch_budget; }},
      {.path = "policy.trace", .field = [](Config& c) -> Field { return &c.policy.trace; }},
      {.path = "peers.job", .field = [](Config& c) -> Field { return &c.peers.job; }},
      {.path = "peers.rendezvous", .field = [](Config& c) -> Field { return &c.peers.rendezvous; }},
      {.path = "peers.provider", .field = [](Config& c) -> Field { return &c.peers.provider; }},
      {.path = "peers.address", .field = [](Config& c) -> Field { return &c.peers.address; }},
      {.path = "peers.expect", .field = [](Config& c) -> Field { return &c.peers.expect; }, .max_size = 1u << 20},
      {.path = "peers.timeout",
       .field = [](Config& c) -> Field { return &c.peers.timeout; },
       .duration = Key::Duration::kPositive},
      {.path = "compute.enabled", .field = [](Config& c) -> Field { return &c.compute.enabled; }},
      {.path = "compute.python", .field = [](Config& c) -> Field { return &c.compute.python; }},
      {.path = "compute.listen", .field = [](Config& c) -> Field { return &c.compute.listen; }},
      {.path = "compute.memory", .field = [](Config& c) -> Field { return &c.compute.memory; }, .min_size = 16 * kMiB},
      {.path = "compute.cache", .field = [](Config& c) -> Field { return &c.compute.cache; }},
      {.path = "compute.start_timeout",
       .field = [](Config& c) -> Field { return &c.compute.start_timeout; },
       .duration = Key::Duration::kPositive},
      {.path = "log.level",
       .field = [](Config& c) -> Field { return &c.log.level; },
       .choices = {"trace", "debug", "info", "warn", "error", "off"}},
      {.path = "log.file", .field = [](Config& c) -> Field { return &c.log.file; }},
      {.path = "metrics.listen", .field = [](Config& c) -> Field { return &c.metrics.listen; }, .host_port = true},
      {.path = "metrics.textfile", .field = [](Config& c) -> Field { return &c.metrics.textfile; }},
      {.path = "metrics.interval",
       .field = [](Config& c) -> Field { return &c.metrics.interval; },
       .duration = Key::Duration::kPositive},
      {.path = "watchdog", .field = [](Config& c) -> Field { return &c.watchdog; }, .duration = Key::Duration::kOrZero},
      {.path = "debug.fault_injection", .field = [](Config& c) -> Field { return &c.debug.fault_injection; }},
  };
  return kKeys;
}

std::string join_path(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : std::string(prefix) + "." + std::string(name);
}

const Key* find_key(std::string_view path) {
  for (const Key& k : schema()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

// The distinct names directly under `prefix` ("" = top level), in schema order.
std::vector<std::string> names_under(std::string_view prefix) {
  std::vector<std::string> names;
  for (const Key& k : schema()) {
    std::string_view rest = k.path;
    if (!prefix.empty()) {
      if (rest.size() <= prefix.size() || rest.substr(0, prefix.size()) != prefix || rest[prefix.size()] != '.') {
        continue;
      }
      rest.remove_prefix(prefix.size() + 1);
    }
    std::string name(rest.substr(0, rest.find('.')));
    bool seen = false;
    for (const std::string& n : names) seen = seen || n == name;
    if (!seen) names.push_back(std::move(name));
  }
  return names;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string join(const std::vector<std::string_view>& items, std::string_view sep) {
  return join(std::vector<std::string>(items.begin(), items.end()), sep);
}

std::string env_name(std::string_view path) {
  std::string name = "CAIRN_";
  for (char c : path) {
    name += c == '.' ? '_' : static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  }
  return name;
}
Kind kind_of(const Key& key) {
  static Config scratch;  // only its members' addresses are taken
  return static_cast<Kind>(key.field(scratch).index());
}

bool is_list(const Key& key) { return kind_of(key) == kIntList || kind_of(key) == kStringList; }

}  // namespace cairn::config_internal
