#include "daemon/named_tensors.hpp"

#include <chrono>
#include <cstring>

#include "daemon/request.hpp"
#include "daemon/watchdog.hpp"

namespace cairn {

using nlohmann::json;
using namespace request;

void NamedTensors::drop_locked(std::unordered_map<std::string, Tensor>::iterator it) {
  if (it->second.pins > 0) orphaned_.push_back(it->second);
  else dram_.release(it->second.extent.offset, it->second.extent.length);
  named_.erase(it);
}

Result<json> NamedTensors::put(Session& s, const json& req, std::vector<uint8_t>& blob) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  CAIRN_ASSIGN_OR_RETURN(TensorDesc d, get_tensor_desc(req, "tensor '" + key + "'"));
  Extent ext;
  if (req.contains("space")) {
    CAIRN_ASSIGN_OR_RETURN(uint64_t id, get_u64(req, "space"));
    auto it = s.staging.find(id);
    if (it == s.staging.end()) return not_found("no staging space " + std::to_string(id) + " in this connection");
    if (it->second.length != d.nbytes)
      return invalid_argument("tensor '" + key + "': staging space holds " + std::to_string(it->second.length) +
                              " bytes but dtype and shape need " + std::to_string(d.nbytes));
    ext = it->second;
    s.staging.erase(it);
  } else {
    if (blob.size() != d.nbytes)
      return invalid_argument("tensor '" + key + "': " + std::to_string(blob.size()) + " bytes sent but dtype and shape need " +
                              std::to_string(d.nbytes));
    CAIRN_ASSIGN_OR_RETURN(uint64_t off, dram_.allocate(d.nbytes));
    if (d.nbytes) std::memcpy(dram_.base() + off, blob.data(), d.nbytes);
    ext = Extent{off, d.nbytes};
  }
  {
    std::lock_guard lock(mu_);
    auto it = named_.find(key);
    if (it != named_.end()) drop_locked(it);
    named_.emplace(key, Tensor{d.dtype, d.shape, d.nbytes, ext, 0, ++generation_});
  }
  cv_.notify_all();
  return json::object();
}

Result<json> NamedTensors::info(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  return json{{"dtype", dtype_name(it->second.dtype)}, {"shape", shape_json(it->second.shape)}, {"nbytes", it->second.nbytes}};
}

Result<json> NamedTensors::lease(Session& s, const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  ++it->second.pins;
  uint64_t id = s.next_id++;
  Session::Lease lease;
  lease.named_key = key;
  lease.named_generation = it->second.generation;
  s.leases[id] = std::move(lease);
  return json{{"lease", id},
              {"offset", it->second.extent.offset},
              {"nbytes", it->second.nbytes},
              {"dtype", dtype_name(it->second.dtype)},
              {"shape", shape_json(it->second.shape)}};
}

Result<json> NamedTensors::poll(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  int64_t timeout_ms = get_i64_or(req, "timeout_ms", 0);
  Watchdog::ClientWait waiting;  // the client asked to wait
  std::unique_lock lock(mu_);
  auto present = [&] { return stopping_ || named_.count(key) > 0; };
  if (timeout_ms < 0) cv_.wait(lock, present);
  else cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), present);
  return json{{"found", named_.count(key) > 0}};
}

Result<json> NamedTensors::remove(const json& req) {
  CAIRN_ASSIGN_OR_RETURN(std::string key, get_name(req, "key", "a tensor key"));
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  drop_locked(it);
  return json::object();
}

void NamedTensors::unpin(const std::string& key, uint64_t generation) {
  std::lock_guard lock(mu_);
  auto it = named_.find(key);
  if (it != named_.end() && it->second.generation == generation) {
    --it->second.pins;
    return;
  }
  for (auto o = orphaned_.begin(); o != orphaned_.end(); ++o) {
    if (o->generation != generation) continue;
    if (--o->pins == 0) {
      dram_.release(o->extent.offset, o->extent.length);
      orphaned_.erase(o);
    }
    return;
  }
}

void NamedTensors::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

}  // namespace cairn
