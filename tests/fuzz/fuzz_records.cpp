// Fuzzes the repository's record reader (tiers/pfs/records.hpp) and the compact commit record
// (decode_commit): logs and checkpoints are read from the PFS, written by other processes, so bad
// bytes must give an error naming what is wrong, never a crash. A commit record that decodes must
// encode back to one that decodes to the same manifest.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tiers/pfs/records.hpp"
#include "tiers/pfs/repository_impl.hpp"

namespace {

// A parent with two tensors, so records may refer to tensors 0 and 1 and to "parent".
const cairn::ModelManifest& parent() {
  static const cairn::ModelManifest p = [] {
    cairn::ModelManifest m;
    m.id = "p";
    for (int k = 0; k < 2; ++k) {
      cairn::TensorManifest t;
      t.name = "t" + std::to_string(k);
      t.dtype = cairn::DType::kU8;
      t.shape = {4};
      t.nbytes = 4;
      cairn::ChunkRef c;
      c.hash = cairn::hash_bytes(t.name.data(), t.name.size());
      c.length = 4;
      c.pack = "w0000000000000001-000001.pack";
      c.offset = 64;
      t.chunks.push_back(c);
      m.tensors.push_back(t);
    }
    return m;
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view buf(reinterpret_cast<const char*>(data), size);
  cairn::pfs::ParseResult r = cairn::pfs::parse_records(buf);
  if (r.consumed > size) std::abort();
  if (r.stop == cairn::pfs::ParseResult::kBad && r.why.empty()) std::abort();
  // The raw bytes as one payload too, so the JSON decoder sees the fuzzer's text directly.
  std::vector<std::string_view> payloads{buf};
  for (const auto& rec : r.records) payloads.push_back(rec.payload);
  for (std::string_view payload : payloads) {
    auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
    if (j.is_discarded()) continue;
    for (const cairn::ModelManifest* p : {static_cast<const cairn::ModelManifest*>(nullptr), &parent()}) {
      auto m = cairn::decode_commit(j, p);
      if (!m.ok()) {
        if (m.status().message().empty()) std::abort();
        continue;
      }
      std::string again;
      try {
        again = cairn::encode_commit(*m, p);
      } catch (const nlohmann::json::exception&) {
        continue;  // strings the parser accepted but dump() will not write (invalid UTF-8 escapes)
      }
      auto back = cairn::decode_commit(nlohmann::json::parse(again), p);
      if (!back.ok() || !(*back == *m)) std::abort();
    }
  }
  return 0;
}
