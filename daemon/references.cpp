#include "daemon/references.hpp"

namespace cairn {

void ReferenceCounts::count(const ModelManifest& m, int delta) {
  cairn::MutexLock lock(mu_);
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks) {
      uint32_t& n = refs_[c.hash];
      n = delta > 0 ? n + 1 : (n > 0 ? n - 1 : 0);
      dram_.hint_references(c.hash, n);
      if (n == 0) refs_.erase(c.hash);
    }
}

void ReferenceCounts::count_all(const std::vector<std::shared_ptr<const ModelManifest>>& models) {
  std::unordered_map<const void*, std::pair<const ModelManifest*, uint32_t>> lists;
  std::vector<const ModelManifest*> unshared;
  for (const auto& m : models) {
    if (const void* id = m->tensors.identity()) {
      auto [it, fresh] = lists.try_emplace(id, m.get(), 0);
      ++it->second.second;
    } else {
      unshared.push_back(m.get());
    }
  }
  cairn::MutexLock lock(mu_);
  std::unordered_map<ChunkHash, uint32_t, ChunkHashHasher> touched;
  auto add = [&](const ModelManifest& m, uint32_t times) CAIRN_REQUIRES(mu_) {
    for (const auto& t : m.tensors)
      for (const auto& c : t.chunks) {
        uint32_t& n = refs_[c.hash];
        n += times;
        touched[c.hash] = n;
      }
  };
  for (const auto& [id, entry] : lists) add(*entry.first, entry.second);
  for (const ModelManifest* m : unshared) add(*m, 1);
  for (const auto& [hash, n] : touched) dram_.hint_references(hash, n);
}

}  // namespace cairn
