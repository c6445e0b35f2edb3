// The peer service (peer_service.hpp): start and stop, `cairn peers`, the chunk source the tier
// manager asks before the repository, and the service thread (announcements, membership scans).
// The messages are in peer_messages.cpp, a reader's fetch in peer_fetch.cpp.
#include "daemon/peers/peer_service.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_service_impl.hpp"

namespace cairn {

using json = nlohmann::json;
using PClock = std::chrono::steady_clock;
using Member = PeerService::Impl::Member;
using Pending = PeerService::Impl::Pending;
using Outgoing = PeerService::Impl::Outgoing;

void PeerService::Impl::announce(const ChunkHash& h, bool resident) {
  {
    cairn::MutexLock lock(announce_mu);
    announcements.emplace_back(h, resident);
  }
  announce_cv.notify_all();
}

void PeerService::Impl::flush_announcements(std::vector<std::pair<ChunkHash, bool>>& batch) {
  std::vector<Outgoing> out;
  cairn::MutexLock lock(mu);
  std::map<std::string, std::pair<json, json>> per_home;  // home -> (have, drop)
  auto now = PClock::now();
  for (const auto& [h, resident] : batch) {
    std::string home_id = home(h);
    if (home_id == self) {
      if (resident)
        deliver_all(directory.add_holder(h, self, now), out);
      else
        directory.remove_holder(h, self);
      continue;
    }
    auto& [have, drop] = per_home[home_id];
    (resident ? have : drop).push_back(h.hex());
  }
  for (auto& [home_id, lists] : per_home) {
    // At most ~1,500 hashes a frame (64 KiB).
    for (int kind = 0; kind < 2; ++kind) {
      json& list = kind == 0 ? lists.first : lists.second;
      if (list.is_null()) continue;
      for (size_t i = 0; i < list.size(); i += 1000) {
        json part = json::array();
        for (size_t j = i; j < std::min(list.size(), i + 1000); ++j) part.push_back(list[j]);
        if (auto o = to_member(home_id, kind == 0 ? PeerMsg::kHave : PeerMsg::kDrop, json{{"chunks", part}}))
          out.push_back(std::move(*o));
      }
    }
  }
  batch.clear();
  lock.unlock();
  send(out);
}

std::string PeerService::Impl::published_address() const {
  const std::string& c = fabric->address();
  std::string out(2, '\0');
  out[0] = static_cast<char>(c.size() & 0xff);
  out[1] = static_cast<char>((c.size() >> 8) & 0xff);
  return out + c + data->address();
}

bool PeerService::Impl::reach(Member& mem, const std::string& published) {
  const size_t n = published.size() < 2 ? 0
                                        : static_cast<uint8_t>(published[0]) |
                                              (static_cast<size_t>(static_cast<uint8_t>(published[1])) << 8);
  if (published.size() < 2 || n == 0 || n + 2 >= published.size()) {
    CAIRN_LOG_WARN(
        "peers: member {} published an address this daemon cannot read ({} bytes): a cairnd of another version?",
        mem.info.id, published.size());
    return false;
  }
  auto c = fabric->add_peer(published.substr(2, n));
  auto d = c.ok() ? data->add_peer(published.substr(2 + n)) : Result<uint64_t>(c.status());
  if (!c.ok() || !d.ok()) {
    CAIRN_LOG_WARN("peers: member {} at {}: {}", mem.info.id, mem.info.host,
                   (c.ok() ? d.status() : c.status()).to_string());
    return false;  // (an address added to one vector stays: removing one may crash rxm)
  }
  mem.handle = *c;
  mem.data_handle = *d;
  mem.reachable = true;
  mem.info.address = published;
  return true;
}

void PeerService::Impl::scan() {
  std::vector<MemberInfo> live = membership->scan();
  (void)membership->heartbeat();
  std::vector<Outgoing> out;
  std::vector<ChunkHash> reannounce;
  {
    cairn::MutexLock lock(mu);
    std::vector<std::string> now_ids;
    for (const MemberInfo& m : live) now_ids.push_back(m.id);
    std::sort(now_ids.begin(), now_ids.end());
    // Members gone from the directory (left, died, stale heartbeat).
    std::vector<std::string> gone;
    for (const auto& [id, mem] : members)
      if (!std::binary_search(now_ids.begin(), now_ids.end(), id)) gone.push_back(id);
    for (const std::string& id : gone) {
      CAIRN_LOG_INFO("peers: member {} is gone", id);
      forget(id, out);
    }
    // New members: reach them and challenge them.
    for (const MemberInfo& m : live) {
      if (m.id == self) continue;
      Member& mem = members[m.id];
      mem.info = m;
      if (!mem.reachable && !reach(mem, m.address)) continue;
      if (!mem.verified && PClock::now() - mem.hello_at > std::chrono::milliseconds(500)) greet(mem, out);
    }
    if (now_ids != ids) {
      std::vector<std::string> old = ids;
      ids = now_ids;
      (void)directory.take_moved(ids, self);
      for (const ChunkHash& h : dram.resident_chunks())
        if (home_of(h, old) != home_of(h, ids)) reannounce.push_back(h);
    }
  }
  send(out);
  for (const ChunkHash& h : reannounce) announce(h, true);
}

void PeerService::Impl::service_loop() {
  auto period = std::max(std::chrono::milliseconds(50), opts.timeout / 4);
  auto next_scan = PClock::now() + period;
  std::vector<std::pair<ChunkHash, bool>> batch;
  std::vector<std::pair<ModelManifest, std::string>> models;
  std::vector<std::string> gone;
  std::vector<IncomingPart> parts;
  while (true) {
    bool do_scan = false;
    {
      cairn::MutexLock lock(announce_mu);
      announce_cv.wait_until(lock, next_scan, [&]() CAIRN_REQUIRES(announce_mu) {
        return stopping || rescan || !announcements.empty() || !incoming_models.empty() || !gone_members.empty() ||
               !incoming_parts.empty();
      });
      if (stopping) return;
      batch.swap(announcements);
      models.swap(incoming_models);
      gone.swap(gone_members);
      parts.swap(incoming_parts);
      do_scan = rescan || PClock::now() >= next_scan;
      rescan = false;
    }
    if (!batch.empty()) flush_announcements(batch);
    // The job's catalog, in the order the messages came.
    for (auto& [model, member] : models) events->model_announced(std::move(model), member);
    models.clear();
    // Multi-part models across the group: after the models announced before them (a holder told
    // that a model is registered finds it in its catalog), before a goodbye that followed them.
    for (IncomingPart& p : parts) events->part_message(p.type, std::move(p.body), p.member);
    parts.clear();
    for (const std::string& member : gone) events->member_left(member);
    gone.clear();
    if (do_scan) {
      scan();
      release_stale_sends();
      send_delayed_bodies();
      std::vector<Outgoing> out;
      {
        cairn::MutexLock lock(mu);
        deliver_all(directory.expire(PClock::now()), out);
      }
      send(out);
      next_scan = PClock::now() + period;
    }
  }
}

namespace {

class PeerSource final : public ChunkSource {
 public:
  explicit PeerSource(PeerService& service) : service_(service) {}
  const std::string& name() const override { return name_; }
  bool has(const ChunkRef&) const override { return service_.has_members(); }
  Status read(const ChunkRef& ref, void* dst) override {
    auto t0 = PClock::now();
    Status st = service_.fetch(ref, dst);
    if (st.ok()) bw_.sample(ref.length, std::chrono::duration<double>(PClock::now() - t0).count());
    return st;
  }
  double cost(uint64_t bytes) const override { return bw_.seconds_for(bytes); }

 private:
  PeerService& service_;
  const std::string name_ = "peer";
  MeasuredBandwidth bw_{1e9};
};

}  // namespace

Result<std::unique_ptr<PeerService>> PeerService::open(const Options& options, DramTier& dram) {
  auto impl = std::make_unique<Impl>(options, dram);
  CAIRN_RETURN_IF_ERROR(impl->set_faults(std::getenv("CAIRN_PEERS_FAULT")));
  FabricOptions fo;
  fo.provider = options.provider;
  fo.address = options.address;
  auto fabric = Fabric::open(fo);
  if (!fabric.ok()) return fabric.status().with_context("peers: opening the fabric");
  impl->fabric = std::move(fabric).value();
  auto data = Fabric::open(fo);
  if (!data.ok()) return data.status().with_context("peers: opening the fabric's data endpoint");
  impl->data = std::move(data).value();
  CAIRN_RETURN_IF_ERROR(impl->data->register_region(dram.base(), dram.arena_size()));
  auto joined = Membership::join(options.rendezvous, options.job, impl->published_address(), options.timeout);
  if (!joined.ok()) return joined.status().with_context("peers: joining job " + options.job);
  impl->membership = std::move(joined).value();
  impl->self = impl->membership->self().id;
  impl->secret = impl->membership->secret();
  {
    cairn::MutexLock lock(impl->mu);
    impl->ids = {impl->self};
  }
  Impl* raw = impl.get();
  raw->fabric->set_control_handler([raw](std::span<const uint8_t> frame) { raw->on_message(frame); });
  // (The data endpoint carries the hello replies too, which set its connections up early.)
  raw->data->set_control_handler([raw](std::span<const uint8_t> frame) { raw->on_message(frame); });
  std::unique_ptr<PeerService> service(new PeerService(std::move(impl)));
  dram.set_residency_hook([raw](const ChunkHash& h, bool resident) { raw->announce(h, resident); });
  raw->scan();
  // Chunks already resident (none at a normal start) are announced by the scan's re-announcement.
  CAIRN_LOG_INFO("peers: member {} of job {} at {} ({}), rendezvous {}", raw->self, options.job,
                 raw->fabric->address_text(), raw->fabric->provider(), raw->membership->directory());
  return service;
}

void PeerService::start(PeerEvents& events) {
  Impl* raw = impl_.get();
  {
    cairn::MutexLock sl(raw->stage_mu);
    raw->events = &events;
  }
  raw->service = std::thread([raw] { raw->service_loop(); });
  const Options& options = raw->opts;
  if (options.expect > 1) {
    cairn::MutexLock lock(raw->mu);
    auto deadline = PClock::now() + options.timeout;
    raw->cv.wait_until(lock, deadline,
                       [&]() CAIRN_REQUIRES(raw->mu) { return raw->verified_count() + 1 >= options.expect; });
    if (raw->verified_count() + 1 < options.expect)
      CAIRN_LOG_WARN("peers: {} of the {} expected members are there after {} ms; going on", raw->verified_count() + 1,
                     options.expect, options.timeout.count());
  }
}

PeerService::PeerService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PeerService::~PeerService() {
  stop_staging();
  Impl& s = *impl_;
  s.dram.set_residency_hook({});
  {
    cairn::MutexLock lock(s.announce_mu);
    s.stopping = true;
  }
  s.announce_cv.notify_all();
  if (s.service.joinable()) s.service.join();
  std::vector<Impl::Outgoing> out;
  {
    cairn::MutexLock lock(s.mu);
    for (auto& [id, m] : s.members)
      if (m.reachable && m.verified) out.push_back(s.make(id, m.handle, PeerMsg::kBye, json::object()));
  }
  const bool said_goodbye = !out.empty();
  s.send(out);
  if (s.membership) s.membership->leave();
  // A moment for the goodbyes to leave before the endpoint closes.
  if (said_goodbye) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.data.reset();  // bodies first: their completions unpin arena chunks
  s.fabric.reset();
}

std::unique_ptr<ChunkSource> PeerService::source() { return std::make_unique<PeerSource>(*this); }

Status PeerService::fetch(const ChunkRef& ref, void* dst) { return impl_->fetch(ref, dst); }

void PeerService::announce_model(const ModelManifest& model) {
  Impl& s = *impl_;
  const json body{{"model", manifest_to_json(model)}};
  std::vector<Outgoing> out;
  {
    cairn::MutexLock lock(s.mu);
    for (const auto& [id, m] : s.members) {
      if (!m.verified || !m.reachable) continue;
      Outgoing o = s.make(id, m.handle, PeerMsg::kCommit, body);
      if (o.frame.size() > Fabric::kMaxControlBytes) {
        ++s.models_too_large;
        CAIRN_LOG_DEBUG("peers: model '{}' is not announced: its manifest takes {} bytes, more than a message",
                        model.id, o.frame.size());
        return;
      }
      out.push_back(std::move(o));
    }
    if (!out.empty()) ++s.models_announced;
  }
  s.send(out);
}

const std::string& PeerService::self() const { return impl_->self; }

std::vector<std::string> PeerService::verified_members() const {
  const Impl& s = *impl_;
  std::vector<std::string> out;
  cairn::MutexLock lock(s.mu);
  for (const auto& [mid, m] : s.members)
    if (m.verified && m.reachable) out.push_back(mid);
  return out;
}

std::string PeerService::model_home(const std::string& id) const {
  std::vector<std::string> candidates = verified_members();
  candidates.push_back(impl_->self);
  return home_of(hash_bytes(id.data(), id.size()), candidates);
}

Status PeerService::send_part_message(const std::string& member, PeerMsg type, json body) {
  Impl& s = *impl_;
  std::vector<Outgoing> out;
  {
    cairn::MutexLock lock(s.mu);
    auto it = s.members.find(member);
    if (it == s.members.end() || !it->second.verified || !it->second.reachable)
      return unavailable("peer " + member + " is not a verified member of the group (any more)");
    Outgoing o = s.make(member, it->second.handle, type, std::move(body));
    if (o.frame.size() > Fabric::kMaxControlBytes)
      return invalid_argument(std::string("a ") + peer_msg_name(type) + " message of " +
                              std::to_string(o.frame.size()) + " bytes exceeds one peer control message (" +
                              std::to_string(Fabric::kMaxControlBytes) +
                              " bytes): too many tensors or chunks in one part");
    out.push_back(std::move(o));
  }
  Status st = s.fabric->send_control(out[0].handle, out[0].frame);
  if (!st.ok()) return st.with_context(std::string("sending a ") + peer_msg_name(type) + " message to peer " + member);
  return Status::OK();
}

bool PeerService::has_members() const {
  cairn::MutexLock lock(impl_->mu);
  return impl_->verified_count() > 0;
}

json PeerService::status() const {
  const Impl& s = *impl_;
  cairn::MutexLock lock(s.mu);
  json members = json::array();
  members.push_back({{"id", s.self},
                     {"self", true},
                     {"host", s.membership->self().host},
                     {"pid", s.membership->self().pid},
                     {"address", s.fabric->address_text()},
                     {"data_address", s.data->address_text()},
                     {"state", "self"}});
  for (const auto& [id, m] : s.members)
    members.push_back({{"id", id},
                       {"self", false},
                       {"host", m.info.host},
                       {"pid", m.info.pid},
                       {"state", m.verified ? "verified" : (m.reachable ? "greeting" : "unreachable")},
                       {"bytes_sent", m.bytes_sent},
                       {"bytes_received", m.bytes_received},
                       {"chunks_served", m.chunks_served},
                       {"chunks_fetched", m.chunks_fetched},
                       {"refused", m.refused},
                       {"replayed", m.replayed}});
  json out{{"enabled", true},
           {"job", s.opts.job},
           {"rendezvous", s.membership->directory()},
           {"provider", s.fabric->provider()},
           {"self", s.self},
           {"members", members},
           {"directory_entries", s.directory.entries()},
           {"fetched_chunks", s.fetched_chunks},
           {"fetched_bytes", s.fetched_bytes},
           {"served_chunks", s.served_chunks},
           {"served_bytes", s.served_bytes},
           {"stages_served", s.stages_served},
           {"bad_bodies", s.bad_bodies},
           {"loads_assigned", s.loads_assigned},
           {"timeouts", s.peer_timeouts},
           {"abandoned_sends", s.abandoned_sends},
           {"late_bodies_drained", s.late_bodies_drained},
           {"sends_in_flight",
            std::count_if(s.serving.begin(), s.serving.end(), [](const auto& b) { return !b.released->load(); })},
           {"refused_frames", s.refused_frames},
           {"replayed_frames", s.replayed_frames},
           {"misaddressed_frames", s.misaddressed_frames},
           {"malformed_bodies", s.malformed_bodies},
           {"models_announced", s.models_announced},
           {"models_received", s.models_received},
           {"models_too_large", s.models_too_large},
           {"fabric", s.fabric->stats()},
           {"data_fabric", s.data->stats()}};
  if (s.fault_replay || s.fault_forge || s.fault_garbage) out["fault_frames_sent"] = s.fault_frames.load();
  return out;
}

}  // namespace cairn
