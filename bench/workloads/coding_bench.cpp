// Chunk coding on real weights (core/chunk_coding.hpp), against zstd alone on the same bytes, in
// one process: how much smaller, and how fast one core codes and decodes.
//
// The input is a file of raw tensor bytes of one dtype (a model's weights concatenated; bench part
// `compression` writes them from trained models), cut into chunks as the repository cuts tensors.
// With --base (a file of the same size: the parent's weights, in the same order), each chunk is
// also coded as a delta against the base's chunk at the same place, as a commit does.
//
// Prints one JSON object: bytes in; bytes out for zstd alone (levels 1 and 3, whole chunks, as a
// general-purpose compressor sees them), cairn's planes (no base) and cairn's choice with the base;
// single-thread throughput (raw bytes per second) of each coder and decoder, and of memcpy over
// the same bytes as the baseline. Every decode is compared with the input.
//
// Usage: cairn_bench_coding --dtype F32|BF16|F16|F64|... --file F [--base F] [--chunk BYTES]
//                           [--repeats N]
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/chunk_coding.hpp"
#include "core/dtype.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cairn_bench_coding: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <class F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "cairn_bench_coding: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype_s, file, base_file;
  size_t chunk = 16u << 20;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dtype")
      dtype_s = next();
    else if (a == "--file")
      file = next();
    else if (a == "--base")
      base_file = next();
    else if (a == "--chunk")
      chunk = std::stoull(next());
    else if (a == "--repeats")
      repeats = std::max(1, std::stoi(next()));
    else
      fail("unknown argument " + a + " (see the top of bench/workloads/coding_bench.cpp)");
  }
  auto dtype = cairn::dtype_from_name(dtype_s);
  if (!dtype || file.empty() || chunk == 0) fail("give --dtype (safetensors spelling) and --file");
  const size_t width = cairn::coding_width(*dtype);
  const std::string raw = slurp(file);
  const std::string base = base_file.empty() ? std::string() : slurp(base_file);
  if (!base.empty() && base.size() != raw.size()) fail("--base must be as long as --file");
  const size_t n = raw.size();
  const size_t chunks = (n + chunk - 1) / chunk;
  auto piece = [&](size_t c) { return std::min(chunk, n - c * chunk); };
  cairn::CodingOptions opt;

  // memcpy over the same bytes: the baseline throughput.
  std::string copy(n, '\0');
  double t_memcpy = median_seconds(repeats, [&] { std::memcpy(copy.data(), raw.data(), n); });

  // zstd alone on whole chunks.
  nlohmann::json out;
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  for (int level : {1, 3}) {
    std::vector<std::vector<uint8_t>> frames(chunks);
    double t_enc = median_seconds(repeats, [&] {
      for (size_t c = 0; c < chunks; ++c) {
        frames[c].resize(ZSTD_compressBound(piece(c)));
        size_t z = ZSTD_compressCCtx(cctx, frames[c].data(), frames[c].size(), raw.data() + c * chunk, piece(c), level);
        if (ZSTD_isError(z)) fail("zstd failed");
        frames[c].resize(z);
      }
    });
    size_t total = 0;
    for (const auto& f : frames) total += std::min(f.size(), chunk);
    double t_dec = median_seconds(repeats, [&] {
      for (size_t c = 0; c < chunks; ++c)
        if (ZSTD_decompressDCtx(dctx, copy.data() + c * chunk, piece(c), frames[c].data(), frames[c].size()) !=
            piece(c))
          fail("zstd decode failed");
    });
    if (copy != raw) fail("zstd round trip differs");
    std::string k = "zstd" + std::to_string(level);
    out[k] = {{"bytes", total}, {"encode_gbps", n / t_enc / 1e9}, {"decode_gbps", n / t_dec / 1e9}};
  }
  ZSTD_freeCCtx(cctx);
  ZSTD_freeDCtx(dctx);

  // cairn: planes (no base), and with the base when given.
  for (bool with_base : {false, true}) {
    if (with_base && base.empty()) continue;
    std::vector<cairn::EncodedChunk> coded(chunks);
    double t_enc = median_seconds(repeats, [&] {
      for (size_t c = 0; c < chunks; ++c)
        coded[c] = cairn::encode_chunk(raw.data() + c * chunk, piece(c), width,
                                       with_base ? base.data() + c * chunk : nullptr, opt);
    });
    size_t total = 0;
    size_t counts[cairn::kChunkCodingCount] = {};
    for (size_t c = 0; c < chunks; ++c) {
      total += coded[c].coding == cairn::ChunkCoding::kRaw ? piece(c) : coded[c].bytes.size();
      ++counts[static_cast<int>(coded[c].coding)];
    }
    std::memset(copy.data(), 0, n);
    double t_dec = median_seconds(repeats, [&] {
      for (size_t c = 0; c < chunks; ++c) {
        const auto& e = coded[c];
        if (e.coding == cairn::ChunkCoding::kRaw) {
          std::memcpy(copy.data() + c * chunk, raw.data() + c * chunk, piece(c));
          continue;
        }
        cairn::Status s =
            cairn::decode_chunk(e.coding, e.bytes.data(), e.bytes.size(), with_base ? base.data() + c * chunk : nullptr,
                                copy.data() + c * chunk, piece(c));
        if (!s.ok()) fail(s.to_string());
      }
    });
    if (copy != raw) fail("cairn round trip differs");
    out[with_base ? "cairn_delta" : "cairn_planes"] = {
        {"bytes", total},          {"encode_gbps", n / t_enc / 1e9}, {"decode_gbps", n / t_dec / 1e9},
        {"chunks_raw", counts[0]}, {"chunks_planes", counts[1]},     {"chunks_delta", counts[2]}};
  }
  out["bytes"] = n;
  out["dtype"] = dtype_s;
  out["chunk"] = chunk;
  out["chunks"] = chunks;
  out["memcpy_gbps"] = n / t_memcpy / 1e9;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
