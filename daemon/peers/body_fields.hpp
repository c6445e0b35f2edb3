// Internal to daemon/peers/: the field checker the peer messages' body decoders share
// (part_messages.cpp, peer_bodies.cpp). A body comes from a member holding the group's secret, but
// that member may run another release or be buggy: every accessor checks the field's type and
// range and returns kProtocol "peer message <type>: <field>: <what is wrong>"; none throws.
#pragma once

#include <cmath>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"
#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "daemon/tickets.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

inline constexpr size_t kMaxMemberIdBytes = kMaxPeerIdBytes;  // as the frame's sender
inline constexpr size_t kMaxErrorBytes = 4096;

// Checks one body: an object whose fields are all among `known` and include `required`.
// REQUIRES: at(f) and the typed accessors only for fields that fields() found (or has() says are there).
class Body {
 public:
  using json = nlohmann::json;
  Body(const char* message, const json& j) : message_(message), j_(j) {}

  Status fault(const std::string& what) const {
    return protocol_error(std::string("peer message ") + message_ + ": " + what);
  }

  Status fields(std::initializer_list<const char*> required, std::initializer_list<const char*> optional = {}) const {
    if (!j_.is_object()) return fault(std::string("body is not an object (a ") + j_.type_name() + ")");
    std::set<std::string> known;
    for (const char* f : required) {
      if (!j_.contains(f)) return fault(std::string("missing field '") + f + "'");
      known.insert(f);
    }
    for (const char* f : optional) known.insert(f);
    for (const auto& [k, v] : j_.items())
      if (!known.count(k)) return fault("unknown field '" + k + "' (a cairnd of another release?)");
    return Status::OK();
  }
  const json& at(const char* f) const { return j_.at(f); }
  bool has(const char* f) const { return j_.contains(f); }

  Result<uint64_t> u64(const char* f, uint64_t lo = 0, uint64_t hi = UINT64_MAX) const {
    const json& v = j_.at(f);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      return fault(std::string(f) + ": expected a non-negative integer, got a " + v.type_name());
    const uint64_t x = v.get<uint64_t>();
    if (x < lo || x > hi)
      return fault(std::string(f) + ": " + std::to_string(x) + " is not in " + std::to_string(lo) + ".." +
                   std::to_string(hi));
    return x;
  }
  Result<bool> boolean(const char* f) const {
    const json& v = j_.at(f);
    if (!v.is_boolean()) return fault(std::string(f) + ": expected true or false, got a " + v.type_name());
    return v.get<bool>();
  }
  // A finite number >= 0 (seconds).
  Result<double> seconds(const char* f) const {
    const json& v = j_.at(f);
    if (!v.is_number()) return fault(std::string(f) + ": expected a number of seconds, got a " + v.type_name());
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0) return fault(std::string(f) + ": not a number of seconds >= 0");
    return x;
  }
  // A string of at most max bytes (at least 1 when nonempty).
  Result<std::string> text(const char* f, size_t max, bool nonempty = false) const {
    const json& v = j_.at(f);
    if (!v.is_string()) return fault(std::string(f) + ": expected a string, got a " + v.type_name());
    std::string s = v.get<std::string>();
    if (s.size() > max || (nonempty && s.empty()))
      return fault(std::string(f) + ": a string of " + std::to_string(s.size()) + " bytes (must be " +
                   (nonempty ? "1" : "0") + ".." + std::to_string(max) + ")");
    return s;
  }
  // Hex text of exactly `bytes` raw bytes (0: any length up to max_bytes), returned raw.
  Result<std::string> hex_bytes(const char* f, size_t bytes, size_t max_bytes = 0) const {
    const json& v = j_.at(f);
    std::string raw;
    if (!v.is_string() || !from_hex(v.get<std::string>(), raw)) return fault(std::string(f) + ": expected hex digits");
    if (bytes ? raw.size() != bytes : raw.size() > max_bytes)
      return fault(std::string(f) + ": " + std::to_string(raw.size()) + " bytes (must be " +
                   std::to_string(bytes ? bytes : max_bytes) + (bytes ? ")" : " at most)"));
    return raw;
  }
  Result<ChunkHash> chunk(const json& v, const std::string& what) const {
    std::optional<ChunkHash> h;
    if (v.is_string()) h = ChunkHash::from_hex(v.get<std::string>());
    if (!h) return fault(what + ": expected a chunk hash (32 hex digits)");
    return *h;
  }
  Result<ChunkHash> chunk(const char* f) const { return chunk(j_.at(f), f); }
  Result<std::string> name(const char* f) const {
    const json& v = j_.at(f);
    if (!v.is_string()) return fault(std::string(f) + ": expected a model id (a string), got a " + v.type_name());
    std::string s = v.get<std::string>();
    if (!valid_name(s)) return fault(std::string(f) + ": not a valid model id");
    return s;
  }
  Result<std::string> member(const json& v, const std::string& what) const {
    if (!v.is_string()) return fault(what + ": expected a member id (a string), got a " + v.type_name());
    std::string s = v.get<std::string>();
    if (s.empty() || s.size() > kMaxMemberIdBytes || s.find('\0') != std::string::npos)
      return fault(what + ": a member id has 1 to " + std::to_string(kMaxMemberIdBytes) + " bytes");
    return s;
  }
  Result<std::string> member(const char* f) const { return member(j_.at(f), f); }
  Result<Durability> durability(const char* f) const {
    const json& v = j_.at(f);
    std::optional<Durability> d;
    if (v.is_string()) d = durability_from_name(v.get<std::string>());
    if (!d) return fault(std::string(f) + ": expected \"memory\", \"local\" or \"global\"");
    return *d;
  }
  Result<ModelManifest> manifest(const char* f) const {
    auto m = manifest_from_json(j_.at(f), /*with_locations=*/false);
    if (!m.ok()) return fault(std::string(f) + ": " + m.status().message());
    return std::move(m).value();
  }

 private:
  const char* message_;
  const json& j_;
};

}  // namespace cairn
