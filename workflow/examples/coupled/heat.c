/* A simulation coupled to online training through cairn (docs/coupled.md): an MPI 2-D heat
 * diffusion (rows split over the ranks) publishes its field every `every` steps as named tensors
 * heat/<step>/<rank>; a PyTorch trainer (trainer.py) learns a surrogate that predicts the field
 * `every` steps ahead and commits it as a model (surrogate-v<n>, parent surrogate-v<n-1>) with the
 * named tensor surrogate/latest = n. Rank 0 loads the newest surrogate through the C API at each
 * publication, predicts the next published field and, one publication later, reports the error of
 * that prediction.
 *
 * With --backend redis the same runs over redis-server, as SmartRedis users do today: the fields
 * and surrogate/latest are tensors of redis_tensors.h, and the surrogate is the tensors
 * surrogate-v<n>/conv.weight and surrogate-v<n>/conv.bias (Redis has no models or lineage).
 *
 *   mpirun -np 2 coupled_heat [--backend cairn|redis] [--redis SOCKET] [--poll-ms 1]
 *       [--n 64 | --nx 64 --ny 64] [--steps 400] [--every 5] [--pace-ms 50] [--wait-trainer-s 60]
 *       [--lockstep 0|1] [--stats FILE]
 *
 * --lockstep 1: rank 0 waits at each publication (up to --wait-trainer-s) until the trainer has taken
 * that field and committed any surrogate it completes, then loads the newest surrogate: the run uses
 * every version the trainer makes, however slowly the trainer runs beside it. 0 (the default): the
 * simulation never waits for the trainer and uses whatever version is newest when it looks.
 *
 * --stats FILE: rank 0 writes a JSON object with every rank's time in each publication's put, each
 * surrogate load's time (poll of surrogate/latest through the last weight read) and the loop's
 * wall time, in seconds (bench/workloads/coupled_bench.py reads it).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cairn/cairn.h"
#ifdef CAIRN_COUPLED_WITH_REDIS
#include "redis_tensors.h"
#endif

static int rank = 0;

#define CHECK(call)                                                               \
  do {                                                                            \
    if ((call) != CAIRN_OK) {                                                     \
      fprintf(stderr, "heat rank %d: %s: %s\n", rank, #call, cairn_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                               \
    }                                                                             \
  } while (0)

#ifdef CAIRN_COUPLED_WITH_REDIS
#define RCHECK(rc, call)                                                   \
  do {                                                                     \
    if ((call) != 0) {                                                     \
      fprintf(stderr, "heat rank %d: %s\n", rank, redis_client_error(rc)); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                        \
    }                                                                      \
  } while (0)
#endif

/* Where the fields go and the surrogate comes from: the node's cairnd, or redis-server. */
typedef struct {
  cairn_client* cairn; /* NULL with --backend redis */
#ifdef CAIRN_COUPLED_WITH_REDIS
  redis_client* redis;
#endif
  int poll_ms; /* Redis: sleep between EXISTS checks while polling */
} store;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void store_open(store* st, const char* backend, const char* redis_socket) {
  memset(st, 0, sizeof *st);
  if (!strcmp(backend, "cairn")) {
    CHECK(cairn_connect(NULL, &st->cairn));
    return;
  }
  if (strcmp(backend, "redis") != 0) {
    fprintf(stderr, "heat: --backend %s: expected cairn or redis\n", backend);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#ifdef CAIRN_COUPLED_WITH_REDIS
  if (!redis_socket) {
    fprintf(stderr, "heat: --backend redis needs --redis SOCKET (redis-server's Unix socket)\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  st->redis = redis_client_connect(redis_socket);
  if (!st->redis || redis_client_error(st->redis)[0]) {
    fprintf(stderr, "heat rank %d: %s\n", rank, redis_client_error(st->redis));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#else
  (void)redis_socket;
  fprintf(stderr, "heat: built without hiredis (Debian: libhiredis-dev), so --backend redis is not available\n");
  MPI_Abort(MPI_COMM_WORLD, 1);
#endif
}

static void store_close(store* st) {
  if (st->cairn) cairn_disconnect(st->cairn);
#ifdef CAIRN_COUPLED_WITH_REDIS
  redis_client_close(st->redis);
#endif
}

static void put_field(store* st, const char* key, const float* f, int rows, int nx) {
  int64_t shape[2] = {rows, nx};
#ifdef CAIRN_COUPLED_WITH_REDIS
  if (st->redis) {
    RCHECK(st->redis, redis_put_tensor(st->redis, key, f, (size_t)rows * (size_t)nx * sizeof(float), "f32", 2, shape));
    return;
  }
#endif
  CHECK(cairn_tensor_put(st->cairn, key, f, CAIRN_DTYPE_F32, 2, shape));
}

static void put_flag(store* st, const char* key) {
  int64_t one = 1;
#ifdef CAIRN_COUPLED_WITH_REDIS
  if (st->redis) {
    RCHECK(st->redis, redis_put_tensor(st->redis, key, &one, sizeof one, "i64", 0, NULL));
    return;
  }
#endif
  CHECK(cairn_tensor_put(st->cairn, key, &one, CAIRN_DTYPE_I64, 0, NULL));
}

static int poll_key(store* st, const char* key, int timeout_ms) {
  int found = 0;
#ifdef CAIRN_COUPLED_WITH_REDIS
  if (st->redis) {
    RCHECK(st->redis, redis_poll_tensor(st->redis, key, timeout_ms, st->poll_ms, &found));
    return found;
  }
#endif
  CHECK(cairn_tensor_poll(st->cairn, key, timeout_ms, &found));
  return found;
}

/* The int64 in named tensor `key`, or -1 when there is none yet. */
static int64_t read_counter(store* st, const char* key) {
  int64_t value = -1;
  if (!poll_key(st, key, 0)) return -1;
#ifdef CAIRN_COUPLED_WITH_REDIS
  if (st->redis) {
    RCHECK(st->redis, redis_unpack_tensor(st->redis, key, &value, sizeof value));
    return value;
  }
#endif
  CHECK(cairn_tensor_unpack(st->cairn, key, &value, sizeof value));
  return value;
}

/* --lockstep: waits up to timeout_s until the trainer has taken the field of step `step` (trainer/seen
 * >= step; it commits any surrogate that field completes before it says so). Returns whether it did. */
static int await_trainer(store* st, int step, int timeout_s) {
  double deadline = MPI_Wtime() + timeout_s;
  while (read_counter(st, "trainer/seen") < step) {
    if (MPI_Wtime() >= deadline) return 0;
    sleep_ms(1);
  }
  return 1;
}

/* Loads the newest surrogate, if the trainer has committed one: its version, its k x k weights
 * (*w, reallocated) and bias. Returns k, or 0 when there is none (yet). */
static int load_surrogate(store* st, int64_t* version, float** w, float* bias) {
  char id[64];
  int k = 0;
  if (!poll_key(st, "surrogate/latest", 0)) return 0;
#ifdef CAIRN_COUPLED_WITH_REDIS
  if (st->redis) {
    char key[96];
    void* data = NULL;
    size_t nb = 0;
    int ndim = 0;
    int64_t shp[REDIS_TENSOR_MAX_DIMS];
    RCHECK(st->redis, redis_unpack_tensor(st->redis, "surrogate/latest", version, sizeof *version));
    snprintf(key, sizeof key, "surrogate-v%lld/conv.weight", (long long)*version);
    if (redis_get_tensor(st->redis, key, &data, &nb, &ndim, shp) != 0) return 0;
    if (ndim == 4 && nb == (size_t)(shp[2] * shp[3]) * sizeof(float)) {
      k = (int)shp[3];
      free(*w);
      *w = (float*)data;
      snprintf(key, sizeof key, "surrogate-v%lld/conv.bias", (long long)*version);
      RCHECK(st->redis, redis_unpack_tensor(st->redis, key, bias, sizeof *bias));
    } else {
      free(data);
    }
    return k;
  }
#endif
  CHECK(cairn_tensor_unpack(st->cairn, "surrogate/latest", version, sizeof *version));
  snprintf(id, sizeof id, "surrogate-v%lld", (long long)*version);
  {
    cairn_model_reader* r = NULL;
    const char* name;
    cairn_dtype dt;
    int ndim;
    int64_t shp[CAIRN_MAX_DIMS];
    size_t nb, k_idx, count = 0, w_bytes = 0;
    if (cairn_model_open(st->cairn, id, &r) != CAIRN_OK) return 0;
    CHECK(cairn_model_tensor_count(r, &count));
    for (k_idx = 0; k_idx < count; ++k_idx) {
      CHECK(cairn_model_tensor_info(r, k_idx, &name, &dt, &ndim, shp, &nb));
      if (!strcmp(name, "conv.weight") && ndim == 4) {
        k = (int)shp[3];
        w_bytes = nb;
        *w = realloc(*w, nb);
      }
    }
    if (k) {
      /* Both tensors in one request. */
      const char* names[2] = {"conv.weight", "conv.bias"};
      void* dsts[2] = {*w, bias};
      size_t sizes[2] = {w_bytes, sizeof *bias};
      CHECK(cairn_model_read(r, 2, names, dsts, sizes, NULL));
    }
    cairn_model_close(r);
  }
  return k;
}

/* Applies a k x k convolution (zero padding, as torch's Conv2d(1, 1, k, padding=k/2)) to the
 * ny x nx field f. */
static void conv(const float* f, float* out, int ny, int nx, const float* w, int k, float bias) {
  int i, j, a, b, h = k / 2;
  for (i = 0; i < ny; ++i)
    for (j = 0; j < nx; ++j) {
      float s = bias;
      for (a = 0; a < k; ++a)
        for (b = 0; b < k; ++b) {
          int y = i + a - h, x = j + b - h;
          if (y >= 0 && y < ny && x >= 0 && x < nx) s += w[a * k + b] * f[(size_t)y * nx + x];
        }
      out[(size_t)i * nx + j] = s;
    }
}

/* Writes v[0..n) as a JSON array. */
static void write_seconds(FILE* f, const double* v, int n) {
  int i;
  fprintf(f, "[");
  for (i = 0; i < n; ++i) fprintf(f, "%s%.9f", i ? ", " : "", v[i]);
  fprintf(f, "]");
}

int main(int argc, char** argv) {
  int size = 1, nx = 64, ny = 64, steps = 400, every = 5, pace = 50, wait_trainer = 60, i, j, s;
  int rows, versions_used = 0, last_version = -1, have_prediction = 0, prediction_version = -1;
  int npub, pub = 0, nload = 0, poll_ms = 1, lockstep = 0;
  const char *backend = "cairn", *redis_socket = NULL, *stats = NULL;
  float *u, *v, *full = NULL, *pred = NULL, *next_pred = NULL, *w = NULL;
  double *pub_s, *load_s = NULL, t_loop;
  size_t cells;
  store st;
  char key[128];

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--n"))
      nx = ny = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--nx"))
      nx = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--ny"))
      ny = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps"))
      steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--every"))
      every = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--pace-ms"))
      pace = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--wait-trainer-s"))
      wait_trainer = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--backend"))
      backend = argv[i + 1];
    else if (!strcmp(argv[i], "--redis"))
      redis_socket = argv[i + 1];
    else if (!strcmp(argv[i], "--poll-ms"))
      poll_ms = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--lockstep"))
      lockstep = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--stats"))
      stats = argv[i + 1];
  }
  if (nx <= 0 || ny <= 0 || ny % size != 0 || every <= 0 || steps < 0) {
    if (rank == 0)
      fprintf(stderr, "heat: --ny %d must be a positive multiple of %d ranks, --nx %d and --every %d positive\n", ny,
              size, nx, every);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rows = ny / size;
  cells = (size_t)nx * (size_t)ny;
  store_open(&st, backend, redis_socket);
  st.poll_ms = poll_ms;
  npub = steps / every + 1;
  pub_s = calloc((size_t)npub, sizeof(double));
  /* This rank's rows plus a halo row above and below. */
  u = calloc((size_t)(rows + 2) * (size_t)nx, sizeof(float));
  v = calloc((size_t)(rows + 2) * (size_t)nx, sizeof(float));
  for (i = 1; i <= rows; ++i)
    for (j = 0; j < nx; ++j) {
      int gi = rank * rows + i - 1;
      float dy = (float)(gi - ny / 3), dx = (float)(j - nx / 2);
      u[(size_t)i * nx + j] = expf(-(dx * dx + dy * dy) / (float)(nx * (double)ny / 32));
    }
  if (rank == 0) {
    full = calloc(cells, sizeof(float));
    pred = calloc(cells, sizeof(float));
    next_pred = calloc(cells, sizeof(float));
    load_s = calloc((size_t)npub, sizeof(double));
    /* The trainer announces itself; the simulation starts once it listens (or after the wait). */
    if (!poll_key(&st, "trainer/ready", wait_trainer * 1000))
      fprintf(stderr, "heat: no trainer after %d s; running without a surrogate\n", wait_trainer);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  t_loop = MPI_Wtime();
  for (s = 0; s <= steps; ++s) {
    if (s % every == 0) {
      double t0 = MPI_Wtime();
      snprintf(key, sizeof key, "heat/%d/%d", s, rank);
      put_field(&st, key, u + nx, rows, nx);
      pub_s[pub++] = MPI_Wtime() - t0;
      MPI_Gather(u + nx, rows * nx, MPI_FLOAT, full, rows * nx, MPI_FLOAT, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        int64_t version = 0;
        float bias = 0;
        int k;
        /* The error of the prediction made one publication ago. */
        if (have_prediction) {
          double num = 0, den = 0;
          size_t c;
          for (c = 0; c < cells; ++c) {
            num += (pred[c] - full[c]) * (double)(pred[c] - full[c]);
            den += (double)full[c] * full[c];
          }
          printf("step %d: surrogate v%d predicted this field with relative error %.4f\n", s, prediction_version,
                 sqrt(num / (den > 0 ? den : 1)));
          fflush(stdout);
        }
        have_prediction = 0;
        /* With --lockstep, the surrogate the trainer makes from this field, if it makes one. */
        if (lockstep && !await_trainer(&st, s, wait_trainer))
          fprintf(stderr, "heat: the trainer did not take step %d's field in %d s; going on\n", s, wait_trainer);
        /* The newest surrogate, if the trainer has committed one. */
        t0 = MPI_Wtime();
        k = load_surrogate(&st, &version, &w, &bias);
        if (k > 0) {
          load_s[nload++] = MPI_Wtime() - t0;
          conv(full, next_pred, ny, nx, w, k, bias);
          memcpy(pred, next_pred, cells * sizeof(float));
          have_prediction = 1;
          prediction_version = (int)version;
          if (version != last_version) ++versions_used;
          last_version = (int)version;
        }
        if (pace > 0) sleep_ms(pace);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    /* Halo exchange, then one explicit step (fixed zero boundary). */
    {
      int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
      MPI_Sendrecv(u + nx, nx, MPI_FLOAT, up, 0, u + (size_t)(rows + 1) * nx, nx, MPI_FLOAT, down, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      MPI_Sendrecv(u + (size_t)rows * nx, nx, MPI_FLOAT, down, 1, u, nx, MPI_FLOAT, up, 1, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      for (i = 1; i <= rows; ++i)
        for (j = 0; j < nx; ++j) {
          size_t c = (size_t)i * nx + j;
          float l = j > 0 ? u[c - 1] : 0, r = j < nx - 1 ? u[c + 1] : 0;
          v[c] = u[c] + 0.2f * (u[c - nx] + u[c + nx] + l + r - 4 * u[c]);
        }
      for (j = 0; j < nx; ++j) v[j] = v[(size_t)(rows + 1) * nx + j] = 0;
      {
        float* t = u;
        u = v;
        v = t;
      }
    }
  }
  t_loop = MPI_Wtime() - t_loop;
  if (rank == 0) {
    put_flag(&st, "heat/done");
    printf("simulation done: %d steps on %d ranks, %d surrogate versions used (last v%d)\n", steps, size, versions_used,
           last_version);
  }
  if (stats) {
    double* all = rank == 0 ? calloc((size_t)npub * (size_t)size, sizeof(double)) : NULL;
    MPI_Gather(pub_s, npub, MPI_DOUBLE, all, npub, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      FILE* f = fopen(stats, "w");
      if (!f) {
        fprintf(stderr, "heat: cannot write --stats %s\n", stats);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      fprintf(f,
              "{\"backend\": \"%s\", \"ranks\": %d, \"nx\": %d, \"ny\": %d, \"steps\": %d, \"every\": %d, "
              "\"publications\": %d, \"slab_bytes\": %zu, \"versions_used\": %d, \"loop_s\": %.6f, \"publish_s\": [",
              backend, size, nx, ny, steps, every, npub, (size_t)rows * nx * sizeof(float), versions_used, t_loop);
      for (i = 0; i < size; ++i) {
        fprintf(f, "%s", i ? ", " : "");
        write_seconds(f, all + (size_t)i * npub, npub);
      }
      fprintf(f, "], \"surrogate_load_s\": ");
      write_seconds(f, load_s, nload);
      fprintf(f, "}\n");
      fclose(f);
    }
    free(all);
  }
  free(u);
  free(v);
  free(full);
  free(pred);
  free(next_pred);
  free(w);
  free(pub_s);
  free(load_s);
  store_close(&st);
  MPI_Finalize();
  return 0;
}
