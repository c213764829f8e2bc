/* test_store.c: unit tests of the SQLite write side (daemon/store.c) on a
 * real database file in a temporary directory.
 *
 * The store is driven through its public calls only; what it wrote is read
 * back through a second, read-only SQLite connection and checked against
 * schema/storage.md: frames decode to the values sent (NaN for null), and
 * every rollup row is recomputed by brute force from the frames (min, max,
 * finite count and nframes exact, sum to 1e-9 of the sum of magnitudes),
 * including the completeness rule (a row for every non-empty block below
 * W_k) after gaps, sparse metrics, history rewrites, rollbacks and a full
 * disk. Not covered: SQLITE_BUSY from a second writer, I/O errors other
 * than SQLITE_FULL, out-of-memory paths. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fblock_rows.h"
#include "fixture_store.h"
#include "integrity.h"
#include "proto.h"
#include "query.h"
#include "rollup.h"
#include "store.h"

/* ------------------------------------------------------------ fixture */

/* Each test gets f, a store on a new database in a temporary directory
 * (struct tmp_db, tests/fixture_store.h). */
static int setup(void **state) {
    struct tmp_db *f = calloc(1, sizeof *f);
    if (!f || tmp_db_open(f, "/tmp/tstore-XXXXXX") != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct tmp_db *f = *state;
    tmp_db_close(f);
    free(f);
    return 0;
}

#define OK(call)                                                                                                \
    do {                                                                                                        \
        if ((call) != 0) fail_msg("%s failed: %s (code %d)", #call, store_errmsg(f->st), store_errcode(f->st)); \
    } while (0)

/* ------------------------------------------------------------ reading the database */

/* The sealed blocks of both layouts (schema/storage.md, "Blocks") as one
 * table of (metric_id, block) for count_rows. */
#define SEALED                                                                                          \
    "(SELECT metric_id, block FROM main.blocks UNION ALL SELECT s.metric_id, c.id & 67108863 AS block " \
    "FROM main.block_chunks c JOIN main.block_series s ON c.id >> 26 = s.base)"

/* ro_open, qi and qs: tests/fixture_store.h. */

/* The first column of the first row of a formatted query as a double
 * (0 when it is NULL); NaN when there is no row. */
static double qd(const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sqlite3_stmt *s = q_prepare(path, fmt, ap);
    va_end(ap);
    double v = NAN;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_double(s, 0);
    q_done(s);
    return v;
}

/* A text dump of every table (row ids of frames and rollups left out), to
 * compare two databases that should hold the same data. */
static char *dump_db(const char *path) {
    static const char *const queries[] = {
        "SELECT id,name,status,created,updated,layers,heads,seq_len,meta,last_seq,last_step FROM runs ORDER BY id",
        "SELECT id,run_id,name,kind FROM metrics ORDER BY id",
        "SELECT run_id,step,seq,time FROM steps ORDER BY run_id,step",
        "SELECT metric_id,step,hex(data) FROM frames ORDER BY metric_id,step",
        "SELECT metric_id,level,block,nframes,hex(data) FROM rollups ORDER BY metric_id,level,block",
        "SELECT run_id,seq,time,level,text FROM events ORDER BY id",
    };
    sqlite3 *db = ro_open(path);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (size_t q = 0; q < sizeof queries / sizeof *queries; q++) {
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_prepare_v2(db, queries[q], -1, &s, NULL), SQLITE_OK);
        while (sqlite3_step(s) == SQLITE_ROW) {
            for (int c = 0; c < sqlite3_column_count(s); c++) {
                const char *t =
                    sqlite3_column_type(s, c) == SQLITE_NULL ? "NULL" : (const char *)sqlite3_column_text(s, c);
                size_t l = strlen(t);
                while (n + l + 4 > cap) {
                    cap *= 2;
                    out = realloc(out, cap);
                    assert_non_null(out);
                }
                memcpy(out + n, t, l);
                n += l;
                out[n++] = '|';
            }
            out[n++] = '\n';
        }
        sqlite3_finalize(s);
        out[n++] = '#';
    }
    out[n] = 0;
    sqlite3_close(db);
    return out;
}

/* ------------------------------------------------------------ building steps */

static void msg_step(struct proto_msg *m, int64_t step) {
    memset(m, 0, sizeof *m);
    m->type = PROTO_STEP;
    m->step = step;
}

/* msg_add: tests/fixture_store.h. */

/* A deterministic value of metric mi at step, index i, in history epoch
 * `epoch` (a rewritten history gets other values). Some are NaN or Inf. */
static float val(int mi, int64_t step, uint32_t i, int epoch) {
    uint64_t h = (uint64_t)step * 2654435761u + i * 40503u + (uint64_t)mi * 9176u + (uint64_t)epoch * 7919u;
    h ^= h >> 13;
    if (h % 17 == 0) return NAN;
    if (h % 97 == 0) return INFINITY;
    if (h % 89 == 0) return -INFINITY;
    return (float)(sin((double)step * 0.013 + i + mi) * 10 + epoch * 100 + (double)(h % 1000) / 7);
}

#define L 2
#define H 3

/* The standard step of the 2x3 test model: scalar loss, layer metric rank,
 * head metric ent, a sparse scalar sp (every 5th step) and a scalar early
 * (only below step 3000). */
static void build_step(struct proto_msg *m, int64_t step, int epoch) {
    float v[L * H];
    msg_step(m, step);
    v[0] = val(0, step, 0, epoch);
    msg_add(m, "loss", PROTO_SCALAR, 1, 1, v);
    for (uint32_t i = 0; i < L; i++) v[i] = val(1, step, i, epoch);
    msg_add(m, "rank", PROTO_LAYER, L, 1, v);
    for (uint32_t i = 0; i < L * H; i++) v[i] = val(2, step, i, epoch);
    msg_add(m, "ent", PROTO_HEAD, L, H, v);
    if (step % 5 == 0) {
        v[0] = val(3, step, 0, epoch);
        msg_add(m, "sp", PROTO_SCALAR, 1, 1, v);
    }
    if (step < 3000) {
        v[0] = val(4, step, 0, epoch);
        msg_add(m, "early", PROTO_SCALAR, 1, 1, v);
    }
}

static int64_t open_run(struct tmp_db *f, const char *name, int64_t layers, int64_t heads) {
    struct store_run_info info;
    OK(store_begin(f->st));
    OK(store_run_open(f->st, name, layers, heads, 64, NULL, 1000.0, &info));
    OK(store_commit(f->st));
    return info.id;
}

/* Stores the given steps (seq continuing from *seq), committing every
 * commit_every steps. */
static void put_steps(struct tmp_db *f, int64_t run, int64_t *seq, const int64_t *steps, size_t n, int epoch,
                      size_t commit_every) {
    OK(store_begin(f->st));
    for (size_t i = 0; i < n; i++) {
        struct proto_msg m;
        build_step(&m, steps[i], epoch);
        int rc = store_step(f->st, run, ++*seq, &m, 1e9 + (double)steps[i], NULL, 0);
        if (rc != 0) fail_msg("store_step(step %lld): %d %s", (long long)steps[i], rc, store_errmsg(f->st));
        proto_msg_free(&m);
        if ((i + 1) % commit_every == 0 && i + 1 < n) {
            OK(store_commit(f->st));
            OK(store_begin(f->st));
        }
    }
    OK(store_commit(f->st));
}

static void put_range(struct tmp_db *f, int64_t run, int64_t *seq, int64_t from, int64_t to, int epoch,
                      size_t commit_every) {
    size_t n = (size_t)(to - from + 1);
    int64_t *steps = malloc(n * sizeof *steps);
    for (size_t i = 0; i < n; i++) steps[i] = from + (int64_t)i;
    put_steps(f, run, seq, steps, n, epoch, commit_every);
    free(steps);
}

/* ------------------------------------------------------------ brute-force rollups */

/* Decodes the one rollup row that `where` selects (n values) into cells. */
static void rollup_row(const char *path, const char *where, uint32_t n, struct rollup_cell *cells) {
    sqlite3 *db = ro_open(path);
    sqlite3_stmt *s;
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT nframes, data FROM rollups WHERE %s", where);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(rollup_decode(sqlite3_column_blob(s, 1), (size_t)sqlite3_column_bytes(s, 1), n,
                                   (uint32_t)sqlite3_column_int64(s, 0), 0, n, cells),
                     0);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

struct agg {
    float mn, mx;
    double sum, abssum;
    uint32_t count;
};

static int same_float(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

/* Decodes every cell of rollup block b of level k of metric mid (n values,
 * nframes frames) from its chunk rows (rollup.h), each of which must be
 * there with that nframes; for a metric of several chunks, checks its
 * total's row against the cells. */
static void block_cells(sqlite3 *db, int64_t mid, int k, int64_t b, uint32_t n, int64_t nframes,
                        struct rollup_cell *cells) {
    sqlite3_stmt *cs;
    uint32_t chunks = ROLLUP_CHUNKS(n);
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT nframes, data FROM rollups WHERE metric_id = ?1 AND level = ?2 "
                                        "AND chunk = ?3 AND block = ?4",
                                        -1, &cs, NULL),
                     SQLITE_OK);
    for (uint32_t c = 0; c < chunks; c++) {
        uint32_t c0 = c * ROLLUP_CHUNK_CELLS, cn = ROLLUP_CHUNK_LEN(n, c);
        sqlite3_bind_int64(cs, 1, mid);
        sqlite3_bind_int(cs, 2, k);
        sqlite3_bind_int(cs, 3, (int)c);
        sqlite3_bind_int64(cs, 4, b);
        if (sqlite3_step(cs) != SQLITE_ROW)
            fail_msg("metric %lld level %d block %lld: no row of chunk %u", (long long)mid, k, (long long)b, c);
        assert_int_equal(sqlite3_column_int64(cs, 0), nframes);
        assert_int_equal(rollup_decode(sqlite3_column_blob(cs, 1), (size_t)sqlite3_column_bytes(cs, 1), cn,
                                       (uint32_t)nframes, 0, cn, cells + c0),
                         0);
        sqlite3_reset(cs);
    }
    sqlite3_finalize(cs);
    if (chunks == 1) return;
    char where[160];
    snprintf(where, sizeof where, "metric_id = %lld AND level = %d AND block = %lld", (long long)mid, k, (long long)b);
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT nframes, data FROM rollup_totals WHERE metric_id = ?1 AND level = ?2 "
                                        "AND block = ?3",
                                        -1, &cs, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(cs, 1, mid);
    sqlite3_bind_int(cs, 2, k);
    sqlite3_bind_int64(cs, 3, b);
    if (sqlite3_step(cs) != SQLITE_ROW) fail_msg("rollup_totals: no row where %s", where);
    assert_int_equal(sqlite3_column_int64(cs, 0), nframes);
    struct rollup_total t;
    int has =
        rollup_total_decode(sqlite3_column_blob(cs, 1), (size_t)sqlite3_column_bytes(cs, 1), n, (uint32_t)nframes, &t);
    assert_true(has >= 0);
    if (has) {
        /* what pooling the cells one by one gives */
        float mn = NAN, mx = NAN;
        uint64_t count = 0;
        double sum = 0, want = 0;
        for (uint32_t v = 0; v < n; v++) {
            if (!cells[v].count) continue;
            if (!count || cells[v].mn < mn) mn = cells[v].mn;
            if (!count || cells[v].mx > mx) mx = cells[v].mx;
            count += cells[v].count;
            want += cells[v].sum;
        }
        assert_int_equal(t.count, count);
        assert_true(same_float(t.mn, mn) && same_float(t.mx, mx));
        assert_int_equal(rollup_total_add(&t, &sum), 1);
        assert_true(sum == want);
    }
    sqlite3_finalize(cs);
}

/* Recomputes every rollup row of run_id's metrics from the frames and
 * compares; checks the completeness rule. Adds the rows checked per level
 * to rows_per_level (index 1..5) when not NULL. */
static void verify_rollups(const char *path, int64_t run_id, int64_t *rows_per_level) {
    sqlite3 *db = ro_open(path);
    int64_t layers = qi(path, "SELECT layers FROM runs WHERE id = %lld", (long long)run_id);
    int64_t heads = qi(path, "SELECT heads FROM runs WHERE id = %lld", (long long)run_id);
    sqlite3_stmt *ms;
    assert_int_equal(
        sqlite3_prepare_v2(db, "SELECT id, kind, name FROM metrics WHERE run_id = ?1 ORDER BY id", -1, &ms, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(ms, 1, run_id);
    while (sqlite3_step(ms) == SQLITE_ROW) {
        int64_t mid = sqlite3_column_int64(ms, 0);
        int kind = sqlite3_column_int(ms, 1);
        char name[80];
        snprintf(name, sizeof name, "%s", (const char *)sqlite3_column_text(ms, 2));
        uint32_t n = kind == PROTO_SCALAR ? 1 : kind == PROTO_LAYER ? (uint32_t)layers : (uint32_t)(layers * heads);

        /* all frames, by step */
        size_t nf = 0, capf = 1024;
        int64_t *fstep = malloc(capf * sizeof *fstep);
        float *fval = malloc(capf * n * sizeof *fval);
        sqlite3_stmt *fs;
        assert_int_equal(
            sqlite3_prepare_v2(db, "SELECT step, data FROM frames WHERE metric_id = ?1 ORDER BY step", -1, &fs, NULL),
            SQLITE_OK);
        sqlite3_bind_int64(fs, 1, mid);
        while (sqlite3_step(fs) == SQLITE_ROW) {
            if (nf == capf) {
                capf *= 2;
                fstep = realloc(fstep, capf * sizeof *fstep);
                fval = realloc(fval, capf * n * sizeof *fval);
            }
            fstep[nf] = sqlite3_column_int64(fs, 0);
            assert_int_equal(sqlite3_column_bytes(fs, 1), (int)(n * 4));
            memcpy(fval + nf * n, sqlite3_column_blob(fs, 1), n * 4);
            nf++;
        }
        sqlite3_finalize(fs);
        int64_t last = nf ? fstep[nf - 1] : -1;

        for (int k = 1; k <= ROLLUP_LEVELS; k++) {
            int64_t size = ROLLUP_LEVEL_SIZE(k);
            sqlite3_stmt *rs;
            assert_int_equal(
                sqlite3_prepare_v2(db,
                                   "SELECT block, nframes FROM rollups WHERE metric_id = ?1 AND level = ?2 "
                                   "AND chunk = 0 ORDER BY block",
                                   -1, &rs, NULL),
                SQLITE_OK);
            sqlite3_bind_int64(rs, 1, mid);
            sqlite3_bind_int(rs, 2, k);
            int rc = sqlite3_step(rs);
            size_t i = 0;
            int64_t matched = 0, nrows = 0;
            /* walk the non-empty blocks in order, alongside the rows */
            while (i < nf) {
                int64_t b = fstep[i] / size;
                size_t j = i;
                struct agg *a = calloc(n, sizeof *a);
                for (uint32_t v = 0; v < n; v++) a[v].mn = a[v].mx = NAN;
                for (; j < nf && fstep[j] / size == b; j++) {
                    for (uint32_t v = 0; v < n; v++) {
                        float x = fval[j * n + v];
                        if (!isfinite(x)) continue;
                        if (a[v].count == 0 || x < a[v].mn) a[v].mn = x;
                        if (a[v].count == 0 || x > a[v].mx) a[v].mx = x;
                        a[v].sum += x;
                        a[v].abssum += fabs(x);
                        a[v].count++;
                    }
                }
                int64_t nframes = (int64_t)(j - i);
                /* rows of empty blocks before b */
                while (rc == SQLITE_ROW && sqlite3_column_int64(rs, 0) < b) {
                    fail_msg("metric %s level %d: row for block %lld, which has no frames", name, k,
                             (long long)sqlite3_column_int64(rs, 0));
                }
                if (rc == SQLITE_ROW && sqlite3_column_int64(rs, 0) == b) {
                    if (sqlite3_column_int64(rs, 1) != nframes)
                        fail_msg("metric %s level %d block %lld: nframes %lld, frames say %lld", name, k, (long long)b,
                                 (long long)sqlite3_column_int64(rs, 1), (long long)nframes);
                    struct rollup_cell *cells = malloc(n * sizeof *cells);
                    block_cells(db, mid, k, b, n, nframes, cells);
                    for (uint32_t v = 0; v < n; v++) {
                        float mn = cells[v].mn, mx = cells[v].mx;
                        double sum = cells[v].sum;
                        uint32_t c = cells[v].count;
                        if (c != a[v].count || !same_float(mn, a[v].mn) || !same_float(mx, a[v].mx) ||
                            fabs(sum - a[v].sum) > 1e-9 * a[v].abssum)
                            fail_msg("metric %s level %d block %lld value %u: stored min %g max %g sum %.17g count %u; "
                                     "frames give min %g max %g sum %.17g count %u",
                                     name, k, (long long)b, v, (double)mn, (double)mx, sum, c, (double)a[v].mn,
                                     (double)a[v].mx, a[v].sum, a[v].count);
                    }
                    free(cells);
                    matched++;
                    nrows++;
                    rc = sqlite3_step(rs);
                } else if (b < last / size) {
                    fail_msg(
                        "metric %s level %d: no row for block %lld (has %lld frames) below W_k = %lld (last step %lld)",
                        name, k, (long long)b, (long long)nframes, (long long)(last / size * size), (long long)last);
                }
                free(a);
                i = j;
            }
            if (rc == SQLITE_ROW)
                fail_msg("metric %s level %d: row for block %lld, which has no frames", name, k,
                         (long long)sqlite3_column_int64(rs, 0));
            sqlite3_finalize(rs);
            /* no other chunk's row, nor total, without its chunk 0 */
            uint32_t chunks = ROLLUP_CHUNKS(n);
            assert_int_equal(
                qi(path, "SELECT count(*) FROM rollups WHERE metric_id = %lld AND level = %d", (long long)mid, k),
                nrows * chunks);
            assert_int_equal(
                qi(path, "SELECT count(*) FROM rollup_totals WHERE metric_id = %lld AND level = %d", (long long)mid, k),
                chunks > 1 ? nrows : 0);
            if (rows_per_level) rows_per_level[k] += matched;
        }
        free(fstep);
        free(fval);
    }
    sqlite3_finalize(ms);
    sqlite3_close(db);
}

/* ------------------------------------------------------------ tests */

static void test_migrations(void **state) {
    struct tmp_db *f = *state;
    int version = store_schema_version();
    assert_true(version >= 1);
    assert_int_equal(qi(f->path, "PRAGMA user_version"), version);
    assert_int_equal(qi(f->path, "PRAGMA page_size"), 16384);
    char *jm = qs(f->path, "PRAGMA journal_mode");
    assert_string_equal(jm, "wal");
    free(jm);
    static const char *const tables[] = {"runs", "metrics", "steps", "frames", "rollups", "events"};
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(
            qi(f->path, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = %Q", tables[i]), 1);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM sqlite_master WHERE name = 'frames_metric_step'"), 1);
    /* rollups are keyed by (metric_id, level, block) itself (migration 7) */
    assert_int_equal(
        qi(f->path, "SELECT count(*) FROM sqlite_master WHERE name = 'rollups' AND sql LIKE '%%WITHOUT ROWID%%'"), 1);
    assert_true(store_db_bytes(f->st) > 0);
    assert_int_equal(store_db_bytes(f->st) % 16384, 0);

    /* reopening keeps the data and does not migrate again */
    int64_t run = open_run(f, "keep", 2, 3);
    store_close(f->st);
    char err[256];
    f->st = store_open(f->path, err, sizeof err);
    assert_non_null(f->st);
    assert_int_equal(qi(f->path, "PRAGMA user_version"), version);
    assert_int_equal(qi(f->path, "SELECT id FROM runs WHERE name = 'keep'"), run);

    /* an existing empty SQLite file (version 0) is brought up to date */
    char p2[160];
    snprintf(p2, sizeof p2, "%s/old.db", f->dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(p2, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE unrelated(x); PRAGMA user_version = 0;", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    struct store *st2 = store_open(p2, err, sizeof err);
    if (!st2) fail_msg("store_open(old.db): %s", err);
    store_close(st2);
    assert_int_equal(qi(p2, "PRAGMA user_version"), version);
    assert_int_equal(qi(p2, "SELECT count(*) FROM sqlite_master WHERE name IN ('runs','frames','rollups')"), 3);
    assert_int_equal(qi(p2, "SELECT count(*) FROM sqlite_master WHERE name = 'unrelated'"), 1);
}

static void test_newer_schema_refused(void **state) {
    struct tmp_db *f = *state;
    open_run(f, "r", 1, 1);
    store_close(f->st);
    f->st = NULL;
    int version = store_schema_version();
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", version + 1);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    char err[512] = "";
    struct store *st = store_open(f->path, err, sizeof err);
    assert_null(st);
    char want[64];
    snprintf(want, sizeof want, "version %d is newer", version + 1);
    if (!strstr(err, want) || !strstr(err, f->path)) fail_msg("unclear message: %s", err);
    /* refused, not touched */
    assert_int_equal(qi(f->path, "PRAGMA user_version"), version + 1);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM runs"), 1);
    /* a path that cannot be opened fails with a message too */
    err[0] = 0;
    assert_null(store_open("/nonexistent-dir-for-tests/x.db", err, sizeof err));
    assert_true(err[0] != 0);
}

static void test_run_open_resume_mismatch(void **state) {
    struct tmp_db *f = *state;
    struct store_run_info a, b, c;
    OK(store_begin(f->st));
    OK(store_run_open(f->st, "alpha", 2, 3, 128, "{\"lr\": 0.1}", 1000.5, &a));
    assert_int_equal(a.created, 1);
    assert_true(a.id > 0);
    assert_int_equal(a.last_seq, 0);
    assert_int_equal(a.layers, 2);
    assert_int_equal(a.heads, 3);
    assert_int_equal(a.seq_len, 128);
    OK(store_run_open(f->st, "beta", 4, 4, 16, NULL, 1001, &b));
    assert_int_equal(b.created, 1);
    assert_true(b.id != a.id);
    OK(store_commit(f->st));
    char *s =
        qs(f->path,
           "SELECT status || ' ' || meta || ' ' || layers || 'x' || heads || ' ' || seq_len FROM runs WHERE id = %lld",
           (long long)a.id);
    assert_string_equal(s, "live {\"lr\": 0.1} 2x3 128");
    free(s);
    s = qs(f->path, "SELECT meta FROM runs WHERE id = %lld", (long long)b.id);
    assert_string_equal(s, "{}");
    free(s);
    assert_true(qd(f->path, "SELECT created FROM runs WHERE name = %Q", "alpha") == 1000.5);
    assert_true(qd(f->path, "SELECT updated FROM runs WHERE name = %Q", "alpha") == 1000.5);
    assert_int_equal(qi(f->path, "SELECT last_step FROM runs WHERE id = %lld", (long long)a.id), INT64_MIN); /* NULL */

    /* some data, then the run goes stale and is resumed */
    int64_t seq = 0;
    int64_t steps[] = {0, 1, 2};
    put_steps(f, a.id, &seq, steps, 3, 0, 10);
    OK(store_begin(f->st));
    OK(store_run_status(f->st, a.id, PROTO_STALE, 0, 1100));
    OK(store_commit(f->st));
    s = qs(f->path, "SELECT status FROM runs WHERE id = %lld", (long long)a.id);
    assert_string_equal(s, "stale");
    free(s);
    OK(store_begin(f->st));
    OK(store_run_open(f->st, "alpha", 2, 3, 256, NULL, 1200, &c));
    OK(store_commit(f->st));
    assert_int_equal(c.created, 0);
    assert_int_equal(c.id, a.id);
    assert_int_equal(c.last_seq, 3);
    assert_int_equal(c.layers, 2);
    assert_int_equal(c.heads, 3);
    s = qs(f->path, "SELECT status || ' ' || meta || ' ' || seq_len FROM runs WHERE id = %lld", (long long)a.id);
    assert_string_equal(s, "live {\"lr\": 0.1} 256"); /* meta kept when NULL */
    free(s);
    assert_true(qd(f->path, "SELECT created FROM runs WHERE name = %Q", "alpha") == 1000.5);
    assert_true(qd(f->path, "SELECT updated FROM runs WHERE name = %Q", "alpha") == 1200);
    /* a resume with meta replaces it */
    OK(store_begin(f->st));
    OK(store_run_open(f->st, "alpha", 2, 3, 256, "{\"v\":2}", 1300, &c));
    OK(store_commit(f->st));
    s = qs(f->path, "SELECT meta FROM runs WHERE id = %lld", (long long)a.id);
    assert_string_equal(s, "{\"v\":2}");
    free(s);

    /* another shape: errcode -2, a message naming both shapes, nothing changed */
    OK(store_begin(f->st));
    OK(store_run_status(f->st, a.id, PROTO_STALE, 0, 1400));
    assert_int_equal(store_run_open(f->st, "alpha", 3, 3, 256, "{\"v\":3}", 1500, &c), -1);
    assert_int_equal(store_errcode(f->st), STORE_ESHAPE);
    if (!strstr(store_errmsg(f->st), "2 layers x 3 heads") || !strstr(store_errmsg(f->st), "3 x 3"))
        fail_msg("message: %s", store_errmsg(f->st));
    assert_int_equal(store_run_open(f->st, "alpha", 2, 4, 256, NULL, 1500, &c), -1);
    assert_int_equal(store_errcode(f->st), STORE_ESHAPE);
    OK(store_commit(f->st));
    s = qs(f->path, "SELECT status || ' ' || meta || ' ' || layers || 'x' || heads FROM runs WHERE id = %lld",
           (long long)a.id);
    assert_string_equal(s, "stale {\"v\":2} 2x3");
    free(s);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM runs"), 2);
    assert_int_equal(store_run_last_seq(f->st, a.id), 3);
    assert_int_equal(store_run_last_seq(f->st, b.id), 0);
    assert_int_equal(store_run_last_seq(f->st, 999999), -1);
}

static void test_step_frames(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "frames", L, H);
    struct proto_msg m;
    msg_step(&m, 17);
    float loss = 2.5f, rank[L] = {0.25f, NAN}, ent[L * H] = {1, 2, NAN, -4, INFINITY, 6e-30f};
    msg_add(&m, "loss", PROTO_SCALAR, 1, 1, &loss);
    msg_add(&m, "rank", PROTO_LAYER, L, 1, rank);
    msg_add(&m, "ent", PROTO_HEAD, L, H, ent);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, run, 1, &m, 1764500000.25, NULL, 0), 0);
    OK(store_commit(f->st));
    proto_msg_free(&m);

    assert_int_equal(qi(f->path, "SELECT count(*) FROM metrics WHERE run_id = %lld", (long long)run), 3);
    assert_int_equal(qi(f->path, "SELECT kind FROM metrics WHERE name = 'loss'"), 0);
    assert_int_equal(qi(f->path, "SELECT kind FROM metrics WHERE name = 'rank'"), 1);
    assert_int_equal(qi(f->path, "SELECT kind FROM metrics WHERE name = 'ent'"), 2);
    const struct {
        const char *name;
        int n;
        const float *v;
    } want[] = {{"loss", 1, &loss}, {"rank", L, rank}, {"ent", L * H, ent}};
    sqlite3 *db = ro_open(f->path);
    for (int i = 0; i < 3; i++) {
        sqlite3_stmt *s;
        assert_int_equal(
            sqlite3_prepare_v2(
                db, "SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = ?1", -1,
                &s, NULL),
            SQLITE_OK);
        sqlite3_bind_text(s, 1, want[i].name, -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int64(s, 0), 17);
        assert_int_equal(sqlite3_column_bytes(s, 1), want[i].n * 4);
        const unsigned char *d = sqlite3_column_blob(s, 1);
        for (int k = 0; k < want[i].n; k++) {
            /* little-endian float32, layer-major */
            uint32_t bits = (uint32_t)d[4 * k] | (uint32_t)d[4 * k + 1] << 8 | (uint32_t)d[4 * k + 2] << 16 |
                            (uint32_t)d[4 * k + 3] << 24;
            float x;
            memcpy(&x, &bits, 4);
            if (!same_float(x, want[i].v[k]))
                fail_msg("%s[%d]: %g, want %g", want[i].name, k, (double)x, (double)want[i].v[k]);
            if (isnan(want[i].v[k])) assert_true(isnan(x)); /* NaN stays NaN: not dropped, not zero */
        }
        assert_int_equal(sqlite3_step(s), SQLITE_DONE);
        sqlite3_finalize(s);
    }
    sqlite3_close(db);
    assert_int_equal(qi(f->path, "SELECT seq FROM steps WHERE run_id = %lld AND step = 17", (long long)run), 1);
    assert_true(qd(f->path, "SELECT time FROM steps WHERE step = %s", "17") == 1764500000.25);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), 1);
    assert_int_equal(qi(f->path, "SELECT last_step FROM runs WHERE id = %lld", (long long)run), 17);
    assert_true(qd(f->path, "SELECT updated FROM runs WHERE name = %Q", "frames") == 1764500000.25);
    assert_int_equal(store_run_last_seq(f->st, run), 1);
    /* no rollups yet: the first block is not complete */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups"), 0);
    /* a step into a later block completes block 0 of level 1 for all three */
    build_step(&m, 64, 0);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, run, 2, &m, 1764500001, NULL, 0), 0);
    OK(store_commit(f->st));
    proto_msg_free(&m);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups WHERE level = 1 AND block = 0"), 3);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups WHERE level > 1 OR block > 0"), 0);
    verify_rollups(f->path, run, NULL);
    /* an unknown run: errcode -3 */
    build_step(&m, 1, 0);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, 987654, 1, &m, 1, NULL, 0), -1);
    assert_int_equal(store_errcode(f->st), STORE_ENORUN);
    store_rollback(f->st);
    proto_msg_free(&m);
}

/* One step of metric "ent" (values v), in a transaction of its own. */
static void put_ent(struct tmp_db *f, int64_t run, int64_t seq, int64_t step, float *v) {
    struct proto_msg m;
    msg_step(&m, step);
    msg_add(&m, "ent", PROTO_HEAD, L, H, v);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, run, seq, &m, 1764500000 + (double)seq, NULL, 0), 0);
    OK(store_commit(f->st));
    proto_msg_free(&m);
}

/* --lossy-bits (bf16, then 16 bits): a sealed block reads back rounded
 * to that precision, the open block, the latest values and the rollups
 * exact. */
static void lossy_bits_case(struct tmp_db *f, int bits) {
    store_set_lossy_bits(f->st, bits);
    int64_t run = open_run(f, "lossy", L, H);
    float v[70][L * H];
    for (int s = 0; s < 70; s++) {
        for (int k = 0; k < L * H; k++) v[s][k] = 1.0f + 0.001234567f * (float)(s * 7 + k);
        put_ent(f, run, s + 1, s, v[s]);
    }
    assert_int_equal(qi(f->path, "SELECT count(*) FROM " SEALED), 1);
    sqlite3 *db = ro_open(f->path);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT step, data FROM frames ORDER BY step", -1, &s, NULL), SQLITE_OK);
    int rows = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        int step = sqlite3_column_int(s, 0);
        float want[L * H], got[L * H];
        memcpy(want, v[step], sizeof want);
        if (step < FBLOCK_STEPS) fblock_round(want, L * H, bits);
        assert_int_equal(sqlite3_column_bytes(s, 1), (int)sizeof got);
        memcpy(got, sqlite3_column_blob(s, 1), sizeof got);
        assert_memory_equal(got, want, sizeof got);
        if (step < FBLOCK_STEPS) assert_memory_not_equal(got, v[step], sizeof got); /* it did round */
        rows++;
    }
    assert_int_equal(rows, 70);
    sqlite3_finalize(s);
    /* the latest values (those /metrics serves) are the last step's, exact */
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT l.step, l.data FROM main.latest l JOIN main.metrics m "
                                        "ON m.id = l.metric_id WHERE m.run_id = ?1 AND m.name = 'ent'",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(s, 0), 69);
    assert_int_equal(sqlite3_column_bytes(s, 1), (int)sizeof v[69]);
    assert_memory_equal(sqlite3_column_blob(s, 1), v[69], sizeof v[69]);
    sqlite3_finalize(s);
    sqlite3_close(db);
    /* the rollup is of the exact values (the frames it would be checked against are rounded) */
    struct rollup_cell cells[L * H];
    rollup_row(f->path, "level = 1 AND block = 0", L * H, cells);
    assert_true(cells[0].mx == v[63][0]); /* max of cell 0 over block 0: the exact value of step 63 */
    store_set_lossy_bits(f->st, 0);
}

static void test_lossy_bf16(void **state) { lossy_bits_case(*state, FBLOCK_BITS_BF16); }
static void test_lossy_bits_16(void **state) { lossy_bits_case(*state, 16); }

/* --lossy-bits and a rollback into a sealed block, the exception store.h
 * names: the block reopens with the rounded values of its steps before the
 * rollback's step (the exact ones are gone); the step sent again is exact. */
static void test_lossy_rewind_reopens_rounded(void **state) {
    struct tmp_db *f = *state;
    store_set_lossy_bits(f->st, 10);
    int64_t run = open_run(f, "lossy-rewind", L, H);
    float v[70][L * H], w[L * H];
    for (int s = 0; s < 70; s++) {
        for (int k = 0; k < L * H; k++) v[s][k] = 1.0f + 0.001234567f * (float)(s * 7 + k);
        put_ent(f, run, s + 1, s, v[s]);
    }
    assert_int_equal(qi(f->path, "SELECT count(*) FROM " SEALED), 1);
    for (int k = 0; k < L * H; k++) w[k] = 2.0f + 0.000987654f * (float)k;
    put_ent(f, run, 71, 30, w);                                       /* the trainer rolled back to step 30 */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM " SEALED), 0); /* block 0 is open again */
    sqlite3 *db = ro_open(f->path);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT f.step, f.data FROM main.frames f JOIN main.metrics m "
                                        "ON m.id = f.metric_id WHERE m.run_id = ?1 AND m.name = 'ent' "
                                        "ORDER BY f.step",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, run);
    int rows = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        int step = sqlite3_column_int(s, 0);
        float want[L * H];
        assert_int_equal(step, rows);
        memcpy(want, step < 30 ? v[step] : w, sizeof want);
        if (step < 30) fblock_round(want, L * H, 10);
        assert_int_equal(sqlite3_column_bytes(s, 1), (int)sizeof want);
        assert_memory_equal(sqlite3_column_blob(s, 1), want, sizeof want);
        rows++;
    }
    assert_int_equal(rows, 31);
    sqlite3_finalize(s);
    sqlite3_close(db);
    store_set_lossy_bits(f->st, 0);
}

static void test_rollups_brute_force(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "roll", L, H);
    /* dense with gaps (every 3rd step missing), then sparse jumps that
     * complete blocks of levels 3, 4 and 5 */
    size_t n = 0;
    int64_t *steps = malloc(8000 * sizeof *steps);
    for (int64_t s = 0; s < 6000; s++)
        if (s % 3 != 2) steps[n++] = s;
    static const int64_t tail[] = {9000, 9001, 40000, 40010, 300000, 300001, 300002, 600000, 2400000};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++) steps[n++] = tail[i];
    int64_t seq = 0;
    put_steps(f, run, &seq, steps, n, 0, 250);
    free(steps);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), (int64_t)n);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), (int64_t)n);
    assert_int_equal(qi(f->path, "SELECT last_step FROM runs WHERE id = %lld", (long long)run), 2400000);
    /* the sparse metric has a frame only every 5th step */
    assert_int_equal(
        qi(f->path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'sp'"),
        qi(f->path, "SELECT count(*) FROM steps WHERE step %% 5 = 0"));
    int64_t rows[ROLLUP_LEVELS + 1] = {0};
    verify_rollups(f->path, run, rows);
    for (int k = 1; k <= ROLLUP_LEVELS; k++)
        if (rows[k] == 0) fail_msg("no rollup row of level %d was checked", k);
    /* level 1 of ent: blocks 0..92 of the dense part, 140, 625 (40000/64),
     * 4687 (300000..), 9375 (600000); 2400000 is the last and open */
    assert_int_equal(
        qi(f->path,
           "SELECT count(*) FROM rollups r JOIN metrics m ON m.id = r.metric_id WHERE m.name = 'ent' AND level = 1"),
        94 + 1 + 1 + 1 + 1);
    assert_int_equal(
        qi(f->path,
           "SELECT count(*) FROM rollups r JOIN metrics m ON m.id = r.metric_id WHERE m.name = 'ent' AND level = 5"),
        3);
    assert_int_equal(
        qi(f->path,
           "SELECT nframes FROM rollups r JOIN metrics m ON m.id = r.metric_id WHERE m.name = 'ent' AND level = 5 AND block = 0"),
        4000 + 4);
    /* early stopped at step 2999: its last block stays open, the others are complete */
    assert_int_equal(
        qi(f->path,
           "SELECT max(block) FROM rollups r JOIN metrics m ON m.id = r.metric_id WHERE m.name = 'early' AND level = 1"),
        2998 / 64 - 1);
}

static int64_t count_rows(struct tmp_db *f, int64_t run, const char *table, const char *where) {
    return qi(f->path, "SELECT count(*) FROM %s WHERE metric_id IN (SELECT id FROM metrics WHERE run_id = %lld) AND %s",
              table, (long long)run, where);
}

static void test_history_rewrite(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "rewrite", L, H);
    int64_t other = open_run(f, "bystander", L, H);
    int64_t seq = 0, oseq = 0;
    put_range(f, run, &seq, 0, 1499, 0, 100);
    put_range(f, other, &oseq, 0, 1499, 0, 500);
    char *before = NULL;
    {
        /* the bystander's rows, to check they are not touched */
        before = qs(f->path,
                    "SELECT group_concat(hex(data)) FROM (SELECT data FROM rollups WHERE metric_id IN "
                    "(SELECT id FROM metrics WHERE run_id = %lld) ORDER BY metric_id, level, block)",
                    (long long)other);
    }
    assert_true(count_rows(f, run, "rollups", "level = 1 AND block >= 10") > 0);
    assert_true(count_rows(f, run, "rollups", "level = 2 AND block = 1") > 0);

    /* step 700 again, with other values */
    int64_t s700[] = {700};
    put_steps(f, run, &seq, s700, 1, 1, 1);
    assert_int_equal(count_rows(f, run, "frames", "step > 700"), 0);
    assert_int_equal(count_rows(f, run, "frames", "step = 700"), 5); /* loss rank ent sp (700 % 5 == 0) early */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 701);
    assert_int_equal(qi(f->path, "SELECT seq FROM steps WHERE run_id = %lld AND step = 700", (long long)run), seq);
    assert_int_equal(count_rows(f, run, "rollups", "level = 1 AND block >= 10"), 0); /* 700 / 64 = 10 */
    assert_int_equal(count_rows(f, run, "rollups", "level = 2 AND block >= 1"), 0);  /* 700 / 512 = 1 */
    assert_true(count_rows(f, run, "rollups", "level = 1 AND block = 9") > 0);       /* complete, kept */
    assert_true(count_rows(f, run, "rollups", "level = 2 AND block = 0") > 0);
    assert_int_equal(qi(f->path, "SELECT last_step FROM runs WHERE id = %lld", (long long)run), 700);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), seq);
    char *ev =
        qs(f->path, "SELECT level || '|' || coalesce(seq, 'NULL') || '|' || text FROM events WHERE run_id = %lld",
           (long long)run);
    assert_non_null(ev);
    if (strncmp(ev, "warn|NULL|rollback to step 700", 30) != 0) fail_msg("event: %s", ev);
    free(ev);
    /* the frame at 700 holds the new values */
    float x;
    char *hex = qs(
        f->path,
        "SELECT hex(data) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.run_id = %lld AND m.name = 'loss' AND step = 700",
        (long long)run);
    uint32_t bits = 0;
    for (int i = 3; i >= 0; i--) {
        unsigned byte;
        sscanf(hex + 2 * i, "%2x", &byte);
        bits = bits << 8 | byte;
    }
    free(hex);
    memcpy(&x, &bits, 4);
    assert_true(same_float(x, val(0, 700, 0, 1)));
    verify_rollups(f->path, run, NULL);

    /* continue, then rewrite to a boundary of levels 1 and 2 */
    put_range(f, run, &seq, 701, 2000, 1, 150);
    verify_rollups(f->path, run, NULL);
    int64_t s1024[] = {1024};
    put_steps(f, run, &seq, s1024, 1, 2, 1);
    assert_int_equal(count_rows(f, run, "rollups", "level = 1 AND block >= 16"), 0);
    assert_int_equal(count_rows(f, run, "rollups", "level = 2 AND block >= 2"), 0);
    assert_true(count_rows(f, run, "rollups", "level = 1 AND block = 15") > 0);
    put_range(f, run, &seq, 1025, 1600, 2, 64);
    verify_rollups(f->path, run, NULL);
    /* the last step again */
    int64_t s1600[] = {1600};
    put_steps(f, run, &seq, s1600, 1, 3, 1);
    assert_int_equal(count_rows(f, run, "frames", "step = 1600"), 5);
    assert_int_equal(count_rows(f, run, "frames", "step > 1600"), 0);
    put_range(f, run, &seq, 1601, 1700, 3, 1000);
    verify_rollups(f->path, run, NULL);

    /* rewrites inside one transaction with the steps before and after it */
    {
        int64_t mixed[400];
        size_t n = 0;
        for (int64_t s = 1701; s <= 1900; s++) mixed[n++] = s;
        for (int64_t s = 1750; s <= 1849; s++) mixed[n++] = s; /* back to 1750 */
        for (int64_t s = 1795; s <= 1894; s++) mixed[n++] = s; /* and to 1795 */
        put_steps(f, run, &seq, mixed, n, 4, 100000);
    }
    assert_int_equal(count_rows(f, run, "frames", "step > 1894"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld AND step > 1894", (long long)run), 0);
    verify_rollups(f->path, run, NULL);

    /* back to step 0: everything goes */
    int64_t s0[] = {0};
    put_steps(f, run, &seq, s0, 1, 5, 1);
    assert_int_equal(count_rows(f, run, "frames", "1"), 5); /* loss rank ent sp early */
    assert_int_equal(count_rows(f, run, "rollups", "1"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 1);
    put_range(f, run, &seq, 1, 700, 5, 97);
    verify_rollups(f->path, run, NULL);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE run_id = %lld AND text LIKE 'rollback to step %%'",
                        (long long)run),
                     6);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), seq);

    /* the other run is untouched */
    char *after = qs(f->path,
                     "SELECT group_concat(hex(data)) FROM (SELECT data FROM rollups WHERE metric_id IN "
                     "(SELECT id FROM metrics WHERE run_id = %lld) ORDER BY metric_id, level, block)",
                     (long long)other);
    assert_string_equal(before, after);
    free(before);
    free(after);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)other), 1500);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE run_id = %lld", (long long)other), 0);
    verify_rollups(f->path, other, NULL);
}

/* A run's rows as text, metric names instead of ids, for comparing two runs. */
static char *run_dump(struct tmp_db *f, int64_t run) {
    return qs(f->path,
              "SELECT (SELECT group_concat(x, ';') FROM (SELECT m.name || '@' || f.step || '=' || hex(f.data) AS x "
              "  FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.run_id = %lld ORDER BY m.name, f.step)) "
              "|| '|' || (SELECT group_concat(x, ';') FROM (SELECT m.name || '@' || a.level || '/' || a.block || '=' "
              "  || a.nframes || hex(a.data) AS x FROM rollups a JOIN metrics m ON m.id = a.metric_id "
              "  WHERE m.run_id = %lld ORDER BY m.name, a.level, a.block)) "
              "|| '|' || (SELECT group_concat(x, ';') FROM (SELECT m.name || '@' || a.step || '=' || hex(a.data) AS x "
              "  FROM abandoned_frames a JOIN metrics m ON m.id = a.metric_id JOIN branches b ON b.id = a.branch_id "
              "  WHERE b.run_id = %lld ORDER BY m.name, a.step)) "
              "|| '|' || (SELECT group_concat(step || ':' || seq, ';') FROM steps WHERE run_id = %lld) "
              "|| '|' || (SELECT group_concat(x, ';') FROM (SELECT m.name || '@' || l.step || '=' || hex(l.data) AS x "
              "  FROM latest l JOIN metrics m ON m.id = l.metric_id WHERE m.run_id = %lld ORDER BY m.name)) "
              "|| '|' || (SELECT last_step || ',' || last_seq FROM runs WHERE id = %lld) "
              "|| '|' || (SELECT group_concat(from_step || '-' || to_step, ';') FROM branches WHERE run_id = %lld)",
              (long long)run, (long long)run, (long long)run, (long long)run, (long long)run, (long long)run,
              (long long)run);
}

/* A rewind done in many small transactions (store_rewind with a small
 * budget, as the writer does) ends exactly where the whole one inside
 * store_step does; meanwhile each chunk moves at most its budget and the
 * run looks like a run at an earlier step (no frame above a missing one). */
static void test_rewind_chunked(void **state) {
    struct tmp_db *f = *state;
    int64_t whole = open_run(f, "whole", L, H), chunked = open_run(f, "chunked", L, H);
    int64_t sw = 0, sc = 0;
    put_range(f, whole, &sw, 0, 2100, 0, 300);
    put_range(f, chunked, &sc, 0, 2100, 0, 300);
    int64_t s600[] = {600};
    put_steps(f, whole, &sw, s600, 1, 1, 1);
    int chunks = 0, more;
    OK(store_begin(f->st));
    assert_int_equal(store_needs_rewind(f->st, chunked, 600), 1);
    assert_int_equal(store_needs_rewind(f->st, chunked, 2101), 0);
    store_rollback(f->st);
    do {
        int64_t before = qi(f->path, "SELECT count(*) FROM abandoned_frames");
        OK(store_begin(f->st));
        more = store_rewind(f->st, chunked, 600, 1e9 + 600, 50);
        assert_true(more >= 0);
        if (more) assert_int_equal(store_needs_rewind(f->st, chunked, 5000), 1); /* nothing new until done */
        OK(store_commit(f->st));
        /* the budget, overrun by at most one sealed block (moved whole) */
        assert_true(qi(f->path, "SELECT count(*) FROM abandoned_frames") - before <= 50 + FBLOCK_STEPS - 1);
        /* highest steps first: the steps left of each metric have no gap at the top */
        assert_int_equal(qi(f->path,
                            "SELECT count(*) FROM metrics m WHERE m.run_id = %lld AND (SELECT max(step) FROM frames "
                            "WHERE metric_id = m.id) - (SELECT min(step) FROM frames WHERE metric_id = m.id) + 1 "
                            "> (SELECT count(*) FROM frames WHERE metric_id = m.id) AND m.name IN ('loss','ent')",
                            (long long)chunked),
                         0);
        chunks++;
    } while (more);
    assert_true(chunks > 20);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rewinds"), 0);
    put_steps(f, chunked, &sc, s600, 1, 1, 1);
    char *a = run_dump(f, whole), *b = run_dump(f, chunked);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a, b);
    free(a);
    free(b);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE run_id = %lld", (long long)chunked), 1);
    verify_rollups(f->path, chunked, NULL);
}

/* Turns the rollups of db back into migration 8's: one row per (metric,
 * level, block) of all its cells, as the writer wrote them then
 * (rollup_encode), and no rollup_totals. */
static void rollups_to_v8(sqlite3 *db) {
    sqlite3_stmt *rs, *ins;
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TABLE rollups_old (metric_id INTEGER NOT NULL, level INTEGER NOT NULL, "
                                  "block INTEGER NOT NULL, nframes INTEGER NOT NULL, data BLOB NOT NULL, "
                                  "PRIMARY KEY (metric_id, level, block)) WITHOUT ROWID",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(
        sqlite3_prepare_v2(db,
                           "SELECT o.metric_id, o.level, o.block, o.nframes, o.data, "
                           "coalesce((SELECT CASE m.kind WHEN 2 THEN r.layers * r.heads WHEN 1 THEN r.layers "
                           "ELSE 1 END FROM metrics m JOIN runs r ON r.id = m.run_id WHERE m.id = o.metric_id), 0) "
                           "FROM rollups o WHERE chunk = 0",
                           -1, &rs, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO rollups_old VALUES (?1, ?2, ?3, ?4, ?5)", -1, &ins, NULL),
                     SQLITE_OK);
    while (sqlite3_step(rs) == SQLITE_ROW) {
        uint32_t n = (uint32_t)sqlite3_column_int64(rs, 5);
        int64_t mid = sqlite3_column_int64(rs, 0), block = sqlite3_column_int64(rs, 2),
                nf = sqlite3_column_int64(rs, 3);
        int level = sqlite3_column_int(rs, 1);
        for (int k = 0; k < 4; k++) sqlite3_bind_value(ins, k + 1, sqlite3_column_value(rs, k));
        unsigned char *row = NULL;
        if (n > ROLLUP_CHUNK_CELLS) {
            struct rollup_cell *cells = malloc(n * sizeof *cells);
            row = malloc(ROLLUP_MAX_BYTES(n));
            block_cells(db, mid, level, block, n, nf, cells);
            size_t len = rollup_encode(cells, n, (uint32_t)nf, row);
            sqlite3_bind_blob(ins, 5, row, (int)len, SQLITE_TRANSIENT);
            free(cells);
        } else {
            sqlite3_bind_value(ins, 5, sqlite3_column_value(rs, 4));
        }
        assert_int_equal(sqlite3_step(ins), SQLITE_DONE);
        sqlite3_reset(ins);
        free(row);
    }
    sqlite3_finalize(rs);
    sqlite3_finalize(ins);
    assert_int_equal(
        sqlite3_exec(db,
                     "DROP TABLE rollups; DROP TABLE rollup_totals; ALTER TABLE rollups_old RENAME TO rollups; "
                     "ALTER TABLE frames DROP COLUMN crc", /* migration 11's */
                     NULL, NULL, NULL),
        SQLITE_OK);
}

/* Turns the sealed blocks of the database at path back into raw frames
 * and its schema back to migration 5: a database as an entropyd before
 * compression left it. */
static void downgrade_to_raw(const char *path) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    rollups_to_v8(db);
    shadow_frames(db);
    assert_int_equal(sqlite3_exec(db,
                                  "DELETE FROM main.frames; INSERT INTO main.frames(metric_id, step, data) "
                                  "SELECT metric_id, step, data FROM temp.frames ORDER BY metric_id, step; "
                                  "DROP TABLE main.blocks; DROP TABLE main.block_chunks; DROP TABLE main.block_series; "
                                  "DELETE FROM main.id_seq WHERE name = 'block_series'; PRAGMA user_version = 5;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
}

/* query_frames' callback: the frames as text, in the order given. */
static int frames_text(void *ctx, int64_t step, const float *v, uint32_t n) {
    char **out = ctx;
    size_t len = *out ? strlen(*out) : 0;
    *out = realloc(*out, len + 32 + 9 * (size_t)n);
    assert_non_null(*out);
    len += (size_t)sprintf(*out + len, "%lld:", (long long)step);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        len += (size_t)sprintf(*out + len, "%08x,", u);
    }
    return 0;
}

/* Every frame of a run's metric through query_frames (query.h). */
static char *walk_metric(const char *path, int64_t run, const char *metric, uint32_t n) {
    char err[256], *out = NULL;
    struct query_pool *p = query_pool_open(path, 1, err, sizeof err);
    if (!p) fail_msg("%s", err);
    struct query *q = query_acquire(p, err, sizeof err);
    assert_non_null(q);
    int64_t id = qi(path, "SELECT id FROM metrics WHERE run_id = %lld AND name = %Q", (long long)run, metric);
    assert_int_equal(query_frames(q, id, n, 0, INT64_MAX, frames_text, &out, err, sizeof err), 0);
    query_release(p, q);
    query_pool_close(p);
    return out;
}

/* A database from before migration 6 (raw frames only) upgrades: its
 * frames stay raw and readable, blocks completed after it are sealed, and
 * every reader and the rewind see what a database written by this version
 * alone holds. */
static void test_upgrade_from_raw(void **state) {
    struct tmp_db *f = *state;
    int64_t old = open_run(f, "old", L, H), so = 0, sr = 0;
    put_range(f, old, &so, 0, 299, 0, 100);
    store_close(f->st);
    downgrade_to_raw(f->path);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM sqlite_master WHERE name = 'blocks'"), 0);
    char err[256];
    f->st = store_open(f->path, err, sizeof err);
    if (!f->st) fail_msg("%s", err);
    assert_int_equal(qi(f->path, "PRAGMA user_version"), store_schema_version());
    int64_t ref = open_run(f, "ref", L, H);
    put_range(f, old, &so, 300, 700, 0, 100);
    put_range(f, ref, &sr, 0, 700, 0, 100);
    assert_int_equal(count_rows(f, old, "main.frames", "step < 256"), 256 * 3 + 52 + 256); /* loss rank ent sp early */
    assert_int_equal(count_rows(f, old, SEALED, "block < 4"), 0);
    assert_true(count_rows(f, old, SEALED, "block >= 4") > 0);
    assert_true(count_rows(f, ref, SEALED, "block < 4") > 0);
    char *a, *b;
    static const struct {
        const char *name;
        uint32_t n;
    } ms[] = {{"loss", 1}, {"rank", L}, {"ent", L * H}, {"sp", 1}};
    for (size_t i = 0; i < 4; i++) {
        a = walk_metric(f->path, old, ms[i].name, ms[i].n);
        b = walk_metric(f->path, ref, ms[i].name, ms[i].n);
        assert_non_null(a);
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    verify_rollups(f->path, old, NULL);
    /* a rollback into the raw part, and one into the sealed part */
    int64_t back[] = {450, 100};
    for (int i = 0; i < 2; i++) {
        put_steps(f, old, &so, &back[i], 1, 1 + i, 1);
        put_steps(f, ref, &sr, &back[i], 1, 1 + i, 1);
        a = run_dump(f, old); /* (NULL before a branch exists) */
        b = run_dump(f, ref);
        assert_non_null(a);
        assert_non_null(b);
        assert_string_equal(a, b);
        free(a);
        free(b);
        verify_rollups(f->path, old, NULL);
    }
}


/* ------------------------------------------------------------ block rows, chunk by chunk */

enum { WL = 5, WH = 7, WN = WL * WH }; /* 35 cells: chunks of 16, 16 and 3 */

/* The value of cell c of run salt's "wide" metric at step: its bits say
 * which run, step and cell it is, so a reader that takes a chunk or a
 * block for another one gives it away. */
static float wide_value(int salt, int64_t step, uint32_t c) {
    uint32_t u = 0x3f800000u ^ (uint32_t)salt << 22 ^ (uint32_t)step << 6 ^ c;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Stores steps [from, to] of the wide metric of run (values wide_value(salt, ...)). */
static void wide_steps(struct tmp_db *f, int64_t run, int64_t *seq, int salt, int64_t from, int64_t to) {
    float v[WN];
    OK(store_begin(f->st));
    for (int64_t st = from; st <= to; st++) {
        for (uint32_t c = 0; c < WN; c++) v[c] = wide_value(salt, st, c);
        struct proto_msg m;
        msg_step(&m, st);
        msg_add(&m, "wide", PROTO_HEAD, WL, WH, v);
        assert_int_equal(store_step(f->st, run, ++*seq, &m, 1e9 + (double)st, NULL, 0), 0);
        proto_msg_free(&m);
    }
    OK(store_commit(f->st));
}

/* Walks the wide metric of run through fblock_rows (cells [c0, c1) of
 * sealed blocks, both tables), ascending or descending, and checks every
 * value read is the one stored for that run, step and cell, that the
 * other cells are left alone, and that the blocks come in order; returns
 * how many blocks it read. */
static int64_t wide_check(const char *path, int64_t run, int salt, uint32_t c0, uint32_t c1, int desc) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    struct fblock_codec *codec = fblock_codec_create();
    struct fblock_rows *r = fblock_rows_open(db, codec);
    assert_non_null(r);
    int64_t mid = qi(path, "SELECT id FROM metrics WHERE run_id = %lld AND name = 'wide'", (long long)run);
    static float vals[FBLOCK_STEPS * WN];
    int64_t block, prev = desc ? INT64_MAX : -1, nblocks = 0, steps[FBLOCK_STEPS];
    uint64_t mask;
    assert_int_equal(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    fblock_rows_walk(r, mid, 0, INT64_MAX, desc, WN, c0, c1);
    for (;;) {
        for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) vals[i] = -1.0f;
        int got = fblock_rows_next(r, &block, &mask, vals);
        assert_true(got >= 0);
        if (!got) break;
        assert_true(desc ? block < prev : block > prev);
        prev = block;
        nblocks++;
        uint32_t nf = fblock_steps(block, mask, steps);
        for (uint32_t fr = 0; fr < nf; fr++)
            for (uint32_t c = 0; c < WN; c++) {
                float want = c >= c0 && c < c1 ? wide_value(salt, steps[fr], c) : -1.0f;
                if (memcmp(&vals[fr * WN + c], &want, 4))
                    fail_msg("run %lld cells [%u, %u): step %lld cell %u reads %a, not %a", (long long)run, c0, c1,
                             (long long)steps[fr], c, (double)vals[fr * WN + c], (double)want);
            }
    }
    fblock_rows_end(r);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    fblock_rows_close(r);
    fblock_codec_destroy(codec);
    sqlite3_close(db);
    return nblocks;
}

/* Checks the wide metric of both runs, over cell ranges within a chunk,
 * across chunk edges, the last (short) chunk and all cells, both ways;
 * every range reads `blocks` blocks. */
static void wide_check_all(const char *path, const int64_t *runs, int64_t blocks) {
    static const uint32_t ranges[][2] = {{0, 1}, {5, 6}, {15, 17}, {16, 32}, {31, 33}, {32, 35}, {34, 35}, {0, WN}};
    for (int i = 0; i < 2; i++)
        for (size_t k = 0; k < sizeof ranges / sizeof *ranges; k++)
            for (int desc = 0; desc < 2; desc++)
                assert_int_equal(wide_check(path, runs[i], i + 1, ranges[k][0], ranges[k][1], desc), blocks);
}

/* Every frame of run's wide metric through query_frames equals what was
 * stored, steps 0..last, in order. */
static void wide_frames_check(const char *path, int64_t run, int salt, int64_t last) {
    char *got = walk_metric(path, run, "wide", WN), *want = NULL;
    assert_non_null(got);
    for (int64_t st = 0; st <= last; st++) {
        float v[WN];
        for (uint32_t c = 0; c < WN; c++) v[c] = wide_value(salt, st, c);
        frames_text(&want, st, v, WN);
    }
    assert_string_equal(got, want);
    free(got);
    free(want);
}

/* Migration 8's rows turned back into migration 6's (one format-2 row a
 * block in `blocks`) and the schema back to migration 7: a database as
 * the entropyd before migration 8 left it. */
static void downgrade_to_7(const char *path) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    struct fblock_codec *codec = fblock_codec_create();
    struct fblock_rows *r = fblock_rows_open(db, codec);
    sqlite3_stmt *ms, *ins;
    assert_int_equal(
        sqlite3_prepare_v2(db,
                           "SELECT s.metric_id, max(1, r.layers * (CASE m.kind WHEN 0 THEN 0 ELSE 1 END) * "
                           "(CASE m.kind WHEN 2 THEN r.heads ELSE 1 END)) FROM block_series s JOIN metrics m "
                           "ON m.id = s.metric_id JOIN runs r ON r.id = m.run_id",
                           -1, &ms, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO blocks(metric_id, block, mask, data) VALUES (?1, ?2, ?3, ?4)",
                                        -1, &ins, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    rollups_to_v8(db);
    float *vals = NULL;
    while (sqlite3_step(ms) == SQLITE_ROW) {
        int64_t mid = sqlite3_column_int64(ms, 0), block;
        uint32_t n = (uint32_t)sqlite3_column_int64(ms, 1);
        uint64_t mask;
        vals = realloc(vals, (size_t)n * FBLOCK_STEPS * sizeof *vals);
        fblock_rows_walk(r, mid, 0, INT64_MAX, 0, n, 0, n);
        while (fblock_rows_next(r, &block, &mask, vals) == 1) {
            const unsigned char *blob;
            size_t len;
            assert_int_equal(fblock_encode(codec, vals, fblock_count(mask), n, &blob, &len), 0);
            sqlite3_bind_int64(ins, 1, mid);
            sqlite3_bind_int64(ins, 2, block);
            sqlite3_bind_int64(ins, 3, (int64_t)mask);
            sqlite3_bind_blob(ins, 4, blob, (int)len, SQLITE_TRANSIENT);
            assert_int_equal(sqlite3_step(ins), SQLITE_DONE);
            sqlite3_reset(ins);
        }
        fblock_rows_end(r);
    }
    free(vals);
    sqlite3_finalize(ms);
    sqlite3_finalize(ins);
    fblock_rows_close(r);
    fblock_codec_destroy(codec);
    assert_int_equal(sqlite3_exec(db,
                                  "DROP TABLE block_chunks; DROP TABLE block_series; DELETE FROM id_seq "
                                  "WHERE name = 'block_series'; COMMIT; PRAGMA user_version = 7;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
}

/* Blocks of metrics wider than a chunk, one row per (metric, chunk,
 * block): a reader of any cells gets the values of its own run, step and
 * cell (the chunks of two metrics, whose series are neighbours, never
 * mixed up); an upgraded database's format-2 rows and the new rows read
 * as one; a rewind and a delete take their own run's chunks only. */
static void test_block_chunks(void **state) {
    struct tmp_db *f = *state;
    int64_t runs[2] = {open_run(f, "wide-a", WL, WH), open_run(f, "wide-b", WL, WH)}, seq[2] = {0, 0};
    for (int64_t at = 0; at < 300; at += 50)
        for (int i = 0; i < 2; i++) wide_steps(f, runs[i], &seq[i], i + 1, at, at + 49); /* interleaved */
    /* steps 0..255 sealed: 4 blocks of 3 chunks each, per run */
    assert_int_equal(count_rows(f, runs[0], SEALED, "1"), 4);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM block_chunks"), 2 * 4 * 3);
    wide_check_all(f->path, runs, 4);
    for (int i = 0; i < 2; i++) wide_frames_check(f->path, runs[i], i + 1, 299);

    /* the same database as migration 7 left it: blocks 0..3 in `blocks` */
    store_close(f->st);
    downgrade_to_7(f->path);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM blocks"), 8);
    char err[256];
    if (!(f->st = store_open(f->path, err, sizeof err))) fail_msg("%s", err);
    assert_int_equal(qi(f->path, "PRAGMA user_version"), store_schema_version());
    for (int i = 0; i < 2; i++) wide_steps(f, runs[i], &seq[i], i + 1, 300, 700);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM blocks"), 8);               /* never rewritten */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM block_chunks"), 2 * 6 * 3); /* blocks 4..9 */
    wide_check_all(f->path, runs, 10);
    for (int i = 0; i < 2; i++) wide_frames_check(f->path, runs[i], i + 1, 700);

    /* run a back to step 100 (into a format-2 block), and on again */
    int64_t back = 100;
    wide_steps(f, runs[0], &seq[0], 1, back, 400);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM abandoned_frames"), 601);
    wide_frames_check(f->path, runs[0], 1, 400);
    wide_frames_check(f->path, runs[1], 2, 700);
    assert_int_equal(wide_check(f->path, runs[0], 1, 16, 32, 0), 6); /* blocks 0 (format 2), 1..5 */
    assert_int_equal(wide_check(f->path, runs[1], 2, 16, 32, 1), 10);

    /* deleting run a leaves run b's chunks whole */
    OK(store_begin(f->st));
    OK(store_run_delete(f->st, runs[0]));
    OK(store_commit(f->st));
    int more;
    do {
        OK(store_begin(f->st));
        more = store_purge(f->st, 100);
        assert_true(more >= 0);
        OK(store_commit(f->st));
    } while (more);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM blocks"), 4);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM block_chunks"), 6 * 3);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM block_series"), 1);
    for (uint32_t c0 = 0; c0 < WN; c0 += 4) assert_int_equal(wide_check(f->path, runs[1], 2, c0, c0 + 1, 0), 10);
    wide_frames_check(f->path, runs[1], 2, 700);
}

/* ------------------------------------------------------------ checksums */

/* Flips bit `bit` of byte `off` of the blob column `col` of the one row of
 * `table` that `where` selects, through SQLite (as a bit flip on disk
 * would change the stored value): returns the blob's length. off -1 only
 * measures. */
static int flip_blob(const char *path, const char *table, const char *col, const char *where, int off, int bit) {
    sqlite3 *db;
    sqlite3_stmt *s;
    char sql[300];
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    snprintf(sql, sizeof sql, "SELECT %s FROM %s WHERE %s", col, table, where);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    int len = sqlite3_column_bytes(s, 0);
    unsigned char *b = malloc((size_t)len + 1);
    memcpy(b, sqlite3_column_blob(s, 0), (size_t)len);
    sqlite3_finalize(s);
    if (off >= 0) {
        assert_true(off < len);
        b[off] ^= (unsigned char)(1u << bit);
        snprintf(sql, sizeof sql, "UPDATE %s SET %s = ?1 WHERE %s", table, col, where);
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
        sqlite3_bind_blob(s, 1, b, len, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(s), SQLITE_DONE);
        assert_int_equal(sqlite3_changes(db), 1);
        sqlite3_finalize(s);
    }
    free(b);
    sqlite3_close(db);
    return len;
}

/* Fails unless err names the run, the metric and the steps and says the
 * checksum failed. */
static void expect_named(const char *err, int64_t run, const char *steps) {
    char want[64];
    snprintf(want, sizeof want, "run %lld, metric \"ent\"", (long long)run);
    if (!strstr(err, want) || !strstr(err, steps) || !strstr(err, "checksum"))
        fail_msg("error does not name run %lld, metric ent, %s and the checksum: %s", (long long)run, steps, err);
}

/* entropyd --check's report of the database at path: its status, and
 * its text in *text (malloc'd). */
static int check_report(const char *path, char **text) {
    size_t len;
    FILE *out = open_memstream(text, &len);
    int rc = integrity_check(path, out, stderr);
    fclose(out);
    return rc;
}

/* A flipped bit in a block chunk's blob (each bit position of every byte
 * in turn), its mask or its rowid, or in a rollup row, is never read as
 * other numbers: the frame, frames and series queries answer QUERY_ERR
 * naming run, metric and steps, the count of integrity errors grows, and
 * integrity_check lists the row. A row without a checksum (written before
 * migration 11) is read as before. */
static void test_checksums_reported(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "crc", L, H), seq = 0;
    put_range(f, run, &seq, 0, 299, 0, 100); /* blocks 0..3 sealed, 256..299 raw */
    int64_t ent = qi(f->path, "SELECT id FROM metrics WHERE run_id = %lld AND name = 'ent'", (long long)run);
    int64_t id1 = qi(f->path,
                     "SELECT id FROM block_chunks WHERE id & 67108863 = 1 AND id >> 26 = "
                     "(SELECT base FROM block_series WHERE metric_id = %lld)",
                     (long long)ent);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM block_chunks WHERE crc IS NULL"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups WHERE crc IS NULL"), 0);
    char err[256], *text = NULL, where[128], rwhere[128];
    snprintf(where, sizeof where, "id = %lld", (long long)id1);
    snprintf(rwhere, sizeof rwhere, "metric_id = %lld AND level = 1 AND block = 2", (long long)ent);
    assert_int_equal(check_report(f->path, &text), 0);
    assert_non_null(strstr(text, "no damage"));
    free(text);

    struct query_pool *p = query_pool_open(f->path, 1, err, sizeof err);
    if (!p) fail_msg("%s", err);
    struct query *q = query_acquire(p, err, sizeof err);
    assert_non_null(q);
    struct strbuf clean = {0}, sb = {0};
    struct query_series_req req = {.run_id = run, .metric = "ent", .layer = -1, .head = -1, .points = 4};
    assert_int_equal(query_series(q, &req, &clean, NULL, err, sizeof err), QUERY_OK);
    uint64_t errors0 = integrity_errors();

    /* every bit of the chunk's blob, one at a time (a bit per byte cycled) */
    int len = flip_blob(f->path, "block_chunks", "data", where, -1, 0);
    assert_true(len > 8);
    for (int off = 0; off < len; off++) {
        flip_blob(f->path, "block_chunks", "data", where, off, off % 8);
        sb.len = 0;
        int rc = query_frame(q, run, "ent", 1, 70, &sb, err, sizeof err);
        if (rc != QUERY_ERR) fail_msg("byte %d of block 1 flipped: the frame at step 70 answered %d", off, rc);
        expect_named(err, run, "steps 64..127");
        flip_blob(f->path, "block_chunks", "data", where, off, off % 8);
    }
    assert_true(integrity_errors() >= errors0 + (uint64_t)len);
    sb.len = 0;
    assert_int_equal(query_frame(q, run, "ent", 1, 70, &sb, err, sizeof err), QUERY_OK); /* restored */

    /* the mask (which steps the frames are), and the rowid (which block) */
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    char sql[200];
    snprintf(sql, sizeof sql, "UPDATE block_chunks SET mask = (mask | 4) - (mask & 4) WHERE %s", where);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sb.len = 0;
    assert_int_equal(query_frame(q, run, "ent", 1, 70, &sb, err, sizeof err), QUERY_ERR);
    expect_named(err, run, "steps 64..127");
    char *out = NULL;
    assert_int_equal(query_frames(q, ent, L * H, 0, INT64_MAX, frames_text, &out, err, sizeof err), QUERY_ERR);
    /* query_frames knows the metric by id only (remote write names the run) */
    if (!strstr(err, "steps 64..127") || !strstr(err, "checksum")) fail_msg("query_frames: %s", err);
    free(out);
    out = NULL;
    assert_int_equal(check_report(f->path, &text), 1);
    if (!strstr(text, "damaged: run ") || !strstr(text, "metric \"ent\" steps 64..127: block chunk 0") ||
        !strstr(text, "checksum mismatch"))
        fail_msg("--check did not name the block: %s", text);
    free(text);
    snprintf(sql, sizeof sql, "UPDATE block_chunks SET mask = (mask | 4) - (mask & 4) WHERE %s", where);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    /* block 3 moved to block 4 (a flipped bit of its key) */
    snprintf(sql, sizeof sql, "UPDATE block_chunks SET id = id + 1 WHERE id = %lld", (long long)(id1 + 2));
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(query_frames(q, ent, L * H, 0, INT64_MAX, frames_text, &out, err, sizeof err), QUERY_ERR);
    free(out);
    out = NULL;
    if (!strstr(err, "steps 256..319") || !strstr(err, "checksum")) fail_msg("moved block: %s", err);
    snprintf(sql, sizeof sql, "UPDATE block_chunks SET id = id - 1 WHERE id = %lld", (long long)(id1 + 3));
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);

    /* a raw frame of the open block */
    char fwhere[96];
    snprintf(fwhere, sizeof fwhere, "metric_id = %lld AND step = 270", (long long)ent);
    flip_blob(f->path, "frames", "data", fwhere, 5, 2);
    sb.len = 0;
    assert_int_equal(query_frame(q, run, "ent", 1, 270, &sb, err, sizeof err), QUERY_ERR);
    expect_named(err, run, "steps 270..270");
    assert_int_equal(check_report(f->path, &text), 1);
    if (!strstr(text, "steps 270..270: raw frame: checksum mismatch")) fail_msg("--check: %s", text);
    free(text);
    flip_blob(f->path, "frames", "data", fwhere, 5, 2);

    /* a rollup row: every byte of it in turn */
    len = flip_blob(f->path, "rollups", "data", rwhere, -1, 0);
    for (int off = 0; off < len; off++) {
        flip_blob(f->path, "rollups", "data", rwhere, off, (off + 3) % 8);
        sb.len = 0;
        int rc = query_series(q, &req, &sb, NULL, err, sizeof err);
        if (rc != QUERY_ERR)
            fail_msg("byte %d of the level-1 rollup of block 2 flipped: the series answered %d", off, rc);
        expect_named(err, run, "steps 128..191");
        flip_blob(f->path, "rollups", "data", rwhere, off, (off + 3) % 8);
    }
    /* a row without a checksum is read as before migration 11 */
    snprintf(sql, sizeof sql, "UPDATE rollups SET crc = NULL WHERE %s", rwhere);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sb.len = 0;
    assert_int_equal(query_series(q, &req, &sb, NULL, err, sizeof err), QUERY_OK);
    assert_true(sb.len == clean.len && memcmp(sb.p, clean.p, clean.len) == 0);
    assert_int_equal(check_report(f->path, &text), 0);
    free(text);

    /* a damaged level-1 row pooled into level 2: the level-2 row reads as
     * damaged too, never as a summary without the row */
    flip_blob(f->path, "rollups", "data", rwhere, 0, 1);
    snprintf(sql, sizeof sql, "UPDATE rollups SET crc = 1 WHERE %s", rwhere);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    put_range(f, run, &seq, 300, 600, 0, 100);
    req.points = 1;
    sb.len = 0;
    assert_int_equal(query_series(q, &req, &sb, NULL, err, sizeof err), QUERY_ERR);
    expect_named(err, run, "steps 0..511");
    assert_int_equal(check_report(f->path, &text), 1);
    if (!strstr(text, "steps 128..191: level-1 rollup, chunk 0: checksum mismatch") ||
        !strstr(text, "steps 0..511: level-2 rollup, chunk 0: pooled from a damaged row"))
        fail_msg("--check: %s", text);
    free(text);
    free(sb.p);
    free(clean.p);
    query_release(p, q);
    query_pool_close(p);
}

/* A stored row whose size does not fit its metric's shape (a raw frame,
 * a rollup) is reported: query_frames, the frame and the series queries
 * answer QUERY_ERR naming it, never a silent gap in the data. */
static void test_corrupt_frame_reported(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "bad", L, H), seq = 0;
    put_range(f, run, &seq, 0, 99, 0, 100);
    int64_t ent = qi(f->path, "SELECT id FROM metrics WHERE run_id = %lld AND name = 'ent'", (long long)run);
    char *before = walk_metric(f->path, run, "ent", L * H);
    assert_non_null(before);
    free(before);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    char sql[200];
    snprintf(sql, sizeof sql,
             "UPDATE frames SET data = substr(data, 1, 8), crc = NULL WHERE metric_id = %lld AND step = 70",
             (long long)ent);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_changes(db), 1);
    char err[256], *out = NULL;
    struct query_pool *p = query_pool_open(f->path, 1, err, sizeof err);
    if (!p) fail_msg("%s", err);
    struct query *q = query_acquire(p, err, sizeof err);
    assert_non_null(q);
    assert_int_equal(query_frames(q, ent, L * H, 0, INT64_MAX, frames_text, &out, err, sizeof err), QUERY_ERR);
    assert_non_null(strstr(err, "at step 70 has 8 bytes"));
    free(out);
    struct strbuf sb = {0};
    assert_int_equal(query_frame(q, run, "ent", 1, 70, &sb, err, sizeof err), QUERY_ERR);
    assert_non_null(strstr(err, "at step 70 has 8 bytes"));
    struct query_series_req req = {.run_id = run, .metric = "ent", .layer = -1, .head = -1, .points = 1000};
    assert_int_equal(query_series(q, &req, &sb, NULL, err, sizeof err), QUERY_ERR);
    assert_non_null(strstr(err, "at step 70 has 8 bytes"));
    /* frames before the bad one still read; a bad rollup is named too */
    assert_int_equal(query_frame(q, run, "ent", 1, 69, &sb, err, sizeof err), QUERY_OK);
    snprintf(sql, sizeof sql, "UPDATE frames SET data = zeroblob(%d), crc = NULL WHERE metric_id = %lld AND step = 70",
             L * H * 4, (long long)ent);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    snprintf(sql, sizeof sql, "UPDATE rollups SET data = x'00' WHERE metric_id = %lld AND level = 1 AND block = 0",
             (long long)ent);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_changes(db), 1);
    req.points = 1;
    assert_int_equal(query_series(q, &req, &sb, NULL, err, sizeof err), QUERY_ERR);
    assert_non_null(strstr(err, "level-1 rollup"));
    free(sb.p);
    sqlite3_close(db);
    query_release(p, q);
    query_pool_close(p);
}

static void test_kind_conflict(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "kinds", L, H);
    struct proto_msg m;
    float one = 1, lay[L] = {2, 3}, heads[L * H] = {1, 2, 3, 4, 5, 6};
    msg_step(&m, 0);
    msg_add(&m, "x", PROTO_SCALAR, 1, 1, &one);
    msg_add(&m, "r", PROTO_LAYER, L, 1, lay);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, run, 1, &m, 10, NULL, 0), 0);
    proto_msg_free(&m);
    /* x as a layer metric, y new, r as a head metric */
    msg_step(&m, 1);
    msg_add(&m, "y", PROTO_SCALAR, 1, 1, &one);
    msg_add(&m, "x", PROTO_LAYER, L, 1, lay);
    msg_add(&m, "r", PROTO_HEAD, L, H, heads);
    char conflict[PROTO_MAX_NAME + 1] = "";
    assert_int_equal(store_step(f->st, run, 2, &m, 11, conflict, sizeof conflict), 1);
    assert_string_equal(conflict, "x"); /* the first one */
    proto_msg_free(&m);
    OK(store_commit(f->st));
    assert_int_equal(
        qi(f->path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'x'"), 1);
    assert_int_equal(
        qi(f->path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'r'"), 1);
    assert_int_equal(
        qi(f->path,
           "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'y' AND step = 1"),
        1);
    assert_int_equal(qi(f->path, "SELECT kind FROM metrics WHERE name = 'x'"), 0);
    assert_int_equal(qi(f->path, "SELECT kind FROM metrics WHERE name = 'r'"), 1);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM metrics WHERE run_id = %lld", (long long)run), 3);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 2);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), 2);
    /* a conflict only: no name buffer is fine; the same after the cache is dropped */
    store_close(f->st);
    char err[256];
    f->st = store_open(f->path, err, sizeof err);
    assert_non_null(f->st);
    msg_step(&m, 2);
    msg_add(&m, "y", PROTO_HEAD, L, H, heads);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, run, 3, &m, 12, NULL, 0), 1);
    OK(store_commit(f->st));
    proto_msg_free(&m);
    assert_int_equal(
        qi(f->path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'y'"), 1);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), 3);
    /* a layer metric with another length is refused the same way */
    float five[5] = {1, 2, 3, 4, 5};
    msg_step(&m, 3);
    msg_add(&m, "r", PROTO_LAYER, 5, 1, five);
    OK(store_begin(f->st));
    conflict[0] = 0;
    assert_int_equal(store_step(f->st, run, 4, &m, 13, conflict, sizeof conflict), 1);
    assert_string_equal(conflict, "r");
    OK(store_commit(f->st));
    proto_msg_free(&m);
    assert_int_equal(
        qi(f->path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'r'"), 1);
    /* the same name in another run is independent */
    int64_t run2 = open_run(f, "kinds2", L, H);
    msg_step(&m, 0);
    msg_add(&m, "x", PROTO_HEAD, L, H, heads);
    OK(store_begin(f->st));
    assert_int_equal(store_step(f->st, run2, 1, &m, 14, NULL, 0), 0);
    OK(store_commit(f->st));
    proto_msg_free(&m);
}

static void test_events_and_status(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "ev", L, H);
    int64_t run2 = open_run(f, "ev2", L, H);
    int64_t run3 = open_run(f, "ev3", L, H);
    OK(store_begin(f->st));
    OK(store_event(f->st, run, 1, 100.5, PROTO_WARN, "lr spike: \"x\" \xe2\x82\xac\nnext line"));
    OK(store_event(f->st, run, 0, 101, PROTO_INFO, "daemon note"));
    OK(store_event(f->st, run, 2, 102, PROTO_ERROR, ""));
    OK(store_commit(f->st));
    char *s = qs(f->path,
                 "SELECT group_concat(coalesce(seq,'NULL') || ',' || time || ',' || level || ',' || text, ';') FROM "
                 "(SELECT * FROM events WHERE run_id = %lld ORDER BY id)",
                 (long long)run);
    assert_string_equal(
        s, "1,100.5,warn,lr spike: \"x\" \xe2\x82\xac\nnext line;NULL,101.0,info,daemon note;2,102.0,error,");
    free(s);
    assert_int_equal(store_run_last_seq(f->st, run), 2);
    assert_true(qd(f->path, "SELECT updated FROM runs WHERE name = %Q", "ev") == 102);
    /* a daemon event does not move last_seq */
    OK(store_begin(f->st));
    OK(store_event(f->st, run, 0, 103, PROTO_INFO, "x"));
    OK(store_commit(f->st));
    assert_int_equal(store_run_last_seq(f->st, run), 2);

    /* status: end with a seq advances last_seq; stale (seq 0) does not */
    OK(store_begin(f->st));
    OK(store_run_status(f->st, run, PROTO_FINISHED, 3, 200));
    OK(store_run_status(f->st, run2, PROTO_STALE, 0, 201));
    OK(store_commit(f->st));
    s = qs(
        f->path,
        "SELECT group_concat(name || ':' || status || ':' || last_seq || ':' || updated, ' ') FROM (SELECT * FROM runs ORDER BY id)");
    assert_string_equal(s, "ev:finished:3:200.0 ev2:stale:0:201.0 ev3:live:0:1000.0");
    free(s);
    static const int sts[] = {PROTO_FAILED, PROTO_ABORTED, PROTO_LIVE};
    static const char *const names[] = {"failed", "aborted", "live"};
    for (int i = 0; i < 3; i++) {
        OK(store_begin(f->st));
        OK(store_run_status(f->st, run2, sts[i], 0, 300 + i));
        OK(store_commit(f->st));
        s = qs(f->path, "SELECT status FROM runs WHERE id = %lld", (long long)run2);
        assert_string_equal(s, names[i]);
        free(s);
    }
    /* at start, runs left live become stale */
    assert_int_equal(store_mark_live_stale(f->st, 400), 2); /* ev2 and ev3 */
    s = qs(f->path, "SELECT group_concat(status, ' ') FROM (SELECT * FROM runs ORDER BY id)");
    assert_string_equal(s, "finished stale stale");
    free(s);
    assert_true(qd(f->path, "SELECT updated FROM runs WHERE name = %Q", "ev3") == 400);
    assert_int_equal(store_mark_live_stale(f->st, 401), 0);
    (void)run3;
}

static void test_delete(void **state) {
    struct tmp_db *f = *state;
    int64_t b = open_run(f, "survivor", L, H);
    int64_t a = open_run(f, "doomed", L, H); /* the highest id: SQLite hands it out again */
    int64_t sa = 0, sb = 0;
    put_range(f, a, &sa, 0, 700, 0, 100);
    put_range(f, b, &sb, 0, 700, 0, 100);
    OK(store_begin(f->st));
    OK(store_event(f->st, a, ++sa, 1, PROTO_INFO, "a"));
    OK(store_event(f->st, b, ++sb, 1, PROTO_INFO, "b"));
    OK(store_commit(f->st));
    assert_true(count_rows(f, a, "rollups", "1") > 0);

    OK(store_begin(f->st));
    OK(store_run_delete(f->st, a));
    OK(store_commit(f->st));
    assert_int_equal(qi(f->path, "SELECT count(*) FROM runs WHERE id = %lld", (long long)a), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM metrics WHERE run_id = %lld", (long long)a), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM latest WHERE metric_id NOT IN (SELECT id FROM metrics)"), 0);
    /* the bulk goes in bounded chunks, each its own transaction */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)a), 701);
    int chunks = 0, more;
    do {
        int64_t before = qi(f->path, "SELECT (SELECT count(*) FROM frames) + (SELECT count(*) FROM rollups)");
        OK(store_begin(f->st));
        more = store_purge(f->st, 100);
        assert_true(more >= 0);
        OK(store_commit(f->st));
        int64_t after = qi(f->path, "SELECT (SELECT count(*) FROM frames) + (SELECT count(*) FROM rollups)");
        assert_true(before - after <= 100);
        chunks++;
    } while (more);
    assert_true(chunks > 10); /* 701 steps x its metrics: many chunks of 100 */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM purge"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)a), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE run_id = %lld", (long long)a), 0);
    /* no orphans */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM frames WHERE metric_id NOT IN (SELECT id FROM metrics)"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups WHERE metric_id NOT IN (SELECT id FROM metrics)"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id NOT IN (SELECT id FROM runs)"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE run_id NOT IN (SELECT id FROM runs)"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)b), 701);
    verify_rollups(f->path, b, NULL);
    assert_int_equal(store_run_last_seq(f->st, a), -1);
    /* the survivor goes on; a new run of the same name starts clean, under a new id */
    put_range(f, b, &sb, 701, 800, 0, 100);
    int64_t c = open_run(f, "doomed", L, H);
    struct store_run_info info;
    OK(store_begin(f->st));
    OK(store_run_open(f->st, "doomed", L, H, 64, NULL, 1, &info));
    OK(store_commit(f->st));
    assert_int_equal(info.last_seq, 0);
    assert_int_equal(info.id, c);
    assert_true(c > a); /* ids are never reused (migration 3): old links cannot point at the new run */
    int64_t sc = 0;
    put_range(f, c, &sc, 0, 200, 1, 50);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)c), 201);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)c), 201);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE run_id = %lld", (long long)c),
                     0); /* no rewrite event */
    verify_rollups(f->path, c, NULL);
    verify_rollups(f->path, b, NULL);
    /* deleting a run that is gone: errcode -3 */
    OK(store_begin(f->st));
    assert_int_equal(store_run_delete(f->st, 424242), -1);
    assert_int_equal(store_errcode(f->st), STORE_ENORUN);
    store_rollback(f->st);
}

/* Runs store_retain_raw passes of `budget` until one completes; returns
 * the chunks it took. */
static int retain_all(struct tmp_db *f, int64_t keep_steps, double keep_s, int64_t budget) {
    int64_t cursor = 0;
    int chunks = 0, more;
    do {
        OK(store_begin(f->st));
        more = store_retain_raw(f->st, keep_steps, keep_s, 1e9 + 10000, &cursor, budget);
        assert_true(more >= 0);
        OK(store_commit(f->st));
        chunks++;
    } while (more);
    assert_int_equal(cursor, 0);
    return chunks;
}

static void test_retain_raw(void **state) {
    struct tmp_db *f = *state;
    int64_t a = open_run(f, "long", L, H), b = open_run(f, "short", L, H), sa = 0, sb = 0;
    put_range(f, a, &sa, 0, 700, 0, 100); /* step s at time 1e9 + s */
    put_range(f, b, &sb, 0, 300, 0, 100);
    int64_t rollups = qi(f->path, "SELECT count(*) FROM rollups"), steps = qi(f->path, "SELECT count(*) FROM steps");
    /* the last 200 steps: run a keeps 501.. (blocks from 7 on), run b 101.. (from 1) */
    assert_true(retain_all(f, 200, 0, 64) > 3); /* in chunks */
    assert_int_equal(count_rows(f, a, SEALED, "block < 7"), 0);
    assert_true(count_rows(f, a, SEALED, "block = 7") > 0);
    assert_int_equal(count_rows(f, b, SEALED, "block < 1"), 0);
    assert_true(count_rows(f, b, SEALED, "block = 1") > 0);
    /* rollups, steps and the open blocks' raw frames all stay */
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups"), rollups);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps"), steps);
    assert_true(count_rows(f, a, "frames", "step >= 640") > 0);
    /* by time: now (1e9 + 10000) - 9350 s keeps the steps at 1e9 + 650 on:
     * run a from block 10 (its open one), run b none but its open block */
    retain_all(f, 0, 9350, 1 << 20);
    assert_int_equal(count_rows(f, a, SEALED, "1"), 0);
    assert_int_equal(count_rows(f, b, SEALED, "1"), 0);
    assert_int_equal(count_rows(f, a, "frames", "step < 640"), 0);
    assert_true(count_rows(f, a, "frames", "step >= 640") > 0);
    assert_true(count_rows(f, b, "frames", "step >= 256") > 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups"), rollups);
    /* the runs go on: new blocks seal over what was cut */
    put_range(f, a, &sa, 701, 800, 0, 100);
    assert_true(count_rows(f, a, SEALED, "block = 10") > 0);
    assert_int_equal(qi(f->path,
                        "SELECT count(DISTINCT block) FROM rollups WHERE level = 1 AND metric_id IN "
                        "(SELECT id FROM metrics WHERE run_id = %lld)",
                        (long long)a),
                     12);
}

static void test_savepoint(void **state) {
    struct tmp_db *f = *state;
    int64_t run = open_run(f, "sp", L, H);
    int64_t seq = 0;
    put_range(f, run, &seq, 0, 60, 0, 100);
    struct proto_msg m;
    OK(store_begin(f->st));
    /* message 1: kept */
    OK(store_savepoint(f->st));
    build_step(&m, 61, 0);
    assert_int_equal(store_step(f->st, run, ++seq, &m, 1, NULL, 0), 0);
    proto_msg_free(&m);
    OK(store_release(f->st));
    /* message 2: crosses a block boundary, adds a metric and an event; undone */
    OK(store_savepoint(f->st));
    build_step(&m, 64, 7);
    float z = 5;
    msg_add(&m, "zzz", PROTO_SCALAR, 1, 1, &z);
    assert_int_equal(store_step(f->st, run, seq + 1, &m, 2, NULL, 0), 0);
    OK(store_event(f->st, run, seq + 2, 3, PROTO_INFO, "undone"));
    proto_msg_free(&m);
    store_rollback_to(f->st);
    /* message 2 again, other values */
    OK(store_savepoint(f->st));
    build_step(&m, 64, 0);
    assert_int_equal(store_step(f->st, run, ++seq, &m, 4, NULL, 0), 0);
    proto_msg_free(&m);
    OK(store_release(f->st));
    OK(store_commit(f->st));
    assert_int_equal(qi(f->path, "SELECT count(*) FROM metrics WHERE name = 'zzz'"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events"), 0);
    assert_int_equal(qi(f->path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), seq);
    assert_int_equal(qi(f->path, "SELECT seq FROM steps WHERE run_id = %lld AND step = 61", (long long)run), seq - 1);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 63);
    assert_int_equal(count_rows(f, run, "rollups", "level = 1 AND block = 0"), 4); /* not sp: no frame at 64 */
    verify_rollups(f->path, run, NULL);

    /* the same history built without the undone message matches exactly */
    char p2[160];
    snprintf(p2, sizeof p2, "%s/ref.db", f->dir);
    char err[256];
    struct store *ref = store_open(p2, err, sizeof err);
    assert_non_null(ref);
    struct store *keep = f->st;
    f->st = ref;
    int64_t rrun = open_run(f, "sp", L, H), rseq = 0;
    put_range(f, rrun, &rseq, 0, 61, 0, 100);
    OK(store_begin(f->st));
    build_step(&m, 64, 0);
    assert_int_equal(store_step(f->st, rrun, ++rseq, &m, 4, NULL, 0), 0);
    proto_msg_free(&m);
    OK(store_commit(f->st));
    store_close(ref);
    f->st = keep;
    char *d1 = dump_db(f->path), *d2 = dump_db(p2);
    /* step 61's time differs (1 here, 1e9+61 there): compare the frames and rollups parts */
    char *f1 = strstr(d1, "#"), *f2 = strstr(d2, "#");
    f1 = strstr(f1 + 1, "#"), f2 = strstr(f2 + 1, "#"); /* after metrics */
    f1 = strstr(f1 + 1, "#"), f2 = strstr(f2 + 1, "#"); /* after steps */
    char *e1 = strstr(f1 + 1, "#"), *e2 = strstr(f2 + 1, "#");
    e1 = strstr(e1 + 1, "#"), e2 = strstr(e2 + 1, "#"); /* after rollups */
    assert_int_equal(e1 - f1, e2 - f2);
    assert_memory_equal(f1, f2, (size_t)(e1 - f1));
    free(d1);
    free(d2);
}

/* The calls of one batch, used twice by test_rollback_retry. */
static void rollback_batch(struct tmp_db *f, int64_t *run, int64_t *seq) {
    struct store_run_info info;
    OK(store_run_open(f->st, "rb", L, H, 64, "{\"a\":1}", 5000, &info));
    *run = info.id;
    *seq = info.last_seq;
    for (int64_t s = 200; s < 700; s++) { /* 200..699 after 0..299: a rewrite to 200 first */
        struct proto_msg m;
        build_step(&m, s, 1);
        int rc = store_step(f->st, *run, ++*seq, &m, 5000 + (double)s, NULL, 0);
        proto_msg_free(&m);
        if (rc) fail_msg("step %lld: %s", (long long)s, store_errmsg(f->st));
    }
    OK(store_event(f->st, *run, ++*seq, 6000, PROTO_INFO, "batch"));
    OK(store_run_status(f->st, *run, PROTO_FINISHED, ++*seq, 6001));
}

static void test_rollback_retry(void **state) {
    struct tmp_db *f = *state;
    char err[256];
    char p2[160];
    snprintf(p2, sizeof p2, "%s/ref.db", f->dir);
    struct store *ref = store_open(p2, err, sizeof err);
    assert_non_null(ref);
    struct store *stores[2] = {f->st, ref};
    for (int which = 0; which < 2; which++) {
        f->st = stores[which];
        int64_t run = open_run(f, "rb", L, H), seq = 0;
        put_range(f, run, &seq, 0, 299, 0, 1000);
        int64_t r2 = 0, s2 = 0;
        if (which == 0) {
            /* the batch, rolled back, then retried */
            OK(store_begin(f->st));
            rollback_batch(f, &r2, &s2);
            store_rollback(f->st);
            assert_int_equal(qi(f->path, "SELECT last_step FROM runs WHERE id = %lld", (long long)run), 299);
            assert_int_equal(qi(f->path, "SELECT count(*) FROM events"), 0);
        }
        OK(store_begin(f->st));
        rollback_batch(f, &r2, &s2);
        OK(store_commit(f->st));
        assert_int_equal(r2, run);
        assert_int_equal(s2, 300 + 500 + 2);
    }
    f->st = stores[0];
    store_close(ref);
    char *d1 = dump_db(f->path), *d2 = dump_db(p2);
    assert_string_equal(d1, d2);
    free(d1);
    free(d2);
    verify_rollups(f->path, 1, NULL);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events WHERE text LIKE 'rollback to step 200%%'"), 1);
    /* store_rollback without a transaction is harmless */
    store_rollback(f->st);
    int64_t seq = store_run_last_seq(f->st, 1);
    put_range(f, 1, &seq, 700, 800, 1, 1000);
    verify_rollups(f->path, 1, NULL);
}

/* A database of migration 8 (a rollup row holds every cell of its metric)
 * upgrades to rows per chunk of cells (migration 9): a metric wider than a
 * chunk is recoded into the very rows and totals this version writes, the
 * rows of one chunk stay as they are, and writing goes on from there; a
 * rewind and a delete then take the chunk and total rows too. */
static void test_upgrade_rollup_chunks(void **state) {
    struct tmp_db *f = *state;
    enum { UL = 12, UH = 12 }; /* 144 cells: chunks of 64, 64 and 16 */
    int64_t wide = open_run(f, "wide", UL, UH), small = open_run(f, "small", L, H), sseq = 0;
    static float v[UL * UH];
    OK(store_begin(f->st));
    for (int s = 0; s < 5000; s++) {
        struct proto_msg m;
        msg_step(&m, s);
        for (int i = 0; i < UL * UH; i++)
            v[i] = (float)(1.0 + 0.001 * ((s * 7919 + i * 104729) % 1000)) * (i % 3 ? 1 : -1);
        if (s == 70) v[5] = NAN;
        msg_add(&m, "att", PROTO_HEAD, UL, UH, v);
        v[0] = (float)s;
        msg_add(&m, "loss", PROTO_SCALAR, 1, 1, v);
        OK(store_step(f->st, wide, s + 1, &m, 1e9 + s, NULL, 0));
        proto_msg_free(&m);
    }
    OK(store_commit(f->st));
    put_range(f, small, &sseq, 0, 700, 0, 100);
    static const char *const dump =
        "SELECT (SELECT group_concat(x, ';') FROM (SELECT metric_id || ',' || level || ',' || chunk "
        "|| ',' || block || ',' || nframes || ',' || hex(data) AS x FROM rollups ORDER BY "
        "metric_id, level, chunk, block)) || '#' || (SELECT group_concat(x, ';') FROM (SELECT "
        "metric_id || ',' || level || ',' || block || ',' || nframes || ',' || hex(data) AS x FROM "
        "rollup_totals ORDER BY metric_id, level, block))";
    char *before = qs(f->path, "%s", dump);
    assert_true(qi(f->path, "SELECT count(DISTINCT chunk) FROM rollups") == 3);
    assert_true(qi(f->path, "SELECT count(*) FROM rollup_totals WHERE length(data) > 0") > 0);
    store_close(f->st);

    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    rollups_to_v8(db);
    /* migration 8's block_chunks had no crc (migration 11) */
    assert_int_equal(
        sqlite3_exec(db, "ALTER TABLE block_chunks DROP COLUMN crc; COMMIT; PRAGMA user_version = 8", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM sqlite_master WHERE name = 'rollup_totals'"), 0);

    char err[256];
    f->st = store_open(f->path, err, sizeof err);
    if (!f->st) fail_msg("%s", err);
    assert_int_equal(qi(f->path, "PRAGMA user_version"), store_schema_version());
    assert_int_equal(qi(f->path, "SELECT count(*) FROM sqlite_master WHERE name = 'rollups_v8'"), 0);
    char *after = qs(f->path, "%s", dump);
    assert_string_equal(before, after);
    free(before);
    free(after);
    verify_rollups(f->path, wide, NULL);
    verify_rollups(f->path, small, NULL);

    /* on from there: more steps, a rewind into the middle, a delete */
    OK(store_begin(f->st));
    for (int s = 5000; s < 5300; s++) {
        struct proto_msg m;
        msg_step(&m, s);
        for (int i = 0; i < UL * UH; i++) v[i] = (float)(s + i);
        msg_add(&m, "att", PROTO_HEAD, UL, UH, v);
        OK(store_step(f->st, wide, s + 1, &m, 1e9 + s, NULL, 0));
        proto_msg_free(&m);
    }
    OK(store_commit(f->st));
    verify_rollups(f->path, wide, NULL);
    /* in small pieces: the rollup phase stops inside a metric's chunks */
    int more, pieces = 0;
    do {
        OK(store_begin(f->st));
        more = store_rewind(f->st, wide, 1000, 2e9, 4);
        assert_true(more >= 0);
        OK(store_commit(f->st));
        pieces++;
    } while (more);
    assert_true(pieces > 10);
    OK(store_begin(f->st));
    struct proto_msg m;
    msg_step(&m, 1000);
    for (int i = 0; i < UL * UH; i++) v[i] = (float)-i;
    msg_add(&m, "att", PROTO_HEAD, UL, UH, v);
    OK(store_step(f->st, wide, 5301, &m, 2e9, NULL, 0));
    proto_msg_free(&m);
    OK(store_commit(f->st));
    verify_rollups(f->path, wide, NULL);
    assert_int_equal(qi(f->path,
                        "SELECT count(*) FROM rollup_totals t JOIN metrics m ON m.id = t.metric_id "
                        "WHERE m.run_id = %lld AND t.level = 1 AND t.block >= 16",
                        (long long)wide),
                     0);
    OK(store_begin(f->st));
    OK(store_run_delete(f->st, wide));
    OK(store_commit(f->st));
    for (int i = 0; i < 1000 && qi(f->path, "SELECT count(*) FROM purge"); i++) {
        OK(store_begin(f->st));
        assert_true(store_purge(f->st, 64) >= 0);
        OK(store_commit(f->st));
    }
    assert_int_equal(qi(f->path, "SELECT count(*) FROM purge"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollup_totals"), 0);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM rollups WHERE metric_id NOT IN (SELECT id FROM metrics)"), 0);
    verify_rollups(f->path, small, NULL);
}

static void test_full_disk(void **state) {
    struct tmp_db *f = *state;
    int64_t small = open_run(f, "small", L, H), sseq = 0;
    put_range(f, small, &sseq, 0, 300, 0, 1000);
    /* a bigger model, so that every step needs new pages */
    enum { BL = 32, BH = 64 };
    int64_t big = open_run(f, "big", BL, BH);
    char *before = dump_db(f->path);
    static float v[BL * BH];
    int64_t pages = store_db_bytes(f->st) / 16384;
    OK(store_set_max_pages(f->st, pages + 2));

    int failed_at = -1;
    OK(store_begin(f->st));
    for (int s = 0; s < 200; s++) {
        struct proto_msg m;
        msg_step(&m, s);
        for (int i = 0; i < BL * BH; i++) v[i] = (float)(s * 10000 + i);
        msg_add(&m, "att", PROTO_HEAD, BL, BH, v);
        int rc = store_step(f->st, big, s + 1, &m, 1, NULL, 0);
        proto_msg_free(&m);
        if (rc) {
            failed_at = s;
            break;
        }
    }
    if (failed_at < 0) {
        assert_int_equal(store_commit(f->st), -1);
        failed_at = 200;
    }
    assert_true(failed_at < 200);
    assert_int_equal(store_errcode(f->st), SQLITE_FULL);
    assert_true(strlen(store_errmsg(f->st)) > 0);
    store_rollback(f->st);
    /* nothing of the failed transaction is visible; the rest is intact */
    char *after = dump_db(f->path);
    assert_string_equal(before, after);
    free(before);
    free(after);
    assert_int_equal(store_run_last_seq(f->st, big), 0);
    /* still full: the same calls fail the same way */
    OK(store_begin(f->st));
    int rc = 0;
    for (int s = 0; s < 200 && rc == 0; s++) {
        struct proto_msg m;
        msg_step(&m, s);
        for (int i = 0; i < BL * BH; i++) v[i] = (float)(s * 10000 + i);
        msg_add(&m, "att", PROTO_HEAD, BL, BH, v);
        rc = store_step(f->st, big, s + 1, &m, 1, NULL, 0);
        proto_msg_free(&m);
    }
    if (rc == 0) rc = store_commit(f->st);
    assert_int_equal(rc, -1);
    assert_int_equal(store_errcode(f->st), SQLITE_FULL);
    store_rollback(f->st);

    /* space returns: the same calls succeed and the data is consistent */
    OK(store_set_max_pages(f->st, 0));
    OK(store_begin(f->st));
    for (int s = 0; s < 200; s++) {
        struct proto_msg m;
        msg_step(&m, s);
        for (int i = 0; i < BL * BH; i++) v[i] = (float)(s * 10000 + i);
        msg_add(&m, "att", PROTO_HEAD, BL, BH, v);
        assert_int_equal(store_step(f->st, big, s + 1, &m, 1, NULL, 0), 0);
        proto_msg_free(&m);
    }
    OK(store_commit(f->st));
    put_range(f, small, &sseq, 301, 399, 0, 1000);
    assert_int_equal(store_run_last_seq(f->st, big), 200);
    assert_int_equal(store_run_last_seq(f->st, small), 400);
    assert_int_equal(qi(f->path,
                        "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.run_id = %lld",
                        (long long)big),
                     200);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)big), 200);
    /* frame 137 holds exactly its values */
    sqlite3 *db = ro_open(f->path);
    sqlite3_stmt *s;
    assert_int_equal(
        sqlite3_prepare_v2(
            db, "SELECT data FROM frames WHERE step = 137 AND metric_id IN (SELECT id FROM metrics WHERE name = 'att')",
            -1, &s, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_bytes(s, 0), BL * BH * 4);
    const float *d = sqlite3_column_blob(s, 0);
    for (int i = 0; i < BL * BH; i++) {
        float x;
        memcpy(&x, (const char *)d + 4 * i, 4);
        assert_true(x == (float)(137 * 10000 + i));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    verify_rollups(f->path, big, NULL);
    verify_rollups(f->path, small, NULL);
    assert_int_equal(qi(f->path, "SELECT count(*) FROM events"), 0); /* no spurious rewrite events */
    char *ic = qs(f->path, "PRAGMA integrity_check");
    assert_string_equal(ic, "ok");
    free(ic);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_migrations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_open_resume_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_step_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lossy_bf16, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lossy_bits_16, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lossy_rewind_reopens_rounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollups_brute_force, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upgrade_rollup_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_history_rewrite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rewind_chunked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upgrade_from_raw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_frame_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checksums_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kind_conflict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_and_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retain_raw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_savepoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
