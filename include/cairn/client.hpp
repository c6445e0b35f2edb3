// cairn/client.hpp — the C++ interface: RAII handles over the C API (cairn.h), header-only, so it
// needs nothing but libcairn.so and works with any C++17 compiler and standard library.
//
// Conventions: errors are values. Every call returns cairn::v1::Status (or Result<T>); nothing
// throws. A Status carries the cairn_status code and the message cairn_last_error() gave.
// Handles are move-only and free themselves; a Reader or Writer must not outlive its Client.
// Every call of cairn.h has its method here, named by one rule: the C name without "cairn_" and
// without the object the class stands for -- Client is the connection (cairn_tensor_put ->
// Client::tensor_put, cairn_model_open -> Client::model_open, cairn_pipeline_flush ->
// Client::pipeline_flush), Writer the model being written (cairn_model_add_tensor ->
// Writer::add_tensor, cairn_model_commit_opts -> Writer::commit), Reader the open model
// (cairn_model_read -> Reader::read, cairn_model_map -> Reader::map), Ticket the ticket
// (cairn_ticket_wait -> Ticket::wait). Options are cairn.h's structs (cairn_read_options,
// cairn_commit_options, cairn_prefetch_options, cairn_file_options), defaulted to their *_INIT
// values. Older method names are [[deprecated]] for one release (docs/api.md lists them).
//
//   namespace cn = cairn::v1;
//   auto client = cn::Client::connect();             // $CAIRN_SOCKET, then the default socket
//   if (!client) { std::cerr << client.status().message() << "\n"; return 1; }
//   auto w = client->model_create("cand-17", "cand-9");
//   w->inherit_tensor("layer1.0.conv1.weight");
//   w->add_tensor("fc.weight", fc.data(), CAIRN_DTYPE_F32, {1000, 512});
//   cairn_commit_options opts = CAIRN_COMMIT_OPTIONS_INIT;  // global, waited
//   w->commit(opts);
//   auto r = client->model_open("cand-17");
//   auto views = r->map({"fc.weight"});                       // zero-copy, valid while r lives
#ifndef CAIRN_CLIENT_HPP
#define CAIRN_CLIENT_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
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
  static Status from(cairn_status code) { return code == CAIRN_OK ? Status() : Status(code, cairn_last_error()); }
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
  Result(T value) : value_(std::move(value)) {}          // NOLINT(google-explicit-constructor)
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
  // cairn_ticket_wait: waits up to timeout_ms (-1: forever) for the commit's outcome and then the
  // durability it asked for. An empty ticket (a commit that waited) is done: ok.
  Status wait(int timeout_ms = -1) { return t_ ? Status::from(cairn_ticket_wait(t_.get(), timeout_ms)) : Status(); }

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
  ~Writer() { abort(); }

  // cairn_model_add_tensor: the bytes are copied into the daemon's arena before it returns.
  Status add_tensor(const std::string& name, const void* data, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    return Status::from(
        cairn_model_add_tensor(w_, name.c_str(), data, dtype, static_cast<int>(shape.size()), shape.data()));
  }
  // One tensor of add_tensors.
  struct In {
    std::string name;
    const void* data;
    cairn_dtype dtype;
    std::vector<int64_t> shape;
  };
  // cairn_model_add_tensors: many tensors in one call, all copied, on every core, before it
  // returns; an error adds none of them.
  Status add_tensors(const std::vector<In>& tensors) {
    std::vector<cairn_tensor_in> in;
    in.reserve(tensors.size());
    for (const In& t : tensors)
      in.push_back(cairn_tensor_in{t.name.c_str(), t.data, t.dtype, static_cast<int>(t.shape.size()), t.shape.data()});
    return Status::from(cairn_model_add_tensors(w_, in.data(), in.size()));
  }
  // cairn_model_add_tensor_device: from device memory, copied before it returns.
  Status add_tensor_device(const std::string& name, const void* data, cairn_dtype dtype,
                           const std::vector<int64_t>& shape) {
    return Status::from(
        cairn_model_add_tensor_device(w_, name.c_str(), data, dtype, static_cast<int>(shape.size()), shape.data()));
  }
  // cairn_model_add_tensor_space: writable arena bytes for the tensor, to fill before commit (no copy).
  Result<void*> add_tensor_space(const std::string& name, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    void* data = nullptr;
    Status s = Status::from(
        cairn_model_add_tensor_space(w_, name.c_str(), dtype, static_cast<int>(shape.size()), shape.data(), &data));
    if (!s) return s;
    return data;
  }
  // cairn_model_seal_tensor: a tensor added with add_tensor_space holds its final bytes (hashed now).
  Status seal_tensor(const std::string& name) { return Status::from(cairn_model_seal_tensor(w_, name.c_str())); }
  // cairn_model_reserve: the sizes of the large tensors about to be added, allocated in one round trip.
  Status reserve(const std::vector<size_t>& nbytes) {
    return Status::from(cairn_model_reserve(w_, nbytes.size(), nbytes.data()));
  }
  // cairn_model_set_copy_threads: the threads this writer's copies may use (0: one per core, at most 4).
  Status set_copy_threads(unsigned threads) { return Status::from(cairn_model_set_copy_threads(w_, threads)); }
  // cairn_model_inherit_tensor: keeps the parent's tensor unchanged (no bytes, no hashing).
  Status inherit_tensor(const std::string& name) { return Status::from(cairn_model_inherit_tensor(w_, name.c_str())); }
  // cairn_model_inherit_all: every parent tensor not added or inherited by name.
  Status inherit_all() { return Status::from(cairn_model_inherit_all(w_)); }
  // cairn_model_set_architecture: the architecture graph as JSON text (docs/graph-format.md).
  Status set_architecture(const std::string& graph_json) {
    return Status::from(cairn_model_set_architecture(w_, graph_json.c_str()));
  }
  // cairn_model_set_metadata: a JSON object as text.
  Status set_metadata(const std::string& meta_json) {
    return Status::from(cairn_model_set_metadata(w_, meta_json.c_str()));
  }
  // cairn_model_commit_opts: commits as opts say and ends this writer. With opts.wait the ticket is
  // empty (the durability is reached); otherwise it waits for the commit's outcome (pipelined) and
  // the durability.
  Result<Ticket> commit(const cairn_commit_options& opts) {
    cairn_ticket* t = nullptr;
    Status s = Status::from(cairn_model_commit_opts(std::exchange(w_, nullptr), &opts, opts.wait ? nullptr : &t));
    if (!s) return s;
    return Ticket(t);
  }
  // cairn_model_commit with no ticket: commits and waits for durability d.
  Status commit(cairn_durability d = CAIRN_DURABILITY_GLOBAL) {
    return Status::from(cairn_model_commit(std::exchange(w_, nullptr), d, nullptr));
  }
  // cairn_model_abort: drops the uncommitted model (the destructor does it too). Nothing once committed.
  void abort() {
    if (w_) cairn_model_abort(std::exchange(w_, nullptr));
  }

  [[deprecated("use add_tensor (docs/api.md)")]] Status add(const std::string& name, const void* data,
                                                            cairn_dtype dtype, const std::vector<int64_t>& shape) {
    return add_tensor(name, data, dtype, shape);
  }
  [[deprecated("use add_tensors (docs/api.md)")]] Status add_many(const std::vector<In>& tensors) {
    return add_tensors(tensors);
  }
  [[deprecated("use add_tensor_device (docs/api.md)")]] Status add_device(const std::string& name, const void* data,
                                                                          cairn_dtype dtype,
                                                                          const std::vector<int64_t>& shape) {
    return add_tensor_device(name, data, dtype, shape);
  }
  [[deprecated("use inherit_tensor (docs/api.md)")]] Status inherit(const std::string& name) {
    return inherit_tensor(name);
  }
  [[deprecated("use add_tensor_space (docs/api.md)")]] Result<void*> add_space(const std::string& name,
                                                                               cairn_dtype dtype,
                                                                               const std::vector<int64_t>& shape) {
    return add_tensor_space(name, dtype, shape);
  }
  [[deprecated("use seal_tensor (docs/api.md)")]] Status seal(const std::string& name) { return seal_tensor(name); }
  // cairn_model_commit with a ticket: pipelined at memory (not a part), else once visible.
  [[deprecated("use commit(cairn_commit_options) (docs/api.md)")]] Result<Ticket> commit_async(cairn_durability d) {
    cairn_ticket* t = nullptr;
    Status s = Status::from(cairn_model_commit(std::exchange(w_, nullptr), d, &t));
    if (!s) return s;
    return Ticket(t);
  }
  [[deprecated("use commit(cairn_commit_options) with pipelined = 1, wait = 0 (docs/api.md)")]] Result<Ticket>
  commit_pipelined(cairn_durability d) {
    cairn_commit_options opts = CAIRN_COMMIT_OPTIONS_INIT;
    opts.durability = d;
    opts.wait = 0;
    opts.pipelined = 1;
    return commit(opts);
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
  ~Reader() { close(); }

  // cairn_model_describe: the open model's id, parent ("" for none) and metadata (JSON text).
  struct Description {
    std::string id, parent, metadata_json;
  };
  Result<Description> describe() {
    const char *id = nullptr, *parent = nullptr, *meta = nullptr;
    Status s = Status::from(cairn_model_describe(r_, &id, &parent, &meta));
    if (!s) return s;
    return Description{id, parent, meta};
  }
  // cairn_model_tensor_count.
  Result<size_t> tensor_count() {
    size_t n = 0;
    Status s = Status::from(cairn_model_tensor_count(r_, &n));
    if (!s) return s;
    return n;
  }
  // cairn_model_tensor_info: tensor number index (0 .. tensor_count() - 1).
  Result<TensorInfo> tensor_info(size_t index) {
    TensorInfo t;
    const char* name = nullptr;
    int ndim = 0;
    int64_t shape[CAIRN_MAX_DIMS];
    Status s = Status::from(cairn_model_tensor_info(r_, index, &name, &t.dtype, &ndim, shape, &t.nbytes));
    if (!s) return s;
    t.name = name;
    t.shape.assign(shape, shape + ndim);
    return t;
  }
  // Every tensor_info, in the model's order.
  Result<std::vector<TensorInfo>> tensors() {
    auto n = tensor_count();
    if (!n) return n.status();
    std::vector<TensorInfo> out;
    out.reserve(*n);
    for (size_t i = 0; i < *n; ++i) {
      auto t = tensor_info(i);
      if (!t) return t.status();
      out.push_back(std::move(*t));
    }
    return out;
  }
  // cairn_model_read: copies names[i] into dsts[i] (dst_bytes[i] must equal its size) with one
  // request; opts.kind says whether the buffers are host or device memory.
  Status read(const std::vector<std::string>& names, const std::vector<void*>& dsts,
              const std::vector<size_t>& dst_bytes, const cairn_read_options& opts = CAIRN_READ_OPTIONS_INIT) {
    if (dsts.size() != names.size() || dst_bytes.size() != names.size())
      return Status(CAIRN_ERR_INVALID_ARGUMENT, "read: names, dsts and dst_bytes differ in length");
    std::vector<const char*> c_names = c_strings(names);
    return Status::from(cairn_model_read(r_, names.size(), c_names.data(), dsts.data(), dst_bytes.data(), &opts));
  }
  // A view of one tensor: read-only, unless mapped with opts.private_copy (then copy-on-write).
  struct View {
    void* data = nullptr;
    size_t nbytes = 0;
  };
  // cairn_model_map: zero-copy views of the tensors with one request, valid while this Reader
  // lives; all or nothing. opts: host (read-only, or copy-on-write with private_copy) or device.
  Result<std::vector<View>> map(const std::vector<std::string>& names,
                                const cairn_read_options& opts = CAIRN_READ_OPTIONS_INIT) {
    std::vector<const char*> c_names = c_strings(names);
    std::vector<void*> data(names.size());
    std::vector<size_t> nbytes(names.size());
    Status s = Status::from(cairn_model_map(r_, names.size(), c_names.data(), data.data(), nbytes.data(), &opts));
    if (!s) return s;
    std::vector<View> out(names.size());
    for (size_t i = 0; i < names.size(); ++i) out[i] = View{data[i], nbytes[i]};
    return out;
  }
  // cairn_model_read_tensor: one tensor into dst (host or device memory by kind).
  Status read_tensor(const std::string& name, void* dst, size_t dst_bytes, cairn_memkind kind = CAIRN_MEM_HOST) {
    return Status::from(cairn_model_read_tensor(r_, name.c_str(), dst, dst_bytes, kind));
  }
  // cairn_model_map_tensor: a read-only view of one tensor in the daemon's arena.
  Result<View> map_tensor(const std::string& name) {
    const void* data = nullptr;
    size_t nbytes = 0;
    Status s = Status::from(cairn_model_map_tensor(r_, name.c_str(), &data, &nbytes));
    if (!s) return s;
    return View{const_cast<void*>(data), nbytes};
  }
  // cairn_model_close: ends the reader and its views (the destructor does it too).
  void close() {
    if (r_) cairn_model_close(std::exchange(r_, nullptr));
  }

  // The single-tensor forms take any string (not a braced list, which is map's and read's).
  template <typename S, typename = std::enable_if_t<std::is_convertible_v<const S&, std::string>>>
  [[deprecated("use read_tensor, or read with cairn_read_options (docs/api.md)")]] Status read(
      const S& name, void* dst, size_t dst_bytes, cairn_memkind kind = CAIRN_MEM_HOST) {
    return read_tensor(name, dst, dst_bytes, kind);
  }
  template <typename S, typename = std::enable_if_t<std::is_convertible_v<const S&, std::string>>>
  [[deprecated("use map_tensor, or map (docs/api.md)")]] Result<View> map(const S& name) {
    return map_tensor(name);
  }
  [[deprecated("use map with kind = CAIRN_MEM_CUDA (docs/api.md)")]] Result<View> map_device(const std::string& name,
                                                                                             int device = -1) {
    auto v = map({name}, device_options(device));
    if (!v) return v.status();
    return (*v)[0];
  }
  [[deprecated("use map (docs/api.md)")]] Result<std::vector<View>> map_many(const std::vector<std::string>& names) {
    return map(names);
  }
  [[deprecated("use map with kind = CAIRN_MEM_CUDA (docs/api.md)")]] Result<std::vector<View>> map_device_many(
      const std::vector<std::string>& names, int device = -1) {
    return map(names, device_options(device));
  }
  [[deprecated("use map with private_copy = 1 (docs/api.md)")]] Result<std::vector<View>> map_private(
      const std::vector<std::string>& names) {
    cairn_read_options opts = CAIRN_READ_OPTIONS_INIT;
    opts.private_copy = 1;
    return map(names, opts);
  }
  [[deprecated("use read (docs/api.md)")]] Status read_many(const std::vector<std::string>& names,
                                                            const std::vector<void*>& dsts,
                                                            const std::vector<size_t>& dst_bytes) {
    return read(names, dsts, dst_bytes);
  }
  [[deprecated("use read with kind = CAIRN_MEM_CUDA (docs/api.md)")]] Status read_many_device(
      const std::vector<std::string>& names, const std::vector<void*>& dsts, const std::vector<size_t>& dst_bytes) {
    return read(names, dsts, dst_bytes, device_options(-1));
  }

 private:
  static cairn_read_options device_options(int device) {
    cairn_read_options opts = CAIRN_READ_OPTIONS_INIT;
    opts.kind = CAIRN_MEM_CUDA;
    opts.device = device;
    return opts;
  }
  static std::vector<const char*> c_strings(const std::vector<std::string>& names) {
    std::vector<const char*> out;
    out.reserve(names.size());
    for (const std::string& n : names) out.push_back(n.c_str());
    return out;
  }

  cairn_model_reader* r_;
};

class Client {
 public:
  // cairn_connect. address: a socket path; empty: $CAIRN_SOCKET, then the default.
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
  // cairn_disconnect.
  ~Client() { cairn_disconnect(c_); }

  // cairn_client_address: the socket path this client is connected to.
  std::string address() const { return cairn_client_address(c_); }

  // ---- named tensors ----

  // cairn_tensor_put.
  Status tensor_put(const std::string& key, const void* data, cairn_dtype dtype, const std::vector<int64_t>& shape) {
    return Status::from(cairn_tensor_put(c_, key.c_str(), data, dtype, static_cast<int>(shape.size()), shape.data()));
  }
  // cairn_tensor_info.
  Result<TensorInfo> tensor_info(const std::string& key) {
    TensorInfo t;
    int ndim = 0;
    int64_t shape[CAIRN_MAX_DIMS];
    Status s = Status::from(cairn_tensor_info(c_, key.c_str(), &t.dtype, &ndim, shape, &t.nbytes));
    if (!s) return s;
    t.name = key;
    t.shape.assign(shape, shape + ndim);
    return t;
  }
  // cairn_tensor_unpack: dst_bytes must be the tensor's size.
  Status tensor_unpack(const std::string& key, void* dst, size_t dst_bytes) {
    return Status::from(cairn_tensor_unpack(c_, key.c_str(), dst, dst_bytes));
  }
  // cairn_tensor_unpack_alloc: the tensor in one round trip into the buffer `alloc` returns for its
  // description (nullptr: CAIRN_ERR_NO_SPACE).
  Status tensor_unpack_alloc(const std::string& key, const std::function<void*(const TensorInfo&)>& alloc) {
    struct Ctx {
      const std::string* key;
      const std::function<void*(const TensorInfo&)>* alloc;
    } ctx{&key, &alloc};
    auto trampoline = [](void* p, cairn_dtype dtype, int ndim, const int64_t* shape, size_t nbytes) -> void* {
      auto* c = static_cast<Ctx*>(p);
      TensorInfo t{*c->key, dtype, std::vector<int64_t>(shape, shape + ndim), nbytes};
      return (*c->alloc)(t);
    };
    return Status::from(cairn_tensor_unpack_alloc(c_, key.c_str(), trampoline, &ctx));
  }
  // cairn_tensor_poll: waits up to timeout_ms (0: not at all, -1: forever); whether the key exists.
  Result<bool> tensor_poll(const std::string& key, int timeout_ms) {
    int found = 0;
    Status s = Status::from(cairn_tensor_poll(c_, key.c_str(), timeout_ms, &found));
    if (!s) return s;
    return found != 0;
  }
  // cairn_tensor_delete.
  Status tensor_delete(const std::string& key) { return Status::from(cairn_tensor_delete(c_, key.c_str())); }

  // ---- models ----

  // cairn_model_create. parent: "" for none.
  Result<Writer> model_create(const std::string& id, const std::string& parent = "") {
    cairn_model_writer* w = nullptr;
    Status s = Status::from(cairn_model_create(c_, id.c_str(), parent.empty() ? nullptr : parent.c_str(), &w));
    if (!s) return s;
    return Writer(w);
  }
  // cairn_model_create_part: part `index` of `count` of model `id`, written by as many writers at once
  // (timeout_ms <= 0: 60 s for the missing parts).
  Result<Writer> model_create_part(const std::string& id, const std::string& parent, int index, int count,
                                   int timeout_ms = 0) {
    cairn_model_writer* w = nullptr;
    Status s = Status::from(cairn_model_create_part(c_, id.c_str(), parent.empty() ? nullptr : parent.c_str(), index,
                                                    count, timeout_ms, &w));
    if (!s) return s;
    return Writer(w);
  }
  // cairn_model_open.
  Result<Reader> model_open(const std::string& id) {
    cairn_model_reader* r = nullptr;
    Status s = Status::from(cairn_model_open(c_, id.c_str(), &r));
    if (!s) return s;
    return Reader(r);
  }
  // cairn_model_put_file: the safetensors file at `path` as model `id` (parent, metadata JSON: "" for none).
  Status model_put_file(const std::string& id, const std::string& path, const std::string& parent = "",
                        cairn_durability d = CAIRN_DURABILITY_GLOBAL, const std::string& meta_json = "") {
    return Status::from(cairn_model_put_file(c_, id.c_str(), path.c_str(), parent.empty() ? nullptr : parent.c_str(), d,
                                             meta_json.empty() ? nullptr : meta_json.c_str()));
  }
  // cairn_model_get_file: model `id` written as the safetensors file `path`.
  Status model_get_file(const std::string& id, const std::string& path) {
    return Status::from(cairn_model_get_file(c_, id.c_str(), path.c_str()));
  }
  // cairn_file_options.progress as a function: the phase, the bytes done, the bytes in all.
  using Progress = std::function<void(const char* phase, uint64_t done, uint64_t total)>;
  // cairn_model_put_file_opts: the file stored as opts say (parent, durability, metadata,
  // architecture); progress, when given, is called as the bytes move (it replaces opts.progress).
  Status model_put_file(const std::string& id, const std::string& path, cairn_file_options opts,
                        const Progress& progress = {}) {
    with_progress(opts, progress);
    return Status::from(cairn_model_put_file_opts(c_, id.c_str(), path.c_str(), &opts));
  }
  // cairn_model_get_file_opts: the model, or the tensors opts.names, written as the file `path`;
  // progress as for model_put_file.
  Status model_get_file(const std::string& id, const std::string& path, cairn_file_options opts,
                        const Progress& progress = {}) {
    with_progress(opts, progress);
    return Status::from(cairn_model_get_file_opts(c_, id.c_str(), path.c_str(), &opts));
  }
  // cairn_model_prefetch: stages the model as opts say; the daemon's answer as JSON text.
  Result<std::string> model_prefetch(const std::string& id,
                                     const cairn_prefetch_options& opts = CAIRN_PREFETCH_OPTIONS_INIT) {
    return json_call([&](char** out) { return cairn_model_prefetch(c_, id.c_str(), &opts, out); });
  }

  // ---- the pipeline of commits ----

  // cairn_pipeline_flush: collects the replies of every pipelined commit in flight: the first error
  // of a commit whose ticket was dropped unwaited, or kUnavailable when the connection was lost.
  Status pipeline_flush() { return Status::from(cairn_pipeline_flush(c_)); }
  // cairn_pipeline_in_flight: requests sent and not yet answered.
  size_t pipeline_in_flight() const { return cairn_pipeline_in_flight(c_); }

  // ---- hints, queries, other requests ----

  // cairn_hint: a hint (docs/policy.md), e.g. {"kind":"will_load","models":["m7"]}; the answer as JSON text.
  Result<std::string> hint(const std::string& hint_json) {
    return json_call([&](char** out) { return cairn_hint(c_, hint_json.c_str(), out); });
  }
  // cairn_query: a catalog query ({"op":"ancestors","model":id}, ...); the answer as JSON text.
  Result<std::string> query(const std::string& request_json) {
    return json_call([&](char** out) { return cairn_query(c_, request_json.c_str(), out); });
  }
  // cairn_request: a request of docs/protocol.md that has no call of its own ("list", "show",
  // "stats", "gc", ...); the answer as JSON text.
  Result<std::string> request(const std::string& request_json) {
    return json_call([&](char** out) { return cairn_request(c_, request_json.c_str(), out); });
  }

  [[deprecated("use tensor_put (docs/api.md)")]] Status put_tensor(const std::string& key, const void* data,
                                                                   cairn_dtype dtype,
                                                                   const std::vector<int64_t>& shape) {
    return tensor_put(key, data, dtype, shape);
  }
  [[deprecated("use tensor_unpack (docs/api.md)")]] Status unpack_tensor(const std::string& key, void* dst,
                                                                         size_t dst_bytes) {
    return tensor_unpack(key, dst, dst_bytes);
  }
  [[deprecated("use tensor_unpack_alloc (docs/api.md)")]] Status unpack_tensor_to(
      const std::string& key, const std::function<void*(const TensorInfo&)>& alloc) {
    return tensor_unpack_alloc(key, alloc);
  }
  [[deprecated("use tensor_poll (docs/api.md)")]] Result<bool> poll_tensor(const std::string& key, int timeout_ms) {
    return tensor_poll(key, timeout_ms);
  }
  [[deprecated("use tensor_delete (docs/api.md)")]] Status delete_tensor(const std::string& key) {
    return tensor_delete(key);
  }
  [[deprecated("use model_create (docs/api.md)")]] Result<Writer> create_model(const std::string& id,
                                                                               const std::string& parent = "") {
    return model_create(id, parent);
  }
  [[deprecated("use model_create_part (docs/api.md)")]] Result<Writer> create_part(const std::string& id,
                                                                                   const std::string& parent, int index,
                                                                                   int count, int timeout_ms = 0) {
    return model_create_part(id, parent, index, count, timeout_ms);
  }
  [[deprecated("use model_open (docs/api.md)")]] Result<Reader> open_model(const std::string& id) {
    return model_open(id);
  }
  [[deprecated("use model_put_file (docs/api.md)")]] Status put_file(const std::string& id, const std::string& path,
                                                                     const std::string& parent = "",
                                                                     cairn_durability d = CAIRN_DURABILITY_GLOBAL,
                                                                     const std::string& meta_json = "") {
    return model_put_file(id, path, parent, d, meta_json);
  }
  [[deprecated("use model_get_file (docs/api.md)")]] Status get_file(const std::string& id, const std::string& path) {
    return model_get_file(id, path);
  }
  [[deprecated("use model_prefetch (docs/api.md)")]] Status prefetch(const std::string& id) {
    return model_prefetch(id).status();
  }
  [[deprecated("use model_prefetch with all = 1 (docs/api.md)")]] Result<std::string> prefetch_all(
      const std::string& id) {
    cairn_prefetch_options opts = CAIRN_PREFETCH_OPTIONS_INIT;
    opts.all = 1;
    return model_prefetch(id, opts);
  }
  [[deprecated("use pipeline_flush (docs/api.md)")]] Status flush_pipeline() { return pipeline_flush(); }
  [[deprecated("use pipeline_in_flight (docs/api.md)")]] size_t in_flight() const { return pipeline_in_flight(); }

 private:
  explicit Client(cairn_client* c) : c_(c) {}
  // A C call that returns malloc'ed JSON text: the text (freed), "{}" when the call gave none.
  template <typename Call>
  static Result<std::string> json_call(Call call) {
    char* out = nullptr;
    Status s = Status::from(call(&out));
    if (!s) return s;
    std::string result(out ? out : "{}");
    cairn_free(out);
    return result;
  }
  // Points opts' progress callback at `progress` (which outlives the call it is used in).
  static void with_progress(cairn_file_options& opts, const Progress& progress) {
    if (!progress) return;
    opts.progress = [](void* ctx, const char* phase, uint64_t done, uint64_t total) {
      (*static_cast<const Progress*>(ctx))(phase, done, total);
    };
    opts.progress_ctx = const_cast<Progress*>(&progress);
  }
  cairn_client* c_ = nullptr;
};

}  // namespace cairn::v1

#endif  // CAIRN_CLIENT_HPP
