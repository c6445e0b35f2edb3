// HashQueue: the hashes of every piece land where they were asked to, whoever computes them; cancel
// and destruction leave no thread reading the caller's bytes.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "core/hash.hpp"
#include "core/hash_queue.hpp"

namespace {

std::vector<uint8_t> bytes(size_t n, unsigned seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed) ^ (i >> 10));
  return v;
}

}  // namespace

TEST_CASE("HashQueue hashes every piece of every buffer, on its threads and the caller's", "[hash]") {
  const uint64_t chunk = 64 << 10;
  for (unsigned threads : {1u, 2u, 4u, 0u}) {
    INFO("threads " << threads);
    cairn::HashQueue q;
    std::vector<std::vector<uint8_t>> bufs;
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{chunk}, size_t{chunk + 1}, size_t{7 * chunk + 333}, size_t{40 * chunk}})
      bufs.push_back(bytes(n, static_cast<unsigned>(n)));
    std::vector<std::vector<cairn::ChunkHash>> got(bufs.size());
    for (size_t b = 0; b < bufs.size(); ++b) {
      got[b].resize(cairn::chunk_count(bufs[b].size(), chunk));
      q.add(bufs[b].data(), bufs[b].size(), chunk, got[b].data(), threads);
    }
    q.finish();
    for (size_t b = 0; b < bufs.size(); ++b) {
      INFO("buffer of " << bufs[b].size() << " bytes");
      CHECK(got[b] == cairn::hash_chunks(bufs[b].data(), bufs[b].size(), chunk));
    }
    // A queue that finished takes work again.
    auto more = bytes(3 * chunk, 9);
    std::vector<cairn::ChunkHash> h(3);
    q.add(more.data(), more.size(), chunk, h.data(), threads);
    q.finish();
    CHECK(h == cairn::hash_chunks(more.data(), more.size(), chunk));
  }
}

TEST_CASE("HashQueue::cancel drops queued pieces and returns only when no thread reads the bytes", "[hash]") {
  const uint64_t chunk = 1 << 20;
  for (int round = 0; round < 20; ++round) {
    auto* buf = new std::vector<uint8_t>(bytes(32 * chunk, static_cast<unsigned>(round)));
    std::vector<cairn::ChunkHash> h(32);
    {
      cairn::HashQueue q;
      q.add(buf->data(), buf->size(), chunk, h.data(), 2);
      if (round % 2) q.cancel();  // else the destructor cancels
    }
    delete buf;  // ASan reports a thread still reading it
  }
  // Cancelled with nothing queued, twice, then used.
  cairn::HashQueue q;
  q.cancel();
  q.cancel();
  auto b = bytes(2 * chunk, 1);
  std::vector<cairn::ChunkHash> h(2);
  q.add(b.data(), b.size(), chunk, h.data(), 1);
  q.finish();
  CHECK(h == cairn::hash_chunks(b.data(), b.size(), chunk));
}
