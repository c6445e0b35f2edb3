/* A C99 program that uses only the C calls the design fixes (ARCHITECTURE.md, "C API"), exactly as
 * written there: it must build (with -Werror) and run unchanged against every release. Run by
 * tests/integration/test_c_api.py against a running cairnd ($CAIRN_SOCKET). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cairn/cairn.h"
#include "check.h"

int main(int argc, char** argv) {
  const char* suffix = argc > 1 ? argv[1] : "";
  char base[128], child[128], query[512];
  cairn_client* c = NULL;
  cairn_model_writer* w = NULL;
  cairn_model_reader* r = NULL;
  cairn_ticket* t = NULL;
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0}, bias[3] = {7, 8, 9};
  int64_t shape[2] = {2, 3}, shape_b[1] = {3}, got[CAIRN_MAX_DIMS];
  cairn_dtype dt;
  int ndim = 0, found = 0;
  size_t nbytes = 0, count = 0;
  const char* name = NULL;
  const void* view = NULL;
  char* result = NULL;
  snprintf(base, sizeof base, "contract-base%s", suffix);
  snprintf(child, sizeof child, "contract-child%s", suffix);

  CHECK(strcmp(cairn_status_string(CAIRN_OK), "ok") == 0);
  CHECK(cairn_connect(NULL, &c) == CAIRN_OK);
  if (!c) return 1;

  /* Named tensors. */
  CHECK(cairn_put_tensor(c, "contract/x", x, CAIRN_DTYPE_F32, 2, shape) == CAIRN_OK);
  CHECK(cairn_get_tensor_info(c, "contract/x", &dt, &ndim, got, &nbytes) == CAIRN_OK);
  CHECK(dt == CAIRN_DTYPE_F32 && ndim == 2 && got[0] == 2 && got[1] == 3 && nbytes == sizeof x);
  CHECK(cairn_unpack_tensor(c, "contract/x", y, sizeof y) == CAIRN_OK && memcmp(x, y, sizeof x) == 0);
  CHECK(cairn_poll_tensor(c, "contract/x", 0, &found) == CAIRN_OK && found == 1);
  CHECK(cairn_delete_tensor(c, "contract/x") == CAIRN_OK);
  CHECK(cairn_poll_tensor(c, "contract/x", 0, &found) == CAIRN_OK && found == 0);
  CHECK(cairn_unpack_tensor(c, "contract/x", y, sizeof y) == CAIRN_ERR_NOT_FOUND);
  CHECK(strlen(cairn_last_error()) > 0);

  /* A model, waited for; a child that inherits a tensor, with a ticket. */
  CHECK(cairn_model_create(c, base, NULL, &w) == CAIRN_OK);
  CHECK(cairn_model_add_tensor(w, "w", x, CAIRN_DTYPE_F32, 2, shape) == CAIRN_OK);
  CHECK(cairn_model_add_tensor(w, "b", bias, CAIRN_DTYPE_F32, 1, shape_b) == CAIRN_OK);
  CHECK(cairn_model_set_metadata(w, "{\"score\": 0.5}") == CAIRN_OK);
  CHECK(cairn_model_set_architecture(w,
                                     "{\"layers\": [{\"name\": \"fc\", \"type\": \"Linear\", \"config\": {}, "
                                     "\"inputs\": []}], \"tensors\": {\"w\": \"fc\", \"b\": \"fc\"}}") == CAIRN_OK);
  CHECK(cairn_model_commit(w, CAIRN_DURABILITY_GLOBAL, NULL) == CAIRN_OK);
  CHECK(cairn_model_create(c, child, base, &w) == CAIRN_OK);
  CHECK(cairn_model_inherit_tensor(w, "w") == CAIRN_OK);
  CHECK(cairn_model_add_tensor(w, "b", x, CAIRN_DTYPE_F32, 1, shape_b) == CAIRN_OK);
  CHECK(cairn_model_commit(w, CAIRN_DURABILITY_LOCAL, &t) == CAIRN_OK);
  CHECK(cairn_wait(t, -1) == CAIRN_OK);
  cairn_ticket_free(t);
  CHECK(cairn_model_create(c, base, NULL, &w) == CAIRN_OK);
  cairn_model_abort(w);

  /* Reading it back: a copy and a zero-copy view. */
  CHECK(cairn_model_open(c, child, &r) == CAIRN_OK);
  if (r) {
    CHECK(cairn_model_tensor_count(r, &count) == CAIRN_OK && count == 2);
    CHECK(cairn_model_tensor_info(r, 0, &name, &dt, &ndim, got, &nbytes) == CAIRN_OK);
    CHECK(name != NULL && strcmp(name, "w") == 0 && nbytes == sizeof x);
    CHECK(cairn_model_read_tensor(r, "w", y, sizeof y, CAIRN_MEM_HOST) == CAIRN_OK && memcmp(x, y, sizeof x) == 0);
    CHECK(cairn_model_map_tensor(r, "b", &view, &nbytes) == CAIRN_OK);
    CHECK(nbytes == sizeof bias && memcmp(view, x, sizeof bias) == 0);
    cairn_model_close(r);
  }
  CHECK(cairn_model_open(c, "contract-no-such-model", &r) == CAIRN_ERR_NOT_FOUND);

  /* Prefetch and a lineage query. */
  CHECK(cairn_prefetch(c, child) == CAIRN_OK);
  snprintf(query, sizeof query, "{\"op\":\"ancestors\",\"model\":\"%s\"}", child);
  CHECK(cairn_query(c, query, &result) == CAIRN_OK);
  CHECK(result != NULL && strstr(result, base) != NULL);
  cairn_free(result);

  cairn_disconnect(c);
  printf("contract_test: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
