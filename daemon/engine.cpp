#include "daemon/engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <mutex>
#include <optional>

#include "core/log.hpp"
#include "core/version.hpp"
#include "core/wire.hpp"
#include "daemon/model_graph.hpp"
#include "daemon/recovery.hpp"
#include "daemon/request.hpp"
#include "daemon/trace_recorder.hpp"

namespace cairn {

using nlohmann::json;

// Engine::create, the constructor and the destructor, which assemble and take apart the
// components, are in engine_open.cpp.

void Engine::drain() { flusher_->drain(); }

bool Engine::drain_for(std::chrono::milliseconds timeout) { return flusher_->drain_for(timeout); }

// ---- the dispatch table: every request op and the component that serves it ----

struct Engine::Op {
  const char* name;
  Handler handler;
};

namespace {

// A typed reply encoded for the wire (request.hpp); a Status alone answers an empty object.
template <class Reply>
Result<json> encoded(Result<Reply> reply) {
  if (!reply.ok()) return reply.status();
  return request::encode(*reply);
}
Result<json> encoded(const Status& st) {
  if (!st.ok()) return st;
  return json::object();
}

}  // namespace

// Each op is decode (request.hpp) -> the component's method -> encode; the ops without request
// fields call their component with none. No component sees a request's JSON.
const std::vector<Engine::Op>& Engine::table() {
  using B = std::vector<uint8_t>;
  static const std::vector<Op> kOps = {
      // connection (engine.cpp)
      {"hello", [](Engine& e, Session& s, const json&, B&) { return e.hello(s); }},
      {"ping", [](Engine&, Session&, const json&, B&) -> Result<json> { return json::object(); }},
      // staging space and commits (commit_path.cpp)
      {"allocate",
       [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_allocate(r));
         return encoded(e.commits_->allocate(s, q));
       }},
      {"free",
       [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_free(r));
         return encoded(e.commits_->free(s, q));
       }},
      {"commit",
       [](Engine& e, Session& s, const json& r, B& b) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_commit(r, {e.repo_->chunk_size()}));
         return encoded(e.commits_->commit(s, std::move(q), b));
       }},
      {"wait",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_wait(r));
         return encoded(e.commits_->wait(q));
       }},
      // named tensors (named_tensors.cpp)
      {"put_tensor",
       [](Engine& e, Session& s, const json& r, B& b) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_put_tensor(r));
         return encoded(e.named_.put(s, q, b));
       }},
      {"tensor_info",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tensor_key(r));
         return encoded(e.named_.info(q));
       }},
      {"lease_tensor",
       [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tensor_key(r));
         return encoded(e.named_.lease(s, q));
       }},
      {"poll_tensor",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_poll_tensor(r));
         return request::encode(e.named_.poll(q));
       }},
      {"delete_tensor",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tensor_key(r));
         return encoded(e.named_.remove(q));
       }},
      // reads (reads.cpp)
      {"open",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_open(r));
         return encoded(e.reads_->open(q));
       }},
      {"lease",
       [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_lease(r));
         return encoded(e.reads_->lease(s, q));
       }},
      {"release",
       [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         auto leases = r.find("leases");
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_release(leases == r.end() ? nullptr : &*leases));
         e.reads_->release(s, q);
         return json::object();
       }},
      {"lease_device",
       [](Engine& e, Session& s, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_lease_device(r));
         return encoded(e.reads_->lease_device(s, q));
       }},
      {"prefetch",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_prefetch(r));
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(q.progress));
         return e.prefetch(q, tracked.progress());
       }},
      // administration (admin.cpp) and queries (queries.cpp)
      {"list",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_list(r));
         return e.admin_->list(q);
       }},
      {"show",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_model_id(r));
         return e.admin_->show(q);
       }},
      {"stats",
       [](Engine& e, Session&, const json&, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(json out, e.admin_->stats());
         out["compute"] = e.compute_->status();
         out["watchdog"] = e.watchdog_.stats();
         out["leases"] = e.reads_->lease_stats();
         out["usage"] = e.usage_.to_json();
         out["usage"]["started_unix_ns"] = e.started_unix_ns_;
         out["fault_injection"] = {{"enabled", e.faults_.enabled()},
                                   {"rules", e.faulty_fs_ ? e.faulty_fs_->rules().size() : 0},
                                   {"injected", e.faulty_fs_ ? e.faulty_fs_->injected() : 0}};
         return out;
       }},
      {"fault",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_RETURN_IF_ERROR(e.faults_.available());  // off: every request refused alike
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_fault(r));
         return e.faults_.handle(q);
       }},
      {"remove",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_model_id(r));
         return e.admin_->remove(q);
       }},
      // The long ones publish their progress under the token in "progress" (progress_board.cpp).
      {"gc",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tracked(r));
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(q.progress));
         return e.admin_->gc(tracked.progress());
       }},
      {"fsck",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_fsck(r));
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(q.progress));
         return e.admin_->fsck(q, tracked.progress());
       }},
      {"flush",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_flush(r));
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(q.progress));
         return e.admin_->flush(q, tracked.progress());
       }},
      {"sync",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_tracked(r));
         CAIRN_ASSIGN_OR_RETURN(auto tracked, e.progress_.track(q.progress));
         tracked.progress().begin_phase("reading the records of other daemons", ProgressUnit::kItems, 0);
         return encoded(e.watch_->sync());
       }},
      {"progress",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_progress(r));
         return e.progress_.query(q);
       }},
      {"peers",
       [](Engine& e, Session&, const json&, B&) -> Result<json> {
         if (!e.peers_) return json{{"enabled", false}, {"members", json::array()}};
         json out = e.peers_->status();
         if (GroupParts* parts = e.commits_->group_parts()) out["parts"] = parts->status();
         return out;
       }},
      {"query",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto q, request::decode_query(r));
         return e.queries_->query(q);
       }},
      // the near-data compute worker (compute.cpp)
      {"compute", [](Engine& e, Session&, const json&, B&) { return e.compute_->attach(); }},
      // hints (prefetcher.cpp)
      {"hint",
       [](Engine& e, Session&, const json& r, B&) -> Result<json> {
         CAIRN_ASSIGN_OR_RETURN(auto h, request::decode_hint(r));
         return e.prefetcher_->hint(h);
       }},
  };
  return kOps;
}

std::vector<std::string> Engine::ops_in_table_order() {
  std::vector<std::string> out;
  for (const Op& op : table()) out.emplace_back(op.name);
  return out;
}

std::vector<std::string> Engine::ops() {
  std::vector<std::string> out = ops_in_table_order();
  std::sort(out.begin(), out.end());
  return out;
}

size_t Engine::op_slot(const std::string& op) {
  const auto& ops = table();
  for (size_t i = 0; i < ops.size(); ++i)
    if (op == ops[i].name) return i;
  return ops.size();
}

Result<json> Engine::dispatch(Session& s, size_t slot, const std::string& op, const json& req,
                              std::vector<uint8_t>& blob) {
  if (slot < table().size()) return table()[slot].handler(*this, s, req, blob);
  return invalid_argument("unknown request op '" + op + "' (client and daemon from different releases?)");
}

Response Engine::handle(Session& session, const json& request, std::vector<uint8_t>& blob) {
  const auto started = std::chrono::steady_clock::now();
  Response r;
  std::string op;
  size_t slot = table().size();
  Result<json> result = [&]() -> Result<json> {
    try {
      // The server's decoder guarantees an object with a string "op"; in-process callers may not.
      auto it = request.is_object() ? request.find("op") : request.end();
      if (it == request.end() || !it->is_string())
        return invalid_argument("a request must be a JSON object with a string field 'op'");
      op = it->get<std::string>();
      slot = op_slot(op);
      // Any request may carry leases the client is done with (saving it a round trip).
      if (auto rel = request.find("release"); rel != request.end() && op != "release") {
        CAIRN_ASSIGN_OR_RETURN(auto released, request::decode_release(&*rel));
        reads_->release(session, released);
      }
      Watchdog::Request tracked(watchdog_, op, {session.id, session.client_pid});
      return dispatch(session, slot, op, request, blob);
    } catch (const std::exception& e) {
      return internal_error(std::string("request '") + op + "' failed: " + e.what());
    }
  }();
  const auto took = std::chrono::steady_clock::now() - started;
  usage_.request_served(std::chrono::duration_cast<std::chrono::nanoseconds>(took));
  if (request_metrics_) record_request(slot, request, result.status().code(), took);
  if (!result.ok()) {
    r.body = json{{"status", static_cast<int>(result.status().code())}, {"error", result.status().message()}};
    r.blob.clear();
    return r;
  }
  r.body = std::move(result).value();
  r.body["status"] = 0;
  return r;
}

void Engine::release_leases(Session& s) { reads_->end_session(s); }

void Engine::end_session(Session& s) {
  reads_->end_session(s);
  commits_->end_session(s);
}

Result<json> Engine::hello(Session& s) {
  if (s.id == 0) s.id = next_session_++;
  json out{{"arena_size", dram_->arena_size()},
           {"chunk_size", repo_->chunk_size()},
           {"pid", static_cast<int64_t>(::getpid())},
           {"session", s.id},
           {"version", version()}};
  if (hbm_) out["hbm"] = json{{"backend", hbm_->backend()}, {"devices", hbm_->devices()}};
  return out;
}

Result<json> Engine::prefetch(const request::Prefetch& req, OperationProgress& progress) {
  if (!req.all) return encoded(reads_->prefetch(req, &progress));
  const std::string& id = req.id;
  CAIRN_RETURN_IF_ERROR(models_->find(id).status());  // unknown here: nobody is asked
  json members = json::array();
  if (!peers_) {
    CAIRN_ASSIGN_OR_RETURN(json local, encoded(reads_->prefetch(req, &progress)));
    local["members"] = std::move(members);
    local["peers"] = false;
    return local;
  }
  // The others and this daemon at once: they fetch from each other as the chunks arrive.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(req.timeout_ms.value_or(uint64_t{600000}));
  auto t0 = std::chrono::steady_clock::now();
  // The other members' answers, counted while this member prefetches; shown once it has finished
  // (its own bytes are the first phase).
  struct Answers {
    std::mutex mu;
    size_t asked = 0, answered = 0;
    bool shown = false;  // GUARDED_BY(mu)
  } answers;
  auto on_answer = [&answers, &progress](size_t asked, size_t answered) {
    std::lock_guard lock(answers.mu);
    answers.asked = asked;
    answers.answered = answered;
    if (!answers.shown) return;
    progress.set_total(asked);
    progress.set_done(answered);
  };
  auto remote = std::async(std::launch::async,
                           [this, &id, deadline, &on_answer] { return peers_->stage_all(id, deadline, on_answer); });
  Result<json> local = encoded(reads_->prefetch(req, &progress));
  const double local_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard lock(answers.mu);
    progress.begin_phase("other members prefetched", ProgressUnit::kItems, answers.asked);
    progress.set_done(answers.answered);
    answers.shown = true;
  }
  {
    Watchdog::ClientWait waiting;  // for the other members, at most timeout_ms
    members = remote.get();
  }
  const double all_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!local.ok()) return local.status().with_context("prefetch --all: this member");
  json out = *local;
  out["seconds"] = local_s;
  out["all_seconds"] = all_s;
  bool ok = true;
  for (const auto& m : members) ok = ok && m.value("ok", false);
  out["all_ok"] = ok;
  out["members"] = std::move(members);
  out["peers"] = true;
  return out;
}

}  // namespace cairn
