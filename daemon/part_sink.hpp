// What the peer group's multi-part assembly (daemon/peers/group_parts.hpp) needs of the commit path:
// the id of a model assembled here reserved and given back, and the assembled model registered as
// one commit. CommitPath implements it; GroupParts knows only this.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.hpp"

namespace cairn {

struct ModelManifest;

class PartSink {
 public:
  virtual ~PartSink() = default;
  // Reserves the id of a model assembled here: kExists when it is a model, or is being committed
  // (also by another daemon of the repository).
  virtual Status reserve_assembly(const std::string& id, const std::string& parent) = 0;
  // Gives a reservation back (the repository's claim stays once the model is pending).
  virtual void release_assembly(const std::string& id) = 0;
  // Registers a model assembled from parts that members of the group hold (their chunks stay where
  // they were written) as one commit with `ticket`, without a local stage here (each holder writes
  // its own parts to its burst buffer). REQUIRES: reserve_assembly(model.id).
  virtual Status register_assembled(const ModelManifest& model, uint64_t ticket) = 0;
};

}  // namespace cairn
