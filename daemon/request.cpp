#include "daemon/request.hpp"

namespace cairn::request {

using nlohmann::json;

Result<std::string> get_string(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_string())
    return invalid_argument("request '" + req.value("op", std::string()) + "': missing string field '" + field + "'");
  return it->get<std::string>();
}

Result<std::string> get_name(const json& req, const char* field, const char* what) {
  CAIRN_ASSIGN_OR_RETURN(std::string s, get_string(req, field));
  if (!valid_name(s))
    return invalid_argument(std::string(what) + " must be 1.." + std::to_string(kMaxNameBytes) +
                            " bytes of UTF-8 without NUL");
  return s;
}

Result<uint64_t> get_u64(const json& req, const char* field) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_number_unsigned())
    return invalid_argument("request '" + req.value("op", std::string()) + "': missing non-negative integer field '" +
                            field + "'");
  return it->get<uint64_t>();
}

int64_t get_i64_or(const json& req, const char* field, int64_t dflt) {
  auto it = req.find(field);
  if (it == req.end() || !it->is_number_integer()) return dflt;
  return it->get<int64_t>();
}

Result<TensorDesc> get_tensor_desc(const json& j, const std::string& what) {
  auto d = j.find("dtype");
  if (d == j.end() || !d->is_string()) return invalid_argument(what + ": missing string field 'dtype'");
  auto dt = dtype_from_name(d->get<std::string>());
  if (!dt) return invalid_argument(what + ": unknown dtype '" + d->get<std::string>() + "'");
  auto s = j.find("shape");
  if (s == j.end() || !s->is_array()) return invalid_argument(what + ": missing array field 'shape'");
  if (s->size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(what + ": " + std::to_string(s->size()) + " dimensions, at most " + std::to_string(kMaxDims));
  TensorDesc t{*dt, {}, 0};
  for (const auto& v : *s) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return invalid_argument(what + ": shape entries must be non-negative integers");
    t.shape.push_back(v.get<int64_t>());
  }
  auto n = tensor_nbytes(t.dtype, t.shape);
  if (!n) return invalid_argument(what + ": shape is too large");
  t.nbytes = *n;
  return t;
}

json shape_json(const std::vector<int64_t>& shape) {
  json a = json::array();
  for (auto d : shape) a.push_back(d);
  return a;
}

}  // namespace cairn::request
