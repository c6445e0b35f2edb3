// The filesystem/device seam (core/fs.hpp): helpers shared by its implementations, which live in
// core/fs_posix.cpp, core/fs_memory.cpp and core/fs_faulty.cpp.
#include "core/fs_internal.hpp"

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
