// cairn/client.hpp — the C++ interface: RAII handles over the C API (cairn.h), header-only, so it
// needs nothing but libcairn.so and works with any C++17 compiler and standard library.
//
// Conventions: errors are values. Every call returns cairn::Status (or cairn::Result<T>); nothing
// throws. A Status carries the cairn_status code and the message cairn_last_error() gave.
// Handles are move-only and free themselves; a Reader or Writer must not outlive its Client.
// Every call of cairn.h has its method here (the header names which): the C names are
// <object>_<verb> (cairn_model_create), the C++ ones the verb on its object (Client::create_model,
// Writer::commit).
//
//   namespace cn = cairn::v1;
//   auto client = cn::Client::connect();             // $CAIRN_SOCKET, then the default socket
//   if (!client) { std::cerr << client.status().message() << "\n"; return 1; }
//   auto w = client->create_model("cand-17", "cand-9");
//   w->inherit("layer1.0.conv1.weight");
//   w->add("fc.weight", fc.data(), CAIRN_DTYPE_F32, {1000, 512});
//   w->commit(CAIRN_DURABILITY_GLOBAL);
//   auto r = client->open_model("cand-17");
//   auto view = r->map("fc.weight");                     // zero-copy, valid while r lives
#ifndef CAIRN_CLIENT_HPP
#define CAIRN_CLIENT_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cairn/cairn.h"

// Versioned, so that these names never collide with the library's own (internal) types.
namespace cairn::v1 {

class Status {
 public:
  Status() = default;
  Status(cairn_status code, std::string message) : code_(code), message_(std::move(message)) {}
  // The status of the last C call on this thread, with its detail.
  static Status from(cairn_status code) {
    return code == CAIRN_OK ? Status() : Status(code, cairn_last_error());
  }
  bool ok() const { return code_ == CAIRN_OK; }
  explicit operator bool() const { return ok(); }
  cairn_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  cairn_status code_ = CAIRN_OK;
  std::string message_;
};

// cairn_status_string: a human-readable string for a code.
inline const char* status_string(cairn_status code) { return cairn_status_string(code); }
// cairn_status_name: the C name of a code ("CAIRN_ERR_NOT_FOUND"); nullptr for an unknown value.
inline const char* status_name(int code) { return cairn_status_name(code); }
// cairn_library_has_cuda: whether libcairn copies between the arena and CUDA memory itself.
inline bool library_has_cuda() { return cairn_library_has_cuda() != 0; }

// A value or a Status. Access the value only when ok().
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return status_.ok(); }
  explicit operator bool() const { return ok(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

struct TensorInfo {
  std::string name;
  cairn_dtype dtype = CAIRN_DTYPE_U8;
  std::vector<int64_t> shape;
  size_t nbytes = 0;
};

class Ticket {
 public:
  Ticket() = default;
  explicit Ticket(cairn_ticket* t) : t_(t, cairn_ticket_free) {}
  // Waits for the durability the commit asked for (-1: forever).
  Status wait(int timeout_ms = -1) { return t_ ? Status::from(cairn_wait(t_.get(), timeout_ms)) : Status(); }

 private:
  std::unique_ptr<cairn_ticket, void (*)(cairn_ticket*)> t_{nullptr, cairn_ticket_free};
};

class Writer {
 public:
  explicit Writer(cairn_model_writer* w) : w_(w) {}
  Writer(Writer&& o) noexcept : w_(std::exchange(o.w_, nullptr)) {}
  Writer& operator=(Writer&& o) noexcept {
    if (this != &o) {
      if (w_) cairn_model_abort(w_);
      w_ = std::exchange(o.w_, nullptr);
    }
    return *this;
  }
  ~Writer() {
    if (w_) cairn_model_abort(w_);
  }

  Status add(const std::string& name, const void* data, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    return Status::from(cairn_model_add_tensor(w_, name.c_str(), data, dtype, static_cast<int>(shape.size()),
                                               shape.data()));
  }
  // Many tensors in one call (cairn_model_add_tensors): all copied, on every core, before it
  // returns; an error adds none of them.
  struct In {
    std::string name;
    const void* data;
    cairn_dtype dtype;
    std::vector<int64_t> shape;
  };
  Status add_many(const std::vector<In>& tensors) {
    std::vector<cairn_tensor_in> in;
    in.reserve(tensors.size());
    for (const In& t : tensors)
      in.push_back(cairn_tensor_in{t.name.c_str(), t.data, t.dtype, static_cast<int>(t.shape.size()), t.shape.data()});
    return Status::from(cairn_model_add_tensors(w_, in.data(), in.size()));
  }
  // From device memory (cairn_model_add_tensor_device): copied before it returns.
  Status add_device(const std::string& name, const void* data, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    return Status::from(cairn_model_add_tensor_device(w_, name.c_str(), data, dtype, static_cast<int>(shape.size()),
                                                      shape.data()));
  }
  Status inherit(const std::string& name) { return Status::from(cairn_model_inherit_tensor(w_, name.c_str())); }
  // cairn_model_inherit_all: every parent tensor not added or inherited by name.
  Status inherit_all() { return Status::from(cairn_model_inherit_all(w_)); }
  // cairn_model_add_tensor_space: writable arena bytes for the tensor, to fill before commit (no copy).
  Result<void*> add_space(const std::string& name, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    void* data = nullptr;
    Status s = Status::from(cairn_model_add_tensor_space(w_, name.c_str(), dtype, static_cast<int>(shape.size()),
                                                         shape.data(), &data));
    if (!s) return s;
    return data;
  }
  // cairn_model_seal_tensor: a tensor added with add_space holds its final bytes (hashed now).
  Status seal(const std::string& name) { return Status::from(cairn_model_seal_tensor(w_, name.c_str())); }
  // cairn_model_reserve: the sizes of the large tensors about to be added, allocated in one round trip.
  Status reserve(const std::vector<size_t>& nbytes) {
    return Status::from(cairn_model_reserve(w_, nbytes.size(), nbytes.data()));
  }
  // cairn_model_set_copy_threads: the threads this writer's copies may use (0: one per core, at most 4).
  Status set_copy_threads(unsigned threads) { return Status::from(cairn_model_set_copy_threads(w_, threads)); }
  Status set_architecture(const std::string& graph_json) {
    return Status::from(cairn_model_set_architecture(w_, graph_json.c_str()));
  }
  Status set_metadata(const std::string& meta_json) {
    return Status::from(cairn_model_set_metadata(w_, meta_json.c_str()));
  }
  // Commits and waits for durability d.
  Status commit(cairn_durability d = CAIRN_DURABILITY_GLOBAL) {
    return Status::from(cairn_model_commit(std::exchange(w_, nullptr), d, nullptr));
  }
  // Commits; the ticket waits for durability d later. At CAIRN_DURABILITY_MEMORY the commit is
  // pipelined: this returns once the request is written, and the commit's own error (kExists, a
  // missing parent, ...) comes from ticket.wait() (cairn.h, cairn_model_commit).
  Result<Ticket> commit_async(cairn_durability d) {
    cairn_ticket* t = nullptr;
    Status s = Status::from(cairn_model_commit(std::exchange(w_, nullptr), d, &t));
    if (!s) return s;
    return Ticket(t);
  }
  // Commits pipelined at any durability: returns once the request is written; the commit's own
  // error and then durability d come from ticket.wait() (cairn.h, cairn_model_commit_pipelined).
  Result<Ticket> commit_pipelined(cairn_durability d) {
    cairn_ticket* t = nullptr;
    Status s = Status::from(cairn_model_commit_pipelined(std::exchange(w_, nullptr), d, &t));
    if (!s) return s;
    return Ticket(t);
  }

 private:
  cairn_model_writer* w_;
};

class Reader {
 public:
  explicit Reader(cairn_model_reader* r) : r_(r) {}
  Reader(Reader&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Reader& operator=(Reader&& o) noexcept {
    if (this != &o) {
      if (r_) cairn_model_close(r_);
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  ~Reader() {
    if (r_) cairn_model_close(r_);
  }

  Result<std::vector<TensorInfo>> tensors() {
    size_t n = 0;
    Status s = Status::from(cairn_model_tensor_count(r_, &n));
    if (!s) return s;
    std::vector<TensorInfo> out(n);
    for (size_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      int ndim = 0;
      int64_t shape[CAIRN_MAX_DIMS];
      s = Status::from(cairn_model_tensor_info(r_, i, &name, &out[i].dtype, &ndim, shape, &out[i].nbytes));
      if (!s) return s;
      out[i].name = name;
      out[i].shape.assign(shape, shape + ndim);
    }
    return out;
  }
  Status read(const std::string& name, void* dst, size_t dst_bytes, cairn_memkind kind = CAIRN_MEM_HOST) {
    return Status::from(cairn_model_read_tensor(r_, name.c_str(), dst, dst_bytes, kind));
  }
  struct View {
    const void* data = nullptr;
    size_t nbytes = 0;
  };
  // A read-only view into the daemon's arena, valid while this Reader lives.
  Result<View> map(const std::string& name) {
    View v;
    Status s = Status::from(cairn_model_map_tensor(r_, name.c_str(), &v.data, &v.nbytes));
    if (!s) return s;
    return v;
  }
  // A read-only device pointer into the daemon's HBM tier (cairn_model_map_tensor_device), valid
  // while this Reader lives; device -1: the daemon's first.
  Result<View> map_device(const std::string& name, int device = -1) {
    View v;
    Status s = Status::from(cairn_model_map_tensor_device(r_, name.c_str(), device, &v.data, &v.nbytes));
    if (!s) return s;
    return v;
  }
  // cairn_model_map_tensors: views of many tensors with one request; all or nothing.
  Result<std::vector<View>> map_many(const std::vector<std::string>& names) {
    return views(names, [&](size_t n, const char* const* c_names, const void** data, size_t* nbytes) {
      return cairn_model_map_tensors(r_, n, c_names, data, nbytes);
    });
  }
  // cairn_model_map_tensors_device: device views of many tensors with one request (device -1: the first).
  Result<std::vector<View>> map_device_many(const std::vector<std::string>& names, int device = -1) {
    return views(names, [&](size_t n, const char* const* c_names, const void** data, size_t* nbytes) {
      return cairn_model_map_tensors_device(r_, n, c_names, device, data, nbytes);
    });
  }
  struct PrivateView {
    void* data = nullptr;
    size_t nbytes = 0;
  };
  // cairn_model_map_tensors_private: writable copy-on-write views, valid while this Reader lives.
  Result<std::vector<PrivateView>> map_private(const std::vector<std::string>& names) {
    std::vector<const char*> c_names = c_strings(names);
    std::vector<void*> data(names.size());
    std::vector<size_t> nbytes(names.size());
    Status s = Status::from(cairn_model_map_tensors_private(r_, names.size(), c_names.data(), data.data(), nbytes.data()));
    if (!s) return s;
    std::vector<PrivateView> out(names.size());
    for (size_t i = 0; i < names.size(); ++i) out[i] = PrivateView{data[i], nbytes[i]};
    return out;
  }
  // cairn_model_read_tensors: many tensors into host buffers with one request (sizes must match).
  Status read_many(const std::vector<std::string>& names, const std::vector<void*>& dsts,
                   const std::vector<size_t>& dst_bytes) {
    if (dsts.size() != names.size() || dst_bytes.size() != names.size())
      return Status(CAIRN_ERR_INVALID_ARGUMENT, "read_many: names, dsts and dst_bytes differ in length");
    std::vector<const char*> c_names = c_strings(names);
    return Status::from(cairn_model_read_tensors(r_, names.size(), c_names.data(), dsts.data(), dst_bytes.data()));
  }
  // cairn_model_read_tensors_device: many tensors into device buffers with one request.
  Status read_many_device(const std::vector<std::string>& names, const std::vector<void*>& dsts,
                          const std::vector<size_t>& dst_bytes) {
    if (dsts.size() != names.size() || dst_bytes.size() != names.size())
      return Status(CAIRN_ERR_INVALID_ARGUMENT, "read_many_device: names, dsts and dst_bytes differ in length");
    std::vector<const char*> c_names = c_strings(names);
    return Status::from(
        cairn_model_read_tensors_device(r_, names.size(), c_names.data(), dsts.data(), dst_bytes.data()));
  }

 private:
  static std::vector<const char*> c_strings(const std::vector<std::string>& names) {
    std::vector<const char*> out;
    out.reserve(names.size());
    for (const std::string& n : names) out.push_back(n.c_str());
    return out;
  }
  template <typename Map>
  Result<std::vector<View>> views(const std::vector<std::string>& names, Map map) {
    std::vector<const char*> c_names = c_strings(names);
    std::vector<const void*> data(names.size());
    std::vector<size_t> nbytes(names.size());
    Status s = Status::from(map(names.size(), c_names.data(), data.data(), nbytes.data()));
    if (!s) return s;
    std::vector<View> out(names.size());
    for (size_t i = 0; i < names.size(); ++i) out[i] = View{data[i], nbytes[i]};
    return out;
  }

  cairn_model_reader* r_;
};

class Client {
 public:
  // address: a socket path; empty: $CAIRN_SOCKET, then the default.
  static Result<Client> connect(const std::string& address = "") {
    cairn_client* c = nullptr;
    Status s = Status::from(cairn_connect(address.empty() ? nullptr : address.c_str(), &c));
    if (!s) return s;
    return Client(c);
  }
  Client() = default;
  Client(Client&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Client& operator=(Client&& o) noexcept {
    if (this != &o) {
      cairn_disconnect(c_);
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  ~Client() { cairn_disconnect(c_); }

  Status put_tensor(const std::string& key, const void* data, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    return Status::from(cairn_put_tensor(c_, key.c_str(), data, dtype, static_cast<int>(shape.size()), shape.data()));
  }
  Result<TensorInfo> tensor_info(const std::string& key) {
    TensorInfo t;
    int ndim = 0;
    int64_t shape[CAIRN_MAX_DIMS];
    Status s = Status::from(cairn_get_tensor_info(c_, key.c_str(), &t.dtype, &ndim, shape, &t.nbytes));
    if (!s) return s;
    t.name = key;
    t.shape.assign(shape, shape + ndim);
    return t;
  }
  Status unpack_tensor(const std::string& key, void* dst, size_t dst_bytes) {
    return Status::from(cairn_unpack_tensor(c_, key.c_str(), dst, dst_bytes));
  }
  Result<bool> poll_tensor(const std::string& key, int timeout_ms) {
    int found = 0;
    Status s = Status::from(cairn_poll_tensor(c_, key.c_str(), timeout_ms, &found));
    if (!s) return s;
    return found != 0;
  }
  Status delete_tensor(const std::string& key) { return Status::from(cairn_delete_tensor(c_, key.c_str())); }
  // cairn_unpack_tensor_alloc: the tensor in one round trip into the buffer `alloc` returns for its
  // description (nullptr: CAIRN_ERR_NO_SPACE).
  Status unpack_tensor_to(const std::string& key, const std::function<void*(const TensorInfo&)>& alloc) {
    struct Ctx {
      const std::string* key;
      const std::function<void*(const TensorInfo&)>* alloc;
    } ctx{&key, &alloc};
    auto trampoline = [](void* p, cairn_dtype dtype, int ndim, const int64_t* shape, size_t nbytes) -> void* {
      auto* c = static_cast<Ctx*>(p);
      TensorInfo t{*c->key, dtype, std::vector<int64_t>(shape, shape + ndim), nbytes};
      return (*c->alloc)(t);
    };
    return Status::from(cairn_unpack_tensor_alloc(c_, key.c_str(), trampoline, &ctx));
  }
  // cairn_client_address: the socket path this client is connected to.
  std::string address() const { return cairn_client_address(c_); }

  // Collects the replies of every pipelined commit in flight (cairn_pipeline_flush): the first error
  // of a commit whose ticket was dropped unwaited, or kUnavailable when the connection was lost.
  Status flush_pipeline() { return Status::from(cairn_pipeline_flush(c_)); }
  size_t in_flight() const { return cairn_pipeline_in_flight(c_); }

  // parent: "" for none.
  Result<Writer> create_model(const std::string& id, const std::string& parent = "") {
    cairn_model_writer* w = nullptr;
    Status s = Status::from(cairn_model_create(c_, id.c_str(), parent.empty() ? nullptr : parent.c_str(), &w));
    if (!s) return s;
    return Writer(w);
  }
  // cairn_model_create_part: part `index` of `count` of model `id`, written by as many writers at once
  // (timeout_ms <= 0: 60 s for the missing parts).
  Result<Writer> create_part(const std::string& id, const std::string& parent, int index, int count,
                             int timeout_ms = 0) {
    cairn_model_writer* w = nullptr;
    Status s = Status::from(cairn_model_create_part(c_, id.c_str(), parent.empty() ? nullptr : parent.c_str(), index,
                                                    count, timeout_ms, &w));
    if (!s) return s;
    return Writer(w);
  }
  // cairn_model_put_file: the safetensors file at `path` as model `id` (parent, metadata JSON: "" for none).
  Status put_file(const std::string& id, const std::string& path, const std::string& parent = "",
                  cairn_durability d = CAIRN_DURABILITY_GLOBAL, const std::string& meta_json = "") {
    return Status::from(cairn_model_put_file(c_, id.c_str(), path.c_str(), parent.empty() ? nullptr : parent.c_str(), d,
                                             meta_json.empty() ? nullptr : meta_json.c_str()));
  }
  // cairn_model_get_file: model `id` written as the safetensors file `path`.
  Status get_file(const std::string& id, const std::string& path) {
    return Status::from(cairn_model_get_file(c_, id.c_str(), path.c_str()));
  }
  Result<Reader> open_model(const std::string& id) {
    cairn_model_reader* r = nullptr;
    Status s = Status::from(cairn_model_open(c_, id.c_str(), &r));
    if (!s) return s;
    return Reader(r);
  }
  Status prefetch(const std::string& id) { return Status::from(cairn_prefetch(c_, id.c_str())); }
  // cairn_prefetch_all: into every peer group member's DRAM, waiting; the per-member result as JSON text.
  Result<std::string> prefetch_all(const std::string& id) {
    char* out = nullptr;
    Status s = Status::from(cairn_prefetch_all(c_, id.c_str(), &out));
    if (!s) return s;
    std::string result(out ? out : "{}");
    cairn_free(out);
    return result;
  }
  // cairn_request: any other request of docs/protocol.md as JSON text; the answer as JSON text.
  Result<std::string> request(const std::string& request_json) {
    char* out = nullptr;
    Status s = Status::from(cairn_request(c_, request_json.c_str(), &out));
    if (!s) return s;
    std::string result(out ? out : "{}");
    cairn_free(out);
    return result;
  }
  // A hint (docs/policy.md), e.g. {"kind":"will_load","models":["m7"]}; the answer as JSON text.
  Result<std::string> hint(const std::string& hint_json) {
    char* out = nullptr;
    Status s = Status::from(cairn_hint(c_, hint_json.c_str(), &out));
    if (!s) return s;
    std::string result(out ? out : "{}");
    cairn_free(out);
    return result;
  }
  // A JSON query ({"op":"ancestors","model":id}, ...); the answer as JSON text.
  Result<std::string> query(const std::string& request_json) {
    char* out = nullptr;
    Status s = Status::from(cairn_query(c_, request_json.c_str(), &out));
    if (!s) return s;
    std::string result(out);
    cairn_free(out);
    return result;
  }

 private:
  explicit Client(cairn_client* c) : c_(c) {}
  cairn_client* c_ = nullptr;
};

}  // namespace cairn::v1

#endif  // CAIRN_CLIENT_HPP
