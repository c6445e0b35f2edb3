// The filesystem/device seam (core/fs.hpp): helpers shared by its implementations, which live in
// core/fs_posix.cpp, core/fs_memory.cpp and core/fs_faulty.cpp.
#include <sys/mman.h>

#include <cstdlib>

#include "core/fs_internal.hpp"

namespace cairn {

namespace {
constexpr uint64_t kHugePage = 2ull << 20;
}  // namespace

AlignedBuffer::AlignedBuffer(uint64_t n) {
  if (n == 0) return;
  if (n >= kHugeFrom) {
    // Room to align the start to a huge page; the part outside [data_, data_ + n) stays untouched.
    const uint64_t len = (n + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
    void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    map_ = m;
    map_len_ = len;
    auto start = (reinterpret_cast<uintptr_t>(m) + kHugePage - 1) / kHugePage * kHugePage;
    data_ = reinterpret_cast<uint8_t*>(start);
    ::madvise(data_, (n + kHugePage - 1) / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: may be refused
  } else {
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlignment, n) != 0) return;
    data_ = static_cast<uint8_t*>(p);
  }
  size_ = n;
}

AlignedBuffer::~AlignedBuffer() {
  if (map_)
    ::munmap(map_, map_len_);
  else
    std::free(data_);
}

}  // namespace cairn

namespace cairn::fs_internal {

std::string at(const std::string& path, uint64_t offset) { return path + " at " + std::to_string(offset); }

std::string strip_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

Status short_read(const std::string& path, const IoRequest& r, size_t got) {
  return io_error("reading " + at(path, r.offset) + ": the file ends after " + std::to_string(got) + " of the " +
                  std::to_string(r.len) + " bytes asked for");
}

}  // namespace cairn::fs_internal
