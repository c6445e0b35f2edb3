// The bodies of the peer messages (peer_bodies.hpp).
#include "daemon/peers/peer_bodies.hpp"

#include "daemon/peers/body_fields.hpp"
#include "daemon/peers/part_messages.hpp"
#include "tiers/peer/fabric.hpp"

namespace cairn {

using json = nlohmann::json;

namespace {

constexpr size_t kMacBytes = 32;

}  // namespace

Result<HelloBody> decode_hello(const json& j) {
  Body b("hello", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"nonce", "address"}));
  HelloBody m;
  CAIRN_ASSIGN_OR_RETURN(m.nonce, b.hex_bytes("nonce", kHelloNonceBytes));
  CAIRN_ASSIGN_OR_RETURN(m.address, b.hex_bytes("address", 0, kMaxPublishedAddressBytes));
  if (m.address.size() < 3) return b.fault("address: " + std::to_string(m.address.size()) + " bytes, too short");
  return m;
}

Result<HelloReplyBody> decode_hello_reply(const json& j) {
  Body b("hello_reply", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"nonce", "answer"}));
  HelloReplyBody m;
  CAIRN_ASSIGN_OR_RETURN(m.nonce, b.hex_bytes("nonce", kHelloNonceBytes));
  CAIRN_ASSIGN_OR_RETURN(m.answer, b.hex_bytes("answer", kMacBytes));
  return m;
}

Result<LookupBody> decode_lookup(const json& j) {
  Body b("lookup", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"req", "chunk", "length"}));
  LookupBody m;
  CAIRN_ASSIGN_OR_RETURN(m.req, b.u64("req"));
  CAIRN_ASSIGN_OR_RETURN(m.chunk, b.chunk("chunk"));
  CAIRN_ASSIGN_OR_RETURN(m.length, b.u64("length", 1));
  return m;
}

Result<LookupReplyBody> decode_lookup_reply(const json& j) {
  Body b("lookup_reply", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"req", "verdict", "holder"}, {"chunk"}));
  LookupReplyBody m;
  CAIRN_ASSIGN_OR_RETURN(m.req, b.u64("req"));
  CAIRN_ASSIGN_OR_RETURN(std::string verdict, b.text("verdict", 16));
  if (verdict == "fetch")
    m.verdict = ChunkDirectory::Verdict::kFetch;
  else if (verdict == "load")
    m.verdict = ChunkDirectory::Verdict::kLoad;
  else if (verdict == "wait")
    m.verdict = ChunkDirectory::Verdict::kWait;
  else
    return b.fault("verdict: '" + verdict + "' is not fetch, load or wait");
  if (m.verdict == ChunkDirectory::Verdict::kFetch) {
    CAIRN_ASSIGN_OR_RETURN(m.holder, b.member("holder"));
  } else {
    CAIRN_ASSIGN_OR_RETURN(m.holder, b.text("holder", kMaxMemberIdBytes));
  }
  if (b.has("chunk")) {
    CAIRN_ASSIGN_OR_RETURN(m.chunk, b.chunk("chunk"));
  }
  return m;
}

Result<ChunksBody> decode_chunks(PeerMsg type, const json& j) {
  Body b(type == PeerMsg::kDrop ? "drop" : "have", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"chunks"}));
  const json& list = b.at("chunks");
  if (!list.is_array()) return b.fault(std::string("chunks: expected an array, got a ") + list.type_name());
  ChunksBody m;
  m.chunks.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    CAIRN_ASSIGN_OR_RETURN(ChunkHash h, b.chunk(list[i], "chunks[" + std::to_string(i) + "]"));
    m.chunks.push_back(h);
  }
  return m;
}

Result<GetBody> decode_get(const json& j) {
  Body b("get", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"req", "chunk", "length", "tag"}));
  GetBody m;
  CAIRN_ASSIGN_OR_RETURN(m.req, b.u64("req"));
  CAIRN_ASSIGN_OR_RETURN(m.chunk, b.chunk("chunk"));
  CAIRN_ASSIGN_OR_RETURN(m.length, b.u64("length", 1));
  CAIRN_ASSIGN_OR_RETURN(m.tag, b.u64("tag"));
  if (!(m.tag & Fabric::kBodyTagBit)) return b.fault("tag: " + std::to_string(m.tag) + " is not a body tag");
  return m;
}

Result<GetReplyBody> decode_get_reply(const json& j) {
  Body b("get_reply", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"req", "error"}));
  GetReplyBody m;
  CAIRN_ASSIGN_OR_RETURN(m.req, b.u64("req"));
  CAIRN_ASSIGN_OR_RETURN(m.error, b.text("error", kMaxErrorBytes, /*nonempty=*/true));
  return m;
}

Result<FetchedBody> decode_fetched(const json& j) {
  Body b("fetched", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"chunk", "holder"}));
  FetchedBody m;
  CAIRN_ASSIGN_OR_RETURN(m.chunk, b.chunk("chunk"));
  // "" when the reader was told to fetch from nobody (a lookup_reply that came too late).
  CAIRN_ASSIGN_OR_RETURN(m.holder, b.text("holder", kMaxMemberIdBytes));
  return m;
}

Result<LoadedBody> decode_loaded(const json& j) {
  Body b("loaded", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"chunk", "ok"}));
  LoadedBody m;
  CAIRN_ASSIGN_OR_RETURN(m.chunk, b.chunk("chunk"));
  CAIRN_ASSIGN_OR_RETURN(m.ok, b.boolean("ok"));
  return m;
}

Result<ModelManifest> decode_commit(const json& j) {
  Body b("commit", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"model"}));
  return b.manifest("model");
}

Result<StageBody> decode_stage(const json& j) {
  Body b("stage", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"req", "model"}));
  StageBody m;
  CAIRN_ASSIGN_OR_RETURN(m.req, b.u64("req"));
  CAIRN_ASSIGN_OR_RETURN(m.model, b.text("model", 4096, /*nonempty=*/true));
  return m;
}

Result<StageReplyBody> decode_stage_reply(const json& j) {
  Body b("stage_reply", j);
  CAIRN_RETURN_IF_ERROR(b.fields({"req", "ok", "seconds"}, {"bytes", "error"}));
  StageReplyBody m;
  CAIRN_ASSIGN_OR_RETURN(m.req, b.u64("req"));
  CAIRN_ASSIGN_OR_RETURN(m.ok, b.boolean("ok"));
  CAIRN_ASSIGN_OR_RETURN(m.seconds, b.seconds("seconds"));
  if (m.ok) {
    if (!b.has("bytes") || b.has("error")) return b.fault("ok: true needs bytes and no error");
    CAIRN_ASSIGN_OR_RETURN(m.bytes, b.u64("bytes"));
  } else {
    if (!b.has("error") || b.has("bytes")) return b.fault("ok: false needs an error and no bytes");
    CAIRN_ASSIGN_OR_RETURN(m.error, b.text("error", kMaxErrorBytes, /*nonempty=*/true));
  }
  return m;
}

Status decode_bye(const json& j) { return Body("bye", j).fields({}); }

Status check_peer_body(PeerMsg type, const json& body) {
  switch (type) {
    case PeerMsg::kHello:
      return decode_hello(body).status();
    case PeerMsg::kHelloReply:
      return decode_hello_reply(body).status();
    case PeerMsg::kLookup:
      return decode_lookup(body).status();
    case PeerMsg::kLookupReply:
      return decode_lookup_reply(body).status();
    case PeerMsg::kHave:
    case PeerMsg::kDrop:
      return decode_chunks(type, body).status();
    case PeerMsg::kGet:
      return decode_get(body).status();
    case PeerMsg::kGetReply:
      return decode_get_reply(body).status();
    case PeerMsg::kFetched:
      return decode_fetched(body).status();
    case PeerMsg::kLoaded:
      return decode_loaded(body).status();
    case PeerMsg::kCommit:
      return decode_commit(body).status();
    case PeerMsg::kBye:
      return decode_bye(body);
    case PeerMsg::kStage:
      return decode_stage(body).status();
    case PeerMsg::kStageReply:
      return decode_stage_reply(body).status();
    case PeerMsg::kPart:
    case PeerMsg::kPartState:
    case PeerMsg::kAssemble:
    case PeerMsg::kPartAck:
      return check_part_body(type, body);
  }
  return protocol_error("peer message: unknown type " + std::to_string(static_cast<int>(type)));
}

}  // namespace cairn
