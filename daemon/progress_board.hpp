// Progress of the long requests in flight (gc, fsck, flush, sync, prefetch), published under a token
// their client chose, so that the client can ask for it on another connection while the request
// runs (docs/protocol.md, "Progress").
//
// A request names its token in the optional field "progress"; without it the request runs the same
// and its progress is tracked but published nowhere. The `progress` request reads the
// current snapshot by token.
//
// Thread-safety: every method may be called from any thread. An Entry belongs to the thread serving
// its request; its OperationProgress may be updated from any thread while the Entry lives.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "core/progress.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/request.hpp"

namespace cairn {

class ProgressBoard {
 public:
  // One request's progress, published under its token until the Entry is destroyed.
  class Entry {
   public:
    Entry(Entry&& o) noexcept : board_(o.board_), token_(std::move(o.token_)), progress_(std::move(o.progress_)) {
      o.board_ = nullptr;
    }
    Entry& operator=(Entry&&) = delete;
    ~Entry();
    OperationProgress& progress() { return *progress_; }

   private:
    friend class ProgressBoard;
    Entry(ProgressBoard* board, std::string token, std::shared_ptr<OperationProgress> p)
        : board_(board), token_(std::move(token)), progress_(std::move(p)) {}
    ProgressBoard* board_;  // null: published nowhere
    std::string token_;
    std::shared_ptr<OperationProgress> progress_;
  };

  // The Entry for a request: published under its token when it has one (request::ProgressToken, a
  // valid name as decoded), else unpublished. kExists when a request with the same token runs now.
  Result<Entry> track(const request::ProgressToken& token);
  // The `progress` request: -> {"progress": {phase, unit, done, total}}. kNotFound when no request
  // with that token runs now (not started yet, or finished).
  Result<nlohmann::json> query(const request::ProgressQuery& req) const;

 private:
  void end(const std::string& token);

  mutable cairn::Mutex mu_;
  std::map<std::string, std::shared_ptr<OperationProgress>> running_ CAIRN_GUARDED_BY(mu_);
};

}  // namespace cairn
