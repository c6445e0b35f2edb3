#include "core/durability.hpp"

namespace cairn {

const char* durability_name(Durability d) {
  switch (d) {
    case Durability::kMemory:
      return "memory";
    case Durability::kLocal:
      return "local";
    case Durability::kGlobal:
      return "global";
  }
  return "global";
}

std::optional<Durability> durability_from_name(std::string_view name) {
  if (name == "memory") return Durability::kMemory;
  if (name == "local") return Durability::kLocal;
  if (name == "global") return Durability::kGlobal;
  return std::nullopt;
}

}  // namespace cairn
