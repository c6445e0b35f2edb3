// Fuzzes the bodies of the peer messages as a member holding the group's secret would send them
// (a buggy or other-release member, or one whose secret leaked): the fuzzer's body is put in a
// frame of the chosen type, signed with the group's secret, and goes through the daemon's own path:
// decode_peer_message (the frame, the CBOR), then the type's body decoder (peer_bodies.hpp, and
// part_messages.hpp for the multi-part messages) that the handlers in peer_messages.cpp run before
// they act on a body. Whatever the bytes, the result is a value or a kProtocol error naming the
// message ("peer message lookup: chunk: ..."), never a crash, an exception or a hang.
//
// Input: byte 0 picks the type (low 5 bits: type = b % 18 + 1) and how the body is given (bit 7:
// JSON text, turned into CBOR, so seeds and mutations can be readable; else raw CBOR bytes).
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
#include "tiers/peer/fabric.hpp"

namespace {

const std::string kSecret = "cairn-fuzz-peer-bodies-secret";

// A frame of `type` from m1 to m2 whose body is these bytes, signed with kSecret: the encoder's
// frame with an empty body, the body spliced in, body_len set, signed again.
std::vector<uint8_t> frame_with_body(cairn::PeerMsg type, const std::vector<uint8_t>& body) {
  cairn::PeerMessage m;
  m.type = type;
  m.seq = 1;
  m.from = "m1111111111111111";
  m.to = "m2222222222222222";
  std::vector<uint8_t> f = cairn::encode_peer_message(m, kSecret);
  f.resize(f.size() - cairn::kPeerMacBytes - nlohmann::json::to_cbor(m.body).size());
  f.insert(f.end(), body.begin(), body.end());
  for (int i = 0; i < 4; ++i) f[20 + i] = static_cast<uint8_t>(body.size() >> (8 * i));
  const std::string mac = cairn::hmac_sha256(kSecret, f.data(), f.size());
  f.insert(f.end(), mac.begin(), mac.end());
  return f;
}

void expect(bool ok) {
  if (!ok) std::abort();
}

// What a decoded body promises its handler.
void check_values(cairn::PeerMsg type, const nlohmann::json& body) {
  using cairn::PeerMsg;
  switch (type) {
    case PeerMsg::kHello: {
      auto h = cairn::decode_hello(body);
      expect(h->nonce.size() == cairn::kHelloNonceBytes && h->address.size() >= 3);
      break;
    }
    case PeerMsg::kHelloReply:
      expect(cairn::decode_hello_reply(body)->answer.size() == 32);
      break;
    case PeerMsg::kGet:
      expect((cairn::decode_get(body)->tag & cairn::Fabric::kBodyTagBit) != 0);
      break;
    case PeerMsg::kLookupReply: {
      auto r = cairn::decode_lookup_reply(body);
      expect(r->verdict != cairn::ChunkDirectory::Verdict::kFetch || !r->holder.empty());
      break;
    }
    case PeerMsg::kStageReply: {
      auto r = cairn::decode_stage_reply(body);
      expect(r->ok == r->error.empty());
      break;
    }
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > cairn::Fabric::kMaxControlBytes) return 0;
  const auto type = static_cast<cairn::PeerMsg>((data[0] & 0x1f) % cairn::kMaxPeerMsg + 1);
  std::vector<uint8_t> body(data + 1, data + size);
  if (data[0] & 0x80) {
    auto j = nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    body = nlohmann::json::to_cbor(j);
  }
  const std::vector<uint8_t> frame = frame_with_body(type, body);
  auto m = cairn::decode_peer_message(std::span<const uint8_t>(frame), kSecret);
  if (!m.ok()) {
    expect(m.status().code() == cairn::StatusCode::kProtocol);
    return 0;
  }
  expect(m->type == type && m->to == "m2222222222222222");
  const cairn::Status st = cairn::check_peer_body(type, m->body);
  if (!st.ok()) {
    expect(st.code() == cairn::StatusCode::kProtocol);
    expect(st.message().rfind(std::string("peer message ") + cairn::peer_msg_name(type), 0) == 0);
    return 0;
  }
  check_values(type, m->body);
  return 0;
}
