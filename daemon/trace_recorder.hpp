// Records the daemon's chunk-level access trace (policy.trace: FILE) in the format `cairn-sim`
// replays (docs/policy.md, "Trace format"): every chunk a read or a prefetch touched and the tier
// that served it, every chunk a commit created, and every hint.
//
// Owns: the trace file (through policy/trace.hpp's writer). Never fails a request: a write error is
// logged once and recording stops.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/hash.hpp"
#include "core/status.hpp"
#include "daemon/hints.hpp"
#include "policy/eviction.hpp"
#include "policy/trace.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

class TraceRecorder {
 public:
  // Creates (or truncates) the trace file and writes its header. Reads staged by the prefetcher are
  // not recorded: a trace is what the workflow asked for, for any policy to be replayed on.
  static Result<std::unique_ptr<TraceRecorder>> open(const std::string& path, const Clock& clock = steady_clock());

  void access(const std::string& model, const ChunkHash& chunk, uint64_t bytes, const char* tier, bool prefetch);
  void commit(const std::string& model, const ChunkHash& chunk, uint64_t bytes);
  // A commit of `model` uses an existing chunk without writing it (an inherited tensor): a replay
  // learns that the model uses it (its population, done and reference terms cover the chunk).
  void inherit(const std::string& model, const ChunkHash& chunk, uint64_t bytes);
  // Every chunk of an inherited tensor.
  void inherit(const std::string& model, const TensorManifest& t);
  void hint(const Hint& h);
  // One chunk of a will_load scoped to tensors: a read of `chunk` by way of `model` is expected
  // `when_s` from now (0: next).
  void expect(const std::string& model, const ChunkHash& chunk, uint64_t bytes, double when_s);
  uint64_t events() const { return events_.load(); }

 private:
  TraceRecorder(std::unique_ptr<TraceWriter> writer, const Clock& clock) : writer_(std::move(writer)), clock_(clock) {}
  void write(TraceEvent e);

  static constexpr uint64_t kFlushEvery = 256;  // events between flushes to the file

  std::unique_ptr<TraceWriter> writer_;
  const Clock& clock_;
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> events_{0};
};

}  // namespace cairn
