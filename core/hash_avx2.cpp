// xxh3 for AVX2: this file alone is built with -mavx2 (CMakeLists.txt); the code is core/hash_simd.inc.
// Measured on the development VM, copying and hashing 1 GiB on one thread: 199 ms with libxxhash
// (SSE2), 175 ms here.
#if defined(__x86_64__) && defined(__AVX2__)
#define CAIRN_HASH_NS hash_avx2
#include "core/hash_simd.inc"
#endif
