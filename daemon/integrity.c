/* integrity.c: row checksums (CRC32C), the count of damaged rows, and the
 * offline check of a database (integrity.h). The check reads the tables
 * whole, in rowid or key order; it is not the readers' path (those verify
 * the rows they read: fblock_rows.c, query_series.c, store.c). */
#include "integrity.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "fblock.h"
#include "proto.h"
#include "rollup.h"

/* ---- CRC32C: proto/crc32c.c, shared with the client's spool */

/* Exposed for the tests: the table's CRC, whatever the CPU. */
uint32_t integrity_crc32c_soft(uint32_t crc, const void *p, size_t n);
uint32_t integrity_crc32c_soft(uint32_t crc, const void *p, size_t n) { return proto_crc32c_soft(crc, p, n); }

uint32_t integrity_crc32c(uint32_t crc, const void *p, size_t n) { return proto_crc32c(crc, p, n); }

static uint32_t crc_i64(uint32_t crc, int64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)v >> (8 * i));
    return integrity_crc32c(crc, b, 8);
}

uint32_t integrity_chunk_crc(int64_t id, uint64_t mask, const void *data, size_t len) {
    uint32_t c = crc_i64(crc_i64(0, id), (int64_t)mask);
    return integrity_crc32c(c, data, len);
}

uint32_t integrity_rollup_crc(int64_t metric_id, int64_t level, int64_t chunk, int64_t block, int64_t nframes,
                              const void *data, size_t len) {
    uint32_t c = crc_i64(crc_i64(crc_i64(crc_i64(crc_i64(0, metric_id), level), chunk), block), nframes);
    return integrity_crc32c(c, data, len);
}

uint32_t integrity_frame_crc(int64_t metric_id, int64_t step, const void *data, size_t len) {
    return integrity_crc32c(crc_i64(crc_i64(0, metric_id), step), data, len);
}

/* ---- the count */

static atomic_uint_fast64_t n_errors;

void integrity_note(void) { atomic_fetch_add(&n_errors, 1); }
uint64_t integrity_errors(void) { return atomic_load(&n_errors); }

/* ---- entropyd --check */

struct metric {
    int64_t id, run_id, base, chunks; /* base -1: no chunk rows */
    uint32_t n;
    char *run, *name;
};

struct check {
    sqlite3 *db;
    FILE *out;
    struct fblock_codec *codec;
    struct metric *m;
    size_t nm;
    struct metric **by_base; /* the metrics with chunk rows, by base */
    size_t nb;
    float *vals;
    size_t valcap;
    struct rollup_cell *cells;
    uint64_t rows, damaged, orphans;
    int failed; /* a table could not be read at all */
};

static int by_id(const void *a, const void *b) {
    const struct metric *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int by_base_cmp(const void *a, const void *b) {
    const struct metric *x = *(struct metric *const *)a, *y = *(struct metric *const *)b;
    return x->base < y->base ? -1 : x->base > y->base;
}

static struct metric *metric_find(struct check *c, int64_t id) {
    struct metric key = {.id = id};
    return bsearch(&key, c->m, c->nm, sizeof *c->m, by_id);
}

/* The metric of a row under check whose column 0 is its metric_id, or
 * NULL: counts the row, and an orphan where its metric is gone. */
static struct metric *row_metric(struct check *c, sqlite3_stmt *s) {
    c->rows++;
    struct metric *m = metric_find(c, sqlite3_column_int64(s, 0));
    if (!m) c->orphans++;
    return m;
}

/* The metric whose chunk series holds `series`, or NULL. */
static struct metric *metric_of_series(struct check *c, int64_t series, int64_t *chunk) {
    size_t lo = 0, hi = c->nb;
    while (lo < hi) { /* the last base <= series */
        size_t mid = (lo + hi) / 2;
        if (c->by_base[mid]->base <= series) lo = mid + 1;
        else hi = mid;
    }
    if (!lo) return NULL;
    struct metric *m = c->by_base[lo - 1];
    if (series >= m->base + m->chunks) return NULL;
    *chunk = series - m->base;
    return m;
}

/* One damaged row: a line naming its run, metric and steps. */
static void damaged(struct check *c, const struct metric *m, int64_t first, int64_t last, const char *what,
                    const char *why) {
    c->damaged++;
    if (m)
        fprintf(c->out, "damaged: run %lld \"%s\" metric \"%s\" steps %lld..%lld: %s: %s\n", (long long)m->run_id,
                m->run, m->name, (long long)first, (long long)last, what, why);
    else fprintf(c->out, "damaged: %s: %s\n", what, why);
}

/* A table that stopped being readable part way (SQLite's own error, e.g.
 * SQLITE_CORRUPT on a damaged page): reported, and the check goes on with
 * the next table. */
static void scan_failed(struct check *c, const char *table) {
    char what[96];
    snprintf(what, sizeof what, "table %s (the scan stopped)", table);
    damaged(c, NULL, 0, 0, what, sqlite3_errmsg(c->db));
}

static int vals_grow(struct check *c, uint32_t n) {
    size_t want = (size_t)n * FBLOCK_STEPS;
    if (want <= c->valcap) return 0;
    float *v = realloc(c->vals, want * sizeof *v);
    if (!v) return -1;
    c->vals = v;
    c->valcap = want;
    return 0;
}

/* Prepares sql, or returns NULL when its table does not exist in this
 * database (an older schema: nothing of it to check). */
static sqlite3_stmt *prep(struct check *c, const char *sql) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) return NULL;
    return s;
}

/* The crc column of row s (column col) against want: 1 when it matches or
 * the row has none (written before migration 11), 0 when it does not. */
static int crc_ok(sqlite3_stmt *s, int col, uint32_t want) {
    if (col < 0 || sqlite3_column_type(s, col) == SQLITE_NULL) return 1;
    return sqlite3_column_int64(s, col) == integrity_stored(want);
}

static const char *crc_why(sqlite3_stmt *s, int col, uint32_t want) {
    return sqlite3_column_int64(s, col) == integrity_poisoned(want) ? "pooled from a damaged row of the level below"
                                                                    : "checksum mismatch";
}

static int load_metrics(struct check *c) {
    sqlite3_stmt *s = prep(c, "SELECT m.id, m.run_id, r.name, m.name, "
                              "CASE m.kind WHEN 2 THEN r.layers * r.heads WHEN 1 THEN r.layers ELSE 1 END "
                              "FROM metrics m JOIN runs r ON r.id = m.run_id ORDER BY m.id");
    if (!s) return -1;
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (c->nm == cap) {
            struct metric *m = realloc(c->m, (cap = cap ? 2 * cap : 64) * sizeof *m);
            if (!m) break;
            c->m = m;
        }
        struct metric *m = &c->m[c->nm++];
        int64_t n = sqlite3_column_int64(s, 4);
        *m = (struct metric){.id = sqlite3_column_int64(s, 0),
                             .run_id = sqlite3_column_int64(s, 1),
                             .base = -1,
                             .n = n > 0 && n <= PROTO_MAX_CELLS ? (uint32_t)n : 0,
                             .run = strdup((const char *)sqlite3_column_text(s, 2)),
                             .name = strdup((const char *)sqlite3_column_text(s, 3))};
        if (!m->run || !m->name) break;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return -1;
    qsort(c->m, c->nm, sizeof *c->m, by_id);
    if (!(s = prep(c, "SELECT metric_id, base, chunks FROM block_series"))) return 0;
    if (!(c->by_base = calloc(c->nm ? c->nm : 1, sizeof *c->by_base))) rc = SQLITE_NOMEM;
    while (c->by_base && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct metric *m = metric_find(c, sqlite3_column_int64(s, 0));
        if (!m) continue; /* being purged */
        m->base = sqlite3_column_int64(s, 1);
        m->chunks = sqlite3_column_int64(s, 2);
        c->by_base[c->nb++] = m;
    }
    sqlite3_finalize(s);
    qsort(c->by_base, c->nb, sizeof *c->by_base, by_base_cmp);
    return rc == SQLITE_DONE ? 0 : -1;
}

#define BLOCK_BITS 26 /* fblock_rows.c's row id: series << 26 | block */

static void check_chunks(struct check *c) {
    sqlite3_stmt *s = prep(c, "SELECT id, mask, data, crc FROM block_chunks ORDER BY id");
    int has_crc = 1, rc;
    if (!s) {
        has_crc = 0;
        if (!(s = prep(c, "SELECT id, mask, data, NULL FROM block_chunks ORDER BY id"))) return;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        c->rows++;
        int64_t id = sqlite3_column_int64(s, 0), chunk = 0, block = id & ((INT64_C(1) << BLOCK_BITS) - 1);
        uint64_t mask = (uint64_t)sqlite3_column_int64(s, 1);
        const void *d = sqlite3_column_blob(s, 2);
        size_t len = (size_t)sqlite3_column_bytes(s, 2);
        struct metric *m = metric_of_series(c, id >> BLOCK_BITS, &chunk);
        if (!m) {
            c->orphans++;
            continue;
        }
        char what[96];
        snprintf(what, sizeof what, "block chunk %lld (block_chunks row %lld)", (long long)chunk, (long long)id);
        int64_t first = block * FBLOCK_STEPS, last = first + FBLOCK_STEPS - 1;
        uint32_t want = integrity_chunk_crc(id, mask, d, len), nf = fblock_count(mask);
        uint32_t c0 = (uint32_t)chunk * FBLOCK_CHUNK, c1 = c0 + FBLOCK_CHUNK < m->n ? c0 + FBLOCK_CHUNK : m->n;
        if (has_crc && !crc_ok(s, 3, want)) damaged(c, m, first, last, what, crc_why(s, 3, want));
        else if (!nf || !m->n || vals_grow(c, m->n) ||
                 fblock_decode_chunk(c->codec, d, len, nf, m->n, (uint32_t)chunk, c0, c1, c->vals))
            damaged(c, m, first, last, what, "does not decode");
    }
    if (rc != SQLITE_DONE) scan_failed(c, "block_chunks");
    sqlite3_finalize(s);
}

static void check_old_blocks(struct check *c) {
    sqlite3_stmt *s = prep(c, "SELECT metric_id, block, mask, data FROM blocks ORDER BY id");
    int rc;
    if (!s) return;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct metric *m = row_metric(c, s);
        if (!m) continue;
        int64_t block = sqlite3_column_int64(s, 1);
        uint32_t nf = fblock_count((uint64_t)sqlite3_column_int64(s, 2));
        if (!nf || !m->n || vals_grow(c, m->n) ||
            fblock_decode(c->codec, sqlite3_column_blob(s, 3), (size_t)sqlite3_column_bytes(s, 3), nf, m->n, 0, m->n,
                          c->vals))
            damaged(c, m, block * FBLOCK_STEPS, block * FBLOCK_STEPS + FBLOCK_STEPS - 1,
                    "block (migration 6's table, no checksum)", "does not decode");
    }
    if (rc != SQLITE_DONE) scan_failed(c, "blocks");
    sqlite3_finalize(s);
}

/* rollups (totals 0) or rollup_totals (totals 1) */
static void check_rollups(struct check *c, int totals) {
    const char *sql[2][2] = {{"SELECT metric_id, level, chunk, block, nframes, data, crc FROM rollups",
                              "SELECT metric_id, level, chunk, block, nframes, data, NULL FROM rollups"},
                             {"SELECT metric_id, level, -1, block, nframes, data, crc FROM rollup_totals",
                              "SELECT metric_id, level, -1, block, nframes, data, NULL FROM rollup_totals"}};
    sqlite3_stmt *s = prep(c, sql[totals][0]);
    int rc;
    if (!s && !(s = prep(c, sql[totals][1]))) return;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct metric *m = row_metric(c, s);
        if (!m) continue;
        int64_t mid = m->id, level = sqlite3_column_int64(s, 1), chunk = sqlite3_column_int64(s, 2);
        int64_t block = sqlite3_column_int64(s, 3), nf = sqlite3_column_int64(s, 4);
        const unsigned char *d = sqlite3_column_blob(s, 5);
        size_t len = (size_t)sqlite3_column_bytes(s, 5);
        int ok_level = level >= 1 && level <= ROLLUP_LEVELS;
        int64_t size = ok_level ? ROLLUP_LEVEL_SIZE(level) : 0;
        char what[96];
        if (totals) snprintf(what, sizeof what, "level-%lld rollup total", (long long)level);
        else snprintf(what, sizeof what, "level-%lld rollup, chunk %lld", (long long)level, (long long)chunk);
        uint32_t want = integrity_rollup_crc(mid, level, chunk, block, nf, d, len);
        if (!crc_ok(s, 6, want)) {
            damaged(c, m, block * size, (block + 1) * size - 1, what, crc_why(s, 6, want));
            continue;
        }
        int bad = !ok_level || nf < 1 || nf > size || !m->n;
        if (!bad && totals) {
            struct rollup_total t;
            bad = rollup_total_decode(d, len, m->n, (uint32_t)nf, &t) < 0;
        } else if (!bad) {
            uint32_t rn =
                chunk >= 0 && (uint64_t)chunk < ROLLUP_CHUNKS(m->n) ? ROLLUP_CHUNK_LEN(m->n, (uint32_t)chunk) : 0;
            bad = !rn || !d || rollup_decode(d, len, rn, (uint32_t)nf, 0, rn, c->cells);
        }
        if (bad) damaged(c, m, block * size, (block + 1) * size - 1, what, "does not decode");
    }
    if (rc != SQLITE_DONE) scan_failed(c, totals ? "rollup_totals" : "rollups");
    sqlite3_finalize(s);
}

static void check_frames(struct check *c) {
    sqlite3_stmt *s = prep(c, "SELECT metric_id, step, data, crc FROM frames");
    int rc;
    if (!s && !(s = prep(c, "SELECT metric_id, step, data, NULL FROM frames"))) return;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct metric *m = row_metric(c, s);
        if (!m) continue;
        int64_t step = sqlite3_column_int64(s, 1);
        const void *d = sqlite3_column_blob(s, 2);
        size_t len = (size_t)sqlite3_column_bytes(s, 2);
        uint32_t want = integrity_frame_crc(m->id, step, d, len);
        if (!crc_ok(s, 3, want)) damaged(c, m, step, step, "raw frame", "checksum mismatch");
        else if (len != (size_t)m->n * 4) damaged(c, m, step, step, "raw frame", "its size is not its metric's shape");
    }
    if (rc != SQLITE_DONE) scan_failed(c, "frames");
    sqlite3_finalize(s);
}

/* SQLite's page and b-tree check: each line it gives is a damage. */
static int check_pages(struct check *c) {
    sqlite3_stmt *s = prep(c, "PRAGMA integrity_check(100)");
    int rc, bad = 0;
    if (!s) return -1;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *msg = (const char *)sqlite3_column_text(s, 0);
        if (msg && strcmp(msg, "ok") != 0) {
            damaged(c, NULL, 0, 0, "database pages (PRAGMA integrity_check)", msg);
            bad = 1;
        }
    }
    if (rc != SQLITE_DONE) scan_failed(c, "(integrity_check)");
    sqlite3_finalize(s);
    return bad;
}

int integrity_check(const char *path, FILE *out, FILE *errout) {
    struct check c = {.out = out};
    int ret = 2;
    /* read-only: a running daemon goes on writing (WAL); this reads the
     * snapshot of its one read transaction */
    if (sqlite3_open_v2(path, &c.db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        fprintf(errout, "entropyd --check: cannot open database %s: %s\n", path,
                c.db ? sqlite3_errmsg(c.db) : "out of memory");
        goto out;
    }
    sqlite3_busy_timeout(c.db, 5000);
    if (!(c.codec = fblock_codec_create()) || !(c.cells = malloc(ROLLUP_CHUNK_CELLS * sizeof *c.cells))) {
        fprintf(errout, "entropyd --check: out of memory\n");
        goto out;
    }
    if (sqlite3_exec(c.db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK || load_metrics(&c)) {
        fprintf(errout, "entropyd --check: %s: cannot read the runs and metrics: %s\n", path, sqlite3_errmsg(c.db));
        goto out;
    }
    check_pages(&c);
    check_chunks(&c);
    check_old_blocks(&c);
    check_rollups(&c, 0);
    check_rollups(&c, 1);
    check_frames(&c);
    sqlite3_exec(c.db, "COMMIT", NULL, NULL, NULL);
    fprintf(out, "entropyd --check: %s: %llu rows of %zu metrics checked (%llu of runs being deleted skipped): %s",
            path, (unsigned long long)c.rows, c.nm, (unsigned long long)c.orphans, c.damaged ? "" : "no damage\n");
    if (c.damaged) fprintf(out, "%llu damaged\n", (unsigned long long)c.damaged);
    ret = c.damaged ? 1 : 0;
out:
    for (size_t i = 0; i < c.nm; i++) {
        free(c.m[i].run);
        free(c.m[i].name);
    }
    free(c.m);
    free(c.by_base);
    free(c.vals);
    free(c.cells);
    fblock_codec_destroy(c.codec);
    sqlite3_close(c.db);
    return ret;
}
