// The filesystem/device seam: every byte the NVMe tier stores and every byte of the repository's
// packs and manifests goes through a FileSystem, so tests can run a tier on memory and inject faults
// (ENOSPC, EIO, short writes, flipped bits) at exact points.
//
// Three implementations:
//   posix_fs()          the real one: open/pread/pwrite/fsync/fallocate/rename; files opened with
//                       kDirect use O_DIRECT (falling back to buffered I/O, and saying so through
//                       File::direct(), on filesystems that refuse it, e.g. tmpfs); batched I/O
//                       (read_many/write_many) goes through io_uring where the kernel allows it.
//   MemoryFileSystem    files in memory; for unit tests of components above the seam.
//   FaultyFileSystem    wraps another FileSystem and fails, shortens or corrupts the operations its
//                       rules match.
//
// Errors are Status values naming the path and the operation ("writing /nvme/data at 4096: No space
// left on device"); ENOSPC maps to kNoSpace. Thread-safety: a FileSystem may be used from any
// thread; one File may be used from several threads for positional I/O (pread/pwrite/read_many/
// write_many/sync) at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn {

// One positional transfer of a batch.
struct IoRequest {
  void* buf = nullptr;  // write_many reads from it, read_many writes to it
  size_t len = 0;
  uint64_t offset = 0;
};

class File {
 public:
  virtual ~File() = default;
  virtual const std::string& path() const = 0;
  // True when the file was opened with kDirect and the filesystem accepted O_DIRECT: then buffers,
  // lengths and offsets must be multiples of kDirectAlignment (kInvalidArgument otherwise).
  virtual bool direct() const = 0;
  // Writes exactly len bytes at offset (retrying partial writes the kernel returns). A write that
  // makes no progress is kIo; ENOSPC is kNoSpace.
  virtual Status pwrite(const void* buf, size_t len, uint64_t offset) = 0;
  // Reads up to len bytes at offset; *got is how many were read (less only at end of file).
  virtual Status pread(void* buf, size_t len, uint64_t offset, size_t* got) = 0;
  // Many transfers at once (io_uring where available, else one after another). Each request
  // transfers exactly its len bytes or the call fails (a read past the end of the file is kIo).
  // On failure some requests may have completed.
  virtual Status write_many(std::span<const IoRequest> reqs) = 0;
  virtual Status read_many(std::span<const IoRequest> reqs) = 0;
  // fsync (data_only = false) or fdatasync (true).
  virtual Status sync(bool data_only) = 0;
  // Reserves [offset, offset+len) (fallocate mode 0): kNoSpace when the device is full.
  virtual Status allocate(uint64_t offset, uint64_t len) = 0;
  virtual Status truncate(uint64_t size) = 0;
  virtual Result<uint64_t> size() = 0;
};

inline constexpr size_t kDirectAlignment = 4096;

// Aligned scratch memory for direct I/O (kDirectAlignment). data() is nullptr when the allocation
// failed (or n is 0). A large buffer asks for transparent huge pages (a mapping aligned to 2 MiB,
// MADV_HUGEPAGE): a direct request into scattered 4 KiB pages is split by the block layer at its
// max_segments (about 1 MiB), into 2 MiB pages only at max_sectors_kb, and the first touch of a
// huge page is one fault instead of 512. Where the system has no huge pages, 4 KiB pages back it.
class AlignedBuffer {
 public:
  static constexpr uint64_t kHugeFrom = 4ull << 20;  // buffers this large ask for huge pages
  explicit AlignedBuffer(uint64_t n);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;  // the mapping of a huge buffer (data_ is its 2 MiB-aligned part)
  uint64_t map_len_ = 0;
};

enum OpenFlags : unsigned {
  kRead = 0,             // read-only, must exist
  kReadWrite = 1u << 0,  // read and write, must exist unless kCreate
  kCreate = 1u << 1,     // create if missing (mode 0644), implies kReadWrite
  kExclusive = 1u << 2,  // with kCreate: fail with kExists if it exists
  kDirect = 1u << 3,     // O_DIRECT where the filesystem allows it (see File::direct())
  kTruncate = 1u << 4,   // empty the file on open
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // kNotFound when the file is missing and kCreate was not given.
  virtual Result<std::unique_ptr<File>> open(const std::string& path, unsigned flags) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // kNotFound when missing.
  virtual Status unlink(const std::string& path) = 0;
  // fsync of a directory (a no-op where the filesystem cannot sync directories).
  virtual Status sync_dir(const std::string& dir) = 0;
  // mkdir -p (mode 0755 for created directories, or 0700 with private_dir for the last one).
  virtual Status make_dirs(const std::string& dir, bool private_dir = false) = 0;
  // Entry names of dir (no "." or ".."), sorted; kNotFound when dir is missing.
  virtual Result<std::vector<std::string>> list(const std::string& dir) = 0;
  virtual bool exists(const std::string& path) = 0;
  // Removes a directory and everything under it; OK when it is missing.
  virtual Status remove_all(const std::string& dir) = 0;
};

// The real filesystem (a process-wide object).
FileSystem& posix_fs();
// True when fs is posix_fs(), directly or under a FaultyFileSystem: then the real file exists (and
// can be flock'ed).
bool is_posix(FileSystem& fs);

// Files and directories in memory. Paths are plain strings; directories exist once created by
// make_dirs (open with kCreate needs the parent directory). Capacity: total bytes of file contents
// allowed (0 = unlimited); beyond it writes and allocate fail with kNoSpace. direct() is false.
class MemoryFileSystem final : public FileSystem {
 public:
  explicit MemoryFileSystem(uint64_t capacity = 0);
  ~MemoryFileSystem() override;
  Result<std::unique_ptr<File>> open(const std::string& path, unsigned flags) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status unlink(const std::string& path) override;
  Status sync_dir(const std::string& dir) override;
  Status make_dirs(const std::string& dir, bool private_dir = false) override;
  Result<std::vector<std::string>> list(const std::string& dir) override;
  bool exists(const std::string& path) override;
  Status remove_all(const std::string& dir) override;
  uint64_t bytes_used() const;

  struct State;  // shared with its files

 private:
  std::shared_ptr<State> state_;
};

// Wraps `base` and applies rules to matching operations. Rules are checked in the order added; each
// has a countdown (`skip`: matching operations let through first) and a budget (`times`, -1 =
// forever).
class FaultyFileSystem final : public FileSystem {
 public:
  enum class Op { kOpen, kWrite, kRead, kSync, kAllocate, kRename, kUnlink };
  enum class Effect {
    kFail,        // the operation fails with errno `err` (ENOSPC -> kNoSpace, EIO -> kIo, ...)
    kShortWrite,  // a write stores only its first half, then fails with EIO (a torn write)
    kFlipBit,     // a read returns its bytes with one bit flipped (silent corruption); a direct
                  // read, whose alignment padding may surround the bytes used, one bit of each byte
    kDropWrite,   // a write reports success but stores nothing (a lying device)
    kDelay,       // the operation waits delay_ms, then runs unchanged (a slow or hung device)
  };
  struct Rule {
    Op op = Op::kWrite;
    std::string path_contains;  // "" matches every path
    Effect effect = Effect::kFail;
    int err = 5;  // EIO
    int skip = 0;
    int times = 1;
    uint32_t delay_ms = 0;  // kDelay only
  };
  // A rule as it stands now: skip and times count down as operations match.
  struct RuleState {
    Rule rule;
    uint64_t injected = 0;  // operations this rule changed (or delayed)
  };

  // The names of ops, effects and injectable errno values ("write", "flip_bit", "ENOSPC"): what
  // the daemon's `fault` request and `cairn fault` use, and what injected errors are called.
  template <class T>
  struct Named {
    const char* name;
    T value;
  };
  static std::span<const Named<Op>> op_names();
  static std::span<const Named<Effect>> effect_names();
  static std::span<const Named<int>> error_names();

  explicit FaultyFileSystem(FileSystem& base);
  ~FaultyFileSystem() override;
  void add(Rule rule);
  void clear();
  // How many operations the rules changed so far (cleared rules included).
  uint64_t injected() const;
  // The rules in the order added, with their counters.
  std::vector<RuleState> rules() const;
  FileSystem& base() const { return base_; }

  Result<std::unique_ptr<File>> open(const std::string& path, unsigned flags) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status unlink(const std::string& path) override;
  Status sync_dir(const std::string& dir) override;
  Status make_dirs(const std::string& dir, bool private_dir = false) override;
  Result<std::vector<std::string>> list(const std::string& dir) override;
  bool exists(const std::string& path) override;
  Status remove_all(const std::string& dir) override;

  struct State;  // shared with its files

 private:
  FileSystem& base_;
  std::shared_ptr<State> state_;
};

}  // namespace cairn
