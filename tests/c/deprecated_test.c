/* The names cairn.h keeps for compatibility -- the deprecated ones (removed in the next release)
 * and the synonyms the design fixes -- still work and do what their replacements do
 * (docs/api.md). Built with -Wno-deprecated-declarations; tests/integration/test_c_api.py also
 * compiles it with -Werror to check that each deprecated name warns, naming its replacement. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cairn/cairn.h"
#include "check.h"

static float alloc_buffer[6];
static void* alloc_into(void* ctx, cairn_dtype dtype, int ndim, const int64_t* shape, size_t nbytes) {
  (void)ctx;
  (void)shape;
  return dtype == CAIRN_DTYPE_F32 && ndim == 2 && nbytes == sizeof alloc_buffer ? alloc_buffer : NULL;
}

int main(int argc, char** argv) {
  const char* suffix = argc > 1 ? argv[1] : "";
  char id[128], piped[128], *result = NULL;
  cairn_client* c = NULL;
  cairn_model_writer* w = NULL;
  cairn_model_reader* r = NULL;
  cairn_ticket* t = NULL;
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0}, z[6] = {0};
  int64_t shape[2] = {2, 3};
  const char* names[2] = {"x", "y"};
  const void* views[2] = {NULL, NULL};
  void *cow[2] = {NULL, NULL}, *dsts[2] = {y, z};
  size_t sizes[2] = {0, 0}, dst_bytes[2] = {sizeof y, sizeof z};
  snprintf(id, sizeof id, "deprecated%s", suffix);
  snprintf(piped, sizeof piped, "deprecated-piped%s", suffix);
  CHECK(cairn_connect(NULL, &c) == CAIRN_OK);
  if (!c) return 1;

  /* cairn_unpack_tensor_alloc -> cairn_tensor_unpack_alloc. */
  CHECK(cairn_tensor_put(c, "deprecated/x", x, CAIRN_DTYPE_F32, 2, shape) == CAIRN_OK);
  CHECK(cairn_unpack_tensor_alloc(c, "deprecated/x", alloc_into, NULL) == CAIRN_OK);
  CHECK(memcmp(alloc_buffer, x, sizeof x) == 0);
  CHECK(cairn_tensor_delete(c, "deprecated/x") == CAIRN_OK);

  /* cairn_model_commit_pipelined -> cairn_model_commit_opts {wait 0, pipelined 1}. */
  CHECK(cairn_model_create(c, id, NULL, &w) == CAIRN_OK);
  CHECK(cairn_model_add_tensor(w, "x", x, CAIRN_DTYPE_F32, 2, shape) == CAIRN_OK);
  CHECK(cairn_model_add_tensor(w, "y", x, CAIRN_DTYPE_F32, 2, shape) == CAIRN_OK);
  CHECK(cairn_model_commit_pipelined(w, CAIRN_DURABILITY_GLOBAL, &t) == CAIRN_OK);
  CHECK(cairn_ticket_wait(t, -1) == CAIRN_OK);
  cairn_ticket_free(t);
  CHECK(cairn_model_create(c, id, NULL, &w) == CAIRN_OK);
  CHECK(cairn_model_commit_pipelined(w, CAIRN_DURABILITY_MEMORY, &t) == CAIRN_OK);
  CHECK(cairn_ticket_wait(t, -1) == CAIRN_ERR_EXISTS); /* the outcome is the ticket's */
  cairn_ticket_free(t);
  CHECK(cairn_model_create(c, piped, NULL, &w) == CAIRN_OK);
  CHECK(cairn_model_commit_pipelined(w, CAIRN_DURABILITY_MEMORY, NULL) == CAIRN_ERR_INVALID_ARGUMENT);

  /* The read variants -> cairn_model_read / cairn_model_map with cairn_read_options. */
  CHECK(cairn_model_open(c, id, &r) == CAIRN_OK);
  if (r) {
    CHECK(cairn_model_read_tensors(r, 2, names, dsts, dst_bytes) == CAIRN_OK);
    CHECK(memcmp(y, x, sizeof x) == 0 && memcmp(z, x, sizeof x) == 0);
    CHECK(cairn_model_map_tensors(r, 2, names, views, sizes) == CAIRN_OK);
    CHECK(sizes[0] == sizeof x && memcmp(views[0], x, sizeof x) == 0 && memcmp(views[1], x, sizeof x) == 0);
    CHECK(cairn_model_map_tensors_private(r, 2, names, cow, sizes) == CAIRN_OK);
    ((float*)cow[0])[0] = -5.0f;
    CHECK(((const float*)views[0])[0] == 1.0f);
    /* The daemon has no HBM tier: the device forms say so, as cairn_model_map with CAIRN_MEM_CUDA does. */
    CHECK(cairn_model_map_tensor_device(r, "x", -1, views, sizes) == CAIRN_ERR_UNAVAILABLE);
    CHECK(cairn_model_map_tensors_device(r, 2, names, -1, views, sizes) == CAIRN_ERR_UNAVAILABLE);
    CHECK(cairn_model_read_tensors_device(r, 0, names, dsts, dst_bytes) == CAIRN_OK);
    cairn_model_close(r);
  }

  /* cairn_prefetch_all -> cairn_model_prefetch {all 1}: a daemon in no peer group answers for itself. */
  {
    cairn_status st = cairn_prefetch_all(c, id, &result);
    cairn_prefetch_options po = CAIRN_PREFETCH_OPTIONS_INIT;
    char* again = NULL;
    po.all = 1;
    CHECK(st == cairn_model_prefetch(c, id, &po, &again));
    CHECK((result == NULL) == (again == NULL));
    cairn_free(result);
    cairn_free(again);
  }

  /* The synonyms the design fixes behave as the calls they stand for. */
  {
    int found = -1;
    CHECK(cairn_put_tensor(c, "deprecated/s", x, CAIRN_DTYPE_F32, 2, shape) == CAIRN_OK);
    CHECK(cairn_tensor_poll(c, "deprecated/s", 0, &found) == CAIRN_OK && found == 1);
    CHECK(cairn_delete_tensor(c, "deprecated/s") == CAIRN_OK);
    CHECK(cairn_poll_tensor(c, "deprecated/s", 0, &found) == CAIRN_OK && found == 0);
    CHECK(cairn_prefetch(c, id) == CAIRN_OK);
    CHECK(cairn_prefetch(c, "deprecated-no-such-model") == CAIRN_ERR_NOT_FOUND);
  }

  cairn_disconnect(c);
  printf("deprecated_test: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
