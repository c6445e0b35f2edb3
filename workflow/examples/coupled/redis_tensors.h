/* A SmartRedis-like tensor binding over hiredis, for the coupled example's Redis baseline
 * (docs/coupled.md): what SmartSim users run today, with the SmartRedis tensor calls the
 * simulation needs (put, poll, unpack, get; the trainer deletes what it read, through redis-py).
 * Redis has no models and no lineage, so a "model" here is only tensors under keys
 * "<model>/<tensor>"; trainer.py writes the same layout through redis-py.
 *
 * A tensor is one Redis hash: fields "dtype" (a name: "f32", "i64", ...), "shape" (dimensions
 * joined by ",", "" for a scalar) and "data" (the bytes, row-major, native byte order). One HSET
 * writes it and one HMGET reads it, so a reader never sees a shape from one put and bytes from
 * another.
 *
 * Conventions: every call returns 0 on success and -1 on failure, with a one-line description in
 * redis_client_error(). A redis_client is not thread-safe (one hiredis connection). */
#ifndef CAIRN_EXAMPLES_COUPLED_REDIS_TENSORS_H_
#define CAIRN_EXAMPLES_COUPLED_REDIS_TENSORS_H_

#include <stddef.h>
#include <stdint.h>

#define REDIS_TENSOR_MAX_DIMS 8

typedef struct redis_client redis_client;

/* Connects to redis-server's Unix socket. Returns NULL when out of memory; otherwise a client that
 * the caller must close, whose redis_client_error() is non-empty if the connection failed. */
redis_client* redis_client_connect(const char* socket_path);
void redis_client_close(redis_client* c);
/* The last failure's description ("" if none). Valid until the next call on c. */
const char* redis_client_error(const redis_client* c);

/* Stores (or replaces) a tensor of nbytes bytes under key. dtype: a short name ("f32", "i64"). */
int redis_put_tensor(redis_client* c, const char* key, const void* data, size_t nbytes, const char* dtype, int ndim,
                     const int64_t* shape);
/* Waits up to timeout_ms for key to exist, checking every poll_ms (SmartRedis' poll_tensor: EXISTS,
 * then sleep). timeout_ms 0: check once. *found = 1 if it exists. */
int redis_poll_tensor(redis_client* c, const char* key, int timeout_ms, int poll_ms, int* found);
/* Copies the tensor's bytes into dst, which must hold exactly its size (dst_bytes). */
int redis_unpack_tensor(redis_client* c, const char* key, void* dst, size_t dst_bytes);
/* The tensor's bytes in a new malloc'd buffer (*data, the caller frees), its size and its shape
 * (ndim and up to REDIS_TENSOR_MAX_DIMS dimensions). */
int redis_get_tensor(redis_client* c, const char* key, void** data, size_t* nbytes, int* ndim, int64_t* shape);

#endif /* CAIRN_EXAMPLES_COUPLED_REDIS_TENSORS_H_ */
