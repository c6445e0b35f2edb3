// What the multi-part models of a peer group (group_parts.hpp) need of the group: who this member
// is, who else is there, which member is a model's home, and a way to send them part messages.
// cairnd's is PeerPartTransport (peer_service.hpp), over the PeerService.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "daemon/peers/peer_wire.hpp"

namespace cairn {

// Thread-safety: every method may be called from any thread.
class PartTransport {
 public:
  virtual ~PartTransport() = default;
  // Another verified member is there: a writer's parts go through the group.
  virtual bool active() const = 0;
  // This member's id in the group.
  virtual std::string self() const = 0;
  // The member that assembles the multi-part model `model` (PeerService::model_home).
  virtual std::string home(const std::string& model) const = 0;
  // Sends a part message (is_part_message) to a verified member. kUnavailable when it is not one.
  virtual Status send(const std::string& member, PeerMsg type, nlohmann::json body) = 0;
  // The verified members, this one not included.
  virtual std::vector<std::string> members() const = 0;
};

}  // namespace cairn
