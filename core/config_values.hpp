// Internal to core/config*.cpp: parsing and validating config values (sizes, booleans, device
// numbers, strings with ${VAR} expansion) and setting them into a Config through the schema.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/config_schema.hpp"

namespace cairn::config_internal {

// Quotes a value for an error message, shortened so that a huge value cannot flood the log.
std::string quote_for_message(std::string_view text);
// Expands ${VAR}, ${VAR:-default}, $VAR and $$ (a literal '$') in `text`.
Result<std::string> expand(std::string_view text, const Env& env, int depth);
Result<bool> parse_bool(const std::string& text);
Result<int> parse_device(const std::string& text);
std::string format_size(uint64_t bytes);
Result<uint64_t> parse_size_for(const Key& key, const std::string& text);
Result<std::string> parse_string_for(const Key& key, const std::string& text, const Env& env);
// Splits an environment list value on commas; "" is the empty list.
Result<std::vector<std::string>> split_list(const std::string& text);
// Sets a scalar (non-list) field from text. Messages carry no key; the caller adds it.
Status set_scalar(const Key& key, const std::string& text, const Env& env, Config& cfg);
// What a key expects, for "expected X, got Y" messages.
std::string expectation(const Key& key);

// Sets a list field from its items; `where(i)` names item i in messages.
template <typename Where>
Status set_list(const Key& key, const std::vector<std::string>& items, const Env& env, Config& cfg, Where where) {
  Field f = key.field(cfg);
  if (auto* ints = std::get_if<std::vector<int>*>(&f)) {
    std::vector<int> out;
    for (size_t i = 0; i < items.size(); ++i) {
      Result<int> v = parse_device(items[i]);
      if (!v) return v.status().with_context(where(i));
      out.push_back(*v);
    }
    **ints = std::move(out);
    return Status::OK();
  }
  auto* strings = std::get<std::vector<std::string>*>(f);
  std::vector<std::string> out;
  for (size_t i = 0; i < items.size(); ++i) {
    Result<std::string> v = parse_string_for(key, items[i], env);
    if (!v) return v.status().with_context(where(i));
    out.push_back(std::move(v).value());
  }
  *strings = std::move(out);
  return Status::OK();
}

}  // namespace cairn::config_internal
