// The tools' side of the public C++ client (include/cairn/client.hpp, cairn::v1 over libcairn.so):
// its statuses as cairn::Status, requests and queries as JSON, dtypes as cairn::DType. The cairn
// tool and the Keras HDF5 converter talk to cairnd through cairn::v1 only.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cairn/client.hpp"
#include "core/dtype.hpp"
#include "core/status.hpp"

namespace cairn::tool {

namespace v1 = cairn::v1;

// A v1::Status as a cairn::Status: the same code, and the message without the code's own words in
// front (cairn_last_error gives "not found: model 'x' ...", cairn::Status adds them back).
inline Status to_status(const v1::Status& s) {
  if (s.ok()) return Status::OK();
  const StatusCode code = status_code_from_int(static_cast<int>(s.code()));
  std::string message = s.message();
  const std::string prefix = std::string(status_code_string(code)) + ": ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  return Status(code, std::move(message));
}

// cairn_connect (address "": $CAIRN_SOCKET, then the default socket).
inline Result<v1::Client> connect(const std::string& address = "") {
  auto c = v1::Client::connect(address);
  if (!c) return to_status(c.status());
  return std::move(*c);
}

// JSON text from the library as JSON (kProtocol if it is not).
inline Result<nlohmann::json> parse_reply(v1::Result<std::string> text, const char* what) {
  if (!text) return to_status(text.status());
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) return Status(StatusCode::kProtocol, std::string("the answer to ") + what + " is not JSON");
  return j;
}

// cairn_request: a request of the wire protocol without a call of its own ("list", "stats", "gc",
// ...); the response without its "status".
inline Result<nlohmann::json> request(v1::Client& client, const nlohmann::json& req) {
  return parse_reply(client.request(req.dump()), "the request");
}

// cairn_query: a catalog query; its answer.
inline Result<nlohmann::json> query(v1::Client& client, const nlohmann::json& q) {
  return parse_reply(client.query(q.dump()), "the query");
}

// cairn_hint: a hint (docs/policy.md); the daemon's answer.
inline Result<nlohmann::json> hint(v1::Client& client, const nlohmann::json& h) {
  return parse_reply(client.hint(h.dump()), "the hint");
}

// The C API's dtypes are cairn::DType's, in the same order (cairn.h, core/dtype.hpp).
inline cairn_dtype to_c(DType d) { return static_cast<cairn_dtype>(d); }
inline DType from_c(cairn_dtype d) { return static_cast<DType>(d); }

}  // namespace cairn::tool
