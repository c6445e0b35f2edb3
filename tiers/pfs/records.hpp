// The repository's log records: the unit of every manifest log segment (logs/*.log) and of every
// catalog checkpoint (checkpoints/*.ckpt) (docs/repository-format.md, "Records").
//
// A record is a 32-byte header and a payload:
//   bytes 0..3    "CRL1"
//   bytes 4..7    type (little-endian u32, RecordType)
//   bytes 8..15   payload length (little-endian u64, at most kMaxRecordPayload)
//   bytes 16..31  xxh3-128 of the payload (hi then lo, little-endian u64 each)
// The payload is compact JSON (a manifest for kCommit; a small object otherwise).
//
// Owns no state and does no I/O: encode and parse only. parse_records is fuzzed
// (tests/fuzz/fuzz_records.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::pfs {

enum class RecordType : uint32_t {
  kCommit = 1,           // a model: its manifest (docs/repository-format.md, manifest schema)
  kRetire = 2,           // {"id", "retired_ns"}: `cairn rm`
  kCollect = 3,          // {"id"}: gc released a retired model's data, its lineage stays
  kRemove = 4,           // {"id"}: gc deleted a retired model
  kSeal = 5,             // {"log", "pack"}: the writer appends no more to these files
  kCheckpointBegin = 6,  // {"seq", "models", "covers": {log file: offset}}: first record of a checkpoint
  kCheckpointEnd = 7,    // {"seq", "models"}: last record of a checkpoint
};

inline constexpr size_t kRecordHeaderBytes = 32;
inline constexpr uint64_t kMaxRecordPayload = 1ull << 30;

// The record's bytes (header and payload).
std::string encode_record(RecordType type, std::string_view payload);

struct ParsedRecord {
  RecordType type = RecordType::kCommit;
  std::string_view payload;  // points into the parsed buffer
  uint64_t offset = 0;       // of the record's header, from the start of the buffer
};

struct ParseResult {
  std::vector<ParsedRecord> records;
  uint64_t consumed = 0;  // bytes of whole, valid records from the start
  // Why parsing stopped before the end of the buffer:
  //   kEnd: it did not (consumed == buffer size);
  //   kIncomplete: the buffer ends inside a record (a write in flight, or torn by a crash);
  //   kBad: the bytes at `consumed` are not a valid record (wrong magic, unknown type, a length
  //         over the limit, or a payload that does not match its hash); `why` says which.
  enum Stop { kEnd, kIncomplete, kBad } stop = kEnd;
  std::string why;
};

// Parses whole records from the start of buf until the end or the first record that is not whole
// and valid. Never throws; garbage of any kind stops it with kBad and a reason.
ParseResult parse_records(std::string_view buf);

// The name of a record type for messages ("commit", "retire", ...).
const char* record_type_name(RecordType t);

}  // namespace cairn::pfs
