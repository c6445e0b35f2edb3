// The repository's files: the names the implementation files of Repository share, and the small
// POSIX helpers they use to read, list, sync and atomically publish files. Not for use outside
// tiers/pfs/.
//
// Owns no state (a UniqueFd owns one file descriptor) and decides nothing: what to write, keep or
// delete is the caller's. Every helper reports failure as a Status naming the path; none throws.
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.hpp"

namespace cairn {
class FileSystem;
}  // namespace cairn

namespace cairn::pfs {

// File names (docs/repository-format.md).
inline constexpr std::string_view kTmpPrefix = ".tmp-";          // a file being written; removed at open
inline constexpr std::string_view kPackSuffix = ".safetensors";  // a pack of its own (safetensors)
inline constexpr std::string_view kSegmentSuffix = ".pack";      // a writer's pack segment
inline constexpr std::string_view kLogSuffix = ".log";           // a writer's manifest log
inline constexpr std::string_view kCheckpointSuffix = ".ckpt";   // a catalog checkpoint
inline constexpr std::string_view kManifestSuffix = ".json";     // version 1's manifests
inline constexpr const char* kPacksDir = "packs";
inline constexpr const char* kLogsDir = "logs";
inline constexpr const char* kCheckpointsDir = "checkpoints";
inline constexpr const char* kManifestsDir = "manifests";  // version 1 only
// A pack segment starts with this many bytes: "cairn-pack-segment 2\n<wid>\n", padded with '\n'.
inline constexpr uint64_t kSegmentHeaderBytes = 64;
inline constexpr uint64_t kMaxChunkSize = 1ull << 32;  // 4 GiB: a chunk is read into memory whole
// The repository format this cairn writes (FORMAT). Version 2 (no coded chunks) is read as it is and
// marked 3 by the first process that may write it; version 1 is migrated (repository_migrate.cpp).
inline constexpr int kFormatVersion = 3;

// Owns a file descriptor (-1: none) and closes it.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// a/b (one slash between them).
inline std::string join_path(const std::string& a, std::string_view b) {
  std::string out = a;
  if (out.empty() || out.back() != '/') out += '/';
  out += b;
  return out;
}

inline bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A name for messages: quoted, cut to 80 bytes (ids can be 1 KiB, fuzzed keys anything).
std::string quote(std::string_view s);

// A pack's file name: a plain name under packs/ ending in .safetensors or .pack, so a manifest
// can never point outside it.
bool valid_pack_name(std::string_view s);

// Reads exactly size bytes at offset; *got tells how many were read before end of file.
Status pread_all(int fd, void* dst, size_t size, uint64_t offset, const std::string& path, size_t* got);

// fsync of a directory; filesystems that cannot sync directories (EINVAL, EROFS) count as synced.
Status fsync_dir(const std::string& path);

// Entry names of a directory, without "." and "..", sorted. *missing is set (and OK returned) when
// the directory does not exist and missing != nullptr.
Status list_dir(const std::string& path, std::vector<std::string>* names, bool* missing = nullptr);

// A directory listed again only when it may have changed: its mtime moved, or is too recent to
// trust (a filesystem with coarse timestamps may not move it for a second create). Refreshes call
// it on every commit; listing a directory is a metadata request on a parallel filesystem, a stat
// is a cheaper one. Not thread-safe (its owner's lock guards it).
class DirListing {
 public:
  // The entries of dir (sorted), from the cache when dir did not change since the last call.
  const std::vector<std::string>& get(const std::string& dir);

 private:
  int64_t mtime_ns_ = -1;
  std::vector<std::string> names_;
};

// Writes pieces (in order, back to back) to dir/.tmp-<unique>, fsyncs, and renames it to
// dir/final_name, then fsyncs dir, all through fs. On failure nothing stays: the temporary file is
// removed, and so is the final name if the rename happened but the directory sync failed.
class AtomicFileWriter {
 public:
  // replacing: final_name exists and is being replaced; then a failed directory sync leaves the
  // new file in place (removing it would lose the old one too).
  static Status publish(FileSystem& fs, const std::string& dir, const std::string& final_name,
                        const std::vector<iovec>& pieces, const std::string& tmp_name, bool replacing = false);

 private:
  // Creates path (it must not exist) and writes and fsyncs pieces. The file is closed on return.
  static Status write_synced(FileSystem& fs, const std::string& path, const std::vector<iovec>& pieces);
};

}  // namespace cairn::pfs
