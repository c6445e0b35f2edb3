// Fuzzes the `fault` request (decoded by daemon/request.hpp, served by daemon/fault_injection.hpp):
// whatever the bytes, a request is either served or refused with a message naming the field; an
// accepted rule is within its bounds and reads back the same from the JSON `list` shows; never a crash.
#include <cstdint>
#include <cstdlib>

#include "core/fs.hpp"
#include "daemon/fault_injection.hpp"
#include "daemon/request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using cairn::FaultyFileSystem;
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  // The rule alone.
  auto r = cairn::parse_fault_rule(j.is_object() && j.contains("rule") ? j["rule"] : j);
  if (!r.ok()) {
    if (r.status().message().rfind("fault: ", 0) != 0) std::abort();  // every message names the field
  } else {
    if (r->skip < 0 || r->times == 0 || r->times < -1 || r->delay_ms > cairn::kMaxFaultDelayMs) std::abort();
    if ((r->effect == FaultyFileSystem::Effect::kDelay) != (r->delay_ms > 0)) std::abort();
    if (r->path_contains.size() > 4096) std::abort();
    nlohmann::json back = cairn::fault_rule_json({*r, 0});
    back.erase("injected");
    auto again = cairn::parse_fault_rule(back);
    if (!again.ok() || again->op != r->op || again->effect != r->effect || again->err != r->err ||
        again->skip != r->skip || again->times != r->times || again->delay_ms != r->delay_ms ||
        again->path_contains != r->path_contains)
      std::abort();
  }
  // The whole request, decoded as the engine does (daemon/request.hpp), on an injector over memory.
  if (!j.is_object()) return 0;
  auto req = cairn::request::decode_fault(j);
  if (!req.ok()) {
    if (req.status().message().rfind("fault: ", 0) != 0) std::abort();
    return 0;
  }
  cairn::MemoryFileSystem mem;
  FaultyFileSystem fs(mem);
  cairn::FaultInjection faults(&fs);
  auto out = faults.handle(*req);
  if (!out.ok() && out.status().message().rfind("fault: ", 0) != 0) std::abort();
  if (out.ok() && fs.rules().size() > 1) std::abort();
  return 0;
}
