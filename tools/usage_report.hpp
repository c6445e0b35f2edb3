// What `cairn stats` and `cairn du` print: the daemon's replies as text for a terminal (the tool
// prints the replies themselves with --json).
#pragma once

#include <nlohmann/json.hpp>

namespace cairn::tool {

// The tiers (capacity, use, hits, bytes moved), the repository (logical, deduplicated and stored
// bytes, chunks by coding), what is not yet in the repository, and the near-data worker: from the
// daemon's `stats` reply.
void print_stats(const nlohmann::json& stats);

// One line per model: logical and stored bytes, what it added over its ancestors, what it and its
// ancestors take, its chunks by coding. rows: [{"id", "logical_bytes", "storage"?}] (storage as
// `show` gives it; absent while the model is not in the repository yet).
void print_du(const nlohmann::json& rows);

}  // namespace cairn::tool
