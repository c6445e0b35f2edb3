#include "daemon/progress_board.hpp"

namespace cairn {

using nlohmann::json;

ProgressBoard::Entry::~Entry() {
  if (board_) board_->end(token_);
}

Result<ProgressBoard::Entry> ProgressBoard::track(const request::ProgressToken& token) {
  auto p = std::make_shared<OperationProgress>();
  if (!token) return Entry(nullptr, "", std::move(p));
  cairn::MutexLock lock(mu_);
  if (!running_.emplace(*token, p).second)
    return already_exists("progress token '" + *token + "' is in use by another request in flight; choose another");
  return Entry(this, *token, std::move(p));
}

void ProgressBoard::end(const std::string& token) {
  cairn::MutexLock lock(mu_);
  running_.erase(token);
}

Result<json> ProgressBoard::query(const request::ProgressQuery& req) const {
  const std::string& token = req.id;
  std::shared_ptr<OperationProgress> p;
  {
    cairn::MutexLock lock(mu_);
    auto it = running_.find(token);
    if (it == running_.end()) return not_found("no request with progress token '" + token + "' is running");
    p = it->second;
  }
  return json{{"progress", progress_to_json(p->snapshot())}};
}

}  // namespace cairn
