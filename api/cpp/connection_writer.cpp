// ConnectionWriter: builds a model in the daemon's arena and commits it (api/cpp/connection.hpp).
#include <algorithm>
#include <cstring>
#include <future>
#include <set>
#include <string_view>
#include <thread>

#include "api/cpp/connection.hpp"
#include "api/cpp/connection_internal.hpp"
#include "core/copy.hpp"
#include "core/hash.hpp"
#include "core/wire.hpp"

namespace cairn {

using nlohmann::json;
using namespace client_detail;

// ---- ConnectionWriter ----

namespace {
// The most threads a writer copies or hashes on (set_copy_threads).
constexpr unsigned kMaxCopyThreads = 4;

// A tensor's chunk hashes as the commit request's "hashes" field.
json hashes_json(const std::vector<ChunkHash>& hashes) {
  json out = json::array();
  for (const ChunkHash& h : hashes) out.push_back(h.hex());
  return out;
}
}  // namespace

ConnectionWriter::ConnectionWriter(Connection& client, std::string id, std::string parent)
    : client_(client), id_(std::move(id)), parent_(std::move(parent)) {}

ConnectionWriter::~ConnectionWriter() { abort(); }

Status ConnectionWriter::check_name(const std::string& name) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  if (!valid_name(name)) return invalid_argument("tensor names must be 1..1024 bytes of UTF-8 without NUL");
  if (names_.count(name)) return already_exists("model '" + id_ + "': tensor '" + name + "' was already added");
  return Status::OK();
}

Status ConnectionWriter::add_tensor(const std::string& name, const void* data, DType dtype,
                                    const std::vector<int64_t>& shape) {
  CAIRN_RETURN_IF_ERROR(check_name(name));
  uint64_t n;
  CAIRN_RETURN_IF_ERROR(check_shape(dtype, shape, &n).with_context("tensor '" + name + "'"));
  if (n > 0 && data == nullptr) return invalid_argument("tensor '" + name + "': data is NULL");
  json t{{"name", name}, {"dtype", dtype_name(dtype)}, {"shape", shape_json(shape)}};
  if (n <= kInlineLimit && inline_.size() + n <= wire::kMaxBlobBytes / 2) {
    t["inline"] = json::array({inline_.size(), n});
    const auto* p = static_cast<const uint8_t*>(data);
    inline_.insert(inline_.end(), p, p + n);
  } else {
    CAIRN_ASSIGN_OR_RETURN(Connection::Space sp, space_for(n));
    const uint64_t chunk = client_.chunk_size();
    if (chunk > 0) {
      // Copied and hashed here, each 64 KiB block hashed while it is in the cache (several chunks:
      // shared among up to 4 threads), so the daemon need not read the bytes again at commit
      // (1 GiB: 1.04x a memcpy on 2 cores instead of a copy and then a hash).
      const unsigned threads = copy_threads(chunk_count(n, chunk));
      t["hashes"] = hashes_json(copy_and_hash_chunks(sp.data, data, n, chunk, threads));
    } else {
      stream_copy(sp.data, data, n, should_stream(n, n));
    }
    spaces_.push_back(sp.id);
    t["space"] = sp.id;
  }
  tensors_.push_back(std::move(t));
  names_[name] = true;
  return Status::OK();
}

Status ConnectionWriter::add_tensors(const std::vector<TensorIn>& in) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  // Checked whole first, so that an error leaves the writer as it was.
  std::vector<uint64_t> sizes(in.size());
  std::set<std::string_view> batch;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorIn& t = in[i];
    CAIRN_RETURN_IF_ERROR(check_name(t.name));
    if (!batch.insert(t.name).second)
      return already_exists("model '" + id_ + "': tensor '" + t.name + "' is given twice");
    CAIRN_RETURN_IF_ERROR(check_shape(t.dtype, t.shape, &sizes[i]).with_context("tensor '" + t.name + "'"));
    if (sizes[i] > 0 && t.data == nullptr) return invalid_argument("tensor '" + t.name + "': data is NULL");
  }
  const uint64_t chunk = client_.chunk_size();
  const size_t tensors_before = tensors_.size(), inline_before = inline_.size(), spaces_before = spaces_.size();
  std::vector<CopyJob> jobs;
  std::vector<size_t> job_tensor;  // index in tensors_ of each job
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorIn& t = in[i];
    const uint64_t n = sizes[i];
    json e{{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", shape_json(t.shape)}};
    if (n <= kInlineLimit && inline_.size() + n <= wire::kMaxBlobBytes / 2) {
      e["inline"] = json::array({inline_.size(), n});
      const auto* p = static_cast<const uint8_t*>(t.data);
      inline_.insert(inline_.end(), p, p + n);
    } else {
      Result<Connection::Space> sp = space_for(n);
      if (!sp.ok()) {  // undo this call's additions; its spaces are freed with the next request
        for (size_t k = spaces_before; k < spaces_.size(); ++k) client_.spaces_to_free_.push_back(spaces_[k]);
        spaces_.resize(spaces_before);
        inline_.resize(inline_before);
        tensors_.erase(tensors_.begin() + static_cast<std::ptrdiff_t>(tensors_before), tensors_.end());
        return sp.status();
      }
      spaces_.push_back(sp->id);
      e["space"] = sp->id;
      if (chunk > 0) {
        jobs.push_back(CopyJob{sp->data, t.data, n});
        job_tensor.push_back(tensors_.size());
      } else {
        stream_copy(sp->data, t.data, n, should_stream(n, n));
      }
    }
    tensors_.push_back(std::move(e));
  }
  if (!jobs.empty()) {
    uint64_t chunks = 0;
    for (const CopyJob& j : jobs) chunks += chunk_count(j.size, chunk);
    const unsigned threads = copy_threads(chunks);
    std::vector<std::vector<ChunkHash>> hashes = copy_and_hash_many(jobs, chunk, threads);
    for (size_t k = 0; k < jobs.size(); ++k) tensors_[job_tensor[k]]["hashes"] = hashes_json(hashes[k]);
  }
  for (const TensorIn& t : in) names_[t.name] = true;
  return Status::OK();
}

unsigned ConnectionWriter::copy_threads(uint64_t chunks) const {
  if (chunks <= 1) return 1;
  return copy_threads_ ? std::min(copy_threads_, kMaxCopyThreads)
                       : std::clamp(std::thread::hardware_concurrency(), 1u, kMaxCopyThreads);
}

Status ConnectionWriter::reserve(const std::vector<uint64_t>& sizes) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  CAIRN_ASSIGN_OR_RETURN(auto spaces, client_.allocate_many(sizes));
  for (const auto& sp : spaces) reserved_.emplace(sp.nbytes, sp);
  return Status::OK();
}

Result<Connection::Space> ConnectionWriter::space_for(uint64_t n) {
  if (auto it = reserved_.find(n); it != reserved_.end()) {
    Connection::Space sp = it->second;
    reserved_.erase(it);
    return sp;
  }
  return client_.allocate(n);
}

void ConnectionWriter::drop_reserved() {
  for (const auto& [n, sp] : reserved_) client_.spaces_to_free_.push_back(sp.id);
  reserved_.clear();
}

Result<uint8_t*> ConnectionWriter::add_tensor_space(const std::string& name, DType dtype,
                                                    const std::vector<int64_t>& shape) {
  CAIRN_RETURN_IF_ERROR(check_name(name));
  uint64_t n;
  CAIRN_RETURN_IF_ERROR(check_shape(dtype, shape, &n).with_context("tensor '" + name + "'"));
  CAIRN_ASSIGN_OR_RETURN(Connection::Space sp, space_for(n));
  spaces_.push_back(sp.id);
  space_tensors_[name] = SpaceTensor{tensors_.size(), sp.data, n, {}};
  tensors_.push_back(
      json{{"name", name}, {"dtype", dtype_name(dtype)}, {"shape", shape_json(shape)}, {"space", sp.id}});
  names_[name] = true;
  return sp.data;
}

Status ConnectionWriter::seal_tensor(const std::string& name) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  auto it = space_tensors_.find(name);
  if (it == space_tensors_.end())
    return invalid_argument("model '" + id_ + "': tensor '" + name + "' was not added with add_tensor_space");
  SpaceTensor& t = it->second;
  if (t.sealed) return invalid_argument("model '" + id_ + "': tensor '" + name + "' is sealed already");
  t.sealed = true;
  const uint64_t chunk = client_.chunk_size();
  if (chunk == 0) return Status::OK();  // a daemon that did not say its chunk size hashes at commit
  t.hashing = true;
  t.hashes.resize(chunk_count(t.nbytes, chunk));
  sealer_.add(t.data, t.nbytes, chunk, t.hashes.data(), std::min(copy_threads_, kMaxCopyThreads));
  return Status::OK();
}

void ConnectionWriter::collect_seals() {
  sealer_.finish();
  for (auto& [name, t] : space_tensors_) {
    if (t.hashing) tensors_[t.index]["hashes"] = hashes_json(t.hashes);
  }
  space_tensors_.clear();
}

Status ConnectionWriter::inherit_tensor(const std::string& name) {
  CAIRN_RETURN_IF_ERROR(check_name(name));
  if (parent_.empty()) return invalid_argument("model '" + id_ + "' has no parent to inherit '" + name + "' from");
  tensors_.push_back(json{{"name", name}, {"inherit", true}});
  names_[name] = true;
  return Status::OK();
}

Status ConnectionWriter::inherit_all() {
  if (parent_.empty()) return invalid_argument("model '" + id_ + "' has no parent to inherit from");
  inherit_all_ = true;
  return Status::OK();
}

Status ConnectionWriter::set_architecture(const json& graph) {
  if (!graph.is_object()) return invalid_argument("the architecture graph must be a JSON object");
  architecture_ = graph;
  return Status::OK();
}

Status ConnectionWriter::set_metadata(const json& meta) {
  if (!meta.is_object()) return invalid_argument("metadata must be a JSON object");
  metadata_ = meta;
  return Status::OK();
}

json ConnectionWriter::request(Durability d, bool wait) const {
  json req{{"op", "commit"}, {"id", id_},           {"durability", durability_name(d)},
           {"wait", wait},   {"tensors", tensors_}, {"metadata", metadata_}};
  if (!parent_.empty()) req["parent"] = parent_;
  if (inherit_all_) req["inherit_all"] = true;
  if (!architecture_.is_null()) req["architecture"] = architecture_;
  if (!source_header_.empty()) req["source_header"] = source_header_;
  if (!part_.is_null()) req["part"] = part_;
  return req;
}

Status ConnectionWriter::set_part(uint32_t index, uint32_t count, int64_t timeout_ms) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  if (count < 2) return invalid_argument("model '" + id_ + "': a multi-part model has at least 2 parts");
  if (index >= count)
    return invalid_argument("model '" + id_ + "': part " + std::to_string(index) + " is not below the count " +
                            std::to_string(count));
  part_ = json{{"index", index}, {"of", count}};
  if (timeout_ms > 0) part_["timeout_ms"] = timeout_ms;
  return Status::OK();
}

Result<uint64_t> ConnectionWriter::commit(Durability d, bool wait) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  drop_reserved();
  collect_seals();
  auto r = client_.call(request(d, wait), inline_);
  if (!r.ok()) {
    abort();  // frees the spaces the daemon did not take
    return r.status();
  }
  done_ = true;
  spaces_.clear();
  return r->value("ticket", uint64_t{0});
}

Result<Ticket> ConnectionWriter::commit_async(Durability d) {
  // A part's ticket is the daemon's, which follows the whole model (it fails when another part
  // never arrives); above memory the call returns once the model is visible.
  if (d != Durability::kMemory || !part_.is_null()) return commit_visible(d);
  return commit_pipelined(d);
}

Result<Ticket> ConnectionWriter::commit_visible(Durability d) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  auto t = std::make_shared<CommitTicket>();
  t->id = id_;
  t->target = d;
  CAIRN_ASSIGN_OR_RETURN(t->daemon_ticket, commit(d, false));
  t->resolved = true;
  return t;
}

Result<Ticket> ConnectionWriter::commit_pipelined(Durability d) {
  if (done_) return invalid_argument("model '" + id_ + "' was already committed or aborted");
  drop_reserved();
  collect_seals();
  auto t = std::make_shared<CommitTicket>();
  t->id = id_;
  t->target = d;
  // At memory (and not a part) the reply is the durability: "ticket": false asks the daemon to keep
  // no ticket for it. Above memory, or for a part (whose ticket follows the whole model), the
  // reply carries the daemon's ticket, which Connection::wait waits for after the reply.
  json req = request(d, false);
  const bool daemon_ticket = d != Durability::kMemory || !part_.is_null();
  if (!daemon_ticket) req["ticket"] = false;
  t->pipelined = true;
  Connection* c = &client_;
  std::vector<uint64_t> spaces = spaces_;
  Status sent = client_.send_pipelined(req, inline_, [t, c, spaces, daemon_ticket](Result<json> r) {
    t->resolved = true;
    t->status = r.status();
    if (r.ok()) {
      if (daemon_ticket) t->daemon_ticket = r->value("ticket", uint64_t{0});
      return;
    }
    // A failed commit consumed none of its spaces (they die with a lost connection anyway).
    if (r.status().code() != StatusCode::kUnavailable)
      c->spaces_to_free_.insert(c->spaces_to_free_.end(), spaces.begin(), spaces.end());
    // Nobody holds the ticket any more: keep the error for flush_pipeline.
    if (t.use_count() == 1 && c->orphan_error_.ok()) c->orphan_error_ = r.status();
  });
  if (!sent.ok()) {
    abort();
    return sent;
  }
  done_ = true;
  spaces_.clear();
  return t;
}

void ConnectionWriter::abort() {
  if (done_) return;
  done_ = true;
  drop_reserved();
  // A hash still running reads the spaces: it ends before they are freed.
  sealer_.cancel();
  space_tensors_.clear();
  // Spaces a failed commit already consumed are unknown to the daemon now: freeing them is a no-op.
  for (uint64_t id : spaces_) (void)client_.free_space(id);
  spaces_.clear();
}

}  // namespace cairn
