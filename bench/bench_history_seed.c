/* bench_history_seed.c: writes one run of a given length straight into an
 * entropyd database through the store API (bench/seed.h), for the
 * history-scaling benchmark (bench/history.sh) and the long-run tests
 * (tests/e2e_long.py). Not a test of the store: it only fills it.
 *
 * Synthetic by default: head metrics (up to 9, sigmatrain's names), 3
 * layer metrics and 2 scalars every step, drifting slowly with no noise (so
 * they compress better than real ones). With --replay SRC the steps are
 * those of a real run recorded in another entropyd database (the one with
 * the most steps, or --replay-run NAME), every metric it has, replayed
 * over and over (step s is the recording's step s mod its length) up to
 * --steps: the real values' statistics at any length, for honest
 * bytes-per-value figures.
 *
 * usage: bench_history_seed --db PATH [--run NAME] [--steps N] [--layers 12]
 *        [--heads 12] [--head-metrics 9] [--end finished|live]
 *        [--replay SRC_DB [--replay-run NAME]] [--lossy-bf16 1] [--lossy-bits N]
 * (--lossy-bits N: sealed blocks rounded to N mantissa bits, as entropyd
 * --lossy-bits; --lossy-bf16 1 is --lossy-bits 7) */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fblock.h"
#include "query.h"
#include "seed.h"
#include "store.h"

static const char *const HEAD_NAMES[] = {"entropy_norm", "entropy", "entropy_bound", "sigma_qk", "max_logit",
                                         "eig_mean",     "eig_var", "attn_sink",     "grad_norm"};
static const char *const LAYER_NAMES[] = {"rank_ratio", "sigma_qkv", "gamma_qkv"};

/* ---- synthetic steps ---- */

struct synth {
    long L, H, nhead;
};

static void synth_step(void *ctx, struct proto_msg *m, long s, long steps) {
    const struct synth *g = ctx;
    long L = g->L, H = g->H;
    float *v = m->values;
    for (long k = 0; k < g->nhead; k++) {
        float *o = v + seed_add_metric(m, HEAD_NAMES[k], PROTO_HEAD, (uint32_t)L, (uint32_t)H);
        for (long l = 0; l < L; l++)
            for (long h = 0; h < H; h++) {
                double base = 0.5 + 0.4 * pow(cos(0.7 * l + 1.3 * h + k), 2);
                o[l * H + h] = (float)(base * (1 - 0.2 * s / (double)steps) + 0.02 * sin(s / 50.0 + h + k));
            }
    }
    for (int k = 0; k < 3; k++) {
        float *o = v + seed_add_metric(m, LAYER_NAMES[k], PROTO_LAYER, (uint32_t)L, 1);
        for (long l = 0; l < L; l++) o[l] = (float)(0.9 - 0.02 * l - 0.3 * s / steps + 0.1 * k);
    }
    v[seed_add_metric(m, "loss", PROTO_SCALAR, 1, 1)] =
        (float)(4 * exp(-s / (steps / 5.0)) + 1.5 + 0.05 * sin((double)s));
    v[seed_add_metric(m, "lr", PROTO_SCALAR, 1, 1)] = (float)(1e-3 * (s < 1000 ? s / 1000.0 : 1.0));
}

/* ---- a recorded real run, replayed ---- */

struct rec_metric {
    char name[PROTO_MAX_NAME + 1];
    int kind;
    uint32_t n;
    float *vals;        /* steps x n */
    unsigned char *has; /* steps: 1 where the recording has a frame */
};

struct recording {
    long L, H, steps;
    uint32_t nmetrics, values; /* values: of every metric, per step */
    struct rec_metric m[64];
};

static int rec_frame(void *ctx, int64_t step, const float *vals, uint32_t n) {
    struct rec_metric *m = ctx;
    memcpy(m->vals + (size_t)step * n, vals, (size_t)n * 4);
    m->has[step] = 1;
    return 0;
}

/* Loads the run `name` (NULL: the one with the most steps) of the
 * database at path, steps 0 .. its last. Returns 0, -1 with a message. */
static int rec_load(struct recording *r, const char *path, const char *name) {
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    struct query_pool *pool = NULL;
    struct query *q = NULL;
    char err[512];
    int rc = -1;
    int64_t run = 0;
    memset(r, 0, sizeof *r);
    /* a recording made by an older entropyd is brought up to this schema */
    struct store *up = store_open(path, err, sizeof err);
    if (!up) {
        fprintf(stderr, "bench_history_seed: %s\n", err);
        return -1;
    }
    store_close(up);
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           name ? "SELECT id, layers, heads, last_step FROM runs WHERE name = ?1"
                                : "SELECT id, layers, heads, last_step FROM runs ORDER BY last_step DESC LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK)
        goto dberr;
    if (name) sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_ROW || sqlite3_column_type(s, 3) == SQLITE_NULL) {
        fprintf(stderr, "bench_history_seed: %s has no such run with steps\n", path);
        goto out;
    }
    run = sqlite3_column_int64(s, 0);
    r->L = sqlite3_column_int64(s, 1);
    r->H = sqlite3_column_int64(s, 2);
    r->steps = (long)sqlite3_column_int64(s, 3) + 1;
    sqlite3_finalize(s);
    if (sqlite3_prepare_v2(db, "SELECT id, name, kind FROM metrics WHERE run_id = ?1 ORDER BY id", -1, &s, NULL) !=
        SQLITE_OK)
        goto dberr;
    sqlite3_bind_int64(s, 1, run);
    if (!(pool = query_pool_open(path, 1, err, sizeof err)) || !(q = query_acquire(pool, err, sizeof err))) {
        fprintf(stderr, "bench_history_seed: %s\n", err);
        goto out;
    }
    while (sqlite3_step(s) == SQLITE_ROW && r->nmetrics < 64) {
        struct rec_metric *m = &r->m[r->nmetrics++];
        snprintf(m->name, sizeof m->name, "%s", (const char *)sqlite3_column_text(s, 1));
        m->kind = sqlite3_column_int(s, 2);
        m->n = m->kind == PROTO_SCALAR ? 1 : m->kind == PROTO_LAYER ? (uint32_t)r->L : (uint32_t)(r->L * r->H);
        m->vals = calloc((size_t)r->steps * m->n, sizeof *m->vals);
        m->has = calloc((size_t)r->steps, 1);
        r->values += m->n;
        if (!m->vals || !m->has ||
            query_frames(q, sqlite3_column_int64(s, 0), m->n, 0, r->steps - 1, rec_frame, m, err, sizeof err)) {
            fprintf(stderr, "bench_history_seed: reading the recording: %s\n",
                    m->vals && m->has ? err : "out of memory");
            goto out;
        }
    }
    rc = 0;
    goto out;
dberr:
    fprintf(stderr, "bench_history_seed: %s: %s\n", path, db ? sqlite3_errmsg(db) : "out of memory");
out:
    sqlite3_finalize(s);
    sqlite3_close(db);
    query_release(pool, q);
    query_pool_close(pool);
    return rc;
}

static void rec_free(struct recording *r) {
    for (uint32_t i = 0; i < r->nmetrics; i++) {
        free(r->m[i].vals);
        free(r->m[i].has);
    }
}

static void rec_step(void *ctx, struct proto_msg *m, long s, long steps) {
    const struct recording *r = ctx;
    long at = s % r->steps;
    (void)steps;
    for (uint32_t i = 0; i < r->nmetrics; i++) {
        const struct rec_metric *rm = &r->m[i];
        if (!rm->has[at]) continue;
        uint32_t rows = rm->kind == PROTO_SCALAR ? 1 : (uint32_t)r->L,
                 cols = rm->kind == PROTO_HEAD ? (uint32_t)r->H : 1;
        uint32_t off = seed_add_metric(m, rm->name, rm->kind, rows, cols);
        memcpy(m->values + off, rm->vals + (size_t)at * rm->n, (size_t)rm->n * 4);
    }
}

int main(int argc, char **argv) {
    const char *db = NULL, *run = "bench-history", *end = "finished", *replay = NULL, *replay_run = NULL;
    long L = 12, H = 12, steps = 10000, nhead = 9, lossy = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--db")) db = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) L = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) H = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-metrics")) nhead = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--run")) run = argv[i + 1];
        else if (!strcmp(argv[i], "--end")) end = argv[i + 1];
        else if (!strcmp(argv[i], "--replay")) replay = argv[i + 1];
        else if (!strcmp(argv[i], "--replay-run")) replay_run = argv[i + 1];
        else if (!strcmp(argv[i], "--lossy-bf16")) lossy = atol(argv[i + 1]) ? FBLOCK_BITS_BF16 : lossy;
        else if (!strcmp(argv[i], "--lossy-bits"))
            lossy = strspn(argv[i + 1], "0123456789") == strlen(argv[i + 1]) ? atol(argv[i + 1]) : -1;
        else {
            fprintf(stderr, "bench_history_seed: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!db || L < 1 || H < 1 || steps < 1 || nhead < 1 || nhead > 9 || lossy < 0 || lossy > 22 ||
        (strcmp(end, "finished") && strcmp(end, "live"))) {
        fprintf(stderr, "usage: bench_history_seed --db PATH [--run NAME] [--steps N] [--layers L] [--heads H] "
                        "[--head-metrics 1..9] [--end finished|live] [--replay SRC_DB [--replay-run NAME]] "
                        "[--lossy-bf16 1] [--lossy-bits 0..22 (0: exact)]\n");
        return 2;
    }
    static struct recording rec;
    struct synth syn = {L, H, nhead};
    if (replay && rec_load(&rec, replay, replay_run)) {
        rec_free(&rec);
        return 1;
    }
    char err[512];
    struct store *st = store_open(db, err, sizeof err);
    if (!st) {
        fprintf(stderr, "bench_history_seed: %s\n", err);
        rec_free(&rec);
        return 1;
    }
    store_set_lossy_bits(st, (int)lossy);
    double t0 = seed_now();
    struct seed_spec spec = {.run = run,
                             .meta = "{\"bench\":true}",
                             .layers = replay ? rec.L : L,
                             .heads = replay ? rec.H : H,
                             .steps = steps,
                             .max_metrics = replay ? 64 : 16,
                             .max_values = replay ? rec.values : (uint32_t)(nhead * L * H + 3 * L + 2),
                             .t0 = t0 - steps * 0.1,
                             .dt = 0.1,
                             .end_status = strcmp(end, "live") ? PROTO_FINISHED : PROTO_STALE};
    int64_t id, values;
    int rc = seed_run(st, &spec, replay ? rec_step : synth_step, replay ? (void *)&rec : (void *)&syn,
                      "bench_history_seed", &id, &values)
                 ? 1
                 : 0;
    if (!rc && replay) {
        printf("seeded run %lld (%s): %ld steps, %ld x %ld heads, replaying the %ld steps of %u metrics of %s, "
               "values %lld, last seq %lld, %.1f s\n",
               (long long)id, run, steps, rec.L, rec.H, rec.steps, rec.nmetrics, replay, (long long)values,
               (long long)store_run_last_seq(st, id), seed_now() - t0);
    } else if (!rc)
        printf(
            "seeded run %lld (%s): %ld steps, %ld x %ld heads, %ld head metrics, values %lld, last seq %lld, %.1f s\n",
            (long long)id, run, steps, L, H, nhead, (long long)values, (long long)store_run_last_seq(st, id),
            seed_now() - t0);
    store_close(st);
    if (!rc && replay) {
        /* closed: the WAL is checkpointed into the file (and gone) */
        struct stat sb;
        int64_t bytes = (stat(db, &sb) == 0 ? (int64_t)sb.st_size : 0) + store_wal_bytes_of(db);
        printf("database %.1f MB for %lld values: %.2f bytes/value all-in (frames, blocks, rollups, indexes, WAL "
               "after checkpoint; bar 2.5)\n",
               (double)bytes / 1e6, (long long)values, (double)bytes / (double)values);
    }
    rec_free(&rec);
    return rc;
}
