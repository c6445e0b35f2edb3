// libcairn_keras_h5.so: the Keras HDF5 converter (keras_h5.hpp) behind two C calls, for the Python
// package (cairn.io loads it with ctypes). Not a public API: the calls and their arguments are
// shared by this file and api/python/cairn/io.py only, and change together.
//
// Each call connects to the daemon at `address` (empty: $CAIRN_SOCKET, as the C API does) and
// returns a cairn_status value (include/cairn/status_codes.h): 0 on success; otherwise the status's
// one-line message (what failed and what to do) is copied into `message` (NUL-terminated, cut to
// `message_size` bytes). Thread-safe: each call has its own connection.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "core/durability.hpp"
#include "core/status.hpp"
#include "tools/keras_h5.hpp"

namespace {

int report(const cairn::Status& s, char* message, size_t message_size) {
  if (message != nullptr && message_size > 0) {
    std::string text = s.ok() ? std::string() : s.to_string();
    size_t n = std::min(text.size(), message_size - 1);
    std::memcpy(message, text.data(), n);
    message[n] = '\0';
  }
  return static_cast<int>(s.code());
}

std::string str(const char* s) { return s != nullptr ? std::string(s) : std::string(); }

template <typename F>
int guarded(char* message, size_t message_size, F&& body) {
  try {
    return report(body(), message, message_size);
  } catch (const std::exception& e) {
    return report(cairn::internal_error(std::string("Keras HDF5 converter: ") + e.what()), message, message_size);
  }
}

}  // namespace

extern "C" {

// Stores the Keras HDF5 file `file` as model `id` (keras_h5.hpp's import_keras_h5). `parent` may be
// null or empty (none), `meta_json` null or a JSON object merged into the metadata, `durability`
// "memory", "local" or "global".
__attribute__((visibility("default"))) int cairn_keras_h5_import(const char* address, const char* id, const char* file,
                                                                 const char* parent, const char* meta_json,
                                                                 const char* durability, char* message,
                                                                 size_t message_size) {
  return guarded(message, message_size, [&]() -> cairn::Status {
    auto level = cairn::durability_from_name(str(durability));
    if (!level)
      return cairn::invalid_argument("durability '" + str(durability) + "' is not one of memory, local, global");
    nlohmann::json meta = nlohmann::json::object();
    if (meta_json != nullptr && *meta_json != '\0') {
      meta = nlohmann::json::parse(meta_json, nullptr, false);
      if (meta.is_discarded() || !meta.is_object()) return cairn::invalid_argument("meta must be a JSON object");
    }
    auto client = cairn::tool::connect(str(address));
    if (!client.ok()) return client.status();
    return cairn::tool::import_keras_h5(*client, str(id), str(file), str(parent), meta, *level);
  });
}

// Writes model `id` as the Keras HDF5 file `file` (keras_h5.hpp's export_keras_h5).
__attribute__((visibility("default"))) int cairn_keras_h5_export(const char* address, const char* id, const char* file,
                                                                 char* message, size_t message_size) {
  return guarded(message, message_size, [&]() -> cairn::Status {
    auto client = cairn::tool::connect(str(address));
    if (!client.ok()) return client.status();
    return cairn::tool::export_keras_h5(*client, str(id), str(file));
  });
}

}  // extern "C"
