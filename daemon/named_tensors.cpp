#include "daemon/named_tensors.hpp"

#include <chrono>
#include <cstring>

#include "daemon/request.hpp"
#include "daemon/watchdog.hpp"

namespace cairn {

using namespace request;

void NamedTensors::drop_locked(std::unordered_map<std::string, Tensor>::iterator it) {
  if (it->second.pins > 0)
    orphaned_.push_back(it->second);
  else
    dram_.release(it->second.extent.offset, it->second.extent.length);
  named_.erase(it);
}

Status NamedTensors::put(Session& s, const PutTensor& r, const std::vector<uint8_t>& blob) {
  const std::string& key = r.key;
  const TensorDesc& d = r.desc;
  Extent ext;
  if (r.space) {
    const uint64_t id = *r.space;
    auto it = s.staging.find(id);
    if (it == s.staging.end()) return not_found("no staging space " + std::to_string(id) + " in this connection");
    if (it->second.length != d.nbytes)
      return invalid_argument("tensor '" + key + "': staging space holds " + std::to_string(it->second.length) +
                              " bytes but dtype and shape need " + std::to_string(d.nbytes));
    ext = it->second;
    s.staging.erase(it);
  } else {
    if (blob.size() != d.nbytes)
      return invalid_argument("tensor '" + key + "': " + std::to_string(blob.size()) +
                              " bytes sent but dtype and shape need " + std::to_string(d.nbytes));
    CAIRN_ASSIGN_OR_RETURN(uint64_t off, dram_.allocate(d.nbytes));
    if (d.nbytes) std::memcpy(dram_.base() + off, blob.data(), d.nbytes);
    ext = Extent{off, d.nbytes};
  }
  {
    cairn::MutexLock lock(mu_);
    auto it = named_.find(key);
    if (it != named_.end()) drop_locked(it);
    named_.emplace(key, Tensor{d.dtype, d.shape, d.nbytes, ext, 0, ++generation_});
  }
  cv_.notify_all();
  return Status::OK();
}

Result<TensorInfoReply> NamedTensors::info(const TensorKey& r) {
  cairn::MutexLock lock(mu_);
  auto it = named_.find(r.key);
  if (it == named_.end()) return not_found("no tensor under key '" + r.key + "'");
  return TensorInfoReply{it->second.dtype, it->second.shape, it->second.nbytes};
}

Result<TensorLeaseReply> NamedTensors::lease(Session& s, const TensorKey& r) {
  const std::string& key = r.key;
  cairn::MutexLock lock(mu_);
  auto it = named_.find(key);
  if (it == named_.end()) return not_found("no tensor under key '" + key + "'");
  ++it->second.pins;
  uint64_t id = s.next_id++;
  Session::Lease lease;
  lease.named_key = key;
  lease.named_generation = it->second.generation;
  s.leases[id] = std::move(lease);
  return TensorLeaseReply{id, it->second.extent.offset, {it->second.dtype, it->second.shape, it->second.nbytes}};
}

PollTensorReply NamedTensors::poll(const PollTensor& r) {
  const std::string& key = r.key;
  const int64_t timeout_ms = r.timeout_ms;
  Watchdog::ClientWait waiting;  // the client asked to wait
  cairn::MutexLock lock(mu_);
  auto present = [&]() CAIRN_REQUIRES(mu_) { return stopping_ || named_.count(key) > 0; };
  if (timeout_ms < 0)
    cv_.wait(lock, present);
  else
    cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), present);
  return PollTensorReply{named_.count(key) > 0};
}

Status NamedTensors::remove(const TensorKey& r) {
  cairn::MutexLock lock(mu_);
  auto it = named_.find(r.key);
  if (it == named_.end()) return not_found("no tensor under key '" + r.key + "'");
  drop_locked(it);
  return Status::OK();
}

void NamedTensors::unpin(const std::string& key, uint64_t generation) {
  cairn::MutexLock lock(mu_);
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
    cairn::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

}  // namespace cairn
