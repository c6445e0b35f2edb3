// Fault injection in a running daemon (docs/config.md, "Fault injection"): with
// debug.fault_injection on, the engine gives the repository and the burst buffer one
// FaultyFileSystem over the real filesystem, and the `fault` request (`cairn fault add|list|clear`)
// adds, lists and clears its rules, so a test harness injects ENOSPC, EIO, torn, dropped or
// bit-flipped writes, flipped reads and delays at the moments it chooses.
//
// Owns: nothing; the engine owns the FaultyFileSystem. Off (fs null): every request is refused,
// naming how to turn it on.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>

#include "core/fs.hpp"
#include "core/status.hpp"
#include "daemon/request.hpp"

namespace cairn {

inline constexpr size_t kMaxFaultRules = 1024;
inline constexpr uint32_t kMaxFaultDelayMs = 600000;

// A rule from its JSON form: {op, path?, effect?, error?, skip?, times?, delay_ms?} (protocol.md,
// "Fault injection"). Unknown fields, wrong types, names not in the lists, out-of-range counts and
// effects that mean nothing for the op are refused with a message that starts with "fault: " and
// names the field.
Result<FaultyFileSystem::Rule> parse_fault_rule(const nlohmann::json& rule);
// The JSON form of a rule as it stands (what `list` returns).
nlohmann::json fault_rule_json(const FaultyFileSystem::RuleState& state);

class FaultInjection {
 public:
  // fs: the injector under the tiers, or null when fault injection is off.
  explicit FaultInjection(FaultyFileSystem* fs) : fs_(fs) {}

  // kUnavailable, naming how to turn it on, when fault injection is off; the engine asks before it
  // decodes a `fault` request, so that a daemon without it answers every one the same.
  Status available() const;
  // The `fault` request: adds the rule, lists or clears them (kUnavailable when off).
  Result<nlohmann::json> handle(const request::Fault& req);
  bool enabled() const { return fs_ != nullptr; }

 private:
  FaultyFileSystem* fs_;
};

}  // namespace cairn
