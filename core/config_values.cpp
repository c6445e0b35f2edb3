// Config values: ${VAR} expansion, UTF-8/text checks, parsing of sizes, booleans, device numbers
// and strings against a schema key, and the public parse_size().
#include "core/config_values.hpp"

#include <pwd.h>
#include <unistd.h>

#include <climits>
#include <optional>

namespace cairn {
namespace config_internal {
namespace {

// How deeply ${A:-${B:-...}} defaults may nest.
constexpr int kMaxExpansionDepth = 16;

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

// Strings must be UTF-8 without control characters, so that to_yaml() can write them back.
Status check_text(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x20 || b == 0x7f) {
      return invalid_argument(quote_for_message(text) + " contains a control character");
    }
    if (b < 0x80) {
      ++i;
      continue;
    }
    int len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 0;
    if (len == 0 || b > 0xf4 || i + len > text.size()) {
      return invalid_argument(quote_for_message(text) + " is not valid UTF-8");
    }
    uint32_t cp = b & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      auto cont = static_cast<unsigned char>(text[i + k]);
      if ((cont & 0xc0) != 0x80) return invalid_argument(quote_for_message(text) + " is not valid UTF-8");
      cp = (cp << 6) | (cont & 0x3f);
    }
    static constexpr uint32_t kMinForLen[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return invalid_argument(quote_for_message(text) + " is not valid UTF-8");
    }
    if (cp >= 0x80 && cp <= 0x9f) {
      return invalid_argument(quote_for_message(text) + " contains a control character");
    }
    i += len;
  }
  return Status::OK();
}

}  // namespace

constexpr std::string_view kSizeExamples = "(examples: 512MiB, 2GiB, 1073741824)";

// Quotes a value for an error message, shortened so that a huge value cannot flood the log.
std::string quote_for_message(std::string_view text) {
  constexpr size_t kMax = 80;
  if (text.size() <= kMax) return "'" + std::string(text) + "'";
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;  // whole chars
  return "'" + std::string(text.substr(0, cut)) + "...'";
}

// Expands ${VAR}, ${VAR:-default}, $VAR and $$ (a literal '$') in `text`.
Result<std::string> expand(std::string_view text, const Env& env, int depth) {
  if (depth > kMaxExpansionDepth) {
    return invalid_argument("${...:-...} defaults nest more than " + std::to_string(kMaxExpansionDepth) + " deep in " +
                            quote_for_message(text));
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
        return invalid_argument("unterminated '${' in " + quote_for_message(text) +
                                " (write ${NAME}, ${NAME:-default}, or $$ for a literal '$')");
      }
      std::string_view inner = text.substr(i + 2, j - i - 2);
      size_t n = 0;
      while (n < inner.size() && is_name_char(inner[n])) ++n;
      std::string name(inner.substr(0, n));
      std::string_view rest = inner.substr(n);
      bool has_default = rest.substr(0, 2) == ":-";
      if (name.empty() || !is_name_start(name[0]) || (!rest.empty() && !has_default)) {
        return invalid_argument("bad variable reference " + quote_for_message("${" + std::string(inner) + "}") +
                                " in " + quote_for_message(text) +
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

Result<bool> parse_bool(const std::string& text) {
  static const char* const kTrue[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "1"};
  static const char* const kFalse[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "0"};
  for (const char* t : kTrue) {
    if (text == t) return true;
  }
  for (const char* f : kFalse) {
    if (text == f) return false;
  }
  return invalid_argument(quote_for_message(text) + " is not a boolean (use true or false)");
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
    return invalid_argument(quote_for_message(text) + " is not a device number (a CUDA ordinal: 0, 1, ...)");
  }
  return static_cast<int>(v);
}

std::string format_size(uint64_t bytes) {
  static const std::pair<uint64_t, const char*> kUnits[] = {{kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}};
  if (bytes == 0) return "0";
  for (const auto& [unit, name] : kUnits) {
    if (bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

Result<uint64_t> parse_size_for(const Key& key, const std::string& text) {
  std::optional<uint64_t> v = parse_size(text);
  if (!v) return invalid_argument(quote_for_message(text) + " is not a size " + std::string(kSizeExamples));
  if (key.power_of_two && ((*v & (*v - 1)) != 0 || *v < key.min_size || *v > key.max_size)) {
    return invalid_argument(quote_for_message(text) + " is not a power of two between " + format_size(key.min_size) +
                            " and " + format_size(key.max_size));
  }
  if (*v < key.min_size) {
    return invalid_argument(quote_for_message(text) + " is less than the minimum, " + format_size(key.min_size));
  }
  if (*v > key.max_size) {
    return invalid_argument(quote_for_message(text) + " is more than the maximum, " + format_size(key.max_size));
  }
  return *v;
}

Result<std::string> parse_string_for(const Key& key, const std::string& text, const Env& env) {
  if (key.duration != Key::Duration::kNo) {
    const auto d = parse_duration(text);
    if (!d) {
      return invalid_argument(quote_for_message(text) + " is not a duration (a number and ms, s or m: 500ms, 10s, 10m" +
                              (key.duration == Key::Duration::kOrZero ? "; 0 = off)" : ")"));
    }
    if (key.duration == Key::Duration::kPositive && d->count() <= 0)
      return invalid_argument(quote_for_message(text) + " is not a positive duration (such as 500ms, 10s or 2m)");
    return format_duration(*d);
  }
  if (!key.choices.empty()) {
    for (std::string_view choice : key.choices) {
      if (text == choice) return text;
    }
    return invalid_argument(quote_for_message(text) + " is not one of: " + join(key.choices, ", "));
  }
  CAIRN_RETURN_IF_ERROR(check_text(text));
  CAIRN_ASSIGN_OR_RETURN(std::string expanded, expand(text, env, 0));
  CAIRN_RETURN_IF_ERROR(check_text(expanded).with_context("after expansion"));
  if (key.host_port && !expanded.empty()) CAIRN_RETURN_IF_ERROR(parse_host_port(expanded).status());
  return expanded;
}

// Splits an environment list value on commas; "" is the empty list.
Result<std::vector<std::string>> split_list(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? std::string() : item.substr(b, e - b + 1);
    if (item.empty()) {
      return invalid_argument("item " + std::to_string(items.size() + 1) + " of " + quote_for_message(text) +
                              " is empty (write a comma-separated list: a,b,c)");
    }
    items.push_back(std::move(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

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
  return Status::OK();
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

}  // namespace config_internal

using config_internal::kGiB;
using config_internal::kKiB;
using config_internal::kMiB;
using config_internal::kTiB;

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

std::string format_duration(std::chrono::milliseconds d) {
  const auto ms = static_cast<uint64_t>(d.count());
  if (ms == 0) return "0";
  if (ms % 60000 == 0) return std::to_string(ms / 60000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

Result<HostPort> parse_host_port(const std::string& text) {
  const std::string form = " (write HOST:PORT, such as 127.0.0.1:9464, 0.0.0.0:9464 or [::1]:9464)";
  std::string_view host;
  std::string_view rest;
  if (text.find("://") != std::string::npos)
    return invalid_argument(config_internal::quote_for_message(text) + " is a URL, not an address" + form);
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos)
      return invalid_argument(config_internal::quote_for_message(text) + " has an unclosed '['" + form);
    host = std::string_view(text).substr(1, close - 1);
    rest = std::string_view(text).substr(close + 1);
    if (host.empty() || host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos)
      return invalid_argument(config_internal::quote_for_message(text) +
                              " does not hold an IPv6 address in its brackets" + form);
    if (rest.empty() || rest[0] != ':')
      return invalid_argument(config_internal::quote_for_message(text) + " has no port" + form);
    rest.remove_prefix(1);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos)
      return invalid_argument(config_internal::quote_for_message(text) + " has no port" + form);
    host = std::string_view(text).substr(0, colon);
    rest = std::string_view(text).substr(colon + 1);
    if (host.find(':') != std::string_view::npos)
      return invalid_argument(config_internal::quote_for_message(text) +
                              " is an IPv6 address without brackets (write [ADDRESS]:PORT, such as [::1]:9464)");
    if (host.empty())
      return invalid_argument(config_internal::quote_for_message(text) +
                              " has no host (write 0.0.0.0:PORT to listen on every interface)");
    for (char c : host) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '-' || c == '_';
      if (!ok)
        return invalid_argument(config_internal::quote_for_message(text) + " has a host that is not a name or address" +
                                form);
    }
  }
  uint32_t port = 0;
  if (rest.empty() || rest.size() > 5 || rest.find_first_not_of("0123456789") != std::string_view::npos)
    return invalid_argument(config_internal::quote_for_message(text) +
                            " has a port that is not a number from 0 to 65535" + form);
  for (char c : rest) port = port * 10 + static_cast<uint32_t>(c - '0');
  if (port > 65535)
    return invalid_argument(config_internal::quote_for_message(text) + " has a port out of range (0 to 65535)");
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

std::optional<std::chrono::milliseconds> parse_duration(const std::string& text) {
  size_t k = 0;
  while (k < text.size() && text[k] >= '0' && text[k] <= '9') ++k;
  if (k == 0 || k > 12) return std::nullopt;
  const uint64_t v = std::stoull(text.substr(0, k));
  const std::string unit = text.substr(k);
  if (unit == "ms") return std::chrono::milliseconds(v);
  if (unit == "s" || (unit.empty() && v == 0)) return std::chrono::milliseconds(v * 1000);
  if (unit == "m") return std::chrono::milliseconds(v * 60000);
  return std::nullopt;
}

}  // namespace cairn
