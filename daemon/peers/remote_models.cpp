// The job's catalog of models committed on other members (remote_models.hpp).
#include "daemon/peers/remote_models.hpp"

#include <algorithm>

namespace cairn {

bool RemoteModels::put(std::shared_ptr<const ModelManifest> model, const std::string& member) {
  std::lock_guard lock(mu_);
  const std::string id = model->id;
  return models_.try_emplace(id, std::move(model), member).second;
}

std::shared_ptr<const ModelManifest> RemoteModels::find(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.first;
}

bool RemoteModels::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  return models_.erase(id) > 0;
}

std::vector<std::shared_ptr<const ModelManifest>> RemoteModels::all() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const ModelManifest>> out;
  out.reserve(models_.size());
  for (const auto& [id, e] : models_) out.push_back(e.first);
  return out;
}

std::vector<std::string> RemoteModels::of_member(const std::string& member) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : models_)
    if (e.second == member) out.push_back(id);
  return out;
}

std::string RemoteModels::member_of(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = models_.find(id);
  return it == models_.end() ? std::string() : it->second.second;
}

size_t RemoteModels::size() const {
  std::lock_guard lock(mu_);
  return models_.size();
}

bool RemoteModels::removed(const std::string& id, int64_t at_ns) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = removed_.try_emplace(id, at_ns);
  if (fresh) {
    removed_order_.push_back(id);
    if (removed_order_.size() > kMaxRemoved) {
      removed_.erase(removed_order_.front());
      removed_order_.pop_front();
    }
  } else {
    it->second = std::max(it->second, at_ns);
  }
  auto m = models_.find(id);
  if (m == models_.end() || m->second.first->created_ns > at_ns) return false;  // committed again since
  models_.erase(m);
  return true;
}

bool RemoteModels::removed_after(const std::string& id, int64_t created_ns) const {
  std::lock_guard lock(mu_);
  auto it = removed_.find(id);
  return it != removed_.end() && it->second >= created_ns;
}

}  // namespace cairn
