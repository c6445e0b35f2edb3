// `cairn prefetch ID --all` (peer_service.hpp, stage_all): the requester asks every verified member
// to stage the model; each stages it through its own read path, which asks the chunks' homes like
// any read. Since the directory gives each holder one upload of a chunk at a time and every member
// that finishes a chunk becomes a holder of it, a chunk that all members want spreads as a tree,
// and the members' chunks are in flight at once: a pipelined tree (docs/peers.md).
#include <thread>

#include "daemon/peers/peer_service_impl.hpp"

namespace cairn {

using json = nlohmann::json;
using PClock = std::chrono::steady_clock;
using Member = PeerService::Impl::Member;
using Outgoing = PeerService::Impl::Outgoing;

void PeerService::Impl::serve_stage(Member& mem, const StageBody& stage) {
  const uint64_t req = stage.req;
  const std::string model = stage.model;
  const std::string from = mem.info.id;
  {
    cairn::MutexLock sl(stage_mu);
    // Not started yet, or closing: the requester sees this member leave.
    if (stages_stopped || !events) return;
    ++stages_running;
  }
  ++stages_served;
  // Its own thread: a stage reads for seconds, and the progress thread must keep delivering.
  std::thread([this, req, model, from] {
    const auto t0 = PClock::now();
    Result<uint64_t> r = events->stage(model);
    const double seconds = std::chrono::duration<double>(PClock::now() - t0).count();
    json reply{{"req", req}, {"ok", r.ok()}, {"seconds", seconds}};
    if (r.ok())
      reply["bytes"] = *r;
    else
      reply["error"] = r.status().to_string().substr(0, 4000);  // peer_bodies.hpp: at most kMaxErrorBytes
    std::vector<Outgoing> out;
    {
      cairn::MutexLock lock(mu);
      if (auto o = to_member(from, PeerMsg::kStageReply, std::move(reply))) out.push_back(std::move(*o));
    }
    send(out);
    // Notified under the lock: once stop_staging sees zero, this thread touches nothing more.
    cairn::MutexLock sl(stage_mu);
    --stages_running;
    stage_cv.notify_all();
  }).detach();
}

void PeerService::Impl::stage_replied(const StageReplyBody& r) {
  auto p = pendings.find(r.req);
  if (p == pendings.end() || p->second.done) return;
  p->second.done = true;
  if (r.ok)
    p->second.bytes = r.bytes;
  else
    p->second.status = unavailable(r.error);
  p->second.seconds = r.seconds;
  cv.notify_all();
}

json PeerService::stage_all(const std::string& model, PClock::time_point deadline,
                            const std::function<void(size_t, size_t)>& on_answer) {
  Impl& s = *impl_;
  std::vector<std::pair<std::string, uint64_t>> asked;
  std::vector<Outgoing> out;
  {
    cairn::MutexLock lock(s.mu);
    for (auto& [id, m] : s.members) {
      if (!m.verified || !m.reachable) continue;
      const uint64_t req = s.add_pending(id);
      asked.emplace_back(id, req);
      out.push_back(s.make(id, m.handle, PeerMsg::kStage, json{{"req", req}, {"model", model}}));
    }
  }
  s.send(out);
  if (on_answer) on_answer(asked.size(), 0);
  json answers = json::array();
  cairn::MutexLock lock(s.mu);
  for (const auto& [id, req] : asked) {
    auto p = s.wait(lock, req, deadline);
    if (on_answer) {  // outside the service's lock: the caller may take its own
      lock.unlock();
      on_answer(asked.size(), answers.size() + 1);
      lock.lock();
    }
    json a{{"member", id}};
    if (!p) {
      a["ok"] = false;
      a["error"] = "no answer before the deadline";
    } else if (!p->status.ok()) {
      a["ok"] = false;
      a["error"] = p->status.to_string();
    } else {
      a["ok"] = true;
      a["bytes"] = p->bytes;
    }
    if (p) a["seconds"] = p->seconds;
    answers.push_back(std::move(a));
  }
  return answers;
}

void PeerService::stop_staging() {
  Impl& s = *impl_;
  cairn::MutexLock sl(s.stage_mu);
  s.stages_stopped = true;
  s.stage_cv.wait(sl, [&]() CAIRN_REQUIRES(s.stage_mu) { return s.stages_running == 0; });
}

}  // namespace cairn
