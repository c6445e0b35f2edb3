// The CUDA device (tiers/hbm/device.hpp): slabs from cudaMalloc, copies on the device's own
// non-blocking stream with an event each, host memory pinned with cudaHostRegister, slabs exported
// with cudaIpcGetMemHandle and opened with cudaIpcOpenMemHandle. Built whenever the toolkit is
// found (CAIRN_WITH_CUDA); runs only where a GPU is visible.
//
// A handle is "cuda:<ordinal>:<128 hex digits of cudaIpcMemHandle_t>"; the ordinal is the daemon's
// (a client must see the devices as the daemon does: the same CUDA_VISIBLE_DEVICES).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "tiers/hbm/device_internal.hpp"

namespace cairn::hbm {

namespace {

std::string cuda_error(const std::string& what, cudaError_t e) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

Status cuda_status(const std::string& what, cudaError_t e) {
  if (e == cudaSuccess) return Status::OK();
  if (e == cudaErrorMemoryAllocation) return no_space(cuda_error(what, e) + "; lower tiers.hbm.capacity");
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
    return unavailable(cuda_error(what, e));
  return io_error(cuda_error(what, e));
}

cudaMemcpyKind memcpy_kind(CopyKind k) {
  switch (k) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

std::string to_hex(const void* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) out += kDigits[b[i] >> 4], out += kDigits[b[i] & 15];
  return out;
}

bool from_hex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    b[i] = static_cast<unsigned char>(v);
  }
  return true;
}

class CudaCompletion final : public Completion {
 public:
  CudaCompletion(int device, cudaEvent_t ev) : device_(device), ev_(ev) {}
  ~CudaCompletion() override {
    (void)wait();
    cudaEventDestroy(ev_);
  }
  Status wait() override {
    cudaSetDevice(device_);
    return cuda_status("waiting for a copy on GPU " + std::to_string(device_), cudaEventSynchronize(ev_));
  }
  bool done() override { return cudaEventQuery(ev_) != cudaErrorNotReady; }

 private:
  int device_;
  cudaEvent_t ev_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  const char* backend() const override { return "cuda"; }
  int ordinal() const override { return ordinal_; }

  Result<Slab> allocate_slab(uint64_t size) override {
    CAIRN_RETURN_IF_ERROR(cuda_status("selecting GPU " + std::to_string(ordinal_), cudaSetDevice(ordinal_)));
    void* p = nullptr;
    // Plain device memory: never managed (cudaMallocManaged) memory, which can migrate under a lease.
    CAIRN_RETURN_IF_ERROR(
        cuda_status("cudaMalloc of a " + std::to_string(size) + "-byte slab on GPU " + std::to_string(ordinal_),
                    cudaMalloc(&p, size)));
    cudaIpcMemHandle_t h;
    if (cudaError_t e = cudaIpcGetMemHandle(&h, p); e != cudaSuccess) {
      cudaFree(p);
      return cuda_status("cudaIpcGetMemHandle on GPU " + std::to_string(ordinal_), e);
    }
    Slab s;
    s.id = next_slab_++;
    s.base = static_cast<uint8_t*>(p);
    s.size = size;
    s.handle = "cuda:" + std::to_string(ordinal_) + ":" + to_hex(&h, sizeof h);
    return s;
  }

  void free_slab(const Slab& slab) override {
    cudaSetDevice(ordinal_);
    cudaFree(slab.base);
  }

  Result<std::unique_ptr<Completion>> copy_async(void* dst, const void* src, uint64_t n, CopyKind kind) override {
    std::lock_guard lock(mu_);  // one stream: copies complete in the order they were started
    CAIRN_RETURN_IF_ERROR(cuda_status("selecting GPU " + std::to_string(ordinal_), cudaSetDevice(ordinal_)));
    CAIRN_RETURN_IF_ERROR(cuda_status("cudaMemcpyAsync on GPU " + std::to_string(ordinal_),
                                      cudaMemcpyAsync(dst, src, n, memcpy_kind(kind), stream_)));
    cudaEvent_t ev;
    CAIRN_RETURN_IF_ERROR(cuda_status("cudaEventCreate", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)));
    if (cudaError_t e = cudaEventRecord(ev, stream_); e != cudaSuccess) {
      cudaEventDestroy(ev);
      return cuda_status("cudaEventRecord", e);
    }
    return std::unique_ptr<Completion>(new CudaCompletion(ordinal_, ev));
  }

  Status register_host(void* p, uint64_t n) override {
    cudaSetDevice(ordinal_);
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) return Status::OK();
    return cuda_status("cudaHostRegister of " + std::to_string(n) + " bytes", e);
  }
  void unregister_host(void* p) override { cudaHostUnregister(p); }

 private:
  const int ordinal_;
  cudaStream_t stream_;
  std::mutex mu_;
  uint64_t next_slab_ = 1;
};

class CudaMapper final : public DeviceMapper {
 public:
  const char* backend() const override { return "cuda"; }
  Result<void*> open(const std::string& handle, uint64_t) override {
    int device = -1;
    size_t colon = handle.find(':', 5);
    if (handle.compare(0, 5, "cuda:") != 0 || colon == std::string::npos ||
        std::sscanf(handle.c_str() + 5, "%d", &device) != 1 || device < 0)
      return invalid_argument("'" + handle.substr(0, 16) + "...' is not a CUDA IPC handle");
    cudaIpcMemHandle_t h;
    if (!from_hex(handle.substr(colon + 1), &h, sizeof h))
      return invalid_argument("a CUDA IPC handle of the wrong length");
    CAIRN_RETURN_IF_ERROR(cuda_status("selecting GPU " + std::to_string(device), cudaSetDevice(device)));
    void* p = nullptr;
    CAIRN_RETURN_IF_ERROR(cuda_status("cudaIpcOpenMemHandle on GPU " + std::to_string(device),
                                      cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess)));
    return p;
  }
  void close(void* p, uint64_t) override { cudaIpcCloseMemHandle(p); }
  Status copy(int device, void* dst, const void* src, uint64_t n, CopyKind kind) override {
    if (device >= 0)
      CAIRN_RETURN_IF_ERROR(cuda_status("selecting GPU " + std::to_string(device), cudaSetDevice(device)));
    return cuda_status("cudaMemcpy of " + std::to_string(n) + " bytes", cudaMemcpy(dst, src, n, memcpy_kind(kind)));
  }
  int device_of(const void* p) override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
  }
  Status copy_many(int device, const std::vector<CopyOp>& ops, CopyKind kind) override {
    if (device >= 0)
      CAIRN_RETURN_IF_ERROR(cuda_status("selecting GPU " + std::to_string(device), cudaSetDevice(device)));
    std::lock_guard<std::mutex> lock(mu_);
    if (!stream_)
      CAIRN_RETURN_IF_ERROR(
          cuda_status("cudaStreamCreate", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
    for (const auto& op : ops) {
      cudaError_t e = cudaMemcpyAsync(op.dst, op.src, op.n, memcpy_kind(kind), stream_);
      if (e != cudaSuccess) {
        (void)cudaStreamSynchronize(stream_);
        return cuda_status("cudaMemcpyAsync of " + std::to_string(op.n) + " bytes", e);
      }
    }
    return cuda_status("cudaStreamSynchronize after " + std::to_string(ops.size()) + " copies",
                       cudaStreamSynchronize(stream_));
  }
  ~CudaMapper() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status pin_host(void* p, uint64_t n, bool read_only) override {
    const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    cudaError_t e = cudaHostRegister(p, n, flags);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      (void)cudaGetLastError();
      return Status::OK();
    }
    return cuda_status("cudaHostRegister of " + std::to_string(n) + " bytes of the arena", e);
  }
  void unpin_host(void* p) override {
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;  // copy_many's, created on first use (one device per process)
};

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cuda_error("cudaGetDeviceCount", e);
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: no GPU is visible";
  return n;
}

Result<std::unique_ptr<Device>> open_cuda_device(int ordinal) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) return unavailable("no GPU: " + why + "; set tiers.hbm.capacity: 0, or tiers.hbm.backend: emulated");
  if (ordinal < 0 || ordinal >= n)
    return unavailable("tiers.hbm.devices: GPU " + std::to_string(ordinal) + " does not exist (" + std::to_string(n) +
                       " visible)");
  CAIRN_RETURN_IF_ERROR(cuda_status("selecting GPU " + std::to_string(ordinal), cudaSetDevice(ordinal)));
  cudaStream_t s;
  CAIRN_RETURN_IF_ERROR(cuda_status("cudaStreamCreate on GPU " + std::to_string(ordinal),
                                    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  return std::unique_ptr<Device>(new CudaDevice(ordinal, s));
}

Result<std::unique_ptr<DeviceMapper>> open_cuda_mapper() {
  std::string why;
  if (cuda_device_count(&why) == 0) return unavailable("no GPU in this process: " + why);
  return std::unique_ptr<DeviceMapper>(new CudaMapper());
}

bool cuda_compiled() { return true; }

}  // namespace cairn::hbm
