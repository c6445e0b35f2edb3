// cairn/client.hpp — the C++ interface: RAII handles over the C API (cairn.h), header-only, so it
// needs nothing but libcairn.so and works with any C++17 compiler and standard library.
//
// Conventions: errors are values. Every call returns cairn::Status (or cairn::Result<T>); nothing
// throws. A Status carries the cairn_status code and the message cairn_last_error() gave.
// Handles are move-only and free themselves; a Reader or Writer must not outlive its Client.
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

 private:
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
  Result<Reader> open_model(const std::string& id) {
    cairn_model_reader* r = nullptr;
    Status s = Status::from(cairn_model_open(c_, id.c_str(), &r));
    if (!s) return s;
    return Reader(r);
  }
  Status prefetch(const std::string& id) { return Status::from(cairn_prefetch(c_, id.c_str())); }
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
