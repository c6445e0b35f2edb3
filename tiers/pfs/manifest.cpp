// Manifests (manifest.hpp): the JSON codec and the checks every manifest must pass, whether it
// comes from disk, from a client or from the burst buffer's records.
//
// Never throws and does no I/O: a manifest that is wrong in any way is a kInvalidArgument naming
// the field, so open can report a bad file as corrupt and commit can refuse a bad model. Anything
// that depends on the repository's state (a parent present, a chunk already stored) is not checked
// here.
#include "tiers/pfs/manifest.hpp"

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#include "core/safetensors.hpp"
#include "tiers/pfs/repo_files.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;
using pfs::quote;
using pfs::valid_pack_name;

constexpr int kManifestFormat = 1;

// ---------------------------------------------------------------------------------------------
// Base64 (RFC 4648, standard alphabet, padded) for the binary source_header.

constexpr char kBase64Chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out += kBase64Chars[(v >> 18) & 63];
    out += kBase64Chars[(v >> 12) & 63];
    out += kBase64Chars[(v >> 6) & 63];
    out += kBase64Chars[v & 63];
  }
  size_t rest = in.size() - i;
  if (rest > 0) {
    uint32_t v = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0);
    out += kBase64Chars[(v >> 18) & 63];
    out += kBase64Chars[(v >> 12) & 63];
    out += rest == 2 ? kBase64Chars[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Strict: length a multiple of 4, padding only at the end, unused bits zero (so the encoding of
// a byte string is unique).
std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      int d = k >= 4 - static_cast<size_t>(pad) ? 0 : value(in[i + k]);
      if (d < 0) return std::nullopt;
      v = v << 6 | static_cast<uint32_t>(d);
    }
    out += static_cast<char>((v >> 16) & 0xFF);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
    if ((pad == 2 && (v & 0xFFFF) != 0) || (pad == 1 && (v & 0xFF) != 0)) return std::nullopt;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Nesting depth of metadata and architecture, for validate_manifest.

bool json_depth_ok(const json& j, int depth) {
  if (depth > kMaxManifestJsonDepth) return false;
  if (j.is_structured())
    for (const auto& v : j)
      if (!json_depth_ok(v, depth + 1)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// JSON field access for manifest_from_json.

Status check_object(const json& j, const std::string& where, std::initializer_list<const char*> fields) {
  if (!j.is_object()) return invalid_argument(where + ": expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* f : fields) known = known || it.key() == f;
    if (!known) return invalid_argument(where + ": unknown field " + quote(it.key()));
  }
  for (const char* f : fields)
    if (j.find(f) == j.end()) return invalid_argument(where + ": missing field '" + f + "'");
  return Status::OK();
}

std::string field_path(const std::string& where, const char* field) {
  return where.empty() ? std::string(field) : where + "." + field;
}

Result<std::string> get_string(const json& obj, const std::string& where, const char* field) {
  const json& v = obj.at(field);
  if (!v.is_string()) return invalid_argument(field_path(where, field) + ": expected a string");
  return v.get<std::string>();
}

Result<uint64_t> get_uint(const json& obj, const std::string& where, const char* field) {
  const json& v = obj.at(field);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    auto i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  return invalid_argument(field_path(where, field) + ": expected a non-negative integer");
}

// A chunk: {"hash", "length", "pack", "offset"}, and when coded "coding", "stored" and (a delta)
// "base": {"hash", "pack", "offset"} with its own "coding" and "stored" when coded. A base has no
// "length": it is the delta's (base_length).
Result<ChunkRef> chunk_from_json(const json& c, const std::string& cw, bool is_base, uint64_t base_length) {
  if (!c.is_object()) return invalid_argument(cw + ": expected a JSON object");
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string& k = it.key();
    bool known = k == "hash" || k == "pack" || k == "offset" || k == "coding" || k == "stored" ||
                 (!is_base && (k == "length" || k == "base"));
    if (!known) return invalid_argument(cw + ": unknown field " + quote(k));
  }
  for (const char* f : {"hash", "length", "pack", "offset"}) {
    if (is_base && std::string_view(f) == "length") continue;
    if (c.find(f) == c.end()) return invalid_argument(cw + ": missing field '" + f + "'");
  }
  ChunkRef r;
  CAIRN_ASSIGN_OR_RETURN(std::string hex, get_string(c, cw, "hash"));
  std::optional<ChunkHash> h = ChunkHash::from_hex(hex);
  if (!h) return invalid_argument(cw + ".hash: expected 32 lowercase hex digits");
  r.hash = *h;
  if (is_base) {
    r.length = base_length;
  } else {
    CAIRN_ASSIGN_OR_RETURN(r.length, get_uint(c, cw, "length"));
  }
  CAIRN_ASSIGN_OR_RETURN(r.pack, get_string(c, cw, "pack"));
  CAIRN_ASSIGN_OR_RETURN(r.offset, get_uint(c, cw, "offset"));
  if (auto it = c.find("coding"); it != c.end()) {
    if (!it->is_string()) return invalid_argument(cw + ".coding: expected a string");
    std::optional<ChunkCoding> coding = chunk_coding_from_name(it->get<std::string>());
    if (!coding || *coding == ChunkCoding::kRaw)
      return invalid_argument(cw + ".coding: " + quote(it->get<std::string>()) +
                              " is not a coding (\"planes\" or \"delta\"; raw chunks have no \"coding\")");
    r.coding = *coding;
    if (c.find("stored") == c.end()) return invalid_argument(cw + ": a coded chunk needs 'stored'");
    CAIRN_ASSIGN_OR_RETURN(r.stored, get_uint(c, cw, "stored"));
  } else if (c.find("stored") != c.end()) {
    return invalid_argument(cw + ".stored: only a coded chunk has one");
  }
  if (auto it = c.find("base"); it != c.end()) {
    CAIRN_ASSIGN_OR_RETURN(ChunkRef b, chunk_from_json(*it, cw + ".base", /*is_base=*/true, r.length));
    r.base = std::make_shared<const ChunkRef>(std::move(b));
  }
  return r;
}

json chunk_to_json(const ChunkRef& c, bool is_base) {
  json jc = json::object();
  jc["hash"] = c.hash.hex();
  if (!is_base) jc["length"] = c.length;
  jc["pack"] = c.pack;
  jc["offset"] = c.offset;
  if (c.coding != ChunkCoding::kRaw) {
    jc["coding"] = std::string(chunk_coding_name(c.coding));
    jc["stored"] = c.stored;
  }
  if (c.base && !is_base) jc["base"] = chunk_to_json(*c.base, /*is_base=*/true);
  return jc;
}

// A chunk's coding fields agree with each other: raw has no stored size and no base; a coded chunk
// has a stored size; a delta, and only a delta, has a base of its length, stored whole.
std::string coding_problem(const ChunkRef& c) {
  if (c.coding == ChunkCoding::kRaw) {
    if (c.stored != 0) return "a raw chunk with a stored size";
    if (c.base) return "a raw chunk with a base";
    return "";
  }
  if (c.stored == 0) return "a coded chunk without its stored size";
  if (c.stored > UINT32_MAX) return "a coded chunk of more than 4 GiB";
  if (c.coding != ChunkCoding::kDelta) return c.base ? "a chunk coded without a delta, with a base" : "";
  if (!c.base) return "a delta without a base";
  const ChunkRef& b = *c.base;
  if (b.coding == ChunkCoding::kDelta || b.base) return "a delta whose base is a delta";
  if (b.length != c.length) return "a base of another length";
  if (b.hash == ChunkHash{}) return "a base without a hash";
  if (b.coding == ChunkCoding::kRaw ? b.stored != 0 : b.stored == 0)
    return "a base whose stored size disagrees with its coding";
  return "";
}

Result<TensorManifest> tensor_from_json(const json& j, const std::string& where) {
  CAIRN_RETURN_IF_ERROR(check_object(j, where, {"name", "dtype", "shape", "nbytes", "chunks"}));
  TensorManifest t;
  CAIRN_ASSIGN_OR_RETURN(t.name, get_string(j, where, "name"));
  CAIRN_ASSIGN_OR_RETURN(std::string dtype, get_string(j, where, "dtype"));
  std::optional<DType> dt = dtype_from_name(dtype);
  if (!dt) return invalid_argument(where + ".dtype: unknown dtype " + quote(dtype));
  t.dtype = *dt;
  const json& shape = j.at("shape");
  if (!shape.is_array()) return invalid_argument(where + ".shape: expected an array");
  if (shape.size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(where + ".shape: more than " + std::to_string(kMaxDims) + " dimensions");
  for (const json& d : shape) {
    if (d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    } else if (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() >= 0) {
      t.shape.push_back(d.get<int64_t>());
    } else {
      return invalid_argument(where + ".shape: dimensions must be non-negative integers");
    }
  }
  CAIRN_ASSIGN_OR_RETURN(t.nbytes, get_uint(j, where, "nbytes"));
  const json& chunks = j.at("chunks");
  if (!chunks.is_array()) return invalid_argument(where + ".chunks: expected an array");
  t.chunks.reserve(chunks.size());
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    CAIRN_ASSIGN_OR_RETURN(ChunkRef r, chunk_from_json(chunks[ci], where + ".chunks[" + std::to_string(ci) + "]",
                                                       /*is_base=*/false, 0));
    t.chunks.push_back(std::move(r));
  }
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Validation

Status validate_manifest(const ModelManifest& m, bool with_locations) {
  if (!valid_name(m.id)) return invalid_argument("id " + quote(m.id) + " is not 1..1024 bytes of UTF-8 without NUL");
  if (!m.parent.empty() && !valid_name(m.parent))
    return invalid_argument("parent " + quote(m.parent) + " is not a valid model id");
  if (m.parent == m.id) return invalid_argument("model " + quote(m.id) + " names itself as parent");
  if (!m.metadata.is_object()) return invalid_argument("metadata: expected a JSON object");
  if (!m.architecture.is_null() && !m.architecture.is_object())
    return invalid_argument("architecture: expected a JSON object or null");
  if (!json_depth_ok(m.metadata, 1))
    return invalid_argument("metadata: nested deeper than " + std::to_string(kMaxManifestJsonDepth));
  if (!json_depth_ok(m.architecture, 1))
    return invalid_argument("architecture: nested deeper than " + std::to_string(kMaxManifestJsonDepth));
  if (m.source_header.size() > 8 + safetensors::kMaxHeaderBytes)
    return invalid_argument("source_header: longer than a safetensors header may be");
  if (with_locations && m.created_ns < 0) return invalid_argument("created_ns: negative");
  if (with_locations && !m.pack.empty() && !valid_pack_name(m.pack))
    return invalid_argument("pack: " + quote(m.pack) + " is not a pack file name");
  std::unordered_set<std::string_view> names;
  for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
    const TensorManifest& t = m.tensors[ti];
    const std::string where = "tensors[" + std::to_string(ti) + "]";
    // "tensors[2].nbytes: ... (tensor 'w')"
    auto bad = [&t](const std::string& field, const std::string& what) {
      return invalid_argument(field + ": " + what + " (tensor " + quote(t.name) + ")");
    };
    if (!valid_name(t.name)) return bad(where + ".name", "not a valid tensor name");
    if (!names.insert(t.name).second) return bad(where + ".name", "duplicate tensor name");
    if (!dtype_from_int(static_cast<int>(t.dtype))) return bad(where + ".dtype", "not a known dtype");
    if (t.shape.size() > static_cast<size_t>(kMaxDims))
      return bad(where + ".shape", "more than " + std::to_string(kMaxDims) + " dimensions");
    std::optional<uint64_t> expect = tensor_nbytes(t.dtype, t.shape);
    if (!expect) return bad(where + ".shape", "negative dimension or too many elements");
    if (*expect != t.nbytes)
      return bad(where + ".nbytes", std::to_string(t.nbytes) + " but shape x " + std::string(dtype_name(t.dtype)) +
                                        " is " + std::to_string(*expect));
    uint64_t sum = 0;
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      const ChunkRef& c = t.chunks[ci];
      const std::string cw = where + ".chunks[" + std::to_string(ci) + "]";
      if (c.hash == ChunkHash{}) return bad(cw + ".hash", "not set");
      if (c.length == 0) return bad(cw + ".length", "zero");
      if (c.length > t.nbytes - sum)
        return bad(cw + ".length", "the chunks hold more than the tensor's " + std::to_string(t.nbytes) + " bytes");
      sum += c.length;
      if (std::string p = coding_problem(c); !p.empty()) return bad(cw + ".coding", p);
      if (with_locations) {
        if (!valid_pack_name(c.pack)) return bad(cw + ".pack", quote(c.pack) + " is not a pack file name");
        if (c.offset > UINT64_MAX - c.stored_bytes()) return bad(cw + ".offset", "too large");
        if (c.base) {
          if (!valid_pack_name(c.base->pack))
            return bad(cw + ".base.pack", quote(c.base->pack) + " is not a pack file name");
          if (c.base->offset > UINT64_MAX - c.base->stored_bytes()) return bad(cw + ".base.offset", "too large");
        }
      }
    }
    if (sum != t.nbytes)
      return bad(where + ".chunks",
                 "they hold " + std::to_string(sum) + " bytes, the tensor " + std::to_string(t.nbytes));
  }
  return Status::OK();
}

Status validate_chunking(const ModelManifest& m, uint64_t chunk_size) {
  for (const TensorManifest& t : m.tensors) {
    uint64_t want = chunk_count(t.nbytes, chunk_size);
    if (t.chunks.size() != want)
      return invalid_argument("tensor " + quote(t.name) + " has " + std::to_string(t.chunks.size()) + " chunks; " +
                              std::to_string(t.nbytes) + " bytes in chunks of " + std::to_string(chunk_size) +
                              " make " + std::to_string(want));
    uint64_t left = t.nbytes;
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      uint64_t len = std::min(left, chunk_size);
      if (t.chunks[ci].length != len)
        return invalid_argument("tensor " + quote(t.name) + " chunk " + std::to_string(ci) + " has length " +
                                std::to_string(t.chunks[ci].length) + "; expected " + std::to_string(len) +
                                " (chunk size " + std::to_string(chunk_size) + ")");
      left -= len;
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// ModelManifest

const TensorManifest* ModelManifest::find(std::string_view name) const {
  for (const TensorManifest& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t ModelManifest::logical_bytes() const {
  uint64_t sum = 0;
  for (const TensorManifest& t : tensors) sum += t.nbytes;
  return sum;
}

json manifest_to_json(const ModelManifest& m) {
  json tensors = json::array();
  for (const TensorManifest& t : m.tensors) {
    json chunks = json::array();
    for (const ChunkRef& c : t.chunks) {
      chunks.push_back(chunk_to_json(c, /*is_base=*/false));
    }
    json jt = json::object();
    jt["name"] = t.name;
    jt["dtype"] = std::string(dtype_name(t.dtype));
    jt["shape"] = t.shape;
    jt["nbytes"] = t.nbytes;
    jt["chunks"] = std::move(chunks);
    tensors.push_back(std::move(jt));
  }
  json j = json::object();
  j["format"] = kManifestFormat;
  j["id"] = m.id;
  j["parent"] = m.parent;
  j["created_ns"] = m.created_ns;
  j["metadata"] = m.metadata;
  j["architecture"] = m.architecture;
  j["pack"] = m.pack;
  j["source_header"] = base64_encode(m.source_header);
  j["tensors"] = std::move(tensors);
  if (m.retired_ns != 0) j["retired_ns"] = m.retired_ns;
  if (m.collected) j["collected"] = true;
  return j;
}

Result<ModelManifest> manifest_from_json(const json& j, bool with_locations) {
  const std::string top = "manifest";
  if (!j.is_object()) return invalid_argument(top + ": expected a JSON object");
  // Optional fields, written only when set.
  json required = j;
  for (const char* opt : {"retired_ns", "collected"}) required.erase(opt);
  CAIRN_RETURN_IF_ERROR(check_object(
      required, top,
      {"format", "id", "parent", "created_ns", "metadata", "architecture", "pack", "source_header", "tensors"}));
  const json& format = j.at("format");
  if (!format.is_number_integer() || format.get<int64_t>() != kManifestFormat)
    return invalid_argument("format: this cairn reads manifest format " + std::to_string(kManifestFormat) +
                            " only; got " +
                            (format.is_number_unsigned()  ? std::to_string(format.get<uint64_t>())
                             : format.is_number_integer() ? std::to_string(format.get<int64_t>())
                                                          : std::string("a value that is not an integer")));
  ModelManifest m;
  CAIRN_ASSIGN_OR_RETURN(m.id, get_string(j, "", "id"));
  CAIRN_ASSIGN_OR_RETURN(m.parent, get_string(j, "", "parent"));
  const json& created = j.at("created_ns");
  if (!created.is_number_integer() ||
      (created.is_number_unsigned() && created.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    return invalid_argument("created_ns: expected an integer that fits in 64 bits");
  m.created_ns = created.get<int64_t>();
  m.metadata = j.at("metadata");
  m.architecture = j.at("architecture");
  CAIRN_ASSIGN_OR_RETURN(m.pack, get_string(j, "", "pack"));
  CAIRN_ASSIGN_OR_RETURN(std::string b64, get_string(j, "", "source_header"));
  std::optional<std::string> header = base64_decode(b64);
  if (!header) return invalid_argument("source_header: not canonical base64");
  m.source_header = std::move(*header);
  const json& tensors = j.at("tensors");
  if (!tensors.is_array()) return invalid_argument("tensors: expected an array");
  m.tensors.reserve(tensors.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    CAIRN_ASSIGN_OR_RETURN(TensorManifest t, tensor_from_json(tensors[ti], "tensors[" + std::to_string(ti) + "]"));
    m.tensors.push_back(std::move(t));
  }
  if (auto it = j.find("retired_ns"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
        (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
      return invalid_argument("retired_ns: expected a positive integer that fits in 64 bits");
    m.retired_ns = it->get<int64_t>();
  }
  if (auto it = j.find("collected"); it != j.end()) {
    if (!it->is_boolean()) return invalid_argument("collected: expected true or false");
    m.collected = it->get<bool>();
    if (m.collected && (m.retired_ns == 0 || !m.tensors.empty() || !m.pack.empty()))
      return invalid_argument("collected: only a retired model without tensors or pack can be collected");
  }
  CAIRN_RETURN_IF_ERROR(validate_manifest(m, with_locations));
  return m;
}

}  // namespace cairn
