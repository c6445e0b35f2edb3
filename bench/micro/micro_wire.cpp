// The wire protocol (core/wire.hpp): encoding + decoding typical frames, and request/response
// round trips over a Unix socket pair.
//
// wire_codec: encode_frame, then decode_header + decode_body + copying the blob out (what
// recv_frame does after its reads), against memcpy of the encoded frame's bytes (moving the bytes)
// and nlohmann dump + parse of the body (the JSON alone, no header, checks or blob). Frames:
//   lease_req        a lease request for one tensor of a ResNet-50 candidate (the commonest request)
//   lease_resp320    the response to leasing all 320 tensors of a ResNet-50 (a map_many)
//   put_64KiB        a put_tensor request carrying a 64 KiB tensor inline (kInlineLimit)
//
// wire_roundtrip: send_frame(request) and recv_frame(response) on one end of a socketpair while a
// thread answers every request frame with a response frame (recv_frame + send_frame), against a
// bare write/read of the same numbers of bytes each way on a socketpair with a thread answering the
// same way (read_full + write_full). Both sides cross the same two threads and the same socket;
// the difference is the framing, the JSON and the system calls per frame.
#include <benchmark/benchmark.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/micro/micro_common.hpp"
#include "core/wire.hpp"

namespace {

using cairn::wire::Kind;
using nlohmann::json;

struct Message {
  Kind kind;
  json body;
  std::vector<uint8_t> blob;
  size_t frame_bytes() const { return cairn::wire::encode_frame(kind, body, blob).size(); }
};

Message lease_request() {
  return {Kind::kRequest,
          json{{"op", "lease"},
               {"id", "resnet50-gen12-cand7"},
               {"tensors", {"layer3.4.conv2.weight"}},
               {"contiguous", true}},
          {}};
}

Message lease_response(int tensors) {
  json leases = json::array();
  uint64_t offset = 123456789;
  for (int i = 0; i < tensors; ++i) {
    const uint64_t len = 4096u * static_cast<uint64_t>(1 + i % 97);
    leases.push_back({{"lease", 1000 + i}, {"extents", {{offset, len}}}});
    offset += len;
  }
  return {Kind::kResponse, json{{"status", 0}, {"created_ns", 1717171717171717171LL}, {"leases", leases}}, {}};
}

Message put_request(uint64_t blob_bytes) {
  return {Kind::kRequest,
          json{{"op", "put_tensor"}, {"key", "sim/step42/pressure"}, {"dtype", "F32"}, {"shape", {blob_bytes / 4}}},
          cairn::bench::random_bytes(blob_bytes, 5)};
}

Message ok_response() { return {Kind::kResponse, cairn::wire::ok_response(), {}}; }

void codec_cairn(benchmark::State& state, const Message* m) {
  for (auto _ : state) {
    std::vector<uint8_t> frame = cairn::wire::encode_frame(m->kind, m->body, m->blob);
    std::span<const uint8_t> bytes(frame);
    auto h = cairn::wire::decode_header(bytes.first(cairn::wire::kFrameHeaderBytes));
    if (!h.ok()) {
      state.SkipWithError(h.status().to_string().c_str());
      break;
    }
    auto body = cairn::wire::decode_body(h->kind, bytes.subspan(cairn::wire::kFrameHeaderBytes, h->json_len));
    if (!body.ok()) {
      state.SkipWithError(body.status().to_string().c_str());
      break;
    }
    std::vector<uint8_t> blob(bytes.begin() + static_cast<ptrdiff_t>(cairn::wire::kFrameHeaderBytes + h->json_len),
                              bytes.end());
    benchmark::DoNotOptimize(body->size());
    benchmark::DoNotOptimize(blob.data());
  }
  state.counters["frame_bytes"] = static_cast<double>(m->frame_bytes());
}

// The JSON alone: dumping the body and parsing it back, without header, checks or blob.
void codec_json(benchmark::State& state, const Message* m) {
  for (auto _ : state) {
    std::string text = m->body.dump();
    json back = json::parse(text);
    benchmark::DoNotOptimize(back.size());
  }
  state.counters["frame_bytes"] = static_cast<double>(m->frame_bytes());
}

void codec_memcpy(benchmark::State& state, const Message* m) {
  const std::vector<uint8_t> src = cairn::wire::encode_frame(m->kind, m->body, m->blob);
  std::vector<uint8_t> dst(src.size(), 1);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.counters["frame_bytes"] = static_cast<double>(src.size());
}

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() {
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) != 0) fd[0] = fd[1] = -1;
  }
  ~SocketPair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  bool ok() const { return fd[0] >= 0; }
};

struct RoundTrip {
  Message request, response;
};

void roundtrip_cairn(benchmark::State& state, const RoundTrip* rt) {
  SocketPair sp;
  if (!sp.ok()) {
    state.SkipWithError("socketpair failed");
    return;
  }
  // Answers frames until the client end shuts down.
  std::thread server([&] {
    while (cairn::wire::recv_frame(sp.fd[1]).ok())
      if (!cairn::wire::send_frame(sp.fd[1], rt->response.kind, rt->response.body, rt->response.blob).ok()) break;
  });
  for (auto _ : state) {
    cairn::Status s = cairn::wire::send_frame(sp.fd[0], rt->request.kind, rt->request.body, rt->request.blob);
    auto r = s.ok() ? cairn::wire::recv_frame(sp.fd[0]) : cairn::Result<cairn::wire::Frame>(s);
    if (!r.ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(r->body.size());
  }
  ::shutdown(sp.fd[0], SHUT_WR);
  server.join();
  state.counters["request_bytes"] = static_cast<double>(rt->request.frame_bytes());
  state.counters["response_bytes"] = static_cast<double>(rt->response.frame_bytes());
}

void roundtrip_bare(benchmark::State& state, const RoundTrip* rt) {
  SocketPair sp;
  if (!sp.ok()) {
    state.SkipWithError("socketpair failed");
    return;
  }
  const std::vector<uint8_t> request = cairn::wire::encode_frame(rt->request.kind, rt->request.body, rt->request.blob);
  const std::vector<uint8_t> response =
      cairn::wire::encode_frame(rt->response.kind, rt->response.body, rt->response.blob);
  std::thread server([&] {
    std::vector<uint8_t> in(request.size());
    while (cairn::wire::read_full(sp.fd[1], in.data(), in.size()).ok())
      if (!cairn::wire::write_full(sp.fd[1], response.data(), response.size()).ok()) break;
  });
  std::vector<uint8_t> in(response.size());
  for (auto _ : state) {
    cairn::Status s = cairn::wire::write_full(sp.fd[0], request.data(), request.size());
    if (s.ok()) s = cairn::wire::read_full(sp.fd[0], in.data(), in.size());
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(in.data());
  }
  ::shutdown(sp.fd[0], SHUT_WR);
  server.join();
  state.counters["request_bytes"] = static_cast<double>(request.size());
  state.counters["response_bytes"] = static_cast<double>(response.size());
}

}  // namespace

namespace cairn::bench {

void register_wire_benchmarks() {
  static const Message frames[] = {lease_request(), lease_response(320), put_request(64 << 10)};
  static const char* const frame_names[] = {"lease_req", "lease_resp320", "put_64KiB"};
  for (size_t i = 0; i < std::size(frames); ++i) {
    benchmark::RegisterBenchmark(bench_name("wire_codec", frame_names[i], "cairn").c_str(), codec_cairn, &frames[i])
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("wire_codec", frame_names[i], "json").c_str(), codec_json, &frames[i])
        ->UseRealTime();
    benchmark::RegisterBenchmark(bench_name("wire_codec", frame_names[i], "memcpy").c_str(), codec_memcpy, &frames[i])
        ->UseRealTime();
  }
  static const RoundTrip trips[] = {{lease_request(), lease_response(1)}, {put_request(64 << 10), ok_response()}};
  static const char* const trip_names[] = {"lease_1", "put_64KiB"};
  for (size_t i = 0; i < std::size(trips); ++i) {
    benchmark::RegisterBenchmark(bench_name("wire_roundtrip", trip_names[i], "cairn").c_str(), roundtrip_cairn,
                                 &trips[i])
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(bench_name("wire_roundtrip", trip_names[i], "bare_socket").c_str(), roundtrip_bare,
                                 &trips[i])
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace cairn::bench
