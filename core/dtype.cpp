#include "core/dtype.hpp"

#include <array>

namespace cairn {
namespace {
struct DTypeRow {
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeRow, kDTypeCount> kRows = {{
    {"F64", 8},
    {"F32", 4},
    {"F16", 2},
    {"BF16", 2},
    {"F8_E4M3", 1},
    {"F8_E5M2", 1},
    {"I64", 8},
    {"I32", 4},
    {"I16", 2},
    {"I8", 1},
    {"U64", 8},
    {"U32", 4},
    {"U16", 2},
    {"U8", 1},
    {"BOOL", 1},
}};
}  // namespace

std::string_view dtype_name(DType t) { return kRows[static_cast<size_t>(t)].name; }
size_t dtype_size(DType t) { return kRows[static_cast<size_t>(t)].size; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < kRows.size(); ++i)
    if (kRows[i].name == name) return static_cast<DType>(i);
  return std::nullopt;
}

std::optional<DType> dtype_from_int(int value) {
  if (value < 0 || value >= kDTypeCount) return std::nullopt;
  return static_cast<DType>(value);
}

std::optional<uint64_t> tensor_nbytes(DType t, const std::vector<int64_t>& shape) {
  constexpr uint64_t kLimit = uint64_t{1} << 63;
  uint64_t n = dtype_size(t);
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) zero = true;
  }
  if (zero) return 0;
  for (int64_t d : shape) {
    auto ud = static_cast<uint64_t>(d);
    if (n > kLimit / ud) return std::nullopt;
    n *= ud;
  }
  return n;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t extra;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      return false;
    i += extra + 1;
  }
  return true;
}

bool valid_name(std::string_view s) {
  return !s.empty() && s.size() <= kMaxNameBytes && s.find('\0') == std::string_view::npos && valid_utf8(s);
}

}  // namespace cairn
