// The messages between the daemons of a peer group (docs/peers.md has the table).
//
// A frame (at most Fabric::kMaxControlBytes), wire version 2 (the magic names it):
//   offset 0 "CPW2" | 4 type u8 | 5 flags u8 (0) | 6 reserved u16 (0) | 8 seq u64 LE | 16 from_len u16 LE
//   | 18 to_len u16 LE | 20 body_len u32 LE | 24 from (the sender's member id, 1-64 bytes)
//   | to (the receiver's member id, 1-64 bytes) | body (CBOR of a JSON object) | MAC (32 bytes)
// MAC = HMAC-SHA256(group secret, every byte before it): a daemon that does not hold the group's
// secret cannot make a frame any member accepts. decode checks everything and names what is wrong.
// What the MAC binds beyond the bytes (the receiver checks, peer_messages.cpp): `to` must be the
// receiver's own id (a frame for member B replayed to C is refused), and `seq` must be new in the
// sender's anti-replay window (replay_window.hpp). Member ids are random at every start, so a
// restarted daemon is a new sender and a new receiver. Version 1 ("CPW1": no `to`) is refused.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn {

enum class PeerMsg : uint8_t {
  kHello = 1,    // {nonce}: prove you hold the secret
  kHelloReply,   // {nonce, answer}: answer = HMAC(secret, nonce | replier id | asker id)
  kLookup,       // {req, chunk, length}: to the chunk's home: who holds it?
  kLookupReply,  // {req, verdict: "fetch"|"load"|"wait", holder}: fetch from holder / read the repository yourself
  kHave,         // {chunks: [hex...]}: the sender holds these now (to their homes)
  kDrop,         // {chunks: [hex...]}: the sender no longer holds these
  kGet,          // {req, chunk, length, tag}: send me the chunk's body with this tag
  kGetReply,     // {req, error}: the body will not come (not held any more, ...)
  kFetched,      // {chunk, holder}: a fetch from holder finished (load accounting at the home)
  kLoaded,       // {chunk, ok}: the loader's repository read finished (ok: it holds it now)
  kCommit,       // {model: manifest JSON}: a model committed on the sender (the job's catalog)
  kBye,          // {}: the sender is leaving
  kStage,        // {req, model}: bring this model into your DRAM now (`cairn prefetch --all`)
  kStageReply,   // {req, ok, bytes, seconds, error}: the stage finished (ok) or failed (error)
  // A multi-part model whose parts were committed on several members (group_parts.hpp; the bodies'
  // codecs are in part_messages.hpp):
  kPart,  // {part: manifest JSON of the part's tensors, index, of, timeout_ms, durability}: holder -> the model's home
  kPartState,  // {model, phase, ...}: the home or the registrar -> a holder: how the model is doing
  kAssemble,   // {model: manifest JSON, durability, holders}: the home -> the member that registers it
  kPartAck,    // {model, what: held|local, ok}: a holder -> the registrar: it still holds its parts /
               // they are on its burst buffer
};
constexpr uint8_t kMaxPeerMsg = static_cast<uint8_t>(PeerMsg::kPartAck);
const char* peer_msg_name(PeerMsg type);

struct PeerMessage {
  PeerMsg type = PeerMsg::kHello;
  uint64_t seq = 0;  // per sender, from 1, never reused while its id lives (anti-replay)
  std::string from;  // the sender's member id
  std::string to;    // the receiver's member id
  nlohmann::json body = nlohmann::json::object();
};

constexpr size_t kPeerHeaderBytes = 24;
constexpr size_t kPeerMacBytes = 32;
constexpr size_t kMaxPeerIdBytes = 64;

std::vector<uint8_t> encode_peer_message(const PeerMessage& message, const std::string& secret);
// kProtocol naming the fault: "peer message: 12 bytes, shorter than a header", "bad magic",
// "wire version 1 (this daemon speaks 2)", "unknown type 77", "receiver id of 0 bytes", "lengths exceed the frame",
// "bad MAC (not signed with this group's secret)", "body is not CBOR: ...", "body is not an object".
Result<PeerMessage> decode_peer_message(std::span<const uint8_t> frame, const std::string& secret);

}  // namespace cairn
