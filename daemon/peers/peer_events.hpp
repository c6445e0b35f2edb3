// What the peer service (peer_service.hpp) tells the daemon about the group: the models other
// members commit (the job's catalog), members that leave, multi-part model messages, and requests
// to stage a model (`cairn prefetch --all` on another member). cairnd's implementation routes each
// event to the component that owns it (engine_open.cpp): the PeerCatalog, GroupParts, Reads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

class PeerEvents {
 public:
  virtual ~PeerEvents() = default;
  // A model `member` committed and announced. On the service thread, in the order that member
  // committed them.
  virtual void model_announced(ModelManifest model, const std::string& member) = 0;
  // A message about a multi-part model assembled across the group (part, part_state, assemble,
  // part_local: group_parts.hpp), its body as it came. On the service thread, after the models
  // announced before it and before a member_left that follows it.
  virtual void part_message(PeerMsg type, nlohmann::json body, const std::string& member) = 0;
  // `member` left the group (goodbye, or silent for peers.timeout): its unflushed models are gone.
  // On the service thread.
  virtual void member_left(const std::string& member) = 0;
  // Another member's `cairn prefetch --all`: brings the model into this daemon's DRAM; the bytes
  // of the model now resident. On a thread of its own per request; may block for long.
  virtual Result<uint64_t> stage(const std::string& model) = 0;
};

}  // namespace cairn
