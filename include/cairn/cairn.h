/* cairn.h — the C API of cairn, a model cache for HPC deep-learning workflows.
 *
 * Conventions (read these once, they hold for every call):
 *  - Every call that can fail returns a cairn_status; CAIRN_OK (0) is success. On failure,
 *    cairn_last_error() returns a one-line, thread-local description of what went wrong and what to
 *    do; it stays valid until the next cairn call on the same thread.
 *  - Handles are opaque. Each has a create/destroy pair: cairn_connect/cairn_disconnect,
 *    cairn_model_create/(cairn_model_commit|cairn_model_abort), cairn_model_open/cairn_model_close,
 *    cairn_model_commit's ticket/cairn_ticket_free. Strings returned by the library are freed with
 *    cairn_free.
 *  - Names are <object>_<verb>, following SmartRedis where the job is the same (put_tensor,
 *    unpack_tensor, poll_tensor, delete_tensor).
 *  - A cairn_client is used by one thread at a time; use one client per thread. Readers and writers
 *    belong to the client that created them and must be finished before it is disconnected.
 *  - Model ids, tensor names and keys are NUL-terminated UTF-8 strings of 1..1024 bytes.
 *  - There is no global state: two clients in one process are independent.
 */
#ifndef CAIRN_CAIRN_H
#define CAIRN_CAIRN_H

#include <stddef.h>
#include <stdint.h>

#include "cairn/status_codes.h"

#if defined(_WIN32) || !defined(__GNUC__)
#define CAIRN_EXPORT
#else
#define CAIRN_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cairn_client cairn_client;
typedef struct cairn_model_writer cairn_model_writer;
typedef struct cairn_model_reader cairn_model_reader;
typedef struct cairn_ticket cairn_ticket;

#define CAIRN_STATUS_C_ENUM_(c_name, cpp_name, message) c_name,
typedef enum { CAIRN_STATUS_LIST(CAIRN_STATUS_C_ENUM_) } cairn_status;
#undef CAIRN_STATUS_C_ENUM_

/* The dtypes of safetensors, in this order (the values are part of the ABI). */
typedef enum {
  CAIRN_DTYPE_F64, CAIRN_DTYPE_F32, CAIRN_DTYPE_F16, CAIRN_DTYPE_BF16, CAIRN_DTYPE_F8_E4M3,
  CAIRN_DTYPE_F8_E5M2, CAIRN_DTYPE_I64, CAIRN_DTYPE_I32, CAIRN_DTYPE_I16, CAIRN_DTYPE_I8,
  CAIRN_DTYPE_U64, CAIRN_DTYPE_U32, CAIRN_DTYPE_U16, CAIRN_DTYPE_U8, CAIRN_DTYPE_BOOL
} cairn_dtype;

/* How far a commit must have gone before it is acknowledged:
 *  MEMORY: in the node daemon's DRAM arena (lost if the daemon dies before it is flushed);
 *  LOCAL:  on node-local storage (the NVMe tier; without one, the repository);
 *  GLOBAL: in the repository on the parallel filesystem, surviving any daemon failure. */
typedef enum { CAIRN_DURABILITY_MEMORY, CAIRN_DURABILITY_LOCAL, CAIRN_DURABILITY_GLOBAL } cairn_durability;

typedef enum { CAIRN_MEM_HOST, CAIRN_MEM_CUDA } cairn_memkind;

#define CAIRN_MAX_DIMS 8
#define CAIRN_MAX_NAME_BYTES 1024

/* ---- status ---- */

/* A static, human-readable string for s. Never NULL. */
CAIRN_EXPORT const char *cairn_status_string(cairn_status s);
/* The detail of the last failed call on this thread ("" if none). Valid until the next call. */
CAIRN_EXPORT const char *cairn_last_error(void);
/* The C name of s ("CAIRN_ERR_NOT_FOUND"), from the one list (status_codes.h); NULL for a value
 * that is not a status of this library. Bindings build their status tables from it. */
CAIRN_EXPORT const char *cairn_status_name(int s);
/* 1 when this library was built with CUDA (it can copy between the daemon's arena and CUDA device
 * memory itself), 0 when not (device copies then need the daemon's HBM tier). */
CAIRN_EXPORT int cairn_library_has_cuda(void);

/* ---- connection ---- */

/* Connects to the node daemon. address: a Unix socket path; NULL means $CAIRN_SOCKET, then
 * ${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock. Fails with CAIRN_ERR_UNAVAILABLE (naming the
 * path) when no daemon listens there. */
CAIRN_EXPORT cairn_status cairn_connect(const char *address, cairn_client **out);
/* Ends the connection; leases held by its readers end with it. Replies of pipelined commits still
 * in flight are collected first (every commit sent is processed; call cairn_pipeline_flush before
 * to learn the errors of commits whose tickets were freed unwaited). NULL is ignored. */
CAIRN_EXPORT void cairn_disconnect(cairn_client *c);
/* The socket path c is connected to (the default resolved when cairn_connect got NULL). Valid until
 * cairn_disconnect(c); "" when c is NULL. */
CAIRN_EXPORT const char *cairn_client_address(const cairn_client *c);

/* ---- named tensors (simulation coupling) ---- */

/* Stores (or replaces) the tensor under key. shape has ndim (0..CAIRN_MAX_DIMS) entries; data holds
 * prod(shape) * itemsize bytes, row-major. The bytes are copied before the call returns. */
CAIRN_EXPORT cairn_status cairn_put_tensor(cairn_client *c, const char *key, const void *data,
                                           cairn_dtype dtype, int ndim, const int64_t *shape);
/* Describes the tensor under key; CAIRN_ERR_NOT_FOUND if there is none. Any out pointer may be NULL. */
CAIRN_EXPORT cairn_status cairn_get_tensor_info(cairn_client *c, const char *key, cairn_dtype *dtype,
                                                int *ndim, int64_t shape[CAIRN_MAX_DIMS], size_t *nbytes);
/* Copies the tensor's bytes into dst; CAIRN_ERR_INVALID_ARGUMENT if dst_bytes is not its size. */
CAIRN_EXPORT cairn_status cairn_unpack_tensor(cairn_client *c, const char *key, void *dst, size_t dst_bytes);
/* Copies the tensor under key in one round trip without knowing its size first: alloc(ctx, dtype,
 * ndim, shape, nbytes) is called with its description and returns a buffer of nbytes (NULL:
 * CAIRN_ERR_NO_SPACE). What bindings that allocate their own arrays use (Python's get_tensor). */
typedef void *(*cairn_alloc_fn)(void *ctx, cairn_dtype dtype, int ndim, const int64_t *shape, size_t nbytes);
CAIRN_EXPORT cairn_status cairn_unpack_tensor_alloc(cairn_client *c, const char *key, cairn_alloc_fn alloc, void *ctx);
/* Waits up to timeout_ms (0: do not wait, -1: forever) for key to exist; *found says whether it does. */
CAIRN_EXPORT cairn_status cairn_poll_tensor(cairn_client *c, const char *key, int timeout_ms, int *found);
CAIRN_EXPORT cairn_status cairn_delete_tensor(cairn_client *c, const char *key);

/* ---- writing a model ---- */

/* Starts a new model id, derived from parent (NULL: none). Nothing is visible until commit. */
CAIRN_EXPORT cairn_status cairn_model_create(cairn_client *c, const char *id, const char *parent,
                                             cairn_model_writer **out);
/* Starts part `index` (0-based) of model `id`, which `count` writers (ranks) write at once: each adds
 * its own tensors (no name twice across parts) and commits its part. Nothing is visible until every
 * part is committed; then the model appears at once, its tensors in part order, at the weakest
 * durability any part asked for. All parts name the same parent. A part committed with a ticket
 * returns at once; the ticket resolves when the whole model reaches the durability, or fails (every
 * part's does) when a part is missing timeout_ms after the first part arrived (timeout_ms <= 0: 60 s)
 * -- the error names the missing parts, and nothing of the model is ever visible. */
CAIRN_EXPORT cairn_status cairn_model_create_part(cairn_client *c, const char *id, const char *parent, int index,
                                                  int count, int timeout_ms, cairn_model_writer **out);
/* Adds a tensor; its bytes are copied into the daemon's arena before the call returns. */
CAIRN_EXPORT cairn_status cairn_model_add_tensor(cairn_model_writer *w, const char *name, const void *data,
                                                 cairn_dtype dtype, int ndim, const int64_t *shape);
/* One tensor of cairn_model_add_tensors. */
typedef struct cairn_tensor_in {
  const char *name;
  const void *data;
  cairn_dtype dtype;
  int ndim;
  const int64_t *shape;
} cairn_tensor_in;
/* cairn_model_add_tensor for each of the n tensors, in order, with the copies (and hashes) of all
 * of them shared among up to 4 threads: a model of many small tensors (each a chunk or less) is
 * copied on every core instead of one tensor at a time. Every argument is checked first, so an
 * error (naming the tensor) adds none of them; the bytes are all copied when the call returns. */
CAIRN_EXPORT cairn_status cairn_model_add_tensors(cairn_model_writer *w, const cairn_tensor_in *tensors, size_t n);
/* Adds a tensor whose bytes are in device memory (docs/gpu.md): with a CUDA daemon or library, a
 * CUDA device pointer; with the emulated device backend (tiers.hbm.backend: emulated), memory of this
 * process. The bytes are copied device-to-host into the daemon's arena before the call returns, so
 * the caller may overwrite its buffer at once, and a commit at CAIRN_DURABILITY_MEMORY is
 * acknowledged only after the copy. CAIRN_ERR_UNAVAILABLE, naming why, when neither the daemon has
 * an HBM tier nor this process a GPU. */
CAIRN_EXPORT cairn_status cairn_model_add_tensor_device(cairn_model_writer *w, const char *name, const void *data,
                                                        cairn_dtype dtype, int ndim, const int64_t *shape);
/* Adds a tensor whose bytes the caller writes in place: *data receives prod(shape) * itemsize
 * writable bytes of the daemon's shared arena (no copy; e.g. read a file straight into them). They
 * must be filled before cairn_model_commit and are valid until it (or cairn_model_abort) returns.
 * Arguments are checked as by cairn_model_add_tensor; CAIRN_ERR_NO_SPACE when the arena is full. */
CAIRN_EXPORT cairn_status cairn_model_add_tensor_space(cairn_model_writer *w, const char *name, cairn_dtype dtype,
                                                       int ndim, const int64_t *shape, void **data);
/* Says that the tensor `name`, added with cairn_model_add_tensor_space, holds its final bytes: they
 * are hashed now, on the library's threads (one fewer than the cores, or the copy-thread count set
 * with cairn_model_set_copy_threads), while the caller fills the next tensor, so the commit need not
 * read them again, only hash on the caller's thread too what is still waiting (write each tensor,
 * seal it, go on: the commit then costs about the writing). Optional. The bytes must not change after this call (a chunk changed after it
 * fails its hash on every later read). CAIRN_ERR_INVALID_ARGUMENT for a tensor not added through
 * arena space or sealed already. */
CAIRN_EXPORT cairn_status cairn_model_seal_tensor(cairn_model_writer *w, const char *name);
/* Announces the byte sizes of the n tensors over 64 KiB about to be added (optional, a speed-up
 * for many-tensor models): their arena space is allocated now in one round trip instead of one per
 * tensor, and each later add of a tensor of such a size takes one of them. Space left unused is
 * freed at commit or abort. CAIRN_ERR_NO_SPACE when the arena cannot hold them all. */
CAIRN_EXPORT cairn_status cairn_model_reserve(cairn_model_writer *w, size_t n, const size_t *nbytes);
/* The threads this writer's copies into the arena (cairn_model_add_tensor, cairn_model_add_tensors)
 * may use: 0 (the default) one per core, at most 4. A checkpoint copied behind a training step
 * asks for 1, leaving the other cores to the training. */
CAIRN_EXPORT cairn_status cairn_model_set_copy_threads(cairn_model_writer *w, unsigned threads);
/* Keeps the parent's tensor `name` unchanged: costs no bytes and no hashing. */
CAIRN_EXPORT cairn_status cairn_model_inherit_tensor(cairn_model_writer *w, const char *name);
/* Keeps every parent tensor not added or inherited by name (after them, in the parent's order).
 * With nothing else added the commit stores no bytes (a metadata-only commit).
 * CAIRN_ERR_INVALID_ARGUMENT when the model has no parent. */
CAIRN_EXPORT cairn_status cairn_model_inherit_all(cairn_model_writer *w);
/* The architecture graph, as JSON (docs/graph-format.md). */
CAIRN_EXPORT cairn_status cairn_model_set_architecture(cairn_model_writer *w, const char *graph_json);
/* Metadata: a JSON object (score, epoch, task, tags ...). */
CAIRN_EXPORT cairn_status cairn_model_set_metadata(cairn_model_writer *w, const char *meta_json);
/* Commits and frees w (whatever the result). With ticket == NULL the call returns once durability d
 * is reached (and returns the commit's error). With a ticket:
 *  - d = MEMORY: the commit is pipelined. The call returns as soon as the request is written, without
 *    waiting for the daemon's reply; *ticket stands for that reply. The commit's outcome
 *    (CAIRN_ERR_EXISTS, CAIRN_ERR_NOT_FOUND for a missing parent, ...) is returned by cairn_wait on
 *    this ticket, never by another call. Requests of one client are served in order, so a later
 *    request of the same client (a child commit, an open) sees the model; other clients see it once
 *    its reply was collected (cairn_wait, cairn_pipeline_flush, or any later call of this client
 *    that needs a reply). At most 256 requests are in flight: the 257th waits for the oldest reply.
 *    An error returned by the call itself means nothing was sent (e.g. CAIRN_ERR_UNAVAILABLE).
 *  - d = LOCAL or GLOBAL: the call returns once the model is visible (in memory), with its error if
 *    it failed; *ticket tracks d.
 * See docs/protocol.md, "Pipelined commits". */
CAIRN_EXPORT cairn_status cairn_model_commit(cairn_model_writer *w, cairn_durability d, cairn_ticket **ticket);
/* Commits and frees w, pipelined at every durability (and for a part, cairn_model_create_part):
 * returns as soon as the request is written -- the tensors are already in the daemon's arena, so
 * the caller's buffers may be reused -- without waiting for the daemon to hash, deduplicate and
 * register the model. cairn_wait on *ticket (required) returns the commit's own outcome
 * (CAIRN_ERR_EXISTS, a missing part, ...) and then waits for durability d. Visibility to other
 * clients as for a pipelined MEMORY commit above. What checkpoints that must not block use. */
CAIRN_EXPORT cairn_status cairn_model_commit_pipelined(cairn_model_writer *w, cairn_durability d,
                                                       cairn_ticket **ticket);
/* Drops an uncommitted model and frees w. */
CAIRN_EXPORT void cairn_model_abort(cairn_model_writer *w);
/* Stores the safetensors file at `path` as model `id`, derived from `parent` (NULL or "": none;
 * tensors equal to the parent's are stored once), with `meta_json` (NULL or a JSON object) as its
 * metadata, and returns once durability d is reached. Large tensors are read from the file straight
 * into the daemon's arena. The file's header is kept: cairn_model_get_file gives the same bytes back.
 * A file that is not valid safetensors is CAIRN_ERR_INVALID_ARGUMENT naming what is wrong. */
CAIRN_EXPORT cairn_status cairn_model_put_file(cairn_client *c, const char *id, const char *path, const char *parent,
                                               cairn_durability d, const char *meta_json);
/* Waits up to timeout_ms (-1: forever) for the ticket: for a pipelined commit, first its reply (the
 * commit's own error is returned here), then the durability asked for. CAIRN_ERR_TIMEOUT if not
 * yet (wait again later); CAIRN_ERR_UNAVAILABLE if the connection was lost before the reply came
 * (the commit may or may not have been made). Waiting again returns the same outcome. */
CAIRN_EXPORT cairn_status cairn_wait(cairn_ticket *t, int timeout_ms);
/* Frees a ticket. Freeing a pipelined commit's ticket before waiting for it does not cancel the
 * commit; its error, if any, is then returned by the next cairn_pipeline_flush. */
CAIRN_EXPORT void cairn_ticket_free(cairn_ticket *t);
/* Collects the reply of every pipelined commit of c still in flight (resolving their tickets).
 * Returns CAIRN_OK, or the first error of a pipelined commit whose ticket was freed before its reply
 * came (errors of tickets still held stay on them), or CAIRN_ERR_UNAVAILABLE when the connection
 * was lost. After it returns, every commit of c is visible to every client. */
CAIRN_EXPORT cairn_status cairn_pipeline_flush(cairn_client *c);
/* How many requests of c are sent and not yet answered (0 for NULL). */
CAIRN_EXPORT size_t cairn_pipeline_in_flight(const cairn_client *c);

/* ---- reading a model ---- */

CAIRN_EXPORT cairn_status cairn_model_open(cairn_client *c, const char *id, cairn_model_reader **out);
CAIRN_EXPORT cairn_status cairn_model_tensor_count(cairn_model_reader *r, size_t *count);
/* Describes tensor number index (0..count-1). *name stays valid until cairn_model_close. */
CAIRN_EXPORT cairn_status cairn_model_tensor_info(cairn_model_reader *r, size_t index, const char **name,
                                                  cairn_dtype *dtype, int *ndim, int64_t shape[CAIRN_MAX_DIMS],
                                                  size_t *nbytes);
/* Copies tensor `name` into dst (dst_bytes must equal its size). kind CAIRN_MEM_CUDA: dst is device
 * memory (docs/gpu.md): when the daemon has an HBM tier the tensor is promoted there and copied
 * device-to-device (with the emulated backend, dst is memory of this process); otherwise, when this
 * library has CUDA and the process sees a GPU, copied from the arena; otherwise
 * CAIRN_ERR_UNAVAILABLE, naming both reasons. */
CAIRN_EXPORT cairn_status cairn_model_read_tensor(cairn_model_reader *r, const char *name, void *dst,
                                                  size_t dst_bytes, cairn_memkind kind);
/* A zero-copy, read-only view of tensor `name` in the daemon's shared arena, valid until
 * cairn_model_close(r); the tensor cannot move or be evicted meanwhile. */
CAIRN_EXPORT cairn_status cairn_model_map_tensor(cairn_model_reader *r, const char *name, const void **data,
                                                 size_t *nbytes);
/* A zero-copy, read-only view of tensor `name` in the daemon's HBM tier on `device` (-1: the daemon's
 * first HBM device): *ptr is a device pointer in this process (the slab holding the tensor is
 * mapped through its CUDA IPC handle, or the emulated device's segment), valid until
 * cairn_model_close(r); the tensor cannot move or be evicted meanwhile, and a process that dies
 * holding it leaks nothing. The tensor is promoted into HBM first when it is not there.
 * CAIRN_ERR_UNAVAILABLE when the daemon has no HBM tier; CAIRN_ERR_NO_SPACE when the device's pool
 * is held by other device leases. */
CAIRN_EXPORT cairn_status cairn_model_map_tensor_device(cairn_model_reader *r, const char *name, int device,
                                                        const void **ptr, size_t *nbytes);
/* Maps `count` tensors with one request to the daemon (data[i], nbytes[i] for names[i]); all or
 * nothing. Loading a whole model this way costs one round trip instead of one per tensor. */
CAIRN_EXPORT cairn_status cairn_model_map_tensors(cairn_model_reader *r, size_t count, const char *const *names,
                                                  const void **data, size_t *nbytes);
/* Like cairn_model_map_tensors, but each view is writable and copy-on-write: the tensor's pages in
 * the arena are mapped privately into this process, so reading costs no copy and a write copies
 * only the page it touches into this process's memory; the stored model never changes. Valid
 * until cairn_model_close(r), which unmaps them; the tensors stay leased meanwhile. For frameworks
 * that train the weights they load (docs/python.md, cairn.torch.load into a module). */
CAIRN_EXPORT cairn_status cairn_model_map_tensors_private(cairn_model_reader *r, size_t count,
                                                          const char *const *names, void **data, size_t *nbytes);
/* Copies `count` tensors into host buffers with one request: dsts[i] receives names[i] and
 * dst_bytes[i] must equal its size. */
CAIRN_EXPORT cairn_status cairn_model_read_tensors(cairn_model_reader *r, size_t count, const char *const *names,
                                                   void *const *dsts, const size_t *dst_bytes);
/* cairn_model_map_tensor_device of `count` tensors with one request to the daemon (ptrs[i],
 * nbytes[i] for names[i]); all or nothing. */
CAIRN_EXPORT cairn_status cairn_model_map_tensors_device(cairn_model_reader *r, size_t count,
                                                         const char *const *names, int device, const void **ptrs,
                                                         size_t *nbytes);
/* cairn_model_read_tensor with CAIRN_MEM_CUDA of `count` tensors into device buffers (dsts[i]
 * receives names[i]; dst_bytes[i] must equal its size): with an HBM tier one request leases them
 * all and the device-to-device copies run back to back, so loading a whole model into a module's
 * parameters costs one round trip. */
CAIRN_EXPORT cairn_status cairn_model_read_tensors_device(cairn_model_reader *r, size_t count,
                                                          const char *const *names, void *const *dsts,
                                                          const size_t *dst_bytes);
CAIRN_EXPORT void cairn_model_close(cairn_model_reader *r);
/* Writes model `id` as the safetensors file `path` (written to a temporary file, then renamed into
 * place). A model stored from a file comes back byte for byte. */
CAIRN_EXPORT cairn_status cairn_model_get_file(cairn_client *c, const char *id, const char *path);

/* ---- hints and queries ---- */

/* Asks the daemon to bring model id into DRAM ahead of need. Returns at once. */
CAIRN_EXPORT cairn_status cairn_prefetch(cairn_client *c, const char *id);
/* The same into the DRAM of every member of the job's peer group at once (docs/peers.md), waiting
 * until all have it. *result_json (free with cairn_free; may be NULL) receives
 * {"bytes", "seconds", "all_seconds", "all_ok", "peers", "members": [{"member", "ok", "bytes",
 * "seconds", "error"}]}; a member that failed is listed there, not an error of the call. */
CAIRN_EXPORT cairn_status cairn_prefetch_all(cairn_client *c, const char *id, char **result_json);
/* Tells the daemon what the workflow will read (docs/policy.md); advice, never an error on a later
 * read. hint_json is one hint object, e.g. {"kind":"will_load","models":["m7"],"when":"next"},
 * {"kind":"population","models":[...]}, {"kind":"sequence","models":[...],"ahead":2},
 * {"kind":"done","models":[...]}. A malformed hint is CAIRN_ERR_INVALID_ARGUMENT naming the field;
 * models that do not exist are ignored (listed in *result_json). result_json may be NULL; else it
 * receives the daemon's answer (free with cairn_free). */
CAIRN_EXPORT cairn_status cairn_hint(cairn_client *c, const char *hint_json, char **result_json);
/* Runs a JSON query, e.g. {"op":"ancestors","model":"m7"} or {"op":"descendants","model":"m0"};
 * *result_json (free with cairn_free) is the JSON answer. */
CAIRN_EXPORT cairn_status cairn_query(cairn_client *c, const char *request_json, char **result_json);
/* Sends one request of the wire protocol (docs/protocol.md): a JSON object with a string "op", for
 * catalog and administration requests, e.g. {"op":"list"}, {"op":"show","id":"m7"}, {"op":"stats"},
 * {"op":"remove","id":"m7"}, {"op":"gc"}, {"op":"fsck","verify":false}, {"op":"query",...}.
 * *response_json (free with cairn_free) is the response without its "status"; a failed response
 * becomes the call's status. Requests that hand out arena space or leases, or end them, have
 * dedicated calls and are refused with CAIRN_ERR_INVALID_ARGUMENT: "hello" (cairn_connect),
 * "allocate" (cairn_model_add_tensor_space), "lease" (cairn_model_open / cairn_model_map_tensor),
 * "lease_tensor" (cairn_unpack_tensor), "put_tensor" (cairn_put_tensor), "commit"
 * (cairn_model_create / cairn_model_commit), "free" (cairn_model_abort), "release"
 * (cairn_model_close), as is a request with a "release" field. */
CAIRN_EXPORT cairn_status cairn_request(cairn_client *c, const char *request_json, char **response_json);
CAIRN_EXPORT void cairn_free(void *p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAIRN_CAIRN_H */
