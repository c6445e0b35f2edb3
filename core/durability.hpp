// Durability levels and their one name table. A commit asks for a level and its ticket reports the
// level reached: memory (in the node's arena), local (synced on the node's NVMe burst buffer: it
// survives kill -9 of the daemon), global (in the shared repository). The levels are ordered; the names are those
// of the wire protocol, the config, the tools and every API (cairn.h's cairn_durability has the same
// values in the same order).
#pragma once

#include <optional>
#include <string_view>

namespace cairn {

enum class Durability : int { kMemory = 0, kLocal = 1, kGlobal = 2 };

// "memory", "local" or "global".
const char* durability_name(Durability d);
// The level named `name`; nullopt for anything but the three names.
std::optional<Durability> durability_from_name(std::string_view name);

}  // namespace cairn
