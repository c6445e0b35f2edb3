// Keras HDF5 import/export and the bridge to Python for PyTorch files (docs/import-export.md).
#include "tools/model_files.hpp"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "core/dtype.hpp"
#include "core/wire.hpp"

#ifdef CAIRN_HAVE_HDF5
#include <hdf5.h>
#endif

extern char** environ;

namespace cairn::tool {

using nlohmann::json;

// ---- Python ----

namespace {

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string p(buf, static_cast<size_t>(n));
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

Result<int> run_python_io(const std::vector<std::string>& args) {
  const char* env_python = std::getenv("CAIRN_PYTHON");
  std::string python = env_python && *env_python ? env_python : "python3";
  // The library next to this tool (build tree: bin/cairn, lib/libcairn.so) unless one is chosen.
  const char* lib = std::getenv("CAIRN_LIBRARY");
  if (!lib || !*lib) {
    std::string dir = self_dir();
    for (const char* rel : {"/../lib/libcairn.so", "/../lib/libcairn.so.0"}) {
      if (!dir.empty() && is_file(dir + rel)) {
        ::setenv("CAIRN_LIBRARY", (dir + rel).c_str(), 1);
        break;
      }
    }
  }
#ifdef CAIRN_PYTHON_PACKAGE_DIR
  // The package of this source tree, after whatever PYTHONPATH already provides.
  if (is_file(std::string(CAIRN_PYTHON_PACKAGE_DIR) + "/cairn/io.py")) {
    const char* pp = std::getenv("PYTHONPATH");
    std::string v = pp && *pp ? std::string(pp) + ":" + CAIRN_PYTHON_PACKAGE_DIR : CAIRN_PYTHON_PACKAGE_DIR;
    ::setenv("PYTHONPATH", v.c_str(), 1);
  }
#endif
  // `-c` rather than `-m cairn.io`: the package imports cairn.io, and runpy warns about that.
  std::vector<std::string> argv_s{python, "-c", "import sys; from cairn.io import _main; sys.exit(_main(sys.argv[1:]))"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid;
  int rc = ::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0)
    return invalid_argument("cannot run Python ('" + python + "': " + std::strerror(rc) +
                       "); .pt/.bin files need Python 3 with PyTorch (set CAIRN_PYTHON to its interpreter)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return errno_status("waiting for " + python, errno);
  }
  if (WIFSIGNALED(status))
    return internal_error("'" + python + "' was killed by signal " + std::to_string(WTERMSIG(status)));
  return WEXITSTATUS(status);
}

#ifndef CAIRN_HAVE_HDF5

bool have_hdf5() { return false; }

Status require_hdf5(const std::string& file) {
  return invalid_argument("'" + file + "': Keras HDF5 files need a cairn built with HDF5 support (CAIRN_WITH_HDF5; "
                          "Debian: libhdf5-dev); convert it to safetensors first");
}

Status import_keras_h5(Client&, const std::string&, const std::string& file, const std::string&, const json&,
                       Durability) {
  return require_hdf5(file);
}

Status export_keras_h5(Client&, const std::string&, const std::string& file) { return require_hdf5(file); }

#else  // CAIRN_HAVE_HDF5

bool have_hdf5() { return true; }
Status require_hdf5(const std::string&) { return Status::ok(); }

namespace {

// ---- small helpers over the HDF5 C API ----

class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_, close_ = o.close_, o.id_ = -1;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// The most specific message on HDF5's error stack ("truncated file: eof = ...").
std::string h5_detail() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(data) = e->desc;
        return 0;
      },
      &out);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : out)
    if (c == '\n') c = ' ';
  return out;
}

Status h5_error(const std::string& what) {
  std::string d = h5_detail();
  return invalid_argument(what + (d.empty() ? "" : " (" + d + ")"));
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) s[2 * i] = digits[p[i] >> 4], s[2 * i + 1] = digits[p[i] & 15];
  return s;
}

std::optional<std::vector<uint8_t>> unhex(const std::string& s) {
  if (s.size() % 2) return std::nullopt;
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return out;
}

Result<std::string> encode_type(hid_t type, const std::string& what) {
  size_t n = 0;
  if (H5Tencode(type, nullptr, &n) < 0 || n == 0) return h5_error(what + ": its HDF5 datatype cannot be serialized");
  std::vector<uint8_t> buf(n);
  if (H5Tencode(type, buf.data(), &n) < 0) return h5_error(what + ": its HDF5 datatype cannot be serialized");
  return hex(buf.data(), n);
}

Result<Hid> decode_type(const json& j, const std::string& what) {
  auto bytes = j.is_string() ? unhex(j.get<std::string>()) : std::nullopt;
  if (!bytes) return invalid_argument(what + ": the recorded HDF5 datatype is not valid hex");
  hid_t t = H5Tdecode(bytes->data());
  if (t < 0) return h5_error(what + ": the recorded HDF5 datatype does not decode");
  return Hid(t, H5Tclose);
}

// The dataspace's shape: nullopt for a null dataspace, {} for a scalar.
Result<std::optional<std::vector<int64_t>>> space_shape(hid_t space, const std::string& what) {
  H5S_class_t cls = H5Sget_simple_extent_type(space);
  if (cls == H5S_NULL) return std::optional<std::vector<int64_t>>();
  if (cls == H5S_SCALAR) return std::optional<std::vector<int64_t>>(std::vector<int64_t>{});
  int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0) return h5_error(what + ": cannot read its dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) return h5_error(what + ": cannot read its dataspace");
  std::vector<int64_t> out;
  for (hsize_t d : dims) out.push_back(static_cast<int64_t>(d));
  return std::optional<std::vector<int64_t>>(std::move(out));
}

Result<Hid> make_space(const json& shape, const std::string& what) {
  if (shape.is_null()) return Hid(H5Screate(H5S_NULL), H5Sclose);
  if (!shape.is_array()) return invalid_argument(what + ": the recorded shape is not an array");
  if (shape.empty()) return Hid(H5Screate(H5S_SCALAR), H5Sclose);
  std::vector<hsize_t> dims;
  for (const auto& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return invalid_argument(what + ": the recorded shape is not valid");
    dims.push_back(d.get<hsize_t>());
  }
  hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  if (s < 0) return h5_error(what + ": cannot make its dataspace");
  return Hid(s, H5Sclose);
}

uint64_t elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// ---- attributes ----

struct AttrRead {
  json record;                                   // what export replays
  std::optional<std::vector<std::string>> text;  // the values, when the attribute holds strings
};

Result<AttrRead> read_attr(hid_t obj, const std::string& name, const std::string& where) {
  std::string what = "attribute '" + name + "' of '" + where + "'";
  Hid a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return h5_error("cannot open " + what);
  Hid type(H5Aget_type(a.get()), H5Tclose);
  Hid space(H5Aget_space(a.get()), H5Sclose);
  if (!type.ok() || !space.ok()) return h5_error("cannot read " + what);
  H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_STRING && cls != H5T_ENUM && cls != H5T_BITFIELD &&
      cls != H5T_OPAQUE)
    return invalid_argument(what + ": compound, array, variable-length and reference attributes are not supported");
  CAIRN_ASSIGN_OR_RETURN(auto shape, space_shape(space.get(), what));
  CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(type.get(), what));
  AttrRead out;
  out.record = json{{"name", name}, {"h5t", h5t}, {"shape", shape ? json(*shape) : json()}};
  uint64_t n = shape ? elements(*shape) : 0;
  if (cls == H5T_STRING && H5Tis_variable_str(type.get()) > 0) {
    Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    std::vector<char*> ptrs(n, nullptr);
    std::vector<std::string> values;
    if (n > 0) {
      if (H5Aread(a.get(), mem.get(), ptrs.data()) < 0) return h5_error("cannot read " + what);
      for (char* p : ptrs) values.emplace_back(p ? p : "");
      H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, ptrs.data());
    }
    for (const auto& v : values)
      if (!valid_utf8(v)) return invalid_argument(what + ": a string is not valid UTF-8");
    out.record["strings"] = values;
    out.text = std::move(values);
    return out;
  }
  size_t esize = H5Tget_size(type.get());
  std::vector<uint8_t> raw(n * esize);
  if (n > 0 && H5Aread(a.get(), type.get(), raw.data()) < 0) return h5_error("cannot read " + what);
  out.record["data"] = hex(raw.data(), raw.size());
  if (cls == H5T_STRING) {
    std::vector<std::string> values;
    for (uint64_t i = 0; i < n; ++i) {
      std::string s(reinterpret_cast<const char*>(raw.data() + i * esize), esize);
      while (!s.empty() && (s.back() == '\0' || (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD && s.back() == ' ')))
        s.pop_back();
      values.push_back(std::move(s));
    }
    out.text = std::move(values);
  } else if (n == 0) {
    out.text = std::vector<std::string>{};  // Keras writes an empty float64 array for "no weights"
  }
  return out;
}

// Every attribute of obj, in the order HDF5 keeps them (creation order when tracked).
Result<json> read_attrs(hid_t obj, unsigned attr_order_flags, const std::string& where) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5_index_t index = (attr_order_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  herr_t r = H5Aiterate2(
      obj, index, H5_ITER_NATIVE, &idx,
      [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->emplace_back(name);
        return 0;
      },
      &names);
  if (r < 0) return h5_error("cannot list the attributes of '" + where + "'");
  json out = json::array();
  for (const auto& n : names) {
    CAIRN_ASSIGN_OR_RETURN(AttrRead a, read_attr(obj, n, where));
    out.push_back(std::move(a.record));
  }
  return out;
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

// A Keras string-list attribute: `name`, or its chunks name0, name1, ... (Keras splits lists over
// 64 KiB). nullopt when there is none.
Result<std::optional<std::vector<std::string>>> read_string_list(hid_t obj, const std::string& name,
                                                                 const std::string& where) {
  std::vector<std::string> out;
  std::vector<std::string> parts;
  if (has_attr(obj, name)) {
    parts.push_back(name);
  } else {
    for (int i = 0; has_attr(obj, name + std::to_string(i)); ++i) parts.push_back(name + std::to_string(i));
    if (parts.empty()) return std::optional<std::vector<std::string>>();
  }
  for (const auto& p : parts) {
    CAIRN_ASSIGN_OR_RETURN(AttrRead a, read_attr(obj, p, where));
    if (!a.text) return invalid_argument("attribute '" + p + "' of '" + where + "' is not a list of strings");
    out.insert(out.end(), a.text->begin(), a.text->end());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

// ---- datasets ----

struct DatasetPlan {
  std::string path, tensor;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// The cairn dtype of an HDF5 dataset type, or an error naming the dataset.
Result<DType> cairn_dtype(hid_t type, const std::string& what) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return h5_error(what + ": bad float type");
    size_t ebias = H5Tget_ebias(type);
    if (size == 2 && spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 && ebias == 15) return DType::kF16;
    if (size == 4 && spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23 && ebias == 127) return DType::kF32;
    if (size == 8 && spos == 63 && epos == 52 && esize == 11 && mpos == 0 && msize == 52 && ebias == 1023)
      return DType::kF64;
    return invalid_argument(what + ": a " + std::to_string(8 * size) +
                            "-bit float that is not IEEE half, single or double is not supported");
  }
  if (cls == H5T_INTEGER) {
    if (H5Tget_precision(type) != 8 * size || H5Tget_offset(type) != 0)
      return invalid_argument(what + ": integers with padding bits are not supported");
    bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (size) {
      case 1: return is_signed ? DType::kI8 : DType::kU8;
      case 2: return is_signed ? DType::kI16 : DType::kU16;
      case 4: return is_signed ? DType::kI32 : DType::kU32;
      case 8: return is_signed ? DType::kI64 : DType::kU64;
      default: return invalid_argument(what + ": " + std::to_string(8 * size) + "-bit integers are not supported");
    }
  }
  if (cls == H5T_ENUM && size == 1 && H5Tget_nmembers(type) == 2) {
    // h5py's (and numpy's) bool: an enum over int8 with FALSE = 0, TRUE = 1.
    bool ok = true;
    for (unsigned i = 0; i < 2 && ok; ++i) {
      char* nm = H5Tget_member_name(type, i);
      int8_t v = -1;
      ok = nm && H5Tget_member_value(type, i, &v) >= 0 &&
           ((std::strcmp(nm, "FALSE") == 0 && v == 0) || (std::strcmp(nm, "TRUE") == 0 && v == 1));
      if (nm) H5free_memory(nm);
    }
    if (ok) return DType::kBool;
  }
  static const std::map<H5T_class_t, const char*> names{
      {H5T_STRING, "string"}, {H5T_ENUM, "enum"},   {H5T_COMPOUND, "compound"}, {H5T_ARRAY, "array"},
      {H5T_VLEN, "variable-length"}, {H5T_OPAQUE, "opaque"}, {H5T_REFERENCE, "reference"}, {H5T_BITFIELD, "bitfield"},
      {H5T_TIME, "time"}};
  auto it = names.find(cls);
  return invalid_argument(what + ": HDF5 " + std::string(it == names.end() ? "unknown" : it->second) +
                          " data are not supported (cairn stores IEEE floats, integers and booleans)");
}

// The in-memory type for a dataset of file type `type`: the same, little-endian.
Result<Hid> memory_type(hid_t type, const std::string& what) {
  Hid m(H5Tcopy(type), H5Tclose);
  if (!m.ok()) return h5_error(what + ": cannot copy its datatype");
  H5T_class_t cls = H5Tget_class(type);
  if ((cls == H5T_FLOAT || cls == H5T_INTEGER) && H5Tset_order(m.get(), H5T_ORDER_LE) < 0)
    return h5_error(what + ": cannot convert its byte order");
  return m;
}

Result<json> dataset_layout(hid_t dcpl, const std::string& what) {
  json out = json::object();
  H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_COMPACT) out["layout"] = "compact";
  if (layout == H5D_CHUNKED) {
    hsize_t dims[32];
    int nd = H5Pget_chunk(dcpl, 32, dims);
    if (nd < 0) return h5_error(what + ": cannot read its chunking");
    out["chunks"] = std::vector<hsize_t>(dims, dims + nd);
  }
  int nf = H5Pget_nfilters(dcpl);
  if (nf > 0) {
    json filters = json::array();
    for (int i = 0; i < nf; ++i) {
      unsigned flags = 0, conf = 0;
      unsigned cd[16];
      size_t ncd = 16;
      char name[256];
      H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &ncd, cd, sizeof name, name, &conf);
      if (id < 0) return h5_error(what + ": cannot read its filters");
      filters.push_back(json{{"id", id}, {"flags", flags}, {"values", std::vector<unsigned>(cd, cd + std::min<size_t>(ncd, 16))},
                             {"name", std::string(name)}});
    }
    out["filters"] = filters;
  }
  return out;
}

// ---- the import walk ----

struct Walk {
  hid_t file = -1;
  std::map<std::string, std::string> tensor_of_path;  // datasets Keras lists, by path
  std::vector<DatasetPlan> other;                    // datasets it does not list, in walk order
  std::map<std::string, DatasetPlan> listed;         // by path
  std::set<std::string> names;
};

Result<json> walk_group(Walk& w, hid_t group, const std::string& path);

Result<json> walk_dataset(Walk& w, hid_t ds, const std::string& path) {
  std::string what = "dataset '" + path + "'";
  Hid type(H5Dget_type(ds), H5Tclose), space(H5Dget_space(ds), H5Sclose), dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!type.ok() || !space.ok() || !dcpl.ok()) return h5_error("cannot read " + what);
  CAIRN_ASSIGN_OR_RETURN(DType dt, cairn_dtype(type.get(), what));
  CAIRN_ASSIGN_OR_RETURN(auto shape, space_shape(space.get(), what));
  if (!shape) return invalid_argument(what + ": empty (null dataspace) datasets are not supported");
  if (shape->size() > static_cast<size_t>(kMaxDims))
    return invalid_argument(what + ": " + std::to_string(shape->size()) + " dimensions (cairn stores at most " +
                            std::to_string(kMaxDims) + ")");
  unsigned attr_flags = 0;
  H5Pget_attr_creation_order(dcpl.get(), &attr_flags);
  CAIRN_ASSIGN_OR_RETURN(json attrs, read_attrs(ds, attr_flags, path));
  CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(type.get(), what));
  CAIRN_ASSIGN_OR_RETURN(json layout, dataset_layout(dcpl.get(), what));
  DatasetPlan plan{path, "", dt, *shape};
  auto it = w.tensor_of_path.find(path);
  if (it != w.tensor_of_path.end()) {
    plan.tensor = it->second;
    w.listed[path] = plan;
  } else {
    plan.tensor = path.substr(1);
    if (!w.names.insert(plan.tensor).second)
      return invalid_argument(what + ": its tensor name '" + plan.tensor + "' is already taken by a Keras weight");
    if (!valid_name(plan.tensor)) return invalid_argument(what + ": its path is not a valid cairn tensor name");
    w.other.push_back(plan);
  }
  json rec{{"tensor", plan.tensor}, {"dtype", std::string(dtype_name(dt))}, {"shape", *shape}, {"h5t", h5t}};
  if (!attrs.empty()) rec["attrs"] = attrs;
  if (attr_flags) rec["attr_order"] = attr_flags;
  for (auto& [k, v] : layout.items()) rec[k] = v;
  return rec;
}

Result<json> walk_group(Walk& w, hid_t group, const std::string& path) {
  const std::string where = path.empty() ? "/" : path;
  Hid gcpl(H5Gget_create_plist(group), H5Pclose);
  if (!gcpl.ok()) return h5_error("cannot read group '" + where + "'");
  unsigned link_flags = 0, attr_flags = 0;
  H5Pget_link_creation_order(gcpl.get(), &link_flags);
  H5Pget_attr_creation_order(gcpl.get(), &attr_flags);
  json rec = json::object();
  CAIRN_ASSIGN_OR_RETURN(json attrs, read_attrs(group, attr_flags, where));
  rec["attrs"] = std::move(attrs);
  if (link_flags) rec["link_order"] = link_flags;
  if (attr_flags) rec["attr_order"] = attr_flags;
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) return h5_error("cannot list group '" + where + "'");
  H5_index_t index = (link_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  json links = json::array();
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len = H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) return h5_error("cannot list group '" + where + "'");
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    std::string child = path + "/" + name;
    H5L_info_t li;
    if (H5Lget_info(group, name.c_str(), &li, H5P_DEFAULT) < 0) return h5_error("cannot read link '" + child + "'");
    if (li.type != H5L_TYPE_HARD)
      return invalid_argument("'" + child + "': soft and external links are not supported");
    Hid obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!obj.ok()) return h5_error("cannot open '" + child + "'");
    H5I_type_t t = H5Iget_type(obj.get());
    if (t == H5I_GROUP) {
      CAIRN_ASSIGN_OR_RETURN(json g, walk_group(w, obj.get(), child));
      links.push_back(json{{"name", name}, {"group", std::move(g)}});
    } else if (t == H5I_DATASET) {
      CAIRN_ASSIGN_OR_RETURN(json d, walk_dataset(w, obj.get(), child));
      links.push_back(json{{"name", name}, {"dataset", std::move(d)}});
    } else {
      return invalid_argument("'" + child + "': named datatypes are not supported");
    }
  }
  rec["links"] = std::move(links);
  return rec;
}

// Keras 2's weight name "dense/kernel:0" of layer "dense" as the tensor "dense.kernel".
std::string tensor_name(const std::string& layer, const std::string& weight) {
  std::string w = weight;
  if (w.size() > layer.size() + 1 && w.compare(0, layer.size(), layer) == 0 && w[layer.size()] == '/')
    w = w.substr(layer.size() + 1);
  if (w.size() > 2 && w.compare(w.size() - 2, 2, ":0") == 0) w.resize(w.size() - 2);
  return layer + "." + w;
}

void silence_hdf5() {
  static bool done = false;
  if (!done) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), done = true;
}

Status pread_dataset(hid_t file, const DatasetPlan& p, uint8_t* dst) {
  std::string what = "dataset '" + p.path + "'";
  Hid ds(H5Dopen2(file, p.path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return h5_error("cannot open " + what);
  Hid type(H5Dget_type(ds.get()), H5Tclose);
  CAIRN_ASSIGN_OR_RETURN(Hid mem, memory_type(type.get(), what));
  if (H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) return h5_error("cannot read " + what);
  return Status::ok();
}

}  // namespace

Status import_keras_h5(Client& client, const std::string& id, const std::string& file, const std::string& parent,
                       const json& meta, Durability durability) {
  silence_hdf5();
  if (H5Fis_hdf5(file.c_str()) <= 0) {
    if (::access(file.c_str(), R_OK) != 0) return errno_status("opening '" + file + "'", errno);
    return h5_error("'" + file + "' is not an HDF5 file");
  }
  Hid f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.ok()) return h5_error("'" + file + "' is not a readable HDF5 file");
  Walk w;
  w.file = f.get();

  // Where the weights are: the root of a weights file, /model_weights of a whole-model file.
  std::string root;
  Hid wroot;
  {
    Hid r(H5Gopen2(f.get(), "/", H5P_DEFAULT), H5Gclose);
    if (!r.ok()) return h5_error("'" + file + "': cannot open its root group");
    CAIRN_ASSIGN_OR_RETURN(auto names, read_string_list(r.get(), "layer_names", "/"));
    if (names) {
      wroot = std::move(r);
    } else if (H5Lexists(f.get(), "model_weights", H5P_DEFAULT) > 0) {
      wroot = Hid(H5Gopen2(f.get(), "/model_weights", H5P_DEFAULT), H5Gclose);
      if (!wroot.ok()) return h5_error("'" + file + "': cannot open /model_weights");
      root = "/model_weights";
    } else {
      return invalid_argument("'" + file + "' is not a Keras weights file (no 'layer_names' attribute at / or /model_weights)");
    }
  }
  const std::string where_root = root.empty() ? "/" : root;
  CAIRN_ASSIGN_OR_RETURN(auto layer_names_opt, read_string_list(wroot.get(), "layer_names", where_root));
  if (!layer_names_opt)
    return invalid_argument("'" + file + "': '" + where_root + "' has no 'layer_names' attribute");
  const std::vector<std::string>& layer_names = *layer_names_opt;

  json weight_names = json::object();
  std::vector<std::pair<std::string, std::string>> order;  // (path, layer) of listed weights
  for (const auto& layer : layer_names) {
    std::string lpath = root + "/" + layer;
    if (layer.empty() || layer.find('/') != std::string::npos || H5Lexists(wroot.get(), layer.c_str(), H5P_DEFAULT) <= 0)
      return invalid_argument("'" + file + "': layer '" + layer + "' in layer_names has no group '" + lpath + "'");
    Hid g(H5Gopen2(wroot.get(), layer.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.ok()) return h5_error("'" + file + "': '" + lpath + "' is not a group");
    CAIRN_ASSIGN_OR_RETURN(auto wn, read_string_list(g.get(), "weight_names", lpath));
    std::vector<std::string> weights = wn ? *wn : std::vector<std::string>{};
    weight_names[layer] = weights;
    for (const auto& wt : weights) {
      std::string path = lpath + "/" + wt;
      std::string t = tensor_name(layer, wt);
      if (!valid_name(t)) return invalid_argument("'" + file + "': weight '" + path + "' gives an invalid tensor name");
      if (!w.names.insert(t).second)
        return invalid_argument("'" + file + "': weight '" + path + "' and another weight both map to tensor '" + t + "'");
      if (!w.tensor_of_path.emplace(path, t).second)
        return invalid_argument("'" + file + "': weight '" + path + "' is listed twice");
      order.emplace_back(path, layer);
    }
  }

  auto tree = [&]() -> Result<json> {
    Hid r(H5Gopen2(f.get(), "/", H5P_DEFAULT), H5Gclose);
    return walk_group(w, r.get(), "");
  }();
  if (!tree.is_ok()) return tree.status().with_context("'" + file + "'");
  for (const auto& [path, layer] : order)
    if (!w.listed.count(path))
      return invalid_argument("'" + file + "': layer '" + layer + "' lists weight '" + path + "', which is not a dataset");

  // Layer types from a whole-model file's model_config, when it has one.
  std::map<std::string, std::string> layer_type;
  if (has_attr(f.get(), "model_config")) {
    auto mc = read_attr(f.get(), "model_config", "/");
    if (mc.is_ok() && mc->text && mc->text->size() == 1) {
      json cfg = json::parse((*mc->text)[0], nullptr, false);
      if (cfg.is_object() && cfg.contains("config")) {
        const json& c = cfg["config"];
        const json* layers = c.is_object() && c.contains("layers") ? &c["layers"] : nullptr;
        if (layers && layers->is_array())
          for (const auto& l : *layers)
            if (l.is_object() && l.value("class_name", json()).is_string() && l.contains("config") &&
                l["config"].is_object() && l["config"].value("name", json()).is_string())
              layer_type[l["config"]["name"].get<std::string>()] = l["class_name"].get<std::string>();
      }
    }
  }

  // The graph: the layers as a chain in layer_names order; each layer's config is its weights.
  json layers = json::array(), tensor_map = json::object();
  std::string prev;
  for (const auto& layer : layer_names) {
    json wl = json::array();
    for (const auto& wt : weight_names[layer]) {
      const DatasetPlan& p = w.listed[root + "/" + layer + "/" + wt.get<std::string>()];
      tensor_map[p.tensor] = layer;
      wl.push_back(json{{"name", p.tensor.substr(layer.size() + 1)}, {"dtype", std::string(dtype_name(p.dtype))},
                        {"shape", p.shape}});
    }
    auto t = layer_type.find(layer);
    json l{{"name", layer}, {"type", t != layer_type.end() ? t->second : std::string("KerasLayer")},
           {"config", json{{"weights", wl}}}, {"inputs", prev.empty() ? json::array() : json::array({prev})}};
    layers.push_back(std::move(l));
    prev = layer;
  }
  json graph{{"layers", layers}, {"tensors", tensor_map}};

  json record{{"format", "keras-h5"},
              {"file", file.substr(file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1)},
              {"weights_root", where_root},
              {"layer_names", layer_names},
              {"weight_names", weight_names},
              {"tree", std::move(tree).value()}};
  json metadata = meta.is_object() ? meta : json::object();
  metadata["cairn.import"] = std::move(record);
  if (metadata.dump().size() > wire::kMaxJsonBytes / 2)
    return invalid_argument("'" + file + "': its HDF5 layout is too large to record in the model's metadata");

  std::vector<const DatasetPlan*> plans;
  for (const auto& [path, layer] : order) plans.push_back(&w.listed[path]);
  for (const auto& p : w.other) plans.push_back(&p);

  ModelWriter writer(client, id, parent);
  CAIRN_RETURN_IF_ERROR(writer.set_metadata(metadata));
  CAIRN_RETURN_IF_ERROR(writer.set_architecture(graph));
  std::vector<uint8_t> small;
  for (const DatasetPlan* p : plans) {
    auto nbytes = tensor_nbytes(p->dtype, p->shape);
    if (!nbytes) return invalid_argument("'" + file + "': dataset '" + p->path + "' is too large");
    if (*nbytes <= kInlineLimit) {
      small.assign(*nbytes, 0);
      if (*nbytes) CAIRN_RETURN_IF_ERROR(pread_dataset(f.get(), *p, small.data()).with_context("'" + file + "'"));
      CAIRN_RETURN_IF_ERROR(writer.add_tensor(p->tensor, small.data(), p->dtype, p->shape));
    } else {
      // Straight from the file into the daemon's arena.
      CAIRN_ASSIGN_OR_RETURN(uint8_t * dst, writer.add_tensor_space(p->tensor, p->dtype, p->shape));
      CAIRN_RETURN_IF_ERROR(pread_dataset(f.get(), *p, dst).with_context("'" + file + "'"));
    }
  }
  auto r = writer.commit(durability, true);
  return r.is_ok() ? Status::ok() : r.status();
}

// ---- export ----

namespace {

struct Writer {
  hid_t file = -1;
  ModelReader* reader = nullptr;
  std::string model;
};

Status write_attrs(hid_t obj, const json& attrs, const std::string& where) {
  if (!attrs.is_array()) return invalid_argument("'" + where + "': the recorded attributes are not a list");
  for (const auto& a : attrs) {
    if (!a.is_object() || !a.value("name", json()).is_string())
      return invalid_argument("'" + where + "': a recorded attribute has no name");
    std::string name = a["name"].get<std::string>();
    std::string what = "attribute '" + name + "' of '" + where + "'";
    CAIRN_ASSIGN_OR_RETURN(Hid type, decode_type(a.value("h5t", json()), what));
    CAIRN_ASSIGN_OR_RETURN(Hid space, make_space(a.value("shape", json()), what));
    Hid at(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!at.ok()) return h5_error("cannot create " + what);
    hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (a.contains("strings")) {
      const json& s = a["strings"];
      if (!s.is_array() || static_cast<hssize_t>(s.size()) != n)
        return invalid_argument(what + ": the recorded strings do not match its shape");
      std::vector<std::string> values;
      for (const auto& v : s) values.push_back(v.is_string() ? v.get<std::string>() : std::string());
      std::vector<const char*> ptrs;
      for (const auto& v : values) ptrs.push_back(v.c_str());
      Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
      if (n > 0 && H5Awrite(at.get(), mem.get(), ptrs.data()) < 0) return h5_error("cannot write " + what);
    } else if (a.contains("data")) {
      auto raw = a["data"].is_string() ? unhex(a["data"].get<std::string>()) : std::nullopt;
      if (!raw || raw->size() != static_cast<size_t>(n) * H5Tget_size(type.get()))
        return invalid_argument(what + ": the recorded value does not match its type and shape");
      if (n > 0 && H5Awrite(at.get(), type.get(), raw->data()) < 0) return h5_error("cannot write " + what);
    }
  }
  return Status::ok();
}

Status write_dataset(Writer& w, hid_t parent, const std::string& name, const json& rec, const std::string& path) {
  std::string what = "dataset '" + path + "'";
  if (!rec.is_object() || !rec.value("tensor", json()).is_string())
    return invalid_argument(what + ": the recorded layout names no tensor");
  std::string tensor = rec["tensor"].get<std::string>();
  const TensorInfo* t = w.reader->find(tensor);
  if (!t) return not_found(what + ": model '" + w.model + "' has no tensor '" + tensor + "'");
  CAIRN_ASSIGN_OR_RETURN(Hid type, decode_type(rec.value("h5t", json()), what));
  CAIRN_ASSIGN_OR_RETURN(DType dt, cairn_dtype(type.get(), what));
  if (dt != t->dtype || json(t->shape) != rec.value("shape", json()))
    return invalid_argument(what + ": tensor '" + tensor + "' is " + std::string(dtype_name(t->dtype)) + " " +
                            json(t->shape).dump() + ", not the recorded " + std::string(dtype_name(dt)) + " " +
                            rec.value("shape", json()).dump());
  CAIRN_ASSIGN_OR_RETURN(Hid space, make_space(json(t->shape), what));
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (rec.contains("attr_order")) H5Pset_attr_creation_order(dcpl.get(), rec["attr_order"].get<unsigned>());
  if (rec.value("layout", "") == "compact") H5Pset_layout(dcpl.get(), H5D_COMPACT);
  if (rec.contains("chunks")) {
    std::vector<hsize_t> chunks = rec["chunks"].get<std::vector<hsize_t>>();
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunks.size()), chunks.data()) < 0)
      return h5_error(what + ": cannot set its chunking");
  }
  if (rec.contains("filters")) {
    for (const auto& fl : rec["filters"]) {
      std::vector<unsigned> cd = fl.value("values", std::vector<unsigned>{});
      if (H5Pset_filter(dcpl.get(), fl["id"].get<H5Z_filter_t>(), fl.value("flags", 0u), cd.size(), cd.data()) < 0)
        return h5_error(what + ": cannot apply its filter '" + fl.value("name", std::string("?")) + "'");
    }
  }
  Hid ds(H5Dcreate2(parent, name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return h5_error("cannot create " + what);
  if (t->nbytes > 0) {
    CAIRN_ASSIGN_OR_RETURN(auto view, w.reader->map(tensor));
    CAIRN_ASSIGN_OR_RETURN(Hid mem, memory_type(type.get(), what));
    herr_t wr = H5Dwrite(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, view.data());
    w.reader->close();  // one tensor pinned at a time: models larger than the arena export too
    if (wr < 0) return h5_error("cannot write " + what);
  }
  return write_attrs(ds.get(), rec.value("attrs", json::array()), path);
}

Status write_group(Writer& w, hid_t group, const json& rec, const std::string& path) {
  const std::string where = path.empty() ? "/" : path;
  if (!rec.is_object()) return invalid_argument("'" + where + "': the recorded group is not an object");
  CAIRN_RETURN_IF_ERROR(write_attrs(group, rec.value("attrs", json::array()), where));
  for (const auto& l : rec.value("links", json::array())) {
    std::string name = l.value("name", std::string());
    std::string child = path + "/" + name;
    if (name.empty() || name.find('/') != std::string::npos)
      return invalid_argument("'" + where + "': a recorded link has no valid name");
    if (l.contains("group")) {
      const json& g = l["group"];
      Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
      if (g.contains("link_order")) H5Pset_link_creation_order(gcpl.get(), g["link_order"].get<unsigned>());
      if (g.contains("attr_order")) H5Pset_attr_creation_order(gcpl.get(), g["attr_order"].get<unsigned>());
      Hid sub(H5Gcreate2(group, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
      if (!sub.ok()) return h5_error("cannot create group '" + child + "'");
      CAIRN_RETURN_IF_ERROR(write_group(w, sub.get(), g, child));
    } else if (l.contains("dataset")) {
      CAIRN_RETURN_IF_ERROR(write_dataset(w, group, name, l["dataset"], child));
    } else {
      return invalid_argument("'" + child + "': the recorded link is neither a group nor a dataset");
    }
  }
  return Status::ok();
}

// A Keras 2 weights-only layout for a model that was not imported from HDF5: one layer per
// tensor-name prefix (up to the last dot), weight "<layer>/<suffix>:0".
Result<json> synthesize_tree(const ModelReader& r) {
  auto string_attr = [](const std::string& name, const std::vector<std::string>& values, bool scalar) -> Result<json> {
    Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t.get(), H5T_VARIABLE);
    H5Tset_cset(t.get(), scalar ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(t.get(), "attribute '" + name + "'"));
    return json{{"name", name}, {"h5t", h5t},
                {"shape", scalar ? json::array() : json::array({values.size()})}, {"strings", values}};
  };
  auto empty_attr = [](const std::string& name) -> Result<json> {
    CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(H5T_IEEE_F64LE, "attribute '" + name + "'"));
    return json{{"name", name}, {"h5t", h5t}, {"shape", json::array({0})}, {"data", ""}};
  };
  std::vector<std::string> layer_order;
  std::map<std::string, std::vector<const TensorInfo*>> by_layer;
  for (const auto& t : r.tensors()) {
    auto dot = t.name.rfind('.');
    std::string layer = dot == std::string::npos || dot == 0 ? t.name : t.name.substr(0, dot);
    if (layer.find('/') != std::string::npos)
      return invalid_argument("tensor '" + t.name + "': a '/' in a layer name cannot be written as an HDF5 group");
    if (!by_layer.count(layer)) layer_order.push_back(layer);
    by_layer[layer].push_back(&t);
  }
  json links = json::array();
  for (const auto& layer : layer_order) {
    std::vector<std::string> wnames;
    json inner = json::array();
    for (const TensorInfo* t : by_layer[layer]) {
      std::string suffix = t->name.size() > layer.size() ? t->name.substr(layer.size() + 1) : t->name;
      wnames.push_back(layer + "/" + suffix + ":0");
      Hid type;
      switch (t->dtype) {
        case DType::kF64: type = Hid(H5Tcopy(H5T_IEEE_F64LE), H5Tclose); break;
        case DType::kF32: type = Hid(H5Tcopy(H5T_IEEE_F32LE), H5Tclose); break;
        case DType::kF16:  // as h5py makes it
          type = Hid(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
          H5Tset_fields(type.get(), 15, 10, 5, 0, 10);
          H5Tset_size(type.get(), 2);
          H5Tset_ebias(type.get(), 15);
          break;
        case DType::kI64: type = Hid(H5Tcopy(H5T_STD_I64LE), H5Tclose); break;
        case DType::kI32: type = Hid(H5Tcopy(H5T_STD_I32LE), H5Tclose); break;
        case DType::kI16: type = Hid(H5Tcopy(H5T_STD_I16LE), H5Tclose); break;
        case DType::kI8: type = Hid(H5Tcopy(H5T_STD_I8LE), H5Tclose); break;
        case DType::kU64: type = Hid(H5Tcopy(H5T_STD_U64LE), H5Tclose); break;
        case DType::kU32: type = Hid(H5Tcopy(H5T_STD_U32LE), H5Tclose); break;
        case DType::kU16: type = Hid(H5Tcopy(H5T_STD_U16LE), H5Tclose); break;
        case DType::kU8: type = Hid(H5Tcopy(H5T_STD_U8LE), H5Tclose); break;
        case DType::kBool: {  // as h5py makes it
          type = Hid(H5Tenum_create(H5T_NATIVE_INT8), H5Tclose);
          int8_t f = 0, t1 = 1;
          H5Tenum_insert(type.get(), "FALSE", &f);
          H5Tenum_insert(type.get(), "TRUE", &t1);
          break;
        }
        default:
          return invalid_argument("tensor '" + t->name + "': " + std::string(dtype_name(t->dtype)) +
                                  " has no HDF5 equivalent (export it as .safetensors or .pt)");
      }
      CAIRN_ASSIGN_OR_RETURN(std::string h5t, encode_type(type.get(), "tensor '" + t->name + "'"));
      json ds{{"tensor", t->name}, {"dtype", std::string(dtype_name(t->dtype))}, {"shape", t->shape}, {"h5t", h5t}};
      inner.push_back(json{{"name", suffix + ":0"}, {"dataset", ds}});
    }
    json group_attrs = json::array();
    CAIRN_ASSIGN_OR_RETURN(json wn, wnames.empty() ? empty_attr("weight_names") : string_attr("weight_names", wnames, false));
    group_attrs.push_back(wn);
    json layer_group{{"attrs", group_attrs},
                     {"links", json::array({json{{"name", layer}, {"group", json{{"attrs", json::array()}, {"links", inner}}}}})}};
    links.push_back(json{{"name", layer}, {"group", layer_group}});
  }
  json root_attrs = json::array();
  CAIRN_ASSIGN_OR_RETURN(json ln, layer_order.empty() ? empty_attr("layer_names") : string_attr("layer_names", layer_order, false));
  root_attrs.push_back(ln);
  return json{{"attrs", root_attrs}, {"links", links}};
}

}  // namespace

Status export_keras_h5(Client& client, const std::string& id, const std::string& file) {
  silence_hdf5();
  CAIRN_ASSIGN_OR_RETURN(auto reader, ModelReader::open(client, id));
  const json& meta = reader->metadata();
  json tree;
  if (meta.is_object() && meta.contains("cairn.import") && meta["cairn.import"].is_object() &&
      meta["cairn.import"].value("format", "") == "keras-h5") {
    tree = meta["cairn.import"].value("tree", json());
  } else {
    auto t = synthesize_tree(*reader);
    if (!t.is_ok()) return t.status().with_context("model '" + id + "'");
    tree = std::move(t).value();
  }
  std::string tmp = file + ".cairn-tmp";
  Status st;
  {
    Hid fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    if (tree.is_object() && tree.contains("link_order")) H5Pset_link_creation_order(fcpl.get(), tree["link_order"].get<unsigned>());
    if (tree.is_object() && tree.contains("attr_order")) H5Pset_attr_creation_order(fcpl.get(), tree["attr_order"].get<unsigned>());
    Hid f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
    if (!f.ok()) return h5_error("cannot create '" + tmp + "'");
    Hid root(H5Gopen2(f.get(), "/", H5P_DEFAULT), H5Gclose);
    Writer w{f.get(), reader.get(), id};
    try {
      st = write_group(w, root.get(), tree, "");
    } catch (const json::exception& e) {
      st = invalid_argument(std::string("the recorded HDF5 layout is malformed: ") + e.what());
    }
    root.reset();
    if (st.is_ok() && H5Fflush(f.get(), H5F_SCOPE_GLOBAL) < 0) st = h5_error("cannot write '" + tmp + "'");
    f.reset();
    reader->close();
  }
  if (st.is_ok() && std::rename(tmp.c_str(), file.c_str()) != 0) st = errno_status("renaming to '" + file + "'", errno);
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st.with_context("exporting model '" + id + "' to '" + file + "'");
  }
  return Status::ok();
}

#endif  // CAIRN_HAVE_HDF5

}  // namespace cairn::tool
