/* The C API, exercised from C99 against a running cairnd ($CAIRN_SOCKET). Run by
 * tests/integration/test_c_api.py, which starts and stops the daemon. Uses only cairn.h. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cairn/cairn.h"
#include "check.h"

/* What cairn_file_options.progress reported: calls, the "committing" phase, the last bytes done. */
struct progress_count {
  int calls;
  int committing;
  uint64_t bytes;
};
static void count_progress(void* ctx, const char* phase, uint64_t done, uint64_t total) {
  struct progress_count* p = (struct progress_count*)ctx;
  (void)total;
  ++p->calls;
  if (strcmp(phase, "committing") == 0)
    ++p->committing;
  else
    p->bytes = done;
}

#define CHECK_OK(call) CHECK((call) == CAIRN_OK)

/* cairn_tensor_unpack_alloc's allocator: records the description; ctx is a buffer of 1 MiB floats
 * (NULL from it when the tensor would not fit). */
static cairn_dtype alloc_dtype;
static int alloc_ndim = -1;
static int64_t alloc_shape0;
static void* alloc_into(void* ctx, cairn_dtype dtype, int ndim, const int64_t* shape, size_t nbytes) {
  alloc_dtype = dtype;
  alloc_ndim = ndim;
  alloc_shape0 = ndim > 0 ? shape[0] : -1;
  return nbytes <= (1u << 20) * sizeof(float) ? ctx : NULL;
}

static float* make_floats(size_t n, float seed) {
  float* p = malloc(n * sizeof *p);
  size_t i;
  for (i = 0; i < n; ++i) p[i] = seed + (float)i * 0.5f;
  return p;
}

int main(int argc, char** argv) {
  cairn_client* c = NULL;
  const char* suffix = argc > 1 ? argv[1] : "";
  char base_id[128], child_id[128];
  snprintf(base_id, sizeof base_id, "c-base%s", suffix);
  snprintf(child_id, sizeof child_id, "c-child%s", suffix);

  CHECK(strcmp(cairn_status_string(CAIRN_OK), "ok") == 0);
  CHECK(strcmp(cairn_status_string(CAIRN_ERR_NOT_FOUND), "not found") == 0);
  CHECK(strlen(cairn_status_string((cairn_status)1000)) > 0);
  CHECK(cairn_connect("/nonexistent/dir/cairnd.sock", &c) == CAIRN_ERR_UNAVAILABLE);
  CHECK(strstr(cairn_last_error(), "/nonexistent/dir/cairnd.sock") != NULL);
  CHECK(c == NULL);
  CHECK_OK(cairn_connect(NULL, &c));
  if (!c) return 1;
  CHECK(strcmp(cairn_client_address(NULL), "") == 0);
  if (getenv("CAIRN_SOCKET") != NULL) CHECK(strcmp(cairn_client_address(c), getenv("CAIRN_SOCKET")) == 0);
  CHECK(strlen(cairn_client_address(c)) > 0);

  /* ---- named tensors ---- */
  {
    int64_t shape[2] = {3, 4};
    float small[12], back[12];
    cairn_dtype dt;
    int ndim = 0, found = -1;
    int64_t got_shape[CAIRN_MAX_DIMS];
    size_t nbytes = 0;
    size_t i, big_n = 1u << 20;
    int64_t big_shape[1];
    float *big = make_floats(big_n, 1.0f), *big_back = malloc(big_n * sizeof(float));
    for (i = 0; i < 12; ++i) small[i] = (float)i;
    CHECK_OK(cairn_tensor_put(c, "sim/sample0", small, CAIRN_DTYPE_F32, 2, shape));
    CHECK_OK(cairn_tensor_info(c, "sim/sample0", &dt, &ndim, got_shape, &nbytes));
    CHECK(dt == CAIRN_DTYPE_F32 && ndim == 2 && got_shape[0] == 3 && got_shape[1] == 4 && nbytes == 48);
    CHECK_OK(cairn_tensor_unpack(c, "sim/sample0", back, sizeof back));
    CHECK(memcmp(small, back, sizeof small) == 0);
    CHECK(cairn_tensor_unpack(c, "sim/sample0", back, 4) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK_OK(cairn_tensor_poll(c, "sim/sample0", 0, &found));
    CHECK(found == 1);
    CHECK_OK(cairn_tensor_poll(c, "sim/never", 50, &found));
    CHECK(found == 0);
    big_shape[0] = (int64_t)big_n;
    CHECK_OK(cairn_tensor_put(c, "sim/big", big, CAIRN_DTYPE_F32, 1, big_shape));
    CHECK_OK(cairn_tensor_unpack(c, "sim/big", big_back, big_n * sizeof(float)));
    CHECK(memcmp(big, big_back, big_n * sizeof(float)) == 0);
    memset(big_back, 0, big_n * sizeof(float));
    CHECK_OK(cairn_tensor_unpack_alloc(c, "sim/big", alloc_into, big_back));
    CHECK(alloc_dtype == CAIRN_DTYPE_F32 && alloc_ndim == 1 && alloc_shape0 == (int64_t)big_n);
    CHECK(memcmp(big, big_back, big_n * sizeof(float)) == 0);
    CHECK(cairn_tensor_unpack_alloc(c, "sim/none", alloc_into, big_back) == CAIRN_ERR_NOT_FOUND);
    /* Reserved arena space: used by the adds of its size, the rest freed at commit and abort (a leak
     * of the unused 64 MiB would fill the 256 MiB arena within these rounds). */
    {
      size_t sizes[3] = {big_n * sizeof(float), 64u << 20, big_n * sizeof(float)};
      int round;
      for (round = 0; round < 8; ++round) {
        char rid[160];
        cairn_model_writer* rw = NULL;
        snprintf(rid, sizeof rid, "%s-reserved%d", base_id, round);
        CHECK_OK(cairn_model_create(c, rid, NULL, &rw));
        CHECK_OK(cairn_model_reserve(rw, 3, sizes));
        CHECK_OK(cairn_model_set_copy_threads(rw, round % 4 == 2 ? 1u : 0u)); /* one copy thread, or per core */
        CHECK_OK(cairn_model_add_tensor(rw, "a", big, CAIRN_DTYPE_F32, 1, big_shape));
        CHECK_OK(cairn_model_add_tensor(rw, "b", small, CAIRN_DTYPE_F32, 2, shape));
        if (round % 2) {
          cairn_model_abort(rw);
          continue;
        }
        CHECK_OK(cairn_model_commit(rw, CAIRN_DURABILITY_MEMORY, NULL));
      }
      for (round = 0; round < 4; round += 2) { /* copied with threads per core (0) and with one (2) */
        char rid[160];
        cairn_model_reader* rr = NULL;
        snprintf(rid, sizeof rid, "%s-reserved%d", base_id, round);
        memset(big_back, 0, big_n * sizeof(float));
        CHECK_OK(cairn_model_open(c, rid, &rr));
        CHECK_OK(cairn_model_read_tensor(rr, "a", big_back, big_n * sizeof(float), CAIRN_MEM_HOST));
        CHECK(memcmp(big, big_back, big_n * sizeof(float)) == 0);
        cairn_model_close(rr);
      }
      CHECK(cairn_model_set_copy_threads(NULL, 1) == CAIRN_ERR_INVALID_ARGUMENT);
    }
    big_shape[0] = (int64_t)big_n * 4 + 1;
    {
      unsigned char* huge = calloc(big_n * 4 + 1, 1);
      CHECK_OK(cairn_tensor_put(c, "sim/too-big", huge, CAIRN_DTYPE_U8, 1, big_shape));
      CHECK(cairn_tensor_unpack_alloc(c, "sim/too-big", alloc_into, big_back) == CAIRN_ERR_NO_SPACE);
      free(huge);
    }
    CHECK_OK(cairn_tensor_put(c, "sim/scalar", small, CAIRN_DTYPE_F64, 0, NULL));
    CHECK_OK(cairn_tensor_info(c, "sim/scalar", &dt, &ndim, got_shape, &nbytes));
    CHECK(ndim == 0 && nbytes == 8 && dt == CAIRN_DTYPE_F64);
    CHECK_OK(cairn_tensor_delete(c, "sim/sample0"));
    CHECK(cairn_tensor_info(c, "sim/sample0", &dt, &ndim, got_shape, &nbytes) == CAIRN_ERR_NOT_FOUND);
    CHECK(strstr(cairn_last_error(), "sim/sample0") != NULL);
    CHECK(cairn_tensor_put(c, "sim/x", small, (cairn_dtype)99, 1, shape) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(cairn_tensor_put(c, "sim/x", small, CAIRN_DTYPE_F32, 9, shape) == CAIRN_ERR_INVALID_ARGUMENT);
    free(big);
    free(big_back);
  }

  /* ---- a model and a model derived from it ---- */
  {
    cairn_model_writer* w = NULL;
    cairn_model_reader* r = NULL;
    cairn_ticket* t = NULL;
    size_t n_w = 1u << 21, count = 0, nbytes = 0;
    int64_t s_w[2] = {1024, 2048}, s_b[1] = {16}, s_h[2] = {10, 16};
    float *w1 = make_floats(n_w, 2.0f), *b1 = make_floats(16, 3.0f), *h1 = make_floats(160, 4.0f);
    float *h2 = make_floats(160, 9.0f), *back = malloc(n_w * sizeof(float));
    const void* view = NULL;
    const char* name = NULL;
    char* result = NULL;
    char query[256];
    cairn_dtype dt;
    int ndim;
    int64_t shape[CAIRN_MAX_DIMS];

    CHECK_OK(cairn_model_create(c, base_id, NULL, &w));
    CHECK_OK(cairn_model_add_tensor(w, "body.weight", w1, CAIRN_DTYPE_F32, 2, s_w));
    CHECK_OK(cairn_model_add_tensor(w, "body.bias", b1, CAIRN_DTYPE_F32, 1, s_b));
    CHECK_OK(cairn_model_add_tensor(w, "head.weight", h1, CAIRN_DTYPE_F32, 2, s_h));
    CHECK(cairn_model_add_tensor(w, "head.weight", h1, CAIRN_DTYPE_F32, 2, s_h) == CAIRN_ERR_EXISTS);
    CHECK(cairn_model_inherit_tensor(w, "x") == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK_OK(cairn_model_set_metadata(w, "{\"score\": 0.5, \"task\": \"c-test\"}"));
    CHECK(cairn_model_set_metadata(w, "{not json") == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_GLOBAL, NULL));

    CHECK_OK(cairn_model_create(c, child_id, base_id, &w));
    CHECK_OK(cairn_model_inherit_tensor(w, "body.weight"));
    CHECK_OK(cairn_model_inherit_tensor(w, "body.bias"));
    CHECK_OK(cairn_model_add_tensor(w, "head.weight", h2, CAIRN_DTYPE_F32, 2, s_h));
    CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, &t));
    CHECK(t != NULL);
    CHECK_OK(cairn_ticket_wait(t, -1));
    cairn_ticket_free(t);

    CHECK_OK(cairn_model_create(c, "c-never", NULL, &w));
    CHECK(cairn_model_commit(w, (cairn_durability)7, NULL) == CAIRN_ERR_INVALID_ARGUMENT); /* frees w */
    CHECK(strstr(cairn_last_error(), "durability") != NULL);
    CHECK(cairn_model_create(c, base_id, NULL, &w) == CAIRN_OK);
    CHECK(cairn_model_commit(w, CAIRN_DURABILITY_GLOBAL, NULL) == CAIRN_ERR_EXISTS);
    CHECK(strstr(cairn_last_error(), base_id) != NULL);

    /* Pipelined commits (memory, with a ticket): the call returns once the request is written; the
     * duplicate id's error comes from its own ticket only, and later commits still succeed. */
    {
      cairn_ticket* tk[8];
      char pid[200], ppar[200];
      int i;
      cairn_commit_options pipelined = CAIRN_COMMIT_OPTIONS_INIT;
      for (i = 0; i < 8; ++i) {
        snprintf(pid, sizeof pid, "%s-pl%d", base_id, i);
        if (i == 0)
          snprintf(ppar, sizeof ppar, "%s", base_id);
        else
          snprintf(ppar, sizeof ppar, "%s-pl%d", base_id, i == 4 ? 2 : i - 1);
        CHECK_OK(cairn_model_create(c, i == 3 ? base_id : pid, ppar, &w));
        CHECK_OK(cairn_model_inherit_all(w));
        CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, &tk[i]));
        CHECK(tk[i] != NULL);
      }
      CHECK(cairn_pipeline_in_flight(c) > 0);
      for (i = 0; i < 8; ++i) {
        if (i == 3) {
          CHECK(cairn_ticket_wait(tk[i], -1) == CAIRN_ERR_EXISTS);
          CHECK(strstr(cairn_last_error(), base_id) != NULL);
        } else {
          CHECK_OK(cairn_ticket_wait(tk[i], -1));
        }
        cairn_ticket_free(tk[i]);
      }
      CHECK(cairn_pipeline_in_flight(c) == 0);
      /* A freed, unwaited ticket's error comes from the next pipeline flush. */
      CHECK_OK(cairn_model_create(c, base_id, base_id, &w));
      CHECK_OK(cairn_model_inherit_all(w));
      CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, &tk[0]));
      cairn_ticket_free(tk[0]);
      CHECK(cairn_pipeline_flush(c) == CAIRN_ERR_EXISTS);
      CHECK_OK(cairn_pipeline_flush(c));

      /* Pipelined above memory: the call returns before the reply; the ticket gives the commit's
       * own outcome, then the durability. */
      snprintf(pid, sizeof pid, "%s-plg", base_id);
      pipelined.wait = 0;
      pipelined.pipelined = 1;
      for (i = 0; i < 2; ++i) {
        CHECK_OK(cairn_model_create(c, pid, base_id, &w));
        CHECK_OK(cairn_model_add_tensor(w, "extra", h1, CAIRN_DTYPE_F32, 2, s_h));
        CHECK_OK(cairn_model_commit_opts(w, &pipelined, &tk[i]));
      }
      CHECK(cairn_pipeline_in_flight(c) > 0);
      CHECK_OK(cairn_ticket_wait(tk[0], -1));
      CHECK(cairn_ticket_wait(tk[1], -1) == CAIRN_ERR_EXISTS);
      cairn_ticket_free(tk[0]);
      cairn_ticket_free(tk[1]);
      CHECK_OK(cairn_model_create(c, pid, NULL, &w));
      CHECK(cairn_model_commit_opts(w, &pipelined, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "ticket") != NULL);
    }

    /* Hints: advice, so unknown models are listed, not an error; a malformed hint names its field. */
    {
      char hint[512], *res = NULL;
      snprintf(hint, sizeof hint, "{\"kind\":\"will_load\",\"models\":[\"%s\",\"no-such-model\"],\"when\":\"next\"}",
               child_id);
      CHECK_OK(cairn_hint(c, hint, &res));
      CHECK(res != NULL && strstr(res, "no-such-model") != NULL);
      cairn_free(res);
      CHECK_OK(cairn_hint(c, "{\"kind\":\"done\",\"models\":[\"x\"]}", NULL));
      CHECK(cairn_hint(c, "{\"kind\":\"soon\",\"models\":[]}", NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "hint.kind") != NULL);
      CHECK(cairn_hint(c, "not json", NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_hint(NULL, "{}", NULL) == CAIRN_ERR_INVALID_ARGUMENT);
    }
    CHECK_OK(cairn_model_open(c, child_id, &r));
    CHECK_OK(cairn_model_tensor_count(r, &count));
    CHECK(count == 3);
    CHECK_OK(cairn_model_tensor_info(r, 0, &name, &dt, &ndim, shape, &nbytes));
    CHECK(strcmp(name, "body.weight") == 0 && dt == CAIRN_DTYPE_F32 && ndim == 2 && shape[1] == 2048);
    CHECK(cairn_model_tensor_info(r, 3, &name, &dt, &ndim, shape, &nbytes) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK_OK(cairn_model_read_tensor(r, "body.weight", back, n_w * sizeof(float), CAIRN_MEM_HOST));
    CHECK(memcmp(back, w1, n_w * sizeof(float)) == 0);
    CHECK_OK(cairn_model_read_tensor(r, "head.weight", back, 160 * sizeof(float), CAIRN_MEM_HOST));
    CHECK(memcmp(back, h2, 160 * sizeof(float)) == 0);
    CHECK(cairn_model_read_tensor(r, "head.weight", back, 8, CAIRN_MEM_HOST) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(cairn_model_read_tensor(r, "nope", back, 8, CAIRN_MEM_HOST) == CAIRN_ERR_NOT_FOUND);
    CHECK(cairn_model_read_tensor(r, "body.bias", back, 64, (cairn_memkind)42) == CAIRN_ERR_INVALID_ARGUMENT);
    /* Device memory: without a GPU (or a CUDA build) the call says so instead of crashing. A real
     * device buffer is exercised by the GPU tests when a GPU is present. */
    if (getenv("CAIRN_TEST_HAVE_GPU") == NULL) {
      CHECK(cairn_model_read_tensor(r, "body.bias", (void*)back, 64, CAIRN_MEM_CUDA) == CAIRN_ERR_UNAVAILABLE);
      CHECK(strlen(cairn_last_error()) > 0);
    }
    CHECK_OK(cairn_model_map_tensor(r, "body.weight", &view, &nbytes));
    CHECK(nbytes == n_w * sizeof(float) && memcmp(view, w1, nbytes) == 0);
    CHECK_OK(cairn_model_map_tensor(r, "body.bias", &view, &nbytes));
    CHECK(nbytes == 64 && memcmp(view, b1, 64) == 0);
    /* Several tensors with one request: mapped, and copied. */
    {
      const char* both[2] = {"body.bias", "body.weight"};
      void* views[2] = {NULL, NULL};
      size_t sizes[2] = {0, 0};
      CHECK_OK(cairn_model_map(r, 2, both, views, sizes, NULL));
      CHECK(sizes[0] == 64 && memcmp(views[0], b1, 64) == 0);
      CHECK(sizes[1] == n_w * sizeof(float) && memcmp(views[1], w1, sizes[1]) == 0);
      float bias_copy[16];
      float* weight_copy = malloc(n_w * sizeof(float));
      void* dsts[2] = {bias_copy, weight_copy};
      size_t dst_bytes[2] = {sizeof bias_copy, n_w * sizeof(float)};
      CHECK(weight_copy != NULL);
      CHECK_OK(cairn_model_read(r, 2, both, dsts, dst_bytes, NULL));
      CHECK(memcmp(bias_copy, b1, 64) == 0 && memcmp(weight_copy, w1, n_w * sizeof(float)) == 0);
      dst_bytes[0] = 8;
      CHECK(cairn_model_read(r, 2, both, dsts, dst_bytes, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      const char* missing[2] = {"body.bias", "nope"};
      CHECK(cairn_model_map(r, 2, missing, views, sizes, NULL) == CAIRN_ERR_NOT_FOUND);
      CHECK(strstr(cairn_last_error(), "nope") != NULL);
      CHECK(cairn_model_map(r, 2, NULL, views, sizes, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      /* Copy-on-write views: writable, and a write changes neither the stored tensor nor the
       * read-only view of it. */
      void* cow[2] = {NULL, NULL};
      cairn_read_options cow_opts = CAIRN_READ_OPTIONS_INIT;
      cow_opts.private_copy = 1;
      CHECK_OK(cairn_model_map(r, 2, both, cow, sizes, &cow_opts));
      CHECK(sizes[0] == 64 && memcmp(cow[0], b1, 64) == 0);
      CHECK(sizes[1] == n_w * sizeof(float) && memcmp(cow[1], w1, sizes[1]) == 0);
      memset(cow[1], 0x5a, sizes[1]);
      ((float*)cow[0])[3] = -1.0f;
      CHECK(((const unsigned char*)cow[1])[sizes[1] - 1] == 0x5a && ((float*)cow[0])[3] == -1.0f);
      CHECK(memcmp(views[1], w1, sizes[1]) == 0 && memcmp(views[0], b1, 64) == 0);
      CHECK_OK(cairn_model_read(r, 2, both, dsts, (size_t[2]){64, n_w * sizeof(float)}, NULL));
      CHECK(memcmp(bias_copy, b1, 64) == 0 && memcmp(weight_copy, w1, n_w * sizeof(float)) == 0);
      CHECK(cairn_model_map(r, 2, missing, cow, sizes, &cow_opts) == CAIRN_ERR_NOT_FOUND);
      CHECK(cairn_model_map(r, 2, NULL, cow, sizes, &cow_opts) == CAIRN_ERR_INVALID_ARGUMENT);
      free(weight_copy);
    }
    cairn_model_close(r);

    CHECK(cairn_model_open(c, "no-such-model", &r) == CAIRN_ERR_NOT_FOUND);
    CHECK(strstr(cairn_last_error(), "no-such-model") != NULL);

    snprintf(query, sizeof query, "{\"op\":\"ancestors\",\"model\":\"%s\"}", child_id);
    CHECK_OK(cairn_query(c, query, &result));
    CHECK(result != NULL && strstr(result, base_id) != NULL);
    cairn_free(result);
    snprintf(query, sizeof query, "{\"op\":\"descendants\",\"model\":\"%s\"}", base_id);
    CHECK_OK(cairn_query(c, query, &result));
    CHECK(result != NULL && strstr(result, child_id) != NULL);
    cairn_free(result);
    CHECK(cairn_query(c, "{\"op\":\"teleport\"}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK_OK(cairn_prefetch(c, base_id));

    /* Zero-copy writes into arena space, and inherit_all: the parent's other tensors follow. */
    {
      char space_id[128], meta_id[128], needle[160];
      void* data = NULL;
      float* dst;
      size_t k;
      snprintf(space_id, sizeof space_id, "c-space%s", suffix);
      snprintf(meta_id, sizeof meta_id, "c-meta%s", suffix);
      CHECK_OK(cairn_model_create(c, space_id, base_id, &w));
      CHECK(cairn_model_add_tensor_space(w, "x", (cairn_dtype)99, 1, s_b, &data) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_model_add_tensor_space(w, "x", CAIRN_DTYPE_F32, 9, s_b, &data) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_model_add_tensor_space(w, "x", CAIRN_DTYPE_F32, 1, s_b, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK_OK(cairn_model_add_tensor_space(w, "head.weight", CAIRN_DTYPE_F32, 2, s_h, &data));
      CHECK(data != NULL);
      if (data) {
        dst = (float*)data;
        for (k = 0; k < 160; ++k) dst[k] = h2[k];
      }
      /* Written: sealed (hashed now, not at commit); once only, and only arena space. */
      CHECK_OK(cairn_model_seal_tensor(w, "head.weight"));
      CHECK(cairn_model_seal_tensor(w, "head.weight") == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_model_seal_tensor(w, "no.such") == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_model_seal_tensor(NULL, "head.weight") == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_model_add_tensor_space(w, "head.weight", CAIRN_DTYPE_F32, 2, s_h, &data) == CAIRN_ERR_EXISTS);
      CHECK(data == NULL);
      CHECK_OK(cairn_model_inherit_all(w));
      CHECK(cairn_model_inherit_all(NULL) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_GLOBAL, NULL));
      CHECK_OK(cairn_model_open(c, space_id, &r));
      CHECK_OK(cairn_model_tensor_count(r, &count));
      CHECK(count == 3);
      CHECK_OK(cairn_model_tensor_info(r, 0, &name, &dt, &ndim, shape, &nbytes));
      CHECK(strcmp(name, "head.weight") == 0 && nbytes == 160 * sizeof(float));
      CHECK_OK(cairn_model_tensor_info(r, 1, &name, &dt, &ndim, shape, &nbytes));
      CHECK(strcmp(name, "body.weight") == 0);
      CHECK_OK(cairn_model_read_tensor(r, "head.weight", back, 160 * sizeof(float), CAIRN_MEM_HOST));
      CHECK(memcmp(back, h2, 160 * sizeof(float)) == 0);
      CHECK_OK(cairn_model_read_tensor(r, "body.weight", back, n_w * sizeof(float), CAIRN_MEM_HOST));
      CHECK(memcmp(back, w1, n_w * sizeof(float)) == 0);
      cairn_model_close(r);

      /* A metadata-only commit: every tensor inherited. */
      CHECK_OK(cairn_model_create(c, meta_id, base_id, &w));
      CHECK_OK(cairn_model_inherit_all(w));
      CHECK_OK(cairn_model_set_metadata(w, "{\"score\": 0.75}"));
      CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_GLOBAL, NULL));
      CHECK_OK(cairn_model_open(c, meta_id, &r));
      CHECK_OK(cairn_model_tensor_count(r, &count));
      CHECK(count == 3);
      cairn_model_close(r);
      /* Many tensors in one call (copied on every core), in order; a bad batch adds nothing. */
      {
        char batch_id[128];
        cairn_tensor_in in[3] = {
            {"h", h2, CAIRN_DTYPE_F32, 2, s_h}, {"w", w1, CAIRN_DTYPE_F32, 2, s_w}, {"b", b1, CAIRN_DTYPE_F32, 1, s_b}};
        cairn_tensor_in dup[2] = {{"d", b1, CAIRN_DTYPE_F32, 1, s_b}, {"d", b1, CAIRN_DTYPE_F32, 1, s_b}};
        cairn_tensor_in bad[2] = {{"e", b1, CAIRN_DTYPE_F32, 1, s_b}, {NULL, b1, CAIRN_DTYPE_F32, 1, s_b}};
        snprintf(batch_id, sizeof batch_id, "c-batch%s", suffix);
        CHECK_OK(cairn_model_create(c, batch_id, NULL, &w));
        CHECK(cairn_model_add_tensors(w, dup, 2) == CAIRN_ERR_EXISTS);
        CHECK(strstr(cairn_last_error(), "'d'") != NULL);
        CHECK(cairn_model_add_tensors(w, bad, 2) == CAIRN_ERR_INVALID_ARGUMENT);
        CHECK(strstr(cairn_last_error(), "tensors[1]") != NULL);
        CHECK(cairn_model_add_tensors(NULL, in, 3) == CAIRN_ERR_INVALID_ARGUMENT);
        CHECK_OK(cairn_model_add_tensors(w, in, 0));
        CHECK_OK(cairn_model_add_tensors(w, in, 3));
        CHECK(cairn_model_add_tensors(w, in, 1) == CAIRN_ERR_EXISTS);
        CHECK_OK(cairn_model_commit(w, CAIRN_DURABILITY_MEMORY, NULL));
        CHECK_OK(cairn_model_open(c, batch_id, &r));
        CHECK_OK(cairn_model_tensor_count(r, &count));
        CHECK(count == 3); /* "d" and "e" never got in */
        CHECK_OK(cairn_model_tensor_info(r, 1, &name, &dt, &ndim, shape, &nbytes));
        CHECK(strcmp(name, "w") == 0 && nbytes == n_w * sizeof(float));
        CHECK_OK(cairn_model_read_tensor(r, "w", back, n_w * sizeof(float), CAIRN_MEM_HOST));
        CHECK(memcmp(back, w1, n_w * sizeof(float)) == 0);
        CHECK_OK(cairn_model_read_tensor(r, "h", back, 160 * sizeof(float), CAIRN_MEM_HOST));
        CHECK(memcmp(back, h2, 160 * sizeof(float)) == 0);
        CHECK_OK(cairn_model_read_tensor(r, "b", back, 16 * sizeof(float), CAIRN_MEM_HOST));
        CHECK(memcmp(back, b1, 16 * sizeof(float)) == 0);
        cairn_model_close(r);
      }
      CHECK_OK(cairn_model_create(c, "c-orphan", NULL, &w));
      CHECK(cairn_model_inherit_all(w) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "parent") != NULL);
      cairn_model_abort(w);

      /* cairn_request: catalog and administration requests. */
      snprintf(needle, sizeof needle, "\"%s\"", meta_id);
      CHECK_OK(cairn_request(c, "{\"op\":\"list\"}", &result));
      CHECK(result != NULL && strncmp(result, "{\"models\":", 10) == 0 && strstr(result, needle) != NULL);
      cairn_free(result);
      snprintf(query, sizeof query, "{\"op\":\"show\",\"id\":\"%s\"}", meta_id);
      CHECK_OK(cairn_request(c, query, &result));
      CHECK(result != NULL && strstr(result, "0.75") != NULL && strstr(result, base_id) != NULL);
      cairn_free(result);
      CHECK_OK(cairn_request(c, "{\"op\":\"stats\"}", &result));
      CHECK(result != NULL && strstr(result, "\"tiers\"") != NULL && strstr(result, "\"repository\"") != NULL);
      cairn_free(result);
      snprintf(query, sizeof query, "{\"op\":\"remove\",\"id\":\"%s\"}", meta_id);
      CHECK_OK(cairn_request(c, query, &result));
      CHECK(result != NULL && strstr(result, needle) != NULL);
      cairn_free(result);
      CHECK_OK(cairn_request(c, "{\"op\":\"list\"}", &result));
      CHECK(result != NULL && strstr(result, needle) == NULL);
      cairn_free(result);
      CHECK_OK(cairn_request(c, "{\"op\":\"gc\"}", &result));
      CHECK(result != NULL && strstr(result, "\"collected\"") != NULL);
      cairn_free(result);
      CHECK_OK(cairn_request(c, "{\"op\":\"fsck\",\"verify\":true}", &result));
      CHECK(result != NULL && strstr(result, "\"ok\":true") != NULL);
      cairn_free(result);
      /* A catalog query goes through cairn_query, which cairn_request refuses to carry. */
      snprintf(query, sizeof query, "{\"op\":\"ancestors\",\"model\":\"%s\"}", space_id);
      CHECK_OK(cairn_query(c, query, &result));
      CHECK(result != NULL && strstr(result, base_id) != NULL);
      cairn_free(result);
      result = NULL;
      snprintf(query, sizeof query, "{\"op\":\"query\",\"query\":{\"op\":\"ancestors\",\"model\":\"%s\"}}", space_id);
      CHECK(cairn_request(c, query, &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(result == NULL && strstr(cairn_last_error(), "cairn_query") != NULL);

      result = NULL;
      CHECK(cairn_request(c, "{\"op\":\"show\",\"id\":\"no-such-model\"}", &result) == CAIRN_ERR_NOT_FOUND);
      CHECK(result == NULL && strstr(cairn_last_error(), "no-such-model") != NULL);
      CHECK(cairn_request(c, "{\"op\":\"hello\"}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "hello") != NULL && strstr(cairn_last_error(), "cairn_connect") != NULL);
      CHECK(cairn_request(c, "{\"op\":\"allocate\",\"nbytes\":8}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "cairn_model_add_tensor_space") != NULL);
      CHECK(cairn_request(c, "{\"op\":\"lease\"}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_request(c, "{\"op\":\"put_tensor\"}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "cairn_tensor_put") != NULL);
      /* Every op that has a call of its own is refused, naming that call. */
      {
        static const char* const refused[][2] = {{"tensor_info", "cairn_tensor_info"},
                                                 {"poll_tensor", "cairn_tensor_poll"},
                                                 {"delete_tensor", "cairn_tensor_delete"},
                                                 {"lease_tensor", "cairn_tensor_unpack"},
                                                 {"open", "cairn_model_open"},
                                                 {"lease_device", "cairn_model_map"},
                                                 {"prefetch", "cairn_model_prefetch"},
                                                 {"hint", "cairn_hint"},
                                                 {"query", "cairn_query"},
                                                 {"release", "cairn_model_close"},
                                                 {"free", "cairn_model_abort"},
                                                 {"wait", "cairn_ticket_wait"}};
        size_t k;
        for (k = 0; k < sizeof refused / sizeof refused[0]; ++k) {
          char req[320];
          snprintf(req, sizeof req, "{\"op\":\"%s\",\"id\":\"%s\"}", refused[k][0], base_id);
          CHECK(cairn_request(c, req, &result) == CAIRN_ERR_INVALID_ARGUMENT);
          CHECK(result == NULL && strstr(cairn_last_error(), refused[k][1]) != NULL);
        }
      }
      CHECK(cairn_request(c, "{\"op\":\"commit\"}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(strstr(cairn_last_error(), "commit") != NULL);
      CHECK(cairn_request(c, "{\"op\":\"stats\",\"release\":[1]}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_request(c, "[1]", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_request(c, "{\"id\":\"x\"}", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_request(c, "{not json", &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_request(c, NULL, &result) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_request(c, "{\"op\":\"teleport\"}", &result) != CAIRN_OK);
      CHECK(result == NULL);
      CHECK_OK(cairn_request(c, "{\"op\":\"ping\"}", &result)); /* still usable after the refusals */
      CHECK(result != NULL);
      cairn_free(result);
    }

    free(w1);
    free(b1);
    free(h1);
    free(h2);
    free(back);
  }

  /* ---- safetensors files in and out (cairn_model_put_file / cairn_model_get_file) ---- */
  {
    const char* tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char in_path[512], out_path[512], bad_path[512], file_id[128], child_file_id[128];
    /* header: {"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}} padded to 8 bytes */
    const char* header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8, k;
    float data[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    unsigned char len_le[8];
    unsigned char in_bytes[256], out_bytes[256];
    size_t in_n = 0, out_n = 0;
    FILE* f;
    snprintf(in_path, sizeof in_path, "%s/c_api_test_in%s-%d.safetensors", tmp, suffix, (int)getpid());
    snprintf(out_path, sizeof out_path, "%s/c_api_test_out%s-%d.safetensors", tmp, suffix, (int)getpid());
    snprintf(bad_path, sizeof bad_path, "%s/c_api_test_bad%s-%d.safetensors", tmp, suffix, (int)getpid());
    snprintf(file_id, sizeof file_id, "c-file%s", suffix);
    snprintf(child_file_id, sizeof child_file_id, "c-file-child%s", suffix);
    for (k = 0; k < 8; ++k) len_le[k] = (unsigned char)((padded >> (8 * k)) & 0xff);
    f = fopen(in_path, "wb");
    CHECK(f != NULL);
    if (f) {
      fwrite(len_le, 1, 8, f);
      fwrite(header, 1, hlen, f);
      for (k = hlen; k < padded; ++k) fputc(' ', f);
      fwrite(data, 1, sizeof data, f);
      fclose(f);
    }
    CHECK_OK(cairn_model_put_file(c, file_id, in_path, NULL, CAIRN_DURABILITY_GLOBAL, "{\"score\": 0.5}"));
    CHECK_OK(cairn_model_put_file(c, child_file_id, in_path, file_id, CAIRN_DURABILITY_MEMORY, NULL));
    CHECK(cairn_model_put_file(c, file_id, in_path, NULL, CAIRN_DURABILITY_GLOBAL, NULL) == CAIRN_ERR_EXISTS);
    CHECK_OK(cairn_model_get_file(c, child_file_id, out_path));
    f = fopen(in_path, "rb");
    if (f) {
      in_n = fread(in_bytes, 1, sizeof in_bytes, f);
      fclose(f);
    }
    f = fopen(out_path, "rb");
    if (f) {
      out_n = fread(out_bytes, 1, sizeof out_bytes, f);
      fclose(f);
    }
    CHECK(in_n > 0 && in_n == out_n && memcmp(in_bytes, out_bytes, in_n) == 0);
    f = fopen(bad_path, "wb");
    if (f) {
      fputs("not a safetensors file", f);
      fclose(f);
    }
    CHECK(cairn_model_put_file(c, "c-bad-file", bad_path, NULL, CAIRN_DURABILITY_GLOBAL, NULL) ==
          CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), bad_path) != NULL);
    CHECK(cairn_model_put_file(c, "c-bad-meta", in_path, NULL, CAIRN_DURABILITY_GLOBAL, "[1]") ==
          CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(cairn_model_get_file(c, "c-no-such-model", out_path) == CAIRN_ERR_NOT_FOUND);
    {
      /* cairn_model_put_file_opts / cairn_model_get_file_opts: architecture, progress, some tensors. */
      char opts_id[128];
      const char* only[1] = {"w"};
      const char* missing[1] = {"no-such-tensor"};
      const char *got_id = NULL, *got_parent = NULL, *got_meta = NULL;
      struct progress_count count = {0, 0, 0};
      cairn_file_options fo;
      cairn_model_reader* fr = NULL;
      snprintf(opts_id, sizeof opts_id, "c-file-opts%s", suffix);
      cairn_file_options_init(&fo);
      fo.parent = file_id;
      fo.durability = CAIRN_DURABILITY_MEMORY;
      fo.metadata_json = "{\"score\": 0.25}";
      fo.architecture_json =
          "{\"layers\": [{\"name\": \"fc\", \"type\": \"Linear\", \"config\": {}, \"inputs\": []}], "
          "\"tensors\": {\"w\": \"fc\"}}";
      fo.progress = count_progress;
      fo.progress_ctx = &count;
      CHECK_OK(cairn_model_put_file_opts(c, opts_id, in_path, &fo));
      CHECK(count.calls >= 2 && count.committing == 1 && count.bytes == 16);
      CHECK_OK(cairn_model_open(c, opts_id, &fr));
      CHECK_OK(cairn_model_describe(fr, &got_id, &got_parent, &got_meta));
      CHECK(got_id && strcmp(got_id, opts_id) == 0 && got_parent && strcmp(got_parent, file_id) == 0);
      CHECK(got_meta && strstr(got_meta, "0.25") != NULL);
      cairn_model_close(fr);
      fo.names = only; /* a put takes no names */
      fo.count = 1;
      CHECK(cairn_model_put_file_opts(c, "c-file-opts-bad", in_path, &fo) == CAIRN_ERR_INVALID_ARGUMENT);
      CHECK(cairn_model_get_file_opts(c, opts_id, out_path, &fo) == CAIRN_ERR_INVALID_ARGUMENT); /* a parent */
      cairn_file_options_init(&fo);
      fo.names = only;
      fo.count = 1;
      fo.progress = count_progress;
      fo.progress_ctx = &count;
      count.calls = count.bytes = 0;
      CHECK_OK(cairn_model_get_file_opts(c, opts_id, out_path, &fo));
      CHECK(count.calls >= 1 && count.bytes == 16);
      fo.names = missing;
      CHECK(cairn_model_get_file_opts(c, opts_id, out_path, &fo) == CAIRN_ERR_NOT_FOUND);
      CHECK(strstr(cairn_last_error(), "no-such-tensor") != NULL);
    }
    remove(in_path);
    remove(out_path);
    remove(bad_path);
  }

  /* ---- options structs: cairn_model_read, cairn_model_map, cairn_model_commit_opts,
   * cairn_model_prefetch ---- */
  {
    char id[128], child[128], *result = NULL;
    const char* names[2] = {"o.a", "o.b"};
    float a[64], b[8], a_back[64], b_back[8];
    int64_t s_a[2] = {8, 8}, s_b[1] = {8};
    void *views[2] = {NULL, NULL}, *dsts[2] = {a_back, b_back};
    size_t sizes[2] = {0, 0}, dst_bytes[2] = {sizeof a_back, sizeof b_back};
    cairn_model_writer* w = NULL;
    cairn_model_reader* r = NULL;
    cairn_ticket* t = (cairn_ticket*)&t; /* not NULL: a waited commit sets it to NULL */
    cairn_read_options ro = CAIRN_READ_OPTIONS_INIT, ro_init;
    cairn_commit_options co = CAIRN_COMMIT_OPTIONS_INIT, co_init;
    cairn_prefetch_options po = CAIRN_PREFETCH_OPTIONS_INIT, po_init;
    cairn_file_options fo_init;
    /* A struct from a newer header: this library's fields, then one it does not know. */
    struct {
      cairn_read_options known;
      int64_t newer_field;
    } newer;
    size_t i;
    for (i = 0; i < 64; ++i) a[i] = (float)i * 0.25f;
    for (i = 0; i < 8; ++i) b[i] = -(float)i;
    snprintf(id, sizeof id, "c-opts%s", suffix);
    snprintf(child, sizeof child, "c-opts-child%s", suffix);

    /* The init calls give what the macros give. */
    memset(&ro_init, 0xff, sizeof ro_init);
    memset(&co_init, 0xff, sizeof co_init);
    memset(&po_init, 0xff, sizeof po_init);
    memset(&fo_init, 0xff, sizeof fo_init);
    cairn_read_options_init(&ro_init);
    cairn_commit_options_init(&co_init);
    cairn_prefetch_options_init(&po_init);
    cairn_file_options_init(&fo_init);
    CHECK(ro_init.size == sizeof ro && ro_init.kind == CAIRN_MEM_HOST && ro_init.device == CAIRN_DEVICE_DEFAULT &&
          ro_init.private_copy == 0);
    CHECK(co_init.size == sizeof co && co_init.durability == CAIRN_DURABILITY_GLOBAL && co_init.wait == 1 &&
          co_init.pipelined == 0);
    CHECK(po_init.size == sizeof po && po_init.kind == CAIRN_MEM_HOST && po_init.device == CAIRN_DEVICE_DEFAULT &&
          po_init.all == 0 && po_init.timeout_ms == 0 && po_init.progress_id == NULL);
    CHECK(fo_init.size == sizeof fo_init && fo_init.parent == NULL && fo_init.durability == CAIRN_DURABILITY_GLOBAL &&
          fo_init.metadata_json == NULL && fo_init.architecture_json == NULL && fo_init.count == 0 &&
          fo_init.names == NULL && fo_init.progress == NULL && fo_init.progress_ctx == NULL);
    cairn_read_options_init(NULL);

    /* Waited (the default): no ticket is handed out. */
    CHECK_OK(cairn_model_create(c, id, NULL, &w));
    CHECK_OK(cairn_model_add_tensor(w, "o.a", a, CAIRN_DTYPE_F32, 2, s_a));
    CHECK_OK(cairn_model_add_tensor(w, "o.b", b, CAIRN_DTYPE_F32, 1, s_b));
    CHECK_OK(cairn_model_commit_opts(w, &co, &t));
    CHECK(t == NULL);
    /* NULL options: the same defaults; wait together with pipelined is refused (and frees w). */
    CHECK_OK(cairn_model_create(c, child, id, &w));
    co.pipelined = 1;
    CHECK(cairn_model_commit_opts(w, &co, &t) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), "wait") != NULL && t == NULL);
    /* Not waited, not pipelined: the model is visible when the call returns; the ticket waits for
     * the durability. */
    CHECK_OK(cairn_model_create(c, child, id, &w));
    CHECK_OK(cairn_model_inherit_all(w));
    co.durability = CAIRN_DURABILITY_MEMORY;
    co.wait = 0;
    co.pipelined = 0;
    CHECK_OK(cairn_model_commit_opts(w, &co, &t));
    CHECK(t != NULL && cairn_pipeline_in_flight(c) == 0);
    CHECK_OK(cairn_ticket_wait(t, -1));
    cairn_ticket_free(t);
    /* ... and its error comes from the call itself (the id is taken). */
    CHECK_OK(cairn_model_create(c, child, id, &w));
    CHECK(cairn_model_commit_opts(w, &co, &t) == CAIRN_ERR_EXISTS && t == NULL);
    /* Pipelined at memory: the error comes from the ticket. */
    CHECK_OK(cairn_model_create(c, child, id, &w));
    co.pipelined = 1;
    CHECK_OK(cairn_model_commit_opts(w, &co, &t));
    CHECK(t != NULL && cairn_ticket_wait(t, -1) == CAIRN_ERR_EXISTS);
    cairn_ticket_free(t);
    /* Bad options: an unknown durability, a size never set, a newer struct that sets a field this
     * library does not know. */
    CHECK_OK(cairn_model_create(c, "c-opts-never", NULL, &w));
    co.durability = (cairn_durability)7;
    CHECK(cairn_model_commit_opts(w, &co, &t) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), "durability") != NULL);
    CHECK_OK(cairn_model_create(c, "c-opts-never", NULL, &w));
    co = co_init;
    co.size = 0;
    CHECK(cairn_model_commit_opts(w, &co, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), "CAIRN_COMMIT_OPTIONS_INIT") != NULL ||
          strstr(cairn_last_error(), "_INIT") != NULL);

    CHECK_OK(cairn_model_open(c, child, &r));
    /* NULL options: host copies and read-only host views, several tensors per request. */
    CHECK_OK(cairn_model_read(r, 2, names, dsts, dst_bytes, NULL));
    CHECK(memcmp(a_back, a, sizeof a) == 0 && memcmp(b_back, b, sizeof b) == 0);
    CHECK_OK(cairn_model_map(r, 2, names, views, sizes, NULL));
    CHECK(sizes[0] == sizeof a && sizes[1] == sizeof b && memcmp(views[0], a, sizeof a) == 0 &&
          memcmp(views[1], b, sizeof b) == 0);
    CHECK_OK(cairn_model_map(r, 1, names + 1, views, NULL, &ro));
    CHECK(memcmp(views[0], b, sizeof b) == 0);
    CHECK_OK(cairn_model_read(r, 0, NULL, NULL, NULL, &ro));
    /* A struct of an older or newer header: accepted while what this library does not know is 0. */
    memset(&newer, 0, sizeof newer);
    newer.known = ro;
    newer.known.size = sizeof newer;
    CHECK_OK(cairn_model_map(r, 2, names, views, sizes, &newer.known));
    newer.newer_field = 1;
    CHECK(cairn_model_map(r, 2, names, views, sizes, &newer.known) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), "newer") != NULL);
    /* A struct of an older header, without private_copy: that field keeps its default (read-only
     * views), whatever follows the struct in memory. */
    {
      struct {
        cairn_read_options opts;
        int64_t after;
      } older;
      memset(&older, 0xff, sizeof older);
      older.opts.size = offsetof(cairn_read_options, private_copy);
      older.opts.kind = CAIRN_MEM_HOST;
      older.opts.device = CAIRN_DEVICE_DEFAULT;
      CHECK_OK(cairn_model_map(r, 2, names, views, sizes, &older.opts));
      CHECK(memcmp(views[1], b, sizeof b) == 0);
    }
    ro.size = 0;
    CHECK(cairn_model_read(r, 2, names, dsts, dst_bytes, &ro) == CAIRN_ERR_INVALID_ARGUMENT);
    ro = ro_init;
    /* Copy-on-write views: a write stays in this process. */
    ro.private_copy = 1;
    CHECK_OK(cairn_model_map(r, 2, names, views, sizes, &ro));
    ((float*)views[1])[0] = 42.0f;
    CHECK_OK(cairn_model_read(r, 2, names, dsts, dst_bytes, NULL));
    CHECK(b_back[0] == b[0] && ((float*)views[1])[0] == 42.0f);
    /* private_copy is for host maps only; unknown kinds are refused. */
    CHECK(cairn_model_read(r, 2, names, dsts, dst_bytes, &ro) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), "private_copy") != NULL);
    ro.kind = CAIRN_MEM_CUDA;
    CHECK(cairn_model_map(r, 2, names, views, sizes, &ro) == CAIRN_ERR_INVALID_ARGUMENT);
    ro = ro_init;
    ro.kind = (cairn_memkind)9;
    CHECK(cairn_model_map(r, 2, names, views, sizes, &ro) == CAIRN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cairn_last_error(), "memkind") != NULL);
    /* Device memory without an HBM tier (this daemon has none) and, on a machine without a GPU, no
     * CUDA: unavailable, naming why. */
    ro = ro_init;
    ro.kind = CAIRN_MEM_CUDA;
    CHECK(cairn_model_map(r, 2, names, views, sizes, &ro) == CAIRN_ERR_UNAVAILABLE);
    if (getenv("CAIRN_TEST_HAVE_GPU") == NULL)
      CHECK(cairn_model_read(r, 2, names, dsts, dst_bytes, &ro) == CAIRN_ERR_UNAVAILABLE);
    cairn_model_close(r);

    /* Prefetch: into DRAM by default; the answer counts the model's bytes. */
    CHECK_OK(cairn_model_prefetch(c, child, NULL, &result));
    CHECK(result != NULL && strstr(result, "\"bytes\":288") != NULL);
    cairn_free(result);
    CHECK_OK(cairn_model_prefetch(c, child, &po, NULL));
    CHECK(cairn_model_prefetch(c, "c-no-such-model", &po, NULL) == CAIRN_ERR_NOT_FOUND);
    po.kind = CAIRN_MEM_CUDA;
    CHECK(cairn_model_prefetch(c, child, &po, NULL) == CAIRN_ERR_UNAVAILABLE);
    po = po_init;
    po.all = 2;
    CHECK(cairn_model_prefetch(c, child, &po, NULL) == CAIRN_ERR_INVALID_ARGUMENT);
    /* A progress id: the prefetch runs as without one. A struct of a header before progress_id
     * (size up to timeout_ms) works too. */
    po = po_init;
    po.progress_id = "c-prefetch-progress";
    CHECK_OK(cairn_model_prefetch(c, child, &po, NULL));
    po = po_init;
    po.size = offsetof(cairn_prefetch_options, progress_id);
    CHECK_OK(cairn_model_prefetch(c, child, &po, NULL));
  }

  cairn_disconnect(c);
  printf("c_api_test: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
