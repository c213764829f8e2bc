/* dist.h - data parallelism across processes for sigmatrain (MPI).
 *
 * What it is: the few collective operations a data-parallel training loop
 * needs, behind one API that has two builds.  Built with -DDIST_MPI (the
 * Makefile's build/sigmatrain-mpi, compiled by mpicc) it runs on MPI: every
 * rank holds the whole model, trains on its own rows of the global batch,
 * and the gradients are summed with MPI_Allreduce on the flat gradient
 * buffer in buckets.  Built without it (build/sigmatrain) it is one process
 * of size 1 and every call is a no-op, so the training loop has no #ifdef.
 * What it is not: model parallelism, or a fault-tolerant runtime (a lost
 * rank ends the job; see dist_on_failure).
 *
 * Identity across ranks: every rank reads the same global batch and keeps
 * the same data cursor, RNG, parameters, optimizer moments and σReparam
 * power-iteration vectors; only the rows each rank runs forward/backward on
 * differ.  dist_check_same() verifies that with a hash every K steps.
 *
 * Threads: every function is called from the training thread only (except
 * the failure callback, see dist_on_failure).  MPI is initialized with
 * MPI_THREAD_FUNNELED.  Errors: functions return 0, or -1 with a message in
 * the caller's buffer; after -1 the caller should end the run as failed and
 * call dist_destroy(d, 1), which aborts the whole job. */
#ifndef DIST_H
#define DIST_H

#include <stddef.h>
#include <stdint.h>

typedef struct dist dist;

/* 1 when this build runs on MPI, 0 in the single-process build. */
int dist_compiled_with_mpi(void);

/* Initializes MPI (argc/argv as MPI_Init takes them).  On MPI builds it
 * installs handlers for SIGTERM/SIGINT/SIGHUP that wake a watcher thread
 * (dist_on_failure): that is how a job killed by mpirun after a peer died
 * is seen.  SIGPIPE is ignored (mpirun closes the ranks' output pipes when
 * it tears a job down).
 * bucket_floats: gradient floats per allreduce bucket (0: one call for the
 * whole buffer).  Returns NULL with a message in err on failure. */
dist *dist_create(int *argc, char ***argv, size_t bucket_floats, char *err, size_t errlen);

/* Finalizes MPI (failed == 0) or aborts every rank of the job (failed != 0,
 * size > 1).  Accepts NULL. */
void dist_destroy(dist *d, int failed);

int dist_rank(const dist *d);
int dist_size(const dist *d);

/* Rows [*b0, *b0 + *nb) of a global batch of B rows that this rank runs:
 * an even split, the first ranks taking one row fewer when B % size != 0.
 * B must be >= size. */
void dist_shard(const dist *d, int B, int *b0, int *nb);

/* Called once from the watcher thread when this process is told to stop
 * (SIGTERM: mpirun kills the job when any rank dies or aborts; SIGINT,
 * SIGHUP) while the training thread is blocked in a dist call (a collective
 * waiting for a peer that will never come).  fn may end the telemetry run;
 * the process then exits with status 128 + signal.  If the training thread
 * is not inside a dist call, nothing runs then: its next dist call returns
 * -1 ("terminated by signal N"), so the loop ends the run itself.  NULL fn:
 * exit at once.  No-op in the single-process build. */
void dist_on_failure(dist *d, void (*fn)(void *ctx), void *ctx);

/* Gradient all-reduce: g <- sum over ranks of weight_r * g_r, n floats, in
 * buckets (dist_create).  weight is this rank's share of the global batch
 * (nb / B): the model's gradient is a mean over its own tokens, so the
 * weighted sum is the mean over the global batch.  Every rank must call it
 * with the same n.  Time spent is added to dist_comm_seconds.  0 / -1. */
int dist_allreduce_grads(dist *d, float *g, size_t n, float weight, char *err, size_t errlen);

/* Small all-reduce of n doubles: v <- sum over ranks of weight * v (the
 * same weight for all n).  For the loss and the eval loss.  0 / -1. */
int dist_sum(dist *d, double *v, int n, double weight, char *err, size_t errlen);

/* Rank 0's n longs to every rank (v in place): a decision only rank 0 can
 * make (it alone hears the daemon) carried out by all.  0 / -1. */
int dist_bcast_longs(dist *d, long *v, int n, char *err, size_t errlen);

/* Hash of buffers (bytes), compared across ranks.  Returns 0 when every
 * rank has the same hash, 1 on a mismatch (err names the ranks that differ
 * from rank 0 and both hashes), -1 on an MPI error. */
int dist_check_same(dist *d, const void *const *bufs, const size_t *bytes, int nbuf, char *err, size_t errlen);

/* Per-rank step figures, gathered to rank 0: tokens_per_s = tokens /
 * step_s, step_ms, comm_ms (time in the gradient all-reduce during the
 * step, which includes waiting for slower ranks).  On rank 0 *names and
 * *values (owned by d, valid until the next call) receive 3 x size
 * scalars "rank{R}_tokens_per_s", "rank{R}_step_ms", "rank{R}_comm_ms";
 * on other ranks *n is 0.  Size 1: nothing gathered, *n = 0.  0 / -1. */
int dist_rank_stats(dist *d, double tokens, double step_s, double comm_s, int *n, const char *const **names,
                    const float **values, char *err, size_t errlen);

/* Seconds spent inside dist_allreduce_grads since dist_create, and the
 * number of such calls. */
double dist_comm_seconds(const dist *d);
long dist_comm_calls(const dist *d);

/* 64-bit hash of n bytes (word-wise multiply-xor; not FNV: it must be fast
 * on megabytes of parameters).  The same on every rank for the same bytes. */
uint64_t dist_hash(const void *p, size_t n, uint64_t h);

#endif
