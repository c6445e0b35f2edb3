#include "policy/eviction.hpp"

namespace cairn {

void LruPolicy::track(const ChunkHash& key, uint64_t /*bytes*/) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.push_front(key);
  index_.emplace(key, order_.begin());
}

void LruPolicy::touch(const ChunkHash& key) {
  auto it = index_.find(key);
  if (it != index_.end()) order_.splice(order_.begin(), order_, it->second);
}

void LruPolicy::remove(const ChunkHash& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  order_.erase(it->second);
  index_.erase(it);
}

std::optional<ChunkHash> LruPolicy::pick_victim(const std::function<bool(const ChunkHash&)>& evictable) {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it)
    if (evictable(*it)) return *it;
  return std::nullopt;
}

Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const std::string& name) {
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(std::make_unique<LruPolicy>());
  // "lineage" is a valid config value; until the lineage-aware scorer exists it runs as LRU.
  if (name == "lineage") return std::unique_ptr<EvictionPolicy>(std::make_unique<LruPolicy>());
  return invalid_argument("policy.eviction: '" + name + "' is not one of lru, lineage");
}

}  // namespace cairn
