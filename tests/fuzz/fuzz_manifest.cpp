// Fuzzes the manifest reader (tiers/pfs/repository.hpp): manifests are read from the PFS at every
// open, so a malformed one must give an error, never a crash. Any manifest it accepts must survive
// manifest_to_json -> manifest_from_json unchanged, both as a JSON value and through its text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tiers/pfs/repository.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  json j = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  cairn::Result<cairn::ModelManifest> m = cairn::manifest_from_json(j);
  if (!m.ok()) {
    if (m.status().message().empty()) std::abort();  // errors must say what is wrong
    return 0;
  }

  json out = cairn::manifest_to_json(*m);
  cairn::Result<cairn::ModelManifest> again = cairn::manifest_from_json(out);
  if (!again.ok() || !(*again == *m)) std::abort();

  // Through text, as the repository writes and reads it. Strings that came from the parser are
  // valid UTF-8, so dump() does not throw here.
  std::string text = out.dump();
  json reparsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (reparsed.is_discarded()) std::abort();
  cairn::Result<cairn::ModelManifest> third = cairn::manifest_from_json(reparsed);
  if (!third.ok() || !(*third == *m)) std::abort();
  if (cairn::manifest_to_json(*third).dump() != text) std::abort();
  return 0;
}
