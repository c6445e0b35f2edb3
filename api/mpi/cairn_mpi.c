/* cairn's MPI helpers (include/cairn/cairn_mpi.h, docs/mpi.md): checkpoints as multi-part models,
 * one part per rank, and restores read once and broadcast. Uses only cairn.h and MPI. */
#include "cairn/cairn_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t itemsize(cairn_dtype d) {
  switch (d) {
    case CAIRN_DTYPE_F64:
    case CAIRN_DTYPE_I64:
    case CAIRN_DTYPE_U64:
      return 8;
    case CAIRN_DTYPE_F32:
    case CAIRN_DTYPE_I32:
    case CAIRN_DTYPE_U32:
      return 4;
    case CAIRN_DTYPE_F16:
    case CAIRN_DTYPE_BF16:
    case CAIRN_DTYPE_I16:
    case CAIRN_DTYPE_U16:
      return 2;
    default:
      return 1;
  }
}

static size_t nbytes_of(const cairn_tensor_ref* t) {
  size_t n = itemsize(t->dtype);
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)(t->shape[i] < 0 ? 0 : t->shape[i]);
  return n;
}

typedef struct {
  size_t index;
  size_t bytes;
} by_size;

static int larger_first(const void* a, const void* b) {
  const by_size *x = (const by_size*)a, *y = (const by_size*)b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->index < y->index ? -1 : (x->index > y->index);
}

cairn_status cairn_mpi_assign(const cairn_tensor_ref* tensors, size_t n, int nranks, int* owner) {
  by_size* order;
  size_t *load, i;
  int r;
  if ((n && (!tensors || !owner)) || nranks < 1) return CAIRN_ERR_INVALID_ARGUMENT;
  if (n == 0) return CAIRN_OK;
  order = (by_size*)malloc(n * sizeof *order);
  load = (size_t*)calloc((size_t)nranks, sizeof *load);
  if (!order || !load) {
    free(order);
    free(load);
    return CAIRN_ERR_NO_SPACE;
  }
  for (i = 0; i < n; ++i) {
    order[i].index = i;
    order[i].bytes = nbytes_of(&tensors[i]);
  }
  qsort(order, n, sizeof *order, larger_first);
  for (i = 0; i < n; ++i) {
    int best = 0;
    for (r = 1; r < nranks; ++r)
      if (load[r] < load[best]) best = r;
    owner[order[i].index] = best;
    load[best] += order[i].bytes;
  }
  free(order);
  free(load);
  return CAIRN_OK;
}

/* The first non-OK status of any rank, on every rank (so that a collective call fails everywhere). */
static cairn_status agree(MPI_Comm comm, cairn_status mine) {
  int in = (int)mine, out = 0;
  if (MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS) return CAIRN_ERR_INTERNAL;
  return (cairn_status)out;
}

cairn_status cairn_mpi_checkpoint(MPI_Comm comm, cairn_client* c, const char* id, const char* parent,
                                  const cairn_tensor_ref* tensors, size_t n, cairn_durability d, int timeout_ms,
                                  cairn_ticket** ticket) {
  int rank = 0, size = 1;
  int* owner = NULL;
  cairn_model_writer* w = NULL;
  cairn_status st;
  size_t i;
  if (ticket) *ticket = NULL;
  if (!c || !id || (n && !tensors) || !ticket) return CAIRN_ERR_INVALID_ARGUMENT;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  owner = (int*)malloc((n ? n : 1) * sizeof *owner);
  if (!owner) return CAIRN_ERR_NO_SPACE;
  st = cairn_mpi_assign(tensors, n, size, owner);
  if (st == CAIRN_OK) {
    st = size == 1 ? cairn_model_create(c, id, parent, &w)
                   : cairn_model_create_part(c, id, parent, rank, size, timeout_ms, &w);
  }
  if (st == CAIRN_OK) {
    /* The arena space of this rank's big tensors in one round trip. */
    size_t *sizes = (size_t*)malloc((n ? n : 1) * sizeof *sizes), k = 0;
    if (sizes) {
      for (i = 0; i < n; ++i)
        if (owner[i] == rank && nbytes_of(&tensors[i]) > 64 * 1024) sizes[k++] = nbytes_of(&tensors[i]);
      if (k > 1) st = cairn_model_reserve(w, k, sizes);
      free(sizes);
    }
  }
  for (i = 0; st == CAIRN_OK && i < n; ++i)
    if (owner[i] == rank)
      st = cairn_model_add_tensor(w, tensors[i].name, tensors[i].data, tensors[i].dtype, tensors[i].ndim,
                                  tensors[i].shape);
  free(owner);
  if (st != CAIRN_OK) {
    if (w) cairn_model_abort(w);
    return st;
  }
  /* Returns once this rank's share is in the arena and the request is written (pipelined): the
   * daemon hashes and registers it behind the caller; the ticket follows the whole model. */
  {
    cairn_commit_options opts = CAIRN_COMMIT_OPTIONS_INIT;
    opts.durability = d;
    opts.wait = 0;
    opts.pipelined = 1;
    return cairn_model_commit_opts(w, &opts, ticket);
  }
}

/* Reads the tensors with want[i] set from the daemon into their buffers. */
static cairn_status read_owned(cairn_client* c, const char* id, const cairn_tensor_ref* tensors, size_t n,
                               const char* want) {
  cairn_model_reader* r = NULL;
  cairn_status st = CAIRN_OK;
  size_t i, k = 0;
  for (i = 0; i < n; ++i) k += want[i] != 0;
  if (k == 0) return CAIRN_OK;
  st = cairn_model_open(c, id, &r);
  for (i = 0; st == CAIRN_OK && i < n; ++i)
    if (want[i])
      st = cairn_model_read_tensor(r, tensors[i].name, tensors[i].data, nbytes_of(&tensors[i]), CAIRN_MEM_HOST);
  if (r) cairn_model_close(r);
  return st;
}

static int bcast_bytes(void* data, size_t bytes, int root, MPI_Comm comm) {
  /* MPI counts are ints: big tensors go in pieces. */
  char* p = (char*)data;
  while (bytes > 0) {
    int piece = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
    if (MPI_Bcast(p, piece, MPI_BYTE, root, comm) != MPI_SUCCESS) return 0;
    p += piece;
    bytes -= (size_t)piece;
  }
  return 1;
}

/* The ranks that share a daemon: those of one node (MPI_COMM_TYPE_SHARED), or, when
 * CAIRN_MPI_NODE is set (a number >= 0), those with the same value (a daemon per socket, tests). */
static int split_by_daemon(MPI_Comm comm, int rank, MPI_Comm* local) {
  const char* env = getenv("CAIRN_MPI_NODE");
  if (env && *env) {
    char* end = NULL;
    long v = strtol(env, &end, 10);
    if (*end == '\0' && v >= 0 && v <= INT_MAX) return MPI_Comm_split(comm, (int)v, rank, local);
    fprintf(stderr, "cairn_mpi: CAIRN_MPI_NODE='%s' is not a number >= 0; grouping ranks by node\n", env);
  }
  return MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, local);
}

/* The restore is node-aware. The ranks of one node share its daemon, so each of them reads straight
 * from the daemon's arena -- one copy, no MPI traffic. The tensors are dealt out over the nodes
 * (cairn_mpi_assign over nodes): each node reads only its share, so the model is read once in all
 * from below the node (NVMe, peers, the repository), and the other nodes' shares arrive by MPI_Bcast
 * over `cross` (the ranks with the same node-local rank on every node). On one node nothing is
 * broadcast. When the nodes hold different numbers of ranks, each rank reads its own share and
 * broadcasts it over comm. */
cairn_status cairn_mpi_restore(MPI_Comm comm, cairn_client* c, const char* id, const cairn_tensor_ref* tensors,
                               size_t n) {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, sizes[2], node = 0, nodes = 1, regular;
  int* owner = NULL;
  char* want = NULL;
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  cairn_status st, all;
  size_t i;
  if (!c || !id || (n && !tensors)) return CAIRN_ERR_INVALID_ARGUMENT;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (split_by_daemon(comm, rank, &local) != MPI_SUCCESS) return CAIRN_ERR_INTERNAL;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  /* Regular when every node has as many ranks: then `cross` k spans every node. */
  sizes[0] = local_size;
  sizes[1] = -local_size;
  MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm);
  regular = sizes[0] == -sizes[1];
  if (regular) {
    if (MPI_Comm_split(comm, local_rank, rank, &cross) != MPI_SUCCESS) {
      MPI_Comm_free(&local);
      return CAIRN_ERR_INTERNAL;
    }
    MPI_Comm_rank(cross, &node);
    MPI_Comm_size(cross, &nodes);
  }
  owner = (int*)malloc((n ? n : 1) * sizeof *owner);
  want = (char*)calloc(n ? n : 1, 1);
  st = owner && want ? CAIRN_OK : CAIRN_ERR_NO_SPACE;
  if (st == CAIRN_OK) st = cairn_mpi_assign(tensors, n, regular ? nodes : size, owner);
  if (st == CAIRN_OK) {
    for (i = 0; i < n; ++i) want[i] = owner[i] == (regular ? node : rank);
    st = read_owned(c, id, tensors, n, want);
  }
  all = agree(comm, st);
  for (i = 0; all == CAIRN_OK && i < n; ++i) {
    if (regular && nodes == 1) break;
    if (!bcast_bytes(tensors[i].data, nbytes_of(&tensors[i]), owner[i], regular ? cross : comm))
      all = CAIRN_ERR_INTERNAL;
  }
  free(owner);
  free(want);
  if (cross != MPI_COMM_NULL) MPI_Comm_free(&cross);
  MPI_Comm_free(&local);
  return all;
}
