/* The GPU tier through the C API, compiled as C99 (docs/gpu.md). Run by
 * tests/integration/test_hbm.py against a cairnd it starts ($CAIRN_SOCKET), with the emulated device
 * backend, or CUDA where a GPU is visible. "Device memory" of this process is host memory with the
 * emulated backend, and memory from cudaMalloc (libcudart, loaded at run time) with CUDA.
 *
 *   hbm_test suite BACKEND              every check below, "N checks, M failed"
 *   hbm_test put ID NAME:BYTES:SEED...  commits a model of U8 tensors (deterministic bytes)
 *   hbm_test map ID NAME BACKEND        maps NAME on the device; prints "host=<fnv> device=<fnv> ptr=<p>"
 *   hbm_test hold ID BACKEND NAME...    maps the tensors on the device, prints "held", sleeps
 *   hbm_test nohbm                      against a daemon without an HBM tier: the errors say why */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cairn/cairn.h"
#include "check.h"

/* One tensor's device view: cairn_model_map with CAIRN_MEM_CUDA on `device`. */
static cairn_status map_device(cairn_model_reader* r, const char* name, int device, const void** ptr, size_t* n) {
  cairn_read_options o = CAIRN_READ_OPTIONS_INIT;
  void* view = NULL;
  cairn_status st;
  o.kind = CAIRN_MEM_CUDA;
  o.device = device;
  st = cairn_model_map(r, 1, &name, &view, n, &o);
  *ptr = view;
  return st;
}

#define CHECK_OK(call) CHECK((call) == CAIRN_OK)

/* ---- this process's device memory ---- */
static int use_cuda = 0;
static int (*cuda_malloc)(void**, size_t);
static int (*cuda_free)(void*);
static int (*cuda_memcpy)(void*, const void*, size_t, int); /* 1: host to device, 2: device to host */
static int (*cuda_device_count)(int*);

static int device_init(const char* backend) {
  if (strcmp(backend, "cuda") != 0) return 1;
  const char* names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
  void* h = NULL;
  for (size_t i = 0; i < 3 && !h; ++i) h = dlopen(names[i], RTLD_NOW);
  if (!h) return 0;
  *(void**)(&cuda_malloc) = dlsym(h, "cudaMalloc");
  *(void**)(&cuda_free) = dlsym(h, "cudaFree");
  *(void**)(&cuda_memcpy) = dlsym(h, "cudaMemcpy");
  *(void**)(&cuda_device_count) = dlsym(h, "cudaGetDeviceCount");
  use_cuda = cuda_malloc && cuda_free && cuda_memcpy && cuda_device_count;
  return use_cuda;
}
static void* dev_alloc(size_t n) {
  void* p = NULL;
  if (!use_cuda) return malloc(n);
  return cuda_malloc(&p, n) == 0 ? p : NULL;
}
static void dev_free(void* p) {
  if (use_cuda)
    cuda_free(p);
  else
    free(p);
}
static void dev_upload(void* dst, const void* src, size_t n) {
  if (use_cuda)
    cuda_memcpy(dst, src, n, 1);
  else
    memcpy(dst, src, n);
}
static void dev_download(void* dst, const void* src, size_t n) {
  if (use_cuda)
    cuda_memcpy(dst, src, n, 2);
  else
    memcpy(dst, src, n);
}

/* ---- bytes ---- */
static void fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)x;
  }
}
static uint64_t fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
/* The bytes behind a device pointer, in host memory (malloc'd). */
static uint8_t* download(const void* dev, size_t n) {
  uint8_t* h = malloc(n ? n : 1);
  dev_download(h, dev, n);
  return h;
}

static cairn_client* connect_or_die(void) {
  cairn_client* c = NULL;
  if (cairn_connect(NULL, &c) != CAIRN_OK) {
    fprintf(stderr, "connect: %s\n", cairn_last_error());
    exit(2);
  }
  return c;
}

static cairn_status put_model(cairn_client* c, const char* id, int n, char** specs) {
  cairn_model_writer* w = NULL;
  cairn_status st = cairn_model_create(c, id, NULL, &w);
  for (int i = 0; st == CAIRN_OK && i < n; ++i) {
    char name[256];
    unsigned long long bytes = 0, seed = 0;
    if (sscanf(specs[i], "%255[^:]:%llu:%llu", name, &bytes, &seed) != 3) return CAIRN_ERR_INVALID_ARGUMENT;
    uint8_t* p = malloc(bytes ? bytes : 1);
    fill(p, bytes, seed);
    int64_t shape[1] = {(int64_t)bytes};
    st = cairn_model_add_tensor(w, name, p, CAIRN_DTYPE_U8, 1, shape);
    free(p);
  }
  if (st != CAIRN_OK) {
    cairn_model_abort(w);
    return st;
  }
  return cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, NULL);
}

/* ---- the suite ---- */
static void suite(const char* backend) {
  cairn_client* c = connect_or_die();
  const size_t wn = 300 * 1024, bn = 40;
  uint8_t *w_host = malloc(wn), *b_host = malloc(bn);
  fill(w_host, wn, 1);
  fill(b_host, bn, 2);

  /* Capacity, first, on an empty pool (the test daemon has 1 MiB per device): two 400 KiB tensors
   * held by device leases leave no room for a third; closing the reader gives the space back. */
  char s0[] = "t0:409600:10", s1[] = "t1:409600:11", s2[] = "t2:409600:12";
  char* specs[] = {s0, s1, s2};
  CHECK_OK(put_model(c, "big", 3, specs));
  cairn_model_reader *r1 = NULL, *r2 = NULL;
  const void* p = NULL;
  size_t n = 0;
  CHECK_OK(cairn_model_open(c, "big", &r1));
  CHECK_OK(map_device(r1, "t0", 0, &p, &n));
  CHECK_OK(map_device(r1, "t1", 0, &p, &n));
  cairn_client* c2 = connect_or_die();
  CHECK_OK(cairn_model_open(c2, "big", &r2));
  CHECK(map_device(r2, "t2", 0, &p, &n) == CAIRN_ERR_NO_SPACE);
  CHECK(strstr(cairn_last_error(), "device leases") != NULL);
  {
    /* A copy into a device buffer still works while the pool is held: from the arena instead. */
    void* d2 = dev_alloc(409600);
    uint8_t* want = malloc(409600);
    fill(want, 409600, 12);
    CHECK_OK(cairn_model_read_tensor(r2, "t2", d2, 409600, CAIRN_MEM_CUDA));
    uint8_t* seen = download(d2, 409600);
    CHECK(memcmp(seen, want, 409600) == 0);
    free(seen);
    free(want);
    dev_free(d2);
  }
  cairn_model_close(r1);
  CHECK_OK(map_device(r2, "t2", 0, &p, &n));
  if (p && n == 409600) {
    uint8_t *want = malloc(n), *seen = download(p, n);
    fill(want, n, 12);
    CHECK(memcmp(seen, want, n) == 0);
    free(want);
    free(seen);
  }
  cairn_model_close(r2);
  cairn_disconnect(c2);

  /* Commits from device memory: the caller overwrites its buffer at once after the add. */
  void *w_dev = dev_alloc(wn), *b_dev = dev_alloc(bn);
  CHECK(w_dev && b_dev);
  dev_upload(w_dev, w_host, wn);
  dev_upload(b_dev, b_host, bn);
  cairn_model_writer* w = NULL;
  CHECK_OK(cairn_model_create(c, "devc", NULL, &w));
  int64_t wshape[2] = {300, 256}, bshape[1] = {10};
  CHECK_OK(cairn_model_add_tensor_device(w, "w", w_dev, CAIRN_DTYPE_F32, 2, wshape));
  CHECK_OK(cairn_model_add_tensor_device(w, "b", b_dev, CAIRN_DTYPE_I32, 1, bshape));
  {
    uint8_t* zeros = calloc(wn, 1);
    dev_upload(w_dev, zeros, wn); /* training goes on writing its buffer */
    free(zeros);
  }
  CHECK(cairn_model_add_tensor_device(w, "w", w_dev, CAIRN_DTYPE_F32, 2, wshape) == CAIRN_ERR_EXISTS);
  CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, NULL));

  cairn_model_reader* r = NULL;
  CHECK_OK(cairn_model_open(c, "devc", &r));
  uint8_t* host = malloc(wn);
  CHECK_OK(cairn_model_read_tensor(r, "w", host, wn, CAIRN_MEM_HOST));
  CHECK(memcmp(host, w_host, wn) == 0);

  /* A zero-copy device view, and the same tensor copied into a device buffer. */
  CHECK_OK(map_device(r, "w", -1, &p, &n));
  CHECK(n == wn);
  if (p && n == wn) {
    uint8_t* seen = download(p, n);
    CHECK(memcmp(seen, w_host, wn) == 0);
    free(seen);
  }
  const void* p2 = NULL;
  CHECK_OK(map_device(r, "w", 0, &p2, &n));
  CHECK(p2 == p); /* one slab mapping per connection, the same entry */
  const void* pb = NULL;
  CHECK_OK(map_device(r, "b", 0, &pb, &n));
  CHECK(n == bn);
  if (pb) {
    uint8_t* seen = download(pb, bn);
    CHECK(memcmp(seen, b_host, bn) == 0);
    free(seen);
  }
  void* dst = dev_alloc(wn);
  CHECK_OK(cairn_model_read_tensor(r, "w", dst, wn, CAIRN_MEM_CUDA));
  {
    uint8_t* seen = download(dst, wn);
    CHECK(memcmp(seen, w_host, wn) == 0);
    free(seen);
  }
  CHECK(cairn_model_read_tensor(r, "w", dst, wn - 1, CAIRN_MEM_CUDA) == CAIRN_ERR_INVALID_ARGUMENT);
  CHECK(map_device(r, "nope", 0, &p, &n) == CAIRN_ERR_NOT_FOUND);
  CHECK(map_device(r, "w", 7, &p, &n) == CAIRN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(cairn_last_error(), "tiers.hbm.devices") != NULL);
  cairn_model_close(r);

  dev_free(dst);
  dev_free(w_dev);
  dev_free(b_dev);
  free(host);
  free(w_host);
  free(b_host);
  cairn_disconnect(c);
  printf("hbm suite (%s): %d checks, %d failed\n", backend, checks, failures);
}

static int map_one(const char* id, const char* name, int hold_forever, int count, char** names) {
  cairn_client* c = connect_or_die();
  cairn_model_reader* r = NULL;
  if (cairn_model_open(c, id, &r) != CAIRN_OK) {
    fprintf(stderr, "open: %s\n", cairn_last_error());
    return 1;
  }
  for (int i = 0; i < count; ++i) {
    const char* t = names ? names[i] : name;
    const void* p = NULL;
    size_t n = 0;
    if (map_device(r, t, -1, &p, &n) != CAIRN_OK) {
      fprintf(stderr, "map %s: %s\n", t, cairn_last_error());
      return 1;
    }
    uint8_t* host = malloc(n ? n : 1);
    if (cairn_model_read_tensor(r, t, host, n, CAIRN_MEM_HOST) != CAIRN_OK) return 1;
    uint8_t* seen = download(p, n);
    printf("%s host=%016llx device=%016llx ptr=%p\n", t, (unsigned long long)fnv(host, n),
           (unsigned long long)fnv(seen, n), p);
    free(host);
    free(seen);
  }
  if (hold_forever) {
    printf("held\n");
    fflush(stdout);
    for (;;) sleep(600);
  }
  cairn_model_close(r);
  cairn_disconnect(c);
  return 0;
}

static int no_hbm(void) {
  cairn_client* c = connect_or_die();
  char s0[] = "x:4096:3";
  char* specs[] = {s0};
  CHECK_OK(put_model(c, "plain", 1, specs));
  cairn_model_reader* r = NULL;
  CHECK_OK(cairn_model_open(c, "plain", &r));
  const void* p = NULL;
  size_t n = 0;
  CHECK(map_device(r, "x", -1, &p, &n) == CAIRN_ERR_UNAVAILABLE);
  CHECK(strstr(cairn_last_error(), "no HBM tier") != NULL);
  /* No HBM tier. Without a GPU in this process either: a clear error naming both. With one: copies
   * between the arena and device memory. */
  int n_gpus = 0;
  const int gpu = device_init("cuda") && cuda_device_count(&n_gpus) == 0 && n_gpus > 0;
  use_cuda = gpu;
  void* dev = dev_alloc(4096);
  cairn_status st = cairn_model_read_tensor(r, "x", dev, 4096, CAIRN_MEM_CUDA);
  if (!gpu) {
    CHECK(st == CAIRN_ERR_UNAVAILABLE);
    CHECK(strstr(cairn_last_error(), "no HBM tier") != NULL);
  }
  cairn_model_writer* w = NULL;
  CHECK_OK(cairn_model_create(c, "plain2", NULL, &w));
  int64_t shape[1] = {4096};
  cairn_status add = cairn_model_add_tensor_device(w, "x", dev, CAIRN_DTYPE_U8, 1, shape);
  if (!gpu) {
    CHECK(add == CAIRN_ERR_UNAVAILABLE);
    CHECK(strstr(cairn_last_error(), "no HBM tier") != NULL);
    cairn_model_abort(w);
  } else {
    uint8_t want[4096], *seen = download(dev, 4096);
    fill(want, 4096, 3);
    CHECK_OK(st);
    CHECK(memcmp(seen, want, 4096) == 0);
    free(seen);
    CHECK_OK(add);
    CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, NULL));
    printf("no hbm: went through this process's GPU\n");
  }
  dev_free(dev);
  cairn_model_close(r);
  cairn_disconnect(c);
  printf("no hbm: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "suite") == 0) {
    if (!device_init(argv[2])) {
      printf("skipped: no GPU (libcudart cannot be loaded)\n");
      return 0;
    }
    suite(argv[2]);
    return failures ? 1 : 0;
  }
  if (argc >= 3 && strcmp(argv[1], "put") == 0) {
    cairn_client* c = connect_or_die();
    cairn_status st = put_model(c, argv[2], argc - 3, argv + 3);
    if (st != CAIRN_OK) fprintf(stderr, "put: %s\n", cairn_last_error());
    cairn_disconnect(c);
    return st == CAIRN_OK ? 0 : 1;
  }
  if (argc == 5 && strcmp(argv[1], "map") == 0) {
    if (!device_init(argv[4])) return 3;
    return map_one(argv[2], argv[3], 0, 1, NULL);
  }
  if (argc >= 5 && strcmp(argv[1], "hold") == 0) {
    if (!device_init(argv[3])) return 3;
    return map_one(argv[2], NULL, 1, argc - 4, argv + 4);
  }
  if (argc == 2 && strcmp(argv[1], "nohbm") == 0) return no_hbm();
  fprintf(stderr,
          "usage: hbm_test suite BACKEND | put ID NAME:BYTES:SEED... | map ID NAME BACKEND | "
          "hold ID BACKEND NAME... | nohbm\n");
  return 2;
}
