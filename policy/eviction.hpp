// Eviction policies: pure decisions, no I/O (CacheLib's four verbs).
//
// A tier tells its policy what happens to the chunks it holds (track, touch, remove) and asks it for
// victims in order of preference; the tier decides whether a candidate may go (it skips pinned and
// dirty chunks) and does the moving. Policies are not thread-safe: the owning tier serializes calls.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/hash.hpp"
#include "core/status.hpp"

namespace cairn {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // A chunk of `bytes` entered the tier.
  virtual void track(const ChunkHash& key, uint64_t bytes) = 0;
  // The chunk was read.
  virtual void touch(const ChunkHash& key) = 0;
  // The chunk left the tier (evicted or deleted). Unknown keys are ignored.
  virtual void remove(const ChunkHash& key) = 0;
  // The best victim for which evictable(key) is true, or nullopt when none is.
  virtual std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) = 0;
  virtual const char* name() const = 0;
};

// Least recently used: the baseline every other policy is measured against.
class LruPolicy final : public EvictionPolicy {
 public:
  void track(const ChunkHash& key, uint64_t bytes) override;
  void touch(const ChunkHash& key) override;
  void remove(const ChunkHash& key) override;
  std::optional<ChunkHash> pick_victim(const std::function<bool(const ChunkHash&)>& evictable) override;
  const char* name() const override { return "lru"; }
  size_t size() const { return index_.size(); }

 private:
  std::list<ChunkHash> order_;  // front = most recent
  std::unordered_map<ChunkHash, std::list<ChunkHash>::iterator, ChunkHashHasher> index_;
};

// The policy named by policy.eviction ("lru"; "lineage" arrives with the tier manager).
Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const std::string& name);

}  // namespace cairn
