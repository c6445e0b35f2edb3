// Fuzzes the frame decoder: header, then body, for both kinds. Anything that decodes must
// re-encode to a frame that decodes to the same JSON. A response's "progress" object (the
// `progress` request's answer) goes through its strict decoder too, which must round-trip.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/progress.hpp"
#include "core/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cairn::wire;
  std::span<const uint8_t> in(data, size);
  auto h = decode_header(in);
  if (!h.ok()) return 0;
  if (h->json_len > in.size() - kFrameHeaderBytes) return 0;
  auto body = decode_body(h->kind, in.subspan(kFrameHeaderBytes, h->json_len));
  if (!body.ok()) return 0;
  auto again = encode_frame(h->kind, *body);
  auto h2 = decode_header(again);
  if (!h2.ok()) std::abort();
  auto body2 = decode_body(h2->kind, std::span<const uint8_t>(again).subspan(kFrameHeaderBytes, h2->json_len));
  if (!body2.ok() || *body2 != *body) std::abort();
  if (auto p = body->find("progress"); h->kind == Kind::kResponse && p != body->end()) {
    auto snap = cairn::progress_from_json(*p);
    if (snap.ok()) {
      auto again_snap = cairn::progress_from_json(cairn::progress_to_json(*snap));
      if (!again_snap.ok() || !(*again_snap == *snap)) std::abort();
    }
  }
  return 0;
}
