/* cairn's MPI helpers: a checkpoint written by every rank of a communicator at once, each rank a
 * disjoint share (no rank writes everything), and a restore where each rank reads its share and the
 * ranks exchange the rest. Built when MPI is found (libcairn_mpi, link with -lcairn_mpi -lcairn and
 * your MPI). docs/mpi.md. */
#ifndef CAIRN_MPI_H
#define CAIRN_MPI_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "cairn/cairn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a state: its name, its bytes (read for a checkpoint, written by a restore), dtype
 * and row-major shape. */
typedef struct cairn_tensor_ref {
  const char* name;
  void* data;
  cairn_dtype dtype;
  int ndim;
  const int64_t* shape;
} cairn_tensor_ref;

/* Which rank writes (and, in a restore, reads) tensor i: the tensors are dealt out by size, largest
 * first, each to the rank with the fewest bytes so far (ties: the lower rank), so every rank
 * computes the same assignment. owner[i] receives the rank, for i < n. */
CAIRN_EXPORT cairn_status cairn_mpi_assign(const cairn_tensor_ref* tensors, size_t n, int nranks, int* owner);

/* Collective over comm: every rank passes the same tensor list (names, dtypes, shapes; the bytes of
 * the tensors it owns must be the state to save). Each rank commits its share as one part of model
 * `id` (cairn_model_create_part, derived from parent when not NULL) and returns as soon as its share
 * is in the daemon's arena (cairn_model_commit_opts, pipelined: the daemon hashes and registers it behind
 * the caller); *ticket resolves when the whole model reaches durability d, or fails -- on every
 * rank -- when the commit failed (e.g. CAIRN_ERR_EXISTS) or some rank's part did not arrive within
 * timeout_ms (<= 0: 60 s). With one rank it is a plain commit. The
 * ranks' daemons must be the same daemon (one node) in this version. Wait with cairn_ticket_wait and free
 * with cairn_ticket_free. */
CAIRN_EXPORT cairn_status cairn_mpi_checkpoint(MPI_Comm comm, cairn_client* c, const char* id, const char* parent,
                                               const cairn_tensor_ref* tensors, size_t n, cairn_durability d,
                                               int timeout_ms, cairn_ticket** ticket);

/* Collective over comm: fills every tensor's buffer with model `id`'s tensor of that name. Node-aware:
 * the tensors are dealt out over the nodes (cairn_mpi_assign); every rank of a node reads its node's
 * share straight from the node's daemon (one copy from the shared arena), and the other nodes'
 * shares arrive by MPI_Bcast, so the model is read once in all from below the nodes' memory. On one
 * node nothing goes through MPI. (Nodes with different rank counts: each rank reads its own share
 * and broadcasts it.) A tensor missing from the model, or of another dtype or size, is
 * CAIRN_ERR_INVALID_ARGUMENT (on every rank). */
CAIRN_EXPORT cairn_status cairn_mpi_restore(MPI_Comm comm, cairn_client* c, const char* id,
                                            const cairn_tensor_ref* tensors, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_MPI_H */
