/* bench_many_runs_seed.c: writes many small runs straight into an entropyd
 * database through the store API (daemon/store.h), for the compare and
 * runs-list tests and benchmarks that need a daemon holding 10,000 runs
 * (tests/browser/compare.test.mjs, bench/live.sh): a few seconds instead of
 * the minutes 10,000 hellos over the socket take.
 *
 * Run i is named sweep<K>-lr<LR>-<reparam>-s<seed>-<i> with the hello meta
 * {"sweep":"sweep<K>","lr":LR,"reparam":"sigma"|"none","seed":S,"norm":"pre"|"post"}
 * (K = i / 1000, LR cycling through 0.001, 0.003, 0.01); every run has
 * --steps steps (loss and a 2 x 4 entropy_norm that falls with the step,
 * faster for the baseline's lr 0.01), every --long-every-th run --long-steps.
 * Every 17th run ends failed, the rest finished; the verdicts are left to
 * the daemon's defaults (healthy; diverged for a failed run), except that
 * every 13th run is marked collapsed, so that the verdict filter has
 * something to find. Not a test of the store: it only fills it.
 *
 * usage: bench_many_runs_seed --db PATH [--runs 10000] [--steps 3]
 *        [--long-every 100] [--long-steps 200] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed.h"
#include "store.h"

static const double LRS[] = {0.001, 0.003, 0.01};

/* Fills m with step s of run i (the file's comment). */
static void many_step(struct proto_msg *m, long i, long s, int sigma, double lr) {
    m->nmetrics = 0;
    m->nvalues = 0;
    m->step = s;
    float *ent = m->values + seed_add_metric(m, "entropy_norm", PROTO_HEAD, 2, 4);
    double fall = sigma ? 0.0005 : lr * 0.3;
    for (int k = 0; k < 8; k++) ent[k] = (float)fmax(0.001, (0.6 + 0.04 * k + 0.01 * (i % 7)) * exp(-fall * s));
    m->values[seed_add_metric(m, "loss", PROTO_SCALAR, 1, 1)] = (float)(2.0 + 3.0 * exp(-s / 60.0) + 0.001 * (i % 100));
}

int main(int argc, char **argv) {
    const char *db = NULL;
    long runs = 10000, steps = 3, long_every = 100, long_steps = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--db")) db = argv[i + 1];
        else if (!strcmp(argv[i], "--runs")) runs = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--long-every")) long_every = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--long-steps")) long_steps = atol(argv[i + 1]);
        else {
            fprintf(stderr, "bench_many_runs_seed: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!db || runs < 1 || steps < 1 || long_every < 1 || long_steps < 1) {
        fprintf(stderr,
                "usage: bench_many_runs_seed --db PATH [--runs N] [--steps N] [--long-every N] [--long-steps N]\n");
        return 2;
    }
    char err[512], conflict[80];
    struct store *st = store_open(db, err, sizeof err);
    if (!st) {
        fprintf(stderr, "bench_many_runs_seed: %s\n", err);
        return 1;
    }
    struct proto_metric metrics[2];
    float values[9];
    struct proto_msg m;
    memset(&m, 0, sizeof m);
    m.type = PROTO_STEP;
    m.has_seq = 1;
    m.has_time = 1;
    m.metrics = metrics;
    m.values = values;
    double t0 = seed_now(), now = t0 - runs * 10.0;
    int rc = 1;
    long total = 0;
    for (long i = 0; i < runs; i++) {
        if (i % 500 == 0 && store_begin(st)) goto dberr;
        int sigma = (int)(i % 2);
        double lr = LRS[(i / 2) % 3];
        char name[96], meta[192];
        snprintf(name, sizeof name, "sweep%ld-lr%g-%s-s%ld-%ld", i / 1000, lr, sigma ? "sigma" : "none", i % 5, i);
        snprintf(meta, sizeof meta,
                 "{\"sweep\":\"sweep%ld\",\"lr\":%g,\"reparam\":\"%s\",\"seed\":%ld,\"norm\":\"%s\"}", i / 1000, lr,
                 sigma ? "sigma" : "none", i % 5, i % 3 ? "post" : "pre");
        struct store_run_info ri;
        now += 10.0;
        if (store_run_open(st, name, 2, 4, 64, meta, now, &ri)) goto dberr;
        long n = i % long_every == 0 ? long_steps : steps;
        int64_t seq = ri.last_seq;
        for (long s = 0; s < n; s++) {
            many_step(&m, i, s, sigma, lr);
            m.seq = ++seq;
            m.time = now + s * 0.01;
            if (store_step(st, ri.id, seq, &m, m.time, conflict, sizeof conflict) < 0 ||
                store_run_summary_step(st, ri.id, &m))
                goto dberr;
        }
        total += n;
        int failed = i % 17 == 16;
        if (failed && store_run_verdict(st, ri.id, "diverged", n - 1, "[]", "loss_nonfinite", NULL)) goto dberr;
        if (!failed && i % 13 == 12 &&
            store_run_verdict(st, ri.id, "collapsed", n / 2, "[[0,1]]", "entropy_collapse", NULL))
            goto dberr;
        if (store_run_status(st, ri.id, failed ? PROTO_FAILED : PROTO_FINISHED, ++seq, now + n * 0.01)) goto dberr;
        if ((i % 500 == 499 || i == runs - 1) && store_commit(st)) goto dberr;
    }
    if (store_checkpoint(st, 1, 1000, NULL) < 0) goto dberr;
    printf("seeded %ld runs, %ld steps, %.1f s\n", runs, total, seed_now() - t0);
    rc = 0;
    goto out;
dberr:
    fprintf(stderr, "bench_many_runs_seed: %s\n", store_errmsg(st));
    if (store_in_transaction(st)) store_rollback(st);
out:
    store_close(st);
    return rc;
}
