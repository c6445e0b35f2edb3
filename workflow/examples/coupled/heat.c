/* A simulation coupled to online training through cairn (docs/coupled.md): an MPI 2-D heat
 * diffusion (rows split over the ranks) publishes its field every `every` steps as named tensors
 * heat/<step>/<rank>; a PyTorch trainer (trainer.py) learns a surrogate that predicts the field
 * `every` steps ahead and commits it as a model (surrogate-v<n>, parent surrogate-v<n-1>) with the
 * named tensor surrogate/latest = n. Rank 0 loads the newest surrogate through the C API at each
 * publication, predicts the next published field and, one publication later, reports the error of
 * that prediction.
 *
 *   mpirun -np 2 heat [--n 64] [--steps 400] [--every 5] [--pace-ms 50] [--wait-trainer-s 60]
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cairn/cairn.h"

#define CHECK(call)                                                                          \
  do {                                                                                       \
    if ((call) != CAIRN_OK) {                                                                \
      fprintf(stderr, "heat rank %d: %s: %s\n", rank, #call, cairn_last_error());            \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                          \
    }                                                                                        \
  } while (0)

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Applies a k x k convolution (zero padding, as torch's Conv2d(1, 1, k, padding=k/2)) to f. */
static void conv(const float *f, float *out, int n, const float *w, int k, float bias) {
  int i, j, a, b, h = k / 2;
  for (i = 0; i < n; ++i)
    for (j = 0; j < n; ++j) {
      float s = bias;
      for (a = 0; a < k; ++a)
        for (b = 0; b < k; ++b) {
          int y = i + a - h, x = j + b - h;
          if (y >= 0 && y < n && x >= 0 && x < n) s += w[a * k + b] * f[y * n + x];
        }
      out[i * n + j] = s;
    }
}

int main(int argc, char **argv) {
  int rank = 0, size = 1, n = 64, steps = 400, every = 5, pace = 50, wait_trainer = 60, i, j, s;
  int rows, versions_used = 0, last_version = -1, have_prediction = 0, prediction_version = -1;
  float *u, *v, *full = NULL, *pred = NULL, *next_pred = NULL, *w = NULL;
  cairn_client *c = NULL;
  char key[128];

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--n")) n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--every")) every = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--pace-ms")) pace = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--wait-trainer-s")) wait_trainer = atoi(argv[i + 1]);
  }
  if (n % size != 0) {
    if (rank == 0) fprintf(stderr, "heat: --n %d is not a multiple of %d ranks\n", n, size);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rows = n / size;
  CHECK(cairn_connect(NULL, &c));
  /* This rank's rows plus a halo row above and below. */
  u = calloc((size_t)(rows + 2) * (size_t)n, sizeof(float));
  v = calloc((size_t)(rows + 2) * (size_t)n, sizeof(float));
  for (i = 1; i <= rows; ++i)
    for (j = 0; j < n; ++j) {
      int gi = rank * rows + i - 1;
      float dy = (float)(gi - n / 3), dx = (float)(j - n / 2);
      u[i * n + j] = expf(-(dx * dx + dy * dy) / (float)(n * n / 32));
    }
  if (rank == 0) {
    int found = 0;
    full = calloc((size_t)n * (size_t)n, sizeof(float));
    pred = calloc((size_t)n * (size_t)n, sizeof(float));
    next_pred = calloc((size_t)n * (size_t)n, sizeof(float));
    /* The trainer announces itself; the simulation starts once it listens (or after the wait). */
    CHECK(cairn_poll_tensor(c, "trainer/ready", wait_trainer * 1000, &found));
    if (!found) fprintf(stderr, "heat: no trainer after %d s; running without a surrogate\n", wait_trainer);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (s = 0; s <= steps; ++s) {
    if (s % every == 0) {
      int64_t shape[2] = {rows, n};
      snprintf(key, sizeof key, "heat/%d/%d", s, rank);
      CHECK(cairn_put_tensor(c, key, u + n, CAIRN_DTYPE_F32, 2, shape));
      MPI_Gather(u + n, rows * n, MPI_FLOAT, full, rows * n, MPI_FLOAT, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        int found = 0;
        /* The error of the prediction made one publication ago. */
        if (have_prediction) {
          double num = 0, den = 0;
          for (i = 0; i < n * n; ++i) {
            num += (pred[i] - full[i]) * (double)(pred[i] - full[i]);
            den += (double)full[i] * full[i];
          }
          printf("step %d: surrogate v%d predicted this field with relative error %.4f\n", s, prediction_version,
                 sqrt(num / (den > 0 ? den : 1)));
          fflush(stdout);
        }
        have_prediction = 0;
        /* The newest surrogate, if the trainer has committed one. */
        CHECK(cairn_poll_tensor(c, "surrogate/latest", 0, &found));
        if (found) {
          int64_t version = 0;
          cairn_model_reader *r = NULL;
          char id[64];
          CHECK(cairn_unpack_tensor(c, "surrogate/latest", &version, sizeof version));
          snprintf(id, sizeof id, "surrogate-v%lld", (long long)version);
          if (cairn_model_open(c, id, &r) == CAIRN_OK) {
            const char *name;
            cairn_dtype dt;
            int ndim;
            int64_t shp[CAIRN_MAX_DIMS];
            size_t nb, k_idx, count = 0;
            float bias = 0;
            int k = 0;
            CHECK(cairn_model_tensor_count(r, &count));
            for (k_idx = 0; k_idx < count; ++k_idx) {
              CHECK(cairn_model_tensor_info(r, k_idx, &name, &dt, &ndim, shp, &nb));
              if (!strcmp(name, "conv.weight") && ndim == 4) {
                k = (int)shp[3];
                w = realloc(w, nb);
                CHECK(cairn_model_read_tensor(r, name, w, nb, CAIRN_MEM_HOST));
              } else if (!strcmp(name, "conv.bias")) {
                CHECK(cairn_model_read_tensor(r, name, &bias, sizeof bias, CAIRN_MEM_HOST));
              }
            }
            cairn_model_close(r);
            if (k > 0) {
              conv(full, next_pred, n, w, k, bias);
              memcpy(pred, next_pred, (size_t)n * (size_t)n * sizeof(float));
              have_prediction = 1;
              prediction_version = (int)version;
              if (version != last_version) ++versions_used;
              last_version = (int)version;
            }
          }
        }
        if (pace > 0) sleep_ms(pace);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    /* Halo exchange, then one explicit step (fixed zero boundary). */
    {
      int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
      MPI_Sendrecv(u + n, n, MPI_FLOAT, up, 0, u + (rows + 1) * n, n, MPI_FLOAT, down, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      MPI_Sendrecv(u + rows * n, n, MPI_FLOAT, down, 1, u, n, MPI_FLOAT, up, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (i = 1; i <= rows; ++i)
        for (j = 0; j < n; ++j) {
          float l = j > 0 ? u[i * n + j - 1] : 0, r = j < n - 1 ? u[i * n + j + 1] : 0;
          v[i * n + j] = u[i * n + j] + 0.2f * (u[(i - 1) * n + j] + u[(i + 1) * n + j] + l + r - 4 * u[i * n + j]);
        }
      for (j = 0; j < n; ++j) v[j] = v[(rows + 1) * n + j] = 0;
      { float *t = u; u = v; v = t; }
    }
  }
  if (rank == 0) {
    int64_t one = 1;
    CHECK(cairn_put_tensor(c, "heat/done", &one, CAIRN_DTYPE_I64, 0, NULL));
    printf("simulation done: %d steps on %d ranks, %d surrogate versions used (last v%d)\n", steps, size,
           versions_used, last_version);
  }
  free(u);
  free(v);
  free(full);
  free(pred);
  free(next_pred);
  free(w);
  cairn_disconnect(c);
  MPI_Finalize();
  return 0;
}
