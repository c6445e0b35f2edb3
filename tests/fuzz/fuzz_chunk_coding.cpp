// Fuzzes chunk coding (core/chunk_coding.hpp). Coded chunks are read from the PFS, where anything
// can damage them: decoding arbitrary bytes must give an error or len bytes, never a crash or a
// write past the output. And whatever bytes are coded, with or without a reference, decode back
// to exactly them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/chunk_coding.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  const size_t width = size_t{1} << (data[1] & 3);
  const uint8_t base_seed = data[2];
  data += 3;
  size -= 3;
  // The decoder on the bytes as given, for the length the frame says (bytes 8..15, at most 1 MiB)
  // or, with the mode's high bit, one taken from the input's size.
  size_t len = size;
  if (!(mode & 0x80) && size >= 16) {
    uint64_t said = 0;
    for (int i = 15; i >= 8; --i) said = said << 8 | data[i];
    len = static_cast<size_t>(said % (1u << 20));
  }
  // The reference serves both halves: as long as the longer of the claimed length and the input.
  std::vector<uint8_t> base(std::max(len, size) + 1), out(len + 1);
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>(i * 131 + base_seed);
  const cairn::ChunkCoding coding = (mode & 1) ? cairn::ChunkCoding::kDelta : cairn::ChunkCoding::kPlanes;
  (void)cairn::decode_chunk(coding, data, size, base.data(), out.data(), len);

  // The encoder: round trip, exact.
  cairn::CodingOptions o;
  o.min_saving = 0;
  const bool with_base = mode & 2;
  cairn::EncodedChunk e = cairn::encode_chunk(data, size, width, with_base ? base.data() : nullptr, o);
  if (e.coding == cairn::ChunkCoding::kRaw) return 0;
  std::vector<uint8_t> back(size + 1);
  cairn::Status s = cairn::decode_chunk(e.coding, e.bytes.data(), e.bytes.size(), base.data(), back.data(), size);
  if (!s.ok()) std::abort();
  for (size_t i = 0; i < size; ++i)
    if (back[i] != data[i]) std::abort();
  return 0;
}
