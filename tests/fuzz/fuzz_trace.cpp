// libFuzzer target for the trace reader and the simulator: any bytes given as a trace must give a
// Trace or a kInvalidArgument Status whose message names a line, never a crash or an escaping
// exception; a Trace that parses must survive format_trace() -> parse_trace() unchanged, and every
// policy must replay it within the bounds of the cache model.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "policy/simulator.hpp"
#include "policy/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cairn::Result<cairn::Trace> r = cairn::parse_trace(text, "fuzz");
  if (!r.ok()) {
    if (r.status().code() != cairn::StatusCode::kInvalidArgument) std::abort();
    if (r.status().message().rfind("fuzz:", 0) != 0) std::abort();
    return 0;
  }
  const std::string formatted = cairn::format_trace(*r);
  cairn::Result<cairn::Trace> back = cairn::parse_trace(formatted, "round trip");
  if (!back.ok() || !(*back == *r) || cairn::format_trace(*back) != formatted) std::abort();

  cairn::Result<cairn::Simulator> sim = cairn::Simulator::create(*r);
  if (!sim.ok()) {
    if (sim.status().code() != cairn::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const cairn::TraceSummary& s = sim->summary();
  for (uint64_t capacity : {uint64_t{0}, s.working_set_bytes / 2, s.working_set_bytes}) {
    uint64_t belady_hits = 0, lru_hits = 0;
    for (cairn::SimPolicy p : cairn::kAllSimPolicies) {
      const cairn::SimResult res = sim->run(p, capacity);
      if (res.requests != s.accesses || res.hits > res.requests || res.bytes_hit > s.unbounded_bytes_hit) std::abort();
      if (p == cairn::SimPolicy::kBelady) belady_hits = res.bytes_hit;
      if (p == cairn::SimPolicy::kLru) lru_hits = res.bytes_hit;
    }
    // With room for everything read, LRU and Belady both hit every reread.
    if (capacity >= s.working_set_bytes && s.inserts == 0 &&
        (lru_hits != s.unbounded_bytes_hit || belady_hits != lru_hits))
      std::abort();
  }
  return 0;
}
