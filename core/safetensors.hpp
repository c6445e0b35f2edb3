// The safetensors format: a strict reader and a writer.
//
// A file is: u64 little-endian N, then N bytes of JSON header, then the data section. The header
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
// the data section) and may hold "__metadata__": {string: string}.
//
// The reader rejects, with a message naming the tensor or field: N larger than kMaxHeaderBytes or
// than the file; JSON that does not parse or is not an object; unknown dtypes; shapes with negative
// or non-integer dimensions or more than kMaxDims dimensions; shape x itemsize != end - begin;
// offsets outside the data section, overlapping, or leaving holes (the data section must be covered
// exactly, as the reference implementation requires); duplicate names; invalid names; metadata that
// is not a string→string object (or repeats a key); tensor entries with missing or extra fields.
// The JSON must start with '{' and may end in whitespace (the writer pads with spaces). Every
// format error is kInvalidArgument.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"

namespace cairn::safetensors {

inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation

struct TensorEntry {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offset in the data section
  uint64_t end = 0;    // one past the last byte
  uint64_t nbytes() const { return end - begin; }
};

struct Header {
  std::vector<TensorEntry> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;  // "__metadata__" was present (even if empty)
  uint64_t header_bytes = 0;  // N: the JSON header's length
  uint64_t data_offset() const { return 8 + header_bytes; }
  uint64_t data_bytes = 0;  // size of the data section
  // The tensor called name, or null. Linear in the number of tensors.
  const TensorEntry* find(std::string_view name) const;
};

// Parses the header of a file of file_size bytes whose first bytes are `prefix`. prefix must hold
// at least 8 bytes and, once N is known, 8 + N bytes (otherwise the result says how many are needed
// with kInvalidArgument and needed_prefix set). *needed_prefix is 0 for every other result, so a
// caller reads more and retries only while *needed_prefix > prefix.size(); it never exceeds
// file_size or 8 + kMaxHeaderBytes. The data section is everything after the header, so file_size
// must be the real size of the file. Memory used is proportional to N.
Result<Header> parse_header(std::span<const uint8_t> prefix, uint64_t file_size, uint64_t* needed_prefix = nullptr);

// Reads and validates the header of the file at path. Errors name the path; a missing file is
// kNotFound, I/O errors as errno_status.
Result<Header> read_header(const std::string& path);

// Serializes a header for tensors laid out in the given order, recomputing data offsets so that the
// data is contiguous in that order, and padding the JSON with spaces to a multiple of 8 bytes.
// Returns the full prefix: 8-byte length + JSON. Each entry's begin/end are updated (only on
// success). Metadata, when given (even empty), is written first as "__metadata__".
// REQUIRES: names valid, unique and not "__metadata__"; at most kMaxDims dimensions; shapes
// consistent with dtypes; metadata UTF-8 (all checked: kInvalidArgument naming the tensor or key).
Result<std::string> build_header(std::vector<TensorEntry>& tensors, const std::map<std::string, std::string>* metadata);

}  // namespace cairn::safetensors
