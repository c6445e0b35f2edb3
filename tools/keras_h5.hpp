// Keras 2 HDF5 weight files as models (docs/import-export.md): read and written here, through the
// HDF5 C library, when built with CAIRN_WITH_HDF5. The `cairn` tool calls these directly; the Python
// package reaches them through libcairn_keras_h5.so (keras_h5_c.cpp), never through the tool.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/durability.hpp"
#include "core/status.hpp"
#include "tools/public_client.hpp"

namespace cairn::tool {

// OK when built with HDF5; otherwise the error to give for `file`.
Status require_hdf5(const std::string& file);

// Stores the Keras HDF5 weights file `file` (Keras 2 layout, weights-only or full model) as model
// `id`: one tensor per dataset, a chain graph of the layers, and in metadata["cairn.import"] what
// export_keras_h5 needs to write the same file structure back. `meta` (an object) is merged in.
// Returns once the model has reached `durability`.
Status import_keras_h5(v1::Client& client, const std::string& id, const std::string& file, const std::string& parent,
                       const nlohmann::json& meta, Durability durability);

// Writes model `id` as a Keras HDF5 weights file: the recorded layout of an imported file, else a
// Keras 2 weights-only layout made from the tensor names (layer = name up to the last dot). Writes a
// temporary file beside `file` and renames it into place, so a failure leaves nothing behind.
Status export_keras_h5(v1::Client& client, const std::string& id, const std::string& file);

}  // namespace cairn::tool
