/* pool.h - a fixed set of threads that run one task at a time on all of
 * them: the caller is thread 0, threads 1..n-1 are workers.  Used by the
 * model (shards of a batch, σReparam, gradient reduction), by the optimizer
 * update and by the probe (through model_parallel).
 *
 * What it is not: a work queue.  pool_run() hands the same function to every
 * thread and returns when all of them have finished it; tasks split their
 * work by the thread index they are given.  Workers spin briefly before
 * sleeping, because tasks come in bursts (forward, backward, reduction,
 * update) and a futex wake-up costs more than a short task. */
#ifndef POOL_H
#define POOL_H

#include <stddef.h>

typedef struct pool pool;

/* fn(ctx, thread, nthreads): thread is 0 (the caller) .. nthreads - 1. */
typedef void (*pool_task)(void *ctx, int thread, int nthreads);

/* Starts threads - 1 workers (threads < 1 counts as 1).  Returns NULL on out
 * of memory or if a thread cannot be created (nothing is left running). */
pool *pool_create(int threads);

/* Stops and joins the workers and frees the pool.  Accepts NULL.  Must not
 * be called from inside a task. */
void pool_destroy(pool *p);

/* Runs fn(ctx, t, n) on every thread t of the pool (t = 0 on the caller)
 * and returns when all have returned.  Not reentrant: a task must not call
 * pool_run on the same pool. */
void pool_run(pool *p, pool_task fn, void *ctx);

/* Splits [0, n) evenly: thread t of nthreads gets [*lo, *hi). */
void pool_split(int t, int nthreads, size_t n, size_t *lo, size_t *hi);

#endif
