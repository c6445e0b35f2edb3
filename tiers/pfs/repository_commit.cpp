// The write path: commit writes a model's new chunks to a pack of its own and then its manifest;
// write_manifest rewrites a manifest in place (retire and gc use it).
//
// Crash-safety: both files are published with AtomicFileWriter (temporary name, fsync, rename,
// directory fsync), the pack before the manifest, so a model becomes visible (on disk, then in the
// catalog) only once everything it references is durable; a crash in between leaves a pack no
// manifest references, which the next open removes. Commit never writes into an existing pack:
// each pack is written once, whole, under a name no other file has.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/safetensors.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;
using pfs::AtomicFileWriter;
using pfs::join_path;
using pfs::kPackSuffix;
using pfs::quote;
using pfs::starts_with;

constexpr std::string_view kChunkEntryPrefix = "__chunk__.";

// v as 16 lowercase hex digits (a pack name's creation-time part).
std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return std::string(buf, 16);
}

// Whether anything (a dangling link included) is at path.
bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

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

}  // namespace cairn
