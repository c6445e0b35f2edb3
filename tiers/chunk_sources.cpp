#include "tiers/chunk_sources.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <vector>

#include "tiers/dram/dram_tier.hpp"

namespace cairn {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

bool NvmeSource::has(const ChunkRef& ref) const { return nvme_.contains(ref.hash); }

Status NvmeSource::read(const ChunkRef& ref, void* dst) {
  auto t0 = std::chrono::steady_clock::now();
  Status st = nvme_.read(ref.hash, dst, ref.length);
  if (st.ok()) bw_.sample(ref.length, seconds_since(t0));
  return st;
}

bool RepositorySource::has(const ChunkRef& ref) const { return !ref.pack.empty() || repo_.locate(ref.hash); }

Status RepositorySource::read(const ChunkRef& ref, void* dst) {
  // A ref without a pack (a model a peer announced before it reached the repository) is looked up,
  // refreshing the repository's view on a miss: the peer may have flushed it since.
  std::optional<ChunkRef> where =
      ref.pack.empty() ? repo_.locate(ref.hash, Freshness::kRefreshOnMiss) : std::optional<ChunkRef>(ref);
  if (!where) {
    // A recovered model's chunk can have a pack name the repository no longer knows (gc).
    where = repo_.locate(ref.hash);
    if (!where) return corruption("chunk " + ref.hash.hex() + " has no intact copy in any tier");
  }
  auto t0 = std::chrono::steady_clock::now();
  Status st;
  if (dram_ && where->coding == ChunkCoding::kDelta) {
    // The base pinned while it is read from, unpinned after.
    std::vector<ChunkHash> pinned;
    Repository::ChunkSource resident = [&](const ChunkHash& h, uint64_t length) -> Result<const void*> {
      uint64_t held = 0;
      auto off = dram_->pin_if_resident(h, &held);
      if (!off) return not_found("not in DRAM");
      pinned.push_back(h);
      if (held < length) return not_found("not whole in DRAM");
      return static_cast<const void*>(dram_->base() + *off);
    };
    st = repo_.read_chunk(*where, dst, resident);
    for (const ChunkHash& h : pinned) dram_->unpin(h);
  } else {
    st = repo_.read_chunk(*where, dst);
  }
  if (st.ok()) bw_.sample(ref.length, seconds_since(t0));
  return st;
}

void RepositorySource::will_read(std::span<const ChunkRef* const> refs) {
  if (repo_.direct_reads()) return;  // the reads bypass the page cache: readahead would read twice
  std::map<std::string, int> fds;
  auto advise = [&](const ChunkRef& c) {
    auto [it, added] = fds.emplace(c.pack, -1);
    if (added) it->second = ::open((repo_.dir() + "/packs/" + c.pack).c_str(), O_RDONLY | O_CLOEXEC);
    if (it->second >= 0)
      ::posix_fadvise(it->second, static_cast<off_t>(c.offset), static_cast<off_t>(c.stored_bytes()),
                      POSIX_FADV_WILLNEED);
  };
  for (const ChunkRef* c : refs) {
    if (c->pack.empty()) continue;
    advise(*c);
    if (c->base) advise(*c->base);  // a delta is decoded with its base
  }
  for (const auto& [pack, fd] : fds)
    if (fd >= 0) ::close(fd);
}

}  // namespace cairn
