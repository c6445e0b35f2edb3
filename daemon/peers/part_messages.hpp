// The bodies of the peer messages about a multi-part model whose parts were committed on several
// members of a peer group (group_parts.hpp; docs/peers.md, "Parts on several members"): a typed
// form of each, its encoder and a strict decoder.
//
// The frame around a body was checked already (peer_wire.hpp: only a member of the job can make
// one), but a member may run another release or be buggy: each decoder checks every field and
// returns kProtocol naming the message and the field ("peer message part: index: 7 is not below
// of (4)"). Decoders never throw, whatever the JSON holds (tests/fuzz/fuzz_peer_wire.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "daemon/tickets.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

// Limits a part must keep (the same as one daemon's: commit_parts.cpp).
inline constexpr uint32_t kMaxModelParts = 65536;
inline constexpr uint64_t kMaxPartTimeoutMs = 24ull * 3600 * 1000;

// part: a holder -> the model's home. One part as the holder placed and hashed it.
struct PartMessage {
  // id, parent, metadata, architecture (null when the part gave none) and the part's tensors with
  // their chunks' hashes and lengths (no repository locations).
  ModelManifest part;
  uint32_t index = 0;
  uint32_t of = 0;
  uint64_t timeout_ms = 0;
  Durability durability = Durability::kGlobal;  // what this part's writer asked for
};

// part_state: what a holder hears about a model it holds parts of.
enum class PartPhase : uint8_t {
  kDelegated,  // the home handed the model to `registrar`, which registers it (from the home)
  kCheck,      // do you still hold your parts? (from the registrar, before it registers the model)
  kMemory,     // registered by the sender and visible in the group (from the registrar)
  kLocal,      // every part is on its holder's burst buffer (from the registrar)
  kGlobal,     // in the repository (from the registrar)
  kFailed,     // not created, or lost: `error` says why (from either)
};
const char* part_phase_name(PartPhase phase);

struct PartStateMessage {
  std::string model;
  PartPhase phase = PartPhase::kFailed;
  std::string registrar;                    // kDelegated: the member that registers the model
  Durability target = Durability::kMemory;  // kMemory: the model's (the weakest part's)
  std::vector<uint32_t> parts;              // kFailed: only these parts failed (empty: every part the holder has)
  Status error;                             // kFailed: not OK
};

// assemble: the home -> the member that registers the model (the holder of the most bytes).
struct AssembleMessage {
  ModelManifest model;                          // the whole manifest, tensors in part order
  Durability durability = Durability::kGlobal;  // the weakest any part asked for
  std::vector<std::string> part_holders;        // the member holding each part, by index (2 or more)
  // The distinct members of part_holders, in order of first appearance.
  std::vector<std::string> holders() const;
};

// part_ack: a holder -> the registrar.
enum class AckOf : uint8_t {
  kHeld,   // (to kCheck) ok: it still holds its parts of the model
  kLocal,  // (after kMemory) ok: its parts are on its burst buffer; false: it has none, or the write failed
};
struct PartAckMessage {
  std::string model;
  AckOf what = AckOf::kHeld;
  bool ok = false;
};

nlohmann::json encode_part(const PartMessage& m);
nlohmann::json encode_part_state(const PartStateMessage& m);
nlohmann::json encode_assemble(const AssembleMessage& m);
nlohmann::json encode_part_ack(const PartAckMessage& m);

Result<PartMessage> decode_part(const nlohmann::json& body);
Result<PartStateMessage> decode_part_state(const nlohmann::json& body);
Result<AssembleMessage> decode_assemble(const nlohmann::json& body);
Result<PartAckMessage> decode_part_ack(const nlohmann::json& body);

// Whether type is one of the four above.
bool is_part_message(PeerMsg type);
// Decodes a body of one of the four types, re-encodes what it got and checks that the encoding
// decodes to the same (what the fuzzer runs on every frame it gets through). OK for other types;
// the decoder's kProtocol error when the body is bad; kInternal when the round trip differs.
Status check_part_body(PeerMsg type, const nlohmann::json& body);

}  // namespace cairn
