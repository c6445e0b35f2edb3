// The repository on the parallel filesystem. Format and protocol: docs/repository-format.md.
//
// Why this shape: Lustre and GPFS are slow at metadata, so a commit creates exactly two files (one
// pack, one manifest) with large sequential writes, and open reads one manifest and one pack prefix
// per model. Everything else (lineage, chunk index, reference counts) is derived in memory.
#include "tiers/pfs/repository.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/fs.hpp"
#include "core/safetensors.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;

constexpr std::string_view kFormatMagic = "cairn-repository";
constexpr int kFormatVersion = 1;
constexpr int kManifestFormat = 1;
constexpr const char* kFormatFile = "FORMAT";
constexpr const char* kLockFile = "LOCK";
constexpr const char* kPacksDir = "packs";
constexpr const char* kManifestsDir = "manifests";
constexpr std::string_view kTmpPrefix = ".tmp-";
constexpr std::string_view kPackSuffix = ".safetensors";
constexpr std::string_view kManifestSuffix = ".json";
constexpr std::string_view kChunkEntryPrefix = "__chunk__.";
constexpr uint64_t kMaxChunkSize = 1ull << 32;      // 4 GiB: a chunk is read into memory whole
constexpr uint64_t kMaxManifestBytes = 1ull << 30;  // sanity bound when reading a manifest
constexpr size_t kMaxOpenPacks = 64;                // read file descriptors kept open
constexpr size_t kMaxPackNameBytes = 255;           // NAME_MAX
constexpr int kReaderScanAttempts = 5;

// ---------------------------------------------------------------------------------------------
// Small POSIX helpers.

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string join_path(const std::string& a, std::string_view b) {
  std::string out = a;
  if (out.empty() || out.back() != '/') out += '/';
  out += b;
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A name for messages: quoted, cut to 80 bytes (ids can be 1 KiB, fuzzed keys anything).
std::string quote(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out = "'";
  out += s.substr(0, kMax);
  if (s.size() > kMax) out += "...";
  out += "'";
  return out;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return std::string(buf, 16);
}

// Reads exactly size bytes at offset; *got tells how many were read before end of file.
Status pread_all(int fd, void* dst, size_t size, uint64_t offset, const std::string& path, size_t* got) {
  auto* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      *got = done;
      return errno_status("reading " + path, errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  *got = done;
  return Status::ok();
}

Status fsync_dir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("opening directory " + path + " to sync it", errno);
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) break;  // filesystems that cannot sync directories
    return errno_status("syncing directory " + path, errno);
  }
  return Status::ok();
}

// mkdir -p with mode 0755 for the directories it creates.
Status make_dirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    cur = path.substr(0, next);
    pos = next + 1;
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("creating directory " + cur, errno);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_status("checking directory " + path, errno);
  if (!S_ISDIR(st.st_mode)) return invalid_argument(path + " exists and is not a directory");
  return Status::ok();
}

// Entry names of a directory, without "." and "..". *missing is set (and OK returned) when the
// directory does not exist and missing != nullptr.
Status list_dir(const std::string& path, std::vector<std::string>* names, bool* missing = nullptr) {
  names->clear();
  if (missing) *missing = false;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) {
    if (errno == ENOENT && missing) {
      *missing = true;
      return Status::ok();
    }
    return errno_status("listing directory " + path, errno);
  }
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names->emplace_back(n);
    errno = 0;
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return errno_status("listing directory " + path, err);
  std::sort(names->begin(), names->end());
  return Status::ok();
}

// The whole file; kNotFound (errno_status maps ENOENT) when absent.
Status read_small_file(const std::string& path, uint64_t max_bytes, std::string* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("opening " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("checking " + path, errno);
  if (!S_ISREG(st.st_mode)) return corruption(path + " is not a regular file");
  auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    return corruption(path + " is " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
                      " a file of its kind may hold");
  out->assign(size, '\0');
  size_t got = 0;
  CAIRN_RETURN_IF_ERROR(pread_all(fd.get(), out->data(), out->size(), 0, path, &got));
  out->resize(got);
  return Status::ok();
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Writes pieces (in order, back to back) to dir/.tmp-<unique>, fsyncs, and renames it to
// dir/final_name, then fsyncs dir, all through fs. On failure nothing stays: the temporary file is
// removed, and so is the final name if the rename happened but the directory sync failed.
class AtomicFileWriter {
 public:
  // replacing: final_name exists and is being replaced; then a failed directory sync leaves the
  // new file in place (removing it would lose the old one too).
  static Status publish(FileSystem& fs, const std::string& dir, const std::string& final_name,
                        const std::vector<iovec>& pieces, const std::string& tmp_name, bool replacing = false) {
    std::string tmp = join_path(dir, tmp_name);
    std::string final_path = join_path(dir, final_name);
    Status s = write_synced(fs, tmp, pieces);
    if (s.is_ok()) s = fs.rename(tmp, final_path);
    if (!s.is_ok()) {
      (void)fs.unlink(tmp);  // best effort: the next open of the repository removes stray temporaries
      return s;
    }
    s = fs.sync_dir(dir);
    if (!s.is_ok() && !replacing) (void)fs.unlink(final_path);
    return s;
  }

 private:
  // Creates path (it must not exist) and writes and fsyncs pieces. The file is closed on return.
  static Status write_synced(FileSystem& fs, const std::string& path, const std::vector<iovec>& pieces) {
    CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<File> f, fs.open(path, kCreate | kExclusive));
    // One batch: the pieces are large (whole chunks) and go out together where io_uring allows it.
    std::vector<IoRequest> reqs;
    reqs.reserve(pieces.size());
    uint64_t offset = 0;
    for (const iovec& p : pieces) {
      if (p.iov_len == 0) continue;
      reqs.push_back({p.iov_base, p.iov_len, offset});
      offset += p.iov_len;
    }
    CAIRN_RETURN_IF_ERROR(f->write_many(reqs));
    return f->sync(/*data_only=*/false);
  }
};

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
// Manifest validation, shared by the JSON reader, commit and open.

// A pack's file name: a plain name under packs/, so a manifest can never point outside it.
bool valid_pack_name(std::string_view s) {
  if (s.size() <= kPackSuffix.size() || s.size() > kMaxPackNameBytes) return false;
  if (s.front() == '.' || !ends_with(s, kPackSuffix)) return false;
  for (char c : s) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool json_depth_ok(const json& j, int depth) {
  if (depth > kMaxManifestJsonDepth) return false;
  if (j.is_structured())
    for (const auto& v : j)
      if (!json_depth_ok(v, depth + 1)) return false;
  return true;
}

// Checks what a manifest must satisfy whatever the repository: names, dtypes, byte counts, hashes
// set, chunk lengths summing to nbytes. With locations, chunk packs must be valid pack names (as
// on disk); without (a manifest handed to commit), pack and offset are ignored.
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
      if (with_locations) {
        if (!valid_pack_name(c.pack)) return bad(cw + ".pack", quote(c.pack) + " is not a pack file name");
        if (c.offset > UINT64_MAX - c.length) return bad(cw + ".offset", "too large");
      }
    }
    if (sum != t.nbytes)
      return bad(where + ".chunks",
                 "they hold " + std::to_string(sum) + " bytes, the tensor " + std::to_string(t.nbytes));
  }
  return Status::ok();
}

// Checks the chunk split against the repository's chunk size: chunk i holds
// min(chunk_size, nbytes - i * chunk_size) bytes.
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
  return Status::ok();
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
  return Status::ok();
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
    const json& c = chunks[ci];
    std::string cw = where + ".chunks[" + std::to_string(ci) + "]";
    CAIRN_RETURN_IF_ERROR(check_object(c, cw, {"hash", "length", "pack", "offset"}));
    ChunkRef r;
    CAIRN_ASSIGN_OR_RETURN(std::string hex, get_string(c, cw, "hash"));
    std::optional<ChunkHash> h = ChunkHash::from_hex(hex);
    if (!h) return invalid_argument(cw + ".hash: expected 32 lowercase hex digits");
    r.hash = *h;
    CAIRN_ASSIGN_OR_RETURN(r.length, get_uint(c, cw, "length"));
    CAIRN_ASSIGN_OR_RETURN(r.pack, get_string(c, cw, "pack"));
    CAIRN_ASSIGN_OR_RETURN(r.offset, get_uint(c, cw, "offset"));
    t.chunks.push_back(std::move(r));
  }
  return t;
}

}  // namespace

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
      json jc = json::object();
      jc["hash"] = c.hash.hex();
      jc["length"] = c.length;
      jc["pack"] = c.pack;
      jc["offset"] = c.offset;
      chunks.push_back(std::move(jc));
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

// ---------------------------------------------------------------------------------------------
// Repository::Impl

namespace {

// What the catalog knows of one pack file that some model references.
struct PackInfo {
  uint64_t data_begin = 0;         // 8 + N: where the safetensors data section starts
  uint64_t data_bytes = 0;         // the data section: every chunk written to it, live or not
  uint64_t refs = 0;               // chunk references from manifests, plus 1 for the owning model
  std::vector<ChunkHash> indexed;  // chunks whose index entry points into this pack
};

// One distinct live chunk.
struct ChunkInfo {
  ChunkRef ref;       // its first stored location
  uint64_t refs = 0;  // (model, tensor, chunk slot) references
};

struct LoadedModel {
  std::shared_ptr<ModelManifest> m;
  std::string file;
};

}  // namespace

struct Repository::Impl {
  std::string dir_;
  std::string packs_dir_;
  std::string manifests_dir_;
  uint64_t chunk_size_ = 0;
  bool writer_ = false;
  UniqueFd lock_fd_;
  FileSystem* fs_ = nullptr;  // pack and manifest writes, chunk reads (never null after open)
  std::atomic<uint64_t> tmp_counter_{0};

  // Serializes commit and remove; they alone change the catalog.
  std::mutex write_mu_;

  // The catalog. Read under a shared lock, changed under an exclusive one (with write_mu_ held).
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const ModelManifest>> models_;
  std::vector<std::string> order_;  // commit order
  std::unordered_map<std::string, std::vector<std::string>> children_;
  std::unordered_map<ChunkHash, ChunkInfo, ChunkHashHasher> chunks_;
  std::unordered_map<std::string, PackInfo> packs_;
  uint64_t logical_bytes_ = 0;
  uint64_t physical_bytes_ = 0;  // bytes of the distinct chunks some manifest references
  uint64_t retired_ = 0;
  int64_t last_created_ns_ = 0;

  // Open packs for reading, at most kMaxOpenPacks; shared so a reader keeps using one that was
  // evicted.
  mutable std::mutex fd_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<File>> fds_;

  std::string tmp_name() {
    return std::string(kTmpPrefix) + std::to_string(::getpid()) + "-" + std::to_string(tmp_counter_.fetch_add(1));
  }
  std::string manifest_file(const std::string& id) const {
    return hash_bytes(id.data(), id.size()).hex() + std::string(kManifestSuffix);
  }

  // ---- open ----

  Status open(const std::string& dir, uint64_t chunk_size);
  Status take_lock();
  std::string writer_description() const;
  Status init_or_read_format(uint64_t chunk_size);
  // One pass over manifests/ and packs/. *raced: a file vanished under a reader (a writer in
  // another process removed a model); the caller scans again.
  Status scan(bool* raced);

  // ---- catalog changes (mu_ held exclusively) ----

  void add_model(std::shared_ptr<const ModelManifest> m);
  std::vector<std::string> drop_model(const std::string& id);
  // Drops m's chunk and pack references; appends packs nothing references any more to *dead.
  void release_data(const ModelManifest& m, std::vector<std::string>* dead);
  void clear_catalog();

  // ---- operations ----

  Status commit(ModelManifest& m, const Repository::ChunkSource& src);
  Status remove(const std::string& id);
  Status retire(const std::string& id);
  Result<GcReport> gc();
  Result<FsckReport> fsck(bool verify_data) const;
  Status write_manifest(const ModelManifest& m, bool replacing);
  // Deletes dead packs and punches the ranges of live packs that no chunk reference covers.
  void reclaim(const std::vector<std::string>& dead, GcReport* report);
  Status read_chunk(const ChunkRef& ref, void* dst) const;
  Result<std::shared_ptr<File>> pack_file(const std::string& pack) const;
  void forget_pack_file(const std::string& pack) const;
};

Status Repository::Impl::take_lock() {
  std::string path = join_path(dir_, kLockFile);
  lock_fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd_.valid()) {
    if (errno == EACCES || errno == EROFS || errno == EPERM) {
      writer_ = false;  // a read-only view (no permission to write the repository)
      return Status::ok();
    }
    return errno_status("opening the repository lock file " + path, errno);
  }
  while (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      writer_ = false;
      return Status::ok();
    }
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      // The filesystem has no locks (e.g. Lustre mounted without -o flock): the single-writer
      // rule is then the operator's (docs/repository-format.md).
      writer_ = true;
      return Status::ok();
    }
    return errno_status("locking " + path, errno);
  }
  writer_ = true;
  // Who holds it, for the kBusy messages of read-only views.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string who = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(lock_fd_.get(), 0) == 0) {
    ssize_t ignored = ::pwrite(lock_fd_.get(), who.data(), who.size(), 0);
    (void)ignored;
  }
  return Status::ok();
}

std::string Repository::Impl::writer_description() const {
  std::string who;
  if (read_small_file(join_path(dir_, kLockFile), 4096, &who).is_ok()) {
    while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
  }
  return who.empty() ? std::string("another process") : who;
}

Status Repository::Impl::init_or_read_format(uint64_t chunk_size) {
  std::string path = join_path(dir_, kFormatFile);
  std::string text;
  Status s = read_small_file(path, 4096, &text);
  if (s.code() == StatusCode::kNotFound) {
    if (!writer_)
      return unavailable("repository " + dir_ + " has no FORMAT file yet and " + writer_description() +
                         " holds its write lock (it may be creating it); retry shortly");
    if (chunk_size == 0 || chunk_size > kMaxChunkSize)
      return invalid_argument("chunk size " + std::to_string(chunk_size) + " for new repository " + dir_ +
                              " must be 1.." + std::to_string(kMaxChunkSize) + " bytes");
    std::vector<std::string> names;
    CAIRN_RETURN_IF_ERROR(list_dir(dir_, &names));
    for (const std::string& n : names) {
      if (n == kLockFile) continue;
      if (starts_with(n, kTmpPrefix)) {
        ::unlink(join_path(dir_, n).c_str());
        continue;
      }
      return invalid_argument("directory " + dir_ + " is not empty (it holds " + quote(n) +
                              ") and has no FORMAT file, so it is not a cairn repository; give an "
                              "empty or new directory");
    }
    std::string content = std::string(kFormatMagic) + " " + std::to_string(kFormatVersion) + "\nchunk_size " +
                          std::to_string(chunk_size) + "\n";
    std::vector<iovec> iov{{content.data(), content.size()}};
    CAIRN_RETURN_IF_ERROR(AtomicFileWriter::publish(*fs_, dir_, kFormatFile, iov, tmp_name()));
    chunk_size_ = chunk_size;
    return Status::ok();
  }
  CAIRN_RETURN_IF_ERROR(s);
  // "cairn-repository <version>\nchunk_size <n>\n"
  std::string_view rest = text;
  auto take_line = [&rest](std::string_view* line) {
    size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) return false;
    *line = rest.substr(0, nl);
    rest.remove_prefix(nl + 1);
    return true;
  };
  auto parse_u64 = [](std::string_view digits, uint64_t* out) {
    if (digits.empty() || digits.size() > 19) return false;
    uint64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    *out = v;
    return true;
  };
  std::string_view line1, line2;
  std::string bad = "repository format file " + path + " is not a cairn FORMAT file (expected \"" +
                    std::string(kFormatMagic) + " " + std::to_string(kFormatVersion) + "\\nchunk_size N\\n\"); is " +
                    dir_ + " a cairn repository?";
  if (!take_line(&line1) || !starts_with(line1, std::string(kFormatMagic) + " ")) return corruption(bad);
  uint64_t version = 0;
  if (!parse_u64(line1.substr(kFormatMagic.size() + 1), &version)) return corruption(bad);
  if (version != static_cast<uint64_t>(kFormatVersion))
    return invalid_argument("repository " + dir_ + " has format version " + std::to_string(version) +
                            "; this cairn reads version " + std::to_string(kFormatVersion) +
                            " only — use a matching cairn");
  uint64_t cs = 0;
  if (!take_line(&line2) || !starts_with(line2, "chunk_size ") || !parse_u64(line2.substr(11), &cs) || cs == 0 ||
      cs > kMaxChunkSize || !rest.empty())
    return corruption(bad);
  chunk_size_ = cs;
  return Status::ok();
}

Status Repository::Impl::open(const std::string& dir, uint64_t chunk_size) {
  if (dir.empty()) return invalid_argument("repository directory: empty path");
  dir_ = dir;
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  packs_dir_ = join_path(dir_, kPacksDir);
  manifests_dir_ = join_path(dir_, kManifestsDir);
  CAIRN_RETURN_IF_ERROR(make_dirs(dir_));
  CAIRN_RETURN_IF_ERROR(take_lock());
  CAIRN_RETURN_IF_ERROR(init_or_read_format(chunk_size));
  if (writer_) {
    bool created = false;
    for (const std::string& sub : {packs_dir_, manifests_dir_}) {
      if (::mkdir(sub.c_str(), 0755) == 0) {
        created = true;
      } else if (errno != EEXIST) {
        return errno_status("creating directory " + sub, errno);
      }
    }
    if (created) CAIRN_RETURN_IF_ERROR(fsync_dir(dir_));
  }
  for (int attempt = 1;; ++attempt) {
    bool raced = false;
    Status s = scan(&raced);
    if (s.is_ok()) return s;
    clear_catalog();
    if (!raced || attempt >= kReaderScanAttempts) return s;
  }
}

void Repository::Impl::clear_catalog() {
  models_.clear();
  order_.clear();
  children_.clear();
  chunks_.clear();
  packs_.clear();
  logical_bytes_ = 0;
  physical_bytes_ = 0;
  retired_ = 0;
  last_created_ns_ = 0;
}

Status Repository::Impl::scan(bool* raced) {
  *raced = false;
  // 1. Manifests.
  std::vector<std::string> names;
  bool missing = false;
  CAIRN_RETURN_IF_ERROR(list_dir(manifests_dir_, &names, &missing));
  bool removed_manifest_tmp = false;
  std::vector<LoadedModel> loaded;
  std::unordered_map<std::string, size_t> by_id;
  for (const std::string& name : names) {
    std::string path = join_path(manifests_dir_, name);
    if (starts_with(name, kTmpPrefix)) {
      if (writer_ && ::unlink(path.c_str()) == 0) removed_manifest_tmp = true;
      continue;
    }
    if (!ends_with(name, kManifestSuffix)) continue;  // not ours (an editor's backup, say)
    std::string text;
    Status s = read_small_file(path, kMaxManifestBytes, &text);
    if (s.code() == StatusCode::kNotFound && !writer_) {
      *raced = true;
      continue;
    }
    if (!s.is_ok()) return s.code() == StatusCode::kNotFound ? corruption(s.message()) : s;
    const std::string what = "manifest " + path;
    const std::string todo = "; restore it, or move it out of manifests/ to drop that model";
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return corruption(what + " is not valid JSON" + todo);
    Result<ModelManifest> r = manifest_from_json(j);
    if (!r.is_ok()) return corruption(what + ": " + r.status().message() + todo);
    auto m = std::make_shared<ModelManifest>(std::move(r).value());
    if (name != manifest_file(m->id))
      return corruption(what + " holds model " + quote(m->id) + ", whose manifest is named " + manifest_file(m->id) +
                        todo);
    Status cs = validate_chunking(*m, chunk_size_);
    if (!cs.is_ok()) return corruption(what + ": " + cs.message() + todo);
    by_id.emplace(m->id, loaded.size());
    loaded.push_back({std::move(m), path});
  }

  // 2. Lineage: parents exist, no cycles.
  for (const LoadedModel& lm : loaded) {
    const std::string& p = lm.m->parent;
    if (!p.empty() && !by_id.count(p))
      return corruption("manifest " + lm.file + ": model " + quote(lm.m->id) + " has parent " + quote(p) +
                        ", which is not in the repository; restore the parent's manifest");
  }
  {
    std::vector<int> state(loaded.size(), 0);  // 0 new, 1 on the current path, 2 done
    for (size_t i = 0; i < loaded.size(); ++i) {
      std::vector<size_t> path;
      size_t k = i;
      while (state[k] == 0) {
        state[k] = 1;
        path.push_back(k);
        const std::string& p = loaded[k].m->parent;
        if (p.empty()) break;
        k = by_id.at(p);
        if (state[k] == 1)
          return corruption("model " + quote(loaded[k].m->id) +
                            " is its own ancestor (a parent cycle in the manifests)");
      }
      for (size_t q : path) state[q] = 2;
    }
  }

  // 3. Packs: which are referenced, by whom first.
  std::map<std::string, std::string> referenced;  // pack -> first model id
  for (const LoadedModel& lm : loaded) {
    if (!lm.m->pack.empty()) referenced.emplace(lm.m->pack, lm.m->id);
    for (const TensorManifest& t : lm.m->tensors)
      for (const ChunkRef& c : t.chunks) referenced.emplace(c.pack, lm.m->id);
  }
  std::vector<std::string> pack_names;
  bool packs_missing = false;
  CAIRN_RETURN_IF_ERROR(list_dir(packs_dir_, &pack_names, &packs_missing));
  bool removed_pack = false;
  if (writer_) {
    for (const std::string& name : pack_names) {
      bool stray = starts_with(name, kTmpPrefix) || (ends_with(name, kPackSuffix) && !referenced.count(name));
      if (stray && ::unlink(join_path(packs_dir_, name).c_str()) == 0) removed_pack = true;
    }
  }
  std::unordered_map<std::string, PackInfo> packs;
  std::unordered_map<std::string, uint64_t> pack_sizes;
  for (const auto& [pack, first_model] : referenced) {
    std::string path = join_path(packs_dir_, pack);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      int err = errno;
      if (err == ENOENT) {
        if (!writer_) *raced = true;
        return corruption("model " + quote(first_model) + " references pack " + pack + ", which is missing from " +
                          packs_dir_ + "; restore the pack, or remove the model's manifest");
      }
      return errno_status("opening pack " + path, err);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return errno_status("checking pack " + path, errno);
    auto size = static_cast<uint64_t>(st.st_size);
    uint8_t prefix[8] = {};
    size_t got = 0;
    CAIRN_RETURN_IF_ERROR(pread_all(fd.get(), prefix, sizeof prefix, 0, path, &got));
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = n << 8 | prefix[b];
    if (got < 8 || n > safetensors::kMaxHeaderBytes || 8 + n > size)
      return corruption("pack " + path + " (of model " + quote(first_model) +
                        ") does not start with a safetensors header; restore it");
    PackInfo info;
    info.data_begin = 8 + n;
    info.data_bytes = size - info.data_begin;
    packs.emplace(pack, std::move(info));
    pack_sizes.emplace(pack, size);
  }
  // Every chunk lies inside its pack's data section.
  for (const LoadedModel& lm : loaded) {
    for (const TensorManifest& t : lm.m->tensors) {
      for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
        const ChunkRef& c = t.chunks[ci];
        const PackInfo& info = packs.at(c.pack);
        if (c.offset < info.data_begin || c.offset + c.length > pack_sizes.at(c.pack))
          return corruption("model " + quote(lm.m->id) + " tensor " + quote(t.name) + " chunk " + std::to_string(ci) +
                            " lies at [" + std::to_string(c.offset) + ", " + std::to_string(c.offset + c.length) +
                            ") outside the data of pack " + c.pack + " (" + std::to_string(pack_sizes.at(c.pack)) +
                            " bytes); the pack is truncated or the manifest is wrong");
      }
    }
  }
  if (removed_manifest_tmp) CAIRN_RETURN_IF_ERROR(fsync_dir(manifests_dir_));
  if (removed_pack) CAIRN_RETURN_IF_ERROR(fsync_dir(packs_dir_));

  // 4. The catalog, in commit order.
  std::sort(loaded.begin(), loaded.end(), [](const LoadedModel& a, const LoadedModel& b) {
    return a.m->created_ns != b.m->created_ns ? a.m->created_ns < b.m->created_ns : a.m->id < b.m->id;
  });
  std::unique_lock lock(mu_);
  packs_ = std::move(packs);
  for (LoadedModel& lm : loaded) {
    last_created_ns_ = std::max(last_created_ns_, lm.m->created_ns);
    add_model(std::move(lm.m));
  }
  return Status::ok();
}

void Repository::Impl::add_model(std::shared_ptr<const ModelManifest> m) {
  const std::string& id = m->id;
  order_.push_back(id);
  if (!m->parent.empty()) children_[m->parent].push_back(id);
  logical_bytes_ += m->logical_bytes();
  if (!m->pack.empty()) packs_.at(m->pack).refs++;
  for (const TensorManifest& t : m->tensors) {
    for (const ChunkRef& c : t.chunks) {
      PackInfo& pack = packs_.at(c.pack);
      pack.refs++;
      auto [it, inserted] = chunks_.try_emplace(c.hash);
      if (inserted) {
        it->second.ref = c;
        pack.indexed.push_back(c.hash);
        physical_bytes_ += c.length;
      }
      it->second.refs++;
    }
  }
  if (m->retired_ns != 0) ++retired_;
  models_.emplace(id, std::move(m));
}

// Returns the packs that no model references any more (already dropped from the catalog).
std::vector<std::string> Repository::Impl::drop_model(const std::string& id) {
  std::vector<std::string> dead;
  auto mit = models_.find(id);
  if (mit == models_.end()) return dead;
  std::shared_ptr<const ModelManifest> m = mit->second;
  models_.erase(mit);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  children_.erase(id);
  if (!m->parent.empty()) {
    auto cit = children_.find(m->parent);
    if (cit != children_.end()) {
      auto& v = cit->second;
      v.erase(std::remove(v.begin(), v.end(), id), v.end());
      if (v.empty()) children_.erase(cit);
    }
  }
  if (m->retired_ns != 0) --retired_;
  release_data(*m, &dead);
  return dead;
}

void Repository::Impl::release_data(const ModelManifest& m, std::vector<std::string>* dead) {
  logical_bytes_ -= m.logical_bytes();
  auto erase_chunk = [&](std::unordered_map<ChunkHash, ChunkInfo, ChunkHashHasher>::iterator cit) {
    physical_bytes_ -= cit->second.ref.length;
    chunks_.erase(cit);
  };
  auto release_pack = [&](const std::string& name) {
    auto pit = packs_.find(name);
    if (pit == packs_.end()) return;
    if (--pit->second.refs > 0) return;
    for (const ChunkHash& h : pit->second.indexed) {
      auto cit = chunks_.find(h);
      if (cit != chunks_.end() && cit->second.ref.pack == name) erase_chunk(cit);
    }
    packs_.erase(pit);
    dead->push_back(name);
  };
  for (const TensorManifest& t : m.tensors) {
    for (const ChunkRef& c : t.chunks) {
      auto cit = chunks_.find(c.hash);
      if (cit != chunks_.end() && --cit->second.refs == 0) erase_chunk(cit);
      release_pack(c.pack);
    }
  }
  if (!m.pack.empty()) release_pack(m.pack);
}

// ---- commit ----

Status Repository::Impl::commit(ModelManifest& in, const Repository::ChunkSource& src) {
  if (!writer_)
    return busy("repository " + dir_ + " is open read-only here: " + writer_description() +
                " holds its write lock; commit through that process (the daemon)");
  std::lock_guard write_lock(write_mu_);
  const std::string model = "model " + quote(in.id);
  {
    Status s = validate_manifest(in, /*with_locations=*/false);
    if (s.is_ok()) s = validate_chunking(in, chunk_size_);
    if (!s.is_ok()) return s.with_context("committing " + model);
  }
  ModelManifest m = in;

  // Plan the pack: which chunks are new, and under which entries they go.
  struct NewChunk {
    ChunkHash hash;
    uint64_t length = 0;
    const void* data = nullptr;
    uint64_t offset = 0;  // absolute, in the pack
  };
  struct Entry {
    size_t first = 0;  // range of new_chunks
    size_t count = 0;
  };
  std::vector<NewChunk> new_chunks;
  std::unordered_map<ChunkHash, size_t, ChunkHashHasher> placed;  // hash -> index in new_chunks
  std::vector<safetensors::TensorEntry> entries;
  std::vector<Entry> entry_chunks;
  {
    std::shared_lock lock(mu_);
    if (models_.count(m.id))
      return already_exists(model + " is already in repository " + dir_ +
                            "; models are immutable, commit under a new id");
    if (!m.parent.empty() && !models_.count(m.parent))
      return not_found("parent " + quote(m.parent) + " of " + model + " is not in repository " + dir_ +
                       "; commit the parent first");
    for (TensorManifest& t : m.tensors) {
      for (ChunkRef& c : t.chunks) {
        auto it = chunks_.find(c.hash);
        if (it != chunks_.end() && it->second.ref.length != c.length)
          return invalid_argument("committing " + model + ": tensor " + quote(t.name) + " has chunk " + c.hash.hex() +
                                  " of " + std::to_string(c.length) + " bytes, but the repository holds it with " +
                                  std::to_string(it->second.ref.length));
      }
      bool whole = t.nbytes > 0 && t.name != "__metadata__" && !starts_with(t.name, kChunkEntryPrefix);
      if (whole) {
        std::unordered_set<ChunkHash, ChunkHashHasher> own;
        for (const ChunkRef& c : t.chunks)
          if (chunks_.count(c.hash) || placed.count(c.hash) || !own.insert(c.hash).second) {
            whole = false;
            break;
          }
      }
      if (whole) {
        safetensors::TensorEntry e;
        e.name = t.name;
        e.dtype = t.dtype;
        e.shape = t.shape;
        entries.push_back(std::move(e));
        entry_chunks.push_back({new_chunks.size(), t.chunks.size()});
        for (const ChunkRef& c : t.chunks) {
          placed.emplace(c.hash, new_chunks.size());
          new_chunks.push_back({c.hash, c.length, nullptr, 0});
        }
        continue;
      }
      for (const ChunkRef& c : t.chunks) {
        if (chunks_.count(c.hash) || placed.count(c.hash)) continue;
        safetensors::TensorEntry e;
        e.name = std::string(kChunkEntryPrefix) + c.hash.hex();
        e.dtype = DType::kU8;
        e.shape = {static_cast<int64_t>(c.length)};
        entries.push_back(std::move(e));
        entry_chunks.push_back({new_chunks.size(), 1});
        placed.emplace(c.hash, new_chunks.size());
        new_chunks.push_back({c.hash, c.length, nullptr, 0});
      }
    }
    // Chunks the repository holds already (inherited ones among them) take its location; the
    // others get one in the new pack below, whatever the caller put there.
    for (TensorManifest& t : m.tensors)
      for (ChunkRef& c : t.chunks) {
        auto it = chunks_.find(c.hash);
        if (it != chunks_.end()) {
          c = it->second.ref;
        } else {
          c.pack.clear();
          c.offset = 0;
        }
      }
  }

  // The bytes of the new chunks, checked against their hashes.
  if (!new_chunks.empty() && !src)
    return invalid_argument("committing " + model + ": " + std::to_string(new_chunks.size()) +
                            " chunks are new to the repository but no chunk source was given");
  uint64_t data_bytes = 0;
  for (NewChunk& nc : new_chunks) {
    Result<const void*> r = src(nc.hash, nc.length);
    if (!r.is_ok()) return r.status().with_context("committing " + model + ": fetching chunk " + nc.hash.hex());
    if (*r == nullptr)
      return invalid_argument("committing " + model + ": the chunk source gave no bytes for chunk " + nc.hash.hex());
    nc.data = *r;
    if (hash_bytes(nc.data, nc.length) != nc.hash)
      return invalid_argument("committing " + model + ": the bytes given for chunk " + nc.hash.hex() + " (" +
                              std::to_string(nc.length) +
                              " bytes) do not hash to it; the manifest and the data disagree");
    data_bytes += nc.length;
  }

  auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // A creation time given by the caller (the daemon stamps models when they become visible) is
  // kept when it follows the last one; commit order and created_ns order always agree.
  m.created_ns = in.created_ns > last_created_ns_ ? in.created_ns : std::max<int64_t>(now, last_created_ns_ + 1);

  // Lay out the pack and name it.
  std::string prefix;
  std::string pack_name;
  if (!new_chunks.empty()) {
    std::map<std::string, std::string> meta{{"cairn.format", "1"},
                                            {"cairn.model", m.id},
                                            {"cairn.parent", m.parent},
                                            {"cairn.chunk_size", std::to_string(chunk_size_)}};
    Result<std::string> header = safetensors::build_header(entries, &meta);
    if (!header.is_ok()) return header.status().with_context("committing " + model + ": building the pack header");
    prefix = std::move(header).value();
    for (size_t k = 0; k < entries.size(); ++k) {
      uint64_t off = prefix.size() + entries[k].begin;
      const Entry& ec = entry_chunks[k];
      for (size_t q = ec.first; q < ec.first + ec.count; ++q) {
        new_chunks[q].offset = off;
        off += new_chunks[q].length;
      }
      if (off != prefix.size() + entries[k].end)
        return internal_error("committing " + model + ": pack entry " + quote(entries[k].name) +
                              " laid out with a size other than its chunks'");
    }
    std::string base =
        hash_bytes(m.id.data(), m.id.size()).hex().substr(0, 16) + "-" + hex16(static_cast<uint64_t>(m.created_ns));
    pack_name = base + std::string(kPackSuffix);
    for (int k = 1; path_exists(join_path(packs_dir_, pack_name)); ++k)
      pack_name = base + "-" + std::to_string(k) + std::string(kPackSuffix);
    for (TensorManifest& t : m.tensors)
      for (ChunkRef& c : t.chunks) {
        auto it = placed.find(c.hash);
        if (it == placed.end()) continue;
        c.pack = pack_name;
        c.offset = new_chunks[it->second].offset;
      }
  }
  m.pack = pack_name;
  for (TensorManifest& t : m.tensors)
    for (ChunkRef& c : t.chunks)
      if (c.pack.empty()) return internal_error("committing " + model + ": a chunk has no location");

  // Serialize the manifest before writing anything, so bad metadata leaves no pack behind.
  std::string text;
  try {
    text = manifest_to_json(m).dump();
  } catch (const json::exception& e) {
    return invalid_argument("committing " + model + ": metadata or architecture cannot be written as JSON (" +
                            e.what() + "); strings must be valid UTF-8");
  }
  text += '\n';
  const std::string mfile = manifest_file(m.id);
  if (path_exists(join_path(manifests_dir_, mfile)))
    return already_exists("committing " + model + ": manifest file " + join_path(manifests_dir_, mfile) +
                          " exists but is not in the catalog (another writer process?)");

  // Publish: pack, then manifest. The model exists once its manifest is renamed into place.
  std::string pack_path;
  if (!new_chunks.empty()) {
    pack_path = join_path(packs_dir_, pack_name);
    std::vector<iovec> iov;
    iov.reserve(new_chunks.size() + 1);
    iov.push_back({prefix.data(), prefix.size()});
    for (const NewChunk& nc : new_chunks) iov.push_back({const_cast<void*>(nc.data), static_cast<size_t>(nc.length)});
    Status s = AtomicFileWriter::publish(*fs_, packs_dir_, pack_name, iov, tmp_name());
    if (!s.is_ok()) return s.with_context("committing " + model + ": writing its pack");
  }
  {
    std::vector<iovec> iov{{text.data(), text.size()}};
    Status s = AtomicFileWriter::publish(*fs_, manifests_dir_, mfile, iov, tmp_name());
    if (!s.is_ok()) {
      if (!pack_path.empty()) {
        (void)fs_->unlink(pack_path);  // else the next open removes it: no manifest references it
        (void)fs_->sync_dir(packs_dir_);
      }
      return s.with_context("committing " + model + ": writing its manifest");
    }
  }

  // Visible to readers of this process.
  auto shared = std::make_shared<const ModelManifest>(m);
  {
    std::unique_lock lock(mu_);
    if (!pack_name.empty()) {
      PackInfo info;
      info.data_begin = prefix.size();
      info.data_bytes = data_bytes;
      packs_.emplace(pack_name, std::move(info));
    }
    last_created_ns_ = m.created_ns;
    add_model(std::move(shared));
  }
  in = std::move(m);
  return Status::ok();
}

// ---- remove ----

Status Repository::Impl::remove(const std::string& id) {
  if (!writer_)
    return busy("repository " + dir_ + " is open read-only here: " + writer_description() +
                " holds its write lock; remove through that process (the daemon)");
  std::lock_guard write_lock(write_mu_);
  const std::string model = "model " + quote(id);
  {
    std::shared_lock lock(mu_);
    if (!models_.count(id)) return not_found(model + " is not in repository " + dir_);
    auto cit = children_.find(id);
    if (cit != children_.end() && !cit->second.empty()) {
      std::string list;
      for (size_t k = 0; k < cit->second.size() && k < 3; ++k) list += (k ? ", " : "") + quote(cit->second[k]);
      if (cit->second.size() > 3) list += ", ...";
      return busy(model + " has " + std::to_string(cit->second.size()) + " child model(s) (" + list +
                  ") whose lineage needs it; remove them first");
    }
  }
  std::string mpath = join_path(manifests_dir_, manifest_file(id));
  if (::unlink(mpath.c_str()) != 0 && errno != ENOENT)
    return errno_status("removing " + model + ": deleting its manifest " + mpath, errno);
  Status synced = fsync_dir(manifests_dir_);

  std::vector<std::string> dead;
  {
    std::unique_lock lock(mu_);
    dead = drop_model(id);
  }
  Status result = synced.is_ok() ? Status::ok()
                                 : synced.with_context(model +
                                                       " was removed, but its manifest deletion may not "
                                                       "be durable yet");
  bool deleted = false;
  for (const std::string& pack : dead) {
    forget_pack_file(pack);
    std::string ppath = join_path(packs_dir_, pack);
    if (::unlink(ppath.c_str()) == 0 || errno == ENOENT) {
      deleted = true;
    } else if (result.is_ok()) {
      result = errno_status(model + " was removed, but its unreferenced pack " + ppath +
                                " could not be deleted (the next open of the repository deletes it)",
                            errno);
    }
  }
  if (deleted) {
    Status s = fsync_dir(packs_dir_);
    if (result.is_ok() && !s.is_ok()) result = s;
  }
  return result;
}

// ---- retire, gc, fsck ----

Status Repository::Impl::write_manifest(const ModelManifest& m, bool replacing) {
  std::string text;
  try {
    text = manifest_to_json(m).dump();
  } catch (const json::exception& e) {
    return invalid_argument("model " + quote(m.id) + ": its manifest cannot be written as JSON (" + e.what() + ")");
  }
  text += '\n';
  std::vector<iovec> iov{{text.data(), text.size()}};
  return AtomicFileWriter::publish(*fs_, manifests_dir_, manifest_file(m.id), iov, tmp_name(), replacing);
}

Status Repository::Impl::retire(const std::string& id) {
  if (!writer_)
    return busy("repository " + dir_ + " is open read-only here: " + writer_description() +
                " holds its write lock; retire through that process (the daemon)");
  std::lock_guard write_lock(write_mu_);
  std::shared_ptr<const ModelManifest> old;
  {
    std::shared_lock lock(mu_);
    auto it = models_.find(id);
    if (it == models_.end()) return not_found("model " + quote(id) + " is not in repository " + dir_);
    old = it->second;
  }
  if (old->retired_ns != 0) return Status::ok();
  auto m = std::make_shared<ModelManifest>(*old);
  auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  m->retired_ns = std::max<int64_t>(now, 1);
  Status s = write_manifest(*m, /*replacing=*/true);
  if (!s.is_ok()) return s.with_context("retiring model " + quote(id));
  std::unique_lock lock(mu_);
  models_[id] = std::move(m);
  ++retired_;
  return Status::ok();
}

namespace {

// Allocated bytes of fd within [begin, end), by SEEK_DATA/SEEK_HOLE. Whole file systems blocks:
// callers pass block-aligned ranges.
uint64_t allocated_bytes(int fd, uint64_t begin, uint64_t end) {
  uint64_t total = 0;
  auto pos = static_cast<off_t>(begin);
  while (static_cast<uint64_t>(pos) < end) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0 || static_cast<uint64_t>(data) >= end) break;
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    uint64_t stop = hole < 0 ? end : std::min<uint64_t>(static_cast<uint64_t>(hole), end);
    total += stop - static_cast<uint64_t>(data);
    pos = static_cast<off_t>(stop);
  }
  return total;
}

struct Range {
  uint64_t begin, end;
};

// The block-aligned parts of [data_begin, data_end) that no live range touches.
std::vector<Range> dead_ranges(std::vector<Range> live, uint64_t data_begin, uint64_t data_end, uint64_t block) {
  std::sort(live.begin(), live.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  uint64_t pos = data_begin;
  auto gap = [&](uint64_t b, uint64_t e) {
    uint64_t ab = (b + block - 1) / block * block, ae = e / block * block;
    if (ab < ae) out.push_back({ab, ae});
  };
  for (const Range& r : live) {
    if (r.begin > pos) gap(pos, r.begin);
    pos = std::max(pos, r.end);
  }
  if (data_end > pos) gap(pos, data_end);
  return out;
}

}  // namespace

void Repository::Impl::reclaim(const std::vector<std::string>& dead, GcReport* report) {
  bool unlinked = false;
  for (const std::string& pack : dead) {
    forget_pack_file(pack);
    if (::unlink(join_path(packs_dir_, pack).c_str()) == 0) {
      unlinked = true;
      ++report->packs_deleted;
    }
  }
  // Pack files nothing references (a crash between a pack's write and its manifest's, say).
  std::vector<std::string> names;
  if (list_dir(packs_dir_, &names).is_ok()) {
    std::shared_lock lock(mu_);
    for (const std::string& name : names) {
      if (!ends_with(name, kPackSuffix) || packs_.count(name)) continue;
      if (::unlink(join_path(packs_dir_, name).c_str()) == 0) {
        unlinked = true;
        ++report->packs_deleted;
      }
    }
  }
  if (unlinked) (void)fsync_dir(packs_dir_);

  // Dead ranges inside live packs.
  struct Plan {
    std::string pack;
    uint64_t data_begin;
    std::vector<Range> live;
  };
  std::vector<Plan> plan;
  {
    std::shared_lock lock(mu_);
    for (const auto& [name, info] : packs_) {
      Plan p{name, info.data_begin, {}};
      for (const ChunkHash& h : info.indexed) {
        auto cit = chunks_.find(h);
        if (cit != chunks_.end() && cit->second.ref.pack == name)
          p.live.push_back({cit->second.ref.offset, cit->second.ref.offset + cit->second.ref.length});
      }
      plan.push_back(std::move(p));
    }
  }
  for (Plan& p : plan) {
    std::string path = join_path(packs_dir_, p.pack);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) continue;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) continue;
    uint64_t block = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize) : 4096;
    for (const Range& r : dead_ranges(std::move(p.live), p.data_begin, static_cast<uint64_t>(st.st_size), block)) {
      uint64_t before = allocated_bytes(fd.get(), r.begin, r.end);
      if (before == 0) continue;
      if (::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.begin),
                      static_cast<off_t>(r.end - r.begin)) != 0) {
        report->bytes_unreclaimable += before;
        continue;
      }
      report->bytes_punched += before - allocated_bytes(fd.get(), r.begin, r.end);
    }
  }
}

Result<GcReport> Repository::Impl::gc() {
  if (!writer_)
    return busy("repository " + dir_ + " is open read-only here: " + writer_description() +
                " holds its write lock; collect through that process (the daemon)");
  std::lock_guard write_lock(write_mu_);
  GcReport report;
  // Retired models with no descendant left go (children before parents); retired models that
  // live descendants still name as an ancestor stay, collected.
  std::vector<std::shared_ptr<const ModelManifest>> to_collect;
  uint64_t physical_before;
  {
    std::shared_lock lock(mu_);
    physical_before = physical_bytes_;
    std::unordered_set<std::string> removing;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      const auto& m = models_.at(*it);
      if (m->retired_ns == 0) continue;
      bool leaf = true;
      if (auto cit = children_.find(*it); cit != children_.end())
        for (const std::string& c : cit->second) leaf = leaf && removing.count(c) > 0;
      if (leaf) {
        removing.insert(*it);
        report.removed.push_back(*it);
      } else if (!m->collected) {
        to_collect.push_back(m);
      }
    }
  }
  // 1. Collected manifests (each replaced atomically).
  std::vector<std::shared_ptr<const ModelManifest>> collected;
  for (const auto& old : to_collect) {
    auto m = std::make_shared<ModelManifest>(*old);
    m->tensors.clear();
    m->pack.clear();
    m->source_header.clear();
    m->collected = true;
    Status s = write_manifest(*m, /*replacing=*/true);
    if (!s.is_ok()) return s.with_context("gc: collecting retired model " + quote(m->id));
    collected.push_back(std::move(m));
    report.collected.push_back(old->id);
  }
  // 2. Deleted manifests, children first, so no manifest ever names a missing parent.
  for (const std::string& id : report.removed) {
    std::string path = join_path(manifests_dir_, manifest_file(id));
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return errno_status("gc: deleting the manifest of retired model " + quote(id) + " (" + path + ")", errno);
  }
  if (!report.removed.empty()) CAIRN_RETURN_IF_ERROR(fsync_dir(manifests_dir_).with_context("gc"));
  // 3. The catalog.
  std::vector<std::string> dead;
  {
    std::unique_lock lock(mu_);
    for (auto& m : collected) {
      std::shared_ptr<const ModelManifest>& slot = models_.at(m->id);
      release_data(*slot, &dead);
      slot = std::move(m);
    }
    for (const std::string& id : report.removed) {
      auto d = drop_model(id);
      dead.insert(dead.end(), d.begin(), d.end());
    }
    report.bytes_released = physical_before - physical_bytes_;
  }
  // 4. The bytes: only what no manifest on disk references.
  reclaim(dead, &report);
  return report;
}

Result<FsckReport> Repository::Impl::fsck(bool verify_data) const {
  FsckReport report;
  std::vector<std::shared_ptr<const ModelManifest>> models;
  std::unordered_map<std::string, uint64_t> data_begin;  // referenced pack -> start of its data
  {
    std::shared_lock lock(mu_);
    for (const std::string& id : order_) models.push_back(models_.at(id));
    for (const auto& [name, info] : packs_) data_begin.emplace(name, info.data_begin);
  }
  report.models = models.size();
  std::unordered_map<std::string, std::vector<Range>> live;
  std::vector<uint8_t> buf;
  for (const auto& m : models) {
    for (const TensorManifest& t : m->tensors) {
      for (const ChunkRef& c : t.chunks) {
        ++report.chunks;
        live[c.pack].push_back({c.offset, c.offset + c.length});
        auto problem = [&](const std::string& detail) {
          report.dangling.push_back({m->id, t.name, c.pack, c.offset, c.length, detail});
        };
        std::string path = join_path(packs_dir_, c.pack);
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) {
          problem("pack file " + path + " is missing");
          continue;
        }
        if (c.offset + c.length > static_cast<uint64_t>(st.st_size)) {
          problem("the chunk lies past the end of " + path + " (" + std::to_string(st.st_size) + " bytes)");
          continue;
        }
        if (!verify_data) continue;
        buf.resize(c.length);
        Status s = read_chunk(c, buf.data());
        if (!s.is_ok()) {
          problem(s.message());
          continue;
        }
        report.bytes_verified += c.length;
      }
    }
  }
  // Orphans: pack files no manifest references, and allocated ranges inside referenced packs that
  // no chunk covers (gc reclaims both).
  std::vector<std::string> names;
  CAIRN_RETURN_IF_ERROR(list_dir(packs_dir_, &names));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (!ends_with(name, kPackSuffix)) continue;
    std::string path = join_path(packs_dir_, name);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) continue;
    auto size = static_cast<uint64_t>(st.st_size);
    auto pit = data_begin.find(name);
    auto lit = live.find(name);
    if (pit == data_begin.end() || lit == live.end()) {
      uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
      report.orphaned.push_back({"", "", name, 0, size, "no manifest references this pack file"});
      report.orphaned_bytes += bytes;
      continue;
    }
    uint64_t block = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize) : 4096;
    for (const Range& r : dead_ranges(lit->second, pit->second, size, block)) {
      uint64_t bytes = allocated_bytes(fd.get(), r.begin, r.end);
      if (bytes == 0) continue;
      report.orphaned.push_back({"", "", name, r.begin, r.end - r.begin,
                                 std::to_string(bytes) + " allocated bytes no chunk reference covers"});
      report.orphaned_bytes += bytes;
    }
  }
  return report;
}

// ---- reads ----

Result<std::shared_ptr<File>> Repository::Impl::pack_file(const std::string& pack) const {
  std::lock_guard lock(fd_mu_);
  auto it = fds_.find(pack);
  if (it != fds_.end()) return it->second;
  std::string path = join_path(packs_dir_, pack);
  Result<std::unique_ptr<File>> f = fs_->open(path, kRead);
  if (!f.is_ok()) {
    if (f.status().code() == StatusCode::kNotFound)
      return not_found("pack " + path +
                       " does not exist (its model was removed, or the "
                       "repository lost it)");
    return f.status().with_context("opening pack " + path);
  }
  std::shared_ptr<File> holder = std::move(f).value();
  if (fds_.size() >= kMaxOpenPacks) fds_.erase(fds_.begin());
  fds_.emplace(pack, holder);
  return holder;
}

void Repository::Impl::forget_pack_file(const std::string& pack) const {
  std::lock_guard lock(fd_mu_);
  fds_.erase(pack);
}

Status Repository::Impl::read_chunk(const ChunkRef& ref, void* dst) const {
  if (!valid_pack_name(ref.pack))
    return invalid_argument("reading chunk " + ref.hash.hex() + ": " + quote(ref.pack) + " is not a pack file name");
  if (ref.length == 0 || ref.length > kMaxChunkSize || ref.offset > UINT64_MAX - ref.length)
    return invalid_argument("reading chunk " + ref.hash.hex() + " from pack " + ref.pack + ": bad length " +
                            std::to_string(ref.length) + " or offset " + std::to_string(ref.offset));
  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<File> file, pack_file(ref.pack));
  std::string path = join_path(packs_dir_, ref.pack);
  size_t got = 0;
  CAIRN_RETURN_IF_ERROR(file->pread(dst, static_cast<size_t>(ref.length), ref.offset, &got));
  std::string where = "chunk " + ref.hash.hex() + " at offset " + std::to_string(ref.offset) + " (" +
                      std::to_string(ref.length) + " bytes) of pack " + path;
  if (got != ref.length)
    return corruption(where + ": the pack ends after " + std::to_string(got) +
                      " of its bytes (truncated); restore the pack from a copy");
  if (hash_bytes(dst, static_cast<size_t>(ref.length)) != ref.hash)
    return corruption(where +
                      ": the bytes do not match the chunk's hash; restore the pack from a "
                      "copy");
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Repository

Repository::Repository(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Repository::~Repository() = default;

Result<std::unique_ptr<Repository>> Repository::open(const std::string& dir, uint64_t chunk_size, FileSystem* fs) {
  auto impl = std::make_unique<Impl>();
  impl->fs_ = fs != nullptr ? fs : &posix_fs();
  CAIRN_RETURN_IF_ERROR(impl->open(dir, chunk_size));
  return std::unique_ptr<Repository>(new Repository(std::move(impl)));
}

uint64_t Repository::chunk_size() const { return impl_->chunk_size_; }
const std::string& Repository::dir() const { return impl_->dir_; }
bool Repository::writable() const { return impl_->writer_; }

Status Repository::commit(ModelManifest& m, const ChunkSource& src) { return impl_->commit(m, src); }

bool Repository::contains(const std::string& id) const {
  std::shared_lock lock(impl_->mu_);
  return impl_->models_.count(id) > 0;
}

Result<ModelManifest> Repository::get(const std::string& id) const {
  std::shared_ptr<const ModelManifest> m;
  {
    std::shared_lock lock(impl_->mu_);
    auto it = impl_->models_.find(id);
    if (it == impl_->models_.end()) return not_found("model " + quote(id) + " is not in repository " + impl_->dir_);
    m = it->second;
  }
  return *m;
}

std::vector<std::string> Repository::list() const {
  std::shared_lock lock(impl_->mu_);
  return impl_->order_;
}

std::vector<std::string> Repository::children(const std::string& id) const {
  std::shared_lock lock(impl_->mu_);
  auto it = impl_->children_.find(id);
  if (it == impl_->children_.end()) return {};
  return it->second;
}

std::optional<ChunkRef> Repository::locate(const ChunkHash& hash) const {
  std::shared_lock lock(impl_->mu_);
  auto it = impl_->chunks_.find(hash);
  if (it == impl_->chunks_.end()) return std::nullopt;
  return it->second.ref;
}

Status Repository::read_chunk(const ChunkRef& ref, void* dst) const { return impl_->read_chunk(ref, dst); }

Status Repository::remove(const std::string& id) { return impl_->remove(id); }
Status Repository::retire(const std::string& id) { return impl_->retire(id); }
Result<GcReport> Repository::gc() { return impl_->gc(); }
Result<FsckReport> Repository::fsck(bool verify_data) const { return impl_->fsck(verify_data); }

Result<std::shared_ptr<const ModelManifest>> Repository::get_shared(const std::string& id) const {
  std::shared_lock lock(impl_->mu_);
  auto it = impl_->models_.find(id);
  if (it == impl_->models_.end()) return not_found("model " + quote(id) + " is not in repository " + impl_->dir_);
  return it->second;
}

RepositoryStats Repository::stats() const {
  std::shared_lock lock(impl_->mu_);
  RepositoryStats s;
  s.models = impl_->models_.size();
  s.packs = impl_->packs_.size();
  s.logical_bytes = impl_->logical_bytes_;
  s.physical_bytes = impl_->physical_bytes_;
  s.chunks = impl_->chunks_.size();
  s.retired = impl_->retired_;
  return s;
}

}  // namespace cairn
