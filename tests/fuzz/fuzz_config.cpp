// libFuzzer target for the config loader: any bytes given as a config file must give a Config or
// a kInvalidArgument Status, never a crash or an escaping exception; and a Config that loads must
// survive to_yaml() -> load_config_text() unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::map<std::string, std::string> kEmptyEnv;
  std::string text(reinterpret_cast<const char*>(data), size);
  cairn::Result<cairn::Config> r = cairn::load_config_text(text, "fuzz", kEmptyEnv);
  if (!r.ok()) {
    if (r.status().code() != cairn::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  std::string yaml = r->to_yaml();
  cairn::Result<cairn::Config> back = cairn::load_config_text(yaml, "round trip", kEmptyEnv);
  if (!back.ok() || back->to_yaml() != yaml) std::abort();
  return 0;
}
