// cairnd's configuration: the schema, YAML overlay, environment overrides, variable expansion and
// the effective-config emitter. The contract is in config.hpp; every key is described in
// docs/config.md.
//
// Why a schema table: every leaf key is one row (dotted path, the Config field it sets, its
// constraints). Walking a YAML document against the table, naming the environment variables,
// listing "valid keys here" and emitting to_yaml() all read the same rows, so a key added in one
// place is known everywhere.
#include "core/config.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <exception>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

namespace cairn {
namespace {

using Env = std::map<std::string, std::string>;
using Field =
    std::variant<std::string*, uint64_t*, bool*, std::vector<int>*, std::vector<std::string>*>;
// A key's type: the alternative of Field its accessor returns.
enum Kind : size_t { kString, kSize, kBool, kIntList, kStringList };

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;

// A config larger than this is not a config; the cap also bounds the parser's work.
constexpr size_t kMaxConfigBytes = 1u << 20;
// How deeply ${A:-${B:-...}} defaults may nest.
constexpr int kMaxExpansionDepth = 16;

constexpr std::string_view kSizeExamples = "(examples: 512MiB, 2GiB, 1073741824)";

// One leaf key of the schema.
struct Key {
  std::string_view path;                       // dotted: "tiers.dram.capacity"
  Field (*field)(Config&);                     // the member it sets
  std::vector<std::string_view> choices = {};  // strings only: the allowed values; empty = any text
  uint64_t min_size = 0;                       // sizes only: inclusive bounds, in bytes
  uint64_t max_size = UINT64_MAX;
  bool power_of_two = false;  // sizes only
};

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
      {.path = "tiers.hbm.capacity",
       .field = [](Config& c) -> Field { return &c.tiers.hbm.capacity; }},
      {.path = "tiers.hbm.devices",
       .field = [](Config& c) -> Field { return &c.tiers.hbm.devices; }},
      {.path = "tiers.dram.capacity",
       .field = [](Config& c) -> Field { return &c.tiers.dram.capacity; },
       .min_size = kMiB},
      {.path = "tiers.nvme.path", .field = [](Config& c) -> Field { return &c.tiers.nvme.path; }},
      {.path = "tiers.nvme.capacity",
       .field = [](Config& c) -> Field { return &c.tiers.nvme.capacity; }},
      {.path = "tiers.nvme.persistent",
       .field = [](Config& c) -> Field { return &c.tiers.nvme.persistent; }},
      {.path = "policy.eviction",
       .field = [](Config& c) -> Field { return &c.policy.eviction; },
       .choices = {"lru", "lineage", "hints"}},
      {.path = "policy.prefetch",
       .field = [](Config& c) -> Field { return &c.policy.prefetch; },
       .choices = {"none", "hints", "lineage"}},
      {.path = "policy.admission",
       .field = [](Config& c) -> Field { return &c.policy.admission; },
       .choices = {"all", "reuse"}},
      {.path = "policy.prefetch_budget",
       .field = [](Config& c) -> Field { return &c.policy.prefetch_budget; }},
      {.path = "policy.trace", .field = [](Config& c) -> Field { return &c.policy.trace; }},
      {.path = "peers.provider", .field = [](Config& c) -> Field { return &c.peers.provider; }},
      {.path = "peers.rendezvous", .field = [](Config& c) -> Field { return &c.peers.rendezvous; }},
      {.path = "peers.bootstrap",
       .field = [](Config& c) -> Field { return &c.peers.bootstrap; },
       .choices = {"none", "rendezvous", "mpi", "static"}},
      {.path = "peers.static_peers",
       .field = [](Config& c) -> Field { return &c.peers.static_peers; }},
      {.path = "log.level",
       .field = [](Config& c) -> Field { return &c.log.level; },
       .choices = {"trace", "debug", "info", "warn", "error", "off"}},
      {.path = "log.file", .field = [](Config& c) -> Field { return &c.log.file; }},
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
      if (rest.size() <= prefix.size() || rest.substr(0, prefix.size()) != prefix ||
          rest[prefix.size()] != '.') {
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

// ---- values ----

// Quotes a value for an error message, shortened so that a huge value cannot flood the log.
std::string quoted(std::string_view text) {
  constexpr size_t kMax = 80;
  if (text.size() <= kMax) return "'" + std::string(text) + "'";
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;  // whole chars
  return "'" + std::string(text.substr(0, cut)) + "...'";
}

bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

// The value of an environment variable for expansion: env, else USER and UID from the process's
// uid (USER is often unset in batch jobs), else nothing.
std::optional<std::string> lookup_var(const std::string& name, const Env& env) {
  if (auto it = env.find(name); it != env.end()) return it->second;
  if (name == "UID") return std::to_string(getuid());
  if (name == "USER") {
    struct passwd pw;
    struct passwd* found = nullptr;
    char buf[4096];
    if (getpwuid_r(getuid(), &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
      return std::string(found->pw_name);
    }
  }
  return std::nullopt;
}

// Expands ${VAR}, ${VAR:-default}, $VAR and $$ (a literal '$') in `text`.
Result<std::string> expand(std::string_view text, const Env& env, int depth) {
  if (depth > kMaxExpansionDepth) {
    return invalid_argument("${...:-...} defaults nest more than " +
                            std::to_string(kMaxExpansionDepth) + " deep in " + quoted(text));
  }
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c != '$' || i + 1 >= text.size()) {
      out += c;
      ++i;
      continue;
    }
    char next = text[i + 1];
    if (next == '$') {
      out += '$';
      i += 2;
    } else if (next == '{') {
      // Find the matching '}', counting nested "${".
      size_t j = i + 2;
      int open = 1;
      while (j < text.size()) {
        if (text[j] == '$' && j + 1 < text.size() && text[j + 1] == '{') {
          ++open;
          j += 2;
        } else if (text[j] == '}' && --open == 0) {
          break;
        } else {
          ++j;
        }
      }
      if (j >= text.size()) {
        return invalid_argument("unterminated '${' in " + quoted(text) +
                                " (write ${NAME}, ${NAME:-default}, or $$ for a literal '$')");
      }
      std::string_view inner = text.substr(i + 2, j - i - 2);
      size_t n = 0;
      while (n < inner.size() && is_name_char(inner[n])) ++n;
      std::string name(inner.substr(0, n));
      std::string_view rest = inner.substr(n);
      bool has_default = rest.substr(0, 2) == ":-";
      if (name.empty() || !is_name_start(name[0]) || (!rest.empty() && !has_default)) {
        return invalid_argument("bad variable reference " +
                                quoted("${" + std::string(inner) + "}") + " in " + quoted(text) +
                                " (write ${NAME} or ${NAME:-default}; $$ is a literal '$')");
      }
      std::optional<std::string> value = lookup_var(name, env);
      if (has_default && (!value || value->empty())) {
        CAIRN_ASSIGN_OR_RETURN(std::string d, expand(rest.substr(2), env, depth + 1));
        out += d;
      } else if (value) {
        out += *value;
      }
      i = j + 1;
    } else if (is_name_start(next)) {
      size_t j = i + 1;
      while (j < text.size() && is_name_char(text[j])) ++j;
      if (auto value = lookup_var(std::string(text.substr(i + 1, j - i - 1)), env)) out += *value;
      i = j;
    } else {
      out += c;  // a lone '$' stands for itself
      ++i;
    }
  }
  return out;
}

// Strings must be UTF-8 without control characters, so that to_yaml() can write them back.
Status check_text(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x20 || b == 0x7f) {
      return invalid_argument(quoted(text) + " contains a control character");
    }
    if (b < 0x80) {
      ++i;
      continue;
    }
    int len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 0;
    if (len == 0 || b > 0xf4 || i + len > text.size()) {
      return invalid_argument(quoted(text) + " is not valid UTF-8");
    }
    uint32_t cp = b & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      auto cont = static_cast<unsigned char>(text[i + k]);
      if ((cont & 0xc0) != 0x80) return invalid_argument(quoted(text) + " is not valid UTF-8");
      cp = (cp << 6) | (cont & 0x3f);
    }
    static constexpr uint32_t kMinForLen[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return invalid_argument(quoted(text) + " is not valid UTF-8");
    }
    if (cp >= 0x80 && cp <= 0x9f) {
      return invalid_argument(quoted(text) + " contains a control character");
    }
    i += len;
  }
  return Status::ok();
}

Result<bool> parse_bool(const std::string& text) {
  static const char* const kTrue[] = {"true", "True", "TRUE", "yes", "Yes",
                                      "YES",  "on",   "On",   "ON",  "1"};
  static const char* const kFalse[] = {"false", "False", "FALSE", "no",  "No",
                                       "NO",    "off",   "Off",   "OFF", "0"};
  for (const char* t : kTrue) {
    if (text == t) return true;
  }
  for (const char* f : kFalse) {
    if (text == f) return false;
  }
  return invalid_argument(quoted(text) + " is not a boolean (use true or false)");
}

Result<int> parse_device(const std::string& text) {
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') v = -1;
    if (v < 0) break;
    v = v * 10 + (c - '0');
    if (v > INT_MAX) v = -1;
  }
  if (text.empty() || v < 0) {
    return invalid_argument(quoted(text) + " is not a device number (a CUDA ordinal: 0, 1, ...)");
  }
  return static_cast<int>(v);
}

std::string format_size(uint64_t bytes) {
  static const std::pair<uint64_t, const char*> kUnits[] = {
      {kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}};
  if (bytes == 0) return "0";
  for (const auto& [unit, name] : kUnits) {
    if (bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

Result<uint64_t> parse_size_for(const Key& key, const std::string& text) {
  std::optional<uint64_t> v = parse_size(text);
  if (!v) return invalid_argument(quoted(text) + " is not a size " + std::string(kSizeExamples));
  if (key.power_of_two && ((*v & (*v - 1)) != 0 || *v < key.min_size || *v > key.max_size)) {
    return invalid_argument(quoted(text) + " is not a power of two between " +
                            format_size(key.min_size) + " and " + format_size(key.max_size));
  }
  if (*v < key.min_size) {
    return invalid_argument(quoted(text) + " is less than the minimum, " +
                            format_size(key.min_size));
  }
  if (*v > key.max_size) {
    return invalid_argument(quoted(text) + " is more than the maximum, " +
                            format_size(key.max_size));
  }
  return *v;
}

Result<std::string> parse_string_for(const Key& key, const std::string& text, const Env& env) {
  if (!key.choices.empty()) {
    for (std::string_view choice : key.choices) {
      if (text == choice) return text;
    }
    return invalid_argument(quoted(text) + " is not one of: " + join(key.choices, ", "));
  }
  CAIRN_RETURN_IF_ERROR(check_text(text));
  CAIRN_ASSIGN_OR_RETURN(std::string expanded, expand(text, env, 0));
  CAIRN_RETURN_IF_ERROR(check_text(expanded).with_context("after expansion"));
  return expanded;
}

// Splits an environment list value on commas; "" is the empty list.
Result<std::vector<std::string>> split_list(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? std::string() : item.substr(b, e - b + 1);
    if (item.empty()) {
      return invalid_argument("item " + std::to_string(items.size() + 1) + " of " + quoted(text) +
                              " is empty (write a comma-separated list: a,b,c)");
    }
    items.push_back(std::move(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

// Sets a list field from its items; `where(i)` names item i in messages.
template <typename Where>
Status set_list(const Key& key, const std::vector<std::string>& items, const Env& env, Config& cfg,
                Where where) {
  Field f = key.field(cfg);
  if (auto* ints = std::get_if<std::vector<int>*>(&f)) {
    std::vector<int> out;
    for (size_t i = 0; i < items.size(); ++i) {
      Result<int> v = parse_device(items[i]);
      if (!v) return v.status().with_context(where(i));
      out.push_back(*v);
    }
    **ints = std::move(out);
    return Status::ok();
  }
  auto* strings = std::get<std::vector<std::string>*>(f);
  std::vector<std::string> out;
  for (size_t i = 0; i < items.size(); ++i) {
    Result<std::string> v = parse_string_for(key, items[i], env);
    if (!v) return v.status().with_context(where(i));
    out.push_back(std::move(v).value());
  }
  *strings = std::move(out);
  return Status::ok();
}

Kind kind_of(const Key& key) {
  static Config scratch;  // only its members' addresses are taken
  return static_cast<Kind>(key.field(scratch).index());
}

bool is_list(const Key& key) { return kind_of(key) == kIntList || kind_of(key) == kStringList; }

// Sets a scalar (non-list) field from text. Messages carry no key; the caller adds it.
Status set_scalar(const Key& key, const std::string& text, const Env& env, Config& cfg) {
  Field f = key.field(cfg);
  if (auto* s = std::get_if<std::string*>(&f)) {
    CAIRN_ASSIGN_OR_RETURN(**s, parse_string_for(key, text, env));
  } else if (auto* size = std::get_if<uint64_t*>(&f)) {
    CAIRN_ASSIGN_OR_RETURN(**size, parse_size_for(key, text));
  } else if (auto* b = std::get_if<bool*>(&f)) {
    CAIRN_ASSIGN_OR_RETURN(**b, parse_bool(text));
  } else {
    return internal_error("set_scalar on a list key");
  }
  return Status::ok();
}

// What a key expects, for "expected X, got Y" messages.
std::string expectation(const Key& key) {
  switch (kind_of(key)) {
    case kString:
      return key.choices.empty() ? "a string" : "one of: " + join(key.choices, ", ");
    case kSize:
      return "a size " + std::string(kSizeExamples);
    case kBool:
      return "a boolean (true or false)";
    case kIntList:
      return "a list of device numbers, like [0, 1]";
    case kStringList:
      break;
  }
  return "a list of strings, like [\"node1:7000\", \"node2:7000\"]";
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return quoted(node.Scalar());
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "an undefined node";
  }
}

// ---- the YAML overlay ----

class Overlay {
 public:
  Overlay(const Env& env, Config& cfg) : env_(env), cfg_(cfg) {}

  // Applies a mapping at `prefix` ("" = the document) to the config.
  Status apply_map(const YAML::Node& map, const std::string& prefix) {
    std::set<std::string> seen;
    for (const auto& entry : map) {
      const YAML::Node key_node = entry.first;
      const YAML::Node value = entry.second;
      if (!key_node.IsScalar()) {
        return invalid_argument((prefix.empty() ? std::string() : prefix + ": ") +
                                "a key must be a plain name, not " + describe(key_node));
      }
      const std::string& name = key_node.Scalar();
      std::string path = join_path(prefix, name.empty() ? "''" : name);
      if (!seen.insert(name).second) return invalid_argument(path + ": key given twice");
      // A dotted name ("tiers.dram") is not a shorthand for nesting.
      bool plain = !name.empty() && name.find('.') == std::string::npos;
      const Key* key = plain ? find_key(path) : nullptr;
      if (key != nullptr) {
        CAIRN_RETURN_IF_ERROR(apply_leaf(*key, value).with_context(path));
        continue;
      }
      std::vector<std::string> children = plain ? names_under(path) : std::vector<std::string>{};
      if (children.empty()) {
        return invalid_argument(
            path + ": unknown key (valid keys here: " + join(names_under(prefix), ", ") + ")");
      }
      if (value.IsNull()) continue;  // "tiers:" with nothing under it
      if (!value.IsMap()) {
        return invalid_argument(path + ": expected a mapping of " + join(children, ", ") +
                                ", got " + describe(value));
      }
      CAIRN_RETURN_IF_ERROR(apply_map(value, path));
    }
    return Status::ok();
  }

 private:
  Status apply_leaf(const Key& key, const YAML::Node& value) {
    if (is_list(key)) {
      std::vector<std::string> items;
      if (value.IsSequence()) {
        for (size_t i = 0; i < value.size(); ++i) {
          const YAML::Node item = value[i];
          if (!item.IsScalar()) {
            return invalid_argument("item " + std::to_string(i + 1) + ": expected a scalar, got " +
                                    describe(item));
          }
          items.push_back(item.Scalar());
        }
      } else if (!value.IsNull()) {
        return invalid_argument("expected " + expectation(key) + ", got " + describe(value));
      }
      return set_list(key, items, env_, cfg_,
                      [](size_t i) { return "item " + std::to_string(i + 1); });
    }
    if (value.IsNull() && kind_of(key) == kString && key.choices.empty()) {
      *std::get<std::string*>(key.field(cfg_)) = "";
      return Status::ok();
    }
    if (!value.IsScalar()) {
      return invalid_argument("expected " + expectation(key) + ", got " + describe(value));
    }
    return set_scalar(key, value.Scalar(), env_, cfg_);
  }

  const Env& env_;
  Config& cfg_;
};

// Counts the documents of a YAML stream without building them. yaml-cpp 0.7 never consumes a
// stray ',' at the top level of a document: YAML::LoadAll(",") loops forever, appending empty
// documents until memory runs out (found by fuzz_config). Such a document starts where the one
// before it did; stuck() reports that.
class DocumentCounter : public YAML::EventHandler {
 public:
  int documents() const { return documents_; }
  bool stuck() const { return stuck_; }
  const YAML::Mark& last_start() const { return last_start_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (documents_ > 0 && mark.pos == last_start_.pos) stuck_ = true;
    last_start_ = mark;
    ++documents_;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  int documents_ = 0;
  bool stuck_ = false;
  YAML::Mark last_start_ = YAML::Mark::null_mark();
};

Status apply_text(const std::string& text, const std::string& source, const Env& env, Config& cfg) {
  const std::string where = source.empty() ? std::string("config") : source;
  if (text.size() > kMaxConfigBytes) {
    return invalid_argument(where + ": is " + std::to_string(text.size()) +
                            " bytes; a config is at most 1 MiB (is this the right file?)");
  }
  auto at = [](const YAML::Mark& mark) {
    return mark.is_null() ? std::string()
                          : "line " + std::to_string(mark.line + 1) + ", column " +
                                std::to_string(mark.column + 1) + ": ";
  };
  YAML::Node doc;
  try {
    // Count the documents first (see DocumentCounter), then build the one there is.
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentCounter counter;
    while (!counter.stuck() && counter.documents() < 3 && parser.HandleNextDocument(counter)) {
    }
    if (counter.stuck()) {
      const YAML::Mark& m = counter.last_start();
      std::string token = m.pos >= 0 && static_cast<size_t>(m.pos) < text.size()
                              ? quoted(text.substr(static_cast<size_t>(m.pos), 1))
                              : std::string("token");
      return invalid_argument(where + ": " + at(m) + "not valid YAML: unexpected " + token);
    }
    if (counter.documents() > 1) {
      return invalid_argument(where +
                              ": holds more than one YAML document; a config is one "
                              "mapping (remove the '---' lines)");
    }
    doc = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return invalid_argument(where + ": " + at(e.mark) + "not valid YAML: " + e.msg);
  }
  if (doc.IsNull()) return Status::ok();  // empty: nothing to override
  if (!doc.IsMap()) {
    return invalid_argument(where + ": a config is a mapping of keys (" +
                            join(names_under(""), ", ") + "), not " + describe(doc));
  }
  return Overlay(env, cfg).apply_map(doc, "").with_context(where);
}

Status apply_env(const Env& env, Config& cfg) {
  for (const Key& key : schema()) {
    std::string var = env_name(key.path);
    auto it = env.find(var);
    if (it == env.end()) continue;
    if (is_list(key)) {
      Result<std::vector<std::string>> items = split_list(it->second);
      if (!items) return items.status().with_context(var);
      CAIRN_RETURN_IF_ERROR(set_list(
          key, *items, env, cfg, [&](size_t i) { return var + " item " + std::to_string(i + 1); }));
    } else {
      CAIRN_RETURN_IF_ERROR(set_scalar(key, it->second, env, cfg).with_context(var));
    }
  }
  return Status::ok();
}

// ---- the emitter ----

void append_utf8_escape(std::string& out, uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, cp > 0xffff ? "\\U%08X" : "\\u%04X", static_cast<unsigned>(cp));
  out += buf;
}

// A YAML double-quoted string that reads back, through our loader, as exactly `s`: '$' is doubled
// because string values are expanded on load.
std::string quote(std::string_view s) {
  std::string out = "\"";
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<unsigned char>(s[i]);
    if (b == '"' || b == '\\') {
      out += '\\';
      out += static_cast<char>(b);
      ++i;
    } else if (b == '$') {
      out += "$$";
      ++i;
    } else if (b < 0x20 || b == 0x7f) {
      append_utf8_escape(out, b);
      ++i;
    } else if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
    } else {
      // Strings are valid UTF-8 (check_text). Line and paragraph separators, NEL and BOM are
      // folded or dropped by YAML readers when written raw, so they are escaped.
      int len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2;
      if (i + len > s.size()) len = static_cast<int>(s.size() - i);
      uint32_t cp = b & (0x7f >> len);
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      if (cp <= 0x9f || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff) {
        append_utf8_escape(out, cp);
      } else {
        out.append(s.substr(i, len));
      }
      i += len;
    }
  }
  return out + "\"";
}

std::string render(const Key& key, Config& cfg) {
  Field f = key.field(cfg);
  if (auto* s = std::get_if<std::string*>(&f)) return key.choices.empty() ? quote(**s) : **s;
  if (auto* size = std::get_if<uint64_t*>(&f)) return format_size(**size);
  if (auto* b = std::get_if<bool*>(&f)) return **b ? "true" : "false";
  std::vector<std::string> items;
  if (auto* ints = std::get_if<std::vector<int>*>(&f)) {
    for (int v : **ints) items.push_back(std::to_string(v));
  } else {
    for (const std::string& v : *std::get<std::vector<std::string>*>(f)) items.push_back(quote(v));
  }
  return "[" + join(items, ", ") + "]";
}

}  // namespace

std::optional<uint64_t> parse_size(const std::string& text) {
  size_t i = 0;
  uint64_t whole = 0;
  size_t int_digits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (__builtin_mul_overflow(whole, 10, &whole) ||
        __builtin_add_overflow(whole, static_cast<uint64_t>(text[i] - '0'), &whole)) {
      return std::nullopt;
    }
    ++i;
    ++int_digits;
  }
  if (int_digits == 0) return std::nullopt;
  // Fraction: at most 9 digits (finer than any unit needs), so that frac * unit fits in 64 bits.
  uint64_t frac = 0;
  uint64_t frac_scale = 1;
  bool has_point = false;
  if (i < text.size() && text[i] == '.') {
    has_point = true;
    ++i;
    size_t frac_digits = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (++frac_digits > 9) return std::nullopt;
      frac = frac * 10 + static_cast<uint64_t>(text[i] - '0');
      frac_scale *= 10;
      ++i;
    }
    if (frac_digits == 0) return std::nullopt;
  }
  if (i < text.size() && text[i] == ' ') ++i;
  std::string_view unit_text = std::string_view(text).substr(i);
  static const std::pair<std::string_view, uint64_t> kUnits[] = {
      {"B", 1},     {"KiB", kKiB},   {"MiB", kMiB},      {"GiB", kGiB},         {"TiB", kTiB},
      {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"TB", 1000000000000}, {"K", kKiB},
      {"M", kMiB},  {"G", kGiB},     {"T", kTiB}};
  uint64_t unit = 0;
  if (unit_text.empty()) {
    if (text.back() == ' ') return std::nullopt;  // "5 " is not a size
    unit = 1;
  } else {
    for (const auto& [name, value] : kUnits) {
      if (unit_text == name) unit = value;
    }
  }
  if (unit == 0) return std::nullopt;
  if (has_point && unit == 1) return std::nullopt;  // no fractions of a byte
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(whole, unit, &bytes)) return std::nullopt;
  // floor(frac / frac_scale * unit), computed without overflow: frac < frac_scale <= 1e9.
  uint64_t part = frac * (unit / frac_scale) + frac * (unit % frac_scale) / frac_scale;
  if (__builtin_add_overflow(bytes, part, &bytes)) return std::nullopt;
  return bytes;
}

std::string Config::to_yaml() const {
  Config copy = *this;  // the schema's accessors take a mutable Config
  std::string out = "# cairn configuration (the effective values; see docs/config.md)\n";
  std::vector<std::string> open;  // the sections the previous key was in
  for (const Key& key : schema()) {
    std::vector<std::string> parts;
    std::string_view rest = key.path;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos;
         rest.remove_prefix(dot + 1)) {
      parts.emplace_back(rest.substr(0, dot));
    }
    size_t common = 0;
    while (common < parts.size() && common < open.size() && parts[common] == open[common]) ++common;
    for (size_t d = common; d < parts.size(); ++d) {
      out += std::string(2 * d, ' ') + parts[d] + ":\n";
    }
    open = parts;
    out += std::string(2 * parts.size(), ' ') + std::string(rest) + ": " + render(key, copy) + "\n";
  }
  return out;
}

Result<Config> load_config_text(const std::string& yaml_text, const std::string& source,
                                const std::map<std::string, std::string>& env) {
  try {
    Config cfg;
    CAIRN_RETURN_IF_ERROR(apply_text(default_config_yaml(), "embedded default config", env, cfg));
    CAIRN_RETURN_IF_ERROR(apply_text(yaml_text, source, env, cfg));
    CAIRN_RETURN_IF_ERROR(apply_env(env, cfg));
    return cfg;
  } catch (const YAML::Exception& e) {
    return invalid_argument((source.empty() ? std::string("config") : source) +
                            ": not valid YAML: " + e.what());
  } catch (const std::exception& e) {
    return internal_error((source.empty() ? std::string("config") : source) +
                          ": reading the config failed: " + e.what());
  } catch (...) {
    return internal_error((source.empty() ? std::string("config") : source) +
                          ": reading the config failed with an unknown exception");
  }
}

Result<Config> load_config(const std::string& path, const std::map<std::string, std::string>& env) {
  if (path.empty()) return load_config_text("", "", env);
  const std::string what = "config file '" + path + "'";
  const std::string hint =
      " (give --config an existing, readable YAML file, or none for the defaults)";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    Status s = errno_status(what, errno);
    return Status(s.code(), s.message() + hint);
  }
  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = errno_status(what, errno);
      ::close(fd);
      return Status(s.code(), s.message() + hint);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxConfigBytes) break;  // load_config_text rejects it with the size
  }
  ::close(fd);
  return load_config_text(text, path, env);
}

std::map<std::string, std::string> process_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

}  // namespace cairn
