// Lossless coding of a chunk's bytes for storage: byte planes and entropy coding, and deltas
// against a reference chunk (docs/repository-format.md, "Coded chunks").
//
// Floats that a model trained have a predictable sign and exponent byte and a mantissa that is
// close to random. Grouping the bytes of each element by position ("planes": BF16 and F16 give 2,
// F32 4, F64 8) puts the predictable bytes together, where zstd's entropy coder (Debian's libzstd)
// shrinks them, and leaves the random ones apart, stored as they are. A fine-tuned model's weights
// differ from their parent's in the low bytes: the XOR of the two (or the element-wise difference,
// whichever codes smaller) is mostly zeros in the high planes.
//
// A chunk's identity stays the hash of its raw bytes; coding changes only what is stored. No state,
// no I/O: values in, values out; the decoder checks every length and never writes past its output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"

namespace cairn {

// How a chunk is stored. kRaw: its bytes as they are. kPlanes: a coded frame of its own bytes.
// kDelta: a coded frame of its bytes combined with a reference chunk's (the same byte range of the
// same-named tensor in an ancestor), which must be read to decode it.
enum class ChunkCoding : uint8_t { kRaw = 0, kPlanes = 1, kDelta = 2 };
inline constexpr int kChunkCodingCount = 3;

// "raw", "planes", "delta".
std::string_view chunk_coding_name(ChunkCoding c);
std::optional<ChunkCoding> chunk_coding_from_name(std::string_view name);

// The planes a dtype's bytes are grouped into: 2 for BF16 and F16, 4 for F32, 8 for F64, 1 (no
// grouping) for the F8 types, integers and BOOL.
size_t coding_width(DType t);

struct CodingOptions {
  int level = 1;             // zstd's compression level for the planes that are entropy coded
  double min_saving = 0.03;  // a chunk is stored raw unless coding saves at least this fraction
};

struct EncodedChunk {
  ChunkCoding coding = ChunkCoding::kRaw;
  std::vector<uint8_t> bytes;  // the coded frame; empty when raw (store the raw bytes)
};

// Codes len bytes (elements of width bytes; a tail shorter than an element is kept as it is).
// base, when not null, is a reference chunk of the same length: the XOR and the element-wise
// difference against it are tried as well, and the smallest estimate is coded. Returns kRaw when
// no coding saves options.min_saving of len.
EncodedChunk encode_chunk(const void* raw, size_t len, size_t width, const void* base, const CodingOptions& options);

// Decodes a coded frame into dst (exactly len bytes). base (len bytes) is required for kDelta
// and ignored otherwise. kCorruption, naming what is wrong, for a frame that does not decode to
// exactly len bytes; dst's content is then unspecified. The caller checks the chunk's hash.
Status decode_chunk(ChunkCoding coding, const void* stored, size_t stored_len, const void* base, void* dst, size_t len);

}  // namespace cairn
