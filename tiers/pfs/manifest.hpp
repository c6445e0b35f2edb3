// A model's manifest: what the repository knows of one model (its tensors, the chunks that make
// them up and where each chunk is stored), and its on-disk JSON form (docs/repository-format.md).
//
// Owns no state and does no I/O: these are values, their codec and their checks. The repository
// (tiers/pfs/repository.hpp, which includes this header) stores and reads them; the burst buffer
// records manifests of models not yet committed (without chunk locations).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/hash.hpp"
#include "core/status.hpp"

namespace cairn {

// Where a chunk's bytes are in the repository.
struct ChunkRef {
  ChunkHash hash;
  uint64_t length = 0;
  std::string pack;     // file name under packs/ (filled in by commit)
  uint64_t offset = 0;  // absolute byte offset in the pack file
  bool operator==(const ChunkRef&) const = default;
};

struct TensorManifest {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::vector<ChunkRef> chunks;  // in order; chunk i covers [i*chunk_size, ...) of the tensor
  bool operator==(const TensorManifest&) const = default;
};

struct ModelManifest {
  std::string id;
  std::string parent;             // "" = none
  nlohmann::json metadata = nlohmann::json::object();
  nlohmann::json architecture;    // null when none was given
  std::vector<TensorManifest> tensors;
  // The original safetensors header (8-byte length + JSON) when the model was stored from a file,
  // so `cairn get` of the whole model reproduces the file byte for byte. "" otherwise.
  std::string source_header;
  int64_t created_ns = 0;         // wall clock; commit keeps a given one that follows the last, else sets it
  std::string pack;               // this model's pack ("" when it stored no new chunk)
  // Retirement (`cairn rm`): a retired model stays readable and in the lineage until `cairn gc`,
  // which deletes it, or, when live descendants need it in their lineage, keeps it "collected":
  // its manifest without tensors.
  int64_t retired_ns = 0;         // when it was retired; 0 = live
  bool collected = false;         // retired and its data released by gc

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
