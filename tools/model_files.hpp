// Model files other than safetensors, for `cairn import` / `cairn export` (docs/import-export.md):
// Keras HDF5 weight files through the HDF5 library (when built with CAIRN_WITH_HDF5), and PyTorch
// state dicts through Python (`python3 -m cairn.io`).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/cpp/client.hpp"
#include "core/status.hpp"

namespace cairn::tool {

// True when this tool was built with HDF5.
bool have_hdf5();
// OK when it was; otherwise the error to give for `file`.
Status require_hdf5(const std::string& file);

// Stores the Keras HDF5 weights file `file` (Keras 2 layout, weights-only or full model) as model
// `id`: one tensor per dataset, a chain graph of the layers, and in metadata["cairn.import"] what
// export_keras_h5 needs to write the same file structure back. `meta` (an object) is merged in.
Status import_keras_h5(Client& client, const std::string& id, const std::string& file, const std::string& parent,
                       const nlohmann::json& meta, Durability durability);

// Writes model `id` as a Keras HDF5 weights file: the recorded layout of an imported file, else a
// Keras 2 weights-only layout made from the tensor names (layer = name up to the last dot).
Status export_keras_h5(Client& client, const std::string& id, const std::string& file);

// Runs cairn.io's command line (`python3 -m cairn.io ARGS...`, ARGS = import ID FILE ... or export
// ID FILE) with this tool's libcairn.so and its Python package (installed beside the tool, else the
// source tree's) as fallbacks, and returns its exit status (its own errors go to stderr). The
// interpreter is $CAIRN_PYTHON, else the one recorded at build time (CMake's CAIRN_PYTHON), else
// `python3` on PATH. One without PyTorch or NumPy fails with one line naming it and what to install;
// a missing interpreter is an error status instead.
Result<int> run_python_io(const std::vector<std::string>& args);

}  // namespace cairn::tool
