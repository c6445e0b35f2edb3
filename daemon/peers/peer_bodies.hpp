// The bodies of the peer messages other than the multi-part ones (those are in part_messages.hpp):
// a typed form of each and a strict decoder, which the message handlers (peer_messages.cpp,
// peer_stage.cpp) run before they act on a body.
//
// A frame that reaches a decoder passed its MAC (only a member of the job can make one), but that
// member may run another release or be buggy: each decoder checks every field (type, range, hex,
// a known verdict, no unknown field) and returns kProtocol naming the message and the field
// ("peer message lookup: chunk: expected a chunk hash (32 hex digits)"). Decoders never throw,
// whatever the JSON holds (tests/fuzz/fuzz_peer_bodies.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/hash.hpp"
#include "core/status.hpp"
#include "daemon/peers/directory.hpp"
#include "daemon/peers/peer_wire.hpp"
#include "tiers/pfs/manifest.hpp"

namespace cairn {

inline constexpr size_t kHelloNonceBytes = 16;
inline constexpr size_t kMaxPublishedAddressBytes = 4096;

struct HelloBody {      // hello {nonce, address}
  std::string nonce;    // raw, kHelloNonceBytes
  std::string address;  // raw published address (both endpoints'), 3..kMaxPublishedAddressBytes
};
struct HelloReplyBody {  // hello_reply {nonce, answer}
  std::string nonce;     // raw, kHelloNonceBytes
  std::string answer;    // raw HMAC-SHA256, 32 bytes
};
struct LookupBody {  // lookup {req, chunk, length}
  uint64_t req = 0;
  ChunkHash chunk;
  uint64_t length = 0;
};
struct LookupReplyBody {  // lookup_reply {req, verdict, holder, chunk?}
  uint64_t req = 0;
  ChunkDirectory::Verdict verdict = ChunkDirectory::Verdict::kLoad;
  std::string holder;              // a member id for kFetch; may be empty otherwise
  std::optional<ChunkHash> chunk;  // absent in the "not verified yet" answer
};
struct ChunksBody {  // have / drop {chunks}
  std::vector<ChunkHash> chunks;
};
struct GetBody {  // get {req, chunk, length, tag}
  uint64_t req = 0;
  ChunkHash chunk;
  uint64_t length = 0;
  uint64_t tag = 0;  // has Fabric::kBodyTagBit
};
struct GetReplyBody {  // get_reply {req, error}
  uint64_t req = 0;
  std::string error;
};
struct FetchedBody {  // fetched {chunk, holder}
  ChunkHash chunk;
  std::string holder;
};
struct LoadedBody {  // loaded {chunk, ok}
  ChunkHash chunk;
  bool ok = false;
};
struct StageBody {  // stage {req, model}
  uint64_t req = 0;
  std::string model;
};
struct StageReplyBody {  // stage_reply {req, ok, seconds, bytes? (ok), error? (not ok)}
  uint64_t req = 0;
  bool ok = false;
  uint64_t bytes = 0;
  double seconds = 0;
  std::string error;
};

Result<HelloBody> decode_hello(const nlohmann::json& body);
Result<HelloReplyBody> decode_hello_reply(const nlohmann::json& body);
Result<LookupBody> decode_lookup(const nlohmann::json& body);
Result<LookupReplyBody> decode_lookup_reply(const nlohmann::json& body);
// have or drop (type names the message in errors).
Result<ChunksBody> decode_chunks(PeerMsg type, const nlohmann::json& body);
Result<GetBody> decode_get(const nlohmann::json& body);
Result<GetReplyBody> decode_get_reply(const nlohmann::json& body);
Result<FetchedBody> decode_fetched(const nlohmann::json& body);
Result<LoadedBody> decode_loaded(const nlohmann::json& body);
// commit {model}: the manifest, without repository locations.
Result<ModelManifest> decode_commit(const nlohmann::json& body);
Result<StageBody> decode_stage(const nlohmann::json& body);
Result<StageReplyBody> decode_stage_reply(const nlohmann::json& body);
// bye {}: no field.
Status decode_bye(const nlohmann::json& body);

// Runs the decoder of a message of any type on a body (the fuzzer's and the tests' entry point;
// the multi-part ones through check_part_body). OK or the decoder's kProtocol error.
Status check_peer_body(PeerMsg type, const nlohmann::json& body);

}  // namespace cairn
