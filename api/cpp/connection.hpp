// The implementation of libcairn behind the C API (api/c/cairn_c*.cpp): a connection to the
// node's cairnd (Connection), and the writers (ConnectionWriter) and readers (ConnectionReader) of
// models on it. It is not installed and is no client API: programs, the `cairn` tool, the
// benchmarks and the examples use the public interfaces, include/cairn/cairn.h and
// include/cairn/client.hpp (cairn::v1), over libcairn.so. Only api/ and the white-box unit test of
// this code (tests/unit/daemon/test_pipeline.cpp) include it (scripts/check-layers).
//
// Data path: at connect the client receives the daemon's DRAM arena (a memfd) and maps it. Large
// tensors are written straight into arena space the daemon hands out (allocate → fill → commit) and
// read from leased extents of the arena, without a copy (map) or with one (read). Small tensors
// travel inline in the request.
//
// Thread-safety: a Connection is used by one thread at a time. Readers and writers belong to their
// client and must not outlive it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.hpp"
#include "core/durability.hpp"
#include "core/hash.hpp"
#include "core/hash_queue.hpp"
#include "core/status.hpp"
#include "tiers/dram/arena.hpp"
#include "tiers/hbm/device.hpp"

namespace cairn {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

// Tensors up to this size travel inline in the request; larger ones go through the arena.
inline constexpr uint64_t kInlineLimit = 64 * 1024;

// What the client knows of one commit made with ConnectionWriter::commit_async. A pipelined commit (at
// durability memory) is sent without waiting for its reply: its ticket resolves when the client
// collects that reply (on its next request that needs a reply, on Connection::wait of any ticket, on
// Connection::flush_pipeline, or when the connection ends). A commit answered before commit_async
// returned is resolved at once. See docs/protocol.md, "Pipelined commits".
struct CommitTicket {
  std::string id;                           // the model
  Durability target = Durability::kMemory;  // the durability asked for
  bool pipelined = false;                   // sent without waiting for the reply
  bool resolved = false;                    // the reply is in (status says how it went)
  Status status;                            // the commit's outcome, then (after a wait) the durability's
  uint64_t daemon_ticket = 0;               // the daemon's ticket for a level above memory (0: none left)
};
using Ticket = std::shared_ptr<CommitTicket>;

class Connection {
 public:
  // address "" = wire::default_socket_path() ($CAIRN_SOCKET, then the default). kUnavailable names the path when
  // nothing listens.
  static Result<std::unique_ptr<Connection>> connect(const std::string& address);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // One request/response exchange. The response's status becomes the Status. Replies of pipelined
  // requests sent before it are collected first (in order).
  Result<nlohmann::json> call(const nlohmann::json& request, std::span<const uint8_t> blob = {});

  // Pipelining. Sends a request without waiting for its reply; on_reply gets the reply (or the
  // error it carries, or kUnavailable when the connection is lost first) when it is collected, in
  // request order. on_reply must not call back into the client. At most kMaxInFlight requests are
  // in flight: sending one more first collects the oldest reply. kUnavailable if the request could
  // not be sent (on_reply is then not called).
  static constexpr size_t kMaxInFlight = 256;
  using ReplyHandler = std::function<void(Result<nlohmann::json>)>;
  Status send_pipelined(const nlohmann::json& request, std::span<const uint8_t> blob, ReplyHandler on_reply);
  // Collects every outstanding reply (each resolves its ticket). Returns the first error of a
  // pipelined commit whose ticket was dropped before its reply came (so that no error is lost;
  // errors of tickets still held stay on them), or kUnavailable when the connection was lost.
  Status flush_pipeline();
  size_t in_flight() const { return in_flight_.size(); }
  // Waits up to timeout_ms (-1: forever) for a commit_async ticket: its reply if not in yet, then
  // the daemon's ticket (a durability above memory). kTimeout leaves the ticket to wait again.
  Status wait(const Ticket& ticket, int timeout_ms);

  // Named tensors.
  Status put_tensor(const std::string& key, const void* data, DType dtype, const std::vector<int64_t>& shape);
  Result<TensorInfo> tensor_info(const std::string& key);
  Status unpack_tensor(const std::string& key, void* dst, uint64_t dst_bytes);
  // One round trip whatever the tensor: `buffer` is called with its description and returns where
  // to copy its bytes (nbytes of them), or an error that the call then returns.
  Status unpack_tensor_to(const std::string& key, const std::function<Result<void*>(const TensorInfo&)>& buffer);
  Result<bool> poll_tensor(const std::string& key, int timeout_ms);
  Status delete_tensor(const std::string& key);

  // Arena space for writing nbytes: (space id, writable pointer). Freed by commit or free_space.
  struct Space {
    uint64_t id = 0;
    uint8_t* data = nullptr;
    uint64_t nbytes = 0;
  };
  Result<Space> allocate(uint64_t nbytes);
  // Spaces for every size at once: the requests are pipelined, so a many-tensor model pays one
  // round trip instead of one per tensor. All or nothing (the spaces of a failed call are freed).
  Result<std::vector<Space>> allocate_many(const std::vector<uint64_t>& sizes);
  Status free_space(uint64_t id);
  Status release(const std::vector<uint64_t>& leases);
  // Releases a lease with the next request instead of a round trip of its own (the chunks stay
  // pinned until then, or until the connection ends).
  void release_later(uint64_t lease) { deferred_release_.push_back(lease); }

  Status wait(uint64_t ticket, int timeout_ms);
  Status prefetch(const std::string& id);
  // Into every peer group member's DRAM at once; the daemon's report (cairn.h, cairn_prefetch_all).
  Result<nlohmann::json> prefetch_all(const std::string& id);
  Result<nlohmann::json> query(const nlohmann::json& q);
  // Sends a hint (docs/policy.md); the daemon's answer.
  Result<nlohmann::json> hint(const nlohmann::json& h);

  // Device memory (docs/gpu.md). The daemon's HBM tier as it said in hello: its backend ("" when it
  // has none) and devices.
  const std::string& hbm_backend() const { return hbm_backend_; }
  const std::vector<int>& hbm_devices() const { return hbm_devices_; }
  // How this process copies to and from device memory for `what` (named in errors): the daemon's
  // device backend when it has an HBM tier, else CUDA when this library has it and a GPU is
  // visible. kUnavailable naming both reasons otherwise.
  Result<hbm::DeviceMapper*> device_path(const std::string& what);
  // A slab the daemon exported (lease_device's handle), mapped once per connection and closed when
  // the client is destroyed.
  Result<uint8_t*> map_slab(const std::string& handle, uint64_t size);
  // Copies n bytes between device memory and the arena at offset arena_off (to_device: from the
  // read-only view to dev_ptr; else from dev_ptr into the read-write view), through page-locked
  // memory: each kPinGranule of a view is pinned on first use and stays pinned while the client
  // lives (the arena never gives its pages back), so only the first copy through a granule pays
  // for pinning it. Falls back to pageable copies if pinning fails.
  Status copy_arena_device(hbm::DeviceMapper* dev, int device, void* dev_ptr, uint64_t arena_off, uint64_t n,
                           bool to_device);
  static constexpr uint64_t kPinGranule = 64ull << 20;

  const uint8_t* arena() const { return view_->read_base(); }
  const ArenaView& arena_view() const { return *view_; }
  uint64_t arena_size() const { return view_->size(); }
  uint64_t chunk_size() const { return chunk_size_; }
  const std::string& address() const { return address_; }
  // Requests sent on this connection (observability, tests).
  uint64_t requests() const { return requests_; }

  // Committed models are immutable, so their descriptions are cached here (DStore's client-side
  // metadata cache): opening a model a second time costs no request. An entry is keyed by id and
  // checked against the model's commit stamp (created_ns) on every lease, so an id that gc
  // deleted and a later commit reused is noticed and refetched.
  struct ModelInfo {
    std::string id, parent;
    int64_t created_ns = 0;
    nlohmann::json metadata;
    std::vector<TensorInfo> tensors;
  };
  std::shared_ptr<const ModelInfo> cached_model(const std::string& id) const;
  void cache_model(std::shared_ptr<const ModelInfo> info);
  void forget_model(const std::string& id) { model_cache_.erase(id); }
  static constexpr size_t kModelCacheEntries = 4096;

 private:
  Connection(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  // Encodes and writes one request (with the deferred releases), collecting replies that arrive
  // while the socket is full. Registers on_reply as the next reply's handler once written.
  Status send_request(const nlohmann::json& request, std::span<const uint8_t> blob, ReplyHandler on_reply);
  Status write_all(std::span<const uint8_t> a, std::span<const uint8_t> b);
  // Reads what the socket holds (waiting up to timeout_ms for something, -1: forever) and hands
  // every complete reply to its handler. false on timeout; kUnavailable once the connection is lost.
  Result<bool> collect(int timeout_ms);
  void dispatch_buffered();
  Status lost(const std::string& why);
  // Sends `free` for staging spaces of pipelined commits that failed (their reply handlers cannot
  // send anything themselves).
  void free_failed_spaces();
  int fd_;
  std::string address_;
  std::deque<ReplyHandler> in_flight_;  // reply handlers, oldest first
  std::vector<uint8_t> rbuf_;           // received bytes; [rpos_, rend_) not yet decoded
  size_t rpos_ = 0, rend_ = 0;
  size_t want_ = 0;      // bytes still missing from the frame being received
  Status broken_;        // set once the connection is lost: every later call fails with it
  Status orphan_error_;  // the first error of a pipelined commit nobody held a ticket for
  std::vector<uint64_t> spaces_to_free_;
  friend class ConnectionWriter;  // its pipelined commits' reply handlers
  friend class ConnectionReader;  // its pipelined leases (read_many)
  std::unique_ptr<ArenaView> view_;
  uint64_t chunk_size_ = 0;
  std::vector<uint64_t> deferred_release_;
  uint64_t requests_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const ModelInfo>> model_cache_;
  std::deque<std::string> model_cache_order_;  // insertion order, for eviction
  std::string hbm_backend_;
  std::vector<int> hbm_devices_;
  std::unique_ptr<hbm::DeviceMapper> mapper_;                   // device_path's, made on first use
  std::map<std::string, std::pair<uint8_t*, uint64_t>> slabs_;  // handle -> (pointer, size)
  std::mutex pin_mu_;
  std::vector<uint8_t> pinned_[2];       // per view (0: read-only, 1: read-write), per kPinGranule: pinned
  bool pin_failed_[2] = {false, false};  // pinning a view failed once: pageable copies from then on
};

// Builds a model: add or inherit tensors, then commit. Destroying an uncommitted writer aborts it.
class ConnectionWriter {
 public:
  ConnectionWriter(Connection& client, std::string id, std::string parent);
  ~ConnectionWriter();
  ConnectionWriter(const ConnectionWriter&) = delete;
  ConnectionWriter& operator=(const ConnectionWriter&) = delete;

  // Copies the bytes (inline or into arena space) before returning.
  Status add_tensor(const std::string& name, const void* data, DType dtype, const std::vector<int64_t>& shape);
  // One tensor of add_tensors.
  struct TensorIn {
    std::string name;
    const void* data = nullptr;
    DType dtype = DType::kU8;
    std::vector<int64_t> shape;
  };
  // add_tensor for each, in order, with the copies (and hashes) of all of them shared among up to
  // 4 threads: a model of many tensors of a chunk or less is copied on every core, not one tensor
  // at a time on one. Every argument is checked first: an error adds none of them.
  Status add_tensors(const std::vector<TensorIn>& tensors);
  // Arena space for the tensor that the caller fills before commit (zero-copy writes, e.g. reading a
  // file straight into it). The pointer is valid until commit or abort.
  Result<uint8_t*> add_tensor_space(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  // Says that a tensor added with add_tensor_space holds its final bytes: the client hashes them
  // now, on threads of its own (one fewer than the cores, or set_copy_threads), while the caller
  // fills the next tensor, and the commit then need not read them again, but hashes what is left on
  // the caller's thread too (a model written tensor by tensor, each sealed once written, commits
  // at about the time of writing it). Writing the tensor after sealing it stores a chunk that fails
  // its hash on every later read: don't. kInvalidArgument for a tensor not added through arena
  // space, or sealed already.
  Status seal_tensor(const std::string& name);
  // Adds a tensor whose bytes are in device memory (CAIRN_MEM_CUDA; with the emulated backend,
  // this process's host memory): copied device-to-host into arena space before returning, so the
  // caller may overwrite its buffer at once and a commit at memory is acknowledged after the copy.
  Status add_tensor_device(const std::string& name, const void* data, DType dtype, const std::vector<int64_t>& shape);
  Status inherit_tensor(const std::string& name);
  // Inherits every parent tensor not added or inherited by name. With nothing else added, the
  // commit stores no bytes at all (a metadata-only commit).
  Status inherit_all();
  Status set_architecture(const nlohmann::json& graph);
  Status set_metadata(const nlohmann::json& meta);
  // The safetensors header JSON of the file the model came from (for byte-exact export).
  void set_source_header(std::string json_text) { source_header_ = std::move(json_text); }
  // Makes this writer part `index` of a model written by `count` writers at once (each adds its own
  // tensors and commits its part; the model becomes visible when all parts are committed, at the
  // weakest durability any part asked for). A part missing `timeout_ms` after the first arrived
  // (default 60 s) fails every part's commit. docs/protocol.md, "Multi-part models".
  Status set_part(uint32_t index, uint32_t count, int64_t timeout_ms = -1);
  // Announces the sizes of the tensors about to be added through arena space (those over
  // kInlineLimit): their spaces are allocated now in one round trip, and add_tensor /
  // add_tensor_space of a tensor of such a size takes one of them. Spaces left unused are freed at
  // commit or abort. Only an optimisation: adding other tensors works as without it.
  Status reserve(const std::vector<uint64_t>& sizes);
  // The threads this writer's copies into the arena (add_tensor, add_tensors) may use: 0 (the
  // default) one per core, at most 4; a checkpoint copied behind a training step uses 1, leaving
  // the other cores to the training. Also the most threads that hash sealed tensors (seal_tensor).
  void set_copy_threads(unsigned n) { copy_threads_ = n; }
  // Commits. wait=true: returns once durability d is reached (ticket 0); otherwise returns a ticket
  // for Connection::wait once the model is visible.
  Result<uint64_t> commit(Durability d, bool wait);
  // Commits without waiting for durability d. At memory the commit is pipelined: it returns once the
  // request is written, and its outcome (kExists, parent not found, ...) is reported on the ticket
  // (Connection::wait). Above memory it returns once the model is visible, as commit(d, false) does.
  // An error returned here means nothing was sent (or, above memory, the commit failed).
  Result<Ticket> commit_async(Durability d);
  // Commits without waiting for durability d, not pipelined at any level: returns once the model is
  // visible (or with the commit's error); the ticket, resolved already, waits for d.
  Result<Ticket> commit_visible(Durability d);
  // Commits without waiting for anything, at any durability and for a part: returns once the
  // request is written (the tensors are already in the arena); the commit's own outcome and then
  // durability d come from Connection::wait on the ticket. commit_async at memory is this.
  Result<Ticket> commit_pipelined(Durability d);
  void abort();
  const std::string& id() const { return id_; }

 private:
  Status check_name(const std::string& name);
  nlohmann::json request(Durability d, bool wait) const;
  // A reserved space of exactly n bytes, else a new one.
  Result<Connection::Space> space_for(uint64_t n);
  // Hands unused reserved spaces to the client, which frees them with its next request.
  void drop_reserved();
  std::multimap<uint64_t, Connection::Space> reserved_;
  unsigned copy_threads_ = 0;
  // Threads for a copy of `chunks` chunks (set_copy_threads).
  unsigned copy_threads(uint64_t chunks) const;
  Connection& client_;
  std::string id_, parent_;
  nlohmann::json tensors_ = nlohmann::json::array();
  std::vector<uint8_t> inline_;
  std::vector<uint64_t> spaces_;
  nlohmann::json architecture_;
  nlohmann::json metadata_ = nlohmann::json::object();
  std::string source_header_;
  std::map<std::string, bool> names_;
  // add_tensor_space tensors: where tensors_ has them, their space, and their hashes once sealed
  // (computed by sealer_ while the caller writes on; collected into tensors_ at commit).
  struct SpaceTensor {
    size_t index = 0;
    const uint8_t* data = nullptr;
    uint64_t nbytes = 0;
    bool sealed = false;
    bool hashing = false;  // sealed with a chunk size known: hashes come from sealer_
    std::vector<ChunkHash> hashes;
  };
  std::map<std::string, SpaceTensor> space_tensors_;
  HashQueue sealer_;
  // Waits for every sealed tensor's hashes (hashing what is left on this thread too) and puts them
  // into tensors_.
  void collect_seals();
  bool inherit_all_ = false;
  bool done_ = false;
  nlohmann::json part_;  // {index, of, timeout_ms} for a part of a multi-part model
};

// Reads a committed model. Views returned by map() stay valid until close() or destruction.
class ConnectionReader {
 public:
  static Result<std::unique_ptr<ConnectionReader>> open(Connection& client, const std::string& id);
  ~ConnectionReader();

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& parent() const { return parent_; }
  const std::string& id() const { return id_; }

  // Copies the tensor into dst (dst_bytes must equal its size).
  Status read(const std::string& name, void* dst, uint64_t dst_bytes);
  // Copies several tensors with one request: dsts[i] receives names[i] (sizes must match).
  Status read_many(const std::vector<std::string>& names, const std::vector<std::span<uint8_t>>& dsts);
  // Copies into device memory (CAIRN_MEM_CUDA): from the daemon's HBM tier when it has one (the
  // tensor is promoted there first), else from the arena with CUDA. kUnavailable, naming why, when
  // neither is possible.
  Status read_to_device(const std::string& name, void* dst, uint64_t dst_bytes);
  // A device pointer to the tensor in the daemon's HBM tier on `device` (-1: its first device),
  // zero-copy through the slab's IPC handle; valid until close(). kUnavailable without an HBM tier.
  Result<std::span<const uint8_t>> map_device(const std::string& name, int device);
  // map_device of several tensors with one request (the order of names); all or nothing.
  Result<std::vector<std::span<const uint8_t>>> map_many_device(const std::vector<std::string>& names, int device);
  // read_to_device of several tensors: with an HBM tier, one request leases them all and the
  // device-to-device copies run back to back on one stream; dsts[i] (device memory) receives names[i].
  Status read_many_to_device(const std::vector<std::string>& names, const std::vector<void*>& dsts,
                             const std::vector<uint64_t>& dst_bytes);
  // A zero-copy view into the daemon's arena.
  Result<std::span<const uint8_t>> map(const std::string& name);
  // Maps several tensors with one request (the order of names).
  Result<std::vector<std::span<const uint8_t>>> map_many(const std::vector<std::string>& names);
  // Writable copy-on-write views of several tensors with one request (ArenaView::map_private):
  // reading costs no copy, a write copies only the page it touches into this process and never
  // changes the stored model. Valid until close(), which unmaps them; the tensors stay leased
  // meanwhile. What a framework that trains the weights it loads wants instead of a copy.
  Result<std::vector<std::span<uint8_t>>> map_many_private(const std::vector<std::string>& names);
  // Unmaps every copy-on-write view and ends every lease this reader holds.
  void close();

 private:
  ConnectionReader(Connection& client) : client_(client) {}
  struct Leased {
    uint64_t lease;
    std::vector<std::pair<uint64_t, uint64_t>> extents;  // (offset, length)
  };
  Result<std::vector<Leased>> lease(const std::vector<std::string>& names, bool contiguous);
  static nlohmann::json lease_request(const std::string& id, const std::vector<std::string>& names, bool contiguous);
  // A lease reply's tensors; kNotFound (its leases released) when the model is no longer the one
  // this reader opened.
  Result<std::vector<Leased>> parse_lease(const nlohmann::json& reply, size_t count);
  // read_many of a large model: one lease per group of tensors, all sent at once, each group
  // copied out while the daemon loads the next.
  Status read_pipelined(const std::vector<std::string>& names, const std::vector<std::span<uint8_t>>& dsts,
                        const std::vector<size_t>& group_ends, uint64_t total);
  void copy_out(const Leased& leased, std::span<uint8_t> dst, uint64_t total);
  // Device leases of tensors, one request: (lease id, device pointer in this process) each, in order.
  Result<std::vector<std::pair<uint64_t, const uint8_t*>>> lease_device(const std::vector<std::string>& names,
                                                                        int device);
  // kNotFound for an unknown tensor, kInvalidArgument when dst_bytes is not its size.
  Status check_buffer(const std::string& name, uint64_t dst_bytes) const;
  Connection& client_;
  std::string id_, parent_;
  int64_t created_ns_ = 0;
  nlohmann::json metadata_;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> held_;
  std::vector<std::span<uint8_t>> private_;  // copy-on-write views, unmapped by close()
};

}  // namespace cairn
