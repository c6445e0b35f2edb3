#include "tiers/nvme/extent_io.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace cairn::nvme {

namespace {

// Reads of a chunk are split so that the device sees several requests at once.
constexpr uint64_t kReadPiece = 1ull << 20;

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBlock == 0; }

}  // namespace

Status read_extent(File& data, uint64_t offset, void* dst, uint64_t length) {
  if (length == 0) return Status::OK();
  const bool direct = data.direct();
  auto* out = static_cast<uint8_t*>(dst);
  std::vector<IoRequest> reqs;
  auto add_pieces = [&](uint8_t* buf, uint64_t off, uint64_t len) {
    for (uint64_t p = 0; p < len; p += kReadPiece)
      reqs.push_back(IoRequest{buf + p, static_cast<size_t>(std::min(kReadPiece, len - p)), off + p});
  };
  if (!direct) {
    add_pieces(out, offset, length);
    return data.read_many(reqs);
  }
  const uint64_t body = aligned(out) ? length / kBlock * kBlock : 0;
  const uint64_t rest = length - body;
  AlignedBuffer tail(round_up(rest));
  if (rest && !tail.data()) return no_space("no memory for a " + std::to_string(rest) + "-byte read buffer");
  add_pieces(out, offset, body);
  if (rest) add_pieces(tail.data(), offset + body, round_up(rest));
  CAIRN_RETURN_IF_ERROR(data.read_many(reqs));
  if (rest) std::memcpy(out + body, tail.data(), rest);
  return Status::OK();
}

Status write_extent(File& data, uint64_t offset, const void* src, uint64_t length, std::vector<IoRequest>& reqs,
                    std::vector<std::unique_ptr<AlignedBuffer>>& keep) {
  if (length == 0) return Status::OK();
  auto* in = static_cast<const uint8_t*>(src);
  if (!data.direct()) {
    reqs.push_back(IoRequest{const_cast<uint8_t*>(in), static_cast<size_t>(length), offset});
    return Status::OK();
  }
  const uint64_t body = aligned(in) ? length / kBlock * kBlock : 0;
  const uint64_t rest = length - body;
  if (body) reqs.push_back(IoRequest{const_cast<uint8_t*>(in), static_cast<size_t>(body), offset});
  if (rest) {
    auto buf = std::make_unique<AlignedBuffer>(round_up(rest));
    if (!buf->data()) return no_space("no memory for a " + std::to_string(rest) + "-byte write buffer");
    std::memset(buf->data(), 0, round_up(rest));
    std::memcpy(buf->data(), in + body, rest);
    reqs.push_back(IoRequest{buf->data(), static_cast<size_t>(round_up(rest)), offset + body});
    keep.push_back(std::move(buf));
  }
  return Status::OK();
}

}  // namespace cairn::nvme
