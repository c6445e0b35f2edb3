// Helpers shared by the filesystem implementations (core/fs_posix.cpp, core/fs_memory.cpp,
// core/fs_faulty.cpp); defined in core/fs.cpp. Not part of the public interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/fs.hpp"

namespace cairn::fs_internal {

// "path at offset", for error messages.
std::string at(const std::string& path, uint64_t offset);

// Drops trailing slashes (but keeps "/") so "d/" and "d" name the same directory.
std::string strip_slashes(std::string path);

// The error for a read of r that found only got bytes before the end of the file.
Status short_read(const std::string& path, const IoRequest& r, size_t got);

}  // namespace cairn::fs_internal
