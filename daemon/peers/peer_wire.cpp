#include "daemon/peers/peer_wire.hpp"

#include <cstring>
#include <exception>

#include "daemon/peers/crypto.hpp"

namespace cairn {

// The header, 24 bytes (kPeerHeaderBytes), all little-endian:
//   0 "CPW2" | 4 type u8 | 5 flags u8 (0) | 6 reserved u16 (0) | 8 seq u64 | 16 from_len u16
//   | 18 to_len u16 | 20 body_len u32
// then from, to, body, and the 32-byte MAC over everything before it.

namespace {

constexpr char kMagic[4] = {'C', 'P', 'W', '2'};
// Bodies are small flat objects (a commit's manifest is the deepest); a frame nested deeper is not
// one of ours, and the limit keeps the recursive CBOR reader's stack bounded.
constexpr size_t kMaxBodyDepth = 128;

void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

Status fault(const std::string& what) { return protocol_error("peer message: " + what); }

using Json = nlohmann::json;

// The DOM builder with a nesting limit.
class BoundedSax {
 public:
  explicit BoundedSax(Json& root) : dom_(root, true) {}
  bool too_deep() const { return too_deep_; }

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) { return dom_.number_float(v, s); }
  bool string(Json::string_t& v) { return dom_.string(v); }
  bool binary(Json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) { return enter() && dom_.start_object(n); }
  bool key(Json::string_t& v) { return dom_.key(v); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t pos, const std::string& token, const Exception& ex) {
    return dom_.parse_error(pos, token, ex);  // throws ex
  }

 private:
  bool enter() {
    if (++depth_ > kMaxBodyDepth) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  size_t depth_ = 0;
  bool too_deep_ = false;
};

}  // namespace

const char* peer_msg_name(PeerMsg type) {
  switch (type) {
    case PeerMsg::kHello:
      return "hello";
    case PeerMsg::kHelloReply:
      return "hello_reply";
    case PeerMsg::kLookup:
      return "lookup";
    case PeerMsg::kLookupReply:
      return "lookup_reply";
    case PeerMsg::kHave:
      return "have";
    case PeerMsg::kDrop:
      return "drop";
    case PeerMsg::kGet:
      return "get";
    case PeerMsg::kGetReply:
      return "get_reply";
    case PeerMsg::kFetched:
      return "fetched";
    case PeerMsg::kLoaded:
      return "loaded";
    case PeerMsg::kCommit:
      return "commit";
    case PeerMsg::kBye:
      return "bye";
    case PeerMsg::kStage:
      return "stage";
    case PeerMsg::kStageReply:
      return "stage_reply";
    case PeerMsg::kPart:
      return "part";
    case PeerMsg::kPartState:
      return "part_state";
    case PeerMsg::kAssemble:
      return "assemble";
    case PeerMsg::kPartAck:
      return "part_ack";
  }
  return "unknown";
}

std::vector<uint8_t> encode_peer_message(const PeerMessage& message, const std::string& secret) {
  const std::vector<uint8_t> body = Json::to_cbor(message.body);
  std::vector<uint8_t> out(kPeerHeaderBytes + message.from.size() + message.to.size() + body.size() + kPeerMacBytes, 0);
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 4);
  p[4] = static_cast<uint8_t>(message.type);
  put_le(p + 8, message.seq, 8);
  put_le(p + 16, message.from.size(), 2);
  put_le(p + 18, message.to.size(), 2);
  put_le(p + 20, body.size(), 4);
  size_t at = kPeerHeaderBytes;
  if (!message.from.empty()) std::memcpy(p + at, message.from.data(), message.from.size());
  at += message.from.size();
  if (!message.to.empty()) std::memcpy(p + at, message.to.data(), message.to.size());
  at += message.to.size();
  if (!body.empty()) std::memcpy(p + at, body.data(), body.size());
  at += body.size();
  const std::string mac = hmac_sha256(secret, p, at);
  std::memcpy(p + at, mac.data(), kPeerMacBytes);
  return out;
}

Result<PeerMessage> decode_peer_message(std::span<const uint8_t> frame, const std::string& secret) {
  const size_t n = frame.size();
  if (n < kPeerHeaderBytes + kPeerMacBytes) {
    return fault(std::to_string(n) + " bytes, shorter than a header (" + std::to_string(kPeerHeaderBytes) +
                 ") and MAC (" + std::to_string(kPeerMacBytes) + ")");
  }
  const uint8_t* p = frame.data();
  if (std::memcmp(p, kMagic, 3) != 0) return fault("bad magic (not a cairn peer frame)");
  if (p[3] != kMagic[3]) {
    return fault(std::string("wire version ") + static_cast<char>(p[3]) + " (this daemon speaks " + kMagic[3] +
                 "): a cairnd of another release");
  }
  const uint8_t type = p[4];
  if (p[5] != 0) return fault("flags " + std::to_string(p[5]) + ", must be 0");
  if (get_le(p + 6, 2) != 0) return fault("reserved header bytes are not 0");
  if (type == 0 || type > kMaxPeerMsg) return fault("unknown type " + std::to_string(type));
  const uint64_t seq = get_le(p + 8, 8);
  const size_t from_len = get_le(p + 16, 2);
  const size_t to_len = get_le(p + 18, 2);
  const size_t body_len = get_le(p + 20, 4);
  for (auto [len, what] : {std::pair{from_len, "sender"}, std::pair{to_len, "receiver"}}) {
    if (len == 0 || len > kMaxPeerIdBytes) {
      return fault(std::string(what) + " id of " + std::to_string(len) + " bytes (must be 1.." +
                   std::to_string(kMaxPeerIdBytes) + ")");
    }
  }
  const size_t want = kPeerHeaderBytes + from_len + to_len + body_len + kPeerMacBytes;  // no overflow: < 2^33
  const auto lengths = [&] {
    return "(sender " + std::to_string(from_len) + " + receiver " + std::to_string(to_len) + " + body " +
           std::to_string(body_len) + " bytes in a frame of " + std::to_string(n) + ")";
  };
  if (want > n) return fault("lengths exceed the frame " + lengths());
  if (want < n) return fault("lengths do not fill the frame " + lengths());
  const size_t signed_len = n - kPeerMacBytes;
  const std::string mac = hmac_sha256(secret, p, signed_len);
  if (!same_mac(mac, std::string_view(reinterpret_cast<const char*>(p + signed_len), kPeerMacBytes))) {
    return fault("bad MAC (not signed with this group's secret)");
  }

  PeerMessage m;
  m.type = static_cast<PeerMsg>(type);
  m.seq = seq;
  m.from.assign(reinterpret_cast<const char*>(p + kPeerHeaderBytes), from_len);
  m.to.assign(reinterpret_cast<const char*>(p + kPeerHeaderBytes + from_len), to_len);
  const uint8_t* body = p + kPeerHeaderBytes + from_len + to_len;
  Json j;
  try {
    BoundedSax sax(j);
    const bool ok = Json::sax_parse(body, body + body_len, &sax, Json::input_format_t::cbor, true);
    if (!ok) {
      return fault(sax.too_deep() ? "body is not CBOR: nested deeper than " + std::to_string(kMaxBodyDepth)
                                  : std::string("body is not CBOR"));
    }
  } catch (const Json::exception& e) {
    return fault(std::string("body is not CBOR: ") + e.what());
  } catch (const std::exception& e) {
    return fault(std::string("body is not CBOR: ") + e.what());
  }
  if (!j.is_object()) return fault(std::string("body is not an object (a CBOR ") + j.type_name() + ")");
  m.body = std::move(j);
  return m;
}

}  // namespace cairn
