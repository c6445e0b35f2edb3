// Progress of one long operation (fsck, gc, flush, prefetch, ...), and its wire form.
//
// The thread doing the work updates an OperationProgress; other threads take snapshots of it (the
// daemon's `progress` request, docs/protocol.md "Progress"). A snapshot crosses the wire as the
// JSON object {"phase", "unit", "done", "total"}; progress_from_json is its strict decoder.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.hpp"

namespace cairn {

enum class ProgressUnit : uint8_t { kBytes, kItems };

// "bytes" or "items".
const char* progress_unit_name(ProgressUnit u);

struct ProgressSnapshot {
  std::string phase;  // what the operation does now, in a few words ("verifying chunks")
  ProgressUnit unit = ProgressUnit::kItems;
  uint64_t done = 0;
  uint64_t total = 0;  // 0: not known (yet)

  bool operator==(const ProgressSnapshot&) const = default;
};

// {"phase": string, "unit": "bytes"|"items", "done": uint, "total": uint}.
nlohmann::json progress_to_json(const ProgressSnapshot& s);
// The strict inverse: exactly those four fields with those types, phase at most 256 bytes, done and
// total non-negative integers. Anything else is kProtocol naming the field.
Result<ProgressSnapshot> progress_from_json(const nlohmann::json& j);

// Thread-safety: every method may be called from any thread.
class OperationProgress {
 public:
  // A new phase: done goes back to 0.
  void begin_phase(std::string phase, ProgressUnit unit, uint64_t total) {
    std::lock_guard lock(mu_);
    s_.phase = std::move(phase);
    s_.unit = unit;
    s_.total = total;
    s_.done = 0;
  }
  void add(uint64_t n) {
    std::lock_guard lock(mu_);
    s_.done += n;
  }
  void set_done(uint64_t done) {
    std::lock_guard lock(mu_);
    s_.done = done;
  }
  void set_total(uint64_t total) {
    std::lock_guard lock(mu_);
    s_.total = total;
  }
  ProgressSnapshot snapshot() const {
    std::lock_guard lock(mu_);
    return s_;
  }

 private:
  mutable std::mutex mu_;
  ProgressSnapshot s_;
};

}  // namespace cairn
