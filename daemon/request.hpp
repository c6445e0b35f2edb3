// Reading a request's fields: each error names the op and the field, so a client learns exactly
// what was wrong with what it sent. Shared by every component that serves requests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/status.hpp"

namespace cairn::request {

// A required string field.
Result<std::string> get_string(const nlohmann::json& req, const char* field);
// A required string field that must be a valid name (core/dtype.hpp valid_name); `what` names it
// in the error ("a model id").
Result<std::string> get_name(const nlohmann::json& req, const char* field, const char* what);
// A required non-negative integer field.
Result<uint64_t> get_u64(const nlohmann::json& req, const char* field);
// An optional integer field; dflt when absent or not an integer.
int64_t get_i64_or(const nlohmann::json& req, const char* field, int64_t dflt);

// A tensor's dtype and shape as a request gives them ("dtype", "shape"), and the bytes they need.
struct TensorDesc {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};
// `what` names the tensor in errors ("model 'a', tensor 'w'").
Result<TensorDesc> get_tensor_desc(const nlohmann::json& j, const std::string& what);

nlohmann::json shape_json(const std::vector<int64_t>& shape);

}  // namespace cairn::request
