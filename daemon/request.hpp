// Requests, decoded once at the edge. The engine's dispatch table (engine.cpp) decodes each
// request's JSON into the op's struct here, calls the component with it, and encodes the reply;
// components never see a request's wire format. Every decoding error names the op and the field
// (or the model and tensor), so a client learns exactly what was wrong with what it sent.
// docs/protocol.md documents each op's fields.
//
// The ops without request fields (hello, ping, stats, peers, compute) have no struct: their
// components take none. The administration ops' replies (list, show, stats, gc, fsck, flush, ...)
// are built as JSON by their components, as docs/protocol.md lists their fields.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/durability.hpp"
#include "core/fs.hpp"
#include "core/graph.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"
#include "daemon/catalog.hpp"
#include "daemon/hints.hpp"

namespace cairn {
struct ModelManifest;
}

namespace cairn::request {

// A tensor's dtype and shape as a request gives them ("dtype", "shape"), and the bytes they need.
struct TensorDesc {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// A shape as JSON (an array of integers), as replies give it.
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

// The optional field "progress" of the long requests (gc, fsck, flush, sync, prefetch): the
// client's token for the request's progress (daemon/progress_board.hpp), a valid name. Absent: the
// progress is published nowhere.
using ProgressToken = std::optional<std::string>;

// `prefetch`: a model's chunks into DRAM (or the HBM tier), nothing left pinned; with `all`, into
// every member's of the peer group.
struct Prefetch {
  enum class Tier { kDram, kHbm };
  std::string id;
  Tier tier = Tier::kDram;
  std::optional<int> device;  // kHbm
  bool all = false;
  std::optional<uint64_t> timeout_ms;  // all: how long to wait for the other members
  ProgressToken progress;
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

// ---- administration (Admin), progress (ProgressBoard), fault injection, queries, hints ----

// `list`: the models, live ones only unless `all`.
struct List {
  bool all = false;
};
// `show` and `remove`: one model.
struct ModelId {
  std::string id;
};
// `gc` and `sync`: long requests with no field but their progress token.
struct Tracked {
  ProgressToken progress;
};
// `fsck` and `flush`: the other long maintenance requests.
struct Fsck {
  bool verify = true;  // read and hash every referenced chunk (false: check references only)
  ProgressToken progress;
};
struct Flush {
  int64_t timeout_ms = -1;  // negative: forever
  ProgressToken progress;
};
// `progress`: the progress of the request running under a token.
struct ProgressQuery {
  std::string id;  // the token
};

// `fault`: adds a rule to the fault injector (with its rule), lists or clears them.
struct Fault {
  enum class Action { kAdd, kList, kClear };
  Action action = Action::kList;
  std::optional<FaultyFileSystem::Rule> rule;  // kAdd
};

// `query`: a catalog query (docs/catalog.md), each op with the fields it uses.
struct Query {
  enum class Op { kBestAncestor, kAncestors, kDescendants, kLca, kPath, kTree, kFind };
  Op op = Op::kAncestors;
  std::string model;                       // ancestors, descendants, tree
  int depth = -1;                          // ancestors, descendants: generations (-1: all)
  std::string a, b;                        // lca: the two models ("models")
  std::string from, to;                    // path
  std::optional<Graph> graph;              // best_ancestor: the architecture to match
  MetadataFilter where;                    // best_ancestor, find: only models whose metadata match
  std::vector<std::string> contains_path;  // find: layer types, in path order (not empty)
  size_t limit = 1000;                     // find: models at most
};
const char* query_op_name(Query::Op op);

Result<List> decode_list(const nlohmann::json& req);
Result<ModelId> decode_model_id(const nlohmann::json& req);
Result<Tracked> decode_tracked(const nlohmann::json& req);
Result<Fsck> decode_fsck(const nlohmann::json& req);
Result<Flush> decode_flush(const nlohmann::json& req);
Result<ProgressQuery> decode_progress(const nlohmann::json& req);
Result<Fault> decode_fault(const nlohmann::json& req);
Result<Query> decode_query(const nlohmann::json& req);
// `hint`: the request's "hint" object, parsed (daemon/hints.hpp; errors name the field).
Result<Hint> decode_hint(const nlohmann::json& req);

}  // namespace cairn::request
