#include "daemon/peers/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>

namespace cairn {

std::string hmac_sha256(std::string_view key, const void* data, size_t length) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), static_cast<const unsigned char*>(data), length, out,
           &n) == nullptr) {
    std::fprintf(stderr, "cairn: HMAC-SHA256 failed in libcrypto\n");
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out), n);
}

bool same_mac(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (n && RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1) {
    std::fprintf(stderr, "cairn: no random bytes from libcrypto (RAND_bytes)\n");
    std::abort();
  }
  return s;
}

std::string to_hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s += kDigits[c >> 4];
    s += kDigits[c & 15];
  }
  return s;
}

bool from_hex(std::string_view hex, std::string& out) {
  if (hex.size() % 2) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string r;
  r.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int h = nib(hex[i]), l = nib(hex[i + 1]);
    if (h < 0 || l < 0) return false;
    r += static_cast<char>(h << 4 | l);
  }
  out = std::move(r);
  return true;
}

}  // namespace cairn
