// Hints: what a workflow tells cairn about its future reads (docs/policy.md, "Hints"). Advice only:
// a wrong or stale hint may cost bandwidth, never correctness, never an error on a later read.
//
//   {"kind": "will_load",  "models": [...], "tensors": [...] (optional), "when": 2.5 | "next",
//    "tier": "dram" | "hbm" (optional: also into the GPU tier, docs/gpu.md)}
//   {"kind": "population", "models": [...]}          the live set a search draws parents from
//   {"kind": "sequence",   "models": [...], "ahead": 2}   read in this order; stage `ahead` in advance
//   {"kind": "done",       "models": [...]}          no more reads expected: first to go
//
// This file is the parser (pure, fuzzed through fuzz_query's sibling fuzz_hint); the Prefetcher
// (daemon/prefetcher.hpp) acts on parsed hints.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn {

struct Hint {
  enum class Kind { kWillLoad, kPopulation, kSequence, kDone };
  Kind kind = Kind::kWillLoad;
  std::vector<std::string> models;   // distinct, in the order given
  std::vector<std::string> tensors;  // will_load: only these (empty: all)
  double when_s = 0;                 // will_load: seconds from now ("next" = 0)
  bool hbm = false;                  // will_load with "tier": "hbm": staged into the HBM tier too
  uint32_t ahead = 2;                // sequence: models staged ahead of the reader
};

inline constexpr size_t kMaxHintModels = 100000;
inline constexpr size_t kMaxHintTensors = 100000;
inline constexpr uint32_t kMaxSequenceAhead = 64;

// Strict: unknown kinds and fields are rejected, every model id and tensor name must be a valid
// name, lists bounded. kInvalidArgument names the field ("hint.models[3]: ...").
Result<Hint> parse_hint(const nlohmann::json& j);
const char* hint_kind_name(Hint::Kind k);

}  // namespace cairn
