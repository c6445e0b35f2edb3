// Version 1 of the repository (one manifest file and one pack per model) and its migration to
// version 2. load_v1 reads and checks the manifests as version 1's open did (without its clean-up);
// migrate_v1 makes them a checkpoint: a version-1 pack is a valid version-2 pack, so no byte of
// data moves.
//
// Crash-safety (docs/repository-format.md, "Migration"): the checkpoint is published (atomic
// rename) before FORMAT says 2 (atomic rename), and the manifests are deleted only after. Killed
// before FORMAT changes, the repository is still version 1 and the next open migrates again
// (replacing the unpublished checkpoint); killed after, it is version 2 and open deletes the
// manifests left over.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/log.hpp"
#include "core/safetensors.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using json = nlohmann::json;
using pfs::ends_with;
using pfs::join_path;
using pfs::kManifestSuffix;
using pfs::kTmpPrefix;
using pfs::list_dir;
using pfs::pread_all;
using pfs::quote;
using pfs::starts_with;
using pfs::UniqueFd;

// Version 1's manifest file name: the hash of the id.
std::string manifest_file(const std::string& id) {
  return hash_bytes(id.data(), id.size()).hex() + std::string(kManifestSuffix);
}

constexpr uint64_t kMaxManifestBytes = 1ull << 30;  // sanity bound when reading a manifest

// A manifest load_v1 has read, and the file it came from.
struct LoadedModel {
  std::shared_ptr<ModelManifest> m;
  std::string file;
};

}  // namespace

Status Repository::Impl::migrate_v1() {
  CAIRN_RETURN_IF_ERROR(coord_->take_lease("migrating repository " + dir_ + " to version 2", std::chrono::minutes(5)));
  struct Release {
    pfs::Coordination* c;
    ~Release() { c->release_lease(); }
  } release{coord_.get()};
  int version = 0;
  CAIRN_RETURN_IF_ERROR(init_or_read_format(chunk_size_, &version));
  if (version != 1) return Status::OK();  // another process migrated it while we waited
  std::vector<std::shared_ptr<ModelManifest>> models;
  CAIRN_RETURN_IF_ERROR(load_v1(&models).with_context("migrating repository " + dir_ + " to version 2"));
  for (const std::string& sub : {packs_dir_, ckpt_dir_}) {
    if (::mkdir(sub.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("creating directory " + sub, errno);
  }
  std::vector<std::shared_ptr<const ModelManifest>> cmodels(models.begin(), models.end());
  CAIRN_RETURN_IF_ERROR(publish_checkpoint(1, {}, cmodels).with_context("migrating repository " + dir_));
  CAIRN_RETURN_IF_ERROR(write_format(2).with_context("migrating repository " + dir_));
  CAIRN_RETURN_IF_ERROR(fs_->remove_all(join_path(dir_, pfs::kManifestsDir)));
  CAIRN_LOG_INFO("migrated repository {} to version 2: {} models, their packs unchanged", dir_, models.size());
  return Status::OK();
}

Status Repository::Impl::load_v1(std::vector<std::shared_ptr<ModelManifest>>* out) {
  const std::string manifests_dir_ = join_path(dir_, pfs::kManifestsDir);
  // 1. Manifests.
  std::vector<std::string> names;
  bool missing = false;
  CAIRN_RETURN_IF_ERROR(list_dir(manifests_dir_, &names, &missing));
  std::vector<LoadedModel> loaded;
  std::unordered_map<std::string, size_t> by_id;
  for (const std::string& name : names) {
    std::string path = join_path(manifests_dir_, name);
    if (starts_with(name, kTmpPrefix)) continue;
    if (!ends_with(name, kManifestSuffix)) continue;  // not ours (an editor's backup, say)
    std::string text;
    Status s = read_small_file(path, kMaxManifestBytes, &text);
    if (!s.ok()) return s.code() == StatusCode::kNotFound ? corruption(s.message()) : s;
    const std::string what = "manifest " + path;
    const std::string todo = "; restore it, or move it out of manifests/ to drop that model";
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return corruption(what + " is not valid JSON" + todo);
    Result<ModelManifest> r = manifest_from_json(j);
    if (!r.ok()) return corruption(what + ": " + r.status().message() + todo);
    auto m = std::make_shared<ModelManifest>(std::move(r).value());
    if (name != manifest_file(m->id))
      return corruption(what + " holds model " + quote(m->id) + ", whose manifest is named " + manifest_file(m->id) +
                        todo);
    Status cs = validate_chunking(*m, chunk_size_);
    if (!cs.ok()) return corruption(what + ": " + cs.message() + todo);
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
  std::unordered_map<std::string, PackInfo> packs;
  std::unordered_map<std::string, uint64_t> pack_sizes;
  for (const auto& [pack, first_model] : referenced) {
    std::string path = join_path(packs_dir_, pack);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      int err = errno;
      if (err == ENOENT) {
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

  // 4. In commit order.
  std::sort(loaded.begin(), loaded.end(), [](const LoadedModel& a, const LoadedModel& b) {
    return a.m->created_ns != b.m->created_ns ? a.m->created_ns < b.m->created_ns : a.m->id < b.m->id;
  });
  out->clear();
  for (LoadedModel& lm : loaded) out->push_back(std::move(lm.m));
  return Status::OK();
}

}  // namespace cairn
