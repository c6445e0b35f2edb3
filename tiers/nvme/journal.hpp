// The burst buffer journal's record format: encoding records and replaying them at open.
//
// Owns the bytes of <path>/journal, nothing else: no file, no lock, no tier state. The tier writes
// the records this encodes (nvme_tier_journal.cpp, in the order that makes them crash-safe) and
// hands the file's bytes to replay_journal() at open (nvme_tier_open.cpp).
//
// A journal is a sequence of records, each a 24-byte header and a payload (integers little-endian,
// as the host writes them):
//
//   magic u32 "CNJ1" | type u32 | length u32 | reserved u32 (0) | checksum u64 | payload (length bytes)
//
// checksum is hash64 of the type (u32) followed by the payload; length is at most kMaxRecordPayload.
// The payloads, by type:
//
//   PUT    hash hi u64, hash lo u64, offset u64, length u64, dirty u8   (33 bytes)
//   DEL    hash hi u64, hash lo u64                                       (16 bytes)
//   CLEAN  hash hi u64, hash lo u64                                       (16 bytes)
//   MODEL  seq u64, id length u32, id, manifest JSON (to the end)         (12 bytes and more)
//   DONE   the model id (all of the payload)
//
// Replay applies the records in order, so a later record overrides an earlier one (a PUT of a chunk
// replaces its earlier PUT, a DEL drops it, a DONE ends its MODEL). It stops at the first record
// that is not whole and valid (bad magic, a payload past the end, a checksum or payload size that
// does not match, an unknown type): appends only ever add to the end, so such a record is the one a
// crash cut short, and it and every byte after it are a torn tail, dropped.
//
// What a record names is trusted only because of the order in which the tier writes them (see
// nvme_tier.hpp and nvme_tier_journal.cpp): a PUT follows its extent's fdatasync, an extent is reused
// only after its DEL is durable, and the journal's order is the order of the state's changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/hash.hpp"

namespace cairn::nvme {

inline constexpr uint32_t kJournalMagic = 0x314a4e43;  // "CNJ1"
// magic u32, type u32, length u32, reserved u32, checksum u64
inline constexpr size_t kRecordHeader = 24;
inline constexpr uint32_t kMaxRecordPayload = 64u << 20;

enum RecordType : uint32_t { kPut = 1, kDel = 2, kClean = 3, kModel = 4, kDone = 5 };

// Appends one record (header and payload) to out.
// REQUIRES: payload.size() <= kMaxRecordPayload.
void append_record(std::string& out, uint32_t type, std::string_view payload);

// Payloads, as the table above lays them out.
std::string hash_payload(const ChunkHash& h);  // DEL, CLEAN
std::string put_payload(const ChunkHash& h, uint64_t offset, uint64_t length, bool dirty);
std::string model_payload(uint64_t seq, const std::string& id, const std::string& manifest_json);
// DONE's payload is the model id itself.

// Receives the records of a journal, one call per record, in journal order.
class JournalHandler {
 public:
  virtual ~JournalHandler() = default;
  virtual void put(const ChunkHash& h, uint64_t offset, uint64_t length, bool dirty) = 0;
  virtual void del(const ChunkHash& h) = 0;
  virtual void clean(const ChunkHash& h) = 0;
  virtual void model(uint64_t seq, std::string_view id, std::string_view manifest_json) = 0;
  virtual void done(std::string_view id) = 0;
};

// Replays the records of a journal's bytes into handler, up to the first record that is not whole
// and valid. Returns the length of that prefix: bytes.size() when the journal ends cleanly, less
// when it ends with a torn tail.
size_t replay_journal(std::string_view bytes, JournalHandler& handler);

}  // namespace cairn::nvme
