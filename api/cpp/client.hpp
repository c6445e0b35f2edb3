// The client library's core: a connection to the node's cairnd, and model writers and readers.
// The C API (api/c/cairn_c.cpp) and the `cairn` tool are built on it.
//
// Data path: at connect the client receives the daemon's DRAM arena (a memfd) and maps it. Large
// tensors are written straight into arena space the daemon hands out (allocate → fill → commit) and
// read from leased extents of the arena, without a copy (map) or with one (read). Small tensors
// travel inline in the request.
//
// Thread-safety: a Client is used by one thread at a time. Readers and writers belong to their
// client and must not outlive it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/status.hpp"
#include "tiers/dram/arena.hpp"

namespace cairn {

enum class Durability { kMemory = 0, kLocal = 1, kGlobal = 2 };
const char* durability_name(Durability d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

// Tensors up to this size travel inline in the request; larger ones go through the arena.
inline constexpr uint64_t kInlineLimit = 64 * 1024;

class Client {
 public:
  // address "" = wire::default_socket_path() ($CAIRN_SOCKET, then the default). kUnavailable names the path when nothing listens.
  static Result<std::unique_ptr<Client>> connect(const std::string& address);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One request/response exchange. The response's status becomes the Status.
  Result<nlohmann::json> call(const nlohmann::json& request, std::span<const uint8_t> blob = {});

  // Named tensors.
  Status put_tensor(const std::string& key, const void* data, DType dtype, const std::vector<int64_t>& shape);
  Result<TensorInfo> tensor_info(const std::string& key);
  Status unpack_tensor(const std::string& key, void* dst, uint64_t dst_bytes);
  Result<bool> poll_tensor(const std::string& key, int timeout_ms);
  Status delete_tensor(const std::string& key);

  // Arena space for writing nbytes: (space id, writable pointer). Freed by commit or free_space.
  struct Space {
    uint64_t id = 0;
    uint8_t* data = nullptr;
    uint64_t nbytes = 0;
  };
  Result<Space> allocate(uint64_t nbytes);
  Status free_space(uint64_t id);
  Status release(const std::vector<uint64_t>& leases);
  // Releases a lease with the next request instead of a round trip of its own (the chunks stay
  // pinned until then, or until the connection ends).
  void release_later(uint64_t lease) { deferred_release_.push_back(lease); }

  Status wait(uint64_t ticket, int timeout_ms);
  Status prefetch(const std::string& id);
  Result<nlohmann::json> query(const nlohmann::json& q);
  // Sends a hint (docs/policy.md); the daemon's answer.
  Result<nlohmann::json> hint(const nlohmann::json& h);

  const uint8_t* arena() const { return view_->read_base(); }
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
  Client(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  int fd_;
  std::string address_;
  std::unique_ptr<ArenaView> view_;
  uint64_t chunk_size_ = 0;
  std::vector<uint64_t> deferred_release_;
  uint64_t requests_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const ModelInfo>> model_cache_;
  std::deque<std::string> model_cache_order_;  // insertion order, for eviction
};

// Builds a model: add or inherit tensors, then commit. Destroying an uncommitted writer aborts it.
class ModelWriter {
 public:
  ModelWriter(Client& client, std::string id, std::string parent);
  ~ModelWriter();
  ModelWriter(const ModelWriter&) = delete;
  ModelWriter& operator=(const ModelWriter&) = delete;

  // Copies the bytes (inline or into arena space) before returning.
  Status add_tensor(const std::string& name, const void* data, DType dtype, const std::vector<int64_t>& shape);
  // Arena space for the tensor that the caller fills before commit (zero-copy writes, e.g. reading a
  // file straight into it). The pointer is valid until commit or abort.
  Result<uint8_t*> add_tensor_space(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  Status inherit_tensor(const std::string& name);
  // Inherits every parent tensor not added or inherited by name. With nothing else added, the
  // commit stores no bytes at all (a metadata-only commit).
  Status inherit_all();
  Status set_architecture(const nlohmann::json& graph);
  Status set_metadata(const nlohmann::json& meta);
  // The safetensors header JSON of the file the model came from (for byte-exact export).
  void set_source_header(std::string json_text) { source_header_ = std::move(json_text); }
  // Commits. wait=true: returns once durability d is reached (ticket 0); otherwise returns a ticket
  // for Client::wait once the model is visible.
  Result<uint64_t> commit(Durability d, bool wait);
  void abort();
  const std::string& id() const { return id_; }

 private:
  Status check_name(const std::string& name);
  Client& client_;
  std::string id_, parent_;
  nlohmann::json tensors_ = nlohmann::json::array();
  std::vector<uint8_t> inline_;
  std::vector<uint64_t> spaces_;
  nlohmann::json architecture_;
  nlohmann::json metadata_ = nlohmann::json::object();
  std::string source_header_;
  std::map<std::string, bool> names_;
  bool inherit_all_ = false;
  bool done_ = false;
};

// Reads a committed model. Views returned by map() stay valid until close() or destruction.
class ModelReader {
 public:
  static Result<std::unique_ptr<ModelReader>> open(Client& client, const std::string& id);
  ~ModelReader();

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& parent() const { return parent_; }
  const std::string& id() const { return id_; }

  // Copies the tensor into dst (dst_bytes must equal its size).
  Status read(const std::string& name, void* dst, uint64_t dst_bytes);
  // Copies several tensors with one request: dsts[i] receives names[i] (sizes must match).
  Status read_many(const std::vector<std::string>& names, const std::vector<std::span<uint8_t>>& dsts);
  // Copies into CUDA device memory (kUnavailable when built without CUDA).
  Status read_to_device(const std::string& name, void* dst, uint64_t dst_bytes);
  // A zero-copy view into the daemon's arena.
  Result<std::span<const uint8_t>> map(const std::string& name);
  // Maps several tensors with one request (the order of names).
  Result<std::vector<std::span<const uint8_t>>> map_many(const std::vector<std::string>& names);
  // Ends every lease this reader holds.
  void close();

 private:
  ModelReader(Client& client) : client_(client) {}
  struct Leased {
    uint64_t lease;
    std::vector<std::pair<uint64_t, uint64_t>> extents;  // (offset, length)
  };
  Result<std::vector<Leased>> lease(const std::vector<std::string>& names, bool contiguous);
  // kNotFound for an unknown tensor, kInvalidArgument when dst_bytes is not its size.
  Status check_buffer(const std::string& name, uint64_t dst_bytes) const;
  Client& client_;
  std::string id_, parent_;
  int64_t created_ns_ = 0;
  nlohmann::json metadata_;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> held_;
};

}  // namespace cairn
