// The version of this build of cairn, for `--version` of the tools and the daemon. Defined in a
// translation unit generated at build time (cmake/cairn_version.cmake), so that a new commit
// recompiles one file rather than everything that includes this header.
#pragma once

namespace cairn {

// CMake's project version, e.g. "0.1.0".
const char* version();

// The version and, when built from a git checkout, the commit: "0.1.0 (git 09a503e)"; "0.1.0" when
// built from a source tree without git (a release tarball, a Spack build from one).
const char* version_string();

}  // namespace cairn
