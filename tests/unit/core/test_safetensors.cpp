#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/safetensors.hpp"

namespace cairn::safetensors {
namespace {

using Catch::Matchers::Contains;

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint8_t>(v >> (8 * i)));
  return out;
}

// A file whose header is `json` (verbatim) followed by data_bytes bytes of data.
std::string file_with_json(std::string_view json, uint64_t data_bytes) {
  return le64(json.size()) + std::string(json) + std::string(data_bytes, '\x5a');
}

Result<Header> parse_file(const std::string& file) { return parse_header(bytes_of(file), file.size()); }

Result<Header> parse_json(std::string_view json, uint64_t data_bytes) {
  return parse_file(file_with_json(json, data_bytes));
}

// The message of a rejected parse. Fails the test if the parse succeeded.
template <typename T>
std::string error_of(const Result<T>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_FALSE(r.status().message().empty());
  return r.status().message();
}

TensorEntry entry(std::string name, DType dtype, std::vector<int64_t> shape) {
  TensorEntry t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

// A complete file for tensors (data filled with a pattern), built with build_header.
std::string build_file(std::vector<TensorEntry>& tensors,
                       const std::map<std::string, std::string>* metadata = nullptr) {
  auto prefix = build_header(tensors, metadata);
  REQUIRE(prefix.ok());
  uint64_t data = tensors.empty() ? 0 : tensors.back().end;
  return *prefix + std::string(data, '\x33');
}

// The invariants every parsed header holds.
void check_consistent(const Header& h, uint64_t file_size) {
  REQUIRE(h.data_offset() + h.data_bytes == file_size);
  REQUIRE(h.header_bytes <= kMaxHeaderBytes);
  uint64_t covered = 0;
  for (const TensorEntry& t : h.tensors) {
    REQUIRE(t.begin == covered);
    REQUIRE(t.begin <= t.end);
    auto n = tensor_nbytes(t.dtype, t.shape);
    REQUIRE(n.has_value());
    REQUIRE(*n == t.nbytes());
    REQUIRE(t.shape.size() <= static_cast<size_t>(kMaxDims));
    REQUIRE(valid_name(t.name));
    REQUIRE(h.find(t.name) == &t);
    covered = t.end;
  }
  REQUIRE(covered == h.data_bytes);
}

TEST_CASE("safetensors: every dtype round-trips through build_header and parse_header", "[safetensors]") {
  std::vector<TensorEntry> tensors;
  for (int i = 0; i < kDTypeCount; ++i) {
    DType t = *dtype_from_int(i);
    tensors.push_back(entry("t." + std::string(dtype_name(t)), t, {2, 3}));
  }
  std::string file = build_file(tensors);
  auto h = parse_file(file);
  REQUIRE(h.ok());
  check_consistent(*h, file.size());
  REQUIRE(h->tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorEntry& got = h->tensors[i];
    CHECK(got.name == tensors[i].name);
    CHECK(got.dtype == tensors[i].dtype);
    CHECK(got.shape == tensors[i].shape);
    CHECK(got.begin == tensors[i].begin);
    CHECK(got.end == tensors[i].end);
    CHECK(got.nbytes() == 6 * dtype_size(got.dtype));
  }
  CHECK_FALSE(h->has_metadata);
  CHECK(h->metadata.empty());
}

TEST_CASE("safetensors: build_header lays tensors out contiguously and pads to 8 bytes", "[safetensors]") {
  std::vector<TensorEntry> tensors = {entry("a", DType::kF32, {3}), entry("b", DType::kU8, {5}),
                                      entry("c", DType::kF64, {1, 1})};
  tensors[0].begin = 99;  // recomputed
  auto prefix = build_header(tensors, nullptr);
  REQUIRE(prefix.ok());
  CHECK(prefix->size() % 8 == 0);
  CHECK(tensors[0].begin == 0);
  CHECK(tensors[0].end == 12);
  CHECK(tensors[1].begin == 12);
  CHECK(tensors[1].end == 17);
  CHECK(tensors[2].begin == 17);
  CHECK(tensors[2].end == 25);
  std::string json = prefix->substr(8);
  CHECK(json.find(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]})") != std::string::npos);
  CHECK(json[json.find_last_not_of(' ')] == '}');
}

TEST_CASE("safetensors: 0-d scalars and zero-element tensors", "[safetensors]") {
  std::vector<TensorEntry> tensors = {entry("scalar", DType::kF64, {}), entry("empty", DType::kF32, {0}),
                                      entry("empty2d", DType::kI16, {4, 0}), entry("after", DType::kBool, {2})};
  std::string file = build_file(tensors);
  auto h = parse_file(file);
  REQUIRE(h.ok());
  check_consistent(*h, file.size());
  const TensorEntry* s = h->find("scalar");
  REQUIRE(s != nullptr);
  CHECK(s->shape.empty());
  CHECK(s->nbytes() == 8);
  CHECK(h->find("empty")->nbytes() == 0);
  CHECK(h->find("empty2d")->shape == std::vector<int64_t>{4, 0});
  CHECK(h->find("after")->begin == 8);
  CHECK(h->find("missing") == nullptr);
  CHECK(h->data_bytes == 10);

  SECTION("a header with no tensors and no data") {
    std::vector<TensorEntry> none;
    std::string empty_file = build_file(none);
    auto e = parse_file(empty_file);
    REQUIRE(e.ok());
    CHECK(e->tensors.empty());
    CHECK(e->data_bytes == 0);
  }
  SECTION("only zero-element tensors") {
    auto z = parse_json(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                        R"("b":{"dtype":"U8","shape":[0,7],"data_offsets":[0,0]}})",
                        0);
    REQUIRE(z.ok());
    CHECK(z->tensors.size() == 2);
  }
}

TEST_CASE("safetensors: metadata is kept", "[safetensors]") {
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"quote\"and\\slash", "line\nbreak\ttab\x01"}, {"unicode", "ñ→𝄞"}, {"", ""}};
  std::vector<TensorEntry> tensors = {entry("w", DType::kBF16, {2, 2})};
  std::string file = build_file(tensors, &metadata);
  CHECK(file.find("{\"__metadata__\":{") == 8);
  auto h = parse_file(file);
  REQUIRE(h.ok());
  CHECK(h->has_metadata);
  CHECK(h->metadata == metadata);

  SECTION("empty metadata is still present") {
    std::map<std::string, std::string> none;
    std::vector<TensorEntry> ts = {entry("w", DType::kU8, {1})};
    auto e = parse_file(build_file(ts, &none));
    REQUIRE(e.ok());
    CHECK(e->has_metadata);
    CHECK(e->metadata.empty());
  }
}

TEST_CASE("safetensors: tensors come back in data-offset order", "[safetensors]") {
  auto h = parse_json(R"({"z":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                      R"("y":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                      R"("__metadata__":{"k":"v"}} )"
                      "\n\t ",
                      6);
  REQUIRE(h.ok());
  REQUIRE(h->tensors.size() == 2);
  CHECK(h->tensors[0].name == "y");
  CHECK(h->tensors[1].name == "z");
  CHECK(h->metadata.at("k") == "v");
  CHECK(h->data_bytes == 6);
}

TEST_CASE("safetensors: rejects truncated and oversized files", "[safetensors]") {
  SECTION("shorter than the length field") {
    std::string file = "\x10\x00\x00";
    auto msg = error_of(parse_file(file));
    CHECK_THAT(msg, Contains("too short"));
  }
  SECTION("data section cut short") {
    std::vector<TensorEntry> tensors = {entry("first", DType::kF32, {4}), entry("last", DType::kF32, {4})};
    std::string file = build_file(tensors);
    file.pop_back();
    auto msg = error_of(parse_file(file));
    CHECK_THAT(msg, Contains("'last'") && Contains("[16,32]") && Contains("31 bytes"));
  }
  SECTION("header longer than the file") {
    std::string file = le64(1000) + std::string(100, ' ');
    auto msg = error_of(parse_file(file));
    CHECK_THAT(msg, Contains("header length 1000") && Contains("108-byte file"));
  }
  SECTION("header length past kMaxHeaderBytes") {
    std::string prefix = le64(kMaxHeaderBytes + 1);
    auto msg = error_of(parse_header(bytes_of(prefix), uint64_t{1} << 40));
    CHECK_THAT(msg, Contains(std::to_string(kMaxHeaderBytes + 1)) && Contains("limit"));
  }
  SECTION("header length of 2^64-1") {
    std::string file = le64(~uint64_t{0}) + "{}";
    auto msg = error_of(parse_file(file));
    CHECK_THAT(msg, Contains("header length"));
  }
}

TEST_CASE("safetensors: rejects headers that are not a JSON object", "[safetensors]") {
  SECTION("bad JSON") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32",)", 0));
    CHECK_THAT(msg, Contains("not valid JSON"));
  }
  SECTION("trailing garbage") {
    auto msg = error_of(parse_json("{} x", 0));
    CHECK_THAT(msg, Contains("not valid JSON after the header object"));
  }
  SECTION("syntax errors say where they are") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":)", 0));
    CHECK_THAT(msg, Contains("not valid JSON in tensor 'b' (dtype)"));
    msg = error_of(parse_json(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)", 0));
    CHECK_THAT(msg, Contains("after entry 'a'"));
  }
  SECTION("an array") {
    auto msg = error_of(parse_json("[1,2]   ", 0));
    CHECK_THAT(msg, Contains("'{'") && Contains("object"));
  }
  SECTION("empty header") {
    auto msg = error_of(parse_json("", 0));
    CHECK_THAT(msg, Contains("'{'"));
  }
  SECTION("leading whitespace") { error_of(parse_json(" {}", 0)); }
  SECTION("comments") {
    auto msg = error_of(parse_json("{/*x*/}", 0));
    CHECK_THAT(msg, Contains("not valid JSON"));
  }
}

TEST_CASE("safetensors: rejects bad tensor entries, naming the tensor", "[safetensors]") {
  auto reject = [](std::string_view tensor_json, uint64_t data_bytes) {
    return error_of(parse_json("{\"w.0\":" + std::string(tensor_json) + "}", data_bytes));
  };
  SECTION("unknown dtype") {
    CHECK_THAT(reject(R"({"dtype":"F33","shape":[1],"data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("unknown dtype 'F33'"));
    CHECK_THAT(reject(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("'f32'"));
  }
  SECTION("dtype not a string") {
    CHECK_THAT(reject(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("dtype must be a string"));
  }
  SECTION("negative dimension") {
    CHECK_THAT(reject(R"({"dtype":"F32","shape":[2,-3],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("negative dimension -3"));
  }
  SECTION("non-integer dimension") {
    CHECK_THAT(reject(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("2.5") && Contains("not an integer"));
    CHECK_THAT(reject(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("shape"));
    CHECK_THAT(reject(R"({"dtype":"F32","shape":[[2]],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("shape"));
  }
  SECTION("dimension past int64") {
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("too large"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("too large"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[1e999],"data_offsets":[0,0]})", 0),
               Contains("'w.0' (shape)") && Contains("1e999"));
  }
  SECTION("too many dimensions") {
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]})", 1),
               Contains("'w.0'") && Contains("more than 8 dimensions"));
    auto h = parse_json(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,2],"data_offsets":[0,2]}})", 2);
    CHECK(h.ok());
  }
  SECTION("shape not an array") {
    CHECK_THAT(reject(R"({"dtype":"U8","shape":4,"data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("shape must be an array"));
  }
  SECTION("shape too large for 64 bits") {
    CHECK_THAT(reject(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]})", 0),
               Contains("'w.0'") && Contains("too large"));
  }
  SECTION("shape and length disagree") {
    auto msg = error_of(parse_json(R"({"layer1.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,40]}})", 40));
    CHECK(msg ==
          "tensor 'layer1.weight': shape [3,4] of F32 needs 48 bytes but data_offsets [0,40] span "
          "40");
  }
  SECTION("data_offsets malformed") {
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4,8]})", 8),
               Contains("'w.0'") && Contains("more than 2"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[4]})", 4),
               Contains("'w.0'") && Contains("has 1 entries"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[-1,3]})", 4),
               Contains("'w.0'") && Contains("negative value -1"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4.0]})", 4),
               Contains("'w.0'") && Contains("not an integer"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":{"a":1}})", 4),
               Contains("'w.0'") && Contains("data_offsets must be [begin, end]"));
  }
  SECTION("begin after end") {
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[0],"data_offsets":[4,0]})", 4),
               Contains("'w.0'") && Contains("[4,0]") && Contains("end before"));
  }
  SECTION("offsets outside the data section") {
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[2,6]})", 4),
               Contains("'w.0'") && Contains("[2,6]") && Contains("data section"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[18446744073709551614,2]})", 4), Contains("'w.0'"));
  }
  SECTION("missing, unknown and repeated fields") {
    CHECK_THAT(reject(R"({"dtype":"U8","data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("missing field 'shape'"));
    CHECK_THAT(reject(R"({"shape":[4],"data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("missing field 'dtype'"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4]})", 4),
               Contains("'w.0'") && Contains("missing field 'data_offsets'"));
    CHECK_THAT(reject(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4],"extra":1})", 4),
               Contains("'w.0'") && Contains("unknown field 'extra'"));
    CHECK_THAT(reject(R"({"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]})", 4),
               Contains("'w.0'") && Contains("duplicate field 'dtype'"));
  }
  SECTION("entry not an object") {
    CHECK_THAT(reject("[1]", 0), Contains("'w.0'") && Contains("must be an object"));
    CHECK_THAT(reject("\"x\"", 0), Contains("'w.0'") && Contains("must be an object"));
    CHECK_THAT(reject("null", 0), Contains("'w.0'") && Contains("null"));
  }
}

TEST_CASE("safetensors: rejects overlaps and holes", "[safetensors]") {
  SECTION("overlapping offsets") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   12));
    CHECK_THAT(msg, Contains("'b'") && Contains("overlap") && Contains("'a'"));
  }
  SECTION("the same range twice") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
                                   8));
    CHECK_THAT(msg, Contains("overlap"));
  }
  SECTION("an empty tensor inside another") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("e":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
                                   8));
    CHECK_THAT(msg, Contains("'e'") && Contains("overlap") && Contains("'a'"));
  }
  SECTION("hole between tensors") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                   12));
    CHECK_THAT(msg, Contains("'b'") && Contains("hole of 4 bytes") && Contains("'a'"));
  }
  SECTION("hole at the start") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
    CHECK_THAT(msg, Contains("'a'") && Contains("start of the data section"));
  }
  SECTION("bytes after the last tensor") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6));
    CHECK_THAT(msg, Contains("cover 4 bytes") && Contains("holds 6") && Contains("2 trailing"));
  }
  SECTION("data but no tensors") {
    auto msg = error_of(parse_json("{}", 3));
    CHECK_THAT(msg, Contains("3 trailing"));
  }
}

TEST_CASE("safetensors: rejects duplicate and invalid names", "[safetensors]") {
  SECTION("duplicate tensor") {
    auto msg = error_of(parse_json(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                   R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                   2));
    CHECK_THAT(msg, Contains("duplicate tensor 'a'"));
  }
  SECTION("non-UTF-8 name") {
    auto msg = error_of(parse_json("{\"bad\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0));
    CHECK_THAT(msg, Contains("UTF-8"));
    CHECK(msg.find('\xff') == std::string::npos);  // messages stay printable
  }
  SECTION("overlong UTF-8 name") {
    auto msg = error_of(parse_json("{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0));
    CHECK_THAT(msg, Contains("UTF-8"));
  }
  SECTION("lone surrogate escape") {
    error_of(parse_json(R"({"\ud800":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0));
  }
  SECTION("NUL in name") {
    auto msg = error_of(parse_json(R"({"a\u0000b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0));
    CHECK_THAT(msg, Contains("'a\\x00b'") && Contains("invalid"));
  }
  SECTION("empty name") {
    auto msg = error_of(parse_json(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0));
    CHECK_THAT(msg, Contains("''") && Contains("invalid"));
  }
  SECTION("name too long") {
    std::string name(kMaxNameBytes + 1, 'n');
    auto msg = error_of(parse_json("{\"" + name + R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0));
    CHECK_THAT(msg, Contains("invalid") && Contains(std::to_string(kMaxNameBytes + 1) + " bytes"));
    CHECK(msg.size() < 400);
  }
  SECTION("non-ASCII UTF-8 names are fine") {
    auto h = parse_json(R"({"poids.ñ.𝄞":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0);
    REQUIRE(h.ok());
    CHECK(h->tensors[0].name == "poids.ñ.𝄞");
  }
}

TEST_CASE("safetensors: rejects bad metadata", "[safetensors]") {
  SECTION("not an object") {
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":"x"})", 0)),
               Contains("__metadata__") && Contains("object of string to string"));
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":["a"]})", 0)), Contains("__metadata__"));
  }
  SECTION("a value that is not a string") {
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":{"epoch":3}})", 0)),
               Contains("__metadata__ 'epoch'") && Contains("must be a string"));
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":{"nested":{"a":"b"}}})", 0)), Contains("__metadata__ 'nested'"));
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":{"n":null}})", 0)), Contains("'n'"));
  }
  SECTION("duplicate key or section") {
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":{"a":"1","a":"2"}})", 0)), Contains("duplicate key 'a'"));
    CHECK_THAT(error_of(parse_json(R"({"__metadata__":{},"__metadata__":{}})", 0)),
               Contains("duplicate entry '__metadata__'"));
  }
}

TEST_CASE("safetensors: build_header rejects what the reader would", "[safetensors]") {
  auto rejected = [](std::vector<TensorEntry> tensors, const std::map<std::string, std::string>* metadata = nullptr) {
    std::vector<TensorEntry> before = tensors;
    auto r = build_header(tensors, metadata);
    std::string msg = error_of(r);
    for (size_t i = 0; i < tensors.size(); ++i) {  // untouched on failure
      CHECK(tensors[i].begin == before[i].begin);
      CHECK(tensors[i].end == before[i].end);
    }
    return msg;
  };
  auto ok = entry("ok", DType::kF32, {2});
  ok.begin = 7;
  ok.end = 9;
  CHECK_THAT(rejected({ok, entry("bad\xff", DType::kF32, {1})}), Contains("'bad\\xFF'"));
  CHECK_THAT(rejected({ok, entry("", DType::kF32, {1})}), Contains("''") && Contains("invalid"));
  CHECK_THAT(rejected({ok, entry("__metadata__", DType::kF32, {1})}), Contains("'__metadata__'"));
  CHECK_THAT(rejected({ok, entry("ok", DType::kF32, {1})}), Contains("duplicate tensor 'ok'"));
  CHECK_THAT(rejected({ok, entry("neg", DType::kF32, {2, -1})}),
             Contains("'neg'") && Contains("[2,-1]") && Contains("negative"));
  CHECK_THAT(rejected({ok, entry("deep", DType::kU8, {1, 1, 1, 1, 1, 1, 1, 1, 1})}),
             Contains("'deep'") && Contains("more than 8"));
  CHECK_THAT(rejected({ok, entry("huge", DType::kF64, {int64_t{1} << 62, 4})}),
             Contains("'huge'") && Contains("too large"));
  auto bad_dtype = entry("weird", DType::kU8, {1});
  bad_dtype.dtype = static_cast<DType>(40);
  CHECK_THAT(rejected({ok, bad_dtype}), Contains("'weird'") && Contains("40"));
  std::map<std::string, std::string> bad_value = {{"k", "\xc3"}};
  CHECK_THAT(rejected({ok}, &bad_value), Contains("__metadata__ 'k'") && Contains("UTF-8"));
  std::map<std::string, std::string> bad_key = {{"\xe2\x82", "v"}};
  CHECK_THAT(rejected({ok}, &bad_key), Contains("__metadata__ key") && Contains("UTF-8"));
}

TEST_CASE("safetensors: a short prefix says how many bytes are needed", "[safetensors]") {
  std::vector<TensorEntry> tensors = {entry("a", DType::kF32, {2}), entry("b", DType::kI8, {3})};
  std::string file = build_file(tensors);
  auto full = parse_file(file);
  REQUIRE(full.ok());
  const uint64_t header_end = full->data_offset();
  auto span = bytes_of(file);
  for (uint64_t len = 0; len < header_end; ++len) {
    uint64_t needed = 12345;
    auto r = parse_header(span.first(len), file.size(), &needed);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(needed == (len < 8 ? 8 : header_end));
    auto again = parse_header(span.first(len), file.size());  // null needed_prefix is fine
    CHECK_FALSE(again.ok());
  }
  uint64_t needed = 12345;
  auto exact = parse_header(span.first(header_end), file.size(), &needed);
  REQUIRE(exact.ok());
  CHECK(needed == 0);
  CHECK(exact->tensors.size() == 2);

  SECTION("format errors leave needed_prefix at 0") {
    needed = 12345;
    std::string bad = file_with_json("[]      ", 0);
    CHECK_FALSE(parse_header(bytes_of(bad), bad.size(), &needed).ok());
    CHECK(needed == 0);
    needed = 12345;
    CHECK_FALSE(parse_header(span.first(4), 6, &needed).ok());  // file too short: no retry
    CHECK(needed == 0);
    needed = 12345;
    std::string huge = le64(kMaxHeaderBytes + 8);
    CHECK_FALSE(parse_header(bytes_of(huge), uint64_t{1} << 40, &needed).ok());
    CHECK(needed == 0);
  }
  SECTION("a prefix longer than the file is an error") { CHECK_FALSE(parse_header(span, file.size() - 1).ok()); }
}

TEST_CASE("safetensors: read_header reads files and names them in errors", "[safetensors]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("cairn_test_safetensors_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& contents) {
    std::ofstream(dir / name, std::ios::binary) << contents;
    return (dir / name).string();
  };
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<TensorEntry> tensors = {entry("emb", DType::kF16, {4, 8}), entry("bias", DType::kF32, {8})};
  std::string file = build_file(tensors, &metadata);

  auto good = read_header(write("good.safetensors", file));
  REQUIRE(good.ok());
  check_consistent(*good, file.size());
  CHECK(good->metadata == metadata);
  CHECK(good->find("bias")->begin == 64);

  std::string cut_path = write("cut.safetensors", file.substr(0, file.size() - 4));
  auto cut = read_header(cut_path);
  REQUIRE_FALSE(cut.ok());
  CHECK_THAT(cut.status().message(), Contains(cut_path) && Contains("'bias'"));

  std::string tiny_path = write("tiny.safetensors", "abc");
  CHECK_THAT(read_header(tiny_path).status().message(), Contains(tiny_path) && Contains("too short"));

  std::string liar_path = write("liar.safetensors", le64(uint64_t{1} << 40) + "{}");
  CHECK_THAT(read_header(liar_path).status().message(), Contains(liar_path) && Contains("limit"));

  std::string missing = (dir / "missing.safetensors").string();
  auto m = read_header(missing);
  CHECK(m.status().code() == StatusCode::kNotFound);
  CHECK_THAT(m.status().message(), Contains(missing));

  CHECK_THAT(read_header(dir.string()).status().message(), Contains("not a regular file"));
  fs::remove_all(dir);
}

TEST_CASE("safetensors: random mutations never crash the parser", "[safetensors]") {
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "x"}};
  std::vector<TensorEntry> tensors = {entry("a", DType::kF32, {2, 2}), entry("b", DType::kU8, {}),
                                      entry("c", DType::kBF16, {0, 3}), entry("d", DType::kI64, {1, 1, 1})};
  const std::string base = build_file(tensors, &metadata);
  REQUIRE(parse_file(base).ok());

  static constexpr char kTokens[] = "{}[]\",:-0123456789. eE\\u\x00\xff";
  std::mt19937_64 rng(0x5afe7e45);
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string f = base;
    int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits; ++e) {
      uint64_t pos = pick(f.size() + 1);
      switch (pick(7)) {
        case 0:  // flip a bit
          if (!f.empty()) f[pos % f.size()] ^= static_cast<char>(1 << pick(8));
          break;
        case 1:  // set a byte to a JSON-ish token
          if (!f.empty()) f[pos % f.size()] = kTokens[pick(sizeof(kTokens) - 1)];
          break;
        case 2:  // truncate
          f.resize(pos);
          break;
        case 3: {  // insert bytes
          uint64_t count = 1 + pick(3);
          f.insert(pos, std::string(count, kTokens[pick(sizeof(kTokens) - 1)]));
          break;
        }
        case 4:  // delete bytes
          if (pos < f.size()) f.erase(pos, 1 + pick(4));
          break;
        case 5:  // rewrite the header length
          if (f.size() >= 8) {
            uint64_t small = pick(2);
            std::string n = le64(small ? pick(f.size() + 16) : rng());
            f.replace(0, 8, n);
          }
          break;
        default:  // append data
          f.append(pick(8), '\0');
          break;
      }
    }
    uint64_t needed = 1;
    auto r = parse_header(bytes_of(f), f.size(), &needed);
    CHECK(needed == 0);
    if (r.ok()) {
      ++accepted;
      check_consistent(*r, f.size());
    } else {
      REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
      REQUIRE_FALSE(r.status().message().empty());
    }
  }
  CHECK(accepted > 0);  // some edits (padding, data-free spots) keep the file valid
}

}  // namespace
}  // namespace cairn::safetensors
