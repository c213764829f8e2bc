/* dist.c - see dist.h.  One file, two builds: with -DDIST_MPI (compiled by
 * mpicc into build/sigmatrain-mpi) the collectives run on MPI; without it a
 * process is a job of size 1 and the collectives return at once.  The
 * #ifdefs live here so that main.c has none. */
#include "dist.h"
#include "now.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef DIST_MPI
#include <mpi.h>
#endif

struct dist {
    int rank, size;
    size_t bucket; /* floats per bucket, 0 = one call */
    double comm_seconds;
    long comm_calls;
    /* dist_rank_stats output (rank 0) */
    int nstats;
    char **names;
    float *values;
    float *gathered; /* (size, 3) */
#ifdef DIST_MPI
    int mpi_inited;
    MPI_Request *reqs;
    size_t nreqs;
    uint64_t *hashes; /* (size) */
    /* failure watcher: see dist_on_failure */
    pthread_t watcher;
    int watcher_started;
    pthread_mutex_t mu;
    int busy;     /* the training thread is inside an MPI call */
    int stopping; /* a stop signal arrived (its number) */
    int taken;    /* the watcher is ending the run */
    void (*on_failure)(void *);
    void *failure_ctx;
    /* test-only fault injection, SIGMATRAIN_DIST_FAULT=RANK:CALL:die|skew */
    int split_wait; /* SIGMATRAIN_DIST_SPLIT_WAIT: barrier first, timed apart */
    double wait_seconds;
    int fault_rank;
    long fault_call;
    char fault_kind[8];
#endif
};

#ifdef DIST_MPI
static double mono(void) { return now_mono_ms() / 1e3; }
#endif

uint64_t dist_hash(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

int dist_rank(const dist *d) { return d ? d->rank : 0; }
int dist_size(const dist *d) { return d ? d->size : 1; }
double dist_comm_seconds(const dist *d) { return d ? d->comm_seconds : 0.0; }
long dist_comm_calls(const dist *d) { return d ? d->comm_calls : 0; }

void dist_shard(const dist *d, int B, int *b0, int *nb) {
    int r = dist_rank(d), n = dist_size(d);
    *b0 = (int)((long)B * r / n);
    *nb = (int)((long)B * (r + 1) / n) - *b0;
}

static void free_stats(dist *d) {
    if (d->names)
        for (int i = 0; i < d->nstats; i++) free(d->names[i]);
    free(d->names);
    free(d->values);
    free(d->gathered);
    d->names = NULL;
    d->values = d->gathered = NULL;
}

#ifdef DIST_MPI
/* Names and value slots for 3 x size per-rank scalars (rank 0). */
static int alloc_stats(dist *d, char *err, size_t errlen) {
    int n = 3 * d->size;
    d->names = calloc((size_t)n, sizeof(char *));
    d->values = calloc((size_t)n, sizeof(float));
    d->gathered = calloc((size_t)n, sizeof(float));
    if (!d->names || !d->values || !d->gathered) goto oom;
    d->nstats = n;
    static const char *const what[3] = {"tokens_per_s", "step_ms", "comm_ms"};
    for (int r = 0; r < d->size; r++)
        for (int k = 0; k < 3; k++) {
            char buf[64];
            snprintf(buf, sizeof buf, "rank%d_%s", r, what[k]);
            if (!(d->names[3 * r + k] = strdup(buf))) goto oom;
        }
    return 0;
oom:
    snprintf(err, errlen, "dist: out of memory");
    return -1;
}
#endif

#ifndef DIST_MPI
/* ------------------------------------------------- single-process build */

int dist_compiled_with_mpi(void) { return 0; }

dist *dist_create(int *argc, char ***argv, size_t bucket_floats, char *err, size_t errlen) {
    (void)argc;
    (void)argv;
    dist *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "dist: out of memory");
        return NULL;
    }
    d->size = 1;
    d->bucket = bucket_floats;
    return d;
}

void dist_destroy(dist *d, int failed) {
    (void)failed;
    if (!d) return;
    free_stats(d);
    free(d);
}

void dist_on_failure(dist *d, void (*fn)(void *), void *ctx) {
    (void)d;
    (void)fn;
    (void)ctx;
}

int dist_allreduce_grads(dist *d, float *g, size_t n, float weight, char *err, size_t errlen) {
    (void)d;
    (void)g;
    (void)n;
    (void)weight;
    (void)err;
    (void)errlen;
    return 0; /* weight is 1 with one rank */
}

int dist_sum(dist *d, double *v, int n, double weight, char *err, size_t errlen) {
    (void)d;
    (void)v;
    (void)n;
    (void)weight;
    (void)err;
    (void)errlen;
    return 0;
}

int dist_bcast_longs(dist *d, long *v, int n, char *err, size_t errlen) {
    (void)d;
    (void)v;
    (void)n;
    (void)err;
    (void)errlen;
    return 0;
}

int dist_check_same(dist *d, const void *const *bufs, const size_t *bytes, int nbuf, char *err, size_t errlen) {
    (void)d;
    (void)bufs;
    (void)bytes;
    (void)nbuf;
    (void)err;
    (void)errlen;
    return 0;
}

int dist_rank_stats(dist *d, double tokens, double step_s, double comm_s, int *n, const char *const **names,
                    const float **values, char *err, size_t errlen) {
    (void)d;
    (void)tokens;
    (void)step_s;
    (void)comm_s;
    (void)err;
    (void)errlen;
    *n = 0;
    *names = NULL;
    *values = NULL;
    return 0;
}

#else
/* ---------------------------------------------------------- MPI build */

int dist_compiled_with_mpi(void) { return 1; }

static void mpi_message(int rc, const char *what, char *err, size_t errlen) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    snprintf(err, errlen, "MPI: %s: %s", what, s);
}

/* Bracket every MPI call of the training thread: refuse to start one when a
 * stop signal came, and never come back from one during which the watcher
 * took over (it is ending the run and will exit the process). */
static int enter(dist *d, char *err, size_t errlen) {
    pthread_mutex_lock(&d->mu);
    int sig = d->stopping;
    if (!sig) d->busy = 1;
    pthread_mutex_unlock(&d->mu);
    if (sig) snprintf(err, errlen, "terminated by signal %d (a rank died or the job was stopped)", sig);
    return sig ? -1 : 0;
}

static void leave(dist *d) {
    pthread_mutex_lock(&d->mu);
    d->busy = 0;
    int taken = d->taken;
    pthread_mutex_unlock(&d->mu);
    while (taken) pause(); /* the watcher exits the process */
}

/* Stop signals go through a pipe to the watcher thread: a handler (not
 * sigwait with the signals blocked) because threads that exist before main
 * (OpenBLAS starts its pool in a constructor) have them unblocked, and the
 * kernel may deliver the signal to any of them. */
static int stop_pipe[2] = {-1, -1};
/* The job the watcher serves; NULL once dist_destroy began (a signal that
 * arrives during the exit must not reach a freed struct).  Held by the
 * watcher while it ends the run, so dist_destroy waits for it (it exits). */
static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static dist *watch_d;

static void on_stop_signal(int sig) {
    int e = errno;
    unsigned char b = (unsigned char)sig;
    if (write(stop_pipe[1], &b, 1) < 0) {} /* full pipe: one is enough */
    errno = e;
}

static void *watcher_main(void *arg) {
    (void)arg;
    unsigned char b = 0;
    ssize_t r;
    while ((r = read(stop_pipe[0], &b, 1)) < 0 && errno == EINTR) {}
    if (r != 1) return NULL;
    int sig = b;
    pthread_mutex_lock(&watch_mu);
    dist *d = watch_d;
    if (!d) {
        pthread_mutex_unlock(&watch_mu);
        return NULL;
    }
    pthread_mutex_lock(&d->mu);
    d->stopping = sig;
    int take = d->busy;
    if (take) d->taken = 1;
    void (*fn)(void *) = d->on_failure;
    void *ctx = d->failure_ctx;
    pthread_mutex_unlock(&d->mu);
    if (!take) { /* the training thread sees it at its next call */
        pthread_mutex_unlock(&watch_mu);
        return NULL;
    }
    fprintf(stderr,
            "sigmatrain: rank %d: signal %d while waiting for the other ranks: "
            "a rank died or the job is being stopped; ending the run as failed\n",
            d->rank, sig);
    if (fn) fn(ctx);
    _exit(128 + sig);
}

dist *dist_create(int *argc, char ***argv, size_t bucket_floats, char *err, size_t errlen) {
    dist *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "dist: out of memory");
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    d->bucket = bucket_floats;
    /* When mpirun tears a job down it closes the pipes that carry the ranks'
     * stdout: a progress line written then must fail with EPIPE, not kill
     * rank 0 before it has ended the run as failed. */
    signal(SIGPIPE, SIG_IGN);
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Init_thread failed (%d)", rc);
        goto err;
    }
    d->mpi_inited = 1;
    /* errors come back as return codes (then the job is aborted by us) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    d->hashes = calloc((size_t)d->size, sizeof(uint64_t));
    if (!d->hashes) {
        snprintf(err, errlen, "dist: out of memory");
        goto err;
    }
    if (d->size == 1) return d; /* a singleton keeps the default signal handling */
    if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "dist: pipe: %s", strerror(errno));
        goto err;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    watch_d = d;
    if (pthread_create(&d->watcher, NULL, watcher_main, d) != 0) {
        snprintf(err, errlen, "dist: watcher thread: %s", strerror(errno));
        goto err;
    }
    d->watcher_started = 1;
    pthread_detach(d->watcher);
    /* Test-only fault injection (tests/e2e_mpi.py): on rank RANK, at the
     * CALL-th gradient all-reduce (1-based), "die" exits at once without a
     * word to MPI (a crashed rank) and "skew" perturbs one reduced gradient
     * value afterwards (a rank that diverges silently). */
    d->split_wait = getenv("SIGMATRAIN_DIST_SPLIT_WAIT") != NULL;
    d->fault_rank = -1;
    const char *f = getenv("SIGMATRAIN_DIST_FAULT");
    if (f && sscanf(f, "%d:%ld:%7s", &d->fault_rank, &d->fault_call, d->fault_kind) != 3) d->fault_rank = -1;
    return d;
err:
    dist_destroy(d, 1);
    return NULL;
}

void dist_destroy(dist *d, int failed) {
    if (!d) return;
    if (d->watcher_started) {
        pthread_mutex_lock(&watch_mu);
        watch_d = NULL;
        pthread_mutex_unlock(&watch_mu);
    }
    if (d->mpi_inited) {
        if (d->split_wait && d->rank == 0 && d->comm_calls)
            fprintf(stderr,
                    "dist: split timing: waiting for the other ranks %.3f ms/step, all-reduce itself "
                    "%.3f ms/step (%ld calls)\n",
                    1e3 * d->wait_seconds / d->comm_calls, 1e3 * (d->comm_seconds - d->wait_seconds) / d->comm_calls,
                    d->comm_calls);
        if (failed && d->size > 1) {
            fflush(stdout);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 1); /* does not return */
        }
        /* a watcher waiting in sigwait is harmless at exit; MPI_Finalize
         * waits for the other ranks */
        MPI_Finalize();
    }
    free_stats(d);
    free(d->reqs);
    free(d->hashes);
    free(d);
}

void dist_on_failure(dist *d, void (*fn)(void *), void *ctx) {
    pthread_mutex_lock(&d->mu);
    d->on_failure = fn;
    d->failure_ctx = ctx;
    pthread_mutex_unlock(&d->mu);
}

int dist_allreduce_grads(dist *d, float *g, size_t n, float weight, char *err, size_t errlen) {
    if (d->size == 1) return 0;
    double t0 = mono();
    if (weight != 1.0f)
        for (size_t i = 0; i < n; i++) g[i] *= weight;
    int fault = d->rank == d->fault_rank && d->comm_calls + 1 == d->fault_call;
    if (fault && !strcmp(d->fault_kind, "die")) {
        fprintf(stderr, "sigmatrain: rank %d: SIGMATRAIN_DIST_FAULT: dying at all-reduce %ld\n", d->rank,
                d->fault_call);
        _exit(7);
    }
    if (enter(d, err, errlen) != 0) return -1;
    int rc = MPI_SUCCESS;
    if (d->split_wait) { /* benchmark: waiting for the slower rank, apart from the transfer */
        double tw = mono();
        rc = MPI_Barrier(MPI_COMM_WORLD);
        d->wait_seconds += mono() - tw;
    }
    if (rc != MPI_SUCCESS) {
    } else if (d->bucket == 0 || d->bucket >= n) {
        rc = MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
        /* every bucket in flight at once: the library pipelines them */
        size_t nb = (n + d->bucket - 1) / d->bucket;
        if (nb > d->nreqs) {
            MPI_Request *r = realloc(d->reqs, nb * sizeof *r);
            if (!r) {
                leave(d);
                snprintf(err, errlen, "dist: out of memory");
                return -1;
            }
            d->reqs = r;
            d->nreqs = nb;
        }
        for (size_t b = 0; b < nb && rc == MPI_SUCCESS; b++) {
            size_t lo = b * d->bucket, len = n - lo < d->bucket ? n - lo : d->bucket;
            rc = MPI_Iallreduce(MPI_IN_PLACE, g + lo, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &d->reqs[b]);
            if (rc != MPI_SUCCESS) nb = b;
        }
        int rc2 = MPI_Waitall((int)nb, d->reqs, MPI_STATUSES_IGNORE);
        if (rc == MPI_SUCCESS) rc = rc2;
    }
    leave(d);
    if (fault && !strcmp(d->fault_kind, "skew") && n > 0) g[0] += 1e-3f;
    d->comm_seconds += mono() - t0;
    d->comm_calls++;
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, "gradient all-reduce", err, errlen);
        return -1;
    }
    return 0;
}

int dist_sum(dist *d, double *v, int n, double weight, char *err, size_t errlen) {
    if (d->size == 1) return 0;
    for (int i = 0; i < n; i++) v[i] *= weight;
    if (enter(d, err, errlen) != 0) return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    leave(d);
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, "all-reduce", err, errlen);
        return -1;
    }
    return 0;
}

int dist_bcast_longs(dist *d, long *v, int n, char *err, size_t errlen) {
    if (d->size == 1) return 0;
    if (enter(d, err, errlen) != 0) return -1;
    int rc = MPI_Bcast(v, n, MPI_LONG, 0, MPI_COMM_WORLD);
    leave(d);
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, "broadcast", err, errlen);
        return -1;
    }
    return 0;
}

int dist_check_same(dist *d, const void *const *bufs, const size_t *bytes, int nbuf, char *err, size_t errlen) {
    if (d->size == 1) return 0;
    uint64_t h = 0xCBF29CE484222325ull;
    for (int i = 0; i < nbuf; i++) h = dist_hash(bufs[i], bytes[i], h);
    if (enter(d, err, errlen) != 0) return -1;
    int rc = MPI_Allgather(&h, 1, MPI_UINT64_T, d->hashes, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    leave(d);
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, "checksum all-gather", err, errlen);
        return -1;
    }
    size_t off = 0;
    int bad = 0;
    for (int r = 1; r < d->size; r++) {
        if (d->hashes[r] == d->hashes[0]) continue;
        if (!bad)
            off += (size_t)snprintf(err + off, off < errlen ? errlen - off : 0,
                                    "parameters or power-iteration vectors differ across ranks: rank 0 %016llx,",
                                    (unsigned long long)d->hashes[0]);
        bad = 1;
        if (off < errlen)
            off += (size_t)snprintf(err + off, errlen - off, " rank %d %016llx", r, (unsigned long long)d->hashes[r]);
    }
    return bad;
}

int dist_rank_stats(dist *d, double tokens, double step_s, double comm_s, int *n, const char *const **names,
                    const float **values, char *err, size_t errlen) {
    *n = 0;
    *names = NULL;
    *values = NULL;
    if (d->size == 1) return 0;
    if (d->rank == 0 && !d->names && alloc_stats(d, err, errlen) != 0) return -1;
    float mine[3] = {step_s > 0 ? (float)(tokens / step_s) : 0.0f, (float)(step_s * 1e3), (float)(comm_s * 1e3)};
    if (enter(d, err, errlen) != 0) return -1;
    int rc = MPI_Gather(mine, 3, MPI_FLOAT, d->gathered, 3, MPI_FLOAT, 0, MPI_COMM_WORLD);
    leave(d);
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, "rank stats gather", err, errlen);
        return -1;
    }
    if (d->rank != 0) return 0;
    memcpy(d->values, d->gathered, sizeof(float) * (size_t)d->nstats);
    *n = d->nstats;
    *names = (const char *const *)d->names;
    *values = d->values;
    return 0;
}

#endif
