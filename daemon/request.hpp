// Requests, decoded once at the edge. The engine's dispatch table (engine.cpp) decodes each
// request's JSON into the op's struct here, calls the component with it, and encodes the typed
// reply; components never see the wire format of the ops below. Every decoding error names the op
// and the field (or the model and tensor), so a client learns exactly what was wrong with what it
// sent. docs/protocol.md documents each op's fields.
//
// The field getters (get_string ...) serve the ops whose components still read their request's
// JSON themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/durability.hpp"
#include "core/graph.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"

namespace cairn {
struct ModelManifest;
}

namespace cairn::request {

// A required string field.
Result<std::string> get_string(const nlohmann::json& req, const char* field);
// A required string field that must be a valid name (core/dtype.hpp valid_name); `what` names it
// in the error ("a model id").
Result<std::string> get_name(const nlohmann::json& req, const char* field, const char* what);
// A required non-negative integer field.
Result<uint64_t> get_u64(const nlohmann::json& req, const char* field);
// An optional integer field; dflt when absent or not an integer.
int64_t get_i64_or(const nlohmann::json& req, const char* field, int64_t dflt);

// A tensor's dtype and shape as a request gives them ("dtype", "shape"), and the bytes they need.
struct TensorDesc {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};
// `what` names the tensor in errors ("model 'a', tensor 'w'").
Result<TensorDesc> get_tensor_desc(const nlohmann::json& j, const std::string& what);

nlohmann::json shape_json(const std::vector<int64_t>& shape);

// ---- staging space and commits (CommitPath) ----

// `allocate`: arena space for a tensor the client writes in place.
struct Allocate {
  uint64_t nbytes = 0;
};
struct AllocateReply {
  uint64_t space = 0;   // the connection's id for the space
  uint64_t offset = 0;  // where it starts in the arena
};

// `free`: gives back a staging space the client will not commit.
struct Free {
  uint64_t space = 0;
};

// One tensor of a commit, as the client names its bytes.
struct CommitTensor {
  enum class Source { kSpace, kInline, kInherit };
  std::string name;
  Source source = Source::kSpace;
  TensorDesc desc{DType::kU8, {}, 0};  // kSpace and kInline (kInherit: the parent's)
  uint64_t space = 0;                  // kSpace: the connection's staging space
  uint64_t inline_offset = 0;          // kInline: [inline_offset, +inline_length) of the frame's
  uint64_t inline_length = 0;          // payload (checked against it by the commit path)
  std::vector<ChunkHash> hashes;       // kSpace: the chunk hashes the client computed (empty: none)
};

// A part of a multi-part model (daemon/commit_parts.cpp).
inline constexpr uint64_t kDefaultPartTimeoutMs = 60000;  // when the part names none
struct Part {
  uint32_t index = 0;
  uint32_t of = 0;
  uint64_t timeout_ms = 0;
};

// `commit`: a model from tensors in staging spaces, inline bytes and the parent's tensors.
struct Commit {
  std::string id;
  std::string parent;  // "" = none
  Durability durability = Durability::kGlobal;
  bool wait = true;         // reply once `durability` is reached
  bool want_ticket = true;  // false: a commit that does not wait keeps no ticket
  nlohmann::json metadata = nlohmann::json::object();
  nlohmann::json architecture;        // null when none was given
  std::optional<Graph> graph;         // `architecture`, parsed
  std::vector<CommitTensor> tensors;  // names unique
  bool inherit_all = false;           // every parent tensor not named, after the named ones
  std::string source_header;          // the safetensors header the model was stored from ("" = none)
  std::optional<Part> part;           // one part of a multi-part model
};
struct CommitReply {
  std::string id;
  std::optional<Durability> reached;  // the level reached (a commit that waited, or memory)
  uint64_t ticket = 0;                // 0: none (waited, or no ticket asked for)
  std::optional<Part> part;           // a part's index and count
  bool assembled = false;             // a part: it completed the model
};

// `wait`: until the ticket's commit reached its durability.
struct Wait {
  uint64_t ticket = 0;
  int64_t timeout_ms = -1;  // negative: forever
};
struct WaitReply {
  Durability reached = Durability::kMemory;
};

// What decoding a request needs to know besides its JSON.
struct Edge {
  uint64_t chunk_size = 0;  // the repository's: the number of client chunk hashes per tensor
};

Result<Allocate> decode_allocate(const nlohmann::json& req);
Result<Free> decode_free(const nlohmann::json& req);
Result<Commit> decode_commit(const nlohmann::json& req, const Edge& edge);
Result<Wait> decode_wait(const nlohmann::json& req);
nlohmann::json encode(const AllocateReply& r);
nlohmann::json encode(const CommitReply& r);
nlohmann::json encode(const WaitReply& r);

// ---- reads (Reads) ----

// `open`: a model's tensors and metadata.
struct Open {
  std::string id;
  bool with_source_header = false;
};
// The model as it is registered; the reply names its tensors (no chunk locations).
struct OpenReply {
  std::shared_ptr<const ModelManifest> model;
  bool with_source_header = false;
};

// `lease` and `lease_device`: tensors pinned for the client, by name, in order.
struct Lease {
  std::string id;
  std::vector<std::string> tensors;
  bool contiguous = false;    // `lease`: one extent per tensor (assembled when scattered)
  std::optional<int> device;  // `lease_device`: the HBM device (absent: the first)
};
struct LeaseReply {
  struct Granted {
    uint64_t lease = 0;
    std::vector<std::pair<uint64_t, uint64_t>> extents;  // (arena offset, length), in order
    uint64_t nbytes = 0;
  };
  std::vector<Granted> leases;
  int64_t created_ns = 0;  // the model's commit stamp
};

struct LeaseDeviceReply {
  struct Granted {
    uint64_t lease = 0;
    int device = 0;
    std::string handle;  // the slab's handle the client maps
    uint64_t slab_bytes = 0;
    uint64_t offset = 0;  // in the slab
    uint64_t nbytes = 0;
    bool hit = false;  // was resident on the device
  };
  std::vector<Granted> leases;
  int64_t created_ns = 0;
  std::string backend;  // the HBM tier's backend (cuda, emulated)
};

// `release`: leases the client is done with (unknown ids are ignored). Also the `release` field
// any request may carry.
struct Release {
  std::vector<uint64_t> leases;
};

// `prefetch`: a model's chunks into DRAM (or the HBM tier), nothing left pinned; with `all`, into
// every member's of the peer group.
struct Prefetch {
  enum class Tier { kDram, kHbm };
  std::string id;
  Tier tier = Tier::kDram;
  std::optional<int> device;  // kHbm
  bool all = false;
  std::optional<uint64_t> timeout_ms;  // all: how long to wait for the other members
};
struct PrefetchReply {
  uint64_t bytes = 0;
  std::optional<int> device;  // into the HBM tier of this device
};

Result<Open> decode_open(const nlohmann::json& req);
Result<Lease> decode_lease(const nlohmann::json& req);
Result<Lease> decode_lease_device(const nlohmann::json& req);
// `leases` is the request's "leases" field (or the "release" field of another request).
Result<Release> decode_release(const nlohmann::json* leases);
Result<Prefetch> decode_prefetch(const nlohmann::json& req);
nlohmann::json encode(const OpenReply& r);
nlohmann::json encode(const LeaseReply& r);
nlohmann::json encode(const LeaseDeviceReply& r);
nlohmann::json encode(const PrefetchReply& r);

// ---- named tensors (NamedTensors) ----

// `put_tensor`: a tensor under a key, from a staging space or the frame's payload.
struct PutTensor {
  std::string key;
  TensorDesc desc{DType::kU8, {}, 0};
  std::optional<uint64_t> space;  // absent: the payload holds the bytes
};
// `tensor_info`, `lease_tensor`, `delete_tensor`: the tensor under a key.
struct TensorKey {
  std::string key;
};
// `poll_tensor`: until a tensor is under the key.
struct PollTensor {
  std::string key;
  int64_t timeout_ms = 0;  // negative: forever
};
struct TensorInfoReply {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};
struct TensorLeaseReply {
  uint64_t lease = 0;
  uint64_t offset = 0;  // in the arena
  TensorInfoReply info;
};
struct PollTensorReply {
  bool found = false;
};

Result<PutTensor> decode_put_tensor(const nlohmann::json& req);
Result<TensorKey> decode_tensor_key(const nlohmann::json& req);
Result<PollTensor> decode_poll_tensor(const nlohmann::json& req);
nlohmann::json encode(const TensorInfoReply& r);
nlohmann::json encode(const TensorLeaseReply& r);
nlohmann::json encode(const PollTensorReply& r);

// ---- the repository watch (RepositoryWatch) ----

// `sync`'s reply: what reading the other daemons' records changed.
struct SyncReply {
  uint64_t added = 0;
  uint64_t removed = 0;
  uint64_t retired = 0;
  bool reloaded = false;  // rebuilt from a checkpoint (the logs were compacted)
  uint64_t models = 0;    // in the repository now
};
nlohmann::json encode(const SyncReply& r);

}  // namespace cairn::request
