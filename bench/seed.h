/* seed.h: writing a whole run straight into an entropyd database through
 * the store API (daemon/store.h), for the benchmarks that need long runs
 * (bench_history_seed, bench_dashboard_seed): the same rows, blocks,
 * rollups and latest values the daemon writes, much faster than streaming
 * them over the socket. A generator fills each step's message; seed_run
 * stores them, 1000 steps a transaction. Header-only (static): each seeder
 * is one program. Not a test of the store: it only fills it. */
#ifndef SEED_H
#define SEED_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store.h"

static inline double seed_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Appends metric name (rows x cols values, left for the caller to write
 * at the returned offset into m->values) to m. */
static inline uint32_t seed_add_metric(struct proto_msg *m, const char *name, int kind, uint32_t rows, uint32_t cols) {
    struct proto_metric *pm = &m->metrics[m->nmetrics++];
    snprintf(pm->name, sizeof pm->name, "%s", name);
    pm->kind = kind;
    pm->rows = rows;
    pm->cols = cols;
    pm->offset = m->nvalues;
    m->nvalues += rows * cols;
    return pm->offset;
}

/* Fills m (seed_add_metric for each metric, then its values) with step s
 * of a run of `steps` steps. */
typedef void (*seed_step_fn)(void *ctx, struct proto_msg *m, long s, long steps);

struct seed_spec {
    const char *run, *meta;
    long layers, heads, steps;
    uint32_t max_metrics, max_values; /* per step, what the generator may add at most */
    double t0, dt;                    /* the time of step 0 and between steps */
    int end_status;                   /* enum proto_status the run ends with */
};

/* Stores the run of spec, each step from fn. Returns 0, the run's id and
 * the number of values stored, or -1 with the reason on stderr (prefixed
 * by who). */
static inline int seed_run(struct store *st, const struct seed_spec *spec, seed_step_fn fn, void *ctx, const char *who,
                           int64_t *run_id, int64_t *values) {
    struct proto_msg m;
    struct store_run_info ri;
    char conflict[80];
    int rc = -1;
    memset(&m, 0, sizeof m);
    m.type = PROTO_STEP;
    m.has_seq = 1;
    m.has_time = 1;
    m.metrics = calloc(spec->max_metrics, sizeof *m.metrics);
    m.values = calloc(spec->max_values, sizeof *m.values);
    if (!m.metrics || !m.values) {
        fprintf(stderr, "%s: out of memory\n", who);
        goto out;
    }
    if (store_begin(st) || store_run_open(st, spec->run, spec->layers, spec->heads, 256, spec->meta, seed_now(), &ri) ||
        store_commit(st))
        goto dberr;
    int64_t seq = ri.last_seq;
    *values = 0;
    for (long s = 0; s < spec->steps; s++) {
        if (s % 1000 == 0 && store_begin(st)) goto dberr;
        m.nmetrics = 0;
        m.nvalues = 0;
        m.step = s;
        m.time = spec->t0 + s * spec->dt;
        fn(ctx, &m, s, spec->steps);
        *values += m.nvalues;
        m.seq = ++seq;
        if (store_step(st, ri.id, seq, &m, m.time, conflict, sizeof conflict) < 0) goto dberr;
        if ((s % 1000 == 999 || s == spec->steps - 1) && store_commit(st)) goto dberr;
    }
    if (store_begin(st) || store_run_status(st, ri.id, spec->end_status, ++seq, seed_now()) || store_commit(st) ||
        store_checkpoint(st, 1, 1000, NULL) < 0)
        goto dberr;
    *run_id = ri.id;
    rc = 0;
    goto out;
dberr:
    fprintf(stderr, "%s: %s\n", who, store_errmsg(st));
    if (store_in_transaction(st)) store_rollback(st);
out:
    free(m.metrics);
    free(m.values);
    return rc;
}

#endif
