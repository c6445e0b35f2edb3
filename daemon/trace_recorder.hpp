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

namespace cairn {

class TraceRecorder {
 public:
  // Creates (or truncates) the trace file and writes its header. Reads staged by the prefetcher are
  // not recorded: a trace is what the workflow asked for, for any policy to be replayed on.
  static Result<std::unique_ptr<TraceRecorder>> open(const std::string& path, const Clock& clock = steady_clock());

  void access(const std::string& model, const ChunkHash& chunk, uint64_t bytes, const char* tier, bool prefetch);
  void commit(const std::string& model, const ChunkHash& chunk, uint64_t bytes);
  void hint(const Hint& h);
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
