// Chunk coding (chunk_coding.hpp).
//
// A coded frame:
//
//   bytes 0..1   "cz"
//   byte  2      frame version (1)
//   byte  3      transform: 0 none (kPlanes), 1 XOR with the reference, 2 element-wise difference
//                (kDelta)
//   byte  4      width w: 1, 2, 4 or 8
//   bytes 5..7   zero
//   bytes 8..15  raw length n, little-endian
//   w plane descriptors of 8 bytes: mode (0 stored, 1 zstd), three zero bytes, stored length
//                (little-endian u32)
//   the w planes' stored bytes, in order, then the n % w tail bytes as they are
//
// Plane k holds byte k of each of the n / w elements (after the transform). The encoder estimates
// each candidate transform from the order-0 entropy of its planes (one pass, no trial coding),
// codes the smallest, and stores a plane as it is when zstd would not shrink it (mantissa bytes
// are close to random: trying them costs time and saves nothing).
#include "core/chunk_coding.hpp"

#include <zstd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace cairn {
namespace {

constexpr size_t kHeaderBytes = 16;
constexpr size_t kPlaneDescBytes = 8;
constexpr uint8_t kFrameVersion = 1;
enum Transform : uint8_t { kNone = 0, kXor = 1, kSub = 2 };
enum PlaneMode : uint8_t { kStored = 0, kZstd = 1 };
// A plane whose estimated entropy is above this many bits per byte is stored as it is.
constexpr double kStoreAboveBits = 7.8;

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// Scratch buffers shared by every thread (the daemon's readers and coders are short-lived threads:
// buffers of their own would be allocated and faulted in again for every load). Never zeroed; a
// few idle ones are kept.
class BufferPool {
 public:
  struct Lease {
    BufferPool* pool = nullptr;
    std::unique_ptr<uint8_t[]> buf;
    size_t cap = 0;
    Lease() = default;
    Lease(BufferPool* p, std::unique_ptr<uint8_t[]> b, size_t c) : pool(p), buf(std::move(b)), cap(c) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = default;
    ~Lease() {
      if (pool && buf) pool->give(std::move(buf), cap);
    }
    uint8_t* get() const { return buf.get(); }
  };
  Lease take(size_t n) {
    {
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < idle_.size(); ++i)
        if (idle_[i].second >= n) {
          auto b = std::move(idle_[i]);
          idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
          return Lease(this, std::move(b.first), b.second);
        }
    }
    return Lease(this, std::unique_ptr<uint8_t[]>(new uint8_t[n]), n);
  }

 private:
  void give(std::unique_ptr<uint8_t[]> b, size_t cap) {
    std::lock_guard lock(mu_);
    if (idle_.size() < kIdle && cap <= kKeepBytes) idle_.emplace_back(std::move(b), cap);
  }
  static constexpr size_t kIdle = 6;
  static constexpr size_t kKeepBytes = size_t{160} << 20;
  std::mutex mu_;
  std::vector<std::pair<std::unique_ptr<uint8_t[]>, size_t>> idle_;
};
BufferPool& pool() {
  static BufferPool* p = new BufferPool;  // never destroyed: threads may hold leases at exit
  return *p;
}

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
ZSTD_CCtx* cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxFree> c(ZSTD_createCCtx());
  return c.get();
}
ZSTD_DCtx* dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxFree> c(ZSTD_createDCtx());
  return c.get();
}

// Element i of a little-endian array of width w (1, 2, 4, 8) as an unsigned integer.
template <class U>
U load(const uint8_t* p) {
  U v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class U>
void store(uint8_t* p, U v) {
  std::memcpy(p, &v, sizeof v);
}

// The transformed element: x itself, x ^ b, or x - b (mod 2^(8w)).
template <class U>
U transform(U x, U b, Transform t) {
  switch (t) {
    case kXor:
      return static_cast<U>(x ^ b);
    case kSub:
      return static_cast<U>(x - b);
    default:
      return x;
  }
}
template <class U>
U untransform(U d, U b, Transform t) {
  switch (t) {
    case kXor:
      return static_cast<U>(d ^ b);
    case kSub:
      return static_cast<U>(d + b);
    default:
      return d;
  }
}

using Histograms = std::array<std::array<uint32_t, 256>, 8>;

// Elements sampled for the estimates: blocks of kSampleBlock elements spread evenly over the chunk,
// kSampleElements in all (a chunk that small is read whole). The estimate chooses a transform and
// which planes are worth coding; the coder itself sees every byte.
constexpr size_t kSampleBlock = 4096;
constexpr size_t kSampleElements = 64 * 1024;

// Per-plane byte histograms of the transformed elements (a sample of them); returns how many.
template <class U>
size_t histogram(const uint8_t* raw, const uint8_t* base, size_t n, Transform t, Histograms* h) {
  auto count = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      U v = transform<U>(load<U>(raw + i * sizeof(U)), base ? load<U>(base + i * sizeof(U)) : U{0}, t);
      for (size_t k = 0; k < sizeof(U); ++k) ++(*h)[k][static_cast<uint8_t>(v >> (8 * k))];
    }
  };
  if (n <= kSampleElements) {
    count(0, n);
    return n;
  }
  const size_t blocks = kSampleElements / kSampleBlock;
  const size_t stride = (n - kSampleBlock) / (blocks - 1);
  for (size_t b = 0; b < blocks; ++b) count(b * stride, b * stride + kSampleBlock);
  return blocks * kSampleBlock;
}

// Estimated coded bytes of one plane of n bytes from its histogram over `sampled` of them
// (order-0 entropy): n itself when it is close to random (stored as it is).
double plane_estimate(const std::array<uint32_t, 256>& h, size_t sampled, size_t n) {
  if (n == 0 || sampled == 0) return 0;
  double bits = 0;
  for (uint32_t c : h)
    if (c) {
      double p = static_cast<double>(c) / static_cast<double>(sampled);
      bits -= static_cast<double>(c) * std::log2(p);
    }
  double per_byte = bits / static_cast<double>(sampled);
  if (per_byte > kStoreAboveBits) return static_cast<double>(n);
  return per_byte * static_cast<double>(n) / 8 + 16;  // and a zstd frame's overhead
}

#if defined(__SSE2__)
// Transform 16 bytes of elements of U (SSE2).
template <class U>
__m128i transform16(__m128i x, __m128i b, Transform t) {
  if (t == kXor) return _mm_xor_si128(x, b);
  if (t == kSub) {
    if constexpr (sizeof(U) == 2) return _mm_sub_epi16(x, b);
    if constexpr (sizeof(U) == 4) return _mm_sub_epi32(x, b);
    if constexpr (sizeof(U) == 8) return _mm_sub_epi64(x, b);
    return _mm_sub_epi8(x, b);
  }
  return x;
}
template <class U>
__m128i untransform16(__m128i d, __m128i b, Transform t) {
  if (t == kXor) return _mm_xor_si128(d, b);
  if (t == kSub) {
    if constexpr (sizeof(U) == 2) return _mm_add_epi16(d, b);
    if constexpr (sizeof(U) == 4) return _mm_add_epi32(d, b);
    if constexpr (sizeof(U) == 8) return _mm_add_epi64(d, b);
    return _mm_add_epi8(d, b);
  }
  return d;
}
__m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
void store16(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

// The first elements of group() 16 (w 2 and 4) at a time; returns how many it did.
template <class U>
size_t group_simd(const uint8_t* raw, const uint8_t* base, size_t n, Transform t, uint8_t* out) {
  const __m128i zero = _mm_setzero_si128();
  auto in = [&](size_t byte) { return transform16<U>(load16(raw + byte), base ? load16(base + byte) : zero, t); };
  size_t i = 0;
  if constexpr (sizeof(U) == 2) {
    const __m128i lo = _mm_set1_epi16(0xFF);
    for (; i + 16 <= n; i += 16) {
      __m128i x0 = in(2 * i), x1 = in(2 * i + 16);
      store16(out + i, _mm_packus_epi16(_mm_and_si128(x0, lo), _mm_and_si128(x1, lo)));
      store16(out + n + i, _mm_packus_epi16(_mm_srli_epi16(x0, 8), _mm_srli_epi16(x1, 8)));
    }
  } else if constexpr (sizeof(U) == 4) {
    const __m128i lo = _mm_set1_epi32(0xFF);
    for (; i + 16 <= n; i += 16) {
      __m128i x[4] = {in(4 * i), in(4 * i + 16), in(4 * i + 32), in(4 * i + 48)};
      for (int k = 0; k < 4; ++k) {
        __m128i v[4];
        for (int j = 0; j < 4; ++j) v[j] = _mm_and_si128(_mm_srli_epi32(x[j], 8 * k), lo);
        store16(out + static_cast<size_t>(k) * n + i,
                _mm_packus_epi16(_mm_packs_epi32(v[0], v[1]), _mm_packs_epi32(v[2], v[3])));
      }
    }
  }
  return i;
}

// The first elements of ungroup() 16 (w 2 and 4) at a time; returns how many it did.
template <class U>
size_t ungroup_simd(const uint8_t* const* planes, const uint8_t* base, size_t n, Transform t, uint8_t* dst) {
  const __m128i zero = _mm_setzero_si128();
  auto out = [&](size_t byte, __m128i v) {
    store16(dst + byte, t == kNone ? v : untransform16<U>(v, load16(base + byte), t));
  };
  (void)zero;
  size_t i = 0;
  if constexpr (sizeof(U) == 2) {
    for (; i + 16 <= n; i += 16) {
      __m128i a = load16(planes[0] + i), b = load16(planes[1] + i);
      out(2 * i, _mm_unpacklo_epi8(a, b));
      out(2 * i + 16, _mm_unpackhi_epi8(a, b));
    }
  } else if constexpr (sizeof(U) == 4) {
    for (; i + 16 <= n; i += 16) {
      __m128i a0 = load16(planes[0] + i), a1 = load16(planes[1] + i), a2 = load16(planes[2] + i),
              a3 = load16(planes[3] + i);
      __m128i t0 = _mm_unpacklo_epi8(a0, a1), t1 = _mm_unpackhi_epi8(a0, a1);
      __m128i t2 = _mm_unpacklo_epi8(a2, a3), t3 = _mm_unpackhi_epi8(a2, a3);
      out(4 * i, _mm_unpacklo_epi16(t0, t2));
      out(4 * i + 16, _mm_unpackhi_epi16(t0, t2));
      out(4 * i + 32, _mm_unpacklo_epi16(t1, t3));
      out(4 * i + 48, _mm_unpackhi_epi16(t1, t3));
    }
  }
  return i;
}
#else
template <class U>
size_t group_simd(const uint8_t*, const uint8_t*, size_t, Transform, uint8_t*) {
  return 0;
}
template <class U>
size_t ungroup_simd(const uint8_t* const*, const uint8_t*, size_t, Transform, uint8_t*) {
  return 0;
}
#endif

// Splits the transformed elements into planes (plane k at out + k * n).
template <class U>
void group(const uint8_t* raw, const uint8_t* base, size_t n, Transform t, uint8_t* out) {
  for (size_t i = group_simd<U>(raw, base, n, t, out); i < n; ++i) {
    U v = transform<U>(load<U>(raw + i * sizeof(U)), base ? load<U>(base + i * sizeof(U)) : U{0}, t);
    for (size_t k = 0; k < sizeof(U); ++k) out[k * n + i] = static_cast<uint8_t>(v >> (8 * k));
  }
}

// Joins planes back into elements and undoes the transform.
template <class U>
void ungroup(const uint8_t* const* planes, const uint8_t* base, size_t n, Transform t, uint8_t* dst) {
  if constexpr (sizeof(U) == 1) {
    const uint8_t* p0 = planes[0];
    if (t == kNone) {
      std::memcpy(dst, p0, n);
      return;
    }
    for (size_t i = 0; i < n; ++i) dst[i] = untransform<uint8_t>(p0[i], base[i], t);
  } else {
    for (size_t i = ungroup_simd<U>(planes, base, n, t, dst); i < n; ++i) {
      U v = 0;
      for (size_t k = 0; k < sizeof(U); ++k) v |= static_cast<U>(static_cast<U>(planes[k][i]) << (8 * k));
      if (t != kNone) v = untransform<U>(v, load<U>(base + i * sizeof(U)), t);
      store<U>(dst + i * sizeof(U), v);
    }
  }
}

template <class F>
void by_width(size_t w, F&& f) {
  switch (w) {
    case 2:
      f(uint16_t{});
      break;
    case 4:
      f(uint32_t{});
      break;
    case 8:
      f(uint64_t{});
      break;
    default:
      f(uint8_t{});
      break;
  }
}

}  // namespace

std::string_view chunk_coding_name(ChunkCoding c) {
  switch (c) {
    case ChunkCoding::kRaw:
      return "raw";
    case ChunkCoding::kPlanes:
      return "planes";
    case ChunkCoding::kDelta:
      return "delta";
  }
  return "raw";
}

std::optional<ChunkCoding> chunk_coding_from_name(std::string_view name) {
  if (name == "raw") return ChunkCoding::kRaw;
  if (name == "planes") return ChunkCoding::kPlanes;
  if (name == "delta") return ChunkCoding::kDelta;
  return std::nullopt;
}

size_t coding_width(DType t) {
  switch (t) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    default:
      return 1;
  }
}

EncodedChunk encode_chunk(const void* raw_v, size_t len, size_t width, const void* base_v,
                          const CodingOptions& options) {
  EncodedChunk out;
  if (width != 2 && width != 4 && width != 8) width = 1;
  const auto* raw = static_cast<const uint8_t*>(raw_v);
  const auto* base = static_cast<const uint8_t*>(base_v);
  const size_t n = len / width;
  const size_t tail = len - n * width;
  if (n == 0 || len > UINT32_MAX) return out;  // a plane's length is a u32

  // Estimate each candidate from its planes' entropy; code the smallest.
  Transform best = kNone;
  double best_bytes = 0;
  std::array<double, 8> best_planes{};
  const Transform candidates[] = {kNone, kXor, kSub};
  for (Transform t : candidates) {
    if (t != kNone && base == nullptr) break;
    Histograms h{};
    size_t sampled = 0;
    by_width(width, [&](auto u) { sampled = histogram<decltype(u)>(raw, base, n, t, &h); });
    std::array<double, 8> planes{};
    double total = 0;
    for (size_t k = 0; k < width; ++k) total += planes[k] = plane_estimate(h[k], sampled, n);
    if (t == kNone || total < best_bytes) {
      best = t;
      best_bytes = total;
      best_planes = planes;
    }
  }
  const double budget = static_cast<double>(len) * (1.0 - options.min_saving);
  if (best_bytes + kHeaderBytes + width * kPlaneDescBytes + tail >= budget) return out;

  // Scratch from the pool (never zeroed): the planes, and the frame before it is copied out at its
  // final size.
  BufferPool::Lease grouped_lease = pool().take(n * width);
  uint8_t* grouped = grouped_lease.get();
  by_width(width, [&](auto u) { group<decltype(u)>(raw, base, n, best, grouped); });
  size_t bound = kHeaderBytes + width * kPlaneDescBytes + tail;
  for (size_t k = 0; k < width; ++k) bound += ZSTD_compressBound(n);
  BufferPool::Lease frame_lease = pool().take(bound);
  uint8_t* f = frame_lease.get();
  std::memset(f, 0, kHeaderBytes + width * kPlaneDescBytes);
  f[0] = 'c';
  f[1] = 'z';
  f[2] = kFrameVersion;
  f[3] = best;
  f[4] = static_cast<uint8_t>(width);
  put_u64(f + 8, len);
  size_t at = kHeaderBytes + width * kPlaneDescBytes;
  for (size_t k = 0; k < width; ++k) {
    uint8_t* desc = f + kHeaderBytes + k * kPlaneDescBytes;
    const uint8_t* plane = grouped + k * n;
    size_t stored = n;
    uint8_t mode = kStored;
    if (best_planes[k] < static_cast<double>(n)) {
      size_t z = ZSTD_compressCCtx(cctx(), f + at, bound - at, plane, n, options.level);
      if (!ZSTD_isError(z) && z < n) {
        stored = z;
        mode = kZstd;
      }
    }
    if (mode == kStored) std::memcpy(f + at, plane, n);
    desc[0] = mode;
    put_u32(desc + 4, static_cast<uint32_t>(stored));
    at += stored;
  }
  std::memcpy(f + at, raw + n * width, tail);
  at += tail;
  if (static_cast<double>(at) >= budget) return out;
  out.bytes.assign(f, f + at);
  out.coding = best == kNone ? ChunkCoding::kPlanes : ChunkCoding::kDelta;
  return out;
}

Status decode_chunk(ChunkCoding coding, const void* stored_v, size_t stored_len, const void* base_v, void* dst_v,
                    size_t len) {
  const auto* f = static_cast<const uint8_t*>(stored_v);
  const auto* base = static_cast<const uint8_t*>(base_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  auto bad = [&](const std::string& what) {
    return corruption("coded chunk (" + std::string(chunk_coding_name(coding)) + ", " + std::to_string(stored_len) +
                      " bytes stored): " + what);
  };
  if (coding == ChunkCoding::kRaw) {
    if (stored_len != len) return bad("raw length " + std::to_string(stored_len) + " for " + std::to_string(len));
    std::memcpy(dst, f, len);
    return Status::OK();
  }
  if (stored_len < kHeaderBytes || f[0] != 'c' || f[1] != 'z') return bad("no frame header");
  if (f[2] != kFrameVersion) return bad("frame version " + std::to_string(f[2]) + " is not 1");
  const uint8_t t = f[3];
  if (coding == ChunkCoding::kPlanes && t != kNone) return bad("a delta transform in a chunk coded without one");
  if (coding == ChunkCoding::kDelta && t != kXor && t != kSub) return bad("no delta transform in a delta chunk");
  if (coding == ChunkCoding::kDelta && base == nullptr) return bad("no reference chunk given");
  const size_t w = f[4];
  if (w != 1 && w != 2 && w != 4 && w != 8) return bad("width " + std::to_string(w));
  if (f[5] || f[6] || f[7]) return bad("reserved bytes set");
  if (get_u64(f + 8) != len)
    return bad("it holds " + std::to_string(get_u64(f + 8)) + " bytes, the chunk " + std::to_string(len));
  const size_t n = len / w;
  const size_t tail = len - n * w;
  if (stored_len < kHeaderBytes + w * kPlaneDescBytes) return bad("truncated plane table");
  size_t at = kHeaderBytes + w * kPlaneDescBytes;
  std::array<const uint8_t*, 8> planes{};
  std::array<uint8_t, 8> modes{};
  std::array<size_t, 8> sizes{};
  for (size_t k = 0; k < w; ++k) {
    const uint8_t* desc = f + kHeaderBytes + k * kPlaneDescBytes;
    if (desc[0] > kZstd || desc[1] || desc[2] || desc[3]) return bad("plane " + std::to_string(k) + ": bad mode");
    modes[k] = desc[0];
    sizes[k] = get_u32(desc + 4);
    if (modes[k] == kStored && sizes[k] != n) return bad("plane " + std::to_string(k) + ": stored with a wrong length");
    if (sizes[k] > stored_len - at) return bad("plane " + std::to_string(k) + " runs past the frame's end");
    planes[k] = f + at;
    at += sizes[k];
  }
  if (stored_len - at != tail)
    return bad(std::to_string(stored_len - at) + " bytes after the planes; expected " + std::to_string(tail));
  // zstd planes are decoded into scratch (w == 1 with no transform: straight into dst).
  size_t zplanes = 0;
  for (size_t k = 0; k < w; ++k) zplanes += modes[k] == kZstd;
  const bool direct = w == 1 && t == kNone;
  BufferPool::Lease scratch;
  if (!direct && zplanes > 0) scratch = pool().take(zplanes * n);
  size_t zi = 0;
  for (size_t k = 0; k < w; ++k) {
    if (modes[k] != kZstd) continue;
    uint8_t* into = direct ? dst : scratch.get() + zi++ * n;
    size_t got = ZSTD_decompressDCtx(dctx(), into, n, planes[k], sizes[k]);
    if (ZSTD_isError(got)) return bad("plane " + std::to_string(k) + ": " + std::string(ZSTD_getErrorName(got)));
    if (got != n)
      return bad("plane " + std::to_string(k) + " decodes to " + std::to_string(got) + " bytes, not " +
                 std::to_string(n));
    planes[k] = into;
  }
  if (direct && modes[0] == kStored) std::memcpy(dst, planes[0], n);
  if (!direct)
    by_width(w, [&](auto u) { ungroup<decltype(u)>(planes.data(), base, n, static_cast<Transform>(t), dst); });
  // The tail is stored as it is (before any transform).
  std::memcpy(dst + n * w, f + at, tail);
  return Status::OK();
}

}  // namespace cairn
