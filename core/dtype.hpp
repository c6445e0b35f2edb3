// Element types: the dtypes of safetensors, numbered as cairn_dtype in cairn.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace cairn {

enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool
};
inline constexpr int kDTypeCount = 15;
inline constexpr int kMaxDims = 8;             // == CAIRN_MAX_DIMS
inline constexpr size_t kMaxNameBytes = 1024;  // == CAIRN_MAX_NAME_BYTES

// The safetensors spelling: "F32", "BF16", "F8_E4M3", "BOOL" ...
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name);
// Bytes per element (1 for BOOL and the F8 types).
size_t dtype_size(DType t);
// A valid enum value (0..14) as DType; nullopt otherwise.
std::optional<DType> dtype_from_int(int value);

// prod(shape) * dtype_size(t), or nullopt on a negative dimension or overflow past 2^63.
std::optional<uint64_t> tensor_nbytes(DType t, const std::vector<int64_t>& shape);

// True when s is well-formed UTF-8: no overlong forms, surrogates or values past U+10FFFF. NUL is
// allowed (JSON carries it as \u0000).
bool valid_utf8(std::string_view s);
// True when s is 1..kMaxNameBytes bytes of valid UTF-8 without NUL.
bool valid_name(std::string_view s);

}  // namespace cairn
