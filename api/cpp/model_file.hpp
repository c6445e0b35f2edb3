// Safetensors files in and out of the daemon, for `cairn put/get`, the C API's
// cairn_model_put_file / cairn_model_get_file (and through it the Swift/T and Fortran bindings).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/cpp/client.hpp"
#include "core/status.hpp"

namespace cairn {

// Stores the safetensors file `path` as model `id` (derived from `parent` when not empty: tensors
// equal to the parent's are stored once). Large tensors are read straight from the file into the
// daemon's arena. The file's header is kept, so put_safetensors_file then get_safetensors_file gives
// the same bytes. `metadata` (an object or null) and `architecture` (a graph or null) go with it.
Status put_safetensors_file(Client& client, const std::string& id, const std::string& path, const std::string& parent,
                            Durability durability, const nlohmann::json& metadata = nullptr,
                            const nlohmann::json& architecture = nullptr);

// Writes model `id` (or only the tensors `names`) as the safetensors file `path`, atomically (a
// temporary file renamed into place). The whole model of a file stored with put_safetensors_file
// comes back byte for byte.
Status get_safetensors_file(Client& client, const std::string& id, const std::string& path,
                            const std::vector<std::string>& names = {});

}  // namespace cairn
