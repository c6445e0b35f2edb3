// Reads: read_chunk, and the cache of packs open for reading that it goes through.
//
// Reads run in parallel with everything: they never take write_mu_ or mu_ (a ChunkRef says where
// the bytes are), only fd_mu_ while they find or open the pack. They never write, and never trust
// the bytes they read: each chunk is checked against its hash before it is returned.
#include <cstdint>
#include <memory>
#include <string>

#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using pfs::join_path;
using pfs::kMaxChunkSize;
using pfs::quote;
using pfs::valid_pack_name;

constexpr size_t kMaxOpenPacks = 64;  // read file descriptors kept open

}  // namespace

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

}  // namespace cairn
