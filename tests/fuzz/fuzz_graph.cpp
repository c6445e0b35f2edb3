// Fuzzes the architecture-graph parser: anything accepted must sign every layer and survive a
// round trip through to_json with the same signatures.
#include <cstdint>
#include <cstdlib>

#include "core/graph.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  auto g = cairn::parse_graph(j);
  if (!g.ok()) {
    if (g.status().message().empty()) std::abort();
    return 0;
  }
  auto sig = cairn::layer_signatures(*g);
  if (sig.size() != g->layers.size()) std::abort();
  auto again = cairn::parse_graph(g->to_json());
  if (!again.ok() || cairn::layer_signatures(*again) != sig) std::abort();
  return 0;
}
