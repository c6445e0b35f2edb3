#include "daemon/references.hpp"

namespace cairn {

void ReferenceCounts::count(const ModelManifest& m, int delta) {
  std::lock_guard lock(mu_);
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks) {
      uint32_t& n = refs_[c.hash];
      n = delta > 0 ? n + 1 : (n > 0 ? n - 1 : 0);
      dram_.hint_references(c.hash, n);
      if (n == 0) refs_.erase(c.hash);
    }
}

}  // namespace cairn
