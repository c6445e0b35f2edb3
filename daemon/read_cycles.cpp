#include "daemon/read_cycles.hpp"

#include <functional>
#include <unordered_set>

namespace cairn {

ReadCycles::Change ReadCycles::read(const ModelManifest& m, const std::vector<const TensorManifest*>& tensors,
                                    const std::vector<uint32_t>& loaded, int64_t started_ns, int64_t now_ns) {
  Change out;
  if (now_ns - last_expire_ns_ >= 1'000'000'000) out = expire(now_ns);
  if (models_.size() >= options_.max_models && !models_.count(m.id)) {
    // Advice, bounded: the oldest knowledge is forgotten first, which here is all that is not cyclic.
    for (auto it = models_.begin(); it != models_.end();) it = it->second.cyclic ? std::next(it) : models_.erase(it);
  }
  Model& s = models_[m.id];
  const std::vector<TensorManifest>& all = m.tensors.vec();
  if (s.read_ns.size() != all.size() || s.created_ns != m.created_ns) {  // new, or another model under the id
    s.read_ns.assign(all.size(), 0);
    s.created_ns = m.created_ns;
  }
  bool again = false;
  for (size_t k = 0; k < tensors.size() && k < loaded.size(); ++k) {
    const TensorManifest* t = tensors[k];
    if (all.empty() || std::less<>{}(t, all.data()) || !std::less<>{}(t, all.data() + all.size())) continue;
    int64_t& at = s.read_ns[static_cast<size_t>(t - all.data())];
    // Read by a lease that ended before this one began, and missing now: evicted since.
    if (loaded[k] > 0 && at != 0 && at < started_ns) again = true;
    at = now_ns;
  }
  s.last_ns = now_ns;
  if (again && !s.cyclic) {
    s.cyclic = true;
    ++found_;
    std::unordered_set<ChunkHash, ChunkHashHasher> seen;
    for (const TensorManifest& t : all)
      for (const ChunkRef& c : t.chunks)
        if (seen.insert(c.hash).second) s.chunks.push_back(c.hash);
    out.mark.insert(out.mark.end(), s.chunks.begin(), s.chunks.end());
  }
  return out;
}

ReadCycles::Change ReadCycles::forget(const std::string& id) {
  Change out;
  if (auto it = models_.find(id); it != models_.end()) drop(it, out);
  return out;
}

ReadCycles::Change ReadCycles::expire(int64_t now_ns) {
  Change out;
  last_expire_ns_ = now_ns;
  for (auto it = models_.begin(); it != models_.end();) {
    auto next = std::next(it);
    if (now_ns - it->second.last_ns >= options_.idle_ns) drop(it, out);
    it = next;
  }
  return out;
}

void ReadCycles::drop(Map::iterator it, Change& out) {
  if (!it->second.cyclic) {
    models_.erase(it);
    return;
  }
  std::vector<ChunkHash> chunks = std::move(it->second.chunks);
  models_.erase(it);
  std::unordered_set<ChunkHash, ChunkHashHasher> kept;  // used by a model still cyclic
  for (const auto& [id, s] : models_)
    if (s.cyclic) kept.insert(s.chunks.begin(), s.chunks.end());
  for (const ChunkHash& h : chunks)
    if (!kept.count(h)) out.unmark.push_back(h);
}

bool ReadCycles::cyclic(const std::string& id) const {
  auto it = models_.find(id);
  return it != models_.end() && it->second.cyclic;
}

size_t ReadCycles::cyclic_models() const {
  size_t n = 0;
  for (const auto& [id, s] : models_) n += s.cyclic;
  return n;
}

}  // namespace cairn
