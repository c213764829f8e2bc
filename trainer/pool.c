/* pool.c - see pool.h. */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    pool *p;
    int id;
    pthread_t thread;
} pool_worker;

struct pool {
    int n;                /* threads, the caller included */
    pool_worker *workers; /* (n) entry 0 unused: the caller */
    int started;          /* workers running: 1..started */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen; /* bumped for each task */
    int pending;  /* workers still running the current task */
    int quit;
    pool_task fn;
    void *ctx;
};

#define SPIN 4000 /* pause instructions, ~0.1-0.5 ms */

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    pool_worker *w = arg;
    pool *p = w->p;
    unsigned seen = 0;
    for (;;) {
        for (int i = 0; i < SPIN && __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) == seen; i++) relax();
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        pool_task fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, w->id, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

pool *pool_create(int threads) {
    pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = threads < 1 ? 1 : threads;
    p->workers = calloc((size_t)p->n, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto err_mu;
    if (pthread_cond_init(&p->go, NULL) != 0) goto err_go;
    if (pthread_cond_init(&p->done, NULL) != 0) goto err_done;
    for (int t = 1; t < p->n; t++) {
        p->workers[t] = (pool_worker){.p = p, .id = t};
        if (pthread_create(&p->workers[t].thread, NULL, worker_main, &p->workers[t]) != 0) {
            pool_destroy(p); /* joins the ones started */
            return NULL;
        }
        p->started = t;
    }
    return p;
err_done:
    pthread_cond_destroy(&p->go);
err_go:
    pthread_mutex_destroy(&p->mu);
err_mu:
    free(p->workers);
    free(p);
    return NULL;
}

void pool_destroy(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t <= p->started; t++) pthread_join(p->workers[t].thread, NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

void pool_run(pool *p, pool_task fn, void *ctx) {
    if (p->n > 1) {
        pthread_mutex_lock(&p->mu);
        p->fn = fn;
        p->ctx = ctx;
        p->pending = p->n - 1;
        __atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    if (p->n > 1) {
        for (int i = 0; i < SPIN && __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0; i++) relax();
        pthread_mutex_lock(&p->mu);
        while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void pool_split(int t, int nthreads, size_t n, size_t *lo, size_t *hi) {
    *lo = n * (size_t)t / (size_t)nthreads;
    *hi = n * (size_t)(t + 1) / (size_t)nthreads;
}
