// Hand-made chunk traces for the policy tests: one event a second, each checked as the trace
// reader would check it.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "policy/simulator.hpp"
#include "policy/trace.hpp"

namespace cairn::testing {

// Builds a trace one event a second (every chunk 10 bytes unless given).
class Build {
 public:
  Build& access(const std::string& model, const std::string& chunk, uint64_t bytes = 10,
                TraceTier tier = TraceTier::kUnknown) {
    return add(TraceEventKind::kAccess, {model}, chunk, bytes, tier);
  }
  Build& insert(const std::string& model, const std::string& chunk, uint64_t bytes = 10) {
    return add(TraceEventKind::kInsert, {model}, chunk, bytes, TraceTier::kUnknown);
  }
  Build& hint(HintKind kind, std::vector<std::string> models) {
    return add(TraceEventKind::kHint, std::move(models), "", 0, TraceTier::kUnknown, kind);
  }
  // A will_load scoped to tensors, as the daemon records it: one hint per chunk.
  Build& expect(const std::string& model, const std::string& chunk, uint64_t bytes = 10) {
    return add(TraceEventKind::kHint, {model}, chunk, bytes, TraceTier::kUnknown, HintKind::kWillLoad);
  }
  // A population member's chance to be the next parent, as the daemon records a population hint
  // with scores (one line per member after the population line).
  Build& chance(const std::string& model, double p) {
    return add(TraceEventKind::kHint, {model}, "", 0, TraceTier::kUnknown, HintKind::kParentChance, p);
  }
  // Reads of model "m", one per character of `chunks`.
  Build& reads(const std::string& chunks) {
    for (char c : chunks) access("m", std::string(1, c));
    return *this;
  }
  const Trace& trace() const { return t_; }
  Simulator simulator() const {
    auto s = Simulator::create(t_);
    REQUIRE(s.ok());
    return std::move(s).value();
  }

 private:
  Build& add(TraceEventKind kind, std::vector<std::string> models, const std::string& chunk, uint64_t bytes,
             TraceTier tier, HintKind hint = HintKind::kNone, std::optional<double> when_s = std::nullopt) {
    TraceEvent e;
    e.time_ns = static_cast<int64_t>(t_.events.size()) * 1'000'000'000;
    e.kind = kind;
    e.models = std::move(models);
    e.chunk = chunk;
    e.bytes = bytes;
    e.tier = tier;
    e.hint = hint;
    e.when_s = when_s;
    REQUIRE(cairn::validate_trace_event(e).ok());
    t_.events.push_back(std::move(e));
    return *this;
  }
  Trace t_;
};

}  // namespace cairn::testing
