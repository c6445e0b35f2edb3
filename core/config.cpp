// cairnd's configuration: the schema, YAML overlay, environment overrides, variable expansion and
// the effective-config emitter. The contract is in config.hpp; every key is described in
// docs/config.md.
//
// Why a schema table: every leaf key is one row (dotted path, the Config field it sets, its
// constraints). Walking a YAML document against the table, naming the environment variables,
// listing "valid keys here" and emitting to_yaml() all read the same rows, so a key added in one
// place is known everywhere.
//
// This file: the YAML overlay, environment overrides, loading and the to_yaml() emitter. The key
// table is in config_schema.cpp; value parsing and ${VAR} expansion are in config_values.cpp.
#include "core/config.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

#include "core/config_schema.hpp"
#include "core/config_values.hpp"

namespace cairn {
namespace {

using namespace config_internal;

// A config larger than this is not a config; the cap also bounds the parser's work.
constexpr size_t kMaxConfigBytes = 1u << 20;

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return quote_for_message(node.Scalar());
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
        return invalid_argument((prefix.empty() ? std::string() : prefix + ": ") + "a key must be a plain name, not " +
                                describe(key_node));
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
        return invalid_argument(path + ": unknown key (valid keys here: " + join(names_under(prefix), ", ") + ")");
      }
      if (value.IsNull()) continue;  // "tiers:" with nothing under it
      if (!value.IsMap()) {
        return invalid_argument(path + ": expected a mapping of " + join(children, ", ") + ", got " + describe(value));
      }
      CAIRN_RETURN_IF_ERROR(apply_map(value, path));
    }
    return Status::OK();
  }

 private:
  Status apply_leaf(const Key& key, const YAML::Node& value) {
    if (is_list(key)) {
      std::vector<std::string> items;
      if (value.IsSequence()) {
        for (size_t i = 0; i < value.size(); ++i) {
          const YAML::Node item = value[i];
          if (!item.IsScalar()) {
            return invalid_argument("item " + std::to_string(i + 1) + ": expected a scalar, got " + describe(item));
          }
          items.push_back(item.Scalar());
        }
      } else if (!value.IsNull()) {
        return invalid_argument("expected " + expectation(key) + ", got " + describe(value));
      }
      return set_list(key, items, env_, cfg_, [](size_t i) { return "item " + std::to_string(i + 1); });
    }
    if (value.IsNull() && kind_of(key) == kString && key.choices.empty()) {
      *std::get<std::string*>(key.field(cfg_)) = "";
      return Status::OK();
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
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
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
    return mark.is_null()
               ? std::string()
               : "line " + std::to_string(mark.line + 1) + ", column " + std::to_string(mark.column + 1) + ": ";
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
                              ? quote_for_message(text.substr(static_cast<size_t>(m.pos), 1))
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
  if (doc.IsNull()) return Status::OK();  // empty: nothing to override
  if (!doc.IsMap()) {
    return invalid_argument(where + ": a config is a mapping of keys (" + join(names_under(""), ", ") + "), not " +
                            describe(doc));
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
      CAIRN_RETURN_IF_ERROR(
          set_list(key, *items, env, cfg, [&](size_t i) { return var + " item " + std::to_string(i + 1); }));
    } else {
      CAIRN_RETURN_IF_ERROR(set_scalar(key, it->second, env, cfg).with_context(var));
    }
  }
  return Status::OK();
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
  // Choices and durations (in normal form: digits and a unit) are plain YAML scalars.
  if (auto* s = std::get_if<std::string*>(&f))
    return key.choices.empty() && key.duration == Key::Duration::kNo ? quote(**s) : **s;
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

std::string Config::to_yaml() const {
  Config copy = *this;  // the schema's accessors take a mutable Config
  std::string out = "# cairn configuration (the effective values; see docs/config.md)\n";
  std::vector<std::string> open;  // the sections the previous key was in
  for (const Key& key : schema()) {
    std::vector<std::string> parts;
    std::string_view rest = key.path;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos; rest.remove_prefix(dot + 1)) {
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
    return invalid_argument((source.empty() ? std::string("config") : source) + ": not valid YAML: " + e.what());
  } catch (const std::exception& e) {
    return internal_error((source.empty() ? std::string("config") : source) +
                          ": reading the config failed: " + e.what());
  } catch (...) {
    return internal_error((source.empty() ? std::string("config") : source) +
                          ": reading the config failed with an unknown exception");
  }
}

Status check_config(const Config& config) {
  Config copy = config;  // the schema's accessors take a mutable config; nothing is written
  for (const Key& key : schema()) {
    Field field = key.field(copy);
    auto* text = std::get_if<std::string*>(&field);
    if (!text) continue;
    Status checked;
    if (key.duration != Key::Duration::kNo || !key.choices.empty())
      checked = parse_string_for(key, **text, Env{}).status();
    else if (key.host_port && !(*text)->empty())
      checked = parse_host_port(**text).status();
    if (!checked.ok()) return checked.with_context(std::string(key.path));
  }
  return Status::OK();
}

Result<Config> load_config(const std::string& path, const std::map<std::string, std::string>& env) {
  if (path.empty()) return load_config_text("", "", env);
  const std::string what = "config file '" + path + "'";
  const std::string hint = " (give --config an existing, readable YAML file, or none for the defaults)";
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
