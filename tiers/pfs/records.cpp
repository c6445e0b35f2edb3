// The record codec (records.hpp).
#include "tiers/pfs/records.hpp"

#include <cstring>

#include "core/hash.hpp"

namespace cairn::pfs {
namespace {

constexpr char kMagic[4] = {'C', 'R', 'L', '1'};

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}

bool known_type(uint32_t t) {
  return t >= static_cast<uint32_t>(RecordType::kCommit) && t <= static_cast<uint32_t>(RecordType::kCheckpointEnd);
}

}  // namespace

const char* record_type_name(RecordType t) {
  switch (t) {
    case RecordType::kCommit:
      return "commit";
    case RecordType::kRetire:
      return "retire";
    case RecordType::kCollect:
      return "collect";
    case RecordType::kRemove:
      return "remove";
    case RecordType::kSeal:
      return "seal";
    case RecordType::kCheckpointBegin:
      return "checkpoint-begin";
    case RecordType::kCheckpointEnd:
      return "checkpoint-end";
  }
  return "unknown";
}

std::string encode_record(RecordType type, std::string_view payload) {
  std::string out(kRecordHeaderBytes + payload.size(), '\0');
  std::memcpy(out.data(), kMagic, 4);
  put_u32(out.data() + 4, static_cast<uint32_t>(type));
  put_u64(out.data() + 8, payload.size());
  ChunkHash h = hash_bytes(payload.data(), payload.size());
  put_u64(out.data() + 16, h.hi);
  put_u64(out.data() + 24, h.lo);
  if (!payload.empty()) std::memcpy(out.data() + kRecordHeaderBytes, payload.data(), payload.size());
  return out;
}

ParseResult parse_records(std::string_view buf) {
  ParseResult r;
  uint64_t pos = 0;
  while (pos < buf.size()) {
    const uint64_t left = buf.size() - pos;
    const char* p = buf.data() + pos;
    // Check what is there of the header before waiting for more of it, so garbage is reported as
    // garbage however short it is.
    if (std::memcmp(p, kMagic, left < 4 ? left : 4) != 0) {
      r.stop = ParseResult::kBad;
      r.why = "no record header (magic \"CRL1\") at byte " + std::to_string(pos);
      break;
    }
    if (left < kRecordHeaderBytes) {
      r.stop = ParseResult::kIncomplete;
      break;
    }
    uint32_t type = get_u32(p + 4);
    uint64_t len = get_u64(p + 8);
    if (!known_type(type)) {
      r.stop = ParseResult::kBad;
      r.why = "record at byte " + std::to_string(pos) + " has unknown type " + std::to_string(type);
      break;
    }
    if (len > kMaxRecordPayload) {
      r.stop = ParseResult::kBad;
      r.why = "record at byte " + std::to_string(pos) + " claims a payload of " + std::to_string(len) +
              " bytes, more than the " + std::to_string(kMaxRecordPayload) + " allowed";
      break;
    }
    if (left - kRecordHeaderBytes < len) {
      r.stop = ParseResult::kIncomplete;
      break;
    }
    std::string_view payload(p + kRecordHeaderBytes, len);
    ChunkHash h = hash_bytes(payload.data(), payload.size());
    if (h.hi != get_u64(p + 16) || h.lo != get_u64(p + 24)) {
      r.stop = ParseResult::kBad;
      r.why = "the payload of the " + std::string(record_type_name(static_cast<RecordType>(type))) +
              " record at byte " + std::to_string(pos) + " does not match its checksum";
      break;
    }
    r.records.push_back({static_cast<RecordType>(type), payload, pos});
    pos += kRecordHeaderBytes + len;
    r.consumed = pos;
  }
  return r;
}

}  // namespace cairn::pfs
