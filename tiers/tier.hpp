// What every tier reports, and the seam the tier manager fetches through.
//
// A ChunkSource is a place below DRAM that can supply a chunk's bytes: the NVMe burst buffer and
// the repository (tiers/chunk_sources.hpp), and the peer group's members (PeerSource,
// daemon/peers/peer_service.cpp). The tier manager keeps an ordered list of them, fastest first,
// and a fetch takes the first intact copy: a new kind of source is one more entry in that list
// (given to the TierManager constructor).
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "core/status.hpp"

namespace cairn {

struct ChunkRef;

// Counters of one tier. Bytes in: bytes that entered the tier (writes, loads from below);
// bytes out: bytes that left it (evictions, flushes to the tier below).
struct TierStats {
  std::string name;
  bool enabled = false;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t chunks = 0;
  uint64_t dirty_bytes = 0;
  uint64_t backpressure_waits = 0;  // allocations that had to wait for dirty data to be written down
  // DRAM only (0 elsewhere): arena bytes resident chunks hold (their extents, rounded up), and of those pinned by
  // readers' leases, staging or flushing. used_bytes - chunk_bytes is arena space held by named tensors, open writes
  // and assembled views; with no client connected and no named tensor, pinned_bytes and that
  // difference are 0 (the torture harness checks this: no leaked arena space).
  uint64_t chunk_bytes = 0;
  uint64_t pinned_bytes = 0;
  std::string pages;  // DRAM only: what backs the arena's pages (SharedArena::pages)
  // DRAM only: arena bytes the daemon has backed with memory since it started (it does so in the
  // background at start, so that the first writes need not fault pages in), and whether that pass
  // is over (it ends early on kernels without MADV_POPULATE_WRITE). -1: not the DRAM tier.
  int64_t prefaulted_bytes = -1;
  bool prefault_finished = false;

  nlohmann::json to_json() const {
    nlohmann::json j = {{"backpressure_waits", backpressure_waits},
                        {"enabled", enabled},
                        {"capacity_bytes", capacity_bytes},
                        {"used_bytes", used_bytes},
                        {"hits", hits},
                        {"misses", misses},
                        {"bytes_in", bytes_in},
                        {"bytes_out", bytes_out},
                        {"chunks", chunks},
                        {"dirty_bytes", dirty_bytes},
                        {"chunk_bytes", chunk_bytes},
                        {"pinned_bytes", pinned_bytes}};
    if (!pages.empty()) j["pages"] = pages;
    if (prefaulted_bytes >= 0) {
      j["prefaulted_bytes"] = prefaulted_bytes;
      j["prefault_finished"] = prefault_finished;
    }
    return j;
  }
};

// A read bandwidth learnt from the reads themselves: a moving average over reads of 64 KiB or more
// (smaller ones measure latency, not bandwidth). Thread-safe.
class MeasuredBandwidth {
 public:
  explicit MeasuredBandwidth(double initial_bytes_per_second) : bw_(initial_bytes_per_second) {}
  void sample(uint64_t bytes, double seconds) {
    if (seconds <= 0 || bytes < (64u << 10)) return;
    bw_.store(0.8 * bw_.load() + 0.2 * (static_cast<double>(bytes) / seconds));
  }
  double bytes_per_second() const { return bw_.load(); }
  double seconds_for(uint64_t bytes) const { return static_cast<double>(bytes) / bw_.load(); }

 private:
  std::atomic<double> bw_;
};

// A source of chunk copies below DRAM. Implementations: tiers/chunk_sources.hpp.
//
// Thread-safety: every method may be called from any thread, concurrently.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;

  // A short name for counters ("reads_from_<name>") and messages: "nvme", "repository", ...
  virtual const std::string& name() const = 0;
  // Whether this source holds a copy of the chunk now. Cheap and local (no I/O); the copy may be
  // gone by the time read() runs, which then fails and the caller tries the next source.
  virtual bool has(const ChunkRef& ref) const = 0;
  // Reads ref.length bytes of the chunk into dst (arena space) and verifies them against ref.hash.
  // kCorruption when the copy fails its check (a source that can, drops it); any other error when
  // the copy cannot be read. On error dst's contents are unspecified; bad bytes are never returned
  // with OK.
  virtual Status read(const ChunkRef& ref, void* dst) = 0;
  // Expected seconds to read `bytes` from here (the eviction policy's refetch cost).
  virtual double cost(uint64_t bytes) const = 0;
  // These chunks will be read soon: a source may start moving them (readahead). Advice only.
  virtual void will_read(std::span<const ChunkRef* const> refs) { (void)refs; }
};

}  // namespace cairn
