// The peer messages' body decoders (daemon/peers/peer_bodies.hpp): what the handlers accept, and
// that garbage from a member holding the secret is refused by name, never thrown.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "daemon/peers/peer_bodies.hpp"
#include "tiers/peer/fabric.hpp"

using cairn::PeerMsg;
using nlohmann::json;

namespace {

const std::string kChunk = "0123456789abcdef0123456789abcdef";
const std::string kMember = "m0123456789abcdef";
const uint64_t kTag = cairn::Fabric::kBodyTagBit | 77;

// A body of each type as the daemon sends it (peer_messages.cpp, peer_fetch.cpp, peer_stage.cpp).
std::vector<std::pair<PeerMsg, json>> sent_bodies() {
  cairn::ModelManifest model;
  model.id = "base";
  cairn::TensorManifest t;
  t.name = "w";
  t.dtype = cairn::DType::kF32;
  t.shape = {4};
  t.nbytes = 16;
  cairn::ChunkRef c;
  c.hash = *cairn::ChunkHash::from_hex(kChunk);
  c.length = 16;
  t.chunks.push_back(c);
  model.tensors.push_back(t);
  const json manifest = cairn::manifest_to_json(model);
  return {
      {PeerMsg::kHello, {{"nonce", std::string(32, 'a')}, {"address", "0400" + std::string(16, 'e')}}},
      {PeerMsg::kHelloReply, {{"nonce", std::string(32, 'b')}, {"answer", std::string(64, 'c')}}},
      {PeerMsg::kLookup, {{"req", 17}, {"chunk", kChunk}, {"length", 16777216}}},
      {PeerMsg::kLookupReply, {{"req", 17}, {"chunk", kChunk}, {"verdict", "fetch"}, {"holder", kMember}}},
      {PeerMsg::kLookupReply, {{"req", 17}, {"verdict", "load"}, {"holder", ""}}},  // "not verified yet"
      {PeerMsg::kHave, {{"chunks", json::array({kChunk, kChunk})}}},
      {PeerMsg::kDrop, {{"chunks", json::array()}}},
      {PeerMsg::kGet, {{"req", 18}, {"chunk", kChunk}, {"length", 1234}, {"tag", kTag}}},
      {PeerMsg::kGetReply, {{"req", 18}, {"error", "not held any more"}}},
      {PeerMsg::kFetched, {{"chunk", kChunk}, {"holder", kMember}}},
      {PeerMsg::kLoaded, {{"chunk", kChunk}, {"ok", false}}},
      {PeerMsg::kCommit, {{"model", manifest}}},
      {PeerMsg::kBye, json::object()},
      {PeerMsg::kStage, {{"req", 19}, {"model", "nas/gen3/c7"}}},
      {PeerMsg::kStageReply, {{"req", 19}, {"ok", true}, {"seconds", 0.25}, {"bytes", 4096}}},
      {PeerMsg::kStageReply, {{"req", 19}, {"ok", false}, {"seconds", 0.0}, {"error", "not found: nas/gen3/c7"}}},
  };
}

std::string refused(PeerMsg type, const json& body) {
  cairn::Status st = cairn::check_peer_body(type, body);
  REQUIRE_FALSE(st.ok());
  REQUIRE(st.code() == cairn::StatusCode::kProtocol);
  REQUIRE(st.message().rfind(std::string("peer message ") + cairn::peer_msg_name(type) + ": ", 0) == 0);
  return st.message();
}

json with(json body, const std::string& key, json value) {
  body[key] = std::move(value);
  return body;
}
json without(json body, const std::string& key) {
  body.erase(key);
  return body;
}

}  // namespace

TEST_CASE("peer bodies: what the daemon sends decodes", "[peers][bodies]") {
  for (const auto& [type, body] : sent_bodies()) {
    INFO(cairn::peer_msg_name(type) << " " << body.dump());
    cairn::Status st = cairn::check_peer_body(type, body);
    INFO(st.to_string());
    REQUIRE(st.ok());
  }
  auto hello = cairn::decode_hello(sent_bodies()[0].second);
  REQUIRE(hello->nonce == std::string(16, '\xaa'));
  REQUIRE(hello->address.size() == 10);
  auto get = cairn::decode_get(sent_bodies()[7].second);
  REQUIRE(get->req == 18);
  REQUIRE(get->chunk.hex() == kChunk);
  REQUIRE(get->length == 1234);
  REQUIRE(get->tag == kTag);
  auto reply = cairn::decode_lookup_reply(sent_bodies()[4].second);
  REQUIRE(reply->verdict == cairn::ChunkDirectory::Verdict::kLoad);
  REQUIRE_FALSE(reply->chunk.has_value());
  auto stage = cairn::decode_stage_reply(sent_bodies()[14].second);
  REQUIRE(stage->ok);
  REQUIRE(stage->bytes == 4096);
  REQUIRE(stage->seconds == 0.25);
}

TEST_CASE("peer bodies: each decoder names each fault", "[peers][bodies]") {
  const auto all = sent_bodies();
  const json& lookup = all[2].second;
  const json& get = all[7].second;
  // Missing, unknown, wrongly typed fields; not an object.
  REQUIRE_THAT(refused(PeerMsg::kLookup, without(lookup, "chunk")), Catch::Contains("missing field 'chunk'"));
  REQUIRE_THAT(refused(PeerMsg::kLookup, with(lookup, "extra", 1)), Catch::Contains("unknown field 'extra'"));
  REQUIRE_THAT(refused(PeerMsg::kLookup, with(lookup, "req", "17")),
               Catch::Contains("req: expected a non-negative integer"));
  REQUIRE_THAT(refused(PeerMsg::kLookup, with(lookup, "req", -1)),
               Catch::Contains("req: expected a non-negative integer"));
  REQUIRE_THAT(refused(PeerMsg::kLookup, with(lookup, "length", 0)), Catch::Contains("length: 0 is not in 1.."));
  REQUIRE_THAT(refused(PeerMsg::kLookup, json::array()), Catch::Contains("body is not an object"));
  for (const json& bad : {json(5), json("zz"), json(kChunk + "0"), json(kChunk.substr(1) + "g"), json(nullptr)})
    REQUIRE_THAT(refused(PeerMsg::kLookup, with(lookup, "chunk", bad)),
                 Catch::Contains("chunk: expected a chunk hash"));
  // have/drop: every entry checked, by index.
  REQUIRE_THAT(refused(PeerMsg::kHave, json{{"chunks", {kChunk, 7}}}),
               Catch::Contains("chunks[1]: expected a chunk hash"));
  REQUIRE_THAT(refused(PeerMsg::kDrop, json{{"chunks", kChunk}}), Catch::Contains("chunks: expected an array"));
  // get: never a length the holder cannot check, never a tag outside the body tags.
  REQUIRE_THAT(refused(PeerMsg::kGet, with(get, "tag", 77)), Catch::Contains("tag: 77 is not a body tag"));
  REQUIRE_THAT(refused(PeerMsg::kGet, with(get, "length", 0)), Catch::Contains("length: 0 is not in"));
  REQUIRE_THAT(refused(PeerMsg::kGet, with(get, "length", 1.5)),
               Catch::Contains("length: expected a non-negative integer"));
  // lookup_reply: a known verdict; a fetch names its holder.
  REQUIRE_THAT(refused(PeerMsg::kLookupReply, with(all[3].second, "verdict", "steal")),
               Catch::Contains("verdict: 'steal' is not fetch, load or wait"));
  REQUIRE_THAT(refused(PeerMsg::kLookupReply, with(all[3].second, "verdict", 3)),
               Catch::Contains("verdict: expected a string"));
  REQUIRE_THAT(refused(PeerMsg::kLookupReply, with(all[3].second, "holder", "")),
               Catch::Contains("holder: a member id has 1 to 64"));
  REQUIRE_THAT(refused(PeerMsg::kLookupReply, with(all[4].second, "holder", std::string(65, 'm'))),
               Catch::Contains("holder: a string of 65 bytes"));
  // hello and its reply: hex of the right sizes.
  REQUIRE_THAT(refused(PeerMsg::kHello, with(all[0].second, "nonce", "abc")),
               Catch::Contains("nonce: expected hex digits"));
  REQUIRE_THAT(refused(PeerMsg::kHello, with(all[0].second, "nonce", std::string(30, 'a'))),
               Catch::Contains("nonce: 15 bytes (must be 16)"));
  REQUIRE_THAT(refused(PeerMsg::kHello, with(all[0].second, "address", "")),
               Catch::Contains("address: 0 bytes, too short"));
  REQUIRE_THAT(refused(PeerMsg::kHello, with(all[0].second, "address", std::string(2 * 4097, 'a'))),
               Catch::Contains("address: 4097 bytes (must be 4096 at most)"));
  REQUIRE_THAT(refused(PeerMsg::kHelloReply, with(all[1].second, "answer", std::string(62, 'c'))),
               Catch::Contains("answer: 31 bytes"));
  // loaded, get_reply, fetched, commit, bye.
  REQUIRE_THAT(refused(PeerMsg::kLoaded, with(all[10].second, "ok", "no")),
               Catch::Contains("ok: expected true or false"));
  REQUIRE_THAT(refused(PeerMsg::kGetReply, with(all[8].second, "error", "")),
               Catch::Contains("error: a string of 0 bytes"));
  REQUIRE_THAT(refused(PeerMsg::kGetReply, with(all[8].second, "error", std::string(5000, 'e'))),
               Catch::Contains("error: a string of 5000 bytes"));
  REQUIRE_THAT(refused(PeerMsg::kFetched, with(all[9].second, "holder", json::object())),
               Catch::Contains("holder: expected a string"));
  REQUIRE_THAT(refused(PeerMsg::kCommit, json{{"model", {{"id", 5}}}}),
               Catch::Contains("peer message commit: model: "));
  REQUIRE_THAT(refused(PeerMsg::kBye, json{{"why", "x"}}), Catch::Contains("unknown field 'why'"));
  // stage and its reply.
  REQUIRE_THAT(refused(PeerMsg::kStage, with(all[13].second, "model", "")),
               Catch::Contains("model: a string of 0 bytes"));
  const json& ok = all[14].second;
  REQUIRE_THAT(refused(PeerMsg::kStageReply, without(ok, "bytes")),
               Catch::Contains("ok: true needs bytes and no error"));
  REQUIRE_THAT(refused(PeerMsg::kStageReply, with(ok, "error", "x")),
               Catch::Contains("ok: true needs bytes and no error"));
  REQUIRE_THAT(refused(PeerMsg::kStageReply, without(all[15].second, "error")),
               Catch::Contains("ok: false needs an error"));
  REQUIRE_THAT(refused(PeerMsg::kStageReply, with(ok, "seconds", -1.0)),
               Catch::Contains("seconds: not a number of seconds"));
  REQUIRE_THAT(refused(PeerMsg::kStageReply, with(ok, "seconds", std::numeric_limits<double>::infinity())),
               Catch::Contains("seconds: not a number of seconds"));
  REQUIRE_THAT(refused(PeerMsg::kStageReply, with(ok, "seconds", "1")), Catch::Contains("seconds: expected a number"));
}

TEST_CASE("peer bodies: random bodies of every type are refused by name, never thrown", "[peers][bodies]") {
  std::mt19937 rng(21);
  const char* keys[] = {"req",   "chunk",  "length",  "tag",   "verdict", "holder", "chunks",
                        "nonce", "answer", "address", "error", "ok",      "bytes",  "seconds",
                        "model", "part",   "index",   "of",    "phase"};
  const json values[] = {json(nullptr),
                         json(true),
                         json(-1),
                         json(0),
                         json(1),
                         json(18446744073709551615ull),
                         json(1.5),
                         json(std::nan("")),
                         json(""),
                         json(kChunk),
                         json(kMember),
                         json("fetch"),
                         json(std::string(32, 'a')),
                         json(std::string(64, 'c')),
                         json::array(),
                         json::array({kChunk, 1}),
                         json::object(),
                         json{{"id", "x"}},
                         json(std::string(70000, 'z'))};
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    json body = json::object();
    const int n = static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) body[keys[rng() % std::size(keys)]] = values[rng() % std::size(values)];
    for (uint8_t t = 1; t <= cairn::kMaxPeerMsg; ++t) {
      cairn::Status st = cairn::check_peer_body(static_cast<PeerMsg>(t), body);
      if (st.ok())
        ++accepted;
      else
        REQUIRE(st.code() == cairn::StatusCode::kProtocol);
    }
  }
  REQUIRE(accepted > 0);  // some random bodies are valid ones (bye {}, drop with chunks [])
}

TEST_CASE("peer bodies: the fuzzers' seeds are valid messages", "[peers][bodies]") {
  // tests/fuzz/corpus/peer_bodies/<name>: a type byte (bit 7: JSON text follows) and a body
  // (tests/fuzz/fuzz_peer_bodies.cpp). Each is a body a daemon would act on.
  const std::filesystem::path dir = std::filesystem::path(CAIRN_SOURCE_DIR) / "tests/fuzz/corpus/peer_bodies";
  size_t seeds = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    INFO(e.path().filename().string());
    std::ifstream in(e.path(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.size() > 1);
    REQUIRE((bytes[0] & 0x80) != 0);
    const auto type = static_cast<PeerMsg>((bytes[0] & 0x1f) % cairn::kMaxPeerMsg + 1);
    json body = json::parse(bytes.begin() + 1, bytes.end());
    cairn::Status st = cairn::check_peer_body(type, body);
    INFO(st.to_string());
    REQUIRE(st.ok());
    ++seeds;
  }
  REQUIRE(seeds >= cairn::kMaxPeerMsg);
}
