// Where the running program is, for the tools and the daemon that look for files installed beside
// it (the cairn Python package for `cairn import` and the near-data worker). Linux only: /proc.
#pragma once

#include <string>

namespace cairn {

// The directory of the running executable (/proc/self/exe resolved); "" if it cannot be read.
std::string executable_dir();
// True when `path` names a regular file (following symlinks).
bool is_regular_file(const std::string& path);

}  // namespace cairn
