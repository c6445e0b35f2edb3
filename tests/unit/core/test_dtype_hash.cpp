#include <catch2/catch.hpp>

#include "cairn/cairn.h"
#include "core/dtype.hpp"
#include "core/durability.hpp"
#include "core/hash.hpp"

using namespace cairn;

TEST_CASE("every safetensors dtype has a name, a size and a round trip", "[dtype]") {
  const char* names[] = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32",
                         "I16", "I8",  "U64", "U32",  "U16",     "U8",      "BOOL"};
  size_t sizes[] = {8, 4, 2, 2, 1, 1, 8, 4, 2, 1, 8, 4, 2, 1, 1};
  for (int i = 0; i < kDTypeCount; ++i) {
    auto t = static_cast<DType>(i);
    CHECK(dtype_name(t) == names[i]);
    CHECK(dtype_size(t) == sizes[i]);
    CHECK(dtype_from_name(names[i]) == t);
  }
  CHECK_FALSE(dtype_from_name("F128").has_value());
  CHECK_FALSE(dtype_from_name("f32").has_value());
  CHECK_FALSE(dtype_from_int(15).has_value());
}

TEST_CASE("durability levels: one ordered name table, the C API's values", "[durability]") {
  const char* names[] = {"memory", "local", "global"};
  const cairn_durability c_values[] = {CAIRN_DURABILITY_MEMORY, CAIRN_DURABILITY_LOCAL, CAIRN_DURABILITY_GLOBAL};
  for (int i = 0; i < 3; ++i) {
    auto d = static_cast<Durability>(i);
    CHECK(std::string(durability_name(d)) == names[i]);
    CHECK(durability_from_name(names[i]) == d);
    CHECK(static_cast<int>(c_values[i]) == i);
  }
  CHECK(Durability::kMemory < Durability::kLocal);
  CHECK(Durability::kLocal < Durability::kGlobal);
  CHECK_FALSE(durability_from_name("Global").has_value());
  CHECK_FALSE(durability_from_name("").has_value());
  CHECK_FALSE(durability_from_name("nvme").has_value());
}

TEST_CASE("tensor_nbytes handles scalars, empty tensors and overflow", "[dtype]") {
  CHECK(tensor_nbytes(DType::kF32, {}) == 4u);
  CHECK(tensor_nbytes(DType::kF32, {0, 1000}) == 0u);
  CHECK(tensor_nbytes(DType::kBF16, {3, 5}) == 30u);
  CHECK_FALSE(tensor_nbytes(DType::kF32, {-1}).has_value());
  CHECK_FALSE(tensor_nbytes(DType::kF64, {1ll << 40, 1ll << 30}).has_value());
}

TEST_CASE("names are bounded UTF-8 without NUL", "[dtype]") {
  CHECK(valid_name("layer1.0.conv1.weight"));
  CHECK(valid_name("模型/ä"));
  CHECK_FALSE(valid_name(""));
  CHECK_FALSE(valid_name(std::string(1025, 'a')));
  CHECK(valid_name(std::string(1024, 'a')));
  CHECK_FALSE(valid_name(std::string("a\0b", 3)));
  CHECK_FALSE(valid_name("\xff\xfe"));
  CHECK_FALSE(valid_name("\xc0\xaf"));  // overlong
  CHECK_FALSE(valid_name("\xe2\x82"));  // truncated
}

TEST_CASE("chunk hashes are stable, hex round-trips, chunking splits at the chunk size", "[hash]") {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  ChunkHash a = hash_bytes(data.data(), data.size());
  CHECK(a == hash_bytes(data.data(), data.size()));
  data[500] ^= 1;
  CHECK_FALSE(a == hash_bytes(data.data(), data.size()));
  CHECK(ChunkHash::from_hex(a.hex()) == a);
  CHECK_FALSE(ChunkHash::from_hex("xyz").has_value());
  CHECK_FALSE(ChunkHash::from_hex(std::string(32, 'G')).has_value());
  auto chunks = hash_chunks(data.data(), data.size(), 256);
  REQUIRE(chunks.size() == 4);
  CHECK(chunks[3] == hash_bytes(data.data() + 768, 232));
  CHECK(chunk_count(0, 256) == 0);
  CHECK(chunk_count(256, 256) == 1);
  CHECK(chunk_count(257, 256) == 2);
}
