#include "daemon/hints.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
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

// scores and tournament of a population hint; h->models is parsed.
Status population_scores(const json& j, Hint* h) {
  auto s = j.find("scores");
  auto t = j.find("tournament");
  if (s == j.end() && t == j.end()) return Status::OK();
  if (s == j.end()) return invalid_argument("hint.scores: missing (one score per model, with 'tournament')");
  if (t == j.end())
    return invalid_argument("hint.tournament: missing (how many members a parent is drawn from, with 'scores')");
  if (!s->is_array()) return invalid_argument("hint.scores: must be an array of numbers, one per model");
  const auto& given = j.at("models");
  if (given.size() != h->models.size())
    return invalid_argument("hint.models: must be distinct when the hint has scores (a score names one member)");
  if (s->size() != h->models.size())
    return invalid_argument("hint.scores: " + std::to_string(s->size()) + " scores for " +
                            std::to_string(h->models.size()) + " models (one per model, in the same order)");
  for (size_t i = 0; i < s->size(); ++i) {
    const json& v = (*s)[i];
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      return invalid_argument("hint.scores[" + std::to_string(i) + "]: must be a finite number (higher is better)");
    h->scores.push_back(v.get<double>());
  }
  if (!t->is_number_integer() || t->get<int64_t>() < 1 || t->get<int64_t>() > static_cast<int64_t>(kMaxHintModels))
    return invalid_argument("hint.tournament: must be an integer from 1 to " + std::to_string(kMaxHintModels));
  h->tournament = static_cast<uint32_t>(t->get<int64_t>());
  h->parent_chance = tournament_win_chances(h->scores, h->tournament);
  return Status::OK();
}

}  // namespace

std::vector<double> tournament_win_chances(const std::vector<double>& scores, uint32_t tournament) {
  const size_t n = scores.size();
  std::vector<double> out(n, 0.0);
  if (n == 0) return out;
  const size_t k = std::min<size_t>(tournament, n);
  // by_rank[r]: C(n-1-r, k-1) / C(n, k), from by_rank[0] = k / n and
  // by_rank[r+1] / by_rank[r] = (n-r-k) / (n-1-r); 0 from rank n-k+1 on.
  std::vector<double> by_rank(n, 0.0);
  by_rank[0] = static_cast<double>(k) / static_cast<double>(n);
  for (size_t r = 0; r + 1 < n && r + k < n; ++r)
    by_rank[r + 1] = by_rank[r] * static_cast<double>(n - r - k) / static_cast<double>(n - 1 - r);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  // Equal scores: each tied member gets the mean of the tied ranks' chances.
  for (size_t r = 0; r < n;) {
    size_t end = r + 1;
    while (end < n && scores[order[end]] == scores[order[r]]) ++end;
    double sum = 0;
    for (size_t i = r; i < end; ++i) sum += by_rank[i];
    for (size_t i = r; i < end; ++i) out[order[i]] = sum / static_cast<double>(end - r);
    r = end;
  }
  return out;
}

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
    allowed.insert({"scores", "tournament"});
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
  if (h.kind == Hint::Kind::kPopulation) CAIRN_RETURN_IF_ERROR(population_scores(j, &h));
  return h;
}

}  // namespace cairn
