// The peer service's test hooks (CAIRN_PEERS_FAULT, docs/peers.md "Test hooks"): a member that
// misbehaves on purpose, so that tests can check the others refuse what it sends. Never set in
// production; each hook set is logged as a warning at start.
#include <cstring>
#include <string_view>

#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_service_impl.hpp"

namespace cairn {

using Outgoing = PeerService::Impl::Outgoing;

namespace {
constexpr size_t kReplayRing = 32;  // the frames a replaying member keeps to send again
}  // namespace

Status PeerService::Impl::set_faults(const char* spec) {
  if (!spec) return Status::OK();
  std::string_view rest(spec);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view hook = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (hook.empty()) continue;
    if (hook == "corrupt_bodies")
      corrupt_bodies = true;
    else if (hook == "replay")
      fault_replay = true;
    else if (hook == "forge")
      fault_forge = true;
    else if (hook == "garbage_bodies")
      fault_garbage = true;
    else if (hook == "late_bodies")
      fault_late_bodies = true;
    else if (hook == "no_drain")
      fault_no_drain = true;
    else
      return invalid_argument("CAIRN_PEERS_FAULT: unknown hook '" + std::string(hook) +
                              "' (corrupt_bodies, replay, forge, garbage_bodies, late_bodies, no_drain; tests only)");
    CAIRN_LOG_WARN("peers: CAIRN_PEERS_FAULT={}: {} (tests only)", hook,
                   hook == "corrupt_bodies" ? "every chunk this member sends is corrupted"
                   : hook == "replay"       ? "this member resends earlier frames verbatim, also to other members"
                   : hook == "forge"        ? "this member sends forged copies of its frames"
                   : hook == "late_bodies"  ? "this member sends each chunk 1.5 peer timeouts late"
                   : hook == "no_drain"     ? "this member never takes a chunk that comes after it gave up"
                                            : "this member sends signed frames with bodies no member can read, "
                                              "and random bytes");
  }
  return Status::OK();
}

void PeerService::Impl::send_faults(const Outgoing& o) {
  std::vector<Outgoing> extra;
  if (fault_forge && o.frame.size() > kPeerHeaderBytes + kPeerMacBytes) {
    const size_t signed_len = o.frame.size() - kPeerMacBytes;
    Outgoing altered = o;  // the last byte of the body changed after signing
    altered.frame[signed_len - 1] ^= 0x01;
    extra.push_back(std::move(altered));
    Outgoing other = o;  // signed with a secret that is not the group's
    const std::string mac = hmac_sha256(secret + "-not-the-group's", other.frame.data(), signed_len);
    std::memcpy(other.frame.data() + signed_len, mac.data(), kPeerMacBytes);
    extra.push_back(std::move(other));
  }
  if (fault_garbage && o.frame.size() > 4) {
    // The same type, properly signed and numbered, every field of the wrong kind.
    const auto type = static_cast<PeerMsg>(o.frame[4]);
    Outgoing junk = make(o.to, o.handle, type,
                         nlohmann::json{{"req", "not a number"},
                                        {"chunk", 42},
                                        {"nonce", nlohmann::json::array()},
                                        {"model", nlohmann::json::object()},
                                        {"garbage", true}});
    junk.via_data = o.via_data;
    extra.push_back(std::move(junk));
    // And random bytes of a random length, up to the largest control message: not a frame at all.
    const std::string noise = random_bytes(1 + static_cast<uint8_t>(random_bytes(1)[0]) * 256);
    Outgoing raw = o;
    raw.frame.assign(noise.begin(), noise.end());
    extra.push_back(std::move(raw));
  }
  if (fault_replay) {
    cairn::MutexLock fl(fault_mu);
    if (!fault_sent.empty()) {
      const Outgoing& old = fault_sent[fault_frames.load() % fault_sent.size()];
      extra.push_back(old);  // to the member it was for: seen before
      if (old.to != o.to) {  // to another member: addressed to someone else
        Outgoing moved = old;
        moved.to = o.to;
        moved.handle = o.handle;
        moved.via_data = o.via_data;
        extra.push_back(std::move(moved));
      }
    }
    if (fault_sent.size() < kReplayRing)
      fault_sent.push_back(o);
    else
      fault_sent[fault_frames.load() % kReplayRing] = o;
  }
  for (const Outgoing& e : extra) {
    ++fault_frames;
    send_one(e);
  }
}

}  // namespace cairn
