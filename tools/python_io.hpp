// The `cairn` tool's bridge to Python, for the model files only Python reads and writes: PyTorch
// state dicts (`cairn import/export` of .pt/.pth/.bin, docs/import-export.md).
#pragma once

#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn::tool {

// Runs cairn.io's command line (`python3 -m cairn.io ARGS...`, ARGS = import ID FILE ... or export
// ID FILE) with this tool's libcairn.so and its Python package (installed beside the tool, else the
// source tree's) as fallbacks, and returns its exit status (its own errors go to stderr). The
// interpreter is $CAIRN_PYTHON, else the one recorded at build time (CMake's CAIRN_PYTHON), else
// `python3` on PATH. One without PyTorch or NumPy fails with one line naming it and what to install;
// a missing interpreter is an error status instead. cairn.io talks to the daemon through libcairn
// and never runs this tool.
Result<int> run_python_io(const std::vector<std::string>& args);

}  // namespace cairn::tool
