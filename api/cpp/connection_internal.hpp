// What connection.cpp and connection_writer.cpp share (not installed).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"

namespace cairn::client_detail {
// Maps n bytes at p in one call instead of one fault per 4 KiB page (copies of 1 MiB and more).
void populate(const void* p, uint64_t n, bool write);
nlohmann::json shape_json(const std::vector<int64_t>& shape);
Status check_shape(DType dtype, const std::vector<int64_t>& shape, uint64_t* nbytes);
}  // namespace cairn::client_detail
