// The wire protocol between local clients and cairnd (docs/protocol.md).
//
// Every message is one frame:
//   offset size  field
//   0      4     magic "CRN1" (0x43 0x52 0x4E 0x31)
//   4      2     version, little-endian (kWireVersion)
//   6      2     kind: 1 request, 2 response
//   8      4     json_len: bytes of the JSON body (1..kMaxJsonBytes)
//   12     4     flags: must be 0 in version 1
//   16     8     blob_len: bytes of binary payload after the JSON (0..kMaxBlobBytes)
//   24     json_len bytes of JSON (an object), then blob_len bytes of blob
// A request's JSON has "op" (a string) and the op's fields; a response's has "status" (a
// cairn_status number), "error" (a message, when status != 0) and the result's fields. The hello
// response also carries the arena's file descriptor as SCM_RIGHTS ancillary data.
// Decoders reject frames that break any of these rules with kProtocol and a message naming the field.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace cairn::wire {

inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 24;
inline constexpr uint32_t kMaxJsonBytes = 16u << 20;
inline constexpr uint64_t kMaxBlobBytes = 256ull << 20;
enum class Kind : uint16_t { kRequest = 1, kResponse = 2 };

struct FrameHeader {
  Kind kind = Kind::kRequest;
  uint32_t json_len = 0;
  uint64_t blob_len = 0;
};

struct Frame {
  Kind kind = Kind::kRequest;
  nlohmann::json body;  // an object
  std::vector<uint8_t> blob;
  int passed_fd = -1;  // a descriptor received with the frame (owned by the receiver)
};

std::array<uint8_t, kFrameHeaderBytes> encode_header(const FrameHeader& h);
Result<FrameHeader> decode_header(std::span<const uint8_t> bytes);
// Parses and checks the JSON body for its kind: an object; requests need a string "op",
// responses an integer "status" that is a known code.
Result<nlohmann::json> decode_body(Kind kind, std::span<const uint8_t> json_bytes);

// Encodes a whole frame (header + JSON + blob) into one buffer.
std::vector<uint8_t> encode_frame(Kind kind, const nlohmann::json& body, std::span<const uint8_t> blob = {});

// Blocking socket I/O on a connected stream socket. send_frame passes fd_to_pass (if >= 0) with the
// frame. recv_frame returns kUnavailable with "connection closed" when the peer closed the socket
// cleanly before a frame started; a frame cut short is kProtocol.
Status send_frame(int sock, Kind kind, const nlohmann::json& body, std::span<const uint8_t> blob = {},
                  int fd_to_pass = -1);
Result<Frame> recv_frame(int sock);

// One recvmsg of up to n bytes into buf, retried on EINTR; returns the bytes read, 0 at end of
// stream, kUnavailable "connection closed" on a reset. Descriptors passed with those bytes are not
// leaked: the first goes to *passed_fd when passed_fd is not null and *passed_fd < 0 (the caller owns
// it), every other one is closed.
Result<size_t> recv_some(int sock, void* buf, size_t n, int* passed_fd = nullptr);

// Reads/writes exactly n bytes (sockets or files), retrying on EINTR and short transfers.
Status read_full(int fd, void* buf, size_t n);
Status write_full(int fd, const void* buf, size_t n);

// Where the node's daemon listens unless told otherwise: $CAIRN_SOCKET if set, else
// ${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock.
std::string default_socket_path();

// Helpers for responses.
nlohmann::json ok_response();
nlohmann::json error_response(const Status& s);
// The Status a response carries (OK when status == 0).
Status response_status(const nlohmann::json& body);

}  // namespace cairn::wire
