// Whether this build has HDF5, and the small helpers over the HDF5 C API that keras_h5_import.cpp
// and keras_h5_export.cpp share (keras_h5_internal.hpp).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "tools/keras_h5.hpp"
#include "tools/keras_h5_internal.hpp"

namespace cairn::tool {

using nlohmann::json;

#ifndef CAIRN_HAVE_HDF5

Status require_hdf5(const std::string& file) {
  return invalid_argument("'" + file +
                          "': Keras HDF5 files need a cairn built with HDF5 support (CAIRN_WITH_HDF5; "
                          "Debian: libhdf5-dev); convert it to safetensors first");
}

#else  // CAIRN_HAVE_HDF5

Status require_hdf5(const std::string&) { return Status::OK(); }

namespace h5 {

// ---- small helpers over the HDF5 C API ----

namespace {

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

}  // namespace

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

std::optional<std::vector<uint8_t> > unhex(const std::string& s) {
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
Result<std::optional<std::vector<int64_t> > > space_shape(hid_t space, const std::string& what) {
  H5S_class_t cls = H5Sget_simple_extent_type(space);
  if (cls == H5S_NULL) return std::optional<std::vector<int64_t> >();
  if (cls == H5S_SCALAR) return std::optional<std::vector<int64_t> >(std::vector<int64_t>{});
  int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0) return h5_error(what + ": cannot read its dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) return h5_error(what + ": cannot read its dataspace");
  std::vector<int64_t> out;
  for (hsize_t d : dims) out.push_back(static_cast<int64_t>(d));
  return std::optional<std::vector<int64_t> >(std::move(out));
}

Result<Hid> make_space(const json& shape, const std::string& what) {
  if (shape.is_null()) return Hid(H5Screate(H5S_NULL), H5Sclose);
  if (!shape.is_array()) return invalid_argument(what + ": the recorded shape is not an array");
  if (shape.empty()) return Hid(H5Screate(H5S_SCALAR), H5Sclose);
  std::vector<hsize_t> dims;
  for (const auto& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      return invalid_argument(what + ": the recorded shape is not valid");
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

// The cairn dtype of an HDF5 dataset type, or an error naming the dataset.
Result<DType> cairn_dtype(hid_t type, const std::string& what) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return h5_error(what + ": bad float type");
    size_t ebias = H5Tget_ebias(type);
    if (size == 2 && spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 && ebias == 15)
      return DType::kF16;
    if (size == 4 && spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23 && ebias == 127)
      return DType::kF32;
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
      case 1:
        return is_signed ? DType::kI8 : DType::kU8;
      case 2:
        return is_signed ? DType::kI16 : DType::kU16;
      case 4:
        return is_signed ? DType::kI32 : DType::kU32;
      case 8:
        return is_signed ? DType::kI64 : DType::kU64;
      default:
        return invalid_argument(what + ": " + std::to_string(8 * size) + "-bit integers are not supported");
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
  static const std::map<H5T_class_t, const char*> names{{H5T_STRING, "string"},
                                                        {H5T_ENUM, "enum"},
                                                        {H5T_COMPOUND, "compound"},
                                                        {H5T_ARRAY, "array"},
                                                        {H5T_VLEN, "variable-length"},
                                                        {H5T_OPAQUE, "opaque"},
                                                        {H5T_REFERENCE, "reference"},
                                                        {H5T_BITFIELD, "bitfield"},
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

void silence_hdf5() {
  static bool done = false;
  if (!done) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), done = true;
}

}  // namespace h5

#endif  // CAIRN_HAVE_HDF5

}  // namespace cairn::tool
