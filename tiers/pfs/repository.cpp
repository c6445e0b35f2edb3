// The public Repository (repository.hpp): a thin facade over Repository::Impl. Each operation
// forwards to Impl (repository_impl.hpp says which file implements what); the catalog lookups read
// the catalog here, under its shared lock; a lookup that misses refreshes first (the model may be
// another writer's) and looks again.
//
// Never writes a file and never changes the catalog itself.
#include "tiers/pfs/repository.hpp"

#include <filesystem>
#include <memory>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/fs.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using pfs::quote;

// Files under dir, recursively (what a parallel filesystem's metadata servers hold for it).
uint64_t count_files(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) ++n;
  return n;
}

}  // namespace

Repository::Repository(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Repository::~Repository() = default;

Result<std::unique_ptr<Repository>> Repository::open(const std::string& dir, uint64_t chunk_size, FileSystem* fs,
                                                     const RepositoryOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->fs_ = fs != nullptr ? fs : &posix_fs();
  impl->options_ = options;
  CAIRN_RETURN_IF_ERROR(impl->open(dir, chunk_size));
  return std::unique_ptr<Repository>(new Repository(std::move(impl)));
}

uint64_t Repository::chunk_size() const { return impl_->chunk_size_; }
const std::string& Repository::dir() const { return impl_->dir_; }
bool Repository::writable() const { return impl_->writable_; }
const std::string& Repository::writer_id() const { return impl_->wid(); }

Status Repository::commit(ModelManifest& m, const ChunkSource& src, const ChunkSource& resident) {
  std::vector<ModelManifest> one;
  one.push_back(std::move(m));
  std::vector<Status> results;
  Status s = impl_->commit_batch(one, src, &results, resident);
  m = std::move(one[0]);
  return s;
}

Status Repository::commit_batch(std::vector<ModelManifest>& ms, const ChunkSource& src, std::vector<Status>* results,
                                const ChunkSource& resident) {
  return impl_->commit_batch(ms, src, results, resident);
}

Status Repository::claim(const std::string& id) {
  if (!impl_->writable_) return impl_->check_writable();
  CAIRN_RETURN_IF_ERROR(impl_->coord_->claim(id));
  // The id may have been published before our claim: look at every log now.
  RefreshReport ignored;
  Status s = impl_->refresh(&ignored);
  if (s.ok() && contains(id, Freshness::kCached))
    s = already_exists("model " + quote(id) + " is already in repository " + impl_->dir_ +
                       "; models are immutable, commit under a new id");
  if (!s.ok()) impl_->coord_->release(id);
  return s;
}

void Repository::release_claim(const std::string& id) { impl_->coord_->release(id); }

Result<RefreshReport> Repository::refresh() {
  RefreshReport ignored;
  CAIRN_RETURN_IF_ERROR(impl_->refresh(&ignored));
  // Everything other writers' records changed since the last call, whichever refresh read them.
  WriterLock lock(impl_->mu_);
  RefreshReport r = std::move(impl_->unreported_);
  impl_->unreported_ = RefreshReport{};
  return r;
}

Result<CompactReport> Repository::compact() {
  CompactReport r;
  CAIRN_RETURN_IF_ERROR(impl_->compact(&r, /*take_lease=*/true));
  return r;
}

Result<CompactReport> Repository::compact_if_needed() {
  CompactReport r;
  if (!impl_->writable_ || impl_->options_.compact_after_logs == 0) return r;
  size_t dead_logs = 0;
  {
    std::lock_guard lock(impl_->refresh_mu_);
    for (const auto& [name, off] : impl_->read_to_)
      if (!impl_->owner_may_append(name)) ++dead_logs;
  }
  if (dead_logs < impl_->options_.compact_after_logs) return r;
  Status s = impl_->compact(&r, /*take_lease=*/true, std::chrono::milliseconds(0));
  if (s.code() == StatusCode::kBusy) return CompactReport{};  // another process compacts or collects
  CAIRN_RETURN_IF_ERROR(s);
  return r;
}

std::shared_ptr<const ModelManifest> Repository::find(const std::string& id, Freshness fresh) const {
  for (int pass = 0; pass < 2; ++pass) {
    {
      ReaderLock lock(impl_->mu_);
      auto it = impl_->models_.find(id);
      if (it != impl_->models_.end()) return it->second;
    }
    if (pass == 0 && fresh == Freshness::kRefreshOnMiss) {
      RefreshReport ignored;
      (void)impl_->refresh(&ignored);
    }
  }
  return nullptr;
}

bool Repository::contains(const std::string& id, Freshness fresh) const { return find(id, fresh) != nullptr; }

Result<ModelManifest> Repository::get(const std::string& id, Freshness fresh) const {
  auto m = find(id, fresh);
  if (!m) return not_found("model " + quote(id) + " is not in repository " + impl_->dir_);
  return *m;
}

std::vector<std::string> Repository::list() const {
  ReaderLock lock(impl_->mu_);
  return impl_->order_;
}

std::vector<std::string> Repository::children(const std::string& id) const {
  ReaderLock lock(impl_->mu_);
  auto it = impl_->children_.find(id);
  if (it == impl_->children_.end()) return {};
  return it->second;
}

std::optional<ChunkRef> Repository::locate(const ChunkHash& hash, Freshness fresh) const {
  for (int pass = 0; pass < 2; ++pass) {
    {
      ReaderLock lock(impl_->mu_);
      auto it = impl_->chunks_.find(hash);
      if (it != impl_->chunks_.end()) return it->second.ref;
    }
    if (pass == 0 && fresh == Freshness::kRefreshOnMiss) {
      RefreshReport ignored;  // as in find: the watch still gets its report
      (void)impl_->refresh(&ignored);
    } else {
      break;
    }
  }
  return std::nullopt;
}

Status Repository::read_chunk(const ChunkRef& ref, void* dst) const { return impl_->read_chunk(ref, dst); }
Status Repository::read_chunk(const ChunkRef& ref, void* dst, const ChunkSource& resident) const {
  return impl_->read_chunk(ref, dst, &resident);
}
bool Repository::direct_reads() const { return impl_->options_.direct_reads; }

Status Repository::remove(const std::string& id) { return impl_->remove(id); }
Status Repository::retire(const std::string& id) { return impl_->retire(id); }
Result<GcReport> Repository::gc(const GcSteps& steps) { return impl_->gc(steps); }
Result<FsckReport> Repository::fsck(bool verify_data, OperationProgress* progress) const {
  return impl_->fsck(verify_data, progress);
}

Result<std::shared_ptr<const ModelManifest>> Repository::get_shared(const std::string& id, Freshness fresh) const {
  auto m = find(id, fresh);
  if (!m) return not_found("model " + quote(id) + " is not in repository " + impl_->dir_);
  return m;
}

RepositoryStats Repository::stats() const {
  RepositoryStats s;
  s.files = count_files(impl_->dir_);
  s.writers_alive = 0;
  for (const std::string& w : impl_->coord_->registered_writers())
    if (impl_->coord_->alive(w)) ++s.writers_alive;
  if (!impl_->coord_->registered()) ++s.writers_alive;  // this handle, before its first write
  {
    std::lock_guard lock(impl_->sync_mu_);
    s.group_syncs = impl_->group_syncs_;
  }
  ReaderLock lock(impl_->mu_);
  s.models = impl_->models_.size();
  s.packs = impl_->packs_.size();
  s.logical_bytes = impl_->logical_bytes_;
  s.physical_bytes = impl_->physical_bytes_;
  s.stored_bytes = impl_->stored_bytes_;
  s.codings = impl_->codings_;
  s.chunks = impl_->chunks_.size();
  s.retired = impl_->retired_;
  return s;
}

Result<ModelUsage> Repository::usage(const std::string& id, Freshness fresh) const {
  if (!find(id, fresh)) return not_found("model " + quote(id) + " is not in repository " + impl_->dir_);
  ReaderLock lock(impl_->mu_);
  auto mit = impl_->models_.find(id);
  if (mit == impl_->models_.end()) return not_found("model " + quote(id) + " is not in repository " + impl_->dir_);
  // Locations as (pack, offset): the same bytes stored twice are two locations.
  using Place = std::pair<std::string_view, uint64_t>;
  struct PlaceHash {
    size_t operator()(const Place& p) const { return std::hash<std::string_view>()(p.first) * 31 + p.second; }
  };
  auto places_of = [](const ModelManifest& m, std::unordered_map<Place, const ChunkRef*, PlaceHash>* into) {
    for (const TensorManifest& t : m.tensors)
      for (const ChunkRef& c : t.chunks)
        for_each_location(c, [&](const ChunkRef& at) { into->emplace(Place{at.pack, at.offset}, &at); });
  };
  ModelUsage u;
  u.id = id;
  const ModelManifest& m = *mit->second;
  u.logical_bytes = m.logical_bytes();
  std::unordered_map<Place, const ChunkRef*, PlaceHash> own, ancestors;
  places_of(m, &own);
  std::unordered_set<std::string> seen{id};
  for (std::string p = m.parent; !p.empty() && seen.insert(p).second;) {
    auto pit = impl_->models_.find(p);
    if (pit == impl_->models_.end()) break;
    ++u.ancestors;
    places_of(*pit->second, &ancestors);
    p = pit->second->parent;
  }
  for (const auto& [place, c] : own) {
    ++u.chunks;
    u.raw_bytes += c->length;
    u.stored_bytes += c->stored_bytes();
    if (!ancestors.count(place)) {
      u.own_raw_bytes += c->length;
      u.own_stored_bytes += c->stored_bytes();
    }
  }
  u.lineage_stored_bytes = u.own_stored_bytes;
  for (const auto& [place, c] : ancestors) u.lineage_stored_bytes += c->stored_bytes();
  return u;
}

}  // namespace cairn
