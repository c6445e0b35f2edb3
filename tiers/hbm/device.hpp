// The device seam: what the HBM tier needs of a GPU, behind one small interface with two backends.
//
//   cuda      (device_cuda.cpp): slabs from cudaMalloc (never managed memory), copies with
//             cudaMemcpyAsync on the device's own stream and an event per copy, host memory pinned
//             with cudaHostRegister, handles from cudaIpcGetMemHandle opened with cudaIpcOpenMemHandle.
//             Compiled whenever the CUDA toolkit is found (CAIRN_WITH_CUDA), so it cannot rot; it
//             only runs where a GPU is visible.
//   emulated  (device_emulated.cpp): the same semantics in host memory, for tests and development
//             on machines without a GPU: each slab is its own POSIX shared-memory segment, separate
//             from the DRAM arena (a device address space of its own); copies run on the device's
//             copy thread and complete asynchronously; a slab's handle is the segment's name, which
//             another process of the same user opens read-only (DeviceMapper).
//
// A device pointer is a `void*` in the address space of the process that holds it: the daemon's
// (Device) or a client's (DeviceMapper::open). With the emulated backend device pointers are host
// addresses; code above the seam never dereferences one itself, it always copies through the seam.
//
// Thread-safety: every method of Device, DeviceMapper and Completion may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn::hbm {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// One asynchronous copy. wait() blocks until it has completed and returns its outcome; the source
// and destination must stay valid until then. Destroying an unwaited Completion waits.
class Completion {
 public:
  virtual ~Completion() = default;
  virtual Status wait() = 0;
  // True once the copy completed (successfully or not); never blocks.
  virtual bool done() = 0;
};

// A slab of device memory: the unit of allocation and of export (CUDA IPC handles are per
// allocation, so the tier carves its pool out of slabs instead of allocating per chunk).
struct Slab {
  uint64_t id = 0;          // unique per Device
  uint8_t* base = nullptr;  // device pointer, in this process
  uint64_t size = 0;
  std::string handle;  // exported: what another process passes to DeviceMapper::open
};

// The daemon's side of one device.
class Device {
 public:
  virtual ~Device() = default;
  virtual const char* backend() const = 0;  // "cuda" or "emulated"
  virtual int ordinal() const = 0;

  // A slab of `size` bytes (kNoSpace when the device has not that much free; kUnavailable when the
  // device is gone). Its handle is exported at once.
  virtual Result<Slab> allocate_slab(uint64_t size) = 0;
  // REQUIRES: no copy into or out of the slab is in flight. Processes that opened its handle keep
  // their mapping until they close it.
  virtual void free_slab(const Slab& slab) = 0;

  // Starts copying n bytes from src to dst. Host pointers should be registered (register_host) for
  // full speed; unregistered ones work, slower.
  virtual Result<std::unique_ptr<Completion>> copy_async(void* dst, const void* src, uint64_t n, CopyKind kind) = 0;

  // Pins [p, p+n) of host memory for DMA (the DRAM arena). unregister_host undoes it.
  virtual Status register_host(void* p, uint64_t n) = 0;
  virtual void unregister_host(void* p) = 0;
};

// A client's side: opens handles exported by a Device of the same backend in another process, and
// copies between the caller's buffers and device memory.
class DeviceMapper {
 public:
  virtual ~DeviceMapper() = default;
  virtual const char* backend() const = 0;
  // Maps an exported slab of `size` bytes; returns its device pointer in this process, read-only
  // where the backend can enforce it. Each open is closed once with close(pointer, size).
  virtual Result<void*> open(const std::string& handle, uint64_t size) = 0;
  virtual void close(void* p, uint64_t size) = 0;
  // A synchronous copy (returns once the bytes are at dst) on device `device`.
  virtual Status copy(int device, void* dst, const void* src, uint64_t n, CopyKind kind) = 0;
  // Several copies of one kind on `device`, returning once all are done (CUDA: issued back to back
  // on one stream, then one synchronization). Each is {dst, src, n}.
  struct CopyOp {
    void* dst;
    const void* src;
    uint64_t n;
  };
  virtual Status copy_many(int device, const std::vector<CopyOp>& ops, CopyKind kind) {
    for (const auto& op : ops) CAIRN_RETURN_IF_ERROR(copy(device, op.dst, op.src, op.n, kind));
    return Status::OK();
  }
  // The device a device pointer belongs to (-1 when the backend cannot tell, or it is not one).
  virtual int device_of(const void* p) = 0;
  // Page-locks [p, p + n) of this process's memory for DMA (cudaHostRegister; read_only: the range
  // is mapped read-only), so that copies to and from it run at the link's speed instead of through
  // the driver's staging buffers. Undone by unpin_host(p). A no-op where copies need no pinning.
  virtual Status pin_host(void* /*p*/, uint64_t /*n*/, bool /*read_only*/) { return Status::OK(); }
  virtual void unpin_host(void* /*p*/) {}
};

// Whether this build has the CUDA backend (CAIRN_WITH_CUDA).
bool cuda_compiled();
// The backends compiled into this build: {"emulated"} or {"emulated", "cuda"}.
std::vector<std::string> backends();

// Opens device `ordinal` of `backend`. kInvalidArgument for an unknown backend; kUnavailable, with
// why, when the backend is not built in or has no such device ("no GPU").
Result<std::unique_ptr<Device>> open_device(const std::string& backend, int ordinal);
// The client's side of `backend`; kUnavailable, with why, as open_device.
Result<std::unique_ptr<DeviceMapper>> open_mapper(const std::string& backend);

// Visible GPUs (cudaGetDeviceCount), 0 when built without CUDA or none is visible; why gets the
// reason when 0 (optional).
int cuda_device_count(std::string* why = nullptr);

// The emulated backend's segments are named "/cairn-hbm-<pid>-..."; removes those whose daemon is
// gone (a daemon killed with -9 cannot unlink its own). Returns how many were removed.
int remove_stale_emulated_segments();

}  // namespace cairn::hbm
