// xxh3-128 built for AVX2 and for AVX-512 (core/hash_simd.inc), x86-64 only (CAIRN_HASH_SIMD is
// defined there by CMakeLists.txt). core/hash.cpp picks the widest the CPU runs; the unit tests
// call each directly, to check it against libxxhash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/hash.hpp"

#if defined(CAIRN_HASH_SIMD)
#define CAIRN_HASH_SIMD_DECLARE(ns)                                                         \
  namespace cairn::ns {                                                                     \
  ChunkHash hash(const void* data, size_t size);                                            \
  ChunkHash copy_and_hash(unsigned char* dst, const unsigned char* src, uint64_t len);      \
  ChunkHash copy_and_hash_ready(unsigned char* dst, const unsigned char* src, uint64_t len, \
                                const std::function<uint64_t(uint64_t)>& ready);            \
  }
CAIRN_HASH_SIMD_DECLARE(hash_avx2)
CAIRN_HASH_SIMD_DECLARE(hash_avx512)
#undef CAIRN_HASH_SIMD_DECLARE
#endif
