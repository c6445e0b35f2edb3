#include "daemon/fault_injection.hpp"

#include <limits>
#include <string_view>

#include "core/log.hpp"

namespace cairn {

using nlohmann::json;
using Faulty = FaultyFileSystem;

namespace {

constexpr size_t kMaxPathBytes = 4096;
constexpr int64_t kMaxCount = std::numeric_limits<int>::max();

template <class T>
std::string list_names(std::span<const Faulty::Named<T>> names) {
  std::string out;
  for (const auto& n : names) out += std::string(out.empty() ? "" : ", ") + n.name;
  return out;
}

template <class T>
const char* name_of(std::span<const Faulty::Named<T>> names, T value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}

// The value of a required or optional name field; the error names the field and the valid names.
template <class T>
Result<T> name_field(const json& rule, const char* field, std::span<const Faulty::Named<T>> names,
                     std::optional<T> dflt) {
  auto it = rule.find(field);
  if (it == rule.end()) {
    if (dflt) return *dflt;
    return invalid_argument(std::string("fault: field 'rule.") + field + "' is missing (one of " + list_names(names) +
                            ")");
  }
  if (it->is_string())
    for (const auto& n : names)
      if (*it == n.name) return n.value;
  return invalid_argument(std::string("fault: field 'rule.") + field + "': " + it->dump(-1, ' ', true).substr(0, 64) +
                          " is not one of " + list_names(names));
}

// An optional integer field within [lo, hi].
Result<int64_t> int_field(const json& rule, const char* field, int64_t dflt, int64_t lo, int64_t hi) {
  auto it = rule.find(field);
  if (it == rule.end()) return dflt;
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) ||
      it->get<int64_t>() < lo || it->get<int64_t>() > hi)
    return invalid_argument(std::string("fault: field 'rule.") + field + "' must be an integer from " +
                            std::to_string(lo) + " to " + std::to_string(hi));
  return it->get<int64_t>();
}

}  // namespace

Result<Faulty::Rule> parse_fault_rule(const json& rule) {
  if (!rule.is_object()) return invalid_argument("fault: field 'rule' must be an object {op, path, effect, ...}");
  static constexpr std::string_view kFields[] = {"op", "path", "effect", "error", "skip", "times", "delay_ms"};
  for (const auto& [key, value] : rule.items()) {
    bool known = false;
    for (auto f : kFields) known = known || key == f;
    if (!known)
      return invalid_argument("fault: field 'rule." + key.substr(0, 64) +
                              "' is not a rule field (op, path, effect, error, skip, times, delay_ms)");
  }
  Faulty::Rule r;
  CAIRN_ASSIGN_OR_RETURN(r.op, name_field<Faulty::Op>(rule, "op", Faulty::op_names(), std::nullopt));
  CAIRN_ASSIGN_OR_RETURN(r.effect,
                         name_field<Faulty::Effect>(rule, "effect", Faulty::effect_names(), Faulty::Effect::kFail));
  CAIRN_ASSIGN_OR_RETURN(r.err, name_field<int>(rule, "error", Faulty::error_names(), EIO));
  if (auto p = rule.find("path"); p != rule.end()) {
    if (!p->is_string()) return invalid_argument("fault: field 'rule.path' must be a string (a part of a file path)");
    r.path_contains = p->get<std::string>();
    if (r.path_contains.size() > kMaxPathBytes || r.path_contains.find('\0') != std::string::npos)
      return invalid_argument("fault: field 'rule.path' must be at most 4096 bytes without NUL");
  }
  CAIRN_ASSIGN_OR_RETURN(int64_t skip, int_field(rule, "skip", 0, 0, kMaxCount));
  CAIRN_ASSIGN_OR_RETURN(int64_t times, int_field(rule, "times", 1, -1, kMaxCount));
  if (times == 0) return invalid_argument("fault: field 'rule.times' must be -1 (forever) or at least 1");
  CAIRN_ASSIGN_OR_RETURN(int64_t delay, int_field(rule, "delay_ms", 0, 0, kMaxFaultDelayMs));
  r.skip = static_cast<int>(skip);
  r.times = static_cast<int>(times);
  r.delay_ms = static_cast<uint32_t>(delay);
  const bool write = r.op == Faulty::Op::kWrite;
  switch (r.effect) {
    case Faulty::Effect::kShortWrite:
    case Faulty::Effect::kDropWrite:
      if (!write) return invalid_argument("fault: field 'rule.effect': short_write and drop_write need op 'write'");
      break;
    case Faulty::Effect::kFlipBit:
      if (!write && r.op != Faulty::Op::kRead)
        return invalid_argument("fault: field 'rule.effect': flip_bit needs op 'read' or 'write'");
      break;
    case Faulty::Effect::kDelay:
      if (delay == 0)
        return invalid_argument("fault: field 'rule.delay_ms' must be given (1 to 600000) with effect 'delay'");
      break;
    case Faulty::Effect::kFail:
      break;
  }
  if (r.effect != Faulty::Effect::kDelay && delay != 0)
    return invalid_argument("fault: field 'rule.delay_ms' is only for effect 'delay'");
  return r;
}

json fault_rule_json(const Faulty::RuleState& s) {
  const Faulty::Rule& r = s.rule;
  json j{{"op", name_of(Faulty::op_names(), r.op)},
         {"path", r.path_contains},
         {"effect", name_of(Faulty::effect_names(), r.effect)},
         {"error", name_of(Faulty::error_names(), r.err)},
         {"skip", r.skip},
         {"times", r.times},
         {"injected", s.injected}};
  if (r.effect == Faulty::Effect::kDelay) j["delay_ms"] = r.delay_ms;
  return j;
}

Status FaultInjection::available() const {
  if (fs_ == nullptr)
    return unavailable(
        "fault: fault injection is off in this cairnd; restart it with debug.fault_injection: true in its config "
        "(or CAIRN_DEBUG_FAULT_INJECTION=1 in its environment) to use it (test daemons only)");
  return Status::OK();
}

Result<json> FaultInjection::handle(const request::Fault& req) {
  CAIRN_RETURN_IF_ERROR(available());
  using Action = request::Fault::Action;
  auto rules_json = [&] {
    json rules = json::array();
    for (const auto& s : fs_->rules()) rules.push_back(fault_rule_json(s));
    return rules;
  };
  switch (req.action) {
    case Action::kList:
      return json{{"rules", rules_json()}, {"injected", fs_->injected()}};
    case Action::kClear: {
      const size_t n = fs_->rules().size();
      fs_->clear();
      CAIRN_LOG_WARN("fault injection: {} rules cleared", n);
      return json{{"cleared", n}, {"injected", fs_->injected()}};
    }
    case Action::kAdd:
      break;
  }
  if (!req.rule) return invalid_argument("fault: field 'rule' is missing (an object {op, path, effect, ...})");
  if (fs_->rules().size() >= kMaxFaultRules)
    return invalid_argument("fault: already " + std::to_string(kMaxFaultRules) + " rules; `cairn fault clear` first");
  json added = fault_rule_json(Faulty::RuleState{*req.rule, 0});
  fs_->add(*req.rule);
  CAIRN_LOG_WARN("fault injection: rule added: {}", added.dump());
  return json{{"added", std::move(added)}, {"rules", fs_->rules().size()}};
}

}  // namespace cairn
