// The group's cryptography, from OpenSSL's libcrypto: HMAC-SHA256 (the join challenge and the MAC
// on every peer message), random bytes (secrets, nonces, member ids) and hex.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cairn {

// HMAC-SHA256 of data with key: 32 raw bytes.
std::string hmac_sha256(std::string_view key, const void* data, size_t length);
inline std::string hmac_sha256(std::string_view key, std::string_view data) {
  return hmac_sha256(key, data.data(), data.size());
}
// Constant-time equality of two MACs (false when the lengths differ).
bool same_mac(std::string_view a, std::string_view b);
// n cryptographically random bytes (RAND_bytes; aborts only if the system has no entropy at all).
std::string random_bytes(size_t n);
// Lower-case hex of bytes, and back (false on odd length or a non-hex digit).
std::string to_hex(std::string_view bytes);
bool from_hex(std::string_view hex, std::string& out);

}  // namespace cairn
