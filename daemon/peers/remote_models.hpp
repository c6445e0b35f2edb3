// The job's catalog: models committed on other members of the peer group that this daemon's
// repository view does not have yet (docs/peers.md, "One catalog per job"). A member announces each
// model it commits, at any durability, to every verified member as soon as the commit is
// acknowledged; the others add it to their lineage catalog and serve it from here, its chunks coming
// from the committer (a peer) until it reaches the repository. An entry leaves when the repository
// watch sees the model published, or when its member leaves the group without having flushed it.
// The watch also records the models it saw removed from the repository (by a gc): an announcement
// of such a model that comes late (a member stopped, then resumed) is refused, and an entry left
// from before the removal is dropped, so no member serves a manifest whose bytes gc freed.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tiers/pfs/manifest.hpp"

namespace cairn {

class RemoteModels {
 public:
  // Adds a model committed on `member`; false when the id is here already.
  bool put(std::shared_ptr<const ModelManifest> model, const std::string& member);
  std::shared_ptr<const ModelManifest> find(const std::string& id) const;
  // Removes it; false when it was not here.
  bool erase(const std::string& id);
  std::vector<std::shared_ptr<const ModelManifest>> all() const;
  // The ids committed on `member`.
  std::vector<std::string> of_member(const std::string& member) const;
  // The member that committed id ("" when it is not here).
  std::string member_of(const std::string& id) const;
  size_t size() const;

  // The repository no longer has id, as seen at wall time at_ns: an entry committed before that is
  // dropped (true when one was), and a later announcement of a model committed before it is stale
  // (removed_after). The last kMaxRemoved such ids are remembered.
  bool removed(const std::string& id, int64_t at_ns);
  // Whether a model of that id committed at created_ns was seen removed since.
  bool removed_after(const std::string& id, int64_t created_ns) const;
  static constexpr size_t kMaxRemoved = 65536;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const ModelManifest>, std::string>> models_;
  std::unordered_map<std::string, int64_t> removed_;  // id -> when it was seen removed (wall ns)
  std::deque<std::string> removed_order_;             // oldest first, for the bound
};

}  // namespace cairn
