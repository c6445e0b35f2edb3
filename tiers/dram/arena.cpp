#include "tiers/dram/arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cairn {

namespace {

// Maps the pages of [p, p + len), a mapping of the arena's file, with read faults: one read every
// 64 KiB, where the kernel's fault-around maps the 16 pages about each fault (MADV_POPULATE_READ
// walks every page: 416 MiB of 4 KiB pages took 1.5x as long; on 2 MiB pages both take under a
// millisecond). 64 MiB and more are split among up to 4 threads, whose faults fill different page
// tables in parallel. A kernel whose fault-around is set below 64 KiB maps fewer pages here; the
// others fault on first use, as they would without this.
void read_fault(const uint8_t* p, uint64_t len) {
  constexpr uint64_t kStride = 64 * 1024, kPerThread = 32ull << 20, kSlice = 2ull << 20;
  // A read every 64 KiB from `from` lands in each 64 KiB window of the range once; the last byte's
  // read covers the window the range ends in (from need not be 64 KiB-aligned).
  auto touch = [](const volatile uint8_t* from, const volatile uint8_t* to) {
    uint8_t sum = 0;
    for (const volatile uint8_t* at = from; at < to; at += kStride) sum = static_cast<uint8_t>(sum + *at);
    if (from < to) sum = static_cast<uint8_t>(sum + to[-1]);
    return sum;
  };
  const uint64_t threads = std::min<uint64_t>(
      {4, std::max(1u, std::thread::hardware_concurrency()), std::max<uint64_t>(1, len / kPerThread)});
  if (threads <= 1) {
    (void)touch(p, p + len);
    return;
  }
  // Slices of whole 2 MiB units, so that no two threads fault into one page table.
  const uint64_t per = (len / threads + kSlice - 1) / kSlice * kSlice;
  std::vector<std::thread> helpers;
  for (uint64_t t = 1; t < threads && t * per < len; ++t)
    helpers.emplace_back([=] { (void)touch(p + t * per, p + std::min(len, (t + 1) * per)); });
  (void)touch(p, p + std::min(len, per));
  for (auto& th : helpers) th.join();
}

// A free() that does not match the allocator's state is a bug in the caller (double free, stale
// offset, arithmetic error). Continuing would hand the same bytes to two tensors, so stop here.
[[noreturn]] void die_bad_free(uint64_t offset, uint64_t size, uint64_t capacity, uint64_t alignment,
                               const std::string& why) {
  std::fprintf(stderr,
               "cairn: ArenaAllocator::free(offset=%" PRIu64 ", size=%" PRIu64
               "): %s (arena "
               "capacity %" PRIu64 ", alignment %" PRIu64
               "). This is a broken invariant in the caller (a double free or a stale offset); "
               "aborting.\n",
               offset, size, why.c_str(), capacity, alignment);
  std::fflush(stderr);
  std::abort();
}

uint64_t page_size() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : 4096;
}

// errno_status, except that a failure to obtain memory is reported as kNoSpace: the arena does
// not fit, and the fix is a smaller DRAM capacity in the config.
Status arena_errno_status(const std::string& what, int err) {
  if (err == ENOMEM || err == EFBIG) {
    return no_space(errno_status(what, err).message() +
                    "; lower the DRAM tier's capacity in the config or free memory on the node");
  }
  return errno_status(what, err);
}

}  // namespace

// ---- ArenaAllocator ----

ArenaAllocator::ArenaAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity), alignment_(alignment), free_bytes_(capacity) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("ArenaAllocator: alignment " + std::to_string(alignment) + " is not a power of two");
  }
  if (capacity % alignment != 0) {
    throw std::invalid_argument("ArenaAllocator: capacity " + std::to_string(capacity) +
                                " is not a multiple of the alignment " + std::to_string(alignment));
  }
  if (capacity > 0) insert_free(0, capacity);
}

uint64_t ArenaAllocator::round_up(uint64_t size) const {
  if (size == 0) return alignment_;
  return (size + alignment_ - 1) & ~(alignment_ - 1);
}

uint64_t ArenaAllocator::largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

std::optional<uint64_t> ArenaAllocator::allocate(uint64_t size) {
  if (size > capacity_) return std::nullopt;  // also keeps round_up from overflowing
  const uint64_t need = round_up(size);
  // Best fit: the smallest free extent that is large enough; the lowest offset among equals.
  auto size_it = by_size_.lower_bound({need, 0});
  if (size_it == by_size_.end()) return std::nullopt;
  const uint64_t extent_size = size_it->first;
  const uint64_t offset = size_it->second;
  auto offset_it = by_offset_.find(offset);
  if (extent_size == need) {
    by_size_.erase(size_it);
    by_offset_.erase(offset_it);
  } else {
    // Carve from the front and keep the remainder. Reusing both nodes keeps the hot path free of
    // heap allocation; the remainder keeps its place in offset order, so the hint is exact.
    const uint64_t rest_offset = offset + need;
    const uint64_t rest_size = extent_size - need;
    auto size_node = by_size_.extract(size_it);
    size_node.value() = {rest_size, rest_offset};
    by_size_.insert(std::move(size_node));
    auto hint = std::next(offset_it);
    auto offset_node = by_offset_.extract(offset_it);
    offset_node.key() = rest_offset;
    offset_node.mapped() = rest_size;
    by_offset_.insert(hint, std::move(offset_node));
  }
  free_bytes_ -= need;
  return offset;
}

void ArenaAllocator::free(uint64_t offset, uint64_t size) {
  if (offset % alignment_ != 0) {
    die_bad_free(offset, size, capacity_, alignment_, "offset is not a multiple of the alignment");
  }
  if (offset >= capacity_ || size > capacity_ - offset) {
    die_bad_free(offset, size, capacity_, alignment_, "range lies outside the arena");
  }
  const uint64_t len = round_up(size);
  if (len > capacity_ - offset) {
    die_bad_free(offset, size, capacity_, alignment_, "rounded range lies outside the arena");
  }
  const uint64_t end = offset + len;

  // Free extents are disjoint and sorted, so the last one starting before `end` is the only one
  // that can reach into [offset, end): if it does not overlap, none does.
  auto next = by_offset_.lower_bound(end);
  auto prev = by_offset_.end();
  if (next != by_offset_.begin()) {
    prev = std::prev(next);
    const uint64_t prev_end = prev->first + prev->second;
    if (prev_end > offset) {
      die_bad_free(offset, size, capacity_, alignment_,
                   "range overlaps the free extent [" + std::to_string(prev->first) + ", " + std::to_string(prev_end) +
                       ") (double free?)");
    }
    if (prev_end != offset) prev = by_offset_.end();  // not adjacent: no merge
  }

  uint64_t merged_offset = offset;
  uint64_t merged_size = len;
  if (next != by_offset_.end() && next->first == end) {
    merged_size += next->second;
    erase_free(next);
  }
  if (prev != by_offset_.end()) {
    merged_offset = prev->first;
    merged_size += prev->second;
    erase_free(prev);
  }
  insert_free(merged_offset, merged_size);
  free_bytes_ += len;
}

void ArenaAllocator::insert_free(uint64_t offset, uint64_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
}

void ArenaAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

// ---- SharedArena ----

namespace {
// The bracketed word of a sysfs choice file ("always [advise] never" -> "advise"); "" if none.
std::string selected_word(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return "";
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string line(buf, n);
  const size_t open = line.find('['), close = line.find(']', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}
}  // namespace

std::string shmem_thp_mode(const std::string& sysfs) {
  std::string per_size = selected_word(sysfs + "/hugepages-2048kB/shmem_enabled");
  if (!per_size.empty() && per_size != "inherit") return per_size;
  return selected_word(sysfs + "/shmem_enabled");
}

Result<std::unique_ptr<SharedArena>> SharedArena::create(uint64_t capacity, const std::string& name) {
  const std::string what = "DRAM arena '" + name + "'";
  const uint64_t page = page_size();
  if (capacity == 0) {
    return invalid_argument(what + ": capacity is 0; set a positive DRAM capacity in the config");
  }
  if (capacity > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) - page) {
    return invalid_argument(what + ": capacity " + std::to_string(capacity) +
                            " bytes is too large; set a smaller DRAM capacity in the config");
  }
  const uint64_t rounded = (capacity + page - 1) / page * page;

  // Sealing lets the daemon forbid resizing: a client holding the descriptor could otherwise
  // shrink the file and make the daemon's next access to the arena fault with SIGBUS.
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 && errno == EINVAL) fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return arena_errno_status("memfd_create for " + what, errno);

  if (::ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
    const int err = errno;
    ::close(fd);
    return arena_errno_status("ftruncate of " + what + " to " + std::to_string(rounded) + " bytes", err);
  }
  // Best effort: fails harmlessly where sealing is unsupported.
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);

  // Not MAP_POPULATE: pages are backed on first touch so a large arena starts at once.
  void* base = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return arena_errno_status("mmap of " + what + " (" + std::to_string(rounded) + " bytes)", err);
  }
  (void)::madvise(base, rounded, MADV_HUGEPAGE);  // best effort; honoured if shmem THP allows
  auto arena = std::unique_ptr<SharedArena>(new SharedArena(fd, static_cast<uint8_t*>(base), rounded));
  // Huge pages matter twice: a direct-I/O request into 4 KiB pages holds at most the device's
  // max_segments pages (about 1 MiB), and copies out of 4 KiB pages miss the TLB far more often.
  const std::string mode = shmem_thp_mode();
  arena->huge_ = mode == "always" || mode == "within_size" || mode == "advise" || mode == "force";
  if (arena->huge_) {
    arena->pages_ = "2 MiB transparent huge pages (shmem_enabled: " + mode + ")";
  } else if (mode.empty()) {
    arena->pages_ = "4 KiB pages (this kernel has no transparent huge pages for shared memory)";
  } else {
    arena->pages_ = "4 KiB pages (shmem_enabled: " + mode +
                    "; as root, 'echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled' gives the "
                    "arena 2 MiB pages)";
  }
  return arena;
}

SharedArena::~SharedArena() {
  if (base_ != nullptr) ::munmap(base_, capacity_);
  if (fd_ >= 0) ::close(fd_);
}

// ---- ArenaView ----

Result<std::unique_ptr<ArenaView>> ArenaView::map(int fd, uint64_t size) {
  if (fd < 0) {
    return invalid_argument("arena descriptor " + std::to_string(fd) + " is not valid; the daemon did not pass one");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return errno_status("fstat of the DRAM arena descriptor", err);
  }
  if (size == 0) {
    ::close(fd);
    return invalid_argument("DRAM arena size is 0; the daemon announced an empty arena");
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) != size) {
    ::close(fd);
    return protocol_error("DRAM arena descriptor is " + std::to_string(st.st_size) +
                          " bytes but the daemon announced " + std::to_string(size) +
                          " bytes; client and daemon disagree about the arena (reconnect, or "
                          "check that client and daemon are the same cairn version)");
  }

  void* ro = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (ro == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return arena_errno_status("read-only mmap of the DRAM arena (" + std::to_string(size) + " bytes)", err);
  }
  void* rw = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (rw == MAP_FAILED) {
    const int err = errno;
    ::munmap(ro, size);
    ::close(fd);
    return arena_errno_status("read-write mmap of the DRAM arena (" + std::to_string(size) + " bytes)", err);
  }
  // A page a client touches first is allocated through its mapping: ask for huge pages there too
  // (with shmem_enabled "advise" only mappings that ask get them). Best effort.
  (void)::madvise(rw, size, MADV_HUGEPAGE);
  (void)::madvise(ro, size, MADV_HUGEPAGE);
  // The descriptor stays open: copy-on-write views of tensors are mapped from it (map_private).
  return std::unique_ptr<ArenaView>(
      new ArenaView(fd, static_cast<const uint8_t*>(ro), static_cast<uint8_t*>(rw), size));
}

ArenaView::ArenaView(int fd, const uint8_t* ro, uint8_t* rw, uint64_t size) : fd_(fd), ro_(ro), rw_(rw), size_(size) {
  const uint64_t granules = (size + kGranule - 1) / kGranule;
  for (auto& flags : populated_) {
    flags.reset(new std::atomic<uint8_t>[granules]);
    for (uint64_t g = 0; g < granules; ++g) flags[g].store(0, std::memory_order_relaxed);
  }
}

void ArenaView::prefault(uint64_t offset, uint64_t nbytes, bool write) const {
  if (nbytes < (1u << 20) || offset >= size_) return;
  const uint64_t end = std::min(size_, offset + nbytes);
  std::atomic<uint8_t>* flags = populated_[write ? 1 : 0].get();
  uint8_t* base = write ? rw_ : const_cast<uint8_t*>(ro_);
  // Runs of granules not populated yet, each with one madvise.
  uint64_t g = offset / kGranule;
  const uint64_t g_end = (end + kGranule - 1) / kGranule;
  while (g < g_end) {
    if (flags[g].load(std::memory_order_relaxed)) {
      ++g;
      continue;
    }
    uint64_t run = g;
    while (run < g_end && !flags[run].load(std::memory_order_relaxed)) ++run;
    const uint64_t from = g * kGranule, to = std::min(size_, run * kGranule);
    bool populated = true;
    if (write)
      populated = ::madvise(base + from, to - from, kMadvPopulateWrite) == 0;
    else
      read_fault(base + from, to - from);
    if (populated)
      for (uint64_t k = g; k < run; ++k) flags[k].store(1, std::memory_order_relaxed);
    g = run;
  }
}

Result<uint8_t*> ArenaView::map_private(uint64_t offset, uint64_t nbytes) const {
  if (nbytes == 0 || offset > size_ || nbytes > size_ - offset)
    return invalid_argument("copy-on-write view [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                            ") is empty or outside the arena of " + std::to_string(size_) + " bytes");
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page, len = offset + nbytes - start;
  // Populated with read faults (MAP_POPULATE on a writable private mapping would copy every page):
  // a write later copies only the page it touches.
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, static_cast<off_t>(start));
  if (p == MAP_FAILED) {
    const int err = errno;
    return arena_errno_status("copy-on-write mmap of " + std::to_string(len) + " arena bytes", err);
  }
  if (len >= (1u << 20)) read_fault(static_cast<const uint8_t*>(p), len);
  return static_cast<uint8_t*>(p) + (offset - start);
}

void ArenaView::unmap_private(uint8_t* data, uint64_t nbytes) {
  if (!data || nbytes == 0) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t at = reinterpret_cast<uintptr_t>(data), start = at / page * page;
  ::munmap(reinterpret_cast<void*>(start), nbytes + (at - start));
}

ArenaView::~ArenaView() {
  if (fd_ >= 0) ::close(fd_);
  if (ro_ != nullptr) ::munmap(const_cast<uint8_t*>(ro_), size_);
  if (rw_ != nullptr) ::munmap(rw_, size_);
}

}  // namespace cairn
