// What a daemon did for its clients since it started, for the job summary that `cairn job stop`
// writes (docs/slurm.md, "What cairn saved the job"): models committed and opened, the bytes its
// clients leased by the tier that served them, the bytes commits did not store again
// (deduplicated chunks, tensors inherited from the parent), and the time clients spent waiting for
// the daemon's answers. `stats` reports them as "usage" (docs/protocol.md).
//
// Always on (unlike RequestMetrics, which only metrics.listen or metrics.textfile turn on): every
// record is a few relaxed atomic additions, allocates nothing and takes no lock.
//
// Thread-safety: every method may be called from any thread at once. A snapshot (to_json) taken
// while requests run may mix counts from before and after one of them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace cairn {

class UsageCounters {
 public:
  // One client request answered (successfully or not) after `took`, measured from its arrival at
  // the engine to its response.
  void request_served(std::chrono::nanoseconds took);
  // One model registered by a commit (or by the last part of a multi-part model). Bytes of its
  // tensors: `stored` in chunks new to this daemon, `deduplicated` in chunks it already held in
  // DRAM or found in the repository, `inherited` in tensors declared unchanged from the parent.
  void model_committed(uint64_t stored, uint64_t deduplicated, uint64_t inherited);
  // One model opened by a client (`open`).
  void model_opened();
  // `bytes` of one chunk leased to a client, served by `source`: "dram" (resident already), "nvme",
  // "peer" or "repository" (the tier manager's source names); any other name counts as "other".
  void chunk_leased(std::string_view source, uint64_t bytes);

  // {"requests", "request_wait_ns", "models_committed", "models_opened", "committed_bytes":
  //  {"stored", "deduplicated", "inherited"}, "leased_bytes": {"dram", "nvme", "peer",
  //  "repository", "other"}}; every value a non-negative integer.
  nlohmann::json to_json() const;

 private:
  enum Source { kDram, kNvme, kPeer, kRepository, kOther, kSources };
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> request_wait_ns_{0};
  std::atomic<uint64_t> models_committed_{0};
  std::atomic<uint64_t> models_opened_{0};
  std::atomic<uint64_t> stored_bytes_{0};
  std::atomic<uint64_t> deduplicated_bytes_{0};
  std::atomic<uint64_t> inherited_bytes_{0};
  std::atomic<uint64_t> leased_bytes_[kSources] = {};
};

}  // namespace cairn
