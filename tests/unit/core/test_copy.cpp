// stream_copy: the same bytes as memcpy for every size and alignment, streaming or not.
#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/copy.hpp"
#include "core/hash.hpp"
#include "core/hash_simd.hpp"

using cairn::should_stream;
using cairn::stream_copy;

TEST_CASE("stream_copy copies exactly, whatever the size and the alignments", "[copy]") {
  const size_t kMax = (3u << 20) + 12345;
  std::vector<uint8_t> src(kMax + 256), dst(kMax + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
  const size_t sizes[] = {0, 1, 63, 64, 4095, 4096, 4097, 16383, 16384, 32768, 32769, 65536 + 17, 1u << 20, kMax};
  for (size_t n : sizes) {
    for (size_t s_off : {size_t{0}, size_t{1}, size_t{64}, size_t{200}}) {
      for (size_t d_off : {size_t{0}, size_t{3}, size_t{128}, size_t{255}}) {
        for (bool streaming : {true, false}) {
          std::fill(dst.begin(), dst.end(), uint8_t{0xcd});
          stream_copy(dst.data() + d_off, src.data() + s_off, n, streaming);
          INFO("n " << n << " src offset " << s_off << " dst offset " << d_off << " streaming " << streaming);
          REQUIRE(std::memcmp(dst.data() + d_off, src.data() + s_off, n) == 0);
          // Nothing outside the destination range was touched.
          const auto untouched = [](uint8_t b) { return b == 0xcd; };
          REQUIRE(std::all_of(dst.begin(), dst.begin() + static_cast<long>(d_off), untouched));
          REQUIRE(std::all_of(dst.begin() + static_cast<long>(d_off + n), dst.end(), untouched));
        }
      }
    }
  }
}

TEST_CASE("stream_copy streams only what cannot stay in the caches", "[copy]") {
  CHECK_FALSE(should_stream(1u << 20, 1u << 20));
  CHECK_FALSE(should_stream(64u << 20, 4096));
  CHECK(should_stream(16u << 20, 64u << 10));
  CHECK(should_stream(1ull << 30, 1ull << 30));
}

TEST_CASE("copy_and_hash_chunks copies and gives hash_chunks' hashes, on any number of threads", "[copy][hash]") {
  const uint64_t chunk = 1u << 20;
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{65536}, chunk, chunk + 1, 5 * chunk + 777}) {
    std::vector<uint8_t> src(n + 1), dst(n + 1, 0xcd);
    for (uint64_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    for (unsigned threads : {1u, 2u, 4u, 64u}) {
      std::fill(dst.begin(), dst.end(), uint8_t{0xcd});
      auto got = cairn::copy_and_hash_chunks(dst.data(), src.data(), n, chunk, threads);
      INFO("n " << n << " threads " << threads);
      REQUIRE(std::memcmp(dst.data(), src.data(), n) == 0);
      REQUIRE(dst[n] == 0xcd);
      REQUIRE(got == cairn::hash_chunks(src.data(), n, chunk));
      if (n > 0) CHECK(got.front() == cairn::hash_bytes(src.data(), std::min(n, chunk)));
    }
  }
  // Several buffers at once: each job's hashes, in order, whatever the threads.
  {
    std::vector<uint64_t> sizes{3 * chunk + 5, 0, 17, chunk, 2 * chunk};
    std::vector<std::vector<uint8_t>> srcs, dsts;
    std::vector<cairn::CopyJob> jobs;
    for (size_t j = 0; j < sizes.size(); ++j) {
      srcs.emplace_back(sizes[j]);
      for (uint64_t i = 0; i < sizes[j]; ++i) srcs[j][i] = static_cast<uint8_t>((i * 31 + j * 7) >> 3);
      dsts.emplace_back(sizes[j], uint8_t{0xcd});
    }
    for (size_t j = 0; j < sizes.size(); ++j) jobs.push_back({dsts[j].data(), srcs[j].data(), sizes[j]});
    for (unsigned threads : {1u, 3u}) {
      auto got = cairn::copy_and_hash_many(jobs, chunk, threads);
      REQUIRE(got.size() == sizes.size());
      for (size_t j = 0; j < sizes.size(); ++j) {
        INFO("job " << j << " threads " << threads);
        REQUIRE(dsts[j] == srcs[j]);
        REQUIRE(got[j] == cairn::hash_chunks(srcs[j].data(), sizes[j], chunk));
      }
    }
    CHECK(cairn::copy_and_hash_many({}, chunk, 4).empty());
  }
  // hash_bytes (the widest build of xxh3 the CPU runs) and libxxhash agree.
  std::vector<uint8_t> buf(3 * chunk + 5);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i ^ (i >> 9));
  for (size_t n : {size_t{0}, size_t{3}, size_t{240}, size_t{4097}, buf.size()}) {
    const XXH128_hash_t want = XXH3_128bits(buf.data(), n);
    CHECK(cairn::hash_bytes(buf.data(), n) == cairn::ChunkHash{want.high64, want.low64});
  }
}

#if defined(CAIRN_HASH_SIMD)
// Each vector build of xxh3 the CPU runs (not only the one hash_bytes picks) gives libxxhash's
// hashes, through each of its three calls, for lengths on both sides of xxh3's internal block
// sizes and of the 64 KiB copy block.
template <class Hash, class Copy, class Ready>
void check_simd_build(const char* isa, Hash hash, Copy copy, Ready ready) {
  INFO(isa);
  std::vector<uint8_t> src((1u << 20) + 333), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i * 31) ^ (i >> 7));
  for (size_t n : {size_t{0}, size_t{1}, size_t{16}, size_t{129}, size_t{240}, size_t{241}, size_t{1024}, size_t{65535},
                   size_t{65537}, src.size()}) {
    INFO("length " << n);
    const XXH128_hash_t w = XXH3_128bits(src.data(), n);
    const cairn::ChunkHash want{w.high64, w.low64};
    CHECK(hash(src.data(), n) == want);
    std::fill(dst.begin(), dst.end(), 0);
    CHECK(copy(dst.data(), src.data(), n) == want);
    CHECK(std::equal(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(n), dst.begin()));
    CHECK(ready(dst.data(), src.data(), n, std::function<uint64_t(uint64_t)>([n](uint64_t) { return n; })) == want);
  }
}

TEST_CASE("the AVX2 and AVX-512 builds of xxh3 give libxxhash's hashes", "[copy][hash]") {
  INFO("hash_bytes uses " << cairn::hash_implementation());
  if (__builtin_cpu_supports("avx2"))
    check_simd_build("avx2", cairn::hash_avx2::hash, cairn::hash_avx2::copy_and_hash,
                     cairn::hash_avx2::copy_and_hash_ready);
  else
    WARN("this CPU has no AVX2: its build of xxh3 is not checked here");
  if (__builtin_cpu_supports("avx512f"))
    check_simd_build("avx512", cairn::hash_avx512::hash, cairn::hash_avx512::copy_and_hash,
                     cairn::hash_avx512::copy_and_hash_ready);
  else
    WARN("this CPU has no AVX-512: its build of xxh3 is not checked here");
}
#endif

TEST_CASE("copy_and_hash_as_ready copies what is ready as it comes, and stops where the source fails", "[copy][hash]") {
  const size_t n = (1u << 20) + 777;
  std::vector<uint8_t> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + (i >> 11));
  const cairn::ChunkHash want = cairn::hash_bytes(src.data(), n);
  SECTION("the bytes arrive 100,000 at a time") {
    uint64_t in = 0;
    std::vector<uint64_t> asked;
    auto h = cairn::copy_and_hash_as_ready(dst.data(), src.data(), n, [&](uint64_t k) {
      asked.push_back(k);
      while (in < k) in = std::min<uint64_t>(n, in + 100000);
      return in;
    });
    CHECK(h == want);
    CHECK(dst == src);
    CHECK(asked.size() > 5);  // asked again whenever what was ready ran out, not once for all
    CHECK(std::is_sorted(asked.begin(), asked.end()));
  }
  SECTION("the source fails half way: the copy stops there") {
    auto h = cairn::copy_and_hash_as_ready(dst.data(), src.data(), n, [&](uint64_t) { return uint64_t{n / 2}; });
    CHECK_FALSE(h == want);
    CHECK(
        std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(n / 2) + 1, dst.end(), [](uint8_t b) { return b == 0; }));
  }
}
