// A model's manifest: what the repository knows of one model (its tensors, the chunks that make
// them up and where each chunk is stored), and its on-disk JSON form (docs/repository-format.md).
//
// Owns no state and does no I/O: these are values, their codec and their checks. The repository
// (tiers/pfs/repository.hpp, which includes this header) stores and reads them; the burst buffer
// records manifests of models not yet committed (without chunk locations).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/chunk_coding.hpp"
#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"

namespace cairn {

// Where a chunk's bytes are in the repository, and how they are stored there.
struct ChunkRef {
  ChunkHash hash;       // xxh3-128 of the raw bytes, however they are stored
  uint64_t length = 0;  // raw bytes
  std::string pack;     // file name under packs/ (filled in by commit)
  uint64_t offset = 0;  // absolute byte offset in the pack file
  // How the bytes are stored (core/chunk_coding.hpp). Coded chunks take `stored` bytes in the pack;
  // a delta is decoded with its base: a chunk of the same length, itself stored whole (raw or
  // planes, never a delta), whose location it carries, so the base stays readable (and counted
  // live) as long as the delta is, whatever happens to the model that stored it.
  ChunkCoding coding = ChunkCoding::kRaw;
  uint64_t stored = 0;                   // bytes in the pack when coded; 0 when raw
  std::shared_ptr<const ChunkRef> base;  // kDelta only

  // The bytes the chunk takes in its pack: [offset, offset + stored_bytes()).
  uint64_t stored_bytes() const { return coding == ChunkCoding::kRaw ? length : stored; }
  bool operator==(const ChunkRef& o) const {
    return hash == o.hash && length == o.length && pack == o.pack && offset == o.offset && coding == o.coding &&
           stored == o.stored && (base == o.base || (base && o.base && *base == *o.base));
  }
};

struct TensorManifest {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::vector<ChunkRef> chunks;  // in order; chunk i covers [i*chunk_size, ...) of the tensor
  bool operator==(const TensorManifest&) const = default;
};

// A model's tensors: a vector shared between copies until one of them is changed (copy on write).
// A derived model that inherits its parent's tensors holds the parent's list itself, not a copy, so
// a million metadata-only children cost a million pointers, and copying a manifest is cheap.
// Iteration and operator[] are read-only (they never copy); changing a tensor in place goes through
// mut(), which first makes the list this manifest's own when another one shares it, as do
// push_back, emplace_back, reserve and resize.
class TensorList {
 public:
  using value_type = TensorManifest;
  using iterator = std::vector<TensorManifest>::iterator;
  using const_iterator = std::vector<TensorManifest>::const_iterator;

  TensorList() = default;
  TensorList(std::vector<TensorManifest> v)  // NOLINT: implicit, as a vector assigns
      : v_(v.empty() ? nullptr : std::make_shared<std::vector<TensorManifest>>(std::move(v))) {}
  TensorList(std::initializer_list<TensorManifest> l) : TensorList(std::vector<TensorManifest>(l)) {}

  size_t size() const { return v_ ? v_->size() : 0; }
  bool empty() const { return size() == 0; }
  const std::vector<TensorManifest>& vec() const { return v_ ? *v_ : empty_vec(); }
  const_iterator begin() const { return vec().begin(); }
  const_iterator end() const { return vec().end(); }
  const_iterator cbegin() const { return vec().begin(); }
  const_iterator cend() const { return vec().end(); }
  const TensorManifest& operator[](size_t i) const { return (*v_)[i]; }
  const TensorManifest& front() const { return v_->front(); }
  const TensorManifest& back() const { return v_->back(); }

  // The list to change in place: this manifest's own (copied first when shared).
  std::vector<TensorManifest>& mut() {
    if (!v_)
      v_ = std::make_shared<std::vector<TensorManifest>>();
    else if (v_.use_count() > 1)
      v_ = std::make_shared<std::vector<TensorManifest>>(*v_);
    return *v_;
  }
  void push_back(TensorManifest t) { mut().push_back(std::move(t)); }
  template <class... A>
  TensorManifest& emplace_back(A&&... a) {
    return mut().emplace_back(std::forward<A>(a)...);
  }
  void reserve(size_t n) { mut().reserve(n); }
  void clear() { v_.reset(); }
  void resize(size_t n) { mut().resize(n); }
  iterator erase(const_iterator first, const_iterator last) {
    auto off = first - vec().begin(), len = last - first;
    auto& v = mut();
    return v.erase(v.begin() + off, v.begin() + off + len);
  }

  // The shared vector's address while any list holds it (nullptr when empty): lists that share it
  // have the same identity.
  const void* identity() const { return v_.get(); }
  // Whether both lists are the same vector (so equal without comparing).
  bool shares_with(const TensorList& o) const { return v_ == o.v_; }
  bool operator==(const TensorList& o) const { return v_ == o.v_ || vec() == o.vec(); }

 private:
  static const std::vector<TensorManifest>& empty_vec() {
    static const std::vector<TensorManifest> e;
    return e;
  }
  std::shared_ptr<std::vector<TensorManifest>> v_;  // null: empty
};

struct ModelManifest {
  std::string id;
  std::string parent;  // "" = none
  nlohmann::json metadata = nlohmann::json::object();
  nlohmann::json architecture;  // null when none was given
  TensorList tensors;
  // The original safetensors header (8-byte length + JSON) when the model was stored from a file,
  // so `cairn get` of the whole model reproduces the file byte for byte. "" otherwise.
  std::string source_header;
  int64_t created_ns = 0;  // wall clock; commit keeps a given one that follows the last, else sets it
  std::string pack;        // this model's pack ("" when it stored no new chunk)
  // Retirement (`cairn rm`): a retired model stays readable and in the lineage until `cairn gc`,
  // which deletes it, or, when live descendants need it in their lineage, keeps it "collected":
  // its manifest without tensors.
  int64_t retired_ns = 0;  // when it was retired; 0 = live
  bool collected = false;  // retired and its data released by gc

  const TensorManifest* find(std::string_view name) const;
  uint64_t logical_bytes() const;  // sum of tensor nbytes
  bool operator==(const ModelManifest&) const = default;
};

// The on-disk JSON form (docs/repository-format.md). Never throws.
nlohmann::json manifest_to_json(const ModelManifest& m);
// Strict: every field required, unknown fields rejected, each value checked (names valid, dtype
// known, nbytes == shape x itemsize == sum of chunk lengths, pack names plain file names, metadata
// and architecture nested at most kMaxManifestJsonDepth deep). kInvalidArgument names the field
// that is wrong ("tensors[2].chunks[0].length: ..."). Never throws, whatever j holds.
// with_locations = false accepts chunks without a pack (a model not yet in the repository, as
// the burst buffer records it).
Result<ModelManifest> manifest_from_json(const nlohmann::json& j, bool with_locations = true);
inline constexpr int kMaxManifestJsonDepth = 64;

// Checks what a manifest must satisfy whatever the repository: names, dtypes, byte counts, hashes
// set, chunk lengths summing to nbytes. With locations, chunk packs must be valid pack names (as
// on disk); without (a manifest handed to commit), pack and offset are ignored. kInvalidArgument
// names the field. manifest_from_json ends with it; commit and open use it too.
Status validate_manifest(const ModelManifest& m, bool with_locations);
// Checks the chunk split against the repository's chunk size: chunk i holds
// min(chunk_size, nbytes - i * chunk_size) bytes. kInvalidArgument names the tensor and chunk.
Status validate_chunking(const ModelManifest& m, uint64_t chunk_size);

}  // namespace cairn
