// Reads: read_chunk, and the cache of packs open for reading that it goes through.
//
// Reads run in parallel with everything: they never take write_mu_ or mu_ (a ChunkRef says where
// the bytes are), only fd_mu_ while they find or open the pack. They never write, and never trust
// the bytes they read: each chunk is checked against its hash before it is returned.
//
// Packs are read with direct I/O where the filesystem allows it (File::direct()): a chunk is read
// cold at most once per daemon (the DRAM and NVMe tiers keep it after that), so the page cache
// would only hold a second copy, and its readahead and the copy out of it cost more than the read.
// A chunk's offset in its pack is not aligned, so the aligned range around it is read into a
// scratch buffer in pieces, and each piece is copied to the caller and hashed while the next is
// read (each 64 KiB block hashed while it is in the cache: one pass over the bytes, not two). The
// scratch buffers ask for huge pages (AlignedBuffer): the block layer then sends large requests.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tiers/pfs/repository_impl.hpp"

namespace cairn {
namespace {

using pfs::join_path;
using pfs::kMaxChunkSize;
using pfs::quote;
using pfs::valid_pack_name;

constexpr size_t kMaxOpenPacks = 64;  // read file descriptors kept open

// Direct reads: the pieces a chunk is read in (each piece is copied and hashed while the next is
// read), and the scratch buffers kept for the next reads (a few, each up to kKeepScratch: one per
// concurrent cold read).
constexpr uint64_t kDirectPiece = 4ull << 20;
constexpr size_t kIdleScratch = 12;
constexpr uint64_t kKeepScratch = 64ull << 20;

uint64_t round_down(uint64_t v) { return v / kDirectAlignment * kDirectAlignment; }
uint64_t round_up(uint64_t v) { return round_down(v + kDirectAlignment - 1); }

}  // namespace

Result<std::shared_ptr<File>> Repository::Impl::pack_file(const std::string& pack) const {
  std::lock_guard lock(fd_mu_);
  auto it = fds_.find(pack);
  if (it != fds_.end()) return it->second;
  std::string path = join_path(packs_dir_, pack);
  Result<std::unique_ptr<File>> f = fs_->open(path, options_.direct_reads ? kRead | kDirect : kRead);
  if (!f.ok()) {
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

std::unique_ptr<AlignedBuffer> Repository::Impl::take_scratch(uint64_t n) const {
  {
    std::lock_guard lock(scratch_mu_);
    for (size_t i = 0; i < scratch_.size(); ++i)
      if (scratch_[i]->size() >= n) {
        std::unique_ptr<AlignedBuffer> b = std::move(scratch_[i]);
        scratch_.erase(scratch_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
  }
  // Sized to the chunk size (the usual chunk) so that it serves the next ones too.
  auto b = std::make_unique<AlignedBuffer>(std::max(n, round_up(chunk_size_) + 2 * kDirectAlignment));
  if (!b->data()) return nullptr;
  return b;
}

void Repository::Impl::give_back_scratch(std::unique_ptr<AlignedBuffer> b) const {
  if (!b || b->size() > kKeepScratch) return;
  std::lock_guard lock(scratch_mu_);
  if (scratch_.size() < kIdleScratch) scratch_.push_back(std::move(b));
}

// Reads [offset, offset + length) of a pack opened with direct I/O into dst and hashes it.
// *got is how many of the chunk's bytes the pack holds (less when it ends early).
Status Repository::Impl::read_direct(File& file, const ChunkRef& ref, void* dst, size_t* got, ChunkHash* hash) const {
  const uint64_t begin = round_down(ref.offset);
  const uint64_t head = ref.offset - begin;
  const uint64_t span = round_up(head + ref.length);
  std::unique_ptr<AlignedBuffer> scratch = take_scratch(span);
  if (!scratch)
    return no_space("no memory for a " + std::to_string(span) + "-byte buffer to read chunk " + ref.hash.hex());
  uint8_t* buf = scratch->data();
  // The range is read in pieces, one after another, on a thread of its own, while this one copies
  // and hashes each piece as soon as it is in: the copy overlaps the next piece's read, instead of
  // following the whole range's (the difference between disk speed and disk plus copy). A short
  // piece is the end of the pack.
  std::mutex mu;
  std::condition_variable arrived;
  uint64_t in = 0;  // bytes of buf read so far
  bool over = false;
  Status st;
  auto read_pieces = [&] {
    for (uint64_t p = 0; p < span;) {
      const size_t n = static_cast<size_t>(std::min(kDirectPiece, span - p));
      size_t piece = 0;
      Status s = file.pread(buf + p, n, begin + p, &piece);
      std::lock_guard lock(mu);
      if (!s.ok())
        st = std::move(s);
      else
        in = p += piece;
      if (!st.ok() || piece < n) break;
      arrived.notify_one();
    }
    std::lock_guard lock(mu);
    over = true;
    arrived.notify_one();
  };
  // ready(n): the first n bytes of the chunk are in buf (after the head), or the reads are over.
  auto ready = [&](uint64_t n) -> uint64_t {
    std::unique_lock lock(mu);
    arrived.wait(lock, [&] { return over || in >= head + n; });
    return in > head ? in - head : 0;
  };
  std::thread reader;
  if (span > kDirectPiece) {
    try {
      reader = std::thread(read_pieces);
    } catch (const std::system_error&) {
      read_pieces();  // no thread to be had: read first, then copy
    }
  } else {
    read_pieces();
  }
  const ChunkHash h = copy_and_hash_as_ready(dst, buf + head, ref.length, ready);
  if (reader.joinable()) reader.join();
  if (st.ok()) {
    *got = static_cast<size_t>(std::min<uint64_t>(ref.length, in - std::min(in, head)));
    if (*got == ref.length) *hash = h;
  }
  give_back_scratch(std::move(scratch));
  return st;
}

Status Repository::Impl::read_coded(File& file, const ChunkRef& ref, void* dst,
                                    const Repository::ChunkSource* resident) const {
  const std::string path = join_path(packs_dir_, ref.pack);
  const uint64_t n = ref.stored_bytes();
  std::string where = "chunk " + ref.hash.hex() + " (" + std::string(chunk_coding_name(ref.coding)) + ", " +
                      std::to_string(n) + " bytes stored) at offset " + std::to_string(ref.offset) + " of pack " + path;
  // Buffers from the pool of scratch buffers (never zeroed, reused by the next reads).
  struct Scratch {
    const Repository::Impl& impl;
    std::unique_ptr<AlignedBuffer> b;
    ~Scratch() { impl.give_back_scratch(std::move(b)); }
  };
  // A delta's base first (itself checked against its hash): from the caller's memory when it holds
  // it, else read.
  Scratch base{*this, nullptr};
  const void* base_bytes = nullptr;
  if (ref.coding == ChunkCoding::kDelta && !ref.base) return corruption(where + ": a delta without its base");
  if (ref.coding == ChunkCoding::kDelta && resident && *resident) {
    Result<const void*> r = (*resident)(ref.base->hash, ref.length);
    if (r.ok() && *r != nullptr && hash_bytes(*r, ref.length) == ref.base->hash) base_bytes = *r;
  }
  if (ref.coding == ChunkCoding::kDelta && base_bytes == nullptr) {
    base.b = take_scratch(ref.length);
    if (!base.b) return no_space("no memory for a " + std::to_string(ref.length) + "-byte buffer to read " + where);
    Status s = read_chunk(*ref.base, base.b->data());
    if (!s.ok()) return s.with_context("reading the base of " + where);
    base_bytes = base.b->data();
  }
  // The stored bytes, through a scratch buffer (aligned for direct I/O).
  std::unique_ptr<AlignedBuffer> scratch;
  const uint8_t* stored = nullptr;
  size_t got = 0;
  if (file.direct()) {
    const uint64_t begin = round_down(ref.offset);
    const uint64_t head = ref.offset - begin;
    const uint64_t span = round_up(head + n);
    scratch = take_scratch(span);
    if (!scratch) return no_space("no memory for a " + std::to_string(span) + "-byte buffer to read " + where);
    size_t in = 0;
    Status s = file.pread(scratch->data(), span, begin, &in);
    if (!s.ok()) {
      give_back_scratch(std::move(scratch));
      return s.with_context("reading " + where);
    }
    got = in > head ? std::min<uint64_t>(n, in - head) : 0;
    stored = scratch->data() + head;
  } else {
    scratch = take_scratch(n);
    if (!scratch) return no_space("no memory for a " + std::to_string(n) + "-byte buffer to read " + where);
    Status s = file.pread(scratch->data(), n, ref.offset, &got);
    if (!s.ok()) {
      give_back_scratch(std::move(scratch));
      return s.with_context("reading " + where);
    }
    stored = scratch->data();
  }
  Status st;
  if (got != n) {
    st = corruption(where + ": the pack ends after " + std::to_string(got) +
                    " of its bytes (truncated); restore the pack from a copy");
  } else {
    st = decode_chunk(ref.coding, stored, n, base_bytes, dst, ref.length);
    if (!st.ok())
      st = corruption(where + ": the stored bytes do not decode (" + st.message() + "); restore the pack from a copy");
  }
  if (scratch) give_back_scratch(std::move(scratch));
  CAIRN_RETURN_IF_ERROR(st);
  if (hash_bytes(dst, ref.length) != ref.hash)
    return corruption(where + ": the decoded bytes do not match the chunk's hash; restore the pack from a copy");
  return Status::OK();
}

Status Repository::Impl::read_chunk(const ChunkRef& ref, void* dst, const Repository::ChunkSource* resident) const {
  if (!valid_pack_name(ref.pack))
    return invalid_argument("reading chunk " + ref.hash.hex() + ": " + quote(ref.pack) + " is not a pack file name");
  if (ref.length == 0 || ref.length > kMaxChunkSize || ref.offset > UINT64_MAX - ref.stored_bytes() ||
      ref.stored_bytes() > kMaxChunkSize + (1u << 20))
    return invalid_argument("reading chunk " + ref.hash.hex() + " from pack " + ref.pack + ": bad length " +
                            std::to_string(ref.length) + " or offset " + std::to_string(ref.offset));
  CAIRN_ASSIGN_OR_RETURN(std::shared_ptr<File> file, pack_file(ref.pack));
  if (ref.coding != ChunkCoding::kRaw) return read_coded(*file, ref, dst, resident);
  std::string path = join_path(packs_dir_, ref.pack);
  size_t got = 0;
  ChunkHash hash;
  if (file->direct()) {
    CAIRN_RETURN_IF_ERROR(read_direct(*file, ref, dst, &got, &hash));
  } else {
    CAIRN_RETURN_IF_ERROR(file->pread(dst, static_cast<size_t>(ref.length), ref.offset, &got));
    if (got == ref.length) hash = hash_bytes(dst, static_cast<size_t>(ref.length));
  }
  std::string where = "chunk " + ref.hash.hex() + " at offset " + std::to_string(ref.offset) + " (" +
                      std::to_string(ref.length) + " bytes) of pack " + path;
  if (got != ref.length)
    return corruption(where + ": the pack ends after " + std::to_string(got) +
                      " of its bytes (truncated); restore the pack from a copy");
  if (hash != ref.hash)
    return corruption(where +
                      ": the bytes do not match the chunk's hash; restore the pack from a "
                      "copy");
  return Status::OK();
}

}  // namespace cairn
