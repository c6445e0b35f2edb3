// A connection's state, and what a request answers. Owned by the server (one Session per
// connection) and handed to the engine with each request; the components record in it what the
// connection holds, so that Engine::end_session can release everything when the client goes away.
//
// Thread-safety: one session is used by one thread at a time (the connection's).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/hash.hpp"

namespace cairn {

// A range of the DRAM arena, in bytes from its start.
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct Session {
  uint64_t id = 0;
  int64_t client_pid = 0;  // the connected process (SO_PEERCRED); 0 in-process
  struct Lease {
    std::vector<ChunkHash> pinned_chunks;  // unpinned at release
    std::vector<Extent> owned_extents;     // assembled views, released at release
    std::string named_key;                 // a named tensor's pin ("" = none)
    uint64_t named_generation = 0;
    int hbm_device = -1;  // a device lease: the HBM tier's entry pinned on this device
    ChunkHash hbm_key;
  };
  std::map<uint64_t, Lease> leases;    // reads (daemon/reads.hpp) and named tensors
  std::map<uint64_t, Extent> staging;  // arena space handed out for writes, not yet committed
  std::set<uint64_t> tickets;          // tickets handed out and not yet waited for
  uint64_t next_id = 1;                // lease and staging ids, per connection
};

struct Response {
  nlohmann::json body;
  std::vector<uint8_t> blob;
};

}  // namespace cairn
