// Fuzzes the hint parser (daemon/hints.hpp): whatever the bytes, a hint is either accepted with
// every field within its bounds, or refused with a message naming the field; never a crash.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/dtype.hpp"
#include "daemon/hints.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  auto h = cairn::parse_hint(j);
  if (!h.ok()) {
    if (h.status().message().rfind("hint", 0) != 0) std::abort();  // every message names the field
    return 0;
  }
  if (h->models.size() > cairn::kMaxHintModels || h->tensors.size() > cairn::kMaxHintTensors) std::abort();
  if (h->ahead < 1 || h->ahead > cairn::kMaxSequenceAhead || !(h->when_s >= 0)) std::abort();
  for (const auto& m : h->models)
    if (!cairn::valid_name(m)) std::abort();
  // Scores come with a tournament size and give one chance per member, each in [0, 1], summing to 1.
  if (h->scores.empty() != (h->tournament == 0) || h->parent_chance.size() != h->scores.size()) std::abort();
  if (!h->scores.empty() && h->scores.size() != h->models.size()) std::abort();
  double sum = 0;
  for (double p : h->parent_chance) {
    if (!(p >= 0 && p <= 1)) std::abort();
    sum += p;
  }
  if (!h->parent_chance.empty() && std::abs(sum - 1) > 1e-6) std::abort();
  return 0;
}
