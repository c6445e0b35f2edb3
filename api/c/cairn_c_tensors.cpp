// The C API's named tensors (cairn.h, "Named tensors"): cairn_tensor_* and the design's synonyms.
#include <string>
#include <vector>

#include "api/c/cairn_c_internal.hpp"

using namespace cairn::capi;

extern "C" {

cairn_status cairn_tensor_put(cairn_client* c, const char* key, const void* data, cairn_dtype dtype, int ndim,
                              const int64_t* shape) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && key, "client and key must not be NULL");
    CAIRN_REQUIRE_ARG(check_dtype(dtype), "unknown dtype " + std::to_string(raw_enum(dtype)));
    std::vector<int64_t> s;
    if (cairn_status st = make_shape(ndim, shape, s); st != CAIRN_OK) return st;
    return done(c->impl->put_tensor(key, data, static_cast<cairn::DType>(dtype), s));
  });
}

cairn_status cairn_tensor_info(cairn_client* c, const char* key, cairn_dtype* dtype, int* ndim,
                               int64_t shape[CAIRN_MAX_DIMS], size_t* nbytes) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && key, "client and key must not be NULL");
    auto t = c->impl->tensor_info(key);
    if (!t.ok()) return fail(t.status());
    if (dtype) *dtype = static_cast<cairn_dtype>(t->dtype);
    if (ndim) *ndim = static_cast<int>(t->shape.size());
    if (shape)
      for (size_t i = 0; i < t->shape.size(); ++i) shape[i] = t->shape[i];
    if (nbytes) *nbytes = t->nbytes;
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_tensor_unpack(cairn_client* c, const char* key, void* dst, size_t dst_bytes) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && key, "client and key must not be NULL");
    CAIRN_REQUIRE_ARG(dst || dst_bytes == 0, "dst is NULL");
    return done(c->impl->unpack_tensor(key, dst, dst_bytes));
  });
}

cairn_status cairn_tensor_unpack_alloc(cairn_client* c, const char* key, cairn_alloc_fn alloc, void* ctx) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && key && alloc, "client, key and alloc must not be NULL");
    return done(c->impl->unpack_tensor_to(key, [&](const cairn::TensorInfo& t) -> cairn::Result<void*> {
      return alloc(ctx, static_cast<cairn_dtype>(t.dtype), static_cast<int>(t.shape.size()), t.shape.data(),
                   static_cast<size_t>(t.nbytes));
    }));
  });
}

cairn_status cairn_tensor_poll(cairn_client* c, const char* key, int timeout_ms, int* found) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && key && found, "client, key and found must not be NULL");
    auto r = c->impl->poll_tensor(key, timeout_ms);
    if (!r.ok()) return fail(r.status());
    *found = *r ? 1 : 0;
    return done(cairn::Status::OK());
  });
}

cairn_status cairn_tensor_delete(cairn_client* c, const char* key) {
  return guarded([&] {
    CAIRN_REQUIRE_ARG(c && key, "client and key must not be NULL");
    return done(c->impl->delete_tensor(key));
  });
}

cairn_status cairn_put_tensor(cairn_client* c, const char* key, const void* data, cairn_dtype dtype, int ndim,
                              const int64_t* shape) {
  return cairn_tensor_put(c, key, data, dtype, ndim, shape);
}
cairn_status cairn_get_tensor_info(cairn_client* c, const char* key, cairn_dtype* dtype, int* ndim,
                                   int64_t shape[CAIRN_MAX_DIMS], size_t* nbytes) {
  return cairn_tensor_info(c, key, dtype, ndim, shape, nbytes);
}
cairn_status cairn_unpack_tensor(cairn_client* c, const char* key, void* dst, size_t dst_bytes) {
  return cairn_tensor_unpack(c, key, dst, dst_bytes);
}
cairn_status cairn_unpack_tensor_alloc(cairn_client* c, const char* key, cairn_alloc_fn alloc, void* ctx) {
  return cairn_tensor_unpack_alloc(c, key, alloc, ctx);
}
cairn_status cairn_poll_tensor(cairn_client* c, const char* key, int timeout_ms, int* found) {
  return cairn_tensor_poll(c, key, timeout_ms, found);
}
cairn_status cairn_delete_tensor(cairn_client* c, const char* key) { return cairn_tensor_delete(c, key); }

}  // extern "C"
