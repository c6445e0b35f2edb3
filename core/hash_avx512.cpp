// xxh3 for AVX-512: this file alone is built with -mavx512f (CMakeLists.txt); the code is
// core/hash_simd.inc. Measured on the development VM (Intel Xeon, 2 vCPUs), hashing 1 GiB as 64 KiB
// blocks in the cache: 29 ms, against 50 ms for AVX2 and 80-110 ms for libxxhash (SSE2); 1 GiB
// read from memory: 114 ms, against 140 ms and 150-170 ms.
#if defined(__x86_64__) && defined(__AVX512F__)
// GCC 12's avx512fintrin.h makes its "undefined" vectors by initialising a variable with itself,
// which -Wuninitialized and -Wmaybe-uninitialized report wherever xxh3 inlines them (GCC bug
// 105593, fixed in GCC 13). Clang has neither complaint (nor the second warning's name).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define CAIRN_HASH_NS hash_avx512
#include "core/hash_simd.inc"
#endif
