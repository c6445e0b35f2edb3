#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/peers/crypto.hpp"
#include "daemon/peers/peer_wire.hpp"

using cairn::PeerMessage;
using cairn::PeerMsg;
using nlohmann::json;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";
const std::string kFrom = "9f8e7d6c5b4a39281706f5e4d3c2b1a0";
const std::string kTo = "m0123456789abcdef";

PeerMessage make(PeerMsg type, json body, uint64_t seq = 42) {
  PeerMessage m;
  m.type = type;
  m.seq = seq;
  m.from = kFrom;
  m.to = kTo;
  m.body = std::move(body);
  return m;
}

// A frame with these fields and bytes, signed with secret (for the faults encode cannot make).
std::vector<uint8_t> raw_frame(uint8_t type, const std::string& from, const std::vector<uint8_t>& body,
                               const std::string& secret = kSecret, const std::string& to = kTo) {
  std::vector<uint8_t> f(cairn::kPeerHeaderBytes, 0);
  std::memcpy(f.data(), "CPW2", 4);
  f[4] = type;
  f[8] = 7;
  f[16] = static_cast<uint8_t>(from.size());
  f[17] = static_cast<uint8_t>(from.size() >> 8);
  f[18] = static_cast<uint8_t>(to.size());
  f[19] = static_cast<uint8_t>(to.size() >> 8);
  for (int i = 0; i < 4; ++i) f[20 + i] = static_cast<uint8_t>(body.size() >> (8 * i));
  f.insert(f.end(), from.begin(), from.end());
  f.insert(f.end(), to.begin(), to.end());
  f.insert(f.end(), body.begin(), body.end());
  std::string mac = cairn::hmac_sha256(secret, f.data(), f.size());
  f.insert(f.end(), mac.begin(), mac.end());
  return f;
}

// Re-signs a frame whose header or body a test changed (so only that change is wrong).
void resign(std::vector<uint8_t>& f, const std::string& secret = kSecret) {
  size_t n = f.size() - cairn::kPeerMacBytes;
  std::string mac = cairn::hmac_sha256(secret, f.data(), n);
  std::memcpy(f.data() + n, mac.data(), mac.size());
}

std::string decode_error(const std::vector<uint8_t>& f, const std::string& secret = kSecret) {
  auto r = cairn::decode_peer_message(f, secret);
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == cairn::StatusCode::kProtocol);
  REQUIRE(r.status().message().rfind("peer message: ", 0) == 0);
  return r.status().message();
}

std::vector<PeerMessage> every_message() {
  const std::string chunk = "0123456789abcdef0123456789abcdef";
  json manifest = {{"id", "llama-7b@3"},
                   {"parent", "llama-7b@2"},
                   {"tensors", json::array({{{"name", "layers.0.attn.q"},
                                             {"dtype", "bf16"},
                                             {"shape", {4096, 4096}},
                                             {"nbytes", 33554432},
                                             {"chunks", json::array({{{"hash", chunk}, {"length", 16777216}},
                                                                     {{"hash", chunk}, {"length", 16777216}}})}}})}};
  return {
      make(PeerMsg::kHello, {{"nonce", std::string(32, 'a')}}),
      make(PeerMsg::kHelloReply, {{"nonce", std::string(32, 'b')}, {"answer", std::string(64, 'c')}}),
      make(PeerMsg::kLookup, {{"req", 17}, {"chunk", chunk}, {"length", 16777216}}),
      make(PeerMsg::kLookupReply, {{"req", 17}, {"verdict", "fetch"}, {"holder", kFrom}}),
      make(PeerMsg::kHave, {{"chunks", json::array({chunk, chunk, chunk})}}),
      make(PeerMsg::kDrop, {{"chunks", json::array({chunk})}}),
      make(PeerMsg::kGet, {{"req", 18}, {"chunk", chunk}, {"length", 1234}, {"tag", 0xffffffffffull}}),
      make(PeerMsg::kGetReply, {{"req", 18}, {"error", "not held any more"}}),
      make(PeerMsg::kFetched, {{"chunk", chunk}, {"holder", kFrom}}),
      make(PeerMsg::kLoaded, {{"chunk", chunk}, {"ok", true}}),
      make(PeerMsg::kCommit, {{"model", manifest}}),
      make(PeerMsg::kBye, json::object(), ~0ull),
      make(PeerMsg::kStage, {{"req", 19}, {"model", "nas/gen3/c7"}}),
      make(PeerMsg::kStageReply, {{"req", 19}, {"ok", false}, {"seconds", 0.25}, {"error", "not found: nas/gen3/c7"}}),
      make(PeerMsg::kPart,
           {{"part", manifest}, {"index", 1}, {"of", 4}, {"timeout_ms", 60000}, {"durability", "local"}}),
      make(PeerMsg::kPartState, {{"model", "llama-7b@3"}, {"phase", "delegated"}, {"registrar", kFrom}}),
      make(PeerMsg::kAssemble, {{"model", manifest}, {"durability", "memory"}, {"part_holders", {kFrom, kFrom}}}),
      make(PeerMsg::kPartAck, {{"model", "llama-7b@3"}, {"what", "held"}, {"ok", true}}),
  };
}

}  // namespace

TEST_CASE("every peer message round-trips", "[peers]") {
  auto all = every_message();
  REQUIRE(all.size() == cairn::kMaxPeerMsg);
  for (const auto& m : all) {
    INFO(cairn::peer_msg_name(m.type));
    auto f = cairn::encode_peer_message(m, kSecret);
    REQUIRE(f.size() == cairn::kPeerHeaderBytes + m.from.size() + m.to.size() + json::to_cbor(m.body).size() +
                            cairn::kPeerMacBytes);
    auto r = cairn::decode_peer_message(f, kSecret);
    REQUIRE(r.ok());
    REQUIRE(r->type == m.type);
    REQUIRE(r->seq == m.seq);
    REQUIRE(r->from == m.from);
    REQUIRE(r->to == m.to);
    REQUIRE(r->body == m.body);
  }
}

TEST_CASE("peer_msg_name names every type", "[peers]") {
  const char* names[] = {"hello", "hello_reply", "lookup",  "lookup_reply", "have",     "drop",
                         "get",   "get_reply",   "fetched", "loaded",       "commit",   "bye",
                         "stage", "stage_reply", "part",    "part_state",   "assemble", "part_ack"};
  for (uint8_t t = 1; t <= cairn::kMaxPeerMsg; ++t)
    REQUIRE(std::string(cairn::peer_msg_name(PeerMsg(t))) == names[t - 1]);
  REQUIRE(std::string(cairn::peer_msg_name(PeerMsg(0))) == "unknown");
  REQUIRE(std::string(cairn::peer_msg_name(PeerMsg(200))) == "unknown");
}

TEST_CASE("the frame layout is the documented one", "[peers]") {
  auto f = cairn::encode_peer_message(make(PeerMsg::kLookup, {{"req", 1}}, 0x0102030405060708ull), kSecret);
  auto body = json::to_cbor(json{{"req", 1}});
  REQUIRE(std::memcmp(f.data(), "CPW2", 4) == 0);
  REQUIRE(f[4] == static_cast<uint8_t>(PeerMsg::kLookup));
  REQUIRE(f[5] == 0);
  REQUIRE(f[8] == 0x08);
  REQUIRE(f[15] == 0x01);
  REQUIRE(f[16] == kFrom.size());
  REQUIRE(f[18] == kTo.size());
  REQUIRE(f[20] == body.size());
  REQUIRE(std::string(f.begin() + 24, f.begin() + 24 + kFrom.size()) == kFrom);
  const auto to_at = f.begin() + 24 + static_cast<std::ptrdiff_t>(kFrom.size());
  REQUIRE(std::string(to_at, to_at + static_cast<std::ptrdiff_t>(kTo.size())) == kTo);
  REQUIRE(std::vector<uint8_t>(to_at + static_cast<std::ptrdiff_t>(kTo.size()), f.end() - 32) == body);
}

TEST_CASE("decode names each fault", "[peers]") {
  const auto good = cairn::encode_peer_message(make(PeerMsg::kLookup, {{"req", 1}, {"chunk", "ab"}}), kSecret);
  REQUIRE(cairn::decode_peer_message(good, kSecret).ok());

  SECTION("short") {
    REQUIRE_THAT(decode_error(std::vector<uint8_t>(12, 0)), Catch::Contains("12 bytes, shorter than a header"));
    REQUIRE_THAT(decode_error({}), Catch::Contains("0 bytes, shorter than a header"));
  }
  SECTION("bad magic") {
    auto f = good;
    f[0] = 'X';
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("bad magic"));
  }
  SECTION("wire version 1 (no receiver id) is refused by name") {
    auto f = good;
    f[3] = '1';
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("wire version 1 (this daemon speaks 2)"));
  }
  SECTION("flags and reserved") {
    auto f = good;
    f[5] = 1;
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("flags 1, must be 0"));
    for (size_t at : {size_t{6}, size_t{7}}) {
      f = good;
      f[at] = 0x80;
      resign(f);
      REQUIRE_THAT(decode_error(f), Catch::Contains("reserved header bytes are not 0"));
    }
  }
  SECTION("unknown type") {
    for (int t : {0, cairn::kMaxPeerMsg + 1, 77, 255}) {
      auto f = good;
      f[4] = static_cast<uint8_t>(t);
      resign(f);
      REQUIRE_THAT(decode_error(f), Catch::Contains("unknown type " + std::to_string(t)));
    }
  }
  SECTION("sender id length") {
    auto body = json::to_cbor(json{{"a", 1}});
    REQUIRE_THAT(decode_error(raw_frame(1, "", body)), Catch::Contains("sender id of 0 bytes"));
    REQUIRE_THAT(decode_error(raw_frame(1, std::string(65, 'x'), body)), Catch::Contains("sender id of 65 bytes"));
    REQUIRE(cairn::decode_peer_message(raw_frame(1, std::string(64, 'x'), body), kSecret).ok());
    REQUIRE(cairn::decode_peer_message(raw_frame(1, "x", body), kSecret).ok());
  }
  SECTION("receiver id length") {
    auto body = json::to_cbor(json{{"a", 1}});
    REQUIRE_THAT(decode_error(raw_frame(1, kFrom, body, kSecret, "")), Catch::Contains("receiver id of 0 bytes"));
    REQUIRE_THAT(decode_error(raw_frame(1, kFrom, body, kSecret, std::string(65, 'y'))),
                 Catch::Contains("receiver id of 65 bytes"));
    auto r = cairn::decode_peer_message(raw_frame(1, kFrom, body, kSecret, std::string(64, 'y')), kSecret);
    REQUIRE(r.ok());
    REQUIRE(r->to == std::string(64, 'y'));
  }
  SECTION("the receiver id is under the MAC") {
    auto f = good;
    f[cairn::kPeerHeaderBytes + kFrom.size()] ^= 0x01;  // the first byte of `to`, not re-signed
    REQUIRE_THAT(decode_error(f), Catch::Contains("bad MAC"));
  }
  SECTION("lengths") {
    auto f = good;
    f[20] += 1;
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("lengths exceed the frame"));
    f = good;
    f[23] = 0xff;  // body_len near 4 GiB
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("lengths exceed the frame"));
    f = good;
    f[20] -= 1;
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("lengths do not fill the frame"));
    f = good;
    f.insert(f.end() - 32, uint8_t{0});  // a stray byte after the body
    resign(f);
    REQUIRE_THAT(decode_error(f), Catch::Contains("lengths do not fill the frame"));
  }
  SECTION("MAC") {
    auto f = good;
    f.back() ^= 1;
    REQUIRE_THAT(decode_error(f), Catch::Contains("bad MAC"));
    // A frame signed with another group's secret.
    auto other = cairn::encode_peer_message(make(PeerMsg::kLookup, {{"req", 1}}), "another group's secret");
    REQUIRE_THAT(decode_error(other), Catch::Contains("bad MAC (not signed with this group's secret)"));
    REQUIRE(cairn::decode_peer_message(other, "another group's secret").ok());
    // An empty secret is a secret like any other.
    REQUIRE_THAT(decode_error(other, ""), Catch::Contains("bad MAC"));
  }
  SECTION("body is not CBOR") {
    // The body is checked only after the MAC: an unsigned garbage body is a MAC fault.
    auto unsigned_frame = raw_frame(3, kFrom, {0xff, 0x00});
    unsigned_frame[unsigned_frame.size() - 1] ^= 0x55;
    REQUIRE_THAT(decode_error(unsigned_frame), Catch::Contains("bad MAC"));
    REQUIRE_THAT(decode_error(raw_frame(3, kFrom, {0xff, 0x00})), Catch::Contains("body is not CBOR"));
    REQUIRE_THAT(decode_error(raw_frame(3, kFrom, {})), Catch::Contains("body is not CBOR"));
    // Truncated: a map of one that ends early.
    REQUIRE_THAT(decode_error(raw_frame(3, kFrom, {0xa1, 0x61, 'a'})), Catch::Contains("body is not CBOR"));
    // Trailing bytes after a complete object.
    auto body = json::to_cbor(json{{"a", 1}});
    body.push_back(0x00);
    REQUIRE_THAT(decode_error(raw_frame(3, kFrom, body)), Catch::Contains("body is not CBOR"));
    // A tag (not JSON).
    REQUIRE_THAT(decode_error(raw_frame(3, kFrom, {0xc1, 0xa0})), Catch::Contains("body is not CBOR"));
    // Nested far deeper than any message: refused, not a deep recursion.
    std::vector<uint8_t> deep(5000, 0x81);  // [[[[...
    deep.push_back(0xa0);
    REQUIRE_THAT(decode_error(raw_frame(3, kFrom, deep)), Catch::Contains("nested deeper than"));
    std::vector<uint8_t> ok(20, 0x81);
    ok.insert(ok.begin(), {0xa1, 0x61, 'a'});
    ok.push_back(0xa0);
    auto r = cairn::decode_peer_message(raw_frame(3, kFrom, ok), kSecret);
    REQUIRE(r.ok());
  }
  SECTION("body is not an object") {
    for (const json& j : {json::array({1, 2}), json(5), json("text"), json(nullptr), json(true)}) {
      REQUIRE_THAT(decode_error(raw_frame(3, kFrom, json::to_cbor(j))), Catch::Contains("body is not an object"));
    }
  }
}

TEST_CASE("any single flipped byte is rejected", "[peers]") {
  for (const auto& m : every_message()) {
    const auto good = cairn::encode_peer_message(m, kSecret);
    for (size_t i = 0; i < good.size(); ++i) {
      for (uint8_t x : {0x01, 0x80, 0xff}) {
        auto f = good;
        f[i] ^= x;
        auto r = cairn::decode_peer_message(f, kSecret);
        INFO(cairn::peer_msg_name(m.type) << " byte " << i << " ^ " << int(x));
        REQUIRE_FALSE(r.ok());
        REQUIRE(r.status().code() == cairn::StatusCode::kProtocol);
        REQUIRE(r.status().message().rfind("peer message: ", 0) == 0);
      }
    }
  }
}

TEST_CASE("any truncation or extension is rejected", "[peers]") {
  for (const auto& m : every_message()) {
    const auto good = cairn::encode_peer_message(m, kSecret);
    for (size_t n = 0; n < good.size(); ++n) {
      std::vector<uint8_t> f(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
      auto r = cairn::decode_peer_message(f, kSecret);
      INFO(cairn::peer_msg_name(m.type) << " cut to " << n << " of " << good.size());
      REQUIRE_FALSE(r.ok());
      REQUIRE(r.status().code() == cairn::StatusCode::kProtocol);
    }
    auto longer = good;
    longer.push_back(0);
    REQUIRE_FALSE(cairn::decode_peer_message(longer, kSecret).ok());
  }
}
