// The bodies of the multi-part messages between members (daemon/peers/part_messages.hpp): each
// round-trips, and each decoder names what is wrong with a bad body instead of throwing.
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "daemon/peers/part_messages.hpp"

using cairn::AckOf;
using cairn::Durability;
using cairn::PartPhase;
using cairn::PeerMsg;
using nlohmann::json;

namespace {

const std::string kMember = "m0123456789abcdef";

cairn::ModelManifest part_manifest() {
  cairn::ModelManifest m;
  m.id = "run7/step1200";
  m.parent = "run7/step1100";
  m.metadata = json{{"rank", 2}};
  cairn::TensorManifest t;
  t.name = "block2.attn.weight";
  t.dtype = cairn::DType::kF32;
  t.shape = {4, 2};
  t.nbytes = 32;
  cairn::ChunkRef c;
  c.hash = cairn::hash_bytes("0123456789abcdef0123456789abcdef", 32);
  c.length = 32;
  t.chunks.push_back(c);
  m.tensors.push_back(t);
  return m;
}

cairn::PartMessage a_part() {
  cairn::PartMessage m;
  m.part = part_manifest();
  m.index = 2;
  m.of = 4;
  m.timeout_ms = 60000;
  m.durability = Durability::kLocal;
  return m;
}

// The kProtocol message of a decoder's error, checked to name the message type.
template <class R>
std::string fault(const R& r, const std::string& type) {
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == cairn::StatusCode::kProtocol);
  REQUIRE(r.status().message().rfind("peer message " + type + ": ", 0) == 0);
  return r.status().message();
}

}  // namespace

TEST_CASE("every part message round-trips", "[peers][parts]") {
  const cairn::PartMessage p = a_part();
  auto part = cairn::decode_part(cairn::encode_part(p));
  REQUIRE(part.ok());
  REQUIRE(part->part == p.part);
  REQUIRE((part->index == 2 && part->of == 4 && part->timeout_ms == 60000));
  REQUIRE(part->durability == Durability::kLocal);

  for (PartPhase phase : {PartPhase::kDelegated, PartPhase::kCheck, PartPhase::kMemory, PartPhase::kLocal,
                          PartPhase::kGlobal, PartPhase::kFailed}) {
    INFO(cairn::part_phase_name(phase));
    cairn::PartStateMessage s{"run7/step1200", phase, kMember, Durability::kLocal, {}, {}};
    if (phase == PartPhase::kFailed) {
      s.parts = {1, 3};
      s.error = cairn::unavailable("model 'run7/step1200' was not created: part 2 of 4 did not arrive");
    }
    auto back = cairn::decode_part_state(cairn::encode_part_state(s));
    REQUIRE(back.ok());
    REQUIRE(back->model == s.model);
    REQUIRE(back->phase == phase);
    if (phase == PartPhase::kDelegated) REQUIRE(back->registrar == kMember);
    if (phase == PartPhase::kMemory) REQUIRE(back->target == Durability::kLocal);
    if (phase == PartPhase::kFailed) {
      REQUIRE(back->parts == std::vector<uint32_t>{1, 3});
      REQUIRE(back->error.code() == cairn::StatusCode::kUnavailable);
      REQUIRE(back->error.message() == s.error.message());
    }
  }

  cairn::AssembleMessage a{part_manifest(), Durability::kMemory, {kMember, "m2", kMember}};
  auto assemble = cairn::decode_assemble(cairn::encode_assemble(a));
  REQUIRE(assemble.ok());
  REQUIRE(assemble->model == a.model);
  REQUIRE(assemble->part_holders == a.part_holders);
  REQUIRE(assemble->holders() == std::vector<std::string>{kMember, "m2"});

  for (AckOf what : {AckOf::kHeld, AckOf::kLocal}) {
    auto ack = cairn::decode_part_ack(cairn::encode_part_ack({"run7/step1200", what, true}));
    REQUIRE(ack.ok());
    REQUIRE((ack->model == "run7/step1200" && ack->what == what && ack->ok));
  }
}

TEST_CASE("the part decoders name each fault", "[peers][parts]") {
  const json good = cairn::encode_part(a_part());
  SECTION("part") {
    REQUIRE(fault(cairn::decode_part(json::array()), "part").find("not an object") != std::string::npos);
    json j = good;
    j.erase("of");
    REQUIRE(fault(cairn::decode_part(j), "part").find("missing field 'of'") != std::string::npos);
    j = good;
    j["extra"] = 1;
    REQUIRE(fault(cairn::decode_part(j), "part").find("unknown field 'extra'") != std::string::npos);
    j = good;
    j["index"] = 4;
    REQUIRE(fault(cairn::decode_part(j), "part").find("index: 4 is not below of (4)") != std::string::npos);
    j = good;
    j["of"] = 1;
    REQUIRE(fault(cairn::decode_part(j), "part").find("of: 1 is not in 2..65536") != std::string::npos);
    j = good;
    j["index"] = -1;
    REQUIRE(fault(cairn::decode_part(j), "part").find("index: expected a non-negative integer") != std::string::npos);
    j = good;
    j["timeout_ms"] = 0;
    REQUIRE(fault(cairn::decode_part(j), "part").find("timeout_ms") != std::string::npos);
    j = good;
    j["durability"] = "forever";
    REQUIRE(fault(cairn::decode_part(j), "part").find("durability: expected") != std::string::npos);
    j = good;
    j["part"]["tensors"][0]["nbytes"] = 33;  // dtype and shape say 32
    REQUIRE(fault(cairn::decode_part(j), "part").find("part: tensors[0]") != std::string::npos);
    j = good;
    j["part"]["id"] = "";
    REQUIRE(fault(cairn::decode_part(j), "part").find("part: ") != std::string::npos);
  }
  SECTION("part_state") {
    REQUIRE(fault(cairn::decode_part_state(json{{"model", "x"}}), "part_state").find("'phase'") != std::string::npos);
    REQUIRE(fault(cairn::decode_part_state(json{{"model", "x"}, {"phase", "done"}}), "part_state")
                .find("phase: 'done' is not one of") != std::string::npos);
    REQUIRE(fault(cairn::decode_part_state(json{{"model", "x"}, {"phase", "delegated"}}), "part_state")
                .find("missing field 'registrar'") != std::string::npos);
    REQUIRE(fault(cairn::decode_part_state(
                      json{{"model", "x"}, {"phase", "delegated"}, {"registrar", std::string(65, 'm')}}),
                  "part_state")
                .find("registrar: a member id has 1 to 64 bytes") != std::string::npos);
    REQUIRE(fault(cairn::decode_part_state(json{{"model", 7}, {"phase", "global"}}), "part_state")
                .find("model: expected a model id") != std::string::npos);
    json failed{{"model", "x"}, {"phase", "failed"}, {"code", 0}, {"error", "why"}};
    REQUIRE(fault(cairn::decode_part_state(failed), "part_state").find("code: 0 is not in") != std::string::npos);
    failed["code"] = 999;
    REQUIRE(fault(cairn::decode_part_state(failed), "part_state").find("code: 999 is not a status code") !=
            std::string::npos);
    failed["code"] = 7;
    failed["error"] = "";
    REQUIRE(fault(cairn::decode_part_state(failed), "part_state").find("error: expected a message") !=
            std::string::npos);
    failed["error"] = "why";
    failed["parts"] = json::array({1, "two"});
    REQUIRE(fault(cairn::decode_part_state(failed), "part_state").find("parts: each entry") != std::string::npos);
    failed["parts"] = json::array();
    REQUIRE(fault(cairn::decode_part_state(failed), "part_state").find("parts: expected 1 to") != std::string::npos);
    REQUIRE(fault(cairn::decode_part_state(json{{"model", "x"}, {"phase", "local"}, {"registrar", "m"}}), "part_state")
                .find("unknown field 'registrar'") != std::string::npos);
  }
  SECTION("assemble") {
    json a = cairn::encode_assemble({part_manifest(), Durability::kGlobal, {kMember, kMember}});
    a["part_holders"] = json::array({kMember});
    REQUIRE(fault(cairn::decode_assemble(a), "assemble").find("part_holders: expected 2 to") != std::string::npos);
    a["part_holders"] = json::array({kMember, 5});
    REQUIRE(fault(cairn::decode_assemble(a), "assemble").find("part_holders[1]: expected a member id") !=
            std::string::npos);
    a["part_holders"] = json::array({kMember, ""});
    REQUIRE(fault(cairn::decode_assemble(a), "assemble").find("part_holders[1]: a member id has") != std::string::npos);
    a["part_holders"] = json::array({kMember, kMember});
    a["model"] = json::object();
    REQUIRE(fault(cairn::decode_assemble(a), "assemble").find("model: ") != std::string::npos);
  }
  SECTION("part_ack") {
    REQUIRE(fault(cairn::decode_part_ack(json{{"model", "x"}, {"what", "done"}, {"ok", true}}), "part_ack")
                .find("what: expected \"held\" or \"local\"") != std::string::npos);
    REQUIRE(fault(cairn::decode_part_ack(json{{"model", "x"}, {"what", "held"}, {"ok", 1}}), "part_ack")
                .find("ok: expected true or false") != std::string::npos);
    REQUIRE(
        fault(cairn::decode_part_ack(json{{"model", "x"}, {"what", "held"}}), "part_ack").find("missing field 'ok'") !=
        std::string::npos);
  }
}

TEST_CASE("check_part_body accepts the encodings and refuses random bodies without throwing", "[peers][parts]") {
  REQUIRE(cairn::check_part_body(PeerMsg::kPart, cairn::encode_part(a_part())).ok());
  REQUIRE(cairn::check_part_body(PeerMsg::kPartAck, cairn::encode_part_ack({"x", AckOf::kLocal, false})).ok());
  REQUIRE(cairn::check_part_body(PeerMsg::kHello, json::array()).ok());  // not a part message
  // Random JSON of the shapes a body could have: every outcome is OK or kProtocol, never a throw.
  std::mt19937_64 rng(42);
  const json values[] = {json(),
                         json(true),
                         json(-1),
                         json(7),
                         json(1.5),
                         json("x"),
                         json(std::string(80, 'm')),
                         json::array(),
                         json::array({1, 2}),
                         json::object(),
                         cairn::manifest_to_json(part_manifest())};
  const char* keys[] = {"part",      "index", "of",    "timeout_ms", "durability",   "model", "phase",
                        "registrar", "code",  "error", "parts",      "part_holders", "what",  "ok"};
  for (int i = 0; i < 20000; ++i) {
    json body = json::object();
    const int n = static_cast<int>(rng() % 7);
    for (int k = 0; k < n; ++k) body[keys[rng() % std::size(keys)]] = values[rng() % std::size(values)];
    if (rng() % 3 == 0) body["phase"] = cairn::part_phase_name(static_cast<PartPhase>(rng() % 6));
    if (rng() % 3 == 0) body["durability"] = "global";
    for (PeerMsg t : {PeerMsg::kPart, PeerMsg::kPartState, PeerMsg::kAssemble, PeerMsg::kPartAck}) {
      cairn::Status st = cairn::check_part_body(t, body);
      if (!st.ok()) REQUIRE(st.code() == cairn::StatusCode::kProtocol);
    }
  }
}

TEST_CASE("the fuzzer's seeds of the part messages decode and pass check_part_body", "[peers][parts]") {
  // tests/fuzz/corpus/peer_wire/<name>: a mode byte (0: as it is) and a frame signed with the
  // fuzzer's secret (tests/fuzz/fuzz_peer_wire.cpp).
  const std::string secret = "cairn-fuzz-peer-wire-secret";
  for (const char* name : {"part", "part_state", "part_state_memory", "assemble", "part_ack"}) {
    INFO(name);
    std::ifstream in(std::string(CAIRN_SOURCE_DIR) + "/tests/fuzz/corpus/peer_wire/" + name, std::ios::binary);
    REQUIRE(in.good());
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.size() > 1);
    REQUIRE(bytes[0] == 0);
    auto m = cairn::decode_peer_message(std::span<const uint8_t>(bytes.data() + 1, bytes.size() - 1), secret);
    REQUIRE(m.ok());
    REQUIRE(cairn::is_part_message(m->type));
    cairn::Status st = cairn::check_part_body(m->type, m->body);
    INFO(st.to_string());
    REQUIRE(st.ok());
  }
}
