// Named tensors: a flat key -> tensor space in the DRAM arena, outside models, for exchanging
// tensors between the processes of a workflow (a simulation puts samples, a trainer polls and
// reads them). Requests: put_tensor, tensor_info, lease_tensor, poll_tensor, delete_tensor
// (docs/protocol.md).
//
// Owns: the key -> tensor map, each tensor's arena extent, pin count and generation, the tensors
// replaced or deleted while a reader still held them (freed when the last lease ends), and the lock
// and condition variable that poll_tensor waits on. Never touches models, chunks or the repository;
// its only I/O is into the arena.
//
// Thread-safety: every method may be called from any thread; a Session by one thread at a time.
// Lock order: a leaf (the DRAM tier's allocator is called with the lock held).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"
#include "core/sync.hpp"
#include "daemon/request.hpp"
#include "daemon/session.hpp"
#include "tiers/dram/dram_tier.hpp"

namespace cairn {

class NamedTensors {
 public:
  explicit NamedTensors(DramTier& dram) : dram_(dram) {}

  // The requests (docs/protocol.md, "Named tensors"). put_tensor takes the bytes from a staging
  // space of the session or from blob; replacing a key keeps the old bytes for its leases.
  // `put_tensor`: replaces what was under the key (a leased tensor stays readable until released).
  // `blob` is the frame's payload (the bytes when r.space is absent).
  Status put(Session& s, const request::PutTensor& r, const std::vector<uint8_t>& blob);
  // `tensor_info`; kNotFound when nothing is under the key.
  Result<request::TensorInfoReply> info(const request::TensorKey& r);
  // `lease_tensor`: the tensor pinned in the arena until the session releases the lease.
  Result<request::TensorLeaseReply> lease(Session& s, const request::TensorKey& r);
  // `poll_tensor`: waits up to r.timeout_ms for a tensor under the key.
  request::PollTensorReply poll(const request::PollTensor& r);
  // `delete_tensor`; kNotFound when nothing is under the key.
  Status remove(const request::TensorKey& r);

  // Ends a lease_tensor pin (the reads component calls it when a lease is released).
  void unpin(const std::string& key, uint64_t generation);
  // Wakes every poll for good (the daemon is stopping).
  void stop();

 private:
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    Extent extent;
    uint32_t pins = 0;
    uint64_t generation = 0;
  };
  // Drops the key's tensor: its bytes go back to the arena, or wait for its last lease.
  void drop_locked(std::unordered_map<std::string, Tensor>::iterator it) CAIRN_REQUIRES(mu_);

  DramTier& dram_;
  cairn::Mutex mu_;
  cairn::CondVar cv_;  // a key appeared, or stopping
  std::unordered_map<std::string, Tensor> named_ CAIRN_GUARDED_BY(mu_);
  std::vector<Tensor> orphaned_ CAIRN_GUARDED_BY(mu_);  // replaced or deleted while pinned
  uint64_t generation_ CAIRN_GUARDED_BY(mu_) = 0;
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
};

}  // namespace cairn
