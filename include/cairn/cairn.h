/* cairn.h — the C API of cairn, a model cache for HPC deep-learning workflows.
 *
 * Conventions (read these once, they hold for every call):
 *  - Every call that can fail returns a cairn_status; CAIRN_OK (0) is success. On failure,
 *    cairn_last_error() returns a one-line, thread-local description of what went wrong and what to
 *    do; it stays valid until the next cairn call on the same thread.
 *  - Handles are opaque. Each has a create/destroy pair: cairn_connect/cairn_disconnect,
 *    cairn_model_create/(cairn_model_commit_opts|cairn_model_abort), cairn_model_open/cairn_model_close,
 *    a commit's ticket/cairn_ticket_free. Strings returned by the library are freed with cairn_free.
 *  - Names are cairn_<object>_<verb>: the object acted on (tensor, model, ticket, pipeline, client,
 *    status, library, read_options, commit_options, prefetch_options, file_options), then what is
 *    done to it (cairn_tensor_put, cairn_model_commit_opts, cairn_ticket_wait, cairn_pipeline_flush). Calls on
 *    the connection as a whole have no object: cairn_connect, cairn_disconnect, cairn_hint,
 *    cairn_query, cairn_request, cairn_free, cairn_last_error. The C++ interface (client.hpp), the
 *    Python package and the Fortran module use the same names without the "cairn_" prefix and
 *    without the object their class stands for (cairn_tensor_put -> Client::tensor_put,
 *    cairn_model_commit_opts -> Writer::commit, cairn_ticket_wait -> Ticket::wait); docs/api.md.
 *  - Variants of one operation are options of one call: a read copies (cairn_model_read) or maps
 *    (cairn_model_map) any number of tensors, to host or device memory, as cairn_read_options say;
 *    a commit waits or not, pipelined or not, as cairn_commit_options say.
 *  - Options structs start with a `size` field and are initialised with their *_INIT macro or
 *    *_init() call, then changed field by field; a NULL options pointer means the defaults. The
 *    library reads the first `size` bytes, so a program built against an older header keeps
 *    working, and refuses (CAIRN_ERR_INVALID_ARGUMENT) a newer struct whose unknown fields are not
 *    zero (as Linux does for openat2's struct open_how). Fields are only ever appended.
 *  - A cairn_client is used by one thread at a time; use one client per thread. Readers and writers
 *    belong to the client that created them and must be finished before it is disconnected.
 *  - Model ids, tensor names and keys are NUL-terminated UTF-8 strings of 1..1024 bytes.
 *  - There is no global state: two clients in one process are independent.
 *  - Older names stay at the end of this header, each naming its replacement (docs/api.md lists
 *    them): the names the design fixes (cairn_put_tensor, cairn_wait, ...) as synonyms without a
 *    warning, the others deprecated (the compiler warns) and removed in the next release.
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

/* Marks a name kept for one release; the compiler's warning names the replacement. */
#if defined(__GNUC__) || defined(__clang__)
#define CAIRN_DEPRECATED(replacement) __attribute__((deprecated("use " replacement " (docs/api.md)")))
#else
#define CAIRN_DEPRECATED(replacement)
#endif
/* Marks a synonym the design fixes: no warning, unless the program defines CAIRN_WARN_SYNONYMS
 * before including this header to find the calls it may move to the general names. */
#ifdef CAIRN_WARN_SYNONYMS
#define CAIRN_SYNONYM(replacement) CAIRN_DEPRECATED(replacement)
#else
#define CAIRN_SYNONYM(replacement)
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
  CAIRN_DTYPE_F64,
  CAIRN_DTYPE_F32,
  CAIRN_DTYPE_F16,
  CAIRN_DTYPE_BF16,
  CAIRN_DTYPE_F8_E4M3,
  CAIRN_DTYPE_F8_E5M2,
  CAIRN_DTYPE_I64,
  CAIRN_DTYPE_I32,
  CAIRN_DTYPE_I16,
  CAIRN_DTYPE_I8,
  CAIRN_DTYPE_U64,
  CAIRN_DTYPE_U32,
  CAIRN_DTYPE_U16,
  CAIRN_DTYPE_U8,
  CAIRN_DTYPE_BOOL
} cairn_dtype;

/* How far a commit must have gone before it is acknowledged:
 *  MEMORY: in the node daemon's DRAM arena (lost if the daemon dies before it is flushed);
 *  LOCAL:  on node-local storage (the NVMe tier; without one, the repository);
 *  GLOBAL: in the repository on the parallel filesystem, surviving any daemon failure. */
typedef enum { CAIRN_DURABILITY_MEMORY, CAIRN_DURABILITY_LOCAL, CAIRN_DURABILITY_GLOBAL } cairn_durability;

/* Where a read puts (or a prefetch stages) the bytes: host memory (the daemon's DRAM arena), or CUDA
 * device memory (docs/gpu.md). */
typedef enum { CAIRN_MEM_HOST, CAIRN_MEM_CUDA } cairn_memkind;

#define CAIRN_MAX_DIMS 8
#define CAIRN_MAX_NAME_BYTES 1024
/* The daemon's first HBM device, where an options struct names a device. */
#define CAIRN_DEVICE_DEFAULT (-1)

/* ---- options ---- */

/* How cairn_model_read and cairn_model_map deliver tensors. */
typedef struct cairn_read_options {
  size_t size;        /* sizeof(cairn_read_options), set by the initialiser; the struct's version */
  cairn_memkind kind; /* CAIRN_MEM_HOST (default): host memory. CAIRN_MEM_CUDA: device memory -- a
                       * read copies into device buffers, a map gives device pointers into the
                       * daemon's HBM tier */
  int device;         /* map to CAIRN_MEM_CUDA: the HBM device whose copy is mapped (default
                       * CAIRN_DEVICE_DEFAULT: the daemon's first); a read copies to the device of
                       * each destination pointer and ignores it */
  int private_copy;   /* map to host memory only: 1 gives writable copy-on-write views (a write
                       * copies the page it touches into this process; the stored model never
                       * changes). Default 0: read-only views */
} cairn_read_options;
#define CAIRN_READ_OPTIONS_INIT \
  { sizeof(cairn_read_options), CAIRN_MEM_HOST, CAIRN_DEVICE_DEFAULT, 0 }

/* How cairn_model_commit_opts commits. */
typedef struct cairn_commit_options {
  size_t size;                 /* sizeof(cairn_commit_options), set by the initialiser */
  cairn_durability durability; /* what is acknowledged (wait) or what the ticket waits for.
                                * Default CAIRN_DURABILITY_GLOBAL */
  int wait;                    /* 1 (default): the call returns once `durability` is reached, with
                                * the commit's error; no ticket. 0: a ticket is required; the call
                                * returns once the model is visible (or, pipelined, once the
                                * request is written) and the ticket waits for `durability` */
  int pipelined;               /* 1 (with wait 0 only): the call returns as soon as the request is
                                * written -- the tensors are already in the daemon's arena, so the
                                * caller's buffers may be reused -- and the commit's own outcome
                                * (CAIRN_ERR_EXISTS, CAIRN_ERR_NOT_FOUND for a missing parent, a
                                * missing part, ...) is returned by cairn_ticket_wait, never by
                                * another call. Default 0 */
} cairn_commit_options;
#define CAIRN_COMMIT_OPTIONS_INIT \
  { sizeof(cairn_commit_options), CAIRN_DURABILITY_GLOBAL, 1, 0 }

/* What cairn_model_prefetch stages, and where. */
typedef struct cairn_prefetch_options {
  size_t size;             /* sizeof(cairn_prefetch_options), set by the initialiser */
  cairn_memkind kind;      /* CAIRN_MEM_HOST (default): into the daemon's DRAM. CAIRN_MEM_CUDA: into its
                            * HBM tier (on `device`) */
  int device;              /* with CAIRN_MEM_CUDA: the HBM device (default CAIRN_DEVICE_DEFAULT) */
  int all;                 /* 1: into every member of the job's peer group at once (docs/peers.md),
                            * waiting until all have it. Default 0: this node's daemon only */
  int timeout_ms;          /* with all: how long the members may take (default 0: the daemon's, 600 s) */
  const char* progress_id; /* a name under which the daemon reports the prefetch's progress while it
                            * runs: cairn_request {"op":"progress","id":progress_id} from another
                            * client (docs/protocol.md, "progress"). Default NULL: none */
} cairn_prefetch_options;
#define CAIRN_PREFETCH_OPTIONS_INIT \
  { sizeof(cairn_prefetch_options), CAIRN_MEM_HOST, CAIRN_DEVICE_DEFAULT, 0, 0, NULL }

/* Called on the calling thread as cairn_model_put_file_opts or cairn_model_get_file_opts moves a
 * file: the phase in a few words ("reading FILE", "committing", "writing FILE"), the tensor bytes
 * done and the bytes in all (0: not known), at least once per 8 MiB and once at the end of each
 * phase. phase is valid during the call only. */
typedef void (*cairn_progress_fn)(void* ctx, const char* phase, uint64_t done, uint64_t total);

/* How cairn_model_put_file_opts stores a safetensors file and cairn_model_get_file_opts writes one. */
typedef struct cairn_file_options {
  size_t size;                   /* sizeof(cairn_file_options), set by the initialiser */
  const char* parent;            /* put: the parent model (default NULL: none) */
  cairn_durability durability;   /* put: what the call waits for (default CAIRN_DURABILITY_GLOBAL) */
  const char* metadata_json;     /* put: a JSON object stored as the model's metadata (default NULL) */
  const char* architecture_json; /* put: the architecture graph as JSON (docs/graph-format.md;
                                  * default NULL: none) */
  size_t count;                  /* get: write only the `count` tensors `names`, in that order
                                  * (default 0: the whole model, byte for byte as it was put) */
  const char* const* names;      /* get: the `count` tensor names */
  cairn_progress_fn progress;    /* put and get: called as the bytes move (default NULL: not called) */
  void* progress_ctx;            /* passed to progress */
} cairn_file_options;
#define CAIRN_FILE_OPTIONS_INIT \
  { sizeof(cairn_file_options), NULL, CAIRN_DURABILITY_GLOBAL, NULL, NULL, 0, NULL, NULL, NULL }

/* The same defaults as the *_INIT macros, for callers without the C preprocessor (Fortran,
 * ctypes). Always succeed; NULL is ignored. Each writes the whole struct as this library defines
 * it: a binding that ships with the library (the Python package, the Fortran module) declares the
 * same struct; a C or C++ program uses the macro, which sizes the struct by the program's header. */
CAIRN_EXPORT void cairn_read_options_init(cairn_read_options* o);
CAIRN_EXPORT void cairn_commit_options_init(cairn_commit_options* o);
CAIRN_EXPORT void cairn_prefetch_options_init(cairn_prefetch_options* o);
CAIRN_EXPORT void cairn_file_options_init(cairn_file_options* o);

/* ---- status ---- */

/* A static, human-readable string for s. Never NULL. */
CAIRN_EXPORT const char* cairn_status_string(cairn_status s);
/* The detail of the last failed call on this thread ("" if none). Valid until the next call. */
CAIRN_EXPORT const char* cairn_last_error(void);
/* The C name of s ("CAIRN_ERR_NOT_FOUND"), from the one list (status_codes.h); NULL for a value
 * that is not a status of this library. Bindings build their status tables from it. */
CAIRN_EXPORT const char* cairn_status_name(int s);
/* 1 when this library was built with CUDA (it can copy between the daemon's arena and CUDA device
 * memory itself), 0 when not (device copies then need the daemon's HBM tier). */
CAIRN_EXPORT int cairn_library_has_cuda(void);

/* ---- connection ---- */

/* Connects to the node daemon. address: a Unix socket path; NULL means $CAIRN_SOCKET, then
 * ${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock. Fails with CAIRN_ERR_UNAVAILABLE (naming the
 * path) when no daemon listens there. */
CAIRN_EXPORT cairn_status cairn_connect(const char* address, cairn_client** out);
/* Ends the connection; leases held by its readers end with it. Replies of pipelined commits still
 * in flight are collected first (every commit sent is processed; call cairn_pipeline_flush before
 * to learn the errors of commits whose tickets were freed unwaited). NULL is ignored. */
CAIRN_EXPORT void cairn_disconnect(cairn_client* c);
/* The socket path c is connected to (the default resolved when cairn_connect got NULL). Valid until
 * cairn_disconnect(c); "" when c is NULL. */
CAIRN_EXPORT const char* cairn_client_address(const cairn_client* c);

/* ---- named tensors (simulation coupling) ---- */

/* Stores (or replaces) the tensor under key. shape has ndim (0..CAIRN_MAX_DIMS) entries; data holds
 * prod(shape) * itemsize bytes, row-major. The bytes are copied before the call returns. */
CAIRN_EXPORT cairn_status cairn_tensor_put(cairn_client* c, const char* key, const void* data, cairn_dtype dtype,
                                           int ndim, const int64_t* shape);
/* Describes the tensor under key; CAIRN_ERR_NOT_FOUND if there is none. Any out pointer may be NULL. */
CAIRN_EXPORT cairn_status cairn_tensor_info(cairn_client* c, const char* key, cairn_dtype* dtype, int* ndim,
                                            int64_t shape[CAIRN_MAX_DIMS], size_t* nbytes);
/* Copies the tensor's bytes into dst; CAIRN_ERR_INVALID_ARGUMENT if dst_bytes is not its size. */
CAIRN_EXPORT cairn_status cairn_tensor_unpack(cairn_client* c, const char* key, void* dst, size_t dst_bytes);
/* Copies the tensor under key in one round trip without knowing its size first: alloc(ctx, dtype,
 * ndim, shape, nbytes) is called with its description and returns a buffer of nbytes (NULL:
 * CAIRN_ERR_NO_SPACE). What bindings that allocate their own arrays use (Python's get_tensor). */
typedef void* (*cairn_alloc_fn)(void* ctx, cairn_dtype dtype, int ndim, const int64_t* shape, size_t nbytes);
CAIRN_EXPORT cairn_status cairn_tensor_unpack_alloc(cairn_client* c, const char* key, cairn_alloc_fn alloc, void* ctx);
/* Waits up to timeout_ms (0: do not wait, -1: forever) for key to exist; *found says whether it does. */
CAIRN_EXPORT cairn_status cairn_tensor_poll(cairn_client* c, const char* key, int timeout_ms, int* found);
/* Deletes the tensor under key; CAIRN_ERR_NOT_FOUND if there is none. */
CAIRN_EXPORT cairn_status cairn_tensor_delete(cairn_client* c, const char* key);

/* ---- writing a model ---- */

/* Starts a new model id, derived from parent (NULL: none). Nothing is visible until commit. */
CAIRN_EXPORT cairn_status cairn_model_create(cairn_client* c, const char* id, const char* parent,
                                             cairn_model_writer** out);
/* Starts part `index` (0-based) of model `id`, which `count` writers (ranks) write at once: each adds
 * its own tensors (no name twice across parts) and commits its part. Nothing is visible until every
 * part is committed; then the model appears at once, its tensors in part order, at the weakest
 * durability any part asked for. All parts name the same parent. A part committed without waiting
 * returns at once; the ticket resolves when the whole model reaches the durability, or fails (every
 * part's does) when a part is missing timeout_ms after the first part arrived (timeout_ms <= 0: 60 s)
 * -- the error names the missing parts, and nothing of the model is ever visible. */
CAIRN_EXPORT cairn_status cairn_model_create_part(cairn_client* c, const char* id, const char* parent, int index,
                                                  int count, int timeout_ms, cairn_model_writer** out);
/* Adds a tensor; its bytes are copied into the daemon's arena before the call returns. */
CAIRN_EXPORT cairn_status cairn_model_add_tensor(cairn_model_writer* w, const char* name, const void* data,
                                                 cairn_dtype dtype, int ndim, const int64_t* shape);
/* One tensor of cairn_model_add_tensors. */
typedef struct cairn_tensor_in {
  const char* name;
  const void* data;
  cairn_dtype dtype;
  int ndim;
  const int64_t* shape;
} cairn_tensor_in;
/* cairn_model_add_tensor for each of the n tensors, in order, with the copies (and hashes) of all
 * of them shared among up to 4 threads: a model of many small tensors (each a chunk or less) is
 * copied on every core instead of one tensor at a time. Every argument is checked first, so an
 * error (naming the tensor) adds none of them; the bytes are all copied when the call returns. */
CAIRN_EXPORT cairn_status cairn_model_add_tensors(cairn_model_writer* w, const cairn_tensor_in* tensors, size_t n);
/* Adds a tensor whose bytes are in device memory (docs/gpu.md): with a CUDA daemon or library, a
 * CUDA device pointer; with the emulated device backend (tiers.hbm.backend: emulated), memory of this
 * process. The bytes are copied device-to-host into the daemon's arena before the call returns, so
 * the caller may overwrite its buffer at once, and a commit at CAIRN_DURABILITY_MEMORY is
 * acknowledged only after the copy. CAIRN_ERR_UNAVAILABLE, naming why, when neither the daemon has
 * an HBM tier nor this process a GPU. */
CAIRN_EXPORT cairn_status cairn_model_add_tensor_device(cairn_model_writer* w, const char* name, const void* data,
                                                        cairn_dtype dtype, int ndim, const int64_t* shape);
/* Adds a tensor whose bytes the caller writes in place: *data receives prod(shape) * itemsize
 * writable bytes of the daemon's shared arena (no copy; e.g. read a file straight into them). They
 * must be filled before the commit and are valid until it (or cairn_model_abort) returns.
 * Arguments are checked as by cairn_model_add_tensor; CAIRN_ERR_NO_SPACE when the arena is full. */
CAIRN_EXPORT cairn_status cairn_model_add_tensor_space(cairn_model_writer* w, const char* name, cairn_dtype dtype,
                                                       int ndim, const int64_t* shape, void** data);
/* Says that the tensor `name`, added with cairn_model_add_tensor_space, holds its final bytes: they
 * are hashed now, on the library's threads (one fewer than the cores, or the copy-thread count set
 * with cairn_model_set_copy_threads), while the caller fills the next tensor, so the commit need not
 * read them again, only hash on the caller's thread too what is still waiting (write each tensor,
 * seal it, go on: the commit then costs about the writing). Optional. The bytes must not change
 * after this call (a chunk changed after it fails its hash on every later read).
 * CAIRN_ERR_INVALID_ARGUMENT for a tensor not added through arena space or sealed already. */
CAIRN_EXPORT cairn_status cairn_model_seal_tensor(cairn_model_writer* w, const char* name);
/* Announces the byte sizes of the n tensors over 64 KiB about to be added (optional, a speed-up
 * for many-tensor models): their arena space is allocated now in one round trip instead of one per
 * tensor, and each later add of a tensor of such a size takes one of them. Space left unused is
 * freed at commit or abort. CAIRN_ERR_NO_SPACE when the arena cannot hold them all. */
CAIRN_EXPORT cairn_status cairn_model_reserve(cairn_model_writer* w, size_t n, const size_t* nbytes);
/* The threads this writer's copies into the arena (cairn_model_add_tensor, cairn_model_add_tensors)
 * may use: 0 (the default) one per core, at most 4. A checkpoint copied behind a training step
 * asks for 1, leaving the other cores to the training. */
CAIRN_EXPORT cairn_status cairn_model_set_copy_threads(cairn_model_writer* w, unsigned threads);
/* Keeps the parent's tensor `name` unchanged: costs no bytes and no hashing. */
CAIRN_EXPORT cairn_status cairn_model_inherit_tensor(cairn_model_writer* w, const char* name);
/* Keeps every parent tensor not added or inherited by name (after them, in the parent's order).
 * With nothing else added the commit stores no bytes (a metadata-only commit).
 * CAIRN_ERR_INVALID_ARGUMENT when the model has no parent. */
CAIRN_EXPORT cairn_status cairn_model_inherit_all(cairn_model_writer* w);
/* The architecture graph, as JSON (docs/graph-format.md). */
CAIRN_EXPORT cairn_status cairn_model_set_architecture(cairn_model_writer* w, const char* graph_json);
/* Metadata: a JSON object (score, epoch, task, tags ...). */
CAIRN_EXPORT cairn_status cairn_model_set_metadata(cairn_model_writer* w, const char* meta_json);
/* Commits and frees w (whatever the result), as opts say (NULL: the defaults, a commit waited for
 * at CAIRN_DURABILITY_GLOBAL):
 *  - wait = 1: returns once opts->durability is reached, with the commit's error. ticket may be NULL;
 *    otherwise *ticket is set to NULL (there is nothing left to wait for).
 *  - wait = 0, pipelined = 0: returns once the model is visible (in the daemon's memory), with its
 *    error if it failed; *ticket (required) waits for the durability.
 *  - wait = 0, pipelined = 1: returns as soon as the request is written; *ticket (required) stands
 *    for the daemon's reply and then the durability. Requests of one client are served in order,
 *    so a later request of the same client (a child commit, an open) sees the model; other clients
 *    see it once its reply was collected (cairn_ticket_wait, cairn_pipeline_flush, or any later call
 *    of this client that needs a reply). At most 256 requests are in flight: the 257th waits for
 *    the oldest reply. An error returned by the call itself means nothing was sent (e.g.
 *    CAIRN_ERR_UNAVAILABLE). See docs/protocol.md, "Pipelined commits".
 * For a part (cairn_model_create_part) the ticket follows the whole model. wait together with
 * pipelined is CAIRN_ERR_INVALID_ARGUMENT. */
CAIRN_EXPORT cairn_status cairn_model_commit_opts(cairn_model_writer* w, const cairn_commit_options* opts,
                                                  cairn_ticket** ticket);
/* Drops an uncommitted model and frees w. */
CAIRN_EXPORT void cairn_model_abort(cairn_model_writer* w);
/* Stores the safetensors file at `path` as model `id`, derived from `parent` (NULL or "": none;
 * tensors equal to the parent's are stored once), with `meta_json` (NULL or a JSON object) as its
 * metadata, and returns once durability d is reached. Large tensors are read from the file straight
 * into the daemon's arena. The file's header is kept: cairn_model_get_file gives the same bytes back.
 * A file that is not valid safetensors is CAIRN_ERR_INVALID_ARGUMENT naming what is wrong. */
CAIRN_EXPORT cairn_status cairn_model_put_file(cairn_client* c, const char* id, const char* path, const char* parent,
                                               cairn_durability d, const char* meta_json);
/* cairn_model_put_file as opts say (NULL: the defaults, no parent, CAIRN_DURABILITY_GLOBAL): also
 * the architecture graph, and progress reports -- the phase "reading PATH" (the tensor bytes copied
 * into the daemon), then "committing" (0 of 0 bytes, until the commit returns). opts->count and
 * opts->names are CAIRN_ERR_INVALID_ARGUMENT here (they choose what a get writes). */
CAIRN_EXPORT cairn_status cairn_model_put_file_opts(cairn_client* c, const char* id, const char* path,
                                                    const cairn_file_options* opts);

/* ---- tickets and the pipeline ---- */

/* Waits up to timeout_ms (-1: forever) for the ticket: for a pipelined commit, first its reply (the
 * commit's own error is returned here), then the durability asked for. CAIRN_ERR_TIMEOUT if not
 * yet (wait again later); CAIRN_ERR_UNAVAILABLE if the connection was lost before the reply came
 * (the commit may or may not have been made). Waiting again returns the same outcome. */
CAIRN_EXPORT cairn_status cairn_ticket_wait(cairn_ticket* t, int timeout_ms);
/* Frees a ticket. Freeing a pipelined commit's ticket before waiting for it does not cancel the
 * commit; its error, if any, is then returned by the next cairn_pipeline_flush. */
CAIRN_EXPORT void cairn_ticket_free(cairn_ticket* t);
/* Collects the reply of every pipelined commit of c still in flight (resolving their tickets).
 * Returns CAIRN_OK, or the first error of a pipelined commit whose ticket was freed before its reply
 * came (errors of tickets still held stay on them), or CAIRN_ERR_UNAVAILABLE when the connection
 * was lost. After it returns, every commit of c is visible to every client. */
CAIRN_EXPORT cairn_status cairn_pipeline_flush(cairn_client* c);
/* How many requests of c are sent and not yet answered (0 for NULL). */
CAIRN_EXPORT size_t cairn_pipeline_in_flight(const cairn_client* c);

/* ---- reading a model ---- */

CAIRN_EXPORT cairn_status cairn_model_open(cairn_client* c, const char* id, cairn_model_reader** out);
CAIRN_EXPORT cairn_status cairn_model_tensor_count(cairn_model_reader* r, size_t* count);
/* Describes tensor number index (0..count-1). *name stays valid until cairn_model_close. */
CAIRN_EXPORT cairn_status cairn_model_tensor_info(cairn_model_reader* r, size_t index, const char** name,
                                                  cairn_dtype* dtype, int* ndim, int64_t shape[CAIRN_MAX_DIMS],
                                                  size_t* nbytes);
/* Copies `count` tensors with one request to the daemon: dsts[i] receives names[i], and
 * dst_bytes[i] must equal its size. opts (NULL: host memory):
 *  - kind CAIRN_MEM_HOST: dsts are host buffers; one copy from the daemon's arena.
 *  - kind CAIRN_MEM_CUDA: dsts are device memory (docs/gpu.md): when the daemon has an HBM tier the
 *    tensors are promoted there, leased with one request and copied device-to-device back to back
 *    (with the emulated backend, dsts are memory of this process); otherwise, when this library has
 *    CUDA and the process sees a GPU, copied from the arena; otherwise CAIRN_ERR_UNAVAILABLE,
 *    naming both reasons.
 * private_copy is CAIRN_ERR_INVALID_ARGUMENT here (a copy is the caller's already). */
CAIRN_EXPORT cairn_status cairn_model_read(cairn_model_reader* r, size_t count, const char* const* names,
                                           void* const* dsts, const size_t* dst_bytes, const cairn_read_options* opts);
/* Zero-copy views of `count` tensors with one request to the daemon (data[i], nbytes[i] for
 * names[i]; nbytes may be NULL); all or nothing. Valid until cairn_model_close(r); the tensors
 * cannot move or be evicted meanwhile, and a process that dies holding them leaks nothing.
 * opts (NULL: read-only host views):
 *  - kind CAIRN_MEM_HOST: views into the daemon's shared arena, read-only (writing one faults);
 *    with private_copy = 1 writable and copy-on-write: the pages are mapped privately into this
 *    process, a write copies only the page it touches, and the stored model never changes (for
 *    frameworks that train the weights they load, docs/python.md).
 *  - kind CAIRN_MEM_CUDA: device pointers into the daemon's HBM tier on opts->device (the slab
 *    holding each tensor mapped through its CUDA IPC handle, or the emulated device's segment),
 *    read-only; the tensors are promoted into HBM first. CAIRN_ERR_UNAVAILABLE when the daemon has
 *    no HBM tier; CAIRN_ERR_NO_SPACE when the device's pool is held by other device leases;
 *    private_copy is CAIRN_ERR_INVALID_ARGUMENT. */
CAIRN_EXPORT cairn_status cairn_model_map(cairn_model_reader* r, size_t count, const char* const* names, void** data,
                                          size_t* nbytes, const cairn_read_options* opts);
/* The open model's id, its parent ("" for none) and its metadata as JSON text ("{}" for none); any
 * out pointer may be NULL. The strings stay valid until cairn_model_close(r). */
CAIRN_EXPORT cairn_status cairn_model_describe(cairn_model_reader* r, const char** id, const char** parent,
                                               const char** metadata_json);
CAIRN_EXPORT void cairn_model_close(cairn_model_reader* r);
/* Writes model `id` as the safetensors file `path` (written to a temporary file, then renamed into
 * place). A model stored from a file comes back byte for byte. */
CAIRN_EXPORT cairn_status cairn_model_get_file(cairn_client* c, const char* id, const char* path);
/* cairn_model_get_file as opts say (NULL: the whole model, no progress): only the opts->count
 * tensors opts->names, in that order (CAIRN_ERR_NOT_FOUND naming a tensor the model lacks), and
 * progress reports -- the phase "writing PATH" (tensor bytes written). put's parent,
 * metadata_json and architecture_json are CAIRN_ERR_INVALID_ARGUMENT here; durability is not read. */
CAIRN_EXPORT cairn_status cairn_model_get_file_opts(cairn_client* c, const char* id, const char* path,
                                                    const cairn_file_options* opts);

/* ---- hints and queries ---- */

/* Stages model id ahead of need, as opts say (NULL: into this node's DRAM). Returns once the model
 * is there (*result_json: {"bytes"} now resident, docs/protocol.md "prefetch"); with `all` once
 * every member of the peer group has it, *result_json receiving {"bytes", "seconds",
 * "all_seconds", "all_ok", "peers", "members": [{"member", "ok", "bytes", "seconds", "error"}]} --
 * a member that failed is listed there, not an error of the call. result_json may be NULL; else it
 * receives the daemon's answer (free with cairn_free). */
CAIRN_EXPORT cairn_status cairn_model_prefetch(cairn_client* c, const char* id, const cairn_prefetch_options* opts,
                                               char** result_json);
/* Tells the daemon what the workflow will read (docs/policy.md); advice, never an error on a later
 * read. hint_json is one hint object, e.g. {"kind":"will_load","models":["m7"],"when":"next"},
 * {"kind":"population","models":[...]} (optionally with "scores":[one per model, higher is better]
 * and "tournament":k, the tournament size parents are drawn with), {"kind":"sequence","models":[...],
 * "ahead":2}, {"kind":"done","models":[...]}. A malformed hint is CAIRN_ERR_INVALID_ARGUMENT naming the field;
 * models that do not exist are ignored (listed in *result_json). result_json may be NULL; else it
 * receives the daemon's answer (free with cairn_free). */
CAIRN_EXPORT cairn_status cairn_hint(cairn_client* c, const char* hint_json, char** result_json);
/* Runs a JSON catalog query (docs/catalog.md), e.g. {"op":"ancestors","model":"m7"},
 * {"op":"descendants","model":"m0"}, {"op":"best_ancestor","graph":{...}}; *result_json (free with
 * cairn_free) is the JSON answer. */
CAIRN_EXPORT cairn_status cairn_query(cairn_client* c, const char* request_json, char** result_json);
/* Sends one request of the wire protocol (docs/protocol.md) that has no call of its own: a JSON
 * object with a string "op", one of "ping", "list", "show", "remove", "gc", "flush", "fsck",
 * "sync", "stats", "peers", "compute", "progress", "fault" (and ops a newer daemon adds).
 * *response_json (free with cairn_free) is the response without its "status"; a failed response
 * becomes the call's status. An op that has a call is refused with CAIRN_ERR_INVALID_ARGUMENT
 * naming the call: "hello" (cairn_connect), "allocate" (cairn_model_add_tensor_space), "free"
 * (cairn_model_abort), "put_tensor", "tensor_info", "lease_tensor", "poll_tensor", "delete_tensor"
 * (cairn_tensor_*), "commit" (cairn_model_commit_opts), "open", "lease", "lease_device"
 * (cairn_model_open, cairn_model_read, cairn_model_map), "release" (cairn_model_close),
 * "prefetch" (cairn_model_prefetch), "hint" (cairn_hint), "query" (cairn_query); so is a request
 * with a "release" field. */
CAIRN_EXPORT cairn_status cairn_request(cairn_client* c, const char* request_json, char** response_json);
CAIRN_EXPORT void cairn_free(void* p);

/* ---- names the design fixes: synonyms of the calls above, kept without a warning ---- */

/* cairn_tensor_put. */
CAIRN_SYNONYM("cairn_tensor_put")
CAIRN_EXPORT cairn_status cairn_put_tensor(cairn_client* c, const char* key, const void* data, cairn_dtype dtype,
                                           int ndim, const int64_t* shape);
/* cairn_tensor_info. */
CAIRN_SYNONYM("cairn_tensor_info")
CAIRN_EXPORT cairn_status cairn_get_tensor_info(cairn_client* c, const char* key, cairn_dtype* dtype, int* ndim,
                                                int64_t shape[CAIRN_MAX_DIMS], size_t* nbytes);
/* cairn_tensor_unpack. */
CAIRN_SYNONYM("cairn_tensor_unpack")
CAIRN_EXPORT cairn_status cairn_unpack_tensor(cairn_client* c, const char* key, void* dst, size_t dst_bytes);
/* cairn_tensor_poll. */
CAIRN_SYNONYM("cairn_tensor_poll")
CAIRN_EXPORT cairn_status cairn_poll_tensor(cairn_client* c, const char* key, int timeout_ms, int* found);
/* cairn_tensor_delete. */
CAIRN_SYNONYM("cairn_tensor_delete")
CAIRN_EXPORT cairn_status cairn_delete_tensor(cairn_client* c, const char* key);
/* cairn_ticket_wait. */
CAIRN_SYNONYM("cairn_ticket_wait")
CAIRN_EXPORT cairn_status cairn_wait(cairn_ticket* t, int timeout_ms);
/* cairn_model_prefetch(c, id, NULL, NULL). */
CAIRN_SYNONYM("cairn_model_prefetch")
CAIRN_EXPORT cairn_status cairn_prefetch(cairn_client* c, const char* id);
/* cairn_model_commit_opts with durability d: ticket == NULL waits for d; with a ticket at
 * CAIRN_DURABILITY_MEMORY (not a part) the commit is pipelined; otherwise it returns once the model
 * is visible and *ticket waits for d. */
CAIRN_SYNONYM("cairn_model_commit_opts")
CAIRN_EXPORT cairn_status cairn_model_commit(cairn_model_writer* w, cairn_durability d, cairn_ticket** ticket);
/* cairn_model_read of one tensor with opts {kind}. */
CAIRN_SYNONYM("cairn_model_read")
CAIRN_EXPORT cairn_status cairn_model_read_tensor(cairn_model_reader* r, const char* name, void* dst, size_t dst_bytes,
                                                  cairn_memkind kind);
/* cairn_model_map of one tensor into host memory, read-only. */
CAIRN_SYNONYM("cairn_model_map")
CAIRN_EXPORT cairn_status cairn_model_map_tensor(cairn_model_reader* r, const char* name, const void** data,
                                                 size_t* nbytes);

/* ---- deprecated: removed in the next release ---- */

CAIRN_DEPRECATED("cairn_tensor_unpack_alloc")
CAIRN_EXPORT cairn_status cairn_unpack_tensor_alloc(cairn_client* c, const char* key, cairn_alloc_fn alloc, void* ctx);
/* cairn_model_commit_opts with {d, wait 0, pipelined 1}. */
CAIRN_DEPRECATED("cairn_model_commit_opts with pipelined = 1, wait = 0")
CAIRN_EXPORT cairn_status cairn_model_commit_pipelined(cairn_model_writer* w, cairn_durability d,
                                                       cairn_ticket** ticket);
CAIRN_DEPRECATED("cairn_model_map with kind = CAIRN_MEM_CUDA")
CAIRN_EXPORT cairn_status cairn_model_map_tensor_device(cairn_model_reader* r, const char* name, int device,
                                                        const void** ptr, size_t* nbytes);
CAIRN_DEPRECATED("cairn_model_map")
CAIRN_EXPORT cairn_status cairn_model_map_tensors(cairn_model_reader* r, size_t count, const char* const* names,
                                                  const void** data, size_t* nbytes);
CAIRN_DEPRECATED("cairn_model_map with private_copy = 1")
CAIRN_EXPORT cairn_status cairn_model_map_tensors_private(cairn_model_reader* r, size_t count, const char* const* names,
                                                          void** data, size_t* nbytes);
CAIRN_DEPRECATED("cairn_model_read")
CAIRN_EXPORT cairn_status cairn_model_read_tensors(cairn_model_reader* r, size_t count, const char* const* names,
                                                   void* const* dsts, const size_t* dst_bytes);
CAIRN_DEPRECATED("cairn_model_map with kind = CAIRN_MEM_CUDA")
CAIRN_EXPORT cairn_status cairn_model_map_tensors_device(cairn_model_reader* r, size_t count, const char* const* names,
                                                         int device, const void** ptrs, size_t* nbytes);
CAIRN_DEPRECATED("cairn_model_read with kind = CAIRN_MEM_CUDA")
CAIRN_EXPORT cairn_status cairn_model_read_tensors_device(cairn_model_reader* r, size_t count, const char* const* names,
                                                          void* const* dsts, const size_t* dst_bytes);
CAIRN_DEPRECATED("cairn_model_prefetch with all = 1")
CAIRN_EXPORT cairn_status cairn_prefetch_all(cairn_client* c, const char* id, char** result_json);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAIRN_CAIRN_H */
