#include "core/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>
#include <utility>

namespace cairn::safetensors {
namespace {

using json = nlohmann::json;

constexpr std::string_view kMetadataName = "__metadata__";
constexpr size_t kShownBytes = 128;         // longer names and values are cut in messages
constexpr size_t kMaxJsonErrorBytes = 512;  // nlohmann's messages quote the offending token

uint64_t get_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_u64_le(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(static_cast<uint8_t>(v >> (8 * i)));
}

void append_hex_escape(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xF];
}

// s as it appears in a message: quoted, control bytes (and every high byte unless s is UTF-8)
// escaped as \xNN, cut after about kShownBytes with its length noted.
std::string shown(std::string_view s) {
  const bool utf8 = valid_utf8(s);
  std::string out = "'";
  size_t i = 0;
  for (; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (i >= kShownBytes && (!utf8 || (c & 0xC0) != 0x80)) break;
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && !utf8)) {
      append_hex_escape(out, c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '\'';
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

// Text from elsewhere (a JSON library message) made printable ASCII and bounded.
std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxJsonErrorBytes; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7F) {
      append_hex_escape(out, c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxJsonErrorBytes) out += "...";
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::string offsets_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + "," + std::to_string(end) + "]";
}

std::string tensor_label(std::string_view name) { return "tensor " + shown(name); }

// Appends s as a JSON string literal. REQUIRES: s is UTF-8.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// Builds a Header from the JSON events of a safetensors header, checking its shape as it goes:
// nesting never goes deeper than the format allows, so a hostile header cannot make the parser
// build large trees, and duplicate keys are seen (a DOM would keep only the last). Offsets are
// checked against each other afterwards, by check_layout.
class HeaderSax {
 public:
  explicit HeaderSax(Header* header) : header_(header) {}

  // The reason parsing stopped; "" if it did not.
  const std::string& error() const { return error_; }

  bool null() { return unexpected("null"); }
  bool boolean(bool /*value*/) { return unexpected("a boolean"); }
  bool binary(json::binary_t& /*value*/) { return unexpected("binary data"); }

  bool number_integer(json::number_integer_t value) {
    if (value >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(value));
    switch (state_) {
      case State::kShape:
        return fail(tensor_label(tensor_.name) + ": shape has negative dimension " + std::to_string(value));
      case State::kOffsets:
        return fail(tensor_label(tensor_.name) + ": data_offsets has negative value " + std::to_string(value));
      default:
        return unexpected("a number");
    }
  }

  bool number_unsigned(json::number_unsigned_t value) {
    switch (state_) {
      case State::kShape:
        if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return fail(tensor_label(tensor_.name) + ": shape dimension " + std::to_string(value) + " is too large");
        if (tensor_.shape.size() == static_cast<size_t>(kMaxDims))
          return fail(tensor_label(tensor_.name) + ": shape has more than " + std::to_string(kMaxDims) + " dimensions");
        tensor_.shape.push_back(static_cast<int64_t>(value));
        return true;
      case State::kOffsets:
        if (offset_count_ == 2)
          return fail(tensor_label(tensor_.name) + ": data_offsets must be [begin, end] but has more than 2 entries");
        (offset_count_ == 0 ? tensor_.begin : tensor_.end) = value;
        ++offset_count_;
        return true;
      default:
        return unexpected("a number");
    }
  }

  // Also called for integers too large for 64 bits.
  bool number_float(json::number_float_t /*value*/, const json::string_t& text) {
    const char* problem = text.find_first_of(".eE") == text.npos ? " is too large" : " is not an integer";
    switch (state_) {
      case State::kShape:
        return fail(tensor_label(tensor_.name) + ": shape dimension " + shown(text) + problem);
      case State::kOffsets:
        return fail(tensor_label(tensor_.name) + ": data_offsets value " + shown(text) + problem);
      default:
        return unexpected("a number");
    }
  }

  bool string(json::string_t& value) {
    if (state_ == State::kDType) {
      auto dtype = dtype_from_name(value);
      if (!dtype) return fail(tensor_label(tensor_.name) + ": unknown dtype " + shown(value));
      tensor_.dtype = *dtype;
      state_ = State::kFieldKey;
      return true;
    }
    if (state_ == State::kMetadataValue) {
      header_->metadata.emplace(std::move(metadata_key_), std::move(value));
      state_ = State::kMetadataKey;
      return true;
    }
    return unexpected("a string");
  }

  bool start_object(std::size_t /*elements*/) {
    if (state_ == State::kTop) {
      state_ = State::kEntryKey;
      return true;
    }
    if (state_ == State::kEntryValue) {
      state_ = in_metadata_ ? State::kMetadataKey : State::kFieldKey;
      return true;
    }
    return unexpected("an object");
  }

  bool key(json::string_t& key) {
    switch (state_) {
      case State::kEntryKey:
        return entry_key(key);
      case State::kMetadataKey:
        if (header_->metadata.count(key)) return fail("__metadata__: duplicate key " + shown(key));
        metadata_key_ = std::move(key);
        state_ = State::kMetadataValue;
        return true;
      case State::kFieldKey:
        return field_key(key);
      default:
        return unexpected("a key");
    }
  }

  bool end_object() {
    switch (state_) {
      case State::kEntryKey:
        state_ = State::kDone;
        return true;
      case State::kMetadataKey:
        in_metadata_ = false;
        last_entry_ = kMetadataName;
        state_ = State::kEntryKey;
        return true;
      case State::kFieldKey:
        if (!has_dtype_) return fail(tensor_label(tensor_.name) + ": missing field 'dtype'");
        if (!has_shape_) return fail(tensor_label(tensor_.name) + ": missing field 'shape'");
        if (!has_offsets_) return fail(tensor_label(tensor_.name) + ": missing field 'data_offsets'");
        last_entry_ = tensor_.name;
        header_->tensors.push_back(std::move(tensor_));
        state_ = State::kEntryKey;
        return true;
      default:
        return unexpected("the end of an object");
    }
  }

  bool start_array(std::size_t /*elements*/) {
    if (state_ == State::kShapeStart) {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kOffsetsStart) {
      state_ = State::kOffsets;
      return true;
    }
    return unexpected("an array");
  }

  bool end_array() {
    if (state_ == State::kShape) {
      state_ = State::kFieldKey;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (offset_count_ != 2)
        return fail(tensor_label(tensor_.name) + ": data_offsets must be [begin, end] but has " +
                    std::to_string(offset_count_) + " entries");
      state_ = State::kFieldKey;
      return true;
    }
    return unexpected("the end of an array");
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const nlohmann::detail::exception& e) {
    std::string_view what = e.what();
    if (auto pos = what.find("] "); what.starts_with("[json.exception.") && pos != what.npos)
      what.remove_prefix(pos + 2);
    return fail("header is not valid JSON" + where() + ": " + printable(what));
  }

 private:
  enum class State {
    kTop,          // before the header object
    kEntryKey,     // in the header object: a tensor name or __metadata__
    kEntryValue,   // after that key
    kMetadataKey,  // in __metadata__
    kMetadataValue,
    kFieldKey,  // in a tensor entry: dtype, shape or data_offsets
    kDType,
    kShapeStart,
    kShape,
    kOffsetsStart,
    kOffsets,
    kDone,
  };

  // Where the parser is, for JSON syntax errors: " in tensor 'w' (shape)".
  std::string where() const {
    switch (state_) {
      case State::kTop:
        return "";
      case State::kEntryKey:
        return last_entry_.empty() ? "" : " after entry " + shown(last_entry_);
      case State::kMetadataKey:
      case State::kMetadataValue:
        return " in __metadata__";
      case State::kEntryValue:
        if (in_metadata_) return " in __metadata__";
        return " in " + tensor_label(tensor_.name);
      case State::kFieldKey:
        return " in " + tensor_label(tensor_.name);
      case State::kDType:
        return " in " + tensor_label(tensor_.name) + " (dtype)";
      case State::kShapeStart:
      case State::kShape:
        return " in " + tensor_label(tensor_.name) + " (shape)";
      case State::kOffsetsStart:
      case State::kOffsets:
        return " in " + tensor_label(tensor_.name) + " (data_offsets)";
      case State::kDone:
        return " after the header object";
    }
    return "";
  }

  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  // What the value in the current state must be, for "expected X, found Y" messages.
  bool unexpected(std::string_view found) {
    std::string got = std::string(", not ") + std::string(found);
    switch (state_) {
      case State::kTop:
        return fail("header is not a JSON object" + got);
      case State::kEntryValue:
        if (in_metadata_) return fail("__metadata__ must be an object of string to string" + got);
        return fail(tensor_label(tensor_.name) + ": entry must be an object with dtype, shape and data_offsets" + got);
      case State::kMetadataValue:
        return fail("__metadata__ " + shown(metadata_key_) + ": value must be a string" + got);
      case State::kDType:
        return fail(tensor_label(tensor_.name) + ": dtype must be a string" + got);
      case State::kShapeStart:
      case State::kShape:
        return fail(tensor_label(tensor_.name) + ": shape must be an array of non-negative integers" + got);
      case State::kOffsetsStart:
      case State::kOffsets:
        return fail(tensor_label(tensor_.name) + ": data_offsets must be [begin, end] of non-negative integers" + got);
      default:
        return fail("header: unexpected " + std::string(found));
    }
  }

  bool entry_key(json::string_t& key) {
    if (key == kMetadataName) {
      if (header_->has_metadata) return fail("header: duplicate entry '__metadata__'");
      header_->has_metadata = true;
      in_metadata_ = true;
      state_ = State::kEntryValue;
      return true;
    }
    if (!valid_name(key))
      return fail("tensor name " + shown(key) + " is invalid (names are 1.." + std::to_string(kMaxNameBytes) +
                  " bytes of UTF-8 without NUL)");
    if (!names_.insert(key).second) return fail("header: duplicate " + tensor_label(key));
    tensor_ = TensorEntry{};
    tensor_.name = std::move(key);
    has_dtype_ = has_shape_ = has_offsets_ = false;
    offset_count_ = 0;
    state_ = State::kEntryValue;
    return true;
  }

  bool field_key(const json::string_t& key) {
    bool* seen;
    State next;
    if (key == "dtype") {
      seen = &has_dtype_;
      next = State::kDType;
    } else if (key == "shape") {
      seen = &has_shape_;
      next = State::kShapeStart;
    } else if (key == "data_offsets") {
      seen = &has_offsets_;
      next = State::kOffsetsStart;
    } else {
      return fail(tensor_label(tensor_.name) + ": unknown field " + shown(key) +
                  " (expected dtype, shape and data_offsets)");
    }
    if (*seen) return fail(tensor_label(tensor_.name) + ": duplicate field " + shown(key));
    *seen = true;
    state_ = next;
    return true;
  }

  Header* header_;
  State state_ = State::kTop;
  std::string error_;
  bool in_metadata_ = false;
  std::string metadata_key_;
  std::string last_entry_;  // the last complete entry's name, for messages
  std::unordered_set<std::string> names_;
  TensorEntry tensor_;  // the entry being read
  bool has_dtype_ = false;
  bool has_shape_ = false;
  bool has_offsets_ = false;
  int offset_count_ = 0;
};

// Checks each tensor's byte range against its shape and the data section, then that the ranges
// tile the data section exactly. Sorts header->tensors by offset.
Status check_layout(Header* header) {
  auto range = [](const TensorEntry& t) {
    return tensor_label(t.name) + ": data_offsets " + offsets_string(t.begin, t.end);
  };
  auto shape_of = [](const TensorEntry& t) {
    return tensor_label(t.name) + ": shape " + shape_string(t.shape) + " of " + std::string(dtype_name(t.dtype));
  };
  for (const TensorEntry& t : header->tensors) {
    if (t.begin > t.end) return invalid_argument(range(t) + " end before they begin");
    if (t.end > header->data_bytes)
      return invalid_argument(range(t) + " run past the end of the data section (" +
                              std::to_string(header->data_bytes) + " bytes; file truncated?)");
    auto need = tensor_nbytes(t.dtype, t.shape);
    if (!need) return invalid_argument(shape_of(t) + " is too large");
    if (*need != t.nbytes())
      return invalid_argument(shape_of(t) + " needs " + std::to_string(*need) + " bytes but " + "data_offsets " +
                              offsets_string(t.begin, t.end) + " span " + std::to_string(t.nbytes()));
  }
  std::stable_sort(header->tensors.begin(), header->tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& t : header->tensors) {
    if (t.begin < covered)
      return invalid_argument(range(t) + " overlap " + tensor_label(prev->name) + " at " +
                              offsets_string(prev->begin, prev->end));
    if (t.begin > covered)
      return invalid_argument(range(t) + " leave a hole of " + std::to_string(t.begin - covered) + " bytes after " +
                              (prev ? tensor_label(prev->name) + " at " + offsets_string(prev->begin, prev->end)
                                    : std::string("the start of the data section")));
    covered = t.end;
    prev = &t;
  }
  if (covered != header->data_bytes)
    return invalid_argument("the tensors cover " + std::to_string(covered) + " bytes but the data section holds " +
                            std::to_string(header->data_bytes) + " (" + std::to_string(header->data_bytes - covered) +
                            " trailing bytes belong to no tensor)");
  return Status::OK();
}

// Reads exactly buf.size() bytes at offset.
Status pread_exact(int fd, std::span<uint8_t> buf, uint64_t offset) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t r = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status("read", errno);
    }
    if (r == 0) return io_error("file shrank while its header was read");
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

const TensorEntry* Header::find(std::string_view name) const {
  for (const TensorEntry& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<Header> parse_header(std::span<const uint8_t> prefix, uint64_t file_size, uint64_t* needed_prefix) {
  if (needed_prefix) *needed_prefix = 0;
  auto need = [&](uint64_t n) -> Status {
    if (needed_prefix) *needed_prefix = n;
    return invalid_argument("safetensors header: need the first " + std::to_string(n) + " bytes of the file, have " +
                            std::to_string(prefix.size()));
  };
  if (prefix.size() > file_size)
    return invalid_argument("safetensors header: prefix of " + std::to_string(prefix.size()) +
                            " bytes is longer than the file (" + std::to_string(file_size) + " bytes)");
  if (file_size < 8)
    return invalid_argument("file of " + std::to_string(file_size) +
                            " bytes is too short for the 8-byte header length (not safetensors?)");
  if (prefix.size() < 8) return need(8);
  const uint64_t n = get_u64_le(prefix.data());
  if (n > kMaxHeaderBytes)
    return invalid_argument("header length " + std::to_string(n) + " exceeds the limit of " +
                            std::to_string(kMaxHeaderBytes) + " bytes (not safetensors?)");
  if (n > file_size - 8)
    return invalid_argument("header length " + std::to_string(n) + " runs past the end of the " +
                            std::to_string(file_size) + "-byte file (truncated?)");
  if (prefix.size() - 8 < n) return need(8 + n);
  const uint8_t* first = prefix.data() + 8;
  if (n == 0 || first[0] != '{')
    return invalid_argument("header does not start with '{' (not a JSON object; not safetensors?)");

  Header header;
  header.header_bytes = n;
  header.data_bytes = file_size - 8 - n;
  HeaderSax sax(&header);
  bool parsed;
  try {
    parsed = json::sax_parse(first, first + n, &sax);
  } catch (const json::exception& e) {
    return invalid_argument("header is not valid JSON: " + printable(e.what()));
  }
  if (!parsed || !sax.error().empty())
    return invalid_argument(sax.error().empty() ? "header is not valid JSON" : sax.error());
  CAIRN_RETURN_IF_ERROR(check_layout(&header));
  return header;
}

Result<Header> read_header(const std::string& path) {
  const std::string context = "safetensors file '" + path + "'";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("opening " + context, errno);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno_status("stat of " + context, errno);
  if (!S_ISREG(st.st_mode)) return invalid_argument(context + ": not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);

  // The first pass reads the length; parse_header then says how much more to read, which it has
  // already checked against the file size and kMaxHeaderBytes.
  std::vector<uint8_t> buf(std::min<uint64_t>(8, file_size));
  CAIRN_RETURN_IF_ERROR(pread_exact(fd, buf, 0).with_context(context));
  for (;;) {
    uint64_t needed = 0;
    auto header = parse_header(buf, file_size, &needed);
    if (header.ok() || needed <= buf.size()) {
      if (!header.ok()) return header.status().with_context(context);
      return header;
    }
    size_t have = buf.size();
    buf.resize(needed);
    CAIRN_RETURN_IF_ERROR(pread_exact(fd, std::span<uint8_t>(buf).subspan(have), have).with_context(context));
  }
}

Result<std::string> build_header(std::vector<TensorEntry>& tensors,
                                 const std::map<std::string, std::string>* metadata) {
  std::string js = "{";
  if (metadata) {
    append_json_string(js, kMetadataName);
    js += ":{";
    bool first = true;
    for (const auto& [key, value] : *metadata) {
      if (!valid_utf8(key)) return invalid_argument("__metadata__ key " + shown(key) + " is not UTF-8");
      if (!valid_utf8(value)) return invalid_argument("__metadata__ " + shown(key) + ": value is not UTF-8");
      if (!first) js += ',';
      first = false;
      append_json_string(js, key);
      js += ':';
      append_json_string(js, value);
    }
    js += '}';
  }

  // Validate everything before touching the caller's entries.
  std::vector<uint64_t> ends;
  ends.reserve(tensors.size());
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  uint64_t offset = 0;
  for (const TensorEntry& t : tensors) {
    if (!valid_name(t.name) || t.name == kMetadataName)
      return invalid_argument("tensor name " + shown(t.name) + " is invalid (names are 1.." +
                              std::to_string(kMaxNameBytes) + " bytes of UTF-8 without NUL, and not __metadata__)");
    if (!names.insert(t.name).second) return invalid_argument("duplicate " + tensor_label(t.name));
    if (!dtype_from_int(static_cast<int>(t.dtype)))
      return invalid_argument(tensor_label(t.name) + ": invalid dtype value " +
                              std::to_string(static_cast<int>(t.dtype)));
    if (t.shape.size() > static_cast<size_t>(kMaxDims))
      return invalid_argument(tensor_label(t.name) + ": shape " + shape_string(t.shape) + " has more than " +
                              std::to_string(kMaxDims) + " dimensions");
    auto nbytes = tensor_nbytes(t.dtype, t.shape);
    if (!nbytes)
      return invalid_argument(tensor_label(t.name) + ": shape " + shape_string(t.shape) + " of " +
                              std::string(dtype_name(t.dtype)) + " has a negative dimension or is too large");
    if (*nbytes > std::numeric_limits<uint64_t>::max() - offset)
      return invalid_argument(tensor_label(t.name) + ": the tensors total more than 2^64 bytes");
    offset += *nbytes;
    ends.push_back(offset);
  }

  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorEntry& t = tensors[i];
    if (js.size() > 1) js += ',';
    append_json_string(js, t.name);
    js += ":{\"dtype\":";
    append_json_string(js, dtype_name(t.dtype));
    js += ",\"shape\":" + shape_string(t.shape);
    js += ",\"data_offsets\":" + offsets_string(i ? ends[i - 1] : 0, ends[i]) + "}";
  }
  js += '}';
  js.append((8 - js.size() % 8) % 8, ' ');
  if (js.size() > kMaxHeaderBytes)
    return invalid_argument("header of " + std::to_string(js.size()) + " bytes exceeds the limit of " +
                            std::to_string(kMaxHeaderBytes) + " bytes (too many tensors or too much metadata)");
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].begin = i ? ends[i - 1] : 0;
    tensors[i].end = ends[i];
  }

  std::string out(8, '\0');
  put_u64_le(out.data(), js.size());
  out += js;
  return out;
}

}  // namespace cairn::safetensors
