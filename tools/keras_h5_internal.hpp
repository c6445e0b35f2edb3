// Internal to the Keras HDF5 converter: the small helpers over the HDF5 C API that keras_h5_util.cpp
// defines and keras_h5_import.cpp and keras_h5_export.cpp share (only when built with CAIRN_WITH_HDF5).
#pragma once

#ifdef CAIRN_HAVE_HDF5

#include <hdf5.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"

namespace cairn::tool::h5 {

// An HDF5 id that closes itself.
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

// An error for `what`, with the most specific message on HDF5's error stack.
Status h5_error(const std::string& what);

// Bytes as lowercase hex, and back (nullopt when `s` is not hex).
std::string hex(const uint8_t* p, size_t n);
std::optional<std::vector<uint8_t>> unhex(const std::string& s);

// An HDF5 datatype serialized (H5Tencode) as hex, and back.
Result<std::string> encode_type(hid_t type, const std::string& what);
Result<Hid> decode_type(const nlohmann::json& j, const std::string& what);

// The dataspace's shape: nullopt for a null dataspace, {} for a scalar.
Result<std::optional<std::vector<int64_t>>> space_shape(hid_t space, const std::string& what);
// A dataspace of a recorded shape (null: a null dataspace, []: a scalar).
Result<Hid> make_space(const nlohmann::json& shape, const std::string& what);
// The number of elements of a shape.
uint64_t elements(const std::vector<int64_t>& shape);

// The cairn dtype of an HDF5 dataset type, or an error naming the dataset.
Result<DType> cairn_dtype(hid_t type, const std::string& what);
// The in-memory type for a dataset of file type `type`: the same, little-endian.
Result<Hid> memory_type(hid_t type, const std::string& what);

// Turns off HDF5's printing of its error stack (once; errors go through h5_error).
void silence_hdf5();

}  // namespace cairn::tool::h5

#endif  // CAIRN_HAVE_HDF5
