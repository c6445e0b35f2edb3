/* Shared by coupled_producer.c and coupled_consumer.c (the `coupled` workload of
 * bench/workloads/workloads.py): argument parsing, the clock, the data pattern, a SmartRedis-like
 * Redis binding over hiredis.
 *
 * Data pattern: word j (uint64) of every step's buffer is splitmix64(j), except the first word of
 * each 4 KiB page, which is step ^ kStepMagic. The producer writes the page heads per step (4096
 * stores for 16 MiB, negligible beside the put); the consumer checks every word (--ack mode) or the
 * page heads and every 61st word (throughput mode, so that checking does not bound throughput). */
#ifndef CAIRN_BENCH_COUPLED_COMMON_H_
#define CAIRN_BENCH_COUPLED_COMMON_H_

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUPLED_PAGE_WORDS 512u
#define COUPLED_STEP_MAGIC 0x5A17C0DE00000000ull

typedef struct {
  const char* backend; /* cairn | redis | memcpy */
  const char* address; /* cairnd's socket, or redis-server's Unix socket */
  const char* prefix;  /* keys are <prefix>/<step>, acks <prefix>/ack/<step> */
  long steps;
  size_t bytes;
  int ack;     /* wait for the consumer's ack before the next put (latency mode) */
  int poll_ms; /* Redis: sleep between EXISTS polls (SmartRedis' poll_frequency_ms) */
} coupled_args;

static inline int64_t coupled_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint64_t coupled_splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static inline void coupled_fill_base(uint64_t* w, size_t words) {
  for (size_t j = 0; j < words; ++j) w[j] = coupled_splitmix64(j);
}

static inline void coupled_stamp(uint64_t* w, size_t words, long step) {
  for (size_t j = 0; j < words; j += COUPLED_PAGE_WORDS) w[j] = (uint64_t)step ^ COUPLED_STEP_MAGIC;
}

/* Returns the number of wrong words checked (0: good). full: check every word. */
static inline size_t coupled_check(const uint64_t* w, size_t words, long step, int full) {
  size_t bad = 0;
  for (size_t j = 0; j < words; j += full ? 1 : 61) {
    uint64_t want = (j % COUPLED_PAGE_WORDS == 0) ? ((uint64_t)step ^ COUPLED_STEP_MAGIC) : coupled_splitmix64(j);
    bad += w[j] != want;
  }
  if (!full)
    for (size_t j = 0; j < words; j += COUPLED_PAGE_WORDS) bad += w[j] != ((uint64_t)step ^ COUPLED_STEP_MAGIC);
  return bad;
}

static inline void coupled_usage(const char* prog) {
  fprintf(stderr,
          "usage: %s --backend cairn|redis%s --address SOCKET --steps N --bytes B [--prefix P] [--ack] "
          "[--poll-ms MS]\n",
          prog, strstr(prog, "producer") ? "|memcpy" : "");
  exit(2);
}

static inline coupled_args coupled_parse(int argc, char** argv) {
  coupled_args a = {"cairn", "", "coupled", 64, 16u << 20, 0, 1};
  for (int i = 1; i < argc; ++i) {
    const char* k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--ack")) {
      a.ack = 1;
      continue;
    }
    if (!v) coupled_usage(argv[0]);
    if (!strcmp(k, "--backend"))
      a.backend = v;
    else if (!strcmp(k, "--address"))
      a.address = v;
    else if (!strcmp(k, "--prefix"))
      a.prefix = v;
    else if (!strcmp(k, "--steps"))
      a.steps = strtol(v, NULL, 10);
    else if (!strcmp(k, "--bytes"))
      a.bytes = (size_t)strtoull(v, NULL, 10);
    else if (!strcmp(k, "--poll-ms"))
      a.poll_ms = atoi(v);
    else
      coupled_usage(argv[0]);
    ++i;
  }
  if (a.steps <= 0 || a.bytes == 0 || a.bytes % (8 * COUPLED_PAGE_WORDS) != 0) {
    fprintf(stderr, "%s: --steps must be > 0 and --bytes a positive multiple of 4096\n", argv[0]);
    exit(2);
  }
  return a;
}

static inline void coupled_print_times(const char* name, const int64_t* t, long n) {
  printf("\"%s\": [", name);
  for (long i = 0; i < n; ++i) printf("%s%lld", i ? ", " : "", (long long)t[i]);
  printf("]");
}

#ifdef COUPLED_WITH_REDIS
#include <hiredis/hiredis.h>

static inline redisContext* coupled_redis_connect(const char* path) {
  redisContext* r = redisConnectUnix(path);
  if (!r || r->err) {
    fprintf(stderr, "redis: cannot connect to %s: %s\n", path, r ? r->errstr : "out of memory");
    exit(1);
  }
  return r;
}

static inline redisReply* coupled_redis_cmd(redisContext* r, const char* what, redisReply* reply) {
  if (!reply) {
    fprintf(stderr, "redis: %s failed: %s\n", what, r->errstr);
    exit(1);
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    fprintf(stderr, "redis: %s: %s\n", what, reply->str);
    exit(1);
  }
  return reply;
}

/* SmartRedis' poll_tensor: EXISTS, then sleep poll_ms, up to tries times. Returns 1 when found. */
static inline int coupled_redis_poll(redisContext* r, const char* key, int poll_ms, long tries) {
  for (long i = 0; i < tries; ++i) {
    redisReply* rep = coupled_redis_cmd(r, "EXISTS", (redisReply*)redisCommand(r, "EXISTS %s", key));
    long long n = rep->integer;
    freeReplyObject(rep);
    if (n > 0) return 1;
    if (poll_ms > 0) {
      struct timespec ts = {poll_ms / 1000, (long)(poll_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  return 0;
}
#endif

#endif /* CAIRN_BENCH_COUPLED_COMMON_H_ */
