// The bodies of the multi-part messages between members (part_messages.hpp).
#include "daemon/peers/part_messages.hpp"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <set>

#include "core/dtype.hpp"
#include "daemon/peers/body_fields.hpp"

namespace cairn {

using json = nlohmann::json;

namespace {

const char* kPhases[] = {"delegated", "check", "memory", "local", "global", "failed"};

}  // namespace

const char* part_phase_name(PartPhase phase) {
  const auto i = static_cast<size_t>(phase);
  return i < std::size(kPhases) ? kPhases[i] : "unknown";
}

bool is_part_message(PeerMsg type) {
  return type == PeerMsg::kPart || type == PeerMsg::kPartState || type == PeerMsg::kAssemble ||
         type == PeerMsg::kPartAck;
}

// ---- part ----

json encode_part(const PartMessage& m) {
  return json{{"part", manifest_to_json(m.part)},
              {"index", m.index},
              {"of", m.of},
              {"timeout_ms", m.timeout_ms},
              {"durability", durability_name(m.durability)}};
}

Result<PartMessage> decode_part(const json& j) {
  Body b("part", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"part", "index", "of", "timeout_ms", "durability"}));
  PartMessage m;
  CAIRN_ASSIGN_OR_RETURN(m.part, b.manifest("part"));
  CAIRN_ASSIGN_OR_RETURN(uint64_t of, b.u64("of", 2, kMaxModelParts));
  CAIRN_ASSIGN_OR_RETURN(uint64_t index, b.u64("index", 0, kMaxModelParts));
  if (index >= of) return b.fault("index: " + std::to_string(index) + " is not below of (" + std::to_string(of) + ")");
  m.of = static_cast<uint32_t>(of);
  m.index = static_cast<uint32_t>(index);
  CAIRN_ASSIGN_OR_RETURN(m.timeout_ms, b.u64("timeout_ms", 1, kMaxPartTimeoutMs));
  CAIRN_ASSIGN_OR_RETURN(m.durability, b.durability("durability"));
  return m;
}

// ---- part_state ----

json encode_part_state(const PartStateMessage& m) {
  json j{{"model", m.model}, {"phase", part_phase_name(m.phase)}};
  if (m.phase == PartPhase::kDelegated) j["registrar"] = m.registrar;
  if (m.phase == PartPhase::kMemory) j["durability"] = durability_name(m.target);
  if (m.phase == PartPhase::kFailed) {
    j["code"] = static_cast<int>(m.error.code());
    j["error"] = m.error.message();
    if (!m.parts.empty()) j["parts"] = m.parts;
  }
  return j;
}

Result<PartStateMessage> decode_part_state(const json& j) {
  Body b("part_state", j);
  if (!j.is_object() || !j.contains("phase") || !j["phase"].is_string())
    return b.fault("expected an object with a string field 'phase'");
  PartStateMessage m;
  const std::string phase = j["phase"].get<std::string>();
  size_t p = 0;
  while (p < std::size(kPhases) && phase != kPhases[p]) ++p;
  if (p == std::size(kPhases))
    return b.fault("phase: '" + phase.substr(0, 64) +
                   "' is not one of delegated, check, memory, local, global, failed");
  m.phase = static_cast<PartPhase>(p);
  switch (m.phase) {
    case PartPhase::kDelegated:
      CAIRN_RETURN_IF_ERROR(b.fields({"model", "phase", "registrar"}));
      break;
    case PartPhase::kMemory:
      CAIRN_RETURN_IF_ERROR(b.fields({"model", "phase", "durability"}));
      break;
    case PartPhase::kFailed:
      CAIRN_RETURN_IF_ERROR(b.fields({"model", "phase", "code", "error"}, {"parts"}));
      break;
    default:
      CAIRN_RETURN_IF_ERROR(b.fields({"model", "phase"}));
      break;
  }
  CAIRN_ASSIGN_OR_RETURN(m.model, b.name("model"));
  if (m.phase == PartPhase::kDelegated) {
    CAIRN_ASSIGN_OR_RETURN(m.registrar, b.member(j["registrar"], "registrar"));
  }
  if (m.phase == PartPhase::kMemory) {
    CAIRN_ASSIGN_OR_RETURN(m.target, b.durability("durability"));
  }
  if (m.phase == PartPhase::kFailed) {
    CAIRN_ASSIGN_OR_RETURN(uint64_t code, b.u64("code", 1, 1000));
    const StatusCode c = status_code_from_int(static_cast<int>(code));
    if (static_cast<uint64_t>(c) != code) return b.fault("code: " + std::to_string(code) + " is not a status code");
    const json& e = j["error"];
    if (!e.is_string() || e.get<std::string>().empty() || e.get<std::string>().size() > kMaxErrorBytes)
      return b.fault("error: expected a message of 1 to " + std::to_string(kMaxErrorBytes) + " bytes");
    m.error = Status(c, e.get<std::string>());
    if (j.contains("parts")) {
      const json& ps = j["parts"];
      if (!ps.is_array() || ps.empty() || ps.size() > kMaxModelParts)
        return b.fault("parts: expected 1 to " + std::to_string(kMaxModelParts) + " part indices");
      for (const json& i : ps) {
        if (!i.is_number_unsigned() || i.get<uint64_t>() >= kMaxModelParts)
          return b.fault("parts: each entry is a part index below " + std::to_string(kMaxModelParts));
        m.parts.push_back(i.get<uint32_t>());
      }
    }
  }
  return m;
}

// ---- assemble ----

std::vector<std::string> AssembleMessage::holders() const {
  std::vector<std::string> out;
  for (const std::string& h : part_holders)
    if (std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  return out;
}

json encode_assemble(const AssembleMessage& m) {
  return json{{"model", manifest_to_json(m.model)},
              {"durability", durability_name(m.durability)},
              {"part_holders", m.part_holders}};
}

Result<AssembleMessage> decode_assemble(const json& j) {
  Body b("assemble", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"model", "durability", "part_holders"}));
  AssembleMessage m;
  CAIRN_ASSIGN_OR_RETURN(m.model, b.manifest("model"));
  CAIRN_ASSIGN_OR_RETURN(m.durability, b.durability("durability"));
  const json& hs = j["part_holders"];
  if (!hs.is_array() || hs.size() < 2 || hs.size() > kMaxModelParts)
    return b.fault("part_holders: expected 2 to " + std::to_string(kMaxModelParts) + " member ids, one per part");
  for (size_t i = 0; i < hs.size(); ++i) {
    CAIRN_ASSIGN_OR_RETURN(std::string h, b.member(hs[i], "part_holders[" + std::to_string(i) + "]"));
    m.part_holders.push_back(std::move(h));
  }
  return m;
}

// ---- part_ack ----

json encode_part_ack(const PartAckMessage& m) {
  return json{{"model", m.model}, {"what", m.what == AckOf::kHeld ? "held" : "local"}, {"ok", m.ok}};
}

Result<PartAckMessage> decode_part_ack(const json& j) {
  Body b("part_ack", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"model", "what", "ok"}));
  PartAckMessage m;
  CAIRN_ASSIGN_OR_RETURN(m.model, b.name("model"));
  const json& w = j["what"];
  if (w == "held")
    m.what = AckOf::kHeld;
  else if (w == "local")
    m.what = AckOf::kLocal;
  else
    return b.fault("what: expected \"held\" or \"local\"");
  if (!j["ok"].is_boolean()) return b.fault("ok: expected true or false");
  m.ok = j["ok"].get<bool>();
  return m;
}

// ---- for the fuzzer ----

namespace {

template <class Decode, class Encode>
Status round_trip(const json& body, Decode decode, Encode encode) {
  auto first = decode(body);
  if (!first.ok()) return first.status();
  const json again = encode(*first);
  auto second = decode(again);
  if (!second.ok()) return internal_error("a decoded part message does not decode again: " + second.status().message());
  // Compared by encoding (a NaN in metadata is not == itself).
  if (json::to_cbor(encode(*second)) != json::to_cbor(again))
    return internal_error("a part message changed in a round trip");
  return Status::OK();
}

}  // namespace

Status check_part_body(PeerMsg type, const json& body) {
  try {
    switch (type) {
      case PeerMsg::kPart:
        return round_trip(body, decode_part, encode_part);
      case PeerMsg::kPartState:
        return round_trip(body, decode_part_state, encode_part_state);
      case PeerMsg::kAssemble:
        return round_trip(body, decode_assemble, encode_assemble);
      case PeerMsg::kPartAck:
        return round_trip(body, decode_part_ack, encode_part_ack);
      default:
        return Status::OK();
    }
  } catch (const std::exception& e) {
    return internal_error(std::string("a part message decoder threw: ") + e.what());
  }
}

}  // namespace cairn
