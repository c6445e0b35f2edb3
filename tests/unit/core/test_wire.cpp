#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <random>
#include <thread>

#include "core/wire.hpp"

using namespace cairn;
using nlohmann::json;

TEST_CASE("frames round-trip through a socket pair, with a passed descriptor", "[wire]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  std::vector<uint8_t> blob(200000);
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<uint8_t>(i * 7);
  json body{{"op", "put_tensor"}, {"key", "k"}, {"shape", {2, 3}}};
  int passed = ::dup(0);
  std::thread t([&] { REQUIRE(wire::send_frame(sv[0], wire::Kind::kRequest, body, blob, passed).ok()); });
  auto f = wire::recv_frame(sv[1]);
  t.join();
  REQUIRE(f.ok());
  CHECK(f->kind == wire::Kind::kRequest);
  CHECK(f->body == body);
  CHECK(f->blob == blob);
  CHECK(f->passed_fd >= 0);
  ::close(f->passed_fd);
  ::close(passed);
  ::close(sv[0]);
  auto closed = wire::recv_frame(sv[1]);
  CHECK(closed.status().code() == StatusCode::kUnavailable);
  ::close(sv[1]);
}

TEST_CASE("frame headers with bad fields are rejected with the field named", "[wire]") {
  auto good = wire::encode_frame(wire::Kind::kRequest, json{{"op", "ping"}});
  auto expect = [&](std::vector<uint8_t> bytes, const char* needle) {
    auto h = wire::decode_header(bytes);
    REQUIRE_FALSE(h.ok());
    CHECK(h.status().code() == StatusCode::kProtocol);
    INFO(h.status().message());
    CHECK(h.status().message().find(needle) != std::string::npos);
  };
  REQUIRE(wire::decode_header(good).ok());
  auto b = good;
  b[0] = 'X';
  expect(b, "magic");
  b = good;
  b[4] = 9;
  expect(b, "version");
  b = good;
  b[6] = 7;
  expect(b, "kind");
  b = good;
  b[8] = b[9] = b[10] = b[11] = 0xff;
  expect(b, "json_len");
  b = good;
  b[12] = 1;
  expect(b, "flags");
  b = good;
  b[23] = 0x10;
  expect(b, "blob_len");
  expect(std::vector<uint8_t>(good.begin(), good.begin() + 10), "need 24");
}

TEST_CASE("frame bodies must be objects with op or status", "[wire]") {
  auto body = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  CHECK(wire::decode_body(wire::Kind::kRequest, body("{\"op\":\"ping\"}")).ok());
  CHECK_FALSE(wire::decode_body(wire::Kind::kRequest, body("{\"op\":1}")).ok());
  CHECK_FALSE(wire::decode_body(wire::Kind::kRequest, body("[1,2]")).ok());
  CHECK_FALSE(wire::decode_body(wire::Kind::kRequest, body("{\"op\":")).ok());
  CHECK(wire::decode_body(wire::Kind::kResponse, body("{\"status\":0}")).ok());
  CHECK_FALSE(wire::decode_body(wire::Kind::kResponse, body("{\"status\":999}")).ok());
  CHECK_FALSE(wire::decode_body(wire::Kind::kResponse, body("{\"status\":1,\"error\":5}")).ok());
}

TEST_CASE("random garbage never crashes the decoders", "[wire]") {
  std::mt19937_64 rng(42);
  auto good = wire::encode_frame(wire::Kind::kRequest, json{{"op", "commit"}, {"id", "m"}, {"tensors", json::array()}});
  for (int i = 0; i < 20000; ++i) {
    auto b = good;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    if (rng() % 5 == 0) b.resize(rng() % b.size());
    auto h = wire::decode_header(b);
    if (!h.ok()) continue;
    if (h->json_len > b.size() - wire::kFrameHeaderBytes) continue;
    auto body = wire::decode_body(h->kind, std::span<const uint8_t>(b).subspan(wire::kFrameHeaderBytes, h->json_len));
    if (body.ok()) CHECK(body->is_object());
  }
}

TEST_CASE("status codes, C enum and messages come from one list", "[status]") {
  CHECK(std::string(status_code_string(StatusCode::kOk)) == "ok");
  CHECK(std::string(status_code_string(StatusCode::kNotFound)) == "not found");
  Status s = not_found("model 'x' does not exist");
  CHECK(s.to_string() == "not found: model 'x' does not exist");
  CHECK(s.with_context("open").message() == "open: model 'x' does not exist");
  CHECK(Status::OK().ok());
  CHECK(errno_status("write", ENOSPC).code() == StatusCode::kNoSpace);
}
