/* The consumer of the `coupled` workload (a trainer reading the simulation's samples): for each
 * step, waits for <prefix>/<step>, copies its bytes into its own buffer, checks them, deletes the key
 * and (with --ack) puts <prefix>/ack/<step>.
 *   cairn: cairn_poll_tensor (the daemon answers when the key appears), cairn_unpack_tensor, then
 *          cairn_get_tensor_info to check dtype and shape, cairn_delete_tensor.
 *   redis: as SmartRedis' poll_tensor: EXISTS, sleep --poll-ms, again; then GET, copy the reply's
 *          bytes into the buffer (SmartRedis' unpack_tensor copies into user memory), DEL.
 *
 * Prints one JSON object: {"backend", "steps", "bytes", "have_ns": [...], "bad_words": N,
 * "checked": "full"|"sampled"}; have_ns[i] is when step i's bytes were in the buffer
 * (CLOCK_MONOTONIC). Exit status 1 on a failure, 3 when the data differ from what was put. */
#include "cairn/cairn.h"
#include "coupled_common.h"

static void die_cairn(const char* what, const char* key, cairn_status s) {
  fprintf(stderr, "coupled_consumer: %s %s: %s: %s\n", what, key, cairn_status_string(s), cairn_last_error());
  exit(1);
}

int main(int argc, char** argv) {
  coupled_args a = coupled_parse(argc, argv);
  size_t words = a.bytes / 8;
  uint64_t* buf = (uint64_t*)aligned_alloc(4096, a.bytes);
  int64_t* have = (int64_t*)calloc((size_t)a.steps, sizeof(int64_t));
  if (!buf || !have) return 1;
  memset(buf, 0, a.bytes);
  char key[1100], ack[1100];
  size_t bad = 0;

  cairn_client* c = NULL;
#ifdef COUPLED_WITH_REDIS
  redisContext* r = NULL;
#endif
  if (!strcmp(a.backend, "cairn")) {
    cairn_status s = cairn_connect(a.address, &c);
    if (s != CAIRN_OK) die_cairn("connect", a.address, s);
  } else if (!strcmp(a.backend, "redis")) {
#ifdef COUPLED_WITH_REDIS
    r = coupled_redis_connect(a.address);
#else
    fprintf(stderr, "coupled_consumer: built without hiredis\n");
    return 1;
#endif
  } else {
    coupled_usage(argv[0]);
  }

  uint64_t one = 1;
  int64_t ack_shape[1] = {1};
  for (long i = 0; i < a.steps; ++i) {
    snprintf(key, sizeof key, "%s/%ld", a.prefix, i);
    snprintf(ack, sizeof ack, "%s/ack/%ld", a.prefix, i);
    if (c) {
      int found = 0;
      cairn_status s = cairn_poll_tensor(c, key, 60000, &found);
      if (s != CAIRN_OK) die_cairn("poll_tensor", key, s);
      if (!found) {
        fprintf(stderr, "coupled_consumer: %s did not appear within 60 s\n", key);
        return 1;
      }
      s = cairn_unpack_tensor(c, key, buf, a.bytes);
      if (s != CAIRN_OK) die_cairn("unpack_tensor", key, s);
      have[i] = coupled_now_ns();
      cairn_dtype dt;
      int nd = 0;
      int64_t shape[CAIRN_MAX_DIMS];
      size_t nbytes = 0;
      s = cairn_get_tensor_info(c, key, &dt, &nd, shape, &nbytes);
      if (s != CAIRN_OK) die_cairn("get_tensor_info", key, s);
      if (dt != CAIRN_DTYPE_F32 || nd != 1 || shape[0] != (int64_t)(a.bytes / 4) || nbytes != a.bytes) {
        fprintf(stderr, "coupled_consumer: %s has the wrong dtype/shape/size\n", key);
        return 3;
      }
      bad += coupled_check(buf, words, i, a.ack);
      s = cairn_delete_tensor(c, key);
      if (s != CAIRN_OK) die_cairn("delete_tensor", key, s);
      if (a.ack) {
        s = cairn_put_tensor(c, ack, &one, CAIRN_DTYPE_U64, 1, ack_shape);
        if (s != CAIRN_OK) die_cairn("put_tensor", ack, s);
      }
    }
#ifdef COUPLED_WITH_REDIS
    else {
      if (!coupled_redis_poll(r, key, a.poll_ms, 60000L / (a.poll_ms > 0 ? a.poll_ms : 1) + 1)) {
        fprintf(stderr, "coupled_consumer: %s did not appear within 60 s\n", key);
        return 1;
      }
      redisReply* rep = coupled_redis_cmd(r, "GET", (redisReply*)redisCommand(r, "GET %s", key));
      if (rep->type != REDIS_REPLY_STRING || rep->len != a.bytes) {
        fprintf(stderr, "coupled_consumer: %s: GET returned %zu bytes, expected %zu\n", key,
                rep->type == REDIS_REPLY_STRING ? rep->len : 0, a.bytes);
        return 3;
      }
      memcpy(buf, rep->str, a.bytes);
      have[i] = coupled_now_ns();
      freeReplyObject(rep);
      bad += coupled_check(buf, words, i, a.ack);
      freeReplyObject(coupled_redis_cmd(r, "DEL", (redisReply*)redisCommand(r, "DEL %s", key)));
      if (a.ack) freeReplyObject(coupled_redis_cmd(r, "SET", (redisReply*)redisCommand(r, "SET %s 1", ack)));
    }
#endif
  }

  printf("{\"backend\": \"%s\", \"steps\": %ld, \"bytes\": %zu, \"bad_words\": %zu, \"checked\": \"%s\", ", a.backend,
         a.steps, a.bytes, bad, a.ack ? "full" : "sampled");
  coupled_print_times("have_ns", have, a.steps);
  printf("}\n");
  if (c) cairn_disconnect(c);
#ifdef COUPLED_WITH_REDIS
  if (r) redisFree(r);
#endif
  free(buf);
  free(have);
  return bad ? 3 : 0;
}
