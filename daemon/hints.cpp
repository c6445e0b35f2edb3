#include "daemon/hints.hpp"

#include <cmath>
#include <set>

#include "core/dtype.hpp"

namespace cairn {

using nlohmann::json;

const char* hint_kind_name(Hint::Kind k) {
  switch (k) {
    case Hint::Kind::kWillLoad:
      return "will_load";
    case Hint::Kind::kPopulation:
      return "population";
    case Hint::Kind::kSequence:
      return "sequence";
    case Hint::Kind::kDone:
      return "done";
  }
  return "?";
}

namespace {

Status names_from(const json& j, const char* field, size_t max, std::vector<std::string>* out) {
  const std::string where = std::string("hint.") + field;
  if (!j.is_array()) return invalid_argument(where + ": must be an array of names");
  if (j.size() > max)
    return invalid_argument(where + ": " + std::to_string(j.size()) + " entries, at most " + std::to_string(max));
  std::set<std::string> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& v = j[i];
    if (!v.is_string() || !valid_name(v.get_ref<const std::string&>()))
      return invalid_argument(where + "[" + std::to_string(i) + "]: must be a name (1.." +
                              std::to_string(kMaxNameBytes) + " bytes of UTF-8 without NUL)");
    if (seen.insert(v.get<std::string>()).second) out->push_back(v.get<std::string>());
  }
  return Status::OK();
}

}  // namespace

Result<Hint> parse_hint(const json& j) {
  if (!j.is_object()) return invalid_argument("hint: must be a JSON object with 'kind' and 'models'");
  auto kit = j.find("kind");
  if (kit == j.end() || !kit->is_string())
    return invalid_argument("hint.kind: missing (one of will_load, population, sequence, done)");
  Hint h;
  const std::string kind = kit->get<std::string>();
  std::set<std::string> allowed{"kind", "models"};
  if (kind == "will_load") {
    h.kind = Hint::Kind::kWillLoad;
    allowed.insert({"tensors", "when", "tier"});
  } else if (kind == "population") {
    h.kind = Hint::Kind::kPopulation;
  } else if (kind == "sequence") {
    h.kind = Hint::Kind::kSequence;
    allowed.insert("ahead");
  } else if (kind == "done") {
    h.kind = Hint::Kind::kDone;
  } else {
    return invalid_argument("hint.kind: '" + kind.substr(0, 64) +
                            "' is not one of will_load, population, sequence, done");
  }
  for (const auto& [key, value] : j.items())
    if (!allowed.count(key))
      return invalid_argument("hint." + key.substr(0, 64) + ": not a field of a '" + kind + "' hint");
  auto mit = j.find("models");
  if (mit == j.end()) return invalid_argument("hint.models: missing (an array of model ids)");
  CAIRN_RETURN_IF_ERROR(names_from(*mit, "models", kMaxHintModels, &h.models));
  if (auto t = j.find("tensors"); t != j.end())
    CAIRN_RETURN_IF_ERROR(names_from(*t, "tensors", kMaxHintTensors, &h.tensors));
  if (auto w = j.find("when"); w != j.end()) {
    if (w->is_string() && w->get_ref<const std::string&>() == "next") {
      h.when_s = 0;
    } else if (w->is_number() && std::isfinite(w->get<double>()) && w->get<double>() >= 0 && w->get<double>() <= 1e9) {
      h.when_s = w->get<double>();
    } else {
      return invalid_argument("hint.when: must be \"next\" or seconds from now (a number >= 0)");
    }
  }
  if (auto t = j.find("tier"); t != j.end()) {
    if (!t->is_string() || (*t != "dram" && *t != "hbm"))
      return invalid_argument("hint.tier: must be \"dram\" or \"hbm\"");
    h.hbm = *t == "hbm";
  }
  if (auto a = j.find("ahead"); a != j.end()) {
    if (!a->is_number_integer() || a->get<int64_t>() < 1 || a->get<int64_t>() > kMaxSequenceAhead)
      return invalid_argument("hint.ahead: must be an integer from 1 to " + std::to_string(kMaxSequenceAhead));
    h.ahead = static_cast<uint32_t>(a->get<int64_t>());
  }
  return h;
}

}  // namespace cairn
