#include "daemon/models.hpp"

namespace cairn {

Result<std::shared_ptr<const ModelManifest>> ModelDirectory::find(const std::string& id) const {
  if (auto pending = flusher_.find(id)) return pending;
  if (auto remote = remote_.find(id)) return remote;
  auto m = repo_.get_shared(id);
  if (!m.ok()) return not_found("model '" + id + "' does not exist (see `cairn ls`)");
  if ((*m)->collected)
    return not_found("model '" + id + "' was retired and its data collected by `cairn gc`; only its lineage remains");
  return std::move(m).value();
}

Result<std::shared_ptr<const ModelManifest>> ModelDirectory::find_fresh(const std::string& id) const {
  if (view_) {
    Status viewed = view_->refresh();
    if (!viewed.ok()) return viewed.with_context("model '" + id + "': reading the repository's logs");
  }
  return find(id);
}

}  // namespace cairn
