#include "policy/trace.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "core/dtype.hpp"

namespace cairn {

namespace {

constexpr std::string_view kHex = "0123456789ABCDEF";

const char* const kEventNames[] = {"access", "insert", "inherit", "commit", "hint", "evict"};
const char* const kTierNames[] = {"", "dram", "nvme", "repository", "peer"};
const char* const kHintNames[] = {"", "will_load", "population", "sequence", "done", "parent_chance"};

// Bytes of a model id written as %XX: the separators of the format, '%' itself and control bytes.
bool needs_escape(unsigned char c) { return c == '%' || c == ',' || c == ';' || c == '"' || c < 0x20 || c == 0x7F; }

void append_escaped(std::string& out, std::string_view s) {
  for (unsigned char c : s) {
    if (!needs_escape(c)) {
      out.push_back(static_cast<char>(c));
      continue;
    }
    out.push_back('%');
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool chunk_token_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '_' ||
         c == ':' || c == '/' || c == '+' || c == '-';
}

// The message for a bad field: "field: what".
Status bad(std::string_view field, const std::string& what) {
  return invalid_argument(std::string(field) + ": " + what);
}

std::string quote_for_message(std::string_view s) {
  constexpr size_t kShown = 40;
  std::string out = "'";
  for (unsigned char c : s.substr(0, kShown)) {
    if (c < 0x20 || c == 0x7F) {
      out += '?';
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (s.size() > kShown) out += "...";
  return out + "'";
}

// Decodes one %-escaped model id.
Result<std::string> unescape_model(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '%') {
      if (i + 2 >= s.size())
        return bad("model", "'%' at byte " + std::to_string(i) + " is not followed by two hex digits");
      const int h = hex_value(s[i + 1]), l = hex_value(s[i + 2]);
      if (h < 0 || l < 0)
        return bad("model", "'%' at byte " + std::to_string(i) + " is not followed by two hex digits");
      out.push_back(static_cast<char>(h * 16 + l));
      i += 2;
      continue;
    }
    if (c == '"' || c < 0x20 || c == 0x7F)
      return bad("model", "byte " + std::to_string(i) + " must be written as %" + std::string(1, kHex[c >> 4]) +
                              std::string(1, kHex[c & 15]));
    out.push_back(static_cast<char>(c));
  }
  return out;
}

template <typename T>
Result<T> parse_unsigned(std::string_view field, std::string_view s) {
  if (s.empty()) return bad(field, "required, an unsigned decimal integer");
  for (char c : s)
    if (c < '0' || c > '9') return bad(field, quote_for_message(s) + " is not an unsigned decimal integer");
  T value{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return bad(field, quote_for_message(s) + " is out of range");
  return value;
}

// The enum value whose name is s. An empty field is allowed when one of the names is "" (its value).
template <typename Enum, size_t N>
Result<Enum> parse_name(std::string_view field, std::string_view s, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<Enum>(i);
  std::string list;
  bool empty_allowed = false;
  for (size_t i = 0; i < N; ++i) {
    if (!*names[i]) {
      empty_allowed = true;
      continue;
    }
    list += std::string(list.empty() ? "" : ", ") + names[i];
  }
  if (empty_allowed) list += " or empty";
  return bad(field, quote_for_message(s) + " is not one of " + list);
}

// Parses the fields of one data line into an event (syntax only; validate_trace_event checks the
// rules per kind).
Result<TraceEvent> parse_line(std::string_view line) {
  std::vector<std::string_view> f;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    f.push_back(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (f.size() != 8)
    return invalid_argument("expected 8 fields (" + std::string(kTraceColumns) + "), found " +
                            std::to_string(f.size()));
  TraceEvent e;
  // Event first: the other fields' messages make more sense once the kind is known.
  CAIRN_ASSIGN_OR_RETURN(e.kind, (parse_name<TraceEventKind>("event", f[1], kEventNames)));
  CAIRN_ASSIGN_OR_RETURN(uint64_t t, parse_unsigned<uint64_t>("time_ns", f[0]));
  if (t > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return bad("time_ns", quote_for_message(f[0]) + " is out of range");
  e.time_ns = static_cast<int64_t>(t);
  if (!f[2].empty()) {
    size_t s = 0;
    while (true) {
      const size_t semi = f[2].find(';', s);
      const std::string_view piece = f[2].substr(s, semi == std::string_view::npos ? std::string_view::npos : semi - s);
      CAIRN_ASSIGN_OR_RETURN(std::string model, unescape_model(piece));
      e.models.push_back(std::move(model));
      if (semi == std::string_view::npos) break;
      s = semi + 1;
    }
  }
  e.chunk = std::string(f[3]);
  // A hint's bytes are empty unless it names a chunk (a will_load scoped to tensors).
  if (!f[4].empty() || e.kind != TraceEventKind::kHint) {
    CAIRN_ASSIGN_OR_RETURN(e.bytes, parse_unsigned<uint64_t>("bytes", f[4]));
  }
  CAIRN_ASSIGN_OR_RETURN(e.tier, (parse_name<TraceTier>("tier", f[5], kTierNames)));
  CAIRN_ASSIGN_OR_RETURN(e.hint, (parse_name<HintKind>("hint", f[6], kHintNames)));
  if (!f[7].empty()) {
    const std::string_view w = f[7];
    double v = 0;
    auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc() || end != w.data() + w.size() || w[0] == '-' || !std::isfinite(v))
      return bad("when_s", quote_for_message(w) + " is not a finite number of seconds >= 0");
    e.when_s = v;
  }
  CAIRN_RETURN_IF_ERROR(validate_trace_event(e));
  return e;
}

}  // namespace

const char* trace_event_kind_name(TraceEventKind k) { return kEventNames[static_cast<int>(k)]; }
const char* trace_tier_name(TraceTier t) { return kTierNames[static_cast<int>(t)]; }
const char* hint_kind_name(HintKind k) { return kHintNames[static_cast<int>(k)]; }

Status validate_trace_event(const TraceEvent& e) {
  if (static_cast<int>(e.kind) > static_cast<int>(TraceEventKind::kEvict)) return bad("event", "unknown event value");
  const std::string kind = trace_event_kind_name(e.kind);
  if (e.time_ns < 0) return bad("time_ns", "must be >= 0");
  const bool is_hint = e.kind == TraceEventKind::kHint;
  // model
  if (is_hint) {
    if (e.models.empty()) return bad("model", "a hint names one or more models, separated by ';'");
  } else if (e.models.size() > 1) {
    return bad("model", "one model for " + kind + ", found " + std::to_string(e.models.size()));
  } else if (e.models.empty() && e.kind != TraceEventKind::kEvict) {
    return bad("model", "required for " + kind);
  }
  for (const std::string& m : e.models)
    if (!valid_name(m))
      return bad("model", quote_for_message(m) + " is not a valid model id (1..1024 bytes of UTF-8, no NUL)");
  // chunk: required for the chunk events; a will_load hint may name one chunk of its one model (the
  // daemon records a will_load scoped to tensors as one such line per chunk); else empty.
  const bool chunk_hint = is_hint && !e.chunk.empty();
  if (chunk_hint && e.hint != HintKind::kWillLoad) return bad("chunk", "allowed on will_load hints only");
  if (chunk_hint && e.models.size() != 1)
    return bad("chunk", "a will_load hint naming a chunk names one model, found " + std::to_string(e.models.size()));
  if (e.kind == TraceEventKind::kCommit || (is_hint && !chunk_hint)) {
    if (!e.chunk.empty()) return bad("chunk", "must be empty for " + kind);
  } else {
    if (e.chunk.empty()) return bad("chunk", "required for " + kind);
    if (e.chunk.size() > kMaxChunkTokenBytes)
      return bad("chunk", "longer than " + std::to_string(kMaxChunkTokenBytes) + " bytes");
    for (char c : e.chunk)
      if (!chunk_token_char(c))
        return bad("chunk", quote_for_message(e.chunk) + " has a byte outside [A-Za-z0-9._:/+-]");
  }
  // bytes
  if (is_hint && !chunk_hint && e.bytes != 0) return bad("bytes", "must be empty for a hint without a chunk");
  // tier
  if (static_cast<int>(e.tier) >= kTraceTierCount) return bad("tier", "unknown tier value");
  if ((e.kind == TraceEventKind::kCommit || e.kind == TraceEventKind::kInherit || is_hint) &&
      e.tier != TraceTier::kUnknown)
    return bad("tier", "must be empty for " + kind);
  if (e.kind == TraceEventKind::kEvict && e.tier == TraceTier::kUnknown)
    return bad("tier", "required for evict: the tier the chunk left");
  // hint
  if (static_cast<int>(e.hint) > static_cast<int>(HintKind::kParentChance)) return bad("hint", "unknown hint value");
  if (is_hint && e.hint == HintKind::kNone)
    return bad("hint", "required for a hint: will_load, population, sequence, done or parent_chance");
  if (!is_hint && e.hint != HintKind::kNone) return bad("hint", "must be empty for " + kind);
  // when_s
  if (e.hint == HintKind::kParentChance) {
    if (e.models.size() != 1)
      return bad("model", "a parent_chance hint names one model, found " + std::to_string(e.models.size()));
    if (!e.when_s || !(*e.when_s >= 0 && *e.when_s <= 1))
      return bad("when_s", "required for parent_chance: the member's chance to be the next parent, 0..1");
  } else if (e.when_s) {
    if (e.hint != HintKind::kWillLoad) return bad("when_s", "allowed for will_load and parent_chance hints only");
    if (!std::isfinite(*e.when_s) || *e.when_s < 0) return bad("when_s", "must be a finite number of seconds >= 0");
  }
  return Status::OK();
}

std::string format_trace_event(const TraceEvent& e) {
  std::string out = std::to_string(e.time_ns);
  out += ',';
  out += trace_event_kind_name(e.kind);
  out += ',';
  for (size_t i = 0; i < e.models.size(); ++i) {
    if (i) out += ';';
    append_escaped(out, e.models[i]);
  }
  out += ',';
  out += e.chunk;
  out += ',';
  if (e.kind != TraceEventKind::kHint || !e.chunk.empty()) out += std::to_string(e.bytes);
  out += ',';
  out += trace_tier_name(e.tier);
  out += ',';
  out += hint_kind_name(e.hint);
  out += ',';
  if (e.when_s) {
    char buf[64];
    // Shortest form that reads back as the same double.
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, *e.when_s);
    if (ec == std::errc()) out.append(buf, end);
  }
  return out;
}

std::string format_trace(const Trace& t) {
  std::string out;
  out.reserve(64 + t.events.size() * 64);
  out += kTraceMagic;
  out += '\n';
  out += kTraceColumns;
  out += '\n';
  for (const TraceEvent& e : t.events) {
    out += format_trace_event(e);
    out += '\n';
  }
  return out;
}

Result<Trace> parse_trace(std::string_view text, std::string_view source) {
  Trace trace;
  size_t pos = 0;
  uint64_t line_no = 0;
  int64_t last_time = 0;
  auto where = [&]() { return std::string(source) + ":" + std::to_string(line_no) + ": "; };
  while (pos < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = (nl == std::string_view::npos) ? text.size() : nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1) {
      if (line != kTraceMagic) {
        if (line.rfind("#cairn-trace ", 0) == 0)
          return invalid_argument(where() + "header: version " + quote_for_message(line.substr(13)) +
                                  " is not supported (this reader takes " + std::string(kTraceMagic) + ")");
        return invalid_argument(where() + "header: expected '" + std::string(kTraceMagic) +
                                "' as the first line, found " + quote_for_message(line));
      }
      continue;
    }
    if (line_no == 2) {
      if (line != kTraceColumns)
        return invalid_argument(where() + "header: expected the columns '" + std::string(kTraceColumns) + "', found " +
                                quote_for_message(line));
      continue;
    }
    if (line.empty())
      return invalid_argument(where() + "line: empty (only comment lines starting with '#' may carry no event)");
    if (line[0] == '#') continue;
    Result<TraceEvent> e = parse_line(line);
    if (!e.ok()) return invalid_argument(where() + e.status().message());
    if (e->time_ns < last_time)
      return invalid_argument(where() + "time_ns: " + std::to_string(e->time_ns) + " is before the previous event's " +
                              std::to_string(last_time) + " (times must not decrease)");
    last_time = e->time_ns;
    trace.events.push_back(std::move(e).value());
  }
  if (line_no < 2)
    return invalid_argument(std::string(source) + ":" + std::to_string(line_no + 1) +
                            ": header: missing (a trace starts with '" + std::string(kTraceMagic) + "' and '" +
                            std::string(kTraceColumns) + "')");
  return trace;
}

Result<Trace> read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("trace " + path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error("trace " + path + ": read failed");
  return parse_trace(text.str(), path);
}

// ---- TraceWriter ----

TraceWriter::TraceWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}

Result<std::unique_ptr<TraceWriter>> TraceWriter::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return errno_status("policy.trace: cannot create " + path, errno);
  std::string header(kTraceMagic);
  header.append("\n").append(kTraceColumns).append("\n");
  if (std::fputs(header.c_str(), f) == EOF || std::fflush(f) != 0) {
    const int err = errno;
    std::fclose(f);
    return errno_status("policy.trace: cannot write " + path, err);
  }
  return std::unique_ptr<TraceWriter>(new TraceWriter(path, f));
}

TraceWriter::~TraceWriter() { (void)close(); }

Status TraceWriter::append(const TraceEvent& e) {
  CAIRN_RETURN_IF_ERROR(validate_trace_event(e));
  std::string line;
  cairn::MutexLock lock(mu_);
  if (!file_) return io_error("policy.trace " + path_ + ": the writer is closed");
  if (e.time_ns < last_time_ns_) {
    TraceEvent clamped = e;
    clamped.time_ns = last_time_ns_;
    line = format_trace_event(clamped);
  } else {
    line = format_trace_event(e);
  }
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size()) {
    const int err = errno;
    std::clearerr(file_);
    return errno_status("policy.trace: cannot append to " + path_, err);
  }
  last_time_ns_ = std::max(last_time_ns_, e.time_ns);
  ++events_written_;
  return Status::OK();
}

Status TraceWriter::flush() {
  cairn::MutexLock lock(mu_);
  if (!file_) return io_error("policy.trace " + path_ + ": the writer is closed");
  if (std::fflush(file_) != 0) {
    const int err = errno;
    std::clearerr(file_);
    return errno_status("policy.trace: cannot flush " + path_, err);
  }
  return Status::OK();
}

Status TraceWriter::close() {
  cairn::MutexLock lock(mu_);
  if (!file_) return Status::OK();
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) return errno_status("policy.trace: cannot close " + path_, errno);
  return Status::OK();
}

uint64_t TraceWriter::events_written() const {
  cairn::MutexLock lock(mu_);
  return events_written_;
}

}  // namespace cairn
