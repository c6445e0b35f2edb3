// Safetensors files in and out of the daemon, for `cairn put/get`, the C API's
// cairn_model_put_file / cairn_model_get_file (and through it the Swift/T and Fortran bindings).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/cpp/connection.hpp"
#include "core/progress.hpp"
#include "core/status.hpp"

namespace cairn {

// Called on the calling thread as a file moves: the phase, the bytes done and the bytes in all
// (ProgressUnit::kBytes), at least once per 8 MiB and once at the end of each phase.
using FileProgress = std::function<void(const ProgressSnapshot&)>;

// Stores the safetensors file `path` as model `id` (derived from `parent` when not empty: tensors
// equal to the parent's are stored once). Large tensors are read straight from the file into the
// daemon's arena. The file's header is kept, so put_safetensors_file then get_safetensors_file gives
// the same bytes. `metadata` (an object or null) and `architecture` (a graph or null) go with it.
// progress: the phase "reading FILE" (the tensor bytes copied into the daemon), then "committing"
// (0 of 0 bytes: the daemon's own work, until the commit returns).
Status put_safetensors_file(Connection& client, const std::string& id, const std::string& path,
                            const std::string& parent, Durability durability, const nlohmann::json& metadata = nullptr,
                            const nlohmann::json& architecture = nullptr, const FileProgress& progress = {});

// Writes model `id` (or only the tensors `names`) as the safetensors file `path`, atomically (a
// temporary file renamed into place). The whole model of a file stored with put_safetensors_file
// comes back byte for byte. progress: the phase "writing FILE" (tensor bytes written).
Status get_safetensors_file(Connection& client, const std::string& id, const std::string& path,
                            const std::vector<std::string>& names = {}, const FileProgress& progress = {});

}  // namespace cairn
