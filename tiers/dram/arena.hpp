// The DRAM tier's storage: a shared-memory arena and the allocator that carves it up.
//
// SharedArena is a memfd (anonymous shared memory) of fixed capacity mapped read-write by the daemon.
// Local clients receive its file descriptor over the Unix socket (SCM_RIGHTS) and map it themselves
// (ArenaView): a read-only view from which tensors are read without a copy, and a read-write view
// into which a client writes the bytes of space the daemon allocated for it.
//
// ArenaAllocator is a pure offset allocator (no I/O, no locking): best-fit over free extents kept
// in two ordered maps (by offset for coalescing, by size for best-fit), so allocate and free are
// O(log n) in the number of free extents and neighbouring free extents always merge.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "core/status.hpp"

namespace cairn {

// madvise advice that maps a range's pages in one call (Linux 5.14); spelled out for older headers.
inline constexpr int kMadvPopulateRead = 22;   // MADV_POPULATE_READ
inline constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE

class ArenaAllocator {
 public:
  // REQUIRES: alignment is a power of two; capacity is a multiple of alignment (else throws
  // std::invalid_argument: bad config at construction).
  explicit ArenaAllocator(uint64_t capacity, uint64_t alignment = 64);

  // Offset of a free extent of round_up(size) bytes (size 0 counts as 1 unit), or nullopt when no
  // free extent is large enough (the caller evicts and retries).
  std::optional<uint64_t> allocate(uint64_t size);
  // Returns [offset, offset + round_up(size)) to the free space. Any aligned sub-range of an
  // allocation may be freed on its own (a committed tensor's duplicate chunks are given back while
  // the rest stays). REQUIRES: the range is currently allocated (checked: aborts on double free,
  // which is a broken invariant).
  void free(uint64_t offset, uint64_t size);

  // size rounded up to a multiple of alignment(); 0 becomes one unit. Wraps only for sizes within
  // one alignment of 2^64 (allocate and free check against capacity() first).
  uint64_t round_up(uint64_t size) const;
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return capacity_ - free_bytes_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const;
  size_t free_extent_count() const { return by_offset_.size(); }
  uint64_t alignment() const { return alignment_; }

 private:
  void insert_free(uint64_t offset, uint64_t size);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset)
};

// The daemon's side: owns the memfd and a read-write mapping.
class SharedArena {
 public:
  // Creates a memfd named `name` of `capacity` bytes (rounded up to the page size; capacity()
  // returns the rounded size) and maps it. Fails with kNoSpace if the kernel refuses the size.
  // Pages are not populated: they are backed on first touch, so a large arena starts at once. The
  // file is sealed against shrinking and growing where the kernel supports seals.
  static Result<std::unique_ptr<SharedArena>> create(uint64_t capacity, const std::string& name);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  uint64_t capacity() const { return capacity_; }
  // What backs the arena's pages, in words: 2 MiB transparent huge pages where the kernel gives
  // them to shared memory that asks for them (MADV_HUGEPAGE), else 4 KiB pages, with the setting
  // that decided it. huge_pages() says which.
  const std::string& pages() const { return pages_; }
  bool huge_pages() const { return huge_; }

 private:
  SharedArena(int fd, uint8_t* base, uint64_t capacity) : fd_(fd), base_(base), capacity_(capacity) {}
  int fd_;
  uint8_t* base_;
  uint64_t capacity_;
  std::string pages_;
  bool huge_ = false;
};

// The kernel's transparent-huge-page mode for shared memory (memfd, tmpfs): the selected word of
// /sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled, or of the global
// shmem_enabled when that says "inherit" or is absent; "" when the kernel has neither.
std::string shmem_thp_mode(const std::string& sysfs = "/sys/kernel/mm/transparent_hugepage");

// A client's mappings of the daemon's arena, from the descriptor it received.
class ArenaView {
 public:
  // Maps fd (size bytes) twice: read-only and read-write. Takes ownership of fd (closes it when
  // the view goes).
  static Result<std::unique_ptr<ArenaView>> map(int fd, uint64_t size);
  ~ArenaView();
  ArenaView(const ArenaView&) = delete;
  ArenaView& operator=(const ArenaView&) = delete;

  const uint8_t* read_base() const { return ro_; }
  uint8_t* write_base() const { return rw_; }
  uint64_t size() const { return size_; }

  // Maps the pages of [offset, offset + nbytes) into the read-only (write = false: one read per
  // 64 KiB, the kernel's fault-around mapping the pages about it, in up to 4 threads for 64 MiB and
  // more) or read-write view (MADV_POPULATE_WRITE, one call) instead of one fault per page, for
  // ranges of 1 MiB and more. Each view remembers which 2 MiB granules it has populated and skips them: the arena
  // never gives pages back, so a page mapped once stays mapped, and walking the page tables of a
  // populated range again costs a quarter of copying it (measured). Best effort; thread-safe.
  void prefault(uint64_t offset, uint64_t nbytes, bool write) const;

  // A writable copy-on-write view of [offset, offset + nbytes): the arena's pages mapped privately
  // (populated for 1 MiB and more), so reading costs no copy and a write copies only the page it
  // touches into this process, never changing the daemon's bytes. The caller must hold a lease on
  // the range for as long as the view lives (pages nobody wrote still show the arena's bytes) and
  // unmaps it with unmap_private(data, nbytes). It outlives this ArenaView.
  Result<uint8_t*> map_private(uint64_t offset, uint64_t nbytes) const;
  static void unmap_private(uint8_t* data, uint64_t nbytes);

 private:
  ArenaView(int fd, const uint8_t* ro, uint8_t* rw, uint64_t size);
  static constexpr uint64_t kGranule = 2ull << 20;
  int fd_;
  // One flag per granule and view (read-only, read-write): populated already.
  std::unique_ptr<std::atomic<uint8_t>[]> populated_[2];
  const uint8_t* ro_;
  uint8_t* rw_;
  uint64_t size_;
};

}  // namespace cairn
