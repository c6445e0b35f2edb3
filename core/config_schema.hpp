// Internal to core/config*.cpp: the config key schema (one row per leaf key) and its lookups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/config.hpp"

namespace cairn::config_internal {

using Env = std::map<std::string, std::string>;
using Field = std::variant<std::string*, uint64_t*, bool*, std::vector<int>*, std::vector<std::string>*>;
// A key's type: the alternative of Field its accessor returns.
enum Kind : size_t { kString, kSize, kBool, kIntList, kStringList };

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;

// One leaf key of the schema.
struct Key {
  std::string_view path;                       // dotted: "tiers.dram.capacity"
  Field (*field)(Config&);                     // the member it sets
  std::vector<std::string_view> choices = {};  // strings only: the allowed values; empty = any text
  uint64_t min_size = 0;                       // sizes only: inclusive bounds, in bytes
  uint64_t max_size = UINT64_MAX;
  bool power_of_two = false;  // sizes only
  // Strings only: the value is a duration (parse_duration); `positive`: and not 0.
  enum class Duration { kNo, kOrZero, kPositive } duration = Duration::kNo;
  // Strings only: the value, once expanded, is "" or a HOST:PORT address (parse_host_port).
  bool host_port = false;
};

// Keys in the order to_yaml() writes them; keys of one section are contiguous.
const std::vector<Key>& schema();
std::string join_path(std::string_view prefix, std::string_view name);
const Key* find_key(std::string_view path);
// The distinct names directly under `prefix` ("" = top level), in schema order.
std::vector<std::string> names_under(std::string_view prefix);
std::string join(const std::vector<std::string>& items, std::string_view sep);
std::string join(const std::vector<std::string_view>& items, std::string_view sep);
std::string env_name(std::string_view path);
Kind kind_of(const Key& key);
bool is_list(const Key& key);

}  // namespace cairn::config_internal
