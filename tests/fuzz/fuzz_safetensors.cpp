// libFuzzer target for the safetensors header reader. The input is a whole file. A header the
// reader accepts must describe a contiguous layout of the file and survive build_header → parse
// unchanged; the reader must never ask for more prefix than the whole file.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "core/safetensors.hpp"

namespace {

using cairn::safetensors::Header;
using cairn::safetensors::TensorEntry;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_safetensors: %s %s\n", what, detail.c_str());
  std::abort();
}

void check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) fail(what, detail);
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void check_layout(const Header& h, uint64_t file_size) {
  check(h.header_bytes <= cairn::safetensors::kMaxHeaderBytes, "header past the limit");
  check(h.data_offset() + h.data_bytes == file_size, "sizes do not add up to the file");
  uint64_t covered = 0;
  for (const TensorEntry& t : h.tensors) {
    check(cairn::valid_name(t.name), "invalid name accepted");
    check(t.begin == covered && t.begin <= t.end, "tensors not contiguous", t.name);
    check(t.shape.size() <= static_cast<size_t>(cairn::kMaxDims), "too many dims", t.name);
    auto n = cairn::tensor_nbytes(t.dtype, t.shape);
    check(n.has_value() && *n == t.nbytes(), "shape does not match length", t.name);
    check(h.find(t.name) == &t, "find disagrees", t.name);
    covered = t.end;
  }
  check(covered == h.data_bytes, "tensors do not cover the data section");
}

bool same_tensors(const Header& a, const Header& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorEntry& x = a.tensors[i];
    const TensorEntry& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.begin != y.begin || x.end != y.end)
      return false;
  }
  return a.has_metadata == b.has_metadata && a.metadata == b.metadata && a.data_bytes == b.data_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> file(data, size);
  uint64_t needed = 1;
  auto parsed = cairn::safetensors::parse_header(file, size, &needed);
  check(needed == 0, "asked for more than the whole file");
  if (!parsed.ok()) {
    check(parsed.status().code() == cairn::StatusCode::kInvalidArgument, "unexpected code",
          parsed.status().to_string());
    check(!parsed.status().message().empty(), "rejection without a message");
    return 0;
  }
  const Header& h = *parsed;
  check_layout(h, size);

  // The exact prefix is enough; one byte less asks for exactly the prefix.
  const uint64_t prefix_len = h.data_offset();
  auto exact = cairn::safetensors::parse_header(file.first(prefix_len), size, &needed);
  check(exact.ok() && needed == 0 && same_tensors(h, *exact), "exact prefix disagrees");
  auto shorter = cairn::safetensors::parse_header(file.first(prefix_len - 1), size, &needed);
  check(!shorter.ok() && needed == prefix_len, "short prefix not reported");

  // What we read, we can write, and read back the same.
  std::vector<TensorEntry> tensors = h.tensors;
  auto built = cairn::safetensors::build_header(tensors, h.has_metadata ? &h.metadata : nullptr);
  check(built.ok(), "build_header rejected a parsed header", built.status().to_string());
  for (size_t i = 0; i < tensors.size(); ++i)
    check(tensors[i].begin == h.tensors[i].begin && tensors[i].end == h.tensors[i].end, "build_header moved a tensor",
          tensors[i].name);
  check(built->size() % 8 == 0, "built header not padded");
  const uint64_t rebuilt_size = built->size() + h.data_bytes;
  auto again = cairn::safetensors::parse_header(bytes_of(*built), rebuilt_size);
  check(again.ok(), "built header rejected", again.status().to_string());
  check(same_tensors(h, *again), "round trip changed the header");
  check_layout(*again, rebuilt_size);
  return 0;
}
