// The emulated device (tiers/hbm/device.hpp): device memory in POSIX shared-memory segments of its
// own, one per slab, copies completed by a copy thread per device, handles that are segment names.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/sync.hpp"
#include "tiers/hbm/device.hpp"
#include "tiers/hbm/device_internal.hpp"

namespace cairn::hbm {

namespace {

constexpr char kPrefix[] = "cairn-hbm-";  // segment names: /cairn-hbm-<pid>-<ordinal>-<slab>-<nonce>

// The shared state of one copy: done once the copy thread ran it.
struct CopyState {
  cairn::Mutex mu;
  cairn::CondVar cv;
  bool done = false;
  Status result;
};

class EmulatedCompletion final : public Completion {
 public:
  explicit EmulatedCompletion(std::shared_ptr<CopyState> s) : s_(std::move(s)) {}
  ~EmulatedCompletion() override { (void)wait(); }
  Status wait() override {
    cairn::MutexLock lock(s_->mu);
    s_->cv.wait(lock, [&] { return s_->done; });
    return s_->result;
  }
  bool done() override {
    cairn::MutexLock lock(s_->mu);
    return s_->done;
  }

 private:
  std::shared_ptr<CopyState> s_;
};

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(int ordinal) : ordinal_(ordinal), worker_([this] { run(); }) {}
  ~EmulatedDevice() override {
    {
      cairn::MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  const char* backend() const override { return "emulated"; }
  int ordinal() const override { return ordinal_; }

  Result<Slab> allocate_slab(uint64_t size) override {
    if (size == 0) return invalid_argument("emulated device: a slab of 0 bytes");
    Slab s;
    s.id = next_slab_++;
    s.size = size;
    std::string name = "/" + std::string(kPrefix) + std::to_string(::getpid()) + "-" + std::to_string(ordinal_) + "-" +
                       std::to_string(s.id) + "-" + std::to_string(reinterpret_cast<uintptr_t>(this) & 0xffffff);
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return errno_status("emulated device: creating segment " + name, errno);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      return no_space("emulated device " + std::to_string(ordinal_) + ": cannot size a slab of " +
                      std::to_string(size) + " bytes (" + std::strerror(err) + "); lower tiers.hbm.capacity");
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
      int err = errno;
      ::shm_unlink(name.c_str());
      return no_space("emulated device " + std::to_string(ordinal_) + ": cannot map a slab of " + std::to_string(size) +
                      " bytes (" + std::strerror(err) + ")");
    }
    s.base = static_cast<uint8_t*>(p);
    s.handle = "emulated:" + name;
    return s;
  }

  void free_slab(const Slab& slab) override {
    ::munmap(slab.base, slab.size);
    ::shm_unlink(slab.handle.substr(std::strlen("emulated:")).c_str());
  }

  Result<std::unique_ptr<Completion>> copy_async(void* dst, const void* src, uint64_t n, CopyKind) override {
    auto state = std::make_shared<CopyState>();
    {
      cairn::MutexLock lock(mu_);
      queue_.push_back([state, dst, src, n] {
        if (n) std::memcpy(dst, src, n);
        cairn::MutexLock l(state->mu);
        state->done = true;
        state->cv.notify_all();
      });
    }
    cv_.notify_one();
    return std::unique_ptr<Completion>(new EmulatedCompletion(state));
  }

  Status register_host(void*, uint64_t) override { return Status::OK(); }
  void unregister_host(void*) override {}

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        cairn::MutexLock lock(mu_);
        cv_.wait(lock, [&]() CAIRN_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_, nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  const int ordinal_;
  std::atomic<uint64_t> next_slab_{1};
  cairn::Mutex mu_;
  cairn::CondVar cv_;
  std::deque<std::function<void()>> queue_ CAIRN_GUARDED_BY(mu_);
  bool stop_ CAIRN_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: started once the rest is constructed
};

class EmulatedMapper final : public DeviceMapper {
 public:
  const char* backend() const override { return "emulated"; }
  Result<void*> open(const std::string& handle, uint64_t size) override {
    const std::string tag = "emulated:/";
    if (handle.compare(0, tag.size(), tag) != 0 || handle.find('/', tag.size()) != std::string::npos ||
        handle.compare(tag.size(), std::strlen(kPrefix), kPrefix) != 0)
      return invalid_argument("'" + handle + "' is not a handle of the emulated device");
    const std::string name = handle.substr(std::strlen("emulated:"));
    int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) return errno_status("opening the emulated device's slab " + name, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size) {
      ::close(fd);
      return protocol_error("emulated device slab " + name + " is smaller than the daemon said");
    }
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return errno_status("mapping the emulated device's slab " + name, errno);
    return p;
  }
  void close(void* p, uint64_t size) override { ::munmap(p, size); }
  Status copy(int, void* dst, const void* src, uint64_t n, CopyKind) override {
    if (n) std::memcpy(dst, src, n);
    return Status::OK();
  }
  int device_of(const void*) override { return -1; }
};

}  // namespace

Result<std::unique_ptr<Device>> open_emulated_device(int ordinal) {
  if (ordinal < 0) return invalid_argument("tiers.hbm.devices: device " + std::to_string(ordinal) + " is negative");
  return std::unique_ptr<Device>(new EmulatedDevice(ordinal));
}

std::unique_ptr<DeviceMapper> open_emulated_mapper() { return std::make_unique<EmulatedMapper>(); }

int remove_stale_emulated_segments() {
  DIR* d = ::opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.compare(0, std::strlen(kPrefix), kPrefix) != 0) continue;
    const long pid = std::strtol(n.c_str() + std::strlen(kPrefix), nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
      if (::shm_unlink(("/" + n).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

Result<std::unique_ptr<Device>> open_device(const std::string& backend, int ordinal) {
  if (backend == "emulated") return open_emulated_device(ordinal);
  if (backend == "cuda") return open_cuda_device(ordinal);
  return invalid_argument("tiers.hbm.backend: '" + backend + "' is not a device backend (cuda or emulated)");
}

Result<std::unique_ptr<DeviceMapper>> open_mapper(const std::string& backend) {
  if (backend == "emulated") return open_emulated_mapper();
  if (backend == "cuda") return open_cuda_mapper();
  return invalid_argument("the daemon's device backend '" + backend +
                          "' is unknown to this library (cuda or emulated)");
}

std::vector<std::string> backends() {
  std::vector<std::string> out{"emulated"};
  if (cuda_compiled()) out.push_back("cuda");
  return out;
}

}  // namespace cairn::hbm
