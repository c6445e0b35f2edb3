// The public Repository (repository.hpp): a thin facade over Repository::Impl. Each operation
// forwards to Impl (repository_impl.hpp says which file implements what); the catalog lookups read
// the catalog here, under its shared lock.
//
// Never writes a file and never changes the catalog itself.
#include "tiers/pfs/repository.hpp"

#include <memory>
#include <shared_mutex>
#include <utility>

#include "core/fs.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using pfs::quote;

}  // namespace

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
