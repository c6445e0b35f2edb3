// Hints: what a workflow tells cairn about its future reads (docs/policy.md, "Hints"). Advice only:
// a wrong or stale hint may cost bandwidth, never correctness, never an error on a later read.
//
//   {"kind": "will_load",  "models": [...], "tensors": [...] (optional), "when": 2.5 | "next",
//    "tier": "dram" | "hbm" (optional: also into the GPU tier, docs/gpu.md)}
//   {"kind": "population", "models": [...]}          the live set a search draws parents from
//   {"kind": "population", "models": [...], "scores": [...], "tournament": k}
//                                                    the same, with each member's score (higher is
//                                                    better) and the tournament size parents are
//                                                    drawn with: each member's chance to be the next
//                                                    parent (tournament_win_chances) weighs its chunks
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
  // population with scores: scores[i] is models[i]'s (finite; higher is better), tournament the
  // number of members a parent is drawn from; parent_chance[i] = models[i]'s chance to win the next
  // tournament (tournament_win_chances). All three empty / 0 for a population without scores.
  std::vector<double> scores;
  uint32_t tournament = 0;
  std::vector<double> parent_chance;
};

inline constexpr size_t kMaxHintModels = 100000;
inline constexpr size_t kMaxHintTensors = 100000;
inline constexpr uint32_t kMaxSequenceAhead = 64;

// The chance that each member wins one tournament: `tournament` distinct members drawn uniformly at
// random from the population (without replacement, as regularized evolution and PBT draw them), the
// one with the highest score wins. With n members ranked r = 0 (best) .. n-1, that is
// C(n-1-r, k-1) / C(n, k) for k = min(tournament, n); members with equal scores share the chances of
// their ranks equally. The chances sum to 1. REQUIRES: tournament >= 1, every score finite.
std::vector<double> tournament_win_chances(const std::vector<double>& scores, uint32_t tournament);

// Strict: unknown kinds and fields are rejected, every model id and tensor name must be a valid
// name, lists bounded. kInvalidArgument names the field ("hint.models[3]: ...").
Result<Hint> parse_hint(const nlohmann::json& j);
const char* hint_kind_name(Hint::Kind k);

}  // namespace cairn
