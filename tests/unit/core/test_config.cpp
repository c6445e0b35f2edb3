// Tests for core/config: defaults, sizes, validation messages, environment overrides, expansion,
// the to_yaml() round trip and a deterministic mutation loop over a valid config.
#include <pwd.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "core/config.hpp"

namespace cairn {
namespace {

using Env = std::map<std::string, std::string>;

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;

std::string current_user() {
  struct passwd* pw = getpwuid(getuid());
  return pw ? pw->pw_name : "";
}

Config load_ok(const std::string& text, const Env& env = {}) {
  Result<Config> r = load_config_text(text, "test.yaml", env);
  INFO(r.status().to_string());
  REQUIRE(r.ok());
  return *r;
}

// The message of a load that must fail with kInvalidArgument.
std::string load_error(const std::string& text, const Env& env = {}) {
  Result<Config> r = load_config_text(text, "/etc/cairn.yaml", env);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  return r.status().message();
}

void require_same(const Config& a, const Config& b) {
  CHECK(a.socket == b.socket);
  CHECK(a.repository == b.repository);
  CHECK(a.chunk_size == b.chunk_size);
  for (auto [x, y] : {std::pair{&a.tiers.hbm, &b.tiers.hbm}, std::pair{&a.tiers.dram, &b.tiers.dram},
                      std::pair{&a.tiers.nvme, &b.tiers.nvme}}) {
    CHECK(x->capacity == y->capacity);
    CHECK(x->path == y->path);
    CHECK(x->devices == y->devices);
    CHECK(x->persistent == y->persistent);
  }
  CHECK(a.policy.eviction == b.policy.eviction);
  CHECK(a.policy.prefetch == b.policy.prefetch);
  CHECK(a.peers.provider == b.peers.provider);
  CHECK(a.peers.rendezvous == b.peers.rendezvous);
  CHECK(a.peers.job == b.peers.job);
  CHECK(a.peers.address == b.peers.address);
  CHECK(a.peers.expect == b.peers.expect);
  CHECK(a.peers.timeout == b.peers.timeout);
  CHECK(a.log.level == b.log.level);
  CHECK(a.log.file == b.log.file);
  CHECK(a.metrics.listen == b.metrics.listen);
  CHECK(a.metrics.textfile == b.metrics.textfile);
  CHECK(a.metrics.interval == b.metrics.interval);
  CHECK(a.to_yaml() == b.to_yaml());
}

// A temporary file removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char name[] = "/tmp/cairn_test_config_XXXXXX";
    int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path_ = name;
    std::ofstream(path_) << content;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- defaults ----

TEST_CASE("config: no file gives the documented defaults", "[config]") {
  Result<Config> r = load_config("", {});
  REQUIRE(r.ok());
  const Config& c = *r;
  CHECK(c.socket.empty());
  CHECK(c.repository == "./cairn-repo");
  CHECK(c.chunk_size == 16 * kMiB);
  CHECK(c.tiers.hbm.capacity == 0);
  CHECK(c.tiers.hbm.devices.empty());
  CHECK(c.tiers.dram.capacity == kGiB);
  CHECK(c.tiers.nvme.path == "/tmp/cairn-" + current_user() + "/nvme");
  CHECK(c.tiers.nvme.capacity == 0);
  CHECK_FALSE(c.tiers.nvme.persistent);
  CHECK(c.policy.eviction == "lru");
  CHECK(c.policy.prefetch == "hints");
  CHECK(c.peers.provider == "tcp;ofi_rxm");
  CHECK(c.peers.rendezvous.empty());
  CHECK(c.peers.job.empty());
  CHECK(c.peers.address.empty());
  CHECK(c.peers.expect == 0);
  CHECK(c.peers.timeout == "10s");
  CHECK(c.log.level == "info");
  CHECK(c.log.file.empty());
  CHECK(c.metrics.listen.empty());  // metrics are off by default
  CHECK(c.metrics.textfile.empty());
  CHECK(c.metrics.interval == "15s");
}

TEST_CASE("config: the nvme path default follows TMPDIR and USER", "[config]") {
  Config c = load_ok("", {{"TMPDIR", "/local/scratch"}, {"USER", "alice"}});
  CHECK(c.tiers.nvme.path == "/local/scratch/cairn-alice/nvme");
  // An empty TMPDIR counts as unset (${VAR:-default}).
  c = load_ok("", {{"TMPDIR", ""}, {"USER", "bob"}});
  CHECK(c.tiers.nvme.path == "/tmp/cairn-bob/nvme");
}

TEST_CASE("config: the embedded default is documented YAML that fits the raw string", "[config]") {
  std::string text = default_config_yaml();
  CHECK(text.find(")cairnyaml\"") == std::string::npos);
  CHECK(contains(text, "tiers:"));
  CHECK(contains(text, "# "));
  // The default text read as a file gives the same config as no file.
  require_same(load_ok(text), *load_config("", {}));
}

TEST_CASE("config: an empty or comment-only file keeps the defaults", "[config]") {
  Config defaults = *load_config("", {});
  require_same(load_ok(""), defaults);
  require_same(load_ok("# nothing here\n\n"), defaults);
  require_same(load_ok("---\n"), defaults);
  require_same(load_ok("tiers:\npolicy:\n"), defaults);
}

TEST_CASE("config: a file overrides only the keys it names", "[config]") {
  Config c = load_ok(
      "repository: /lus/proj/cairn\n"
      "chunk_size: 4MiB\n"
      "tiers:\n"
      "  hbm: {capacity: 20GiB, devices: [0, 1, 3]}\n"
      "  dram:\n"
      "    capacity: 64GiB\n"
      "  nvme:\n"
      "    path: /local/nvme\n"
      "    capacity: 1.5TiB\n"
      "    persistent: true\n"
      "policy: {eviction: lineage, prefetch: lineage}\n"
      "peers:\n"
      "  provider: cxi\n"
      "  rendezvous: /lus/proj/rdv\n"
      "  job: \"4242\"\n"
      "  address: 10.1.2.3\n"
      "  expect: 8\n"
      "  timeout: 2s\n"
      "log: {level: debug, file: /tmp/cairnd.log}\n");
  CHECK(c.socket.empty());
  CHECK(c.repository == "/lus/proj/cairn");
  CHECK(c.chunk_size == 4 * kMiB);
  CHECK(c.tiers.hbm.capacity == 20 * kGiB);
  CHECK(c.tiers.hbm.devices == std::vector<int>{0, 1, 3});
  CHECK(c.tiers.dram.capacity == 64 * kGiB);
  CHECK(c.tiers.nvme.path == "/local/nvme");
  CHECK(c.tiers.nvme.capacity == kTiB + kTiB / 2);
  CHECK(c.tiers.nvme.persistent);
  CHECK(c.policy.eviction == "lineage");
  CHECK(c.policy.prefetch == "lineage");
  CHECK(c.peers.provider == "cxi");
  CHECK(c.peers.rendezvous == "/lus/proj/rdv");
  CHECK(c.peers.job == "4242");
  CHECK(c.peers.address == "10.1.2.3");
  CHECK(c.peers.expect == 8);
  CHECK(c.peers.timeout == "2s");
  CHECK(c.log.level == "debug");
  CHECK(c.log.file == "/tmp/cairnd.log");
}

TEST_CASE("config: a size may be an integer scalar or a string", "[config]") {
  CHECK(load_ok("tiers: {dram: {capacity: 1073741824}}").tiers.dram.capacity == kGiB);
  CHECK(load_ok("tiers: {dram: {capacity: \"2GiB\"}}").tiers.dram.capacity == 2 * kGiB);
  CHECK(load_ok("tiers: {dram: {capacity: 512 MiB}}").tiers.dram.capacity == 512 * kMiB);
}

TEST_CASE("config: null string values mean empty, null lists mean none", "[config]") {
  Config c = load_ok("repository:\nlog: {file: ~}\npolicy: {trace: }\ntiers: {hbm: {devices: }}\n");
  CHECK(c.repository.empty());
  CHECK(c.log.file.empty());
  CHECK(c.policy.trace.empty());
  CHECK(c.tiers.hbm.devices.empty());
}

// ---- sizes ----

TEST_CASE("config: parse_size accepts every documented form", "[config]") {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"1", 1},
      {"1073741824", kGiB},
      {"007", 7},
      {"18446744073709551615", UINT64_MAX},
      {"1B", 1},
      {"5 B", 5},
      {"64KiB", 64 * kKiB},
      {"512MiB", 512 * kMiB},
      {"2GiB", 2 * kGiB},
      {"3TiB", 3 * kTiB},
      {"1 GiB", kGiB},
      {"1.5GiB", kGiB + kGiB / 2},
      {"1.5 GiB", kGiB + kGiB / 2},
      {"0.5KiB", 512},
      {"0.25MiB", 256 * kKiB},
      {"1.000000001GiB", kGiB + 1},  // floor(1.073741825) extra bytes
      {"0.1KiB", 102},               // fractions of a byte are dropped
      {"1KB", 1000},
      {"10MB", 10000000},
      {"2GB", 2000000000},
      {"4TB", 4000000000000},
      {"1.5KB", 1500},
      {"1K", kKiB},
      {"1M", kMiB},
      {"2G", 2 * kGiB},
      {"1T", kTiB},
      {"16777215TiB", 16777215 * kTiB},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    std::optional<uint64_t> v = parse_size(c.text);
    REQUIRE(v.has_value());
    CHECK(*v == c.bytes);
  }
}

TEST_CASE("config: parse_size rejects malformed sizes", "[config]") {
  const char* bad[] = {
      "",
      " ",
      "-1",
      "+1",
      "-1GiB",
      "1.5",
      "1.5B",
      "1..5GiB",
      ".5GiB",
      "1.GiB",
      "GiB",
      "1 gib",
      "1kib",
      "1Kib",
      "1kB",
      "1mb",
      "1  GiB",
      " 1GiB",
      "1GiB ",
      "1 ",
      "1e9",
      "0x10",
      "12 parsecs",
      "1,000",
      "1 000",
      "1GiBs",
      "1iB",
      "1Ki",
      "inf",
      "nan",
      "18446744073709551616",
      "16777216TiB",
      "99999999999999999999999",
      "1.0000000001GiB",
      "1\tGiB",
      "1GiB\n",
      "1/2GiB",
      "½GiB",
  };
  for (const char* text : bad) {
    INFO(text);
    CHECK_FALSE(parse_size(text).has_value());
  }
}

TEST_CASE("config: size constraints on chunk_size and dram capacity", "[config]") {
  CHECK(load_ok("chunk_size: 64KiB").chunk_size == 64 * kKiB);
  CHECK(load_ok("chunk_size: 1GiB").chunk_size == kGiB);
  CHECK(load_ok("chunk_size: 1048576").chunk_size == kMiB);
  for (const char* bad : {"32KiB", "2GiB", "3MiB", "1000000", "0"}) {
    INFO(bad);
    std::string m = load_error(std::string("chunk_size: ") + bad);
    CHECK(contains(m, "/etc/cairn.yaml: chunk_size: '" + std::string(bad) + "'"));
    CHECK(contains(m, "power of two between 64KiB and 1GiB"));
  }
  CHECK(load_ok("tiers: {dram: {capacity: 1MiB}}").tiers.dram.capacity == kMiB);
  std::string m = load_error("tiers: {dram: {capacity: 1023KiB}}");
  CHECK(contains(m, "tiers.dram.capacity: '1023KiB'"));
  CHECK(contains(m, "minimum, 1MiB"));
  // Disabled tiers may be 0.
  CHECK(load_ok("tiers: {hbm: {capacity: 0}, nvme: {capacity: 0}}").tiers.nvme.capacity == 0);
}

// ---- validation errors ----

TEST_CASE("config: unknown keys are rejected with their path and the valid keys", "[config]") {
  std::string m = load_error("tiers:\n  dram:\n    capacty: 2GiB\n");
  CHECK(m == "/etc/cairn.yaml: tiers.dram.capacty: unknown key (valid keys here: capacity)");

  m = load_error("sockett: /x\n");
  CHECK(contains(m, "/etc/cairn.yaml: sockett: unknown key"));
  CHECK(contains(m,
                 "socket, repository, chunk_size, repository_refresh, repository_direct_reads, repository_compression, "
                 "tiers, policy, peers, compute, log"));

  m = load_error("tiers: {ssd: {capacity: 1GiB}}");
  CHECK(contains(m, "tiers.ssd: unknown key (valid keys here: hbm, dram, nvme)"));

  m = load_error("tiers: {nvme: {size: 1GiB}}");
  CHECK(contains(m, "tiers.nvme.size: unknown key (valid keys here: path, capacity, persistent)"));

  m = load_error("policy: {evict: lru}");
  CHECK(contains(m,
                 "policy.evict: unknown key (valid keys here: eviction, prefetch, admission, prefetch_budget, trace)"));

  m = load_error("peers: {jobid: 12}");
  CHECK(contains(m,
                 "peers.jobid: unknown key (valid keys here: job, rendezvous, provider, "
                 "address, expect, timeout)"));

  m = load_error("log: {levels: info}");
  CHECK(contains(m, "log.levels: unknown key (valid keys here: level, file)"));

  // Dotted keys are not a shorthand for nesting.
  m = load_error("tiers.dram.capacity: 2GiB\n");
  CHECK(contains(m, "tiers.dram.capacity: unknown key"));

  // Keys under a leaf.
  m = load_error("tiers: {dram: {capacity: {value: 1GiB}}}");
  CHECK(contains(m, "tiers.dram.capacity: expected a size"));
}

TEST_CASE("config: wrong types name the key", "[config]") {
  std::string m = load_error("tiers: {nvme: {persistent: maybe}}");
  CHECK(contains(m, "/etc/cairn.yaml: tiers.nvme.persistent: 'maybe' is not a boolean"));

  m = load_error("tiers: {dram: {capacity: [1, 2]}}");
  CHECK(contains(m, "tiers.dram.capacity: expected a size"));
  CHECK(contains(m, "got a list"));

  m = load_error("repository: {path: /x}");
  CHECK(contains(m, "repository: expected a string, got a mapping"));

  m = load_error("tiers: 5");
  CHECK(contains(m, "tiers: expected a mapping of hbm, dram, nvme, got '5'"));

  m = load_error("tiers: {hbm: [0, 1]}");
  CHECK(contains(m, "tiers.hbm: expected a mapping"));

  m = load_error("tiers: {hbm: {devices: 0}}");
  CHECK(contains(m, "tiers.hbm.devices: expected a list of device numbers"));

  m = load_error("tiers: {hbm: {devices: [0, gpu1]}}");
  CHECK(contains(m, "tiers.hbm.devices: item 2: 'gpu1' is not a device number"));

  m = load_error("tiers: {hbm: {devices: [-1]}}");
  CHECK(contains(m, "tiers.hbm.devices: item 1: '-1' is not a device number"));

  m = load_error("tiers: {hbm: {devices: [99999999999]}}");
  CHECK(contains(m, "tiers.hbm.devices: item 1"));

  m = load_error("peers: {expect: many}");
  CHECK(contains(m, "peers.expect"));

  m = load_error("tiers: {nvme: {persistent: }}");
  CHECK(contains(m, "tiers.nvme.persistent: expected a boolean"));

  m = load_error("chunk_size:\n");
  CHECK(contains(m, "chunk_size: expected a size"));

  m = load_error("log: {file: \"a\\x01b\"}");
  CHECK(contains(m, "log.file:"));
  CHECK(contains(m, "control character"));
}

TEST_CASE("config: booleans accept the YAML spellings", "[config]") {
  for (const char* t : {"true", "True", "TRUE", "yes", "on", "1"}) {
    CHECK(load_ok(std::string("tiers: {nvme: {persistent: ") + t + "}}").tiers.nvme.persistent);
  }
  for (const char* f : {"false", "False", "no", "off", "0"}) {
    CHECK_FALSE(load_ok(std::string("tiers: {nvme: {persistent: ") + f + "}}").tiers.nvme.persistent);
  }
}

TEST_CASE("config: bad enum values list the allowed ones", "[config]") {
  std::string m = load_error("policy: {eviction: fifo}");
  CHECK(m == "/etc/cairn.yaml: policy.eviction: 'fifo' is not one of: lru, lineage, hints");
  m = load_error("policy: {prefetch: always}");
  CHECK(contains(m, "policy.prefetch: 'always' is not one of: none, hints, lineage"));
  m = load_error("log: {level: verbose}");
  CHECK(contains(m, "log.level: 'verbose' is not one of: trace, debug, info, warn, error, off"));
  m = load_error("log: {level: INFO}");  // case matters
  CHECK(contains(m, "log.level: 'INFO'"));
  CHECK(load_ok("log: {level: off}").log.level == "off");
}

TEST_CASE("config: check_config checks a config built in code as a file's", "[config]") {
  CHECK(check_config(Config{}).ok());
  CHECK(check_config(load_ok("watchdog: 90s\npeers: {timeout: 2s}\n")).ok());
  Config c;
  c.watchdog = "banana";
  CHECK(check_config(c).message() ==
        "watchdog: 'banana' is not a duration (a number and ms, s or m: 500ms, 10s, 10m; 0 = off)");
  c = Config{};
  c.peers.timeout = "0";
  CHECK(contains(check_config(c).message(), "peers.timeout: '0' is not a positive duration"));
  c = Config{};
  c.policy.eviction = "fifo";
  CHECK(contains(check_config(c).message(), "policy.eviction: 'fifo' is not one of: lru, lineage, hints"));
  c = Config{};
  c.metrics.listen = "localhost";
  CHECK(check_config(c).message().rfind("metrics.listen: 'localhost' has no port", 0) == 0);
  // Free text is taken as it is: a path may hold a '$' once the config's references are expanded.
  c = Config{};
  c.repository = "/scratch/$odd";
  CHECK(check_config(c).ok());
}

TEST_CASE("config: bad sizes give examples", "[config]") {
  std::string m = load_error("tiers:\n  dram:\n    capacity: 12 parsecs\n");
  CHECK(m ==
        "/etc/cairn.yaml: tiers.dram.capacity: '12 parsecs' is not a size (examples: 512MiB, "
        "2GiB, 1073741824)");
  m = load_error("tiers: {nvme: {capacity: -5GiB}}");
  CHECK(contains(m, "tiers.nvme.capacity: '-5GiB' is not a size"));
}

TEST_CASE("config: durations are checked when the config is read", "[config]") {
  CHECK(load_error("watchdog: banana") ==
        "/etc/cairn.yaml: watchdog: 'banana' is not a duration (a number and ms, s or m: 500ms, 10s, 10m; 0 = off)");
  CHECK(contains(load_error("repository_refresh: 1h"), "repository_refresh: '1h' is not a duration"));
  CHECK(contains(load_error("repository_refresh: 5"), "repository_refresh: '5' is not a duration"));
  CHECK(contains(load_error("peers: {timeout: 0}"), "peers.timeout: '0' is not a positive duration"));
  CHECK(contains(load_error("compute: {start_timeout: -1s}"), "compute.start_timeout: '-1s' is not a duration"));
  CHECK(load_ok("watchdog: 0").watchdog == "0");
  CHECK(load_ok("repository_refresh: 250ms").repository_refresh == "250ms");
  CHECK(load_ok("peers: {timeout: 2m}").peers.timeout == "2m");
  // Held and printed in normal form: the largest whole unit.
  CHECK(load_ok("watchdog: 600s").watchdog == "10m");
  CHECK(load_ok("watchdog: 90000ms").watchdog == "90s");
  CHECK(load_ok("repository_refresh: 1500ms").repository_refresh == "1500ms");
  CHECK(load_ok("repository_refresh: 0ms").repository_refresh == "0");
  CHECK(contains(load_ok("watchdog: 120s").to_yaml(), "\nwatchdog: 2m\n"));
  CHECK(format_duration(std::chrono::milliseconds(61000)) == "61s");
  Result<Config> env = load_config_text("", "test.yaml", {{"CAIRN_WATCHDOG", "banana"}});
  REQUIRE_FALSE(env.ok());
  CHECK(env.status().message() ==
        "CAIRN_WATCHDOG: 'banana' is not a duration (a number and ms, s or m: 500ms, 10s, 10m; 0 = off)");
  CHECK(parse_duration("1500ms") == std::chrono::milliseconds(1500));
  CHECK(parse_duration("2m") == std::chrono::milliseconds(120000));
  CHECK(parse_duration("0") == std::chrono::milliseconds(0));
  CHECK_FALSE(parse_duration("5").has_value());
  CHECK_FALSE(parse_duration("").has_value());
  CHECK_FALSE(parse_duration("1234567890123s").has_value());
}

TEST_CASE("config: YAML syntax errors give the source and line", "[config]") {
  std::string m = load_error("socket: /x\ntiers:\n  dram: [1,\n");
  CHECK(contains(m, "/etc/cairn.yaml: line "));
  CHECK(contains(m, "not valid YAML"));

  m = load_error("socket: /x\nrepository: /y\n  bad: indent\n");
  CHECK(contains(m, "/etc/cairn.yaml: line 3"));

  m = load_error("a: *missing\n");
  CHECK(contains(m, "/etc/cairn.yaml: line 1"));
}

TEST_CASE("config: the top level must be one mapping", "[config]") {
  std::string m = load_error("just a string\n");
  CHECK(contains(m, "/etc/cairn.yaml: a config is a mapping of keys"));
  m = load_error("- socket: /x\n");
  CHECK(contains(m, "/etc/cairn.yaml: a config is a mapping of keys"));
  CHECK(contains(m, "not a list"));
  m = load_error("socket: /a\n---\nsocket: /b\n");
  CHECK(contains(m, "/etc/cairn.yaml: holds more than one YAML document"));
  m = load_error("---\n---\n---\n");
  CHECK(contains(m, "holds more than one YAML document"));
}

// yaml-cpp 0.7's LoadAll() never consumes a stray top-level ',' and loops forever, allocating
// (found by fuzz_config).
TEST_CASE("config: a stray comma is a syntax error, not a hang", "[config]") {
  for (const char* text : {",", ",a", "a: 1\n,", "a: 1\n,\n,", "- x\n,", "# c\n,\n", "--- ,"}) {
    INFO(text);
    std::string m = load_error(text);
    CHECK(contains(m, "/etc/cairn.yaml: line "));
    CHECK(contains(m, "not valid YAML"));
  }
  CHECK(load_error(",") == "/etc/cairn.yaml: line 1, column 1: not valid YAML: unexpected ','");
}

TEST_CASE("config: a key given twice is rejected", "[config]") {
  std::string m = load_error("log: {level: info}\nlog: {file: x}\n");
  CHECK(contains(m, "/etc/cairn.yaml: log: key given twice"));
  m = load_error("tiers: {dram: {capacity: 1GiB, capacity: 2GiB}}");
  CHECK(contains(m, "tiers.dram.capacity: key given twice"));
}

TEST_CASE("config: non-scalar keys are rejected", "[config]") {
  std::string m = load_error("? [a, b]\n: 1\n");
  CHECK(contains(m, "/etc/cairn.yaml: a key must be a plain name"));
  m = load_error("tiers: {? {x: 1} : 2}");
  CHECK(contains(m, "tiers: a key must be a plain name"));
}

TEST_CASE("config: an empty source name still gives a location", "[config]") {
  Result<Config> r = load_config_text("bogus: 1", "", {});
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.status().message(), "config: bogus: unknown key"));
}

TEST_CASE("config: files", "[config]") {
  SECTION("a readable file") {
    TempFile f("tiers:\n  dram:\n    capacity: 2GiB\n");
    Result<Config> r = load_config(f.path(), {});
    REQUIRE(r.ok());
    CHECK(r->tiers.dram.capacity == 2 * kGiB);
  }
  SECTION("every message from a file names it") {
    TempFile f("tiers:\n  dram:\n    capacity: 12 parsecs\n");
    Result<Config> r = load_config(f.path(), {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().rfind(f.path() + ": tiers.dram.capacity: '12 parsecs'", 0) == 0);
  }
  SECTION("a syntax error in a file names it and the line") {
    TempFile f("log:\n  level: info\n  file: [\n");
    Result<Config> r = load_config(f.path(), {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(r.status().message(), f.path() + ": line "));
  }
  SECTION("a missing file is kNotFound with its path") {
    Result<Config> r = load_config("/nonexistent/cairn/config.yaml", {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK(contains(r.status().message(), "/nonexistent/cairn/config.yaml"));
  }
  SECTION("a directory is an I/O error with its path") {
    Result<Config> r = load_config("/tmp", {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kIo);
    CHECK(contains(r.status().message(), "'/tmp'"));
  }
  SECTION("a huge file is refused") {
    TempFile f(std::string(2 << 20, '#'));
    Result<Config> r = load_config(f.path(), {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(r.status().message(), f.path() + ": is "));
  }
}

// ---- metrics ----

TEST_CASE("config: the metrics keys", "[config][metrics]") {
  Config c = load_ok(
      "metrics:\n  listen: 127.0.0.1:9464\n  textfile: /var/lib/node_exporter/cairn.prom\n"
      "  interval: 30s\n");
  CHECK(c.metrics.listen == "127.0.0.1:9464");
  CHECK(c.metrics.textfile == "/var/lib/node_exporter/cairn.prom");
  CHECK(c.metrics.interval == "30s");
  CHECK(load_ok("metrics: {listen: \"[::1]:9100\"}").metrics.listen == "[::1]:9100");
  CHECK(load_ok("metrics: {listen: \"node-01.cluster:9100\"}").metrics.listen == "node-01.cluster:9100");
  CHECK(load_ok("metrics: {listen: \"0.0.0.0:0\"}").metrics.listen == "0.0.0.0:0");
  CHECK(load_ok("metrics: {listen: \"localhost:65535\"}").metrics.listen == "localhost:65535");
  // Expanded before it is checked.
  CHECK(load_ok("metrics: {listen: \"${NODE}:9464\"}", {{"NODE", "n7"}}).metrics.listen == "n7:9464");
  // Environment overrides.
  Config e = load_ok("", {{"CAIRN_METRICS_LISTEN", "0.0.0.0:9464"},
                          {"CAIRN_METRICS_TEXTFILE", "/tmp/cairn.prom"},
                          {"CAIRN_METRICS_INTERVAL", "1m"}});
  CHECK(e.metrics.listen == "0.0.0.0:9464");
  CHECK(e.metrics.textfile == "/tmp/cairn.prom");
  CHECK(e.metrics.interval == "1m");
  // And they round-trip through to_yaml().
  require_same(load_ok(c.to_yaml()), c);
  require_same(load_ok(e.to_yaml()), e);
}

TEST_CASE("config: bad metrics values are rejected with the key", "[config][metrics]") {
  CHECK(load_error("metrics: {listen: localhost}") ==
        "/etc/cairn.yaml: metrics.listen: 'localhost' has no port (write HOST:PORT, such as 127.0.0.1:9464, "
        "0.0.0.0:9464 or [::1]:9464)");
  CHECK(contains(load_error("metrics: {listen: \"127.0.0.1:\"}"),
                 "metrics.listen: '127.0.0.1:' has a port that is not a number from 0 to 65535"));
  CHECK(contains(load_error("metrics: {listen: \"127.0.0.1:65536\"}"),
                 "metrics.listen: '127.0.0.1:65536' has a port out of range (0 to 65535)"));
  CHECK(contains(load_error("metrics: {listen: \"127.0.0.1:123456\"}"),
                 "metrics.listen: '127.0.0.1:123456' has a port that is not a number"));
  CHECK(contains(load_error("metrics: {listen: \"127.0.0.1:-1\"}"), "has a port that is not a number"));
  CHECK(contains(load_error("metrics: {listen: \":9464\"}"), "metrics.listen: ':9464' has no host"));
  CHECK(contains(load_error("metrics: {listen: \"::1:9464\"}"), "is an IPv6 address without brackets"));
  CHECK(contains(load_error("metrics: {listen: \"[::1\"}"), "has an unclosed '['"));
  CHECK(contains(load_error("metrics: {listen: \"[::1]\"}"), "metrics.listen: '[::1]' has no port"));
  CHECK(contains(load_error("metrics: {listen: \"[nope]:1\"}"), "does not hold an IPv6 address"));
  CHECK(contains(load_error("metrics: {listen: \"http://x:1\"}"), "metrics.listen: 'http://x:1' is a URL"));
  CHECK(contains(load_error("metrics: {listen: \"a b:1\"}"), "has a host that is not a name or address"));
  CHECK(contains(load_error("metrics: {listen: [1]}"), "metrics.listen: expected a string, got a list"));
  CHECK(contains(load_error("metrics: {interval: 0}"), "metrics.interval: '0' is not a positive duration"));
  CHECK(contains(load_error("metrics: {interval: soon}"), "metrics.interval: 'soon' is not a duration"));
  CHECK(contains(load_error("metrics: {port: 9464}"),
                 "metrics.port: unknown key (valid keys here: listen, textfile, interval)"));
  Result<Config> env = load_config_text("", "test.yaml", {{"CAIRN_METRICS_LISTEN", "9464"}});
  REQUIRE_FALSE(env.ok());
  CHECK(env.status().message() ==
        "CAIRN_METRICS_LISTEN: '9464' has no port (write HOST:PORT, such as 127.0.0.1:9464, 0.0.0.0:9464 or "
        "[::1]:9464)");
}

TEST_CASE("config: parse_host_port", "[config][metrics]") {
  auto ok = [](const std::string& text) {
    Result<HostPort> r = parse_host_port(text);
    INFO(text << ": " << r.status().to_string());
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(ok("127.0.0.1:9464").host == "127.0.0.1");
  CHECK(ok("127.0.0.1:9464").port == 9464);
  CHECK(ok("[::1]:80").host == "::1");
  CHECK(ok("[::]:0").port == 0);
  CHECK(ok("n_1.x-y:1").host == "n_1.x-y");
  CHECK(ok("h:00080").port == 80);
  for (const char* bad : {"", ":", "h", "h:", "h:p", "h:1:2", "[]:1", "[::1]x:1", "h:99999", "h :1", "h:+1"})
    CHECK_FALSE(parse_host_port(bad).ok());
}

// ---- environment ----

TEST_CASE("config: environment variables override the file", "[config]") {
  Env env = {
      {"CAIRN_SOCKET", "/run/cairn.sock"},
      {"CAIRN_REPOSITORY", "/lus/repo"},
      {"CAIRN_CHUNK_SIZE", "1MiB"},
      {"CAIRN_TIERS_HBM_CAPACITY", "8GiB"},
      {"CAIRN_TIERS_HBM_DEVICES", "0, 2,3"},
      {"CAIRN_TIERS_DRAM_CAPACITY", "4GiB"},
      {"CAIRN_TIERS_NVME_PATH", "/local/nvme"},
      {"CAIRN_TIERS_NVME_CAPACITY", "100GB"},
      {"CAIRN_TIERS_NVME_PERSISTENT", "true"},
      {"CAIRN_POLICY_EVICTION", "lineage"},
      {"CAIRN_POLICY_PREFETCH", "none"},
      {"CAIRN_PEERS_PROVIDER", "verbs;ofi_rxm"},
      {"CAIRN_PEERS_RENDEZVOUS", "/lus/rdv"},
      {"CAIRN_PEERS_JOB", "77"},
      {"CAIRN_PEERS_EXPECT", "16"},
      {"CAIRN_PEERS_TIMEOUT", "3s"},
      {"CAIRN_LOG_LEVEL", "warn"},
      {"CAIRN_LOG_FILE", "/tmp/c.log"},
      {"CAIRN_SOMETHING_ELSE", "ignored"},  // clients use other CAIRN_* names
  };
  Config c = load_ok("tiers: {dram: {capacity: 2GiB}}\nlog: {level: debug}\n", env);
  CHECK(c.socket == "/run/cairn.sock");
  CHECK(c.repository == "/lus/repo");
  CHECK(c.chunk_size == kMiB);
  CHECK(c.tiers.hbm.capacity == 8 * kGiB);
  CHECK(c.tiers.hbm.devices == std::vector<int>{0, 2, 3});
  CHECK(c.tiers.dram.capacity == 4 * kGiB);
  CHECK(c.tiers.nvme.path == "/local/nvme");
  CHECK(c.tiers.nvme.capacity == 100000000000ull);
  CHECK(c.tiers.nvme.persistent);
  CHECK(c.policy.eviction == "lineage");
  CHECK(c.policy.prefetch == "none");
  CHECK(c.peers.provider == "verbs;ofi_rxm");
  CHECK(c.peers.rendezvous == "/lus/rdv");
  CHECK(c.peers.job == "77");
  CHECK(c.peers.expect == 16);
  CHECK(c.peers.timeout == "3s");
  CHECK(c.log.level == "warn");
  CHECK(c.log.file == "/tmp/c.log");
}

TEST_CASE("config: an empty list variable clears the list", "[config]") {
  Config c = load_ok("tiers: {hbm: {devices: [0, 1]}}", {{"CAIRN_TIERS_HBM_DEVICES", ""}});
  CHECK(c.tiers.hbm.devices.empty());
}

TEST_CASE("config: bad environment values name the variable", "[config]") {
  auto env_error = [](const std::string& var, const std::string& value) {
    Result<Config> r = load_config_text("", "test.yaml", {{var, value}});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    return r.status().message();
  };
  CHECK(env_error("CAIRN_TIERS_DRAM_CAPACITY", "lots") ==
        "CAIRN_TIERS_DRAM_CAPACITY: 'lots' is not a size (examples: 512MiB, 2GiB, 1073741824)");
  CHECK(contains(env_error("CAIRN_TIERS_DRAM_CAPACITY", "1KiB"), "CAIRN_TIERS_DRAM_CAPACITY: "));
  CHECK(contains(env_error("CAIRN_CHUNK_SIZE", "3MiB"), "CAIRN_CHUNK_SIZE: '3MiB' is not a power"));
  CHECK(contains(env_error("CAIRN_TIERS_NVME_PERSISTENT", "maybe"),
                 "CAIRN_TIERS_NVME_PERSISTENT: 'maybe' is not a boolean"));
  CHECK(contains(env_error("CAIRN_POLICY_EVICTION", "fifo"),
                 "CAIRN_POLICY_EVICTION: 'fifo' is not one of: lru, lineage"));
  CHECK(contains(env_error("CAIRN_LOG_LEVEL", ""), "CAIRN_LOG_LEVEL: '' is not one of"));
  CHECK(contains(env_error("CAIRN_TIERS_HBM_DEVICES", "0,x"),
                 "CAIRN_TIERS_HBM_DEVICES item 2: 'x' is not a device number"));
  CHECK(contains(env_error("CAIRN_TIERS_HBM_DEVICES", "0,,1"), "CAIRN_TIERS_HBM_DEVICES: item 2"));
  CHECK(contains(env_error("CAIRN_PEERS_EXPECT", "several"), "CAIRN_PEERS_EXPECT: 'several' is not a size"));
  CHECK(contains(env_error("CAIRN_REPOSITORY", "${UNCLOSED"), "CAIRN_REPOSITORY: unterminated"));
  CHECK(contains(env_error("CAIRN_LOG_FILE", "a\nb"), "CAIRN_LOG_FILE: "));
  CHECK(contains(env_error("CAIRN_LOG_FILE", "\xff"), "not valid UTF-8"));
}

TEST_CASE("config: process_env reads environ", "[config]") {
  REQUIRE(setenv("CAIRN_TEST_CONFIG_VAR", "a=b", 1) == 0);
  std::map<std::string, std::string> env = process_env();
  CHECK(env["CAIRN_TEST_CONFIG_VAR"] == "a=b");
  unsetenv("CAIRN_TEST_CONFIG_VAR");
  CHECK(process_env().count("CAIRN_TEST_CONFIG_VAR") == 0);
}

// ---- expansion ----

TEST_CASE("config: string values expand variables", "[config]") {
  Env env = {{"SCRATCH", "/lus/scratch"}, {"JOB", "42"}, {"EMPTY", ""}, {"USER", "carol"}};
  auto repo = [&](const std::string& value) { return load_ok("repository: \"" + value + "\"", env).repository; };
  CHECK(repo("${SCRATCH}/repo") == "/lus/scratch/repo");
  CHECK(repo("$SCRATCH/repo-$JOB") == "/lus/scratch/repo-42");
  CHECK(repo("${NOPE}/x") == "/x");
  CHECK(repo("$NOPE/x") == "/x");
  CHECK(repo("${NOPE:-/tmp}/x") == "/tmp/x");
  CHECK(repo("${EMPTY:-/d}") == "/d");
  CHECK(repo("${JOB:-0}") == "42");
  CHECK(repo("${NOPE:-${SCRATCH}/fallback}") == "/lus/scratch/fallback");
  CHECK(repo("${NOPE:-${ALSO_NOPE:-deep}}") == "deep");
  CHECK(repo("$$HOME and $$") == "$HOME and $");
  CHECK(repo("cost: 5$ or $ 5") == "cost: 5$ or $ 5");
  CHECK(repo("$USER") == "carol");
  CHECK(repo("a${JOB}b") == "a42b");
  // Expansion applies to every string key, and to environment values.
  Config c = load_ok("log: {file: $SCRATCH/log}\npeers: {job: \"$JOB:1\"}", env);
  CHECK(c.log.file == "/lus/scratch/log");
  CHECK(c.peers.job == "42:1");
  Env with_override = env;
  with_override["CAIRN_TIERS_NVME_PATH"] = "${SCRATCH}/nvme";
  CHECK(load_ok("", with_override).tiers.nvme.path == "/lus/scratch/nvme");
}

TEST_CASE("config: USER and UID fall back to the process's uid", "[config]") {
  Config c = load_ok("repository: /r/$USER/${UID}", {});
  CHECK(c.repository == "/r/" + current_user() + "/" + std::to_string(getuid()));
}

TEST_CASE("config: malformed references are errors with the key", "[config]") {
  CHECK(contains(load_error("repository: \"${SCRATCH\""), "repository: unterminated '${'"));
  CHECK(contains(load_error("repository: \"${}\""), "repository: bad variable reference"));
  CHECK(contains(load_error("repository: \"${A B}\""), "repository: bad variable reference"));
  CHECK(contains(load_error("repository: \"${1A}\""), "repository: bad variable reference"));
  CHECK(contains(load_error("repository: \"${A-x}\""), "repository: bad variable reference"));
  std::string deep = "x";
  for (int i = 0; i < 40; ++i) deep = "${N:-" + deep + "}";
  CHECK(contains(load_error("repository: \"" + deep + "\""), "nest more than"));
}

// ---- to_yaml ----

TEST_CASE("config: to_yaml round-trips the defaults", "[config]") {
  Config c = *load_config("", {});
  std::string yaml = c.to_yaml();
  CHECK(contains(yaml, "chunk_size: 16MiB"));
  CHECK(contains(yaml, "tiers:\n  hbm:\n    capacity: 0\n"));
  CHECK(contains(yaml, "    capacity: 1GiB\n"));
  require_same(load_ok(yaml), c);
}

TEST_CASE("config: to_yaml round-trips unusual values", "[config]") {
  Config c = load_ok(
      "socket: \"/run/with space/\\\"q\\\" and \\\\back\"\n"
      "repository: \"$$literal and $${braced}\"\n"
      "chunk_size: 128KiB\n"
      "tiers:\n"
      "  hbm: {capacity: 1000001, devices: [7, 0]}\n"
      "  dram: {capacity: 1.5GiB}\n"
      "  nvme: {path: \"yes\", capacity: 3TB, persistent: yes}\n"
      "policy: {eviction: lineage, prefetch: none}\n"
      "peers:\n"
      "  provider: \"~\"\n"
      "  rendezvous: \"123\"\n"
      "  job: \"a, b #c\"\n"
      "  address: \"d: e [f]\"\n"
      "log: {level: off, file: \"caf\\u00e9 \\u2028 \\u2029 \\uFEFF \\U0001F600 'x'\"}\n");
  CHECK(c.repository == "$literal and ${braced}");
  CHECK(c.tiers.nvme.path == "yes");
  CHECK(c.peers.job == "a, b #c");
  CHECK(c.peers.address == "d: e [f]");
  std::string yaml = c.to_yaml();
  INFO(yaml);
  Config back = load_ok(yaml);
  require_same(back, c);
  // A second trip is a fixed point.
  CHECK(back.to_yaml() == yaml);
}

TEST_CASE("config: to_yaml round-trips with environment overrides in effect", "[config]") {
  Env env = {{"CAIRN_LOG_LEVEL", "trace"}, {"CAIRN_TIERS_HBM_DEVICES", "1,2"}, {"HOME", "/h"}};
  Config c = load_ok("repository: $HOME/repo", env);
  require_same(load_ok(c.to_yaml(), env), c);
}

// ---- robustness ----

TEST_CASE("config: random mutations of a valid config never throw or crash", "[config]") {
  const std::string base =
      "socket: \"/run/cairn/${USER}.sock\"\n"
      "repository: /lus/proj/cairn\n"
      "chunk_size: 16MiB\n"
      "tiers:\n"
      "  hbm:\n"
      "    capacity: 20GiB\n"
      "    devices: [0, 1]\n"
      "  dram: {capacity: 64GiB}\n"
      "  nvme:\n"
      "    path: ${TMPDIR:-/tmp}/nvme\n"
      "    capacity: 1.5TiB\n"
      "    persistent: true\n"
      "policy: {eviction: lineage, prefetch: hints}\n"
      "peers:\n"
      "  provider: \"tcp;ofi_rxm\"\n"
      "  job: \"1234\"\n"
      "  address: 'eth0'\n"
      "log: {level: debug, file: \"\"}\n"
      "metrics: {listen: \"127.0.0.1:9464\", textfile: /tmp/c.prom, interval: 15s}\n";
  REQUIRE(load_config_text(base, "base", {}).ok());
  const std::string alphabet = ":-[]{},#&*!|>'\"%@`?$ \t\n\r\\.0123456789KMGiBabcxyz~\x80\xff";
  std::mt19937 rng(20240607);  // fixed: the loop must be reproducible
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  int ok = 0;
  int rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string text = base;
    int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits; ++e) {
      size_t pos = pick(text.size() + 1);
      switch (pick(6)) {
        case 0:  // replace a byte
          if (!text.empty()) text[pick(text.size())] = alphabet[pick(alphabet.size())];
          break;
        case 1:  // insert a byte
          text.insert(text.begin() + static_cast<std::ptrdiff_t>(pos), alphabet[pick(alphabet.size())]);
          break;
        case 2:  // delete a run
          text.erase(pos, 1 + pick(8));
          break;
        case 3: {  // duplicate a run elsewhere
          size_t from = pick(text.size());
          std::string run = text.substr(from, 1 + pick(24));
          text.insert(pick(text.size() + 1), run);
          break;
        }
        case 4:  // truncate
          text.resize(pos);
          break;
        default:  // flip a bit
          if (!text.empty()) text[pick(text.size())] ^= static_cast<char>(1u << pick(8));
          break;
      }
    }
    INFO("iteration " << iter << ":\n" << text);
    Result<Config> r = Result<Config>(internal_error("not run"));
    REQUIRE_NOTHROW(r = load_config_text(text, "mutant", {}));
    if (r.ok()) {
      ++ok;
      Result<Config> back = Result<Config>(internal_error("not run"));
      REQUIRE_NOTHROW(back = load_config_text(r->to_yaml(), "round trip", {}));
      INFO(r->to_yaml() << "\n" << back.status().to_string());
      REQUIRE(back.ok());
      REQUIRE(back->to_yaml() == r->to_yaml());
    } else {
      ++rejected;
      REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
      REQUIRE(r.status().message().rfind("mutant: ", 0) == 0);
    }
  }
  // Both outcomes must be exercised, or the mutations are too weak or too strong to test much.
  CHECK(ok > 100);
  CHECK(rejected > 100);
}

}  // namespace
}  // namespace cairn
