// Chunk-level access traces: what a cache saw, in order, so that any policy can be replayed on it.
//
// A trace is a list of events (a chunk read, a chunk created by a commit, a commit, a hint, an
// eviction), stored as CSV text whose format is docs/policy.md "Trace format". cairnd records one
// (policy.trace) through TraceWriter; the simulator (policy/simulator.hpp) and cairn-sim read them
// with parse_trace / read_trace_file. The reader is strict: any line it cannot take whole is an
// error naming the line and the field, never a silently skipped event.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"
#include "core/sync.hpp"

namespace cairn {

// The first line of every trace; a reader refuses other versions.
inline constexpr std::string_view kTraceMagic = "#cairn-trace v1";
// The second line: the column names, in this order.
inline constexpr std::string_view kTraceColumns = "time_ns,event,model,chunk,bytes,tier,hint,when_s";
// Longest chunk token accepted (a chunk hash is 32 hex digits; tokens are for hand-made traces).
inline constexpr size_t kMaxChunkTokenBytes = 256;

enum class TraceEventKind : uint8_t {
  kAccess,   // a chunk was read (model, chunk, bytes; tier that served it if known)
  kInsert,   // a chunk was written by a commit of `model` (model, chunk, bytes; tier it went to)
  kInherit,  // a commit of `model` uses an existing chunk without writing it (model, chunk, bytes)
  kCommit,   // a model was committed (model; bytes = its total logical size)
  kHint,     // a workflow hint (hint kind, models, when_s for will_load)
  kEvict,    // the recorded cache dropped a chunk from `tier` (chunk, bytes, tier; model optional)
};

// Where a read was served from. kUnknown is the empty field.
enum class TraceTier : uint8_t { kUnknown, kDram, kNvme, kRepository, kPeer };
inline constexpr int kTraceTierCount = 5;

enum class HintKind : uint8_t {
  kNone,        // not a hint event
  kWillLoad,    // these models will be read `when_s` from now (unset: next)
  kPopulation,  // the live set a search draws parents from; replaces the previous population
  kSequence,    // these models will be read in this order
  kDone,        // no more reads are expected for these models
  // One member of the population announced just before (the `population` line it follows) and its
  // chance to be the next parent drawn, in when_s (0..1; from the hint's scores). A population
  // line without them carries no chances.
  kParentChance,
};

struct TraceEvent {
  int64_t time_ns = 0;  // >= 0, non-decreasing along a trace
  TraceEventKind kind = TraceEventKind::kAccess;
  // One model id for access, insert, inherit, commit and evict (may be empty for evict only); one or more,
  // in order, for a hint. Each a valid name (core/dtype.hpp valid_name).
  std::vector<std::string> models;
  // The chunk: its 32-hex-digit hash, or any token of [A-Za-z0-9._:/+-] (1..kMaxChunkTokenBytes).
  // Empty for commit and hint, except a will_load hint scoped to tensors: the daemon records it as
  // one hint per chunk of those tensors, each naming the one model and the chunk.
  std::string chunk;
  // Chunk bytes (access, insert, inherit, evict, a will_load naming a chunk); the model's bytes
  // (commit); 0 (other hints).
  uint64_t bytes = 0;
  TraceTier tier = TraceTier::kUnknown;  // access, insert (optional), evict (required); else kUnknown
  HintKind hint = HintKind::kNone;       // set for hints only
  // Hints of kind will_load: seconds from time_ns to the expected read, finite and >= 0; nullopt
  // means "next" (soon, unspecified). parent_chance: the chance, required, 0..1. Always nullopt for
  // other events.
  std::optional<double> when_s;

  bool operator==(const TraceEvent&) const = default;
};

struct Trace {
  std::vector<TraceEvent> events;
  bool operator==(const Trace&) const = default;
};

const char* trace_event_kind_name(TraceEventKind k);  // "access", ...
const char* trace_tier_name(TraceTier t);             // "" for kUnknown, "dram", ...
const char* hint_kind_name(HintKind k);               // "" for kNone, "will_load", ...

// Checks one event against the format's rules (fields required, allowed or empty per kind; valid
// names and tokens). Does not check the ordering of time_ns. An invalid_argument Status naming the
// field otherwise.
Status validate_trace_event(const TraceEvent& e);

// One CSV line for the event, without the newline. REQUIRES: validate_trace_event(e) is OK.
std::string format_trace_event(const TraceEvent& e);

// The whole trace as text: the two header lines, then one line per event, each ending in '\n'.
// REQUIRES: every event valid and times non-decreasing.
std::string format_trace(const Trace& t);

// Parses a whole trace. Accepts '\n' or "\r\n" line ends, a missing final newline, and comment
// lines starting with '#' after the header; nothing else. An invalid_argument Status whose message
// is "<source>:<line>: <field>: <what is wrong>" for the first bad line. `source` names the input
// in messages (a file name).
Result<Trace> parse_trace(std::string_view text, std::string_view source = "trace");

// Reads and parses a trace file. io_error when it cannot be read.
Result<Trace> read_trace_file(const std::string& path);

// Appends events to a trace file as they happen (what cairnd uses for policy.trace).
// Thread-safe: append may be called from any thread; each event is one whole line. Times are made
// non-decreasing: an event stamped before the last one written is written with the last one's time
// (threads stamp events before they take the writer's lock). Lines are buffered by stdio; flush()
// or close() pushes them to the file.
class TraceWriter {
 public:
  // Creates (or truncates) `path` and writes the header. io_error naming the path on failure.
  static Result<std::unique_ptr<TraceWriter>> open(const std::string& path);
  ~TraceWriter();  // closes (errors then are lost: call close() to see them)
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // invalid_argument for an event that validate_trace_event refuses (nothing is written);
  // io_error when the write fails (the writer stays usable; later appends try again).
  Status append(const TraceEvent& e);
  Status flush();
  // Flushes and closes; later appends fail with io_error. Idempotent.
  Status close();
  uint64_t events_written() const;

 private:
  TraceWriter(std::string path, std::FILE* file);

  const std::string path_;
  mutable cairn::Mutex mu_;
  std::FILE* file_ CAIRN_GUARDED_BY(mu_);  // ; null once closed
  int64_t last_time_ns_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t events_written_ CAIRN_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn
