/* bench_history_seed.c: writes one synthetic run of a given length straight
 * into an entropyd database through the store API (daemon/store.h), for the
 * history-scaling benchmark (bench/history.sh) and the long-run tests
 * (tests/e2e_long.py): the same rows, rollups and latest values the daemon
 * writes, much faster than streaming them over the socket. Not a test of
 * the store: it only fills it.
 *
 * The run has head metrics (up to 9, sigmatrain's names), 3 layer metrics
 * and 2 scalars every step; values drift slowly with a little noise, like a
 * real probe stream.
 *
 * usage: bench_history_seed --db PATH [--run NAME] [--steps N] [--layers 12]
 *        [--heads 12] [--head-metrics 9] [--end finished|live] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *const HEAD_NAMES[] = {"entropy_norm", "entropy", "entropy_bound", "sigma_qk", "max_logit",
                                         "eig_mean", "eig_var", "attn_sink", "grad_norm"};
static const char *const LAYER_NAMES[] = {"rank_ratio", "sigma_qkv", "gamma_qkv"};

static void add_metric(struct proto_msg *m, const char *name, int kind, uint32_t rows, uint32_t cols) {
    struct proto_metric *pm = &m->metrics[m->nmetrics++];
    snprintf(pm->name, sizeof pm->name, "%s", name);
    pm->kind = kind;
    pm->rows = rows;
    pm->cols = cols;
    pm->offset = m->nvalues;
    m->nvalues += rows * cols;
}

int main(int argc, char **argv) {
    const char *db = NULL, *run = "bench-history", *end = "finished";
    long L = 12, H = 12, steps = 10000, nhead = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--db")) db = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) L = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) H = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-metrics")) nhead = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--run")) run = argv[i + 1];
        else if (!strcmp(argv[i], "--end")) end = argv[i + 1];
        else {
            fprintf(stderr, "bench_history_seed: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!db || L < 1 || H < 1 || steps < 1 || nhead < 1 || nhead > 9 ||
        (strcmp(end, "finished") && strcmp(end, "live"))) {
        fprintf(stderr, "usage: bench_history_seed --db PATH [--run NAME] [--steps N] [--layers L] [--heads H] "
                        "[--head-metrics 1..9] [--end finished|live]\n");
        return 2;
    }
    char err[512];
    struct store *st = store_open(db, err, sizeof err);
    if (!st) {
        fprintf(stderr, "bench_history_seed: %s\n", err);
        return 1;
    }
    int rc = 1;
    struct proto_msg m;
    memset(&m, 0, sizeof m);
    m.type = PROTO_STEP;
    m.has_seq = 1;
    m.has_time = 1;
    m.metrics = calloc(16, sizeof *m.metrics);
    m.values = calloc((size_t)(nhead * L * H + 3 * L + 2), sizeof *m.values);
    if (!m.metrics || !m.values) goto out;

    struct store_run_info ri;
    double t0 = now_s(), tbase = t0 - steps * 0.1;
    if (store_begin(st) || store_run_open(st, run, L, H, 256, "{\"bench\":true}", t0, &ri) || store_commit(st)) {
        fprintf(stderr, "bench_history_seed: %s\n", store_errmsg(st));
        goto out;
    }
    int64_t seq = ri.last_seq;
    char conflict[80];
    for (long s = 0; s < steps; s++) {
        if (s % 1000 == 0 && store_begin(st)) goto dberr;
        m.nmetrics = 0;
        m.nvalues = 0;
        m.step = s;
        m.time = tbase + s * 0.1;
        float *v = m.values;
        for (long k = 0; k < nhead; k++) {
            add_metric(&m, HEAD_NAMES[k], PROTO_HEAD, (uint32_t)L, (uint32_t)H);
            float *o = v + m.metrics[m.nmetrics - 1].offset;
            for (long l = 0; l < L; l++)
                for (long h = 0; h < H; h++) {
                    double base = 0.5 + 0.4 * pow(cos(0.7 * l + 1.3 * h + k), 2);
                    o[l * H + h] = (float)(base * (1 - 0.2 * s / (double)steps) + 0.02 * sin(s / 50.0 + h + k));
                }
        }
        for (int k = 0; k < 3; k++) {
            add_metric(&m, LAYER_NAMES[k], PROTO_LAYER, (uint32_t)L, 1);
            float *o = v + m.metrics[m.nmetrics - 1].offset;
            for (long l = 0; l < L; l++) o[l] = (float)(0.9 - 0.02 * l - 0.3 * s / steps + 0.1 * k);
        }
        add_metric(&m, "loss", PROTO_SCALAR, 1, 1);
        v[m.metrics[m.nmetrics - 1].offset] = (float)(4 * exp(-s / (steps / 5.0)) + 1.5 + 0.05 * sin((double)s));
        add_metric(&m, "lr", PROTO_SCALAR, 1, 1);
        v[m.metrics[m.nmetrics - 1].offset] = (float)(1e-3 * (s < 1000 ? s / 1000.0 : 1.0));
        m.seq = ++seq;
        if (store_step(st, ri.id, seq, &m, m.time, conflict, sizeof conflict) < 0) goto dberr;
        if ((s % 1000 == 999 || s == steps - 1) && store_commit(st)) goto dberr;
    }
    if (store_begin(st) ||
        store_run_status(st, ri.id, strcmp(end, "live") ? PROTO_FINISHED : PROTO_STALE, ++seq, now_s()) ||
        store_commit(st) || store_checkpoint(st, 1, 1000, NULL) < 0)
        goto dberr;
    printf("seeded run %lld (%s): %ld steps, %ld x %ld heads, %ld head metrics, last seq %lld, %.1f s\n",
           (long long)ri.id, run, steps, L, H, nhead, (long long)seq, now_s() - t0);
    rc = 0;
    goto out;
dberr:
    fprintf(stderr, "bench_history_seed: %s\n", store_errmsg(st));
out:
    free(m.metrics);
    free(m.values);
    m.metrics = NULL;
    m.values = NULL;
    store_close(st);
    return rc;
}
