#include "core/progress.hpp"

namespace cairn {

using nlohmann::json;

namespace {
constexpr size_t kMaxPhaseBytes = 256;
}  // namespace

const char* progress_unit_name(ProgressUnit u) { return u == ProgressUnit::kBytes ? "bytes" : "items"; }

json progress_to_json(const ProgressSnapshot& s) {
  return json{{"phase", s.phase}, {"unit", progress_unit_name(s.unit)}, {"done", s.done}, {"total", s.total}};
}

Result<ProgressSnapshot> progress_from_json(const json& j) {
  auto bad = [](const std::string& what) { return Status(StatusCode::kProtocol, "progress: " + what); };
  if (!j.is_object()) return bad("not a JSON object");
  if (j.size() != 4) return bad("expected exactly the fields phase, unit, done, total");
  ProgressSnapshot s;
  auto phase = j.find("phase");
  if (phase == j.end() || !phase->is_string()) return bad("field 'phase' must be a string");
  s.phase = phase->get<std::string>();
  if (s.phase.size() > kMaxPhaseBytes) return bad("field 'phase' is longer than 256 bytes");
  auto unit = j.find("unit");
  if (unit == j.end() || !unit->is_string()) return bad("field 'unit' must be a string");
  if (*unit == "bytes")
    s.unit = ProgressUnit::kBytes;
  else if (*unit == "items")
    s.unit = ProgressUnit::kItems;
  else
    return bad("field 'unit' must be \"bytes\" or \"items\"");
  for (auto [name, dst] : {std::pair{"done", &s.done}, std::pair{"total", &s.total}}) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0))
      return bad(std::string("field '") + name + "' must be a non-negative integer");
    *dst = it->get<uint64_t>();
  }
  return s;
}

}  // namespace cairn
