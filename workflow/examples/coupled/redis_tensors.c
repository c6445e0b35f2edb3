/* The SmartRedis-like tensor binding over hiredis (redis_tensors.h). */
#include "redis_tensors.h"

#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct redis_client {
  redisContext* ctx;
  char error[512];
};

static int fail(redis_client* c, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error, sizeof c->error, fmt, ap);
  va_end(ap);
  return -1;
}

/* Checks a reply: NULL (the connection broke) or a Redis error fail with what was asked. */
static redisReply* checked(redis_client* c, void* reply, const char* what, const char* key) {
  redisReply* r = (redisReply*)reply;
  if (!r) {
    fail(c, "redis %s %s: %s (is redis-server still running?)", what, key, c->ctx->errstr);
    return NULL;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    fail(c, "redis %s %s: %s", what, key, r->str);
    freeReplyObject(r);
    return NULL;
  }
  return r;
}

redis_client* redis_client_connect(const char* socket_path) {
  redis_client* c = (redis_client*)calloc(1, sizeof *c);
  if (!c) return NULL;
  c->ctx = redisConnectUnix(socket_path);
  if (!c->ctx)
    fail(c, "redis: cannot connect to %s: out of memory", socket_path);
  else if (c->ctx->err)
    fail(c, "redis: cannot connect to %s: %s (start redis-server with --unixsocket %s)", socket_path, c->ctx->errstr,
         socket_path);
  return c;
}

void redis_client_close(redis_client* c) {
  if (!c) return;
  if (c->ctx) redisFree(c->ctx);
  free(c);
}

const char* redis_client_error(const redis_client* c) { return c ? c->error : "redis: out of memory"; }

int redis_put_tensor(redis_client* c, const char* key, const void* data, size_t nbytes, const char* dtype, int ndim,
                     const int64_t* shape) {
  char dims[REDIS_TENSOR_MAX_DIMS * 21] = "";
  size_t used = 0;
  int i;
  redisReply* r;
  if (ndim < 0 || ndim > REDIS_TENSOR_MAX_DIMS)
    return fail(c, "redis put %s: %d dimensions (at most %d)", key, ndim, REDIS_TENSOR_MAX_DIMS);
  for (i = 0; i < ndim; ++i)
    used += (size_t)snprintf(dims + used, sizeof dims - used, "%s%lld", i ? "," : "", (long long)shape[i]);
  r = checked(c, redisCommand(c->ctx, "HSET %s dtype %s shape %s data %b", key, dtype, dims, data, nbytes), "HSET",
              key);
  if (!r) return -1;
  freeReplyObject(r);
  return 0;
}

int redis_poll_tensor(redis_client* c, const char* key, int timeout_ms, int poll_ms, int* found) {
  long tries = poll_ms > 0 ? timeout_ms / poll_ms + 1 : 1, i;
  *found = 0;
  for (i = 0; i < tries; ++i) {
    redisReply* r = checked(c, redisCommand(c->ctx, "EXISTS %s", key), "EXISTS", key);
    if (!r) return -1;
    *found = r->integer > 0;
    freeReplyObject(r);
    if (*found || i + 1 == tries) break;
    {
      struct timespec ts = {poll_ms / 1000, (long)(poll_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  return 0;
}

/* HMGET key shape data; fails if the key is missing or is not a tensor. */
static redisReply* fetch(redis_client* c, const char* key) {
  redisReply* r = checked(c, redisCommand(c->ctx, "HMGET %s shape data", key), "HMGET", key);
  if (!r) return NULL;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[1]->type != REDIS_REPLY_STRING) {
    fail(c, "redis get %s: no such tensor (not put yet, or deleted)", key);
    freeReplyObject(r);
    return NULL;
  }
  return r;
}

int redis_unpack_tensor(redis_client* c, const char* key, void* dst, size_t dst_bytes) {
  redisReply* r = fetch(c, key);
  if (!r) return -1;
  if ((size_t)r->element[1]->len != dst_bytes) {
    fail(c, "redis unpack %s: the tensor has %zu bytes, the buffer %zu", key, (size_t)r->element[1]->len, dst_bytes);
    freeReplyObject(r);
    return -1;
  }
  memcpy(dst, r->element[1]->str, dst_bytes);
  freeReplyObject(r);
  return 0;
}

int redis_get_tensor(redis_client* c, const char* key, void** data, size_t* nbytes, int* ndim, int64_t* shape) {
  redisReply* r = fetch(c, key);
  const char* p;
  if (!r) return -1;
  *ndim = 0;
  p = r->element[0]->type == REDIS_REPLY_STRING ? r->element[0]->str : "";
  while (*p && *ndim < REDIS_TENSOR_MAX_DIMS) {
    char* end;
    long long d = strtoll(p, &end, 10);
    if (end == p) break; /* not a number: stop rather than loop */
    shape[(*ndim)++] = d;
    p = *end == ',' ? end + 1 : end;
  }
  *nbytes = (size_t)r->element[1]->len;
  *data = malloc(*nbytes ? *nbytes : 1);
  if (!*data) {
    freeReplyObject(r);
    return fail(c, "redis get %s: out of memory for %zu bytes", key, *nbytes);
  }
  memcpy(*data, r->element[1]->str, *nbytes);
  freeReplyObject(r);
  return 0;
}
