// Synthetic chunk-level traces of the workflows cairn serves, for tests and benchmarks of the
// policies (cairn-sim --generate; the committed ones are bench/traces/*.csv).
//
// Each generator plays the workflow's driver and writes what a cairnd serving it would record:
// the chunks each model reads and writes (models share chunks along their lineage, as content
// addressing makes them), the hints the driver would send, and plausible timestamps (reads at a few
// GB/s, training in between). They do not simulate a cache: access events carry no tier.
// Deterministic for a given seed and scale (own PRNG, no std distributions).
//
//   nas         regularized evolution (Real et al.): a population, tournament selection, a child
//               that inherits the parent's chunks but the mutated layers and the head; the oldest
//               dies. Hints: population after each change, will_load of the parent, done of the dead.
//   ensemble    members fine-tuned from one base (shared backbone, own heads) read round after
//               round, in order, with unrelated one-off model reads in between. Hints: sequence.
//   sweep       a fine-tuning sweep from one base, run in order, then two evaluation passes over
//               the results. Hints: will_load of the base, sequence of each pass.
//   checkpoint  a training loop writing checkpoints (frozen layers inherited), an evaluator reading
//               each one, old ones but the best rotated out, a restart from the latest now and then,
//               a rollback to the best after a loss spike. Hints: will_load, done.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.hpp"
#include "policy/trace.hpp"

namespace cairn {

inline constexpr const char* kTraceWorkloads[] = {"nas", "ensemble", "sweep", "checkpoint"};

struct GenerateOptions {
  uint64_t seed = 1;
  // Multiplies the length of the run (cycles, rounds, runs, checkpoints). REQUIRES: > 0; at 1 each
  // trace has a few thousand events (~100-200 KB of CSV).
  double scale = 1.0;
};

// invalid_argument for an unknown workload or a bad option.
Result<Trace> generate_trace(const std::string& workload, const GenerateOptions& options = {});

}  // namespace cairn
