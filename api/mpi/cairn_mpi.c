/* cairn's MPI helpers (include/cairn/cairn_mpi.h, docs/mpi.md): checkpoints as multi-part models,
 * one part per rank, and restores read once and broadcast. Uses only cairn.h and MPI. */
#include "cairn/cairn_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t itemsize(cairn_dtype d) {
  switch (d) {
    case CAIRN_DTYPE_F64: case CAIRN_DTYPE_I64: case CAIRN_DTYPE_U64: return 8;
    case CAIRN_DTYPE_F32: case CAIRN_DTYPE_I32: case CAIRN_DTYPE_U32: return 4;
    case CAIRN_DTYPE_F16: case CAIRN_DTYPE_BF16: case CAIRN_DTYPE_I16: case CAIRN_DTYPE_U16: return 2;
    default: return 1;
  }
}

static size_t nbytes_of(const cairn_tensor_ref *t) {
  size_t n = itemsize(t->dtype);
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)(t->shape[i] < 0 ? 0 : t->shape[i]);
  return n;
}

typedef struct {
  size_t index;
  size_t bytes;
} by_size;

static int larger_first(const void *a, const void *b) {
  const by_size *x = (const by_size *)a, *y = (const by_size *)b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->index < y->index ? -1 : (x->index > y->index);
}

cairn_status cairn_mpi_assign(const cairn_tensor_ref *tensors, size_t n, int nranks, int *owner) {
  by_size *order;
  size_t *load, i;
  int r;
  if ((n && (!tensors || !owner)) || nranks < 1) return CAIRN_ERR_INVALID_ARGUMENT;
  if (n == 0) return CAIRN_OK;
  order = (by_size *)malloc(n * sizeof *order);
  load = (size_t *)calloc((size_t)nranks, sizeof *load);
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

cairn_status cairn_mpi_checkpoint(MPI_Comm comm, cairn_client *c, const char *id, const char *parent,
                                  const cairn_tensor_ref *tensors, size_t n, cairn_durability d, int timeout_ms,
                                  cairn_ticket **ticket) {
  int rank = 0, size = 1;
  int *owner = NULL;
  cairn_model_writer *w = NULL;
  cairn_status st;
  size_t i;
  if (ticket) *ticket = NULL;
  if (!c || !id || (n && !tensors) || !ticket) return CAIRN_ERR_INVALID_ARGUMENT;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  owner = (int *)malloc((n ? n : 1) * sizeof *owner);
  if (!owner) return CAIRN_ERR_NO_SPACE;
  st = cairn_mpi_assign(tensors, n, size, owner);
  if (st == CAIRN_OK) {
    st = size == 1 ? cairn_model_create(c, id, parent, &w)
                   : cairn_model_create_part(c, id, parent, rank, size, timeout_ms, &w);
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
  return cairn_model_commit_pipelined(w, d, ticket);
}

cairn_status cairn_mpi_restore(MPI_Comm comm, cairn_client *c, const char *id, const cairn_tensor_ref *tensors,
                               size_t n) {
  int rank = 0, size = 1;
  int *owner = NULL;
  cairn_model_reader *r = NULL;
  cairn_status st, all;
  size_t i;
  if (!c || !id || (n && !tensors)) return CAIRN_ERR_INVALID_ARGUMENT;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  owner = (int *)malloc((n ? n : 1) * sizeof *owner);
  if (!owner) return CAIRN_ERR_NO_SPACE;
  st = cairn_mpi_assign(tensors, n, size, owner);
  if (st == CAIRN_OK) st = cairn_model_open(c, id, &r);
  for (i = 0; st == CAIRN_OK && i < n; ++i)
    if (owner[i] == rank)
      st = cairn_model_read_tensor(r, tensors[i].name, tensors[i].data, nbytes_of(&tensors[i]), CAIRN_MEM_HOST);
  if (r) cairn_model_close(r);
  all = agree(comm, st);
  if (all != CAIRN_OK) {
    free(owner);
    return all;
  }
  for (i = 0; i < n; ++i) {
    /* MPI counts are ints: big tensors go in pieces. */
    size_t left = nbytes_of(&tensors[i]);
    char *p = (char *)tensors[i].data;
    while (left > 0) {
      int piece = left > (size_t)INT_MAX ? INT_MAX : (int)left;
      if (MPI_Bcast(p, piece, MPI_BYTE, owner[i], comm) != MPI_SUCCESS) {
        free(owner);
        return CAIRN_ERR_INTERNAL;
      }
      p += piece;
      left -= (size_t)piece;
    }
  }
  free(owner);
  return CAIRN_OK;
}
