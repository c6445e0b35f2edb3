// What the C API's source files share (api/c/cairn_c*.cpp): the handles behind the C types, the
// thread-local last error, and the guards that keep every failure (an exception too) on this side of
// the C boundary as a status and a message.
#pragma once

#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api/cpp/connection.hpp"
#include "cairn/cairn.h"

struct cairn_client {
  std::unique_ptr<cairn::Connection> impl;
};
struct cairn_model_writer {
  std::unique_ptr<cairn::ConnectionWriter> impl;
  cairn_client* client;
};
struct cairn_model_reader {
  std::unique_ptr<cairn::ConnectionReader> impl;
  std::string metadata_text;  // cairn_model_describe's, made on first use
};
struct cairn_ticket {
  cairn_client* client;
  cairn::Ticket ticket;  // resolved by the client's pipeline (docs/protocol.md, "Pipelined commits")
};

namespace cairn::capi {

inline thread_local std::string g_last_error;

inline cairn_status fail(const cairn::Status& s) {
  g_last_error = s.to_string();
  return static_cast<cairn_status>(s.code());
}

inline cairn_status fail(cairn_status code, const std::string& msg) {
  g_last_error = std::string(cairn_status_string(code)) + ": " + msg;
  return code;
}

inline cairn_status done(const cairn::Status& s) {
  if (s.ok()) {
    g_last_error.clear();
    return CAIRN_OK;
  }
  return fail(s);
}

template <typename F>
cairn_status guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(CAIRN_ERR_NO_SPACE, "out of memory");
  } catch (const std::exception& e) {
    return fail(CAIRN_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(CAIRN_ERR_INTERNAL, "unknown exception");
  }
}

// A C caller may pass any int as an enum; loading an out-of-range value as a C++ enum is undefined,
// so the C shim reads enum arguments through their representation.
template <typename E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

inline bool check_dtype(const cairn_dtype& d) { return cairn::dtype_from_int(raw_enum(d)).has_value(); }

inline cairn_status make_shape(int ndim, const int64_t* shape, std::vector<int64_t>& out) {
  if (ndim < 0 || ndim > CAIRN_MAX_DIMS)
    return fail(CAIRN_ERR_INVALID_ARGUMENT, "ndim " + std::to_string(ndim) + " is outside 0..8");
  if (ndim > 0 && !shape) return fail(CAIRN_ERR_INVALID_ARGUMENT, "shape is NULL");
  out.assign(shape, shape + ndim);
  return CAIRN_OK;
}

#define CAIRN_REQUIRE_ARG(cond, what) \
  if (!(cond)) return fail(CAIRN_ERR_INVALID_ARGUMENT, what)

}  // namespace cairn::capi
