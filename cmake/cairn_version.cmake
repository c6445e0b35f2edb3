# Writes the translation unit that holds cairn's version string (core/version.hpp), run by the
# `cairn_version_info` target on every build:
#   cmake -DSOURCE_DIR=... -DTEMPLATE=cmake/version.cpp.in -DOUTPUT=... -DVERSION=0.1.0
#         [-DGIT_EXECUTABLE=/usr/bin/git] -P cmake/cairn_version.cmake
# The version is CMake's project version plus, when SOURCE_DIR is the top of a git checkout, the
# short commit: "0.1.0 (git 09a503e)"; from a tarball (a Spack build), "0.1.0". OUTPUT is rewritten
# only when its text changes, so a new commit recompiles this one file and relinks the tools.
foreach(v SOURCE_DIR TEMPLATE OUTPUT VERSION)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "cairn_version.cmake: -D${v}=... is required")
  endif()
endforeach()

set(CAIRN_VERSION_STRING "${VERSION}")
if(GIT_EXECUTABLE AND EXISTS "${SOURCE_DIR}/.git")
  # safe.directory: a checkout owned by another user still names its commit (root building a user's tree).
  execute_process(COMMAND "${GIT_EXECUTABLE}" -c safe.directory=* -C "${SOURCE_DIR}" rev-parse --short HEAD
                  OUTPUT_VARIABLE _rev RESULT_VARIABLE _rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_rc EQUAL 0 AND _rev MATCHES "^[0-9a-f]+$")
    set(CAIRN_VERSION_STRING "${VERSION} (git ${_rev})")
  endif()
endif()
configure_file("${TEMPLATE}" "${OUTPUT}" @ONLY)
