// Reading and writing a chunk's extent of the burst buffer's data file, with direct I/O.
//
// Owns no state: each call works on the data file it is given. An extent starts at a multiple of
// kBlock and is round_up(length) bytes long; a chunk's bytes fill its start and the rest is padding.
// With direct I/O (File::direct()) every request must be aligned in memory, offset and length, so
// the unaligned parts of a chunk go through AlignedBuffer scratch copies.
//
// Thread-safety: the functions may run at once on one File (it takes concurrent requests).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/fs.hpp"
#include "core/status.hpp"

namespace cairn::nvme {

inline constexpr uint64_t kBlock = kDirectAlignment;

// n rounded up to a multiple of kBlock: the length of the extent of an n-byte chunk.
inline uint64_t round_up(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

using cairn::AlignedBuffer;  // core/fs.hpp

// Reads [offset, offset+length) of the data file into dst, with direct I/O where possible (dst
// need not be aligned). The read is split into pieces so that the device sees several requests at
// once. kNoSpace when no scratch buffer can be had.
Status read_extent(File& data, uint64_t offset, void* dst, uint64_t length);

// Adds to reqs the writes of a chunk's bytes at offset (the extent is round_up(length) long; with
// direct I/O its last block is written whole, the padding zeroed); the caller issues them with
// data.write_many(reqs). Scratch copies of unaligned
// parts go to keep, which must outlive the writes. kNoSpace when no scratch buffer can be had.
// REQUIRES: src stays valid until the writes are done.
Status write_extent(File& data, uint64_t offset, const void* src, uint64_t length, std::vector<IoRequest>& reqs,
                    std::vector<std::unique_ptr<AlignedBuffer>>& keep);

}  // namespace cairn::nvme
