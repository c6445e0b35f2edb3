#include "core/wire.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cairn::wire {
namespace {
constexpr uint8_t kMagic[4] = {'C', 'R', 'N', '1'};

void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

std::array<uint8_t, kFrameHeaderBytes> encode_header(const FrameHeader& h) {
  std::array<uint8_t, kFrameHeaderBytes> b{};
  std::memcpy(b.data(), kMagic, 4);
  put_u16(b.data() + 4, kWireVersion);
  put_u16(b.data() + 6, static_cast<uint16_t>(h.kind));
  put_u32(b.data() + 8, h.json_len);
  put_u32(b.data() + 12, 0);
  put_u64(b.data() + 16, h.blob_len);
  return b;
}

Result<FrameHeader> decode_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kFrameHeaderBytes)
    return protocol_error("frame header: " + std::to_string(bytes.size()) + " bytes, need " +
                          std::to_string(kFrameHeaderBytes));
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) return protocol_error("frame header: bad magic (not a cairn client or daemon?)");
  uint16_t version = get_u16(p + 4);
  if (version != kWireVersion)
    return protocol_error("frame header: protocol version " + std::to_string(version) +
                          " is not supported (this side speaks " + std::to_string(kWireVersion) +
                          "); use a client and daemon from the same release");
  uint16_t kind = get_u16(p + 6);
  if (kind != 1 && kind != 2) return protocol_error("frame header: unknown kind " + std::to_string(kind));
  FrameHeader h;
  h.kind = static_cast<Kind>(kind);
  h.json_len = get_u32(p + 8);
  if (h.json_len == 0 || h.json_len > kMaxJsonBytes)
    return protocol_error("frame header: json_len " + std::to_string(h.json_len) + " outside 1.." +
                          std::to_string(kMaxJsonBytes));
  if (get_u32(p + 12) != 0) return protocol_error("frame header: flags must be 0 in version 1");
  h.blob_len = get_u64(p + 16);
  if (h.blob_len > kMaxBlobBytes)
    return protocol_error("frame header: blob_len " + std::to_string(h.blob_len) + " exceeds the maximum of " +
                          std::to_string(kMaxBlobBytes) + " (large tensors go through the shared arena)");
  return h;
}

Result<nlohmann::json> decode_body(Kind kind, std::span<const uint8_t> json_bytes) {
  nlohmann::json j = nlohmann::json::parse(json_bytes.begin(), json_bytes.end(), nullptr, false);
  if (j.is_discarded()) return protocol_error("frame body: not valid JSON");
  if (!j.is_object()) return protocol_error("frame body: not a JSON object");
  if (kind == Kind::kRequest) {
    auto it = j.find("op");
    if (it == j.end() || !it->is_string()) return protocol_error("request: missing string field 'op'");
  } else {
    auto it = j.find("status");
    if (it == j.end() || !it->is_number_integer()) return protocol_error("response: missing integer field 'status'");
    int64_t s = it->get<int64_t>();
    if (s < 0 || s > static_cast<int64_t>(StatusCode::kProtocol))
      return protocol_error("response: unknown status " + std::to_string(s));
    auto e = j.find("error");
    if (e != j.end() && !e->is_string()) return protocol_error("response: 'error' is not a string");
  }
  return j;
}

std::vector<uint8_t> encode_frame(Kind kind, const nlohmann::json& body, std::span<const uint8_t> blob) {
  std::string js = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  FrameHeader h{kind, static_cast<uint32_t>(js.size()), blob.size()};
  auto hb = encode_header(h);
  std::vector<uint8_t> out;
  out.reserve(hb.size() + js.size() + blob.size());
  out.insert(out.end(), hb.begin(), hb.end());
  out.insert(out.end(), js.begin(), js.end());
  out.insert(out.end(), blob.begin(), blob.end());
  return out;
}

Status read_full(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::read(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status("socket read", errno);
    }
    if (r == 0) return protocol_error("connection closed in the middle of a frame");
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status write_full(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    // send() with MSG_NOSIGNAL so that a closed peer is an error, not a SIGPIPE in the client's
    // process; plain write() for descriptors that are not sockets.
    ssize_t r = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (r < 0 && errno == ENOTSOCK) r = ::write(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return unavailable("connection closed by the other side");
      return errno_status("write", errno);
    }
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status send_frame(int sock, Kind kind, const nlohmann::json& body, std::span<const uint8_t> blob, int fd_to_pass) {
  std::string js = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (js.size() > kMaxJsonBytes)
    return invalid_argument("message too large (" + std::to_string(js.size()) + " bytes of JSON)");
  if (blob.size() > kMaxBlobBytes)
    return invalid_argument("inline payload too large (" + std::to_string(blob.size()) + " bytes)");
  FrameHeader h{kind, static_cast<uint32_t>(js.size()), blob.size()};
  auto hb = encode_header(h);
  if (fd_to_pass >= 0) {
    // The descriptor rides with the frame header.
    iovec iov{hb.data(), hb.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd_to_pass, sizeof(int));
    ssize_t r;
    do {
      r = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return errno_status("socket sendmsg", errno);
    if (static_cast<size_t>(r) < hb.size())
      CAIRN_RETURN_IF_ERROR(write_full(sock, hb.data() + r, hb.size() - static_cast<size_t>(r)));
  } else if (js.size() + blob.size() < 64 * 1024) {
    std::vector<uint8_t> all;
    all.reserve(hb.size() + js.size() + blob.size());
    all.insert(all.end(), hb.begin(), hb.end());
    all.insert(all.end(), js.begin(), js.end());
    all.insert(all.end(), blob.begin(), blob.end());
    return write_full(sock, all.data(), all.size());
  } else {
    CAIRN_RETURN_IF_ERROR(write_full(sock, hb.data(), hb.size()));
  }
  CAIRN_RETURN_IF_ERROR(write_full(sock, js.data(), js.size()));
  if (!blob.empty()) CAIRN_RETURN_IF_ERROR(write_full(sock, blob.data(), blob.size()));
  return Status::OK();
}

Result<size_t> recv_some(int sock, void* buf, size_t n, int* passed_fd) {
  iovec iov{buf, n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r;
  do {
    r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); r >= 0 && cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (passed_fd != nullptr && *passed_fd < 0)
        *passed_fd = fd;
      else
        ::close(fd);
    }
  }
  if (r < 0) {
    if (errno == ECONNRESET) return unavailable("connection closed");
    return errno_status("socket recvmsg", errno);
  }
  return static_cast<size_t>(r);
}

Result<Frame> recv_frame(int sock) {
  std::array<uint8_t, kFrameHeaderBytes> hb{};
  Frame f;
  // The first read may carry a passed descriptor.
  CAIRN_ASSIGN_OR_RETURN(size_t got, recv_some(sock, hb.data(), hb.size(), &f.passed_fd));
  if (got == 0) return unavailable("connection closed");
  auto fail = [&](Status s) -> Result<Frame> {
    if (f.passed_fd >= 0) ::close(f.passed_fd);
    return s;
  };
  if (got < hb.size()) {
    Status s = read_full(sock, hb.data() + got, hb.size() - got);
    if (!s.ok()) return fail(s);
  }
  auto h = decode_header(hb);
  if (!h.ok()) return fail(h.status());
  std::vector<uint8_t> js(h->json_len);
  Status s = read_full(sock, js.data(), js.size());
  if (!s.ok()) return fail(s);
  auto body = decode_body(h->kind, js);
  if (!body.ok()) return fail(body.status());
  f.kind = h->kind;
  f.body = std::move(body).value();
  if (h->blob_len > 0) {
    f.blob.resize(h->blob_len);
    s = read_full(sock, f.blob.data(), f.blob.size());
    if (!s.ok()) return fail(s);
  }
  return f;
}

std::string default_socket_path() {
  if (const char* s = std::getenv("CAIRN_SOCKET"); s && *s) return s;
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  std::string dir = (xdg && *xdg) ? xdg : "/tmp";
  return dir + "/cairn-" + std::to_string(::getuid()) + "/cairnd.sock";
}

nlohmann::json ok_response() { return nlohmann::json{{"status", 0}}; }

nlohmann::json error_response(const Status& s) {
  return nlohmann::json{{"status", static_cast<int>(s.code())}, {"error", s.message()}};
}

Status response_status(const nlohmann::json& body) {
  int code = body.value("status", static_cast<int>(StatusCode::kProtocol));
  if (code == 0) return Status::OK();
  return Status(status_code_from_int(code), body.value("error", std::string()));
}

}  // namespace cairn::wire
