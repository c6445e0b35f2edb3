// Fuzzes the peer message decoder (daemon/peers/peer_wire.hpp): frames come off the network from
// any process that can reach the endpoint, so bad bytes must give a kProtocol error naming what is
// wrong, never a crash or an exception. The first input byte picks a mode, so the fuzzer also gets
// past the MAC (which it cannot forge) into the body parser:
//   bit 0: re-sign the frame with the fixed secret before decoding;
//   bit 1: first set body_len so the lengths fill the frame (when from_len and to_len are plausible).
// A frame that decodes must encode to one that decodes to the same message. Its body also goes
// through its type's decoder (check_peer_body: peer_bodies.hpp, part_messages.hpp): a kProtocol
// error naming it, or a value (tests/fuzz/fuzz_peer_bodies.cpp fuzzes the bodies alone).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_bodies.hpp"
#include "daemon/peers/peer_wire.hpp"

namespace {

// The seeds in tests/fuzz/corpus/peer_wire/ are signed with this.
const std::string kSecret = "cairn-fuzz-peer-wire-secret";

void check_error(const cairn::Status& s) {
  if (s.code() != cairn::StatusCode::kProtocol) std::abort();
  if (s.message().rfind("peer message: ", 0) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> frame(data + 1, data + size);
  const size_t n = frame.size();
  if ((mode & 2) && n >= cairn::kPeerHeaderBytes + cairn::kPeerMacBytes) {
    const size_t ids =
        (frame[16] | static_cast<size_t>(frame[17]) << 8) + (frame[18] | static_cast<size_t>(frame[19]) << 8);
    if (cairn::kPeerHeaderBytes + ids + cairn::kPeerMacBytes <= n) {
      const size_t body_len = n - cairn::kPeerHeaderBytes - ids - cairn::kPeerMacBytes;
      for (int i = 0; i < 4; ++i) frame[20 + i] = static_cast<uint8_t>(body_len >> (8 * i));
    }
  }
  if ((mode & 1) && n >= cairn::kPeerMacBytes) {
    const std::string mac = cairn::hmac_sha256(kSecret, frame.data(), n - cairn::kPeerMacBytes);
    std::memcpy(frame.data() + n - cairn::kPeerMacBytes, mac.data(), cairn::kPeerMacBytes);
  }

  auto r = cairn::decode_peer_message(std::span<const uint8_t>(frame), kSecret);
  if (!r.ok()) {
    check_error(r.status());
    return 0;
  }
  const cairn::PeerMessage& m = *r;
  if (!m.body.is_object() || m.from.empty() || m.from.size() > 64 || m.to.empty() || m.to.size() > 64) std::abort();
  if (std::strcmp(cairn::peer_msg_name(m.type), "unknown") == 0) std::abort();
  // The body through its type's decoder (peer_bodies.hpp; a multi-part message's also round-trips,
  // check_part_body saying kInternal when it does not): a value, or kProtocol naming the message.
  const cairn::Status body = cairn::check_peer_body(m.type, m.body);
  if (!body.ok() && (body.code() != cairn::StatusCode::kProtocol || body.message().rfind("peer message ", 0) != 0))
    std::abort();
  // Another secret never accepts it.
  if (cairn::decode_peer_message(std::span<const uint8_t>(frame), kSecret + "x").ok()) std::abort();

  const std::vector<uint8_t> again = cairn::encode_peer_message(m, kSecret);
  auto back = cairn::decode_peer_message(std::span<const uint8_t>(again), kSecret);
  if (!back.ok()) std::abort();
  if (back->type != m.type || back->seq != m.seq || back->from != m.from || back->to != m.to) std::abort();
  // Bodies compared by their encoding (a NaN is not == itself).
  if (nlohmann::json::to_cbor(back->body) != nlohmann::json::to_cbor(m.body)) std::abort();
  return 0;
}
