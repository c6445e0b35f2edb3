/* The producer of the `coupled` workload (a simulation putting training samples): puts --steps
 * tensors of --bytes each under <prefix>/<step>, through cairn (cairn_put_tensor), Redis (SET of the
 * tensor's bytes with a key per step, as SmartRedis does without RedisAI) or, as the physical limit,
 * memcpy into a private buffer. With --ack it waits for <prefix>/ack/<step> from the consumer before
 * the next put (latency mode); without, it puts as fast as it can (throughput mode).
 *
 * Prints one JSON object: {"backend", "steps", "bytes", "start_ns": [...], "end_ns": [...]}
 * (CLOCK_MONOTONIC, shared with the consumer on the same node). Exit status 1 on any failure. */
#include "cairn/cairn.h"
#include "coupled_common.h"

static void die_cairn(const char* what, cairn_status s) {
  fprintf(stderr, "coupled_producer: %s: %s: %s\n", what, cairn_status_string(s), cairn_last_error());
  exit(1);
}

int main(int argc, char** argv) {
  coupled_args a = coupled_parse(argc, argv);
  size_t words = a.bytes / 8;
  uint64_t* buf = (uint64_t*)aligned_alloc(4096, a.bytes);
  uint64_t* dst = NULL;
  int64_t* start = (int64_t*)calloc((size_t)a.steps, sizeof(int64_t));
  int64_t* end = (int64_t*)calloc((size_t)a.steps, sizeof(int64_t));
  if (!buf || !start || !end) return 1;
  coupled_fill_base(buf, words);
  char key[1100];

  cairn_client* c = NULL;
#ifdef COUPLED_WITH_REDIS
  redisContext* r = NULL;
#endif
  if (!strcmp(a.backend, "cairn")) {
    cairn_status s = cairn_connect(a.address, &c);
    if (s != CAIRN_OK) die_cairn("connect", s);
  } else if (!strcmp(a.backend, "redis")) {
#ifdef COUPLED_WITH_REDIS
    r = coupled_redis_connect(a.address);
#else
    fprintf(stderr, "coupled_producer: built without hiredis\n");
    return 1;
#endif
  } else if (!strcmp(a.backend, "memcpy")) {
    dst = (uint64_t*)aligned_alloc(4096, a.bytes);
    if (!dst) return 1;
    memset(dst, 1, a.bytes); /* fault the pages in: the limit is the copy, not page faults */
  } else {
    coupled_usage(argv[0]);
  }

  int64_t shape[1] = {(int64_t)(a.bytes / 4)};
  for (long i = 0; i < a.steps; ++i) {
    coupled_stamp(buf, words, i);
    snprintf(key, sizeof key, "%s/%ld", a.prefix, i);
    start[i] = coupled_now_ns();
    if (c) {
      cairn_status s = cairn_put_tensor(c, key, buf, CAIRN_DTYPE_F32, 1, shape);
      if (s != CAIRN_OK) die_cairn("put_tensor", s);
    }
#ifdef COUPLED_WITH_REDIS
    else if (r) {
      freeReplyObject(
          coupled_redis_cmd(r, "SET", (redisReply*)redisCommand(r, "SET %s %b", key, (const void*)buf, a.bytes)));
    }
#endif
    else {
      memcpy(dst, buf, a.bytes);
      __asm__ __volatile__("" : : "r"(dst) : "memory");
    }
    end[i] = coupled_now_ns();
    if (a.ack && !dst) {
      snprintf(key, sizeof key, "%s/ack/%ld", a.prefix, i);
      int found = 0;
      if (c) {
        cairn_status s = cairn_poll_tensor(c, key, 60000, &found);
        if (s != CAIRN_OK) die_cairn("poll_tensor (ack)", s);
      }
#ifdef COUPLED_WITH_REDIS
      else {
        found = coupled_redis_poll(r, key, a.poll_ms, 60000L / (a.poll_ms > 0 ? a.poll_ms : 1) + 1);
      }
#endif
      if (!found) {
        fprintf(stderr, "coupled_producer: no ack for step %ld within 60 s\n", i);
        return 1;
      }
    }
  }
  if (dst && dst[1] != buf[1]) return 1;

  printf("{\"backend\": \"%s\", \"steps\": %ld, \"bytes\": %zu, ", a.backend, a.steps, a.bytes);
  coupled_print_times("start_ns", start, a.steps);
  printf(", ");
  coupled_print_times("end_ns", end, a.steps);
  printf("}\n");
  if (c) cairn_disconnect(c);
#ifdef COUPLED_WITH_REDIS
  if (r) redisFree(r);
#endif
  free(buf);
  free(dst);
  free(start);
  free(end);
  return 0;
}
