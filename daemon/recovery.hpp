// Recovery at start: what the daemon knew before it stopped is rebuilt from what is durable.
//   load_catalog   — the catalog and the reference counts from the repository's manifests;
//   recover_from_nvme — models a crashed daemon acknowledged `local` are on the burst buffer: each
//                    whose record and chunks pass their checks is registered again and queued for
//                    the repository; the others are reported lost (never half-registered).
// Runs once, while the engine is opened (engine_open.cpp), before any request is served.
#pragma once

#include "core/status.hpp"
#include "daemon/admin.hpp"
#include "daemon/catalog.hpp"
#include "daemon/commit_clock.hpp"
#include "daemon/flusher.hpp"
#include "daemon/models.hpp"
#include "daemon/references.hpp"
#include "tiers/nvme/nvme_tier.hpp"
#include "tiers/pfs/repository.hpp"

namespace cairn {

struct RecoveryParts {
  Repository& repo;
  Catalog& catalog;
  ReferenceCounts& references;
  Flusher& flusher;
  CommitClock& clock;  // told the stamp of every model found
  const ModelDirectory& models;
  NvmeTier* nvme;  // null without a burst buffer
};

// Fills the catalog from the repository. Fails with the first manifest that cannot be registered.
Status load_catalog(const RecoveryParts& parts);
// Registers and queues what the burst buffer holds of models committed `local` (nothing without a
// burst buffer).
RecoveryReport recover_from_nvme(const RecoveryParts& parts);

}  // namespace cairn
