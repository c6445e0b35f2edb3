#include "tiers/nvme/journal.hpp"

#include <cstring>

namespace cairn::nvme {

namespace {

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t record_checksum(uint32_t type, std::string_view payload) {
  std::string buf;
  buf.reserve(payload.size() + 4);
  put_u32(buf, type);
  buf.append(payload);
  return hash64(buf);
}

}  // namespace

void append_record(std::string& out, uint32_t type, std::string_view payload) {
  put_u32(out, kJournalMagic);
  put_u32(out, type);
  put_u32(out, static_cast<uint32_t>(payload.size()));
  put_u32(out, 0);
  put_u64(out, record_checksum(type, payload));
  out.append(payload);
}

std::string hash_payload(const ChunkHash& h) {
  std::string p;
  put_u64(p, h.hi);
  put_u64(p, h.lo);
  return p;
}

std::string put_payload(const ChunkHash& h, uint64_t offset, uint64_t length, bool dirty) {
  std::string p = hash_payload(h);
  put_u64(p, offset);
  put_u64(p, length);
  p.push_back(dirty ? 1 : 0);
  return p;
}

std::string model_payload(uint64_t seq, const std::string& id, const std::string& manifest_json) {
  std::string p;
  put_u64(p, seq);
  put_u32(p, static_cast<uint32_t>(id.size()));
  p += id;
  p += manifest_json;
  return p;
}

size_t replay_journal(std::string_view bytes, JournalHandler& handler) {
  size_t pos = 0;
  while (pos + kRecordHeader <= bytes.size()) {
    const char* h = bytes.data() + pos;
    uint32_t magic = get_u32(h), type = get_u32(h + 4), len = get_u32(h + 8);
    uint64_t sum = get_u64(h + 16);
    if (magic != kJournalMagic || len > kMaxRecordPayload || pos + kRecordHeader + len > bytes.size()) break;
    std::string_view p(h + kRecordHeader, len);
    if (record_checksum(type, p) != sum) break;
    auto hash_at = [&](size_t o) { return ChunkHash{get_u64(p.data() + o), get_u64(p.data() + o + 8)}; };
    bool ok = true;
    switch (type) {
      case kPut:
        if ((ok = len == 33)) handler.put(hash_at(0), get_u64(p.data() + 16), get_u64(p.data() + 24), p[32] != 0);
        break;
      case kDel:
        if ((ok = len == 16)) handler.del(hash_at(0));
        break;
      case kClean:
        if ((ok = len == 16)) handler.clean(hash_at(0));
        break;
      case kModel: {
        if ((ok = len >= 12)) {
          uint64_t seq = get_u64(p.data());
          uint32_t idlen = get_u32(p.data() + 8);
          if ((ok = 12 + static_cast<uint64_t>(idlen) <= len))
            handler.model(seq, p.substr(12, idlen), p.substr(12 + idlen));
        }
        break;
      }
      case kDone:
        handler.done(p);
        break;
      default:
        ok = false;
    }
    if (!ok) break;
    pos += kRecordHeader + len;
  }
  return pos;
}

}  // namespace cairn::nvme
