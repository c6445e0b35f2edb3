// The C API: a shim over the C++ client. No exception crosses this boundary; every failure sets
// the thread-local last error.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "api/c/cairn_c_internal.hpp"
#include "api/cpp/connection.hpp"
#include "api/cpp/model_file.hpp"
#include "cairn/cairn.h"

using namespace cairn::capi;

namespace {

// The versioned options structs (cairn.h, "Options structs"): `out` starts from the defaults and
// takes the first in->size bytes of *in; a larger struct (a newer header) is accepted when every
// byte past what this library knows is zero, as Linux's copy_struct_from_user does.
template <typename Options>
cairn_status read_options(const Options* in, const Options& defaults, const char* type, Options& out) {
  out = defaults;
  if (!in) return CAIRN_OK;
  const size_t size = in->size;
  if (size < sizeof(size_t))
    return fail(CAIRN_ERR_INVALID_ARGUMENT, std::string(type) + ".size is " + std::to_string(size) +
                                                ": initialise the struct with its _INIT macro or _init call first");
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t i = sizeof(Options); i < size; ++i)
    if (bytes[i] != 0)
      return fail(CAIRN_ERR_INVALID_ARGUMENT, std::string(type) + " sets a field at byte " + std::to_string(i) +
                                                  " that this libcairn does not know (a newer cairn.h than the "
                                                  "library): link the library of that release");
  std::memcpy(&out, in, std::min(size, sizeof(Options)));
  out.size = sizeof(Options);
  return CAIRN_OK;
}

constexpr cairn_read_options kReadDefaults = CAIRN_READ_OPTIONS_INIT;
constexpr cairn_commit_options kCommitDefaults = CAIRN_COMMIT_OPTIONS_INIT;
constexpr cairn_prefetch_options kPrefetchDefaults = CAIRN_PREFETCH_OPTIONS_INIT;
constexpr cairn_file_options kFileDefaults = CAIRN_FILE_OPTIONS_INIT;

// JSON text of an argument (NULL or "": null), or an error naming what it is (`what`).
cairn_status parse_json_field(const char* text, const char* what, bool object, nlohmann::json& out) {
  out = nullptr;
  if (!text || !*text) return CAIRN_OK;
  out = nlohmann::json::parse(text, nullptr, false);
  if (out.is_discarded() || (object && !out.is_object()))
    return fail(CAIRN_ERR_INVALID_ARGUMENT,
                std::string(what) + (object ? " is not a JSON object" : " is not valid JSON"));
  return CAIRN_OK;
}

// The FileProgress that reports to a cairn_progress_fn (none without one).
cairn::FileProgress file_progress(const cairn_file_options& o) {
  if (!o.progress) return {};
  return [fn = o.progress, ctx = o.progress_ctx](const cairn::ProgressSnapshot& s) {
    fn(ctx, s.phase.c_str(), s.done, s.total);
  };
}

// The memory kind of read options: host or CUDA, anything else an error naming the value.
cairn_status read_kind(const cairn_read_options& o, bool& device) {
  const int k = raw_enum(o.kind);
  CAIRN_REQUIRE_ARG(k == CAIRN_MEM_HOST || k == CAIRN_MEM_CUDA,
                    "cairn_read_options.kind: unknown memkind " + std::to_string(k));
  device = k == CAIRN_MEM_CUDA;
  CAIRN_REQUIRE_ARG(o.private_copy == 0 || o.private_copy == 1,
                    "cairn_read_options.private_copy must be 0 or 1, not " + std::to_string(o.private_copy));
  return CAIRN_OK;
}

// cairn_model_map_tensors and cairn_model_map_tensors_private: the names checked and listed, one
// request through `map` (a ConnectionReader member), the views written out.
template <typename View, typename MapMany>
cairn_status map_tensors(cairn_model_reader* r, size_t count, const char* const* names, View* data, size_t* nbytes,
                         MapMany map) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(r && (count == 0 || (names && data)), "reader, names and data must not be NULL");
    std::vector<std::string> list;
    list.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      CAIRN_REQUIRE_ARG(names[i], "names[" + std::to_string(i) + "] must not be NULL");
      list.emplace_back(names[i]);
    }
    if (count == 0) return done(cairn::Status::OK());
    auto v = ((*r->impl).*map)(list);
    if (!v.ok()) return fail(v.status());
    for (size_t i = 0; i < count; ++i) {
      data[i] = (*v)[i].data();
      if (nbytes) nbytes[i] = (*v)[i].size();
    }
    return done(cairn::Status::OK());
  });
}

}  // namespace

extern "C" {

const char* cairn_status_string(cairn_status s) {
  return cairn::status_code_string(cairn::status_code_from_int(raw_enum(s)));
}

const char* cairn_last_error(void) { return g_last_error.c_str(); }

const char* cairn_status_name(int s) { return cairn::status_code_name(s); }

int cairn_library_has_cuda(void) {
#ifdef CAIRN_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

cairn_status cairn_connect(const char* address, cairn_client** out) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(out, "out is NULL");
    *out = nullptr;
    auto c = cairn::Connection::connect(address ? address : "");
    if (!c.ok()) return fail(c.status());
    *out = new cairn_client{std::move(c).value()};
    return done(cairn::Status::OK());
  });
}

void cairn_disconnect(cairn_client* c) { delete c; }

const char* cairn_client_address(const cairn_client* c) { return c ? c->impl->address().c_str() : ""; }

cairn_status cairn_model_create(cairn_client* c, const char* id, const char* parent, cairn_model_writer** out) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && id && out, "client, id and out must not be NULL");
    *out = nullptr;
    CAIRN_REQUIRE_ARG(cairn::valid_name(id), "model ids must be 1..1024 bytes of UTF-8 without NUL");
    CAIRN_REQUIRE_ARG(!parent || cairn::valid_name(parent), "parent ids must be 1..1024 bytes of UTF-8 without NUL");
    *out = new cairn_model_writer{std::make_unique<cairn::ConnectionWriter>(*c->impl, id, parent ? parent : ""), c};
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_create_part(cairn_client* c, const char* id, const char* parent, int index, int count,
                                     int timeout_ms, cairn_model_writer** out) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && id && out, "client, id and out must not be NULL");
    *out = nullptr;
    CAIRN_REQUIRE_ARG(cairn::valid_name(id), "model ids must be 1..1024 bytes of UTF-8 without NUL");
    CAIRN_REQUIRE_ARG(!parent || !*parent || cairn::valid_name(parent),
                      "parent ids must be 1..1024 bytes of UTF-8 without NUL");
    CAIRN_REQUIRE_ARG(count >= 2 && index >= 0 && index < count,
                      "part " + std::to_string(index) + " of " + std::to_string(count) +
                          ": a multi-part model has at least 2 parts, numbered from 0");
    auto w = std::make_unique<cairn::ConnectionWriter>(*c->impl, id, parent ? parent : "");
    cairn::Status st = w->set_part(static_cast<uint32_t>(index), static_cast<uint32_t>(count), timeout_ms);
    if (!st.ok()) return fail(st);
    *out = new cairn_model_writer{std::move(w), c};
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_add_tensor(cairn_model_writer* w, const char* name, const void* data, cairn_dtype dtype,
                                    int ndim, const int64_t* shape) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && name, "writer and name must not be NULL");
    CAIRN_REQUIRE_ARG(check_dtype(dtype), "unknown dtype " + std::to_string(raw_enum(dtype)));
    std::vector<int64_t> s;
    if (cairn_status st = make_shape(ndim, shape, s); st != CAIRN_OK) return st;
    return done(w->impl->add_tensor(name, data, static_cast<cairn::DType>(dtype), s));
  });
}

cairn_status cairn_model_add_tensors(cairn_model_writer* w, const cairn_tensor_in* tensors, size_t n) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w, "writer must not be NULL");
    CAIRN_REQUIRE_ARG(tensors || n == 0, "tensors must not be NULL");
    std::vector<cairn::ConnectionWriter::TensorIn> in(n);
    for (size_t i = 0; i < n; ++i) {
      const cairn_tensor_in& t = tensors[i];
      CAIRN_REQUIRE_ARG(t.name, "tensors[" + std::to_string(i) + "].name must not be NULL");
      CAIRN_REQUIRE_ARG(check_dtype(t.dtype),
                        "tensors[" + std::to_string(i) + "]: unknown dtype " + std::to_string(raw_enum(t.dtype)));
      if (cairn_status st = make_shape(t.ndim, t.shape, in[i].shape); st != CAIRN_OK) return st;
      in[i].name = t.name;
      in[i].data = t.data;
      in[i].dtype = static_cast<cairn::DType>(t.dtype);
    }
    return done(w->impl->add_tensors(in));
  });
}

cairn_status cairn_model_add_tensor_device(cairn_model_writer* w, const char* name, const void* data, cairn_dtype dtype,
                                           int ndim, const int64_t* shape) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && name, "writer and name must not be NULL");
    CAIRN_REQUIRE_ARG(check_dtype(dtype), "unknown dtype " + std::to_string(raw_enum(dtype)));
    std::vector<int64_t> s;
    if (cairn_status st = make_shape(ndim, shape, s); st != CAIRN_OK) return st;
    return done(w->impl->add_tensor_device(name, data, static_cast<cairn::DType>(dtype), s));
  });
}

cairn_status cairn_model_add_tensor_space(cairn_model_writer* w, const char* name, cairn_dtype dtype, int ndim,
                                          const int64_t* shape, void** data) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && name && data, "writer, name and data must not be NULL");
    *data = nullptr;
    CAIRN_REQUIRE_ARG(check_dtype(dtype), "unknown dtype " + std::to_string(raw_enum(dtype)));
    std::vector<int64_t> s;
    if (cairn_status st = make_shape(ndim, shape, s); st != CAIRN_OK) return st;
    auto p = w->impl->add_tensor_space(name, static_cast<cairn::DType>(dtype), s);
    if (!p.ok()) return fail(p.status());
    *data = *p;
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_seal_tensor(cairn_model_writer* w, const char* name) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && name, "writer and name must not be NULL");
    return done(w->impl->seal_tensor(name));
  });
}

cairn_status cairn_model_reserve(cairn_model_writer* w, size_t n, const size_t* nbytes) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && (n == 0 || nbytes), "writer and nbytes must not be NULL");
    return done(w->impl->reserve(std::vector<uint64_t>(nbytes, nbytes + n)));
  });
}

cairn_status cairn_model_set_copy_threads(cairn_model_writer* w, unsigned threads) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w, "writer is NULL");
    w->impl->set_copy_threads(threads);
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_inherit_all(cairn_model_writer* w) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w, "writer is NULL");
    return done(w->impl->inherit_all());
  });
}

cairn_status cairn_model_inherit_tensor(cairn_model_writer* w, const char* name) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && name, "writer and name must not be NULL");
    return done(w->impl->inherit_tensor(name));
  });
}

static cairn_status set_json(cairn_model_writer* w, const char* text, bool arch) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(w && text, "writer and JSON text must not be NULL");
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded())
      return fail(CAIRN_ERR_INVALID_ARGUMENT, std::string(arch ? "architecture" : "metadata") + " is not valid JSON");
    return done(arch ? w->impl->set_architecture(j) : w->impl->set_metadata(j));
  });
}

cairn_status cairn_model_set_architecture(cairn_model_writer* w, const char* graph_json) {
  return set_json(w, graph_json, true);
}
cairn_status cairn_model_set_metadata(cairn_model_writer* w, const char* meta_json) {
  return set_json(w, meta_json, false);
}

void cairn_read_options_init(cairn_read_options* o) {
  if (o) *o = kReadDefaults;
}
void cairn_commit_options_init(cairn_commit_options* o) {
  if (o) *o = kCommitDefaults;
}
void cairn_prefetch_options_init(cairn_prefetch_options* o) {
  if (o) *o = kPrefetchDefaults;
}
void cairn_file_options_init(cairn_file_options* o) {
  if (o) *o = kFileDefaults;
}

cairn_status cairn_model_commit_opts(cairn_model_writer* w, const cairn_commit_options* opts, cairn_ticket** ticket) {
  if (!w) return fail(CAIRN_ERR_INVALID_ARGUMENT, "writer is NULL");
  cairn_status st = guarded([&] {
    if (ticket) *ticket = nullptr;
    cairn_commit_options o;
    if (cairn_status e = read_options(opts, kCommitDefaults, "cairn_commit_options", o); e != CAIRN_OK) return e;
    const int level = raw_enum(o.durability);
    CAIRN_REQUIRE_ARG(level >= CAIRN_DURABILITY_MEMORY && level <= CAIRN_DURABILITY_GLOBAL,
                      "cairn_commit_options.durability: unknown durability " + std::to_string(level));
    CAIRN_REQUIRE_ARG(o.wait == 0 || o.wait == 1,
                      "cairn_commit_options.wait must be 0 or 1, not " + std::to_string(o.wait));
    CAIRN_REQUIRE_ARG(o.pipelined == 0 || o.pipelined == 1,
                      "cairn_commit_options.pipelined must be 0 or 1, not " + std::to_string(o.pipelined));
    CAIRN_REQUIRE_ARG(!(o.wait && o.pipelined),
                      "cairn_commit_options: a pipelined commit does not wait (set wait = 0 and wait on the ticket)");
    const auto d = static_cast<cairn::Durability>(level);
    if (o.wait) {
      auto r = w->impl->commit(d, true);
      if (!r.ok()) return fail(r.status());
      return done(cairn::Status::OK());
    }
    CAIRN_REQUIRE_ARG(ticket, "ticket is NULL: a commit with wait = 0 hands its outcome to a ticket");
    auto r = o.pipelined ? w->impl->commit_pipelined(d) : w->impl->commit_visible(d);
    if (!r.ok()) return fail(r.status());
    // The ticket is answered by the client the writer came from.
    *ticket = new cairn_ticket{w->client, std::move(r).value()};
    return done(cairn::Status::OK());
  });
  delete w;
  return st;
}

cairn_status cairn_model_commit(cairn_model_writer* w, cairn_durability d, cairn_ticket** ticket) {
  if (!w) return fail(CAIRN_ERR_INVALID_ARGUMENT, "writer is NULL");
  cairn_status st = guarded([&] {
    if (ticket) *ticket = nullptr;
    const int level = raw_enum(d);
    CAIRN_REQUIRE_ARG(level >= CAIRN_DURABILITY_MEMORY && level <= CAIRN_DURABILITY_GLOBAL,
                      "unknown durability " + std::to_string(level));
    if (!ticket) {
      auto r = w->impl->commit(static_cast<cairn::Durability>(level), true);
      if (!r.ok()) return fail(r.status());
      return done(cairn::Status::OK());
    }
    // At memory (not a part): pipelined; otherwise visible, the ticket waiting for the level.
    auto r = w->impl->commit_async(static_cast<cairn::Durability>(level));
    if (!r.ok()) return fail(r.status());
    *ticket = new cairn_ticket{w->client, std::move(r).value()};
    return done(cairn::Status::OK());
  });
  delete w;
  return st;
}

cairn_status cairn_model_commit_pipelined(cairn_model_writer* w, cairn_durability d, cairn_ticket** ticket) {
  cairn_commit_options o = CAIRN_COMMIT_OPTIONS_INIT;
  o.durability = d;
  o.wait = 0;
  o.pipelined = 1;
  return cairn_model_commit_opts(w, &o, ticket);
}

void cairn_model_abort(cairn_model_writer* w) { delete w; }

cairn_status cairn_ticket_wait(cairn_ticket* t, int timeout_ms) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(t, "ticket is NULL");
    if (!t->ticket || t->client == nullptr) return done(cairn::Status::OK());
    return done(t->client->impl->wait(t->ticket, timeout_ms));
  });
}

cairn_status cairn_wait(cairn_ticket* t, int timeout_ms) { return cairn_ticket_wait(t, timeout_ms); }

cairn_status cairn_pipeline_flush(cairn_client* c) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c, "client is NULL");
    return done(c->impl->flush_pipeline());
  });
}

size_t cairn_pipeline_in_flight(const cairn_client* c) { return c ? c->impl->in_flight() : 0; }

void cairn_ticket_free(cairn_ticket* t) { delete t; }

cairn_status cairn_model_open(cairn_client* c, const char* id, cairn_model_reader** out) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && id && out, "client, id and out must not be NULL");
    *out = nullptr;
    auto r = cairn::ConnectionReader::open(*c->impl, id);
    if (!r.ok()) return fail(r.status());
    *out = new cairn_model_reader{std::move(r).value(), {}};
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_tensor_count(cairn_model_reader* r, size_t* count) {
  CAIRN_REQUIRE_ARG(r && count, "reader and count must not be NULL");
  *count = r->impl->tensors().size();
  return done(cairn::Status::OK());
}

cairn_status cairn_model_tensor_info(cairn_model_reader* r, size_t index, const char** name, cairn_dtype* dtype,
                                     int* ndim, int64_t shape[CAIRN_MAX_DIMS], size_t* nbytes) {
  CAIRN_REQUIRE_ARG(r, "reader is NULL");
  const auto& ts = r->impl->tensors();
  if (index >= ts.size())
    return fail(CAIRN_ERR_INVALID_ARGUMENT, "tensor index " + std::to_string(index) + " is outside 0.." +
                                                std::to_string(ts.size()) + " (exclusive)");
  const auto& t = ts[index];
  if (name) *name = t.name.c_str();
  if (dtype) *dtype = static_cast<cairn_dtype>(t.dtype);
  if (ndim) *ndim = static_cast<int>(t.shape.size());
  if (shape)
    for (size_t i = 0; i < t.shape.size(); ++i) shape[i] = t.shape[i];
  if (nbytes) *nbytes = t.nbytes;
  return done(cairn::Status::OK());
}

cairn_status cairn_model_read(cairn_model_reader* r, size_t count, const char* const* names, void* const* dsts,
                              const size_t* dst_bytes, const cairn_read_options* opts) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(r && (count == 0 || (names && dsts && dst_bytes)),
                      "reader, names, dsts and dst_bytes must not be NULL");
    cairn_read_options o;
    if (cairn_status e = read_options(opts, kReadDefaults, "cairn_read_options", o); e != CAIRN_OK) return e;
    bool device = false;
    if (cairn_status e = read_kind(o, device); e != CAIRN_OK) return e;
    CAIRN_REQUIRE_ARG(!o.private_copy,
                      "cairn_read_options.private_copy is for cairn_model_map (a copy is the caller's already)");
    std::vector<std::string> list;
    list.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      CAIRN_REQUIRE_ARG(names[i], "names[" + std::to_string(i) + "] must not be NULL");
      CAIRN_REQUIRE_ARG(dsts[i] || dst_bytes[i] == 0, "dsts[" + std::to_string(i) + "] must not be NULL");
      list.emplace_back(names[i]);
    }
    if (count == 0) return done(cairn::Status::OK());
    if (device) {
      std::vector<void*> ptrs(dsts, dsts + count);
      std::vector<uint64_t> sizes(dst_bytes, dst_bytes + count);
      // One tensor: the single-tensor path (it needs no HBM tier lease batch).
      if (count == 1) return done(r->impl->read_to_device(list[0], ptrs[0], dst_bytes[0]));
      return done(r->impl->read_many_to_device(list, ptrs, sizes));
    }
    if (count == 1) return done(r->impl->read(list[0], dsts[0], dst_bytes[0]));
    std::vector<std::span<uint8_t>> spans;
    spans.reserve(count);
    for (size_t i = 0; i < count; ++i) spans.emplace_back(static_cast<uint8_t*>(dsts[i]), dst_bytes[i]);
    return done(r->impl->read_many(list, spans));
  });
}

cairn_status cairn_model_map(cairn_model_reader* r, size_t count, const char* const* names, void** data, size_t* nbytes,
                             const cairn_read_options* opts) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(r && (count == 0 || (names && data)), "reader, names and data must not be NULL");
    cairn_read_options o;
    if (cairn_status e = read_options(opts, kReadDefaults, "cairn_read_options", o); e != CAIRN_OK) return e;
    bool device = false;
    if (cairn_status e = read_kind(o, device); e != CAIRN_OK) return e;
    CAIRN_REQUIRE_ARG(!(device && o.private_copy),
                      "cairn_read_options.private_copy maps host memory only (device views are read-only)");
    std::vector<std::string> list;
    list.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      CAIRN_REQUIRE_ARG(names[i], "names[" + std::to_string(i) + "] must not be NULL");
      list.emplace_back(names[i]);
    }
    if (count == 0) return done(cairn::Status::OK());
    auto put = [&](size_t i, const void* p, size_t n) {
      data[i] = const_cast<void*>(p);  // read-only unless private_copy (cairn.h)
      if (nbytes) nbytes[i] = n;
    };
    if (device) {
      if (count == 1) {
        auto v = r->impl->map_device(list[0], o.device);
        if (!v.ok()) return fail(v.status());
        put(0, v->data(), v->size());
        return done(cairn::Status::OK());
      }
      auto v = r->impl->map_many_device(list, o.device);
      if (!v.ok()) return fail(v.status());
      for (size_t i = 0; i < count; ++i) put(i, (*v)[i].data(), (*v)[i].size());
      return done(cairn::Status::OK());
    }
    if (o.private_copy) {
      auto v = r->impl->map_many_private(list);
      if (!v.ok()) return fail(v.status());
      for (size_t i = 0; i < count; ++i) put(i, (*v)[i].data(), (*v)[i].size());
      return done(cairn::Status::OK());
    }
    if (count == 1) {
      auto v = r->impl->map(list[0]);
      if (!v.ok()) return fail(v.status());
      put(0, v->data(), v->size());
      return done(cairn::Status::OK());
    }
    auto v = r->impl->map_many(list);
    if (!v.ok()) return fail(v.status());
    for (size_t i = 0; i < count; ++i) put(i, (*v)[i].data(), (*v)[i].size());
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_read_tensor(cairn_model_reader* r, const char* name, void* dst, size_t dst_bytes,
                                     cairn_memkind kind) {
  CAIRN_REQUIRE_ARG(name, "reader and name must not be NULL");
  cairn_read_options o = CAIRN_READ_OPTIONS_INIT;
  o.kind = kind;
  return cairn_model_read(r, 1, &name, &dst, &dst_bytes, &o);
}

cairn_status cairn_model_map_tensor(cairn_model_reader* r, const char* name, const void** data, size_t* nbytes) {
  CAIRN_REQUIRE_ARG(name && data, "reader, name and data must not be NULL");
  return cairn_model_map(r, 1, &name, const_cast<void**>(data), nbytes, nullptr);
}

cairn_status cairn_model_map_tensor_device(cairn_model_reader* r, const char* name, int device, const void** ptr,
                                           size_t* nbytes) {
  CAIRN_REQUIRE_ARG(name && ptr, "reader, name and ptr must not be NULL");
  cairn_read_options o = CAIRN_READ_OPTIONS_INIT;
  o.kind = CAIRN_MEM_CUDA;
  o.device = device;
  return cairn_model_map(r, 1, &name, const_cast<void**>(ptr), nbytes, &o);
}

cairn_status cairn_model_map_tensors(cairn_model_reader* r, size_t count, const char* const* names, const void** data,
                                     size_t* nbytes) {
  return cairn_model_map(r, count, names, const_cast<void**>(data), nbytes, nullptr);
}

cairn_status cairn_model_map_tensors_private(cairn_model_reader* r, size_t count, const char* const* names, void** data,
                                             size_t* nbytes) {
  cairn_read_options o = CAIRN_READ_OPTIONS_INIT;
  o.private_copy = 1;
  return cairn_model_map(r, count, names, data, nbytes, &o);
}

cairn_status cairn_model_read_tensors(cairn_model_reader* r, size_t count, const char* const* names, void* const* dsts,
                                      const size_t* dst_bytes) {
  return cairn_model_read(r, count, names, dsts, dst_bytes, nullptr);
}

cairn_status cairn_model_map_tensors_device(cairn_model_reader* r, size_t count, const char* const* names, int device,
                                            const void** ptrs, size_t* nbytes) {
  cairn_read_options o = CAIRN_READ_OPTIONS_INIT;
  o.kind = CAIRN_MEM_CUDA;
  o.device = device;
  return cairn_model_map(r, count, names, const_cast<void**>(ptrs), nbytes, &o);
}

cairn_status cairn_model_read_tensors_device(cairn_model_reader* r, size_t count, const char* const* names,
                                             void* const* dsts, const size_t* dst_bytes) {
  cairn_read_options o = CAIRN_READ_OPTIONS_INIT;
  o.kind = CAIRN_MEM_CUDA;
  return cairn_model_read(r, count, names, dsts, dst_bytes, &o);
}

cairn_status cairn_model_describe(cairn_model_reader* r, const char** id, const char** parent,
                                  const char** metadata_json) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(r, "reader is NULL");
    if (id) *id = r->impl->id().c_str();
    if (parent) *parent = r->impl->parent().c_str();
    if (metadata_json) {
      if (r->metadata_text.empty()) {
        const nlohmann::json& m = r->impl->metadata();
        r->metadata_text = m.is_object() ? m.dump() : "{}";
      }
      *metadata_json = r->metadata_text.c_str();
    }
    return done(cairn::Status::OK());
  });
}

void cairn_model_close(cairn_model_reader* r) { delete r; }

// A malloc'ed copy of j's text (freed by cairn_free), or nullptr when out of memory.
static char* dump_c(const nlohmann::json& j) {
  std::string s = j.dump();
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

cairn_status cairn_model_prefetch(cairn_client* c, const char* id, const cairn_prefetch_options* opts,
                                  char** result_json) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && id, "client and id must not be NULL");
    if (result_json) *result_json = nullptr;
    cairn_prefetch_options o;
    if (cairn_status e = read_options(opts, kPrefetchDefaults, "cairn_prefetch_options", o); e != CAIRN_OK) return e;
    const int k = raw_enum(o.kind);
    CAIRN_REQUIRE_ARG(k == CAIRN_MEM_HOST || k == CAIRN_MEM_CUDA,
                      "cairn_prefetch_options.kind: unknown memkind " + std::to_string(k));
    CAIRN_REQUIRE_ARG(o.all == 0 || o.all == 1,
                      "cairn_prefetch_options.all must be 0 or 1, not " + std::to_string(o.all));
    CAIRN_REQUIRE_ARG(o.timeout_ms >= 0, "cairn_prefetch_options.timeout_ms must not be negative");
    nlohmann::json req{{"op", "prefetch"}, {"id", id}};
    if (k == CAIRN_MEM_CUDA) {
      req["tier"] = "hbm";
      if (o.device >= 0) req["device"] = o.device;
    }
    if (o.all) req["all"] = true;
    if (o.all && o.timeout_ms > 0) req["timeout_ms"] = o.timeout_ms;
    if (o.progress_id && *o.progress_id) req["progress"] = o.progress_id;
    auto r = c->impl->call(req);
    if (!r.ok()) return fail(r.status());
    r->erase("status");
    if (result_json) {
      char* out = dump_c(*r);
      if (!out) return fail(CAIRN_ERR_NO_SPACE, "out of memory");
      *result_json = out;
    }
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_prefetch(cairn_client* c, const char* id) { return cairn_model_prefetch(c, id, nullptr, nullptr); }

cairn_status cairn_prefetch_all(cairn_client* c, const char* id, char** result_json) {
  cairn_prefetch_options o = CAIRN_PREFETCH_OPTIONS_INIT;
  o.all = 1;
  return cairn_model_prefetch(c, id, &o, result_json);
}

cairn_status cairn_hint(cairn_client* c, const char* hint_json, char** result_json) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && hint_json, "client and hint must not be NULL");
    if (result_json) *result_json = nullptr;
    auto h = nlohmann::json::parse(hint_json, nullptr, false);
    if (h.is_discarded() || !h.is_object())
      return fail(CAIRN_ERR_INVALID_ARGUMENT, "the hint is not a JSON object (docs/policy.md)");
    auto r = c->impl->hint(h);
    if (!r.ok()) return fail(r.status());
    if (result_json) {
      char* out = dump_c(*r);
      if (!out) return fail(CAIRN_ERR_NO_SPACE, "out of memory");
      *result_json = out;
    }
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_model_put_file(cairn_client* c, const char* id, const char* path, const char* parent,
                                  cairn_durability d, const char* meta_json) {
  cairn_file_options o = kFileDefaults;
  o.parent = parent;
  std::memcpy(&o.durability, &d, sizeof d);  // checked by cairn_model_put_file_opts (raw_enum)
  o.metadata_json = meta_json;
  return cairn_model_put_file_opts(c, id, path, &o);
}

cairn_status cairn_model_get_file(cairn_client* c, const char* id, const char* path) {
  return cairn_model_get_file_opts(c, id, path, nullptr);
}

cairn_status cairn_model_put_file_opts(cairn_client* c, const char* id, const char* path,
                                       const cairn_file_options* opts) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && id && path, "client, id and path must not be NULL");
    cairn_file_options o;
    if (cairn_status e = read_options(opts, kFileDefaults, "cairn_file_options", o); e != CAIRN_OK) return e;
    const int level = raw_enum(o.durability);
    CAIRN_REQUIRE_ARG(level >= CAIRN_DURABILITY_MEMORY && level <= CAIRN_DURABILITY_GLOBAL,
                      "unknown durability " + std::to_string(level));
    CAIRN_REQUIRE_ARG(o.count == 0 && !o.names,
                      "cairn_file_options.count and names choose the tensors of a get, not of a put");
    nlohmann::json meta, arch;
    if (cairn_status e = parse_json_field(o.metadata_json, "the metadata", true, meta); e != CAIRN_OK) return e;
    if (cairn_status e = parse_json_field(o.architecture_json, "the architecture graph", false, arch); e != CAIRN_OK)
      return e;
    return done(cairn::put_safetensors_file(*c->impl, id, path, o.parent ? o.parent : "",
                                            static_cast<cairn::Durability>(level), meta, arch, file_progress(o)));
  });
}

cairn_status cairn_model_get_file_opts(cairn_client* c, const char* id, const char* path,
                                       const cairn_file_options* opts) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && id && path, "client, id and path must not be NULL");
    cairn_file_options o;
    if (cairn_status e = read_options(opts, kFileDefaults, "cairn_file_options", o); e != CAIRN_OK) return e;
    CAIRN_REQUIRE_ARG(!o.parent && !o.metadata_json && !o.architecture_json,
                      "cairn_file_options.parent, metadata_json and architecture_json are for a put, not a get");
    CAIRN_REQUIRE_ARG(o.count == 0 || o.names,
                      "cairn_file_options.names is NULL with a count of " + std::to_string(o.count));
    std::vector<std::string> names;
    names.reserve(o.count);
    for (size_t i = 0; i < o.count; ++i) {
      CAIRN_REQUIRE_ARG(o.names[i], "cairn_file_options.names[" + std::to_string(i) + "] must not be NULL");
      names.emplace_back(o.names[i]);
    }
    return done(cairn::get_safetensors_file(*c->impl, id, path, names, file_progress(o)));
  });
}

cairn_status cairn_query(cairn_client* c, const char* request_json, char** result_json) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && request_json && result_json, "client, request and result must not be NULL");
    *result_json = nullptr;
    auto q = nlohmann::json::parse(request_json, nullptr, false);
    if (q.is_discarded() || !q.is_object()) return fail(CAIRN_ERR_INVALID_ARGUMENT, "the query is not a JSON object");
    auto r = c->impl->query(q);
    if (!r.ok()) return fail(r.status());
    char* out = dump_c(*r);
    if (!out) return fail(CAIRN_ERR_NO_SPACE, "out of memory");
    *result_json = out;
    return done(cairn::Status::OK());
  });
}

// Ops that have a call of their own (cairn.h, cairn_request), and that call.
static const char* dedicated_call(const std::string& op) {
  static const std::pair<const char*, const char*> kOps[] = {
      {"hello", "cairn_connect"},
      {"allocate", "cairn_model_add_tensor_space"},
      {"free", "cairn_model_abort"},
      {"put_tensor", "cairn_tensor_put"},
      {"tensor_info", "cairn_tensor_info"},
      {"lease_tensor", "cairn_tensor_unpack"},
      {"poll_tensor", "cairn_tensor_poll"},
      {"delete_tensor", "cairn_tensor_delete"},
      {"commit", "cairn_model_create and cairn_model_commit_opts"},
      {"open", "cairn_model_open"},
      {"lease", "cairn_model_open and cairn_model_map or cairn_model_read"},
      {"lease_device", "cairn_model_map or cairn_model_read with kind CAIRN_MEM_CUDA"},
      {"release", "cairn_model_close"},
      {"prefetch", "cairn_model_prefetch"},
      {"hint", "cairn_hint"},
      {"query", "cairn_query"},
      {"wait", "cairn_ticket_wait"},
  };
  for (const auto& [name, call] : kOps)
    if (op == name) return call;
  return nullptr;
}

cairn_status cairn_request(cairn_client* c, const char* request_json, char** response_json) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && request_json && response_json, "client, request and response must not be NULL");
    *response_json = nullptr;
    auto q = nlohmann::json::parse(request_json, nullptr, false);
    if (q.is_discarded() || !q.is_object()) return fail(CAIRN_ERR_INVALID_ARGUMENT, "the request is not a JSON object");
    auto op = q.find("op");
    if (op == q.end() || !op->is_string()) return fail(CAIRN_ERR_INVALID_ARGUMENT, "the request has no string \"op\"");
    const std::string name = op->get<std::string>();
    if (const char* call = dedicated_call(name))
      return fail(CAIRN_ERR_INVALID_ARGUMENT, "op \"" + name + "\" cannot be sent through cairn_request; use " + call);
    if (q.contains("release"))
      return fail(CAIRN_ERR_INVALID_ARGUMENT,
                  "a request sent through cairn_request cannot carry \"release\"; leases end with cairn_model_close");
    auto r = c->impl->call(q);
    if (!r.ok()) return fail(r.status());
    r->erase("status");
    char* out = dump_c(*r);
    if (!out) return fail(CAIRN_ERR_NO_SPACE, "out of memory");
    *response_json = out;
    return done(cairn::Status::OK());
  });
}

void cairn_free(void* p) { std::free(p); }

}  // extern "C"
