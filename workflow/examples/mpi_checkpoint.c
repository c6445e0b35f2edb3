/* Data-parallel checkpoint and restart through cairn (docs/mpi.md): every rank holds the same model
 * state (as DDP replicas do); cairn_mpi_checkpoint makes each rank write a disjoint share as one part
 * of one model and return at once; cairn_mpi_restore reads each share once and broadcasts it.
 *
 *   mpirun -np 4 mpi_checkpoint [--id ID] [--tensors N] [--mib M] [--parent ID] [--durability memory]
 *                               [--stall-rank R --timeout-ms T]   (rank R never commits its part)
 *
 * Prints, from rank 0, how long the ranks were blocked by the checkpoint and how long the restore
 * took, and checks on every rank that the restored state is exact (exit status 1 if not). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cairn/cairn_mpi.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  const char *id = "mpi-ckpt", *parent = NULL, *dur = "memory";
  int ntensors = 12, mib = 32, rank = 0, size = 1, i, bad = 0, all_bad = 0, stall = -1, timeout_ms = 30000;
  cairn_client* c = NULL;
  cairn_ticket* ticket = NULL;
  cairn_tensor_ref* refs;
  int64_t* shapes;
  float **data, **back;
  size_t total = 0;
  double t0, blocked, waited, restored, max_blocked = 0, max_restored = 0;
  cairn_durability d;
  cairn_status st;

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--id"))
      id = argv[i + 1];
    else if (!strcmp(argv[i], "--tensors"))
      ntensors = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mib"))
      mib = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--parent"))
      parent = argv[i + 1];
    else if (!strcmp(argv[i], "--durability"))
      dur = argv[i + 1];
    else if (!strcmp(argv[i], "--stall-rank"))
      stall = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--timeout-ms"))
      timeout_ms = atoi(argv[i + 1]);
  }
  d = !strcmp(dur, "global")  ? CAIRN_DURABILITY_GLOBAL
      : !strcmp(dur, "local") ? CAIRN_DURABILITY_LOCAL
                              : CAIRN_DURABILITY_MEMORY;
  if (cairn_connect(NULL, &c) != CAIRN_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* Tensors of decreasing size (like a transformer's embedding, blocks, norms), the same on every
   * rank. */
  refs = calloc((size_t)ntensors, sizeof *refs);
  shapes = calloc((size_t)ntensors, sizeof *shapes);
  data = calloc((size_t)ntensors, sizeof *data);
  back = calloc((size_t)ntensors, sizeof *back);
  {
    size_t budget = (size_t)mib << 20, k;
    for (i = 0; i < ntensors; ++i) {
      size_t n = budget / (size_t)(2 << (i < 6 ? i : 6)) / sizeof(float);
      char* name = malloc(32);
      if (n < 16) n = 16;
      shapes[i] = (int64_t)n;
      data[i] = malloc(n * sizeof(float));
      back[i] = calloc(n, sizeof(float));
      for (k = 0; k < n; ++k) data[i][k] = (float)((k * 2654435761u + (size_t)i * 97u) % 1000003u) / 1000003.0f;
      snprintf(name, 32, "block%02d.weight", i);
      refs[i].name = name;
      refs[i].data = data[i];
      refs[i].dtype = CAIRN_DTYPE_F32;
      refs[i].ndim = 1;
      refs[i].shape = &shapes[i];
      total += n * sizeof(float);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  t0 = now();
  if (rank == stall) {
    /* --stall-rank R: rank R never commits its part (a writer that hung or died before its part),
     * so every other rank's ticket fails after --timeout-ms naming the missing part, and nothing
     * of the model becomes visible. */
    int failed = 0, any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    cairn_disconnect(c);
    MPI_Finalize();
    return any_failed ? 6 : 0;
  }
  st = cairn_mpi_checkpoint(MPI_COMM_WORLD, c, id, parent, refs, (size_t)ntensors, d, timeout_ms, &ticket);
  blocked = now() - t0;
  if (stall >= 0 && stall < size) {
    int failed = 0, any_failed = 0;
    if (st == CAIRN_OK) st = cairn_ticket_wait(ticket, -1);
    if (st != CAIRN_OK) {
      printf("rank %d: the checkpoint failed: %s\n", rank, cairn_last_error());
      failed = 1;
    }
    cairn_ticket_free(ticket);
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    cairn_disconnect(c);
    MPI_Finalize();
    return any_failed ? 6 : 0;
  }
  if (st != CAIRN_OK) {
    fprintf(stderr, "rank %d: checkpoint: %s\n", rank, cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  t0 = now();
  st = cairn_ticket_wait(ticket, -1);
  waited = now() - t0;
  cairn_ticket_free(ticket);
  if (st != CAIRN_OK) {
    fprintf(stderr, "rank %d: the checkpoint failed: %s\n", rank, cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 4);
  }
  for (i = 0; i < ntensors; ++i) refs[i].data = back[i];
  MPI_Barrier(MPI_COMM_WORLD);
  t0 = now();
  st = cairn_mpi_restore(MPI_COMM_WORLD, c, id, refs, (size_t)ntensors);
  restored = now() - t0;
  if (st != CAIRN_OK) {
    fprintf(stderr, "rank %d: restore: %s\n", rank, cairn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 5);
  }
  for (i = 0; i < ntensors; ++i)
    if (memcmp(data[i], back[i], (size_t)shapes[i] * sizeof(float)) != 0) bad = 1;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Reduce(&blocked, &max_blocked, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&restored, &max_restored, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf(
        "checkpoint %s: %d tensors, %zu bytes, %d ranks; blocked %.2f ms (slowest rank), durability %s after "
        "%.2f ms more; restore %.2f ms; %s\n",
        id, ntensors, total, size, max_blocked * 1e3, dur, waited * 1e3, max_restored * 1e3,
        all_bad ? "RESTORE DIFFERS" : "restore exact on every rank");
  for (i = 0; i < ntensors; ++i) {
    free((void*)refs[i].name);
    free(data[i]);
    free(back[i]);
  }
  free(refs);
  free(shapes);
  free(data);
  free(back);
  cairn_disconnect(c);
  MPI_Finalize();
  return all_bad ? 1 : 0;
}
