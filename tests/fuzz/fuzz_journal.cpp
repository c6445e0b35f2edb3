// Fuzzes the burst buffer's journal replay (NvmeTier::open). The journal is a valid one, written by
// the tier itself, cut at a point the input chooses and followed, or overwritten, by the input's
// bytes. Whatever it holds, open either fails with a message or recovers a state whose pending
// models are in order, and the tier keeps working: a put, then a reopen of the journal it wrote,
// which must find the chunk byte-exact.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/fs.hpp"
#include "tiers/nvme/nvme_tier.hpp"

namespace {

constexpr uint64_t kCapacity = 1ull << 20;

std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return v;
}

std::unique_ptr<cairn::NvmeTier> open_tier(cairn::FileSystem& fs) {
  cairn::NvmeTier::Options o;
  o.path = "/bb";
  o.capacity = kCapacity;
  o.persistent = true;
  o.fs = &fs;
  auto t = cairn::NvmeTier::open(std::move(o));
  if (!t.ok()) return nullptr;
  return std::move(t).value();
}

// A data file and a journal written by the tier: chunks (dirty and clean, one removed, one cleaned)
// and two pending models, one done.
struct Valid {
  std::string data, journal;
};
const Valid& valid() {
  static Valid* v = [] {
    cairn::MemoryFileSystem fs;
    auto t = open_tier(fs);
    if (!t) std::abort();
    std::vector<std::vector<uint8_t>> chunks;
    for (int i = 0; i < 6; ++i) chunks.push_back(bytes(1000 + 5000 * static_cast<size_t>(i), static_cast<uint8_t>(i)));
    for (size_t i = 0; i < chunks.size(); ++i) {
      cairn::NvmeTier::Put p{cairn::hash_bytes(chunks[i].data(), chunks[i].size()), chunks[i].data(), chunks[i].size(),
                             i % 2 == 0};
      if (!t->put(std::span<const cairn::NvmeTier::Put>(&p, 1)).ok()) std::abort();
    }
    t->remove(cairn::hash_bytes(chunks[1].data(), chunks[1].size()));
    t->mark_clean(cairn::hash_bytes(chunks[2].data(), chunks[2].size()));
    if (!t->put_model(1, "a", "{\"x\":1}").ok() || !t->put_model(2, "b", "{}").ok()) std::abort();
    (void)t->model_done("a");
    t.reset();  // as a crash leaves it (no close)
    auto* out = new Valid;
    for (auto [name, dst] : {std::pair{"/bb/data", &out->data}, std::pair{"/bb/journal", &out->journal}}) {
      auto f = fs.open(name, cairn::kRead);
      if (!f.ok()) std::abort();
      uint64_t n = *(*f)->size();
      dst->resize(n);
      size_t got = 0;
      if (!(*f)->pread(dst->data(), n, 0, &got).ok()) std::abort();
    }
    return out;
  }();
  return *v;
}

void write_file(cairn::FileSystem& fs, const std::string& path, const std::string& content) {
  auto f = fs.open(path, cairn::kCreate | cairn::kTruncate);
  if (!f.ok()) std::abort();
  if (!content.empty() && !(*f)->pwrite(content.data(), content.size(), 0).ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Valid& v = valid();
  if (size < 3) return 0;
  // Byte 0: mode; bytes 1-2: where the input goes in the valid journal.
  const size_t at = (static_cast<size_t>(data[1]) << 8 | data[2]) % (v.journal.size() + 1);
  std::string journal = v.journal.substr(0, at);
  const char* in = reinterpret_cast<const char*>(data + 3);
  const size_t n = size - 3;
  if (data[0] & 1) {
    journal.append(in, n);  // a valid prefix, then anything
  } else {
    journal = v.journal;  // the valid journal with bytes overwritten from `at`
    for (size_t i = 0; i < n && at + i < journal.size(); ++i)
      journal[at + i] = static_cast<char>(journal[at + i] ^ in[i]);
  }
  cairn::MemoryFileSystem fs;
  if (!fs.make_dirs("/bb").ok()) std::abort();
  write_file(fs, "/bb/data", v.data);
  write_file(fs, "/bb/journal", journal);
  auto t = open_tier(fs);
  if (!t) return 0;
  const auto& report = t->open_report();
  for (size_t i = 1; i < report.pending.size(); ++i)
    if (report.pending[i - 1].seq > report.pending[i].seq) std::abort();
  // The tier still works: a put, then a reopen that finds it.
  std::vector<uint8_t> extra = bytes(777, 99);
  cairn::ChunkHash eh = cairn::hash_bytes(extra.data(), extra.size());
  cairn::NvmeTier::Put p{eh, extra.data(), extra.size(), true};
  bool put_ok = t->put(std::span<const cairn::NvmeTier::Put>(&p, 1)).ok();
  t.reset();
  auto again = open_tier(fs);
  if (!again) std::abort();  // a journal the tier wrote itself must open
  if (put_ok && !again->contains(eh)) std::abort();
  std::vector<uint8_t> back(extra.size());
  if (put_ok && !again->read(eh, back.data(), back.size()).ok()) std::abort();
  if (put_ok && back != extra) std::abort();
  return 0;
}
