// Fuzzes the hint parser (daemon/hints.hpp): whatever the bytes, a hint is either accepted with
// every field within its bounds, or refused with a message naming the field; never a crash.
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
  return 0;
}
