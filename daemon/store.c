/* store.c: entropyd's SQLite write side. See store.h for the contract and
 * schema/storage.md for the layout. This file knows SQL and blobs; it knows
 * nothing of sockets or threads (the writer thread calls it). What takes
 * data away in bounded chunks (the purge of deleted runs, raw retention) is
 * store_purge.c; what both share is store_int.h. */
#include "store.h"
#include "store_int.h"

#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>

#include "embed.h"
#include "fblock.h"
#include "fblock_rows.h"
#include "integrity.h"
#include "rollup.h"

/* Debian's SQLite is built with SQLITE_SECURE_DELETE: every deleted row
 * zeroed and every freed page written to the WAL. Sealing a block deletes
 * its 64 raw frames, and that was the largest part of its cost; the data
 * is the user's own, kept in the same file, so it is not worth it. */
#define SECURE_DELETE "OFF"

/* A metric of a cached run: its row id, kind, value count and last stored
 * step (-1 when none), which decides when a rollup block is complete. */
struct metric_cache {
    char name[PROTO_MAX_NAME + 1];
    int64_t id;
    int kind;
    uint32_t n;
    int64_t last_step;
};

/* What the writer knows of a run between messages: a cache of rows, safe
 * to drop at any time (every change is written to the database at once). */
struct run_cache {
    int64_t id, layers, heads;
    int64_t last_seq, last_step;  /* last_step -1 when none */
    double updated;
    int rewinding;                /* a rewinds row exists: finish it before any new step */
    /* how far the rewind got (in this cache's life: a reloaded cache starts
     * over, which is correct as every phase is idempotent, only slower):
     * phase 0 rollups, 1 raw frames, 2 blocks, 3 steps; the metric index
     * within it */
    int rewind_phase;
    uint32_t rewind_metric;
    uint32_t nmetrics, cap;
    struct metric_cache *metrics;
};


static const char *const stmt_sql[S_COUNT] = {
    [S_INSERT_FRAME] = "INSERT OR REPLACE INTO frames(metric_id, step, data, crc) VALUES (?1, ?2, ?3, ?4)",
    [S_INSERT_STEP] = "INSERT OR REPLACE INTO steps(run_id, step, seq, time) VALUES (?1, ?2, ?3, ?4)",
    /* an id above every live one and every one still being purged: frames
     * of a deleted metric must never be taken for a new one's */
    [S_INSERT_METRIC] = "INSERT INTO metrics(id, run_id, name, kind) VALUES (max(coalesce((SELECT max(id) FROM metrics), 0), "
                        "coalesce((SELECT max(id) FROM purge WHERE kind = 0), 0)) + 1, ?1, ?2, ?3)",
    /* crc: integrity.h (migration 11) */
    [S_INSERT_ROLLUP] = "INSERT OR REPLACE INTO rollups(metric_id, level, chunk, block, nframes, data, crc) "
                        "VALUES (?1, ?2, ?6, ?3, ?4, ?5, ?7)",
    [S_INSERT_TOTAL] = "INSERT OR REPLACE INTO rollup_totals(metric_id, level, block, nframes, data, crc) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?7)",
    [S_SEAL_FRAMES] = "SELECT step, data, crc FROM frames WHERE metric_id = ?1 AND step >= ?2 AND step < ?3 ORDER BY step",
    [S_SEAL_DELETE] = "DELETE FROM frames WHERE metric_id = ?1 AND step >= ?2 AND step < ?3",
    [S_INSERT_ABANDONED] = "INSERT INTO abandoned_frames(branch_id, metric_id, step, data) VALUES (?1, ?2, ?3, ?4)",
    [S_LAST_FRAME] = "SELECT step, data FROM frames WHERE metric_id = ?1 ORDER BY step DESC LIMIT 1",
    [S_SELECT_ROLLUPS] = "SELECT nframes, data, crc, block FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 "
                         "AND block >= ?3 AND block < ?4",
    [S_UPDATE_RUN] = "UPDATE runs SET last_seq = ?2, last_step = ?3, updated = ?4 WHERE id = ?1",
    [S_INSERT_EVENT] = "INSERT INTO events(run_id, seq, time, level, text) VALUES (?1, ?2, ?3, ?4, ?5)",
    [S_SELECT_RUN] = "SELECT layers, heads, last_seq, last_step, updated, "
                     "(SELECT count(*) FROM rewinds WHERE run_id = ?1) FROM runs WHERE id = ?1",
    /* the last step, or a step of the last block (which is all that
     * sealing needs, store.c rollup_advance), -1 for none */
    [S_SELECT_METRICS] = "SELECT m.id, m.name, m.kind, max(coalesce((SELECT max(step) FROM frames f WHERE f.metric_id = m.id), -1), "
                         "coalesce((SELECT max(block) FROM blocks b WHERE b.metric_id = m.id) * 64, -1), "
                         "coalesce((SELECT (max(c.id) & 67108863) * 64 FROM block_series b, block_chunks c WHERE b.metric_id = m.id "
                         "AND c.id BETWEEN b.base << 26 AND (b.base << 26) + 67108863), -1)) "
                         "FROM metrics m WHERE m.run_id = ?1",
    [S_UPSERT_LATEST] = "INSERT INTO latest(metric_id, step, data) VALUES (?1, ?2, ?3) "
                        "ON CONFLICT(metric_id) DO UPDATE SET step = excluded.step, data = excluded.data",
    [S_SELECT_REWIND] = "SELECT branch_id, from_step FROM rewinds WHERE run_id = ?1",
    /* A rewind moves the highest steps first, so that one in progress looks
     * to readers like a run at an earlier step, not one with holes: the
     * lowest step of the chunk is the budget-th from the top (NULL: all). */
    [S_REWIND_LOW] = "SELECT step FROM frames WHERE metric_id = ?1 AND step >= ?2 ORDER BY step DESC LIMIT 1 OFFSET ?3",
    [S_REWIND_MOVE] = "INSERT INTO abandoned_frames(branch_id, metric_id, step, data) "
                      "SELECT ?3, metric_id, step, data FROM frames WHERE metric_id = ?1 AND step >= ?2 ORDER BY step",
    [S_REWIND_DELETE] = "DELETE FROM frames WHERE metric_id = ?1 AND step >= ?2",
    [S_REWIND_STEPS] = "DELETE FROM steps WHERE run_id = ?1 AND step >= coalesce((SELECT step FROM steps "
                       "WHERE run_id = ?1 AND step >= ?2 ORDER BY step DESC LIMIT 1 OFFSET ?3), ?2)",
    /* rollups have no rowid (migration 7): the key within one metric, level
     * and chunk (migration 9) */
    [S_REWIND_ROLLUPS] = "DELETE FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 AND block IN "
                         "(SELECT block FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 AND block >= ?3 LIMIT ?4)",
    [S_REWIND_TOTALS] = "DELETE FROM rollup_totals WHERE metric_id = ?1 AND level = ?2 AND block IN (SELECT block "
                        "FROM rollup_totals WHERE metric_id = ?1 AND level = ?2 AND block >= ?3 LIMIT ?4)",
    [S_PURGE_NEXT] = "SELECT kind, id FROM purge LIMIT 1",
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_SAVEPOINT] = "SAVEPOINT item",
    [S_RELEASE] = "RELEASE item",
    [S_RUN_BY_NAME] = "SELECT id, layers, heads, last_seq FROM runs WHERE name = ?1",
    [S_RUN_RESUME] = "UPDATE runs SET status = 'live', updated = ?2, seq_len = ?3, meta = coalesce(?4, meta) WHERE id = ?1",
    /* ids come from id_seq (migration 3) so a deleted run's id is never reused */
    [S_RUN_ID_NEXT] = "UPDATE id_seq SET last = max(last, (SELECT coalesce(max(id), 0) FROM runs)) + 1 WHERE name = 'runs'",
    [S_RUN_CREATE] = "INSERT INTO runs(id, name, status, created, updated, seq_len, meta, layers, heads) "
                     "VALUES ((SELECT last FROM id_seq WHERE name = 'runs'), ?1, 'live', ?2, ?2, ?3, coalesce(?4, '{}'), ?5, ?6)",
    [S_RUN_STATUS] = "UPDATE runs SET status = ?2, updated = ?3 WHERE id = ?1",
    [S_RUN_VERDICT] = "INSERT INTO run_summary(run_id, verdict, since_step, heads, rule, evidence) "
                      "SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM runs WHERE id = ?1) "
                      "ON CONFLICT(run_id) DO UPDATE SET verdict = excluded.verdict, "
                      "since_step = excluded.since_step, heads = excluded.heads, rule = excluded.rule, "
                      "evidence = excluded.evidence",
    [S_ALERTS_CLOSE_RUN] = "UPDATE alerts SET state = 'resolved', ends_at = ?2, reason = 'run_ended' "
                           "WHERE run_id = ?1 AND state = 'firing'",
};


int store_set_err(struct store *st, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
    st->errcode = code;
    return -1;
}

int store_db_err(struct store *st, const char *what) {
    return store_set_err(st, sqlite3_extended_errcode(st->db) & 0xff, "%s: %s", what, sqlite3_errmsg(st->db));
}

int store_rows_err(struct store *st, int64_t rc, int64_t metric_id, int64_t block, const char *what) {
    if (rc >= 0) return 0;
    if (rc == FBLOCK_ENOMEM) return store_set_err(st, SQLITE_NOMEM, "%s: out of memory", what);
    if (rc == FBLOCK_ECORRUPT)
        return store_set_err(st, SQLITE_CORRUPT, "%s: a block of metric %lld%s does not decode", what,
                       (long long)metric_id, block >= 0 ? " (or a chunk of it is missing)" : "");
    return store_db_err(st, what);
}

const char *store_errmsg(const struct store *st) { return st->err; }
int store_errcode(const struct store *st) { return st->errcode; }

int store_schema_version(void) {
    int n = 0;
    while (migrations[n].path) n++;
    return n;
}

int store_exec(struct store *st, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        store_set_err(st, sqlite3_extended_errcode(st->db) & 0xff, "%s", msg ? msg : sqlite3_errmsg(st->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int64_t pragma_int(struct store *st, const char *sql) {
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK) return -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

static int step_done(struct store *st, sqlite3_stmt *s, const char *what);
static int rollup_put(struct store *st, int64_t metric_id, const struct rollup_cell *a, uint32_t n, int level,
                      int64_t block, int64_t nframes, int poisoned);

/* Migration 9's part in C (schema/009_rollup_chunks.sql): the rollup rows
 * of metrics wider than a chunk, left in rollups_v8, decoded and written
 * again as chunk rows and a total's row each (what the writer writes now,
 * rollup_put); then rollups_v8 goes. A row that does not decode as its
 * metric's values is kept as it is in chunk 0, where a reader reports it
 * as corrupt (schema/storage.md), as it would have before. */
static int migrate_rollup_chunks(struct store *st) {
    sqlite3_stmt *s = NULL, *ins = NULL;
    struct rollup_cell *cells = NULL;
    uint32_t cap = 0;
    int rc, ret = -1;
    if (sqlite3_prepare_v2(st->db, "SELECT o.metric_id, o.level, o.block, o.nframes, o.data, "
                           "CASE m.kind WHEN 2 THEN r.layers * r.heads WHEN 1 THEN r.layers ELSE 1 END "
                           "FROM rollups_v8 o JOIN metrics m ON m.id = o.metric_id JOIN runs r ON r.id = m.run_id "
                           "ORDER BY o.metric_id, o.level, o.block", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(st->db, "INSERT INTO rollups(metric_id, level, chunk, block, nframes, data) "
                           "VALUES (?1, ?2, 0, ?3, ?4, ?5)", -1, &ins, NULL) != SQLITE_OK ||
        /* the tables as they are at migration 9, without migration 11's
         * crc (rollup_put's ?7 is left unbound: these rows get NULL, as
         * every row before migration 11) */
        sqlite3_prepare_v3(st->db, "INSERT OR REPLACE INTO rollups(metric_id, level, chunk, block, nframes, data) "
                           "VALUES (?1, ?2, ?6, ?3, ?4, ?5)", -1, 0, &st->stmt[S_INSERT_ROLLUP], NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(st->db, "INSERT OR REPLACE INTO rollup_totals(metric_id, level, block, nframes, data) "
                           "VALUES (?1, ?2, ?3, ?4, ?5)", -1, 0, &st->stmt[S_INSERT_TOTAL], NULL) != SQLITE_OK) {
        store_db_err(st, "preparing the rollups' recoding");
        goto out;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t mid = sqlite3_column_int64(s, 0), block = sqlite3_column_int64(s, 2), nf = sqlite3_column_int64(s, 3);
        int level = sqlite3_column_int(s, 1);
        int64_t n64 = sqlite3_column_int64(s, 5);
        const unsigned char *d = sqlite3_column_blob(s, 4);
        size_t len = (size_t)sqlite3_column_bytes(s, 4);
        uint32_t n = n64 > 0 && n64 <= PROTO_MAX_CELLS ? (uint32_t)n64 : 0;
        if (n > cap) {
            struct rollup_cell *c = realloc(cells, n * sizeof *c);
            unsigned char *row = c ? realloc(st->aggrow, ROLLUP_MAX_BYTES(n)) : NULL;
            if (c) cells = c;
            if (!row) {
                store_set_err(st, SQLITE_NOMEM, "out of memory");
                goto out;
            }
            st->aggrow = row;
            cap = n;
        }
        if (n && level >= 1 && level <= STORE_LEVELS && nf >= 0 && nf <= STORE_LEVEL_SIZE(level) && d &&
            !rollup_decode(d, len, n, (uint32_t)nf, 0, n, cells)) {
            if (rollup_put(st, mid, cells, n, level, block, nf, 0)) goto out;
            continue;
        }
        sqlite3_bind_int64(ins, 1, mid);
        sqlite3_bind_int(ins, 2, level);
        sqlite3_bind_int64(ins, 3, block);
        sqlite3_bind_int64(ins, 4, nf);
        sqlite3_bind_blob(ins, 5, d ? (const void *)d : "", (int)len, SQLITE_TRANSIENT);
        if (step_done(st, ins, "keeping a rollup row")) goto out;
    }
    if (rc != SQLITE_DONE) {
        store_db_err(st, "reading rollups_v8");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    ret = store_exec(st, "DROP TABLE rollups_v8");
out:
    sqlite3_finalize(s);
    sqlite3_finalize(ins);
    /* store_open prepares them again, for good */
    sqlite3_finalize(st->stmt[S_INSERT_ROLLUP]);
    sqlite3_finalize(st->stmt[S_INSERT_TOTAL]);
    st->stmt[S_INSERT_ROLLUP] = st->stmt[S_INSERT_TOTAL] = NULL;
    free(cells);
    return ret;
}

/* What migrations need of C beyond their SQL, by index (migration i + 1). */
static int (*const migration_code[])(struct store *) = {[8] = migrate_rollup_chunks};
#define MIGRATION_CODE_N ((int)(sizeof migration_code / sizeof migration_code[0]))

/* Applies the migrations the database has not seen, each in its own
 * transaction together with the new user_version (and its C part,
 * migration_code). */
static int migrate(struct store *st) {
    int known = store_schema_version();
    int64_t have = pragma_int(st, "PRAGMA user_version");
    if (have < 0) return store_db_err(st, "reading schema version");
    if (have > known)
        return store_set_err(st, SQLITE_ERROR,
                       "database schema version %lld is newer than this entropyd knows (%d): "
                       "use a newer entropyd or another --db", (long long)have, known);
    for (int i = (int)have; i < known; i++) {
        char sql[64];
        if (store_exec(st, "BEGIN IMMEDIATE")) return -1;
        if (store_exec(st, (const char *)migrations[i].data) || (i < MIGRATION_CODE_N && migration_code[i] && migration_code[i](st))) {
            char msg[sizeof st->err];
            snprintf(msg, sizeof msg, "%s", st->err);
            store_exec(st, "ROLLBACK");
            return store_set_err(st, SQLITE_ERROR, "migration %.64s failed: %.400s", migrations[i].path, msg);
        }
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", i + 1);
        if (store_exec(st, sql) || store_exec(st, "COMMIT")) {
            store_exec(st, "ROLLBACK");
            return -1;
        }
    }
    return 0;
}

/* Counts the WAL's frames after each commit, and checkpoints as SQLite's
 * autocheckpoint does (at 1000 frames) unless the caller took that over
 * (store_set_autocheckpoint). */
static int wal_hook(void *ctx, sqlite3 *db, const char *name, int frames) {
    struct store *st = ctx;
    st->wal_frames = frames;
    if (st->autockpt && frames >= 1000) sqlite3_wal_checkpoint(db, name);
    return SQLITE_OK;
}

void store_set_autocheckpoint(struct store *st, int on) { st->autockpt = on; }

struct store *store_open(const char *path, char *err, size_t errlen) {
    struct store *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot open database %s: %s", path, st->db ? sqlite3_errmsg(st->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(st->db, 5000);
    /* page_size only takes effect before the first table exists. 16 KiB
     * pages pack the frame rows (~600 bytes for 12x12) with little waste. */
    if (store_exec(st, "PRAGMA page_size = 16384") ||
        store_exec(st, "PRAGMA journal_mode = WAL") ||
        store_exec(st, "PRAGMA synchronous = NORMAL") ||
        store_exec(st, "PRAGMA foreign_keys = ON") ||
        store_exec(st, "PRAGMA secure_delete = " SECURE_DELETE) ||
        store_exec(st, "PRAGMA cache_size = -65536") ||
        /* the WAL file is cut back to this size whenever it restarts
         * (store_checkpoint, writer.h); see schema/storage.md "WAL" */
        store_exec(st, "PRAGMA journal_size_limit = " STORE_WAL_LIMIT_STR) ||
        migrate(st)) {
        snprintf(err, errlen, "database %s: %s", path, st->err);
        goto fail;
    }
    if (!(st->codec = fblock_codec_create())) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!(st->rows = fblock_rows_open(st->db, st->codec))) {
        snprintf(err, errlen, "database %s: preparing block statements: %s", path, sqlite3_errmsg(st->db));
        goto fail;
    }
    st->autockpt = 1;
    sqlite3_wal_hook(st->db, wal_hook, st);
    st->page_size = pragma_int(st, "PRAGMA page_size");
    for (int i = 0; i < S_COUNT; i++) {
        if (sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i], NULL) != SQLITE_OK) {
            snprintf(err, errlen, "database %s: preparing statement: %s", path, sqlite3_errmsg(st->db));
            goto fail;
        }
    }
    return st;
fail:
    store_close(st);
    return NULL;
}

static void drop_caches(struct store *st) {
    for (uint32_t i = 0; i < st->nruns; i++) {
        free(st->runs[i]->metrics);
        free(st->runs[i]);
    }
    st->nruns = 0;
}

void store_close(struct store *st) {
    if (!st) return;
    if (st->in_txn) store_rollback(st);
    drop_caches(st);
    free(st->runs);
    free(st->agg);
    free(st->aggsrc);
    free(st->aggrow);
    free(st->blockvals);
    fblock_rows_close(st->rows);
    fblock_codec_destroy(st->codec);
    for (int i = 0; i < S_COUNT; i++) sqlite3_finalize(st->stmt[i]);
    sqlite3_finalize(st->summary_stmt);
    sqlite3_close(st->db);
    free(st);
}

int store_begin(struct store *st) {
    if (step_done(st, st->stmt[S_BEGIN], "BEGIN")) return -1;
    st->in_txn = 1;
    return 0;
}

int store_begin_nowait(struct store *st) {
    sqlite3_busy_timeout(st->db, 0);
    int rc = store_begin(st);
    sqlite3_busy_timeout(st->db, 5000);
    return rc;
}

static int step_done(struct store *st, sqlite3_stmt *s, const char *what) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return store_db_err(st, what);
    return 0;
}

int store_commit(struct store *st) {
    if (step_done(st, st->stmt[S_COMMIT], "COMMIT")) return -1;
    st->in_txn = 0;
    return 0;
}

int store_savepoint(struct store *st) { return step_done(st, st->stmt[S_SAVEPOINT], "opening a savepoint"); }
int store_in_transaction(struct store *st) { return st->in_txn && !sqlite3_get_autocommit(st->db); }
int store_release(struct store *st) { return step_done(st, st->stmt[S_RELEASE], "releasing a savepoint"); }

void store_rollback_to(struct store *st) {
    sqlite3_exec(st->db, "ROLLBACK TO item; RELEASE item", NULL, NULL, NULL);
    drop_caches(st);
}

/* Writes the run's bookkeeping columns from its cache. */
static int run_save(struct store *st, struct run_cache *r) {
    sqlite3_stmt *s = st->stmt[S_UPDATE_RUN];
    sqlite3_bind_int64(s, 1, r->id);
    sqlite3_bind_int64(s, 2, r->last_seq);
    if (r->last_step >= 0) sqlite3_bind_int64(s, 3, r->last_step);
    else sqlite3_bind_null(s, 3);
    sqlite3_bind_double(s, 4, r->updated);
    return step_done(st, s, "updating run");
}

void store_rollback(struct store *st) {
    if (sqlite3_get_autocommit(st->db) == 0) sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    st->in_txn = 0;
    drop_caches(st); /* the cache may describe rows that no longer exist */
}

/* Finds or loads the cache of run id. NULL with an error if it fails. */
static struct run_cache *run_get(struct store *st, int64_t id) {
    for (uint32_t i = 0; i < st->nruns; i++)
        if (st->runs[i]->id == id) return st->runs[i];
    struct run_cache *r = calloc(1, sizeof *r);
    if (!r) { store_set_err(st, SQLITE_NOMEM, "out of memory"); return NULL; }
    r->id = id;
    sqlite3_stmt *s = st->stmt[S_SELECT_RUN];
    sqlite3_bind_int64(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        r->layers = sqlite3_column_int64(s, 0);
        r->heads = sqlite3_column_int64(s, 1);
        r->last_seq = sqlite3_column_int64(s, 2);
        r->last_step = sqlite3_column_type(s, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 3);
        r->updated = sqlite3_column_double(s, 4);
        r->rewinding = sqlite3_column_int(s, 5) > 0;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW) {
        free(r);
        if (rc == SQLITE_DONE) store_set_err(st, -3, "no run %lld", (long long)id);
        else store_db_err(st, "loading run");
        return NULL;
    }
    s = st->stmt[S_SELECT_METRICS];
    sqlite3_bind_int64(s, 1, id);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (r->nmetrics == r->cap) {
            uint32_t cap = r->cap ? r->cap * 2 : 16;
            struct metric_cache *m = realloc(r->metrics, cap * sizeof *m);
            if (!m) { rc = SQLITE_NOMEM; break; }
            r->metrics = m;
            r->cap = cap;
        }
        struct metric_cache *m = &r->metrics[r->nmetrics++];
        m->id = sqlite3_column_int64(s, 0);
        snprintf(m->name, sizeof m->name, "%s", (const char *)sqlite3_column_text(s, 1));
        m->kind = sqlite3_column_int(s, 2);
        m->n = m->kind == PROTO_SCALAR ? 1 : m->kind == PROTO_LAYER ? (uint32_t)r->layers : (uint32_t)(r->layers * r->heads);
        m->last_step = sqlite3_column_int64(s, 3);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        if (rc == SQLITE_NOMEM) store_set_err(st, SQLITE_NOMEM, "out of memory");
        else store_db_err(st, "loading metrics");
        free(r->metrics);
        free(r);
        return NULL;
    }
    if (st->nruns == st->capruns) {
        uint32_t cap = st->capruns ? st->capruns * 2 : 16;
        struct run_cache **rs = realloc(st->runs, cap * sizeof *rs);
        if (!rs) {
            free(r->metrics);
            free(r);
            store_set_err(st, SQLITE_NOMEM, "out of memory");
            return NULL;
        }
        st->runs = rs;
        st->capruns = cap;
    }
    st->runs[st->nruns++] = r;
    return r;
}

static void run_forget(struct store *st, int64_t id) {
    for (uint32_t i = 0; i < st->nruns; i++) {
        if (st->runs[i]->id != id) continue;
        free(st->runs[i]->metrics);
        free(st->runs[i]);
        st->runs[i] = st->runs[--st->nruns];
        return;
    }
}

int store_mark_live_stale(struct store *st, double now) {
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE runs SET status = 'stale', updated = %.3f WHERE status = 'live'", now);
    if (store_exec(st, sql)) return -1;
    return sqlite3_changes(st->db);
}

int store_run_open(struct store *st, const char *name, int64_t layers, int64_t heads, int64_t seq_len,
                   const char *meta, double now, struct store_run_info *out) {
    memset(out, 0, sizeof *out);
    sqlite3_stmt *s = st->stmt[S_RUN_BY_NAME];
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        out->id = sqlite3_column_int64(s, 0);
        out->layers = sqlite3_column_int64(s, 1);
        out->heads = sqlite3_column_int64(s, 2);
        out->last_seq = sqlite3_column_int64(s, 3);
        out->seq_len = seq_len;
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s); /* name is the caller's */
    if (rc == SQLITE_ROW) {
        if (out->layers != layers || out->heads != heads)
            return store_set_err(st, -2, "run %s has %lld layers x %lld heads, not %lld x %lld", name,
                           (long long)out->layers, (long long)out->heads, (long long)layers, (long long)heads);
        s = st->stmt[S_RUN_RESUME];
        sqlite3_bind_int64(s, 1, out->id);
    } else if (rc == SQLITE_DONE) {
        if (step_done(st, st->stmt[S_RUN_ID_NEXT], "creating run")) return -1;
        s = st->stmt[S_RUN_CREATE];
        sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, layers);
        sqlite3_bind_int64(s, 6, heads);
        out->created = 1;
        out->layers = layers;
        out->heads = heads;
        out->seq_len = seq_len;
    } else {
        return store_db_err(st, "looking up run");
    }
    sqlite3_bind_double(s, 2, now);
    sqlite3_bind_int64(s, 3, seq_len);
    if (meta) sqlite3_bind_text(s, 4, meta, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 4);
    int failed = step_done(st, s, "writing run");
    sqlite3_clear_bindings(s); /* name and meta are the caller's */
    if (failed) return -1;
    if (out->created) out->id = sqlite3_last_insert_rowid(st->db);
    return 0;
}

static struct metric_cache *metric_get(struct store *st, struct run_cache *r, const struct proto_metric *pm,
                                       uint32_t hint, int *conflict) {
    struct metric_cache *m = NULL;
    *conflict = 0;
    if (hint < r->nmetrics && strcmp(r->metrics[hint].name, pm->name) == 0) m = &r->metrics[hint];
    for (uint32_t i = 0; !m && i < r->nmetrics; i++)
        if (strcmp(r->metrics[i].name, pm->name) == 0) m = &r->metrics[i];
    if (m) {
        if (m->kind != pm->kind) *conflict = 1;
        return m;
    }
    if (r->nmetrics == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 16;
        struct metric_cache *nm = realloc(r->metrics, cap * sizeof *nm);
        if (!nm) { store_set_err(st, SQLITE_NOMEM, "out of memory"); return NULL; }
        r->metrics = nm;
        r->cap = cap;
    }
    sqlite3_stmt *s = st->stmt[S_INSERT_METRIC];
    sqlite3_bind_int64(s, 1, r->id);
    sqlite3_bind_text(s, 2, pm->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, pm->kind);
    if (step_done(st, s, "creating metric")) return NULL;
    m = &r->metrics[r->nmetrics++];
    memcpy(m->name, pm->name, sizeof m->name);
    m->id = sqlite3_last_insert_rowid(st->db);
    m->kind = pm->kind;
    m->n = pm->rows * pm->cols;
    m->last_step = -1;
    return m;
}

/* Grows the scratch buffers for metrics of n values. */
static int scratch_grow(struct store *st, uint32_t n) {
    if (n > st->aggcap) {
        struct rollup_cell *a = realloc(st->agg, n * sizeof *a);
        if (a) st->agg = a;
        struct rollup_cell *src = a ? realloc(st->aggsrc, n * sizeof *src) : NULL;
        if (src) st->aggsrc = src;
        unsigned char *row = src ? realloc(st->aggrow, ROLLUP_MAX_BYTES(n)) : NULL;
        if (!row) return store_set_err(st, SQLITE_NOMEM, "out of memory");
        st->aggrow = row;
        st->aggcap = n;
    }
    size_t vals = (size_t)n * FBLOCK_STEPS;
    if (vals > st->blockcap) {
        float *v = realloc(st->blockvals, vals * sizeof *v);
        if (!v) return store_set_err(st, SQLITE_NOMEM, "out of memory");
        st->blockvals = v;
        st->blockcap = vals;
    }
    return 0;
}

/* Writes the n cells at a as rollup block `block` of level `level` of
 * metric `metric_id`, coded (rollup.h): a row per chunk of cells, and the
 * total's row for a metric of several chunks. st->aggrow is the scratch
 * (room for ROLLUP_MAX_BYTES(n)). */
/* The crc of a row (integrity.h): its checksum, inverted when poisoned
 * (the row was pooled from a damaged one: it must read as damaged). */
static int64_t row_crc(uint32_t c, int poisoned) { return poisoned ? integrity_poisoned(c) : integrity_stored(c); }

static int rollup_put(struct store *st, int64_t metric_id, const struct rollup_cell *a, uint32_t n, int level,
                      int64_t block, int64_t nframes, int poisoned) {
    uint32_t chunks = ROLLUP_CHUNKS(n);
    sqlite3_stmt *s = st->stmt[S_INSERT_ROLLUP];
    for (uint32_t c = 0; c < chunks; c++) {
        uint32_t c0 = c * ROLLUP_CHUNK_CELLS, cn = ROLLUP_CHUNK_LEN(n, c);
        size_t len = chunks == 1 ? rollup_encode(a, n, (uint32_t)nframes, st->aggrow)
                                 : rollup_encode_chunk(a + c0, cn, (uint32_t)nframes, st->aggrow);
        sqlite3_bind_int64(s, 1, metric_id);
        sqlite3_bind_int(s, 2, level);
        sqlite3_bind_int64(s, 3, block);
        sqlite3_bind_int64(s, 4, nframes);
        sqlite3_bind_blob(s, 5, st->aggrow, (int)len, SQLITE_STATIC);
        sqlite3_bind_int(s, 6, (int)c);
        sqlite3_bind_int64(s, 7, row_crc(integrity_rollup_crc(metric_id, level, c, block, nframes, st->aggrow, len), poisoned));
        if (step_done(st, s, "writing rollup")) return -1;
    }
    if (chunks == 1) return 0;
    unsigned char tot[ROLLUP_TOTAL_BYTES];
    size_t len = rollup_total_encode(a, n, (uint32_t)nframes, tot);
    s = st->stmt[S_INSERT_TOTAL];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int(s, 2, level);
    sqlite3_bind_int64(s, 3, block);
    sqlite3_bind_int64(s, 4, nframes);
    sqlite3_bind_blob(s, 5, tot, (int)len, SQLITE_STATIC); /* an empty blob: no total */
    sqlite3_bind_int64(s, 7, row_crc(integrity_rollup_crc(metric_id, level, -1, block, nframes, tot, len), poisoned));
    return step_done(st, s, "writing rollup total");
}

/* Writes st->agg as rollup block `block` of level `level` of metric m. */
static int rollup_write(struct store *st, struct metric_cache *m, int level, int64_t block, int64_t nframes,
                        int poisoned) {
    return rollup_put(st, m->id, st->agg, m->n, level, block, nframes, poisoned);
}

/* Computes and stores rollup block `block` of level `level` (>= 2) for
 * metric m from the level below (rows of either format). An empty block
 * gets no row. A row below that fails its checksum or does not decode is
 * damaged: the block is written all the same but poisoned (integrity.h),
 * so that a reader of it reports the damage instead of a summary that
 * leaves the row out, and the damage is counted and logged once here. */
static int rollup_block(struct store *st, struct metric_cache *m, int level, int64_t block) {
    if (scratch_grow(st, m->n)) return -1;
    rollup_reset(st->agg, m->n);
    int64_t nframes = 0, bad_block = -1;
    int rc = SQLITE_DONE;
    sqlite3_stmt *s = st->stmt[S_SELECT_ROLLUPS];
    for (uint32_t c = 0; c < ROLLUP_CHUNKS(m->n) && rc == SQLITE_DONE; c++) {
        uint32_t c0 = c * ROLLUP_CHUNK_CELLS, cn = ROLLUP_CHUNK_LEN(m->n, c);
        sqlite3_bind_int64(s, 1, m->id);
        sqlite3_bind_int(s, 2, level - 1);
        sqlite3_bind_int64(s, 3, block * 8);
        sqlite3_bind_int64(s, 4, block * 8 + 8);
        sqlite3_bind_int(s, 5, (int)c);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            int64_t nf = sqlite3_column_int64(s, 0), b = sqlite3_column_int64(s, 3);
            const void *d = sqlite3_column_blob(s, 1);
            size_t len = (size_t)sqlite3_column_bytes(s, 1);
            if ((sqlite3_column_type(s, 2) != SQLITE_NULL &&
                 sqlite3_column_int64(s, 2) != integrity_stored(integrity_rollup_crc(m->id, level - 1, c, b, nf, d, len))) ||
                nf < 0 || nf > STORE_LEVEL_SIZE(level - 1) ||
                rollup_decode(d, len, cn, (uint32_t)nf, 0, cn, st->aggsrc + c0)) {
                if (bad_block < 0) bad_block = b;
                continue;
            }
            if (!c) nframes += nf; /* every chunk has the block's frames */
            for (uint32_t i = c0; i < c0 + cn; i++) rollup_merge(&st->agg[i], &st->aggsrc[i]);
        }
        sqlite3_reset(s);
    }
    if (rc != SQLITE_DONE) return store_db_err(st, "reading rollup source");
    if (bad_block >= 0) {
        integrity_note();
        fprintf(stderr, "entropyd: store: damaged rollup row: metric %lld, level %d, block %lld (steps %lld..%lld) fails "
                "its checksum or does not decode; level %d block %lld, pooled from it, is marked damaged too\n",
                (long long)m->id, level - 1, (long long)bad_block, (long long)(bad_block * STORE_LEVEL_SIZE(level - 1)),
                (long long)((bad_block + 1) * STORE_LEVEL_SIZE(level - 1) - 1), level, (long long)block);
        if (!nframes) nframes = 1; /* a row must be there, for readers to find the damage */
    }
    return nframes ? rollup_write(st, m, level, block, nframes, bad_block >= 0) : 0;
}

/* Seals block `block` of metric m (its steps are complete): its raw frames
 * become its level-1 rollup and its coded rows (fblock_rows.h), and
 * leave `frames`. A block without raw frames is left as it is (one sealed
 * before a rewind that ended at its last step). */
static int block_seal(struct store *st, struct metric_cache *m, int64_t block) {
    int64_t lo = block * FBLOCK_STEPS;
    uint64_t mask = 0;
    uint32_t nf = 0;
    int rc;
    int64_t bad = -1; /* a frame that fails its checksum: the block is sealed poisoned */
    if (scratch_grow(st, m->n)) return -1;
    sqlite3_stmt *s = st->stmt[S_SEAL_FRAMES];
    sqlite3_bind_int64(s, 1, m->id);
    sqlite3_bind_int64(s, 2, lo);
    sqlite3_bind_int64(s, 3, lo + FBLOCK_STEPS);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(s, 0);
        if ((uint32_t)sqlite3_column_bytes(s, 1) != m->n * 4) continue; /* cannot happen: shapes are fixed per run */
        if (sqlite3_column_type(s, 2) != SQLITE_NULL &&
            sqlite3_column_int64(s, 2) != integrity_stored(integrity_frame_crc(m->id, step, sqlite3_column_blob(s, 1),
                                                                               (size_t)m->n * 4)))
            bad = step;
        memcpy(st->blockvals + (size_t)nf * m->n, sqlite3_column_blob(s, 1), (size_t)m->n * 4);
        mask |= UINT64_C(1) << (step - lo);
        nf++;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return store_db_err(st, "reading a block's frames");
    if (!nf) return 0;
    rollup_reset(st->agg, m->n);
    for (uint32_t f = 0; f < nf; f++) {
        const float *v = st->blockvals + (size_t)f * m->n;
        for (uint32_t i = 0; i < m->n; i++) rollup_add(&st->agg[i], v[i]);
    }
    if (bad >= 0) {
        integrity_note();
        fprintf(stderr, "entropyd: store: damaged raw frame: metric %lld, step %lld fails its checksum; its block "
                "(steps %lld..%lld) is sealed marked damaged\n", (long long)m->id, (long long)bad, (long long)lo,
                (long long)(lo + FBLOCK_STEPS - 1));
    }
    if (rollup_write(st, m, 1, block, nf, bad >= 0)) return -1;
    if (st->lossy_bits) fblock_round(st->blockvals, (size_t)nf * m->n, st->lossy_bits);
    int put = fblock_rows_put(st->rows, m->id, block, mask, st->blockvals, nf, m->n, bad >= 0);
    if (store_rows_err(st, put, m->id, block, "writing a block")) return -1;
    if (put == 1) return 0; /* a step past 2^32: its frames stay raw */
    s = st->stmt[S_SEAL_DELETE];
    sqlite3_bind_int64(s, 1, m->id);
    sqlite3_bind_int64(s, 2, lo);
    sqlite3_bind_int64(s, 3, lo + FBLOCK_STEPS);
    return step_done(st, s, "deleting a sealed block's frames");
}

/* A new frame at `step` completes every block that held the metric's
 * previous last step and ends at or before `step`: level 1 is the block of
 * frames itself (sealed), higher levels roll up the level below. */
static int rollup_advance(struct store *st, struct metric_cache *m, int64_t step) {
    if (m->last_step < 0) return 0;
    for (int k = 1; k <= STORE_LEVELS; k++) {
        int64_t size = STORE_LEVEL_SIZE(k);
        int64_t pb = m->last_step / size;
        if (step / size <= pb) break; /* higher levels cannot complete either */
        if (k == 1 ? block_seal(st, m, pb) : rollup_block(st, m, k, pb)) return -1;
    }
    return 0;
}

/* The last frame of metric m, raw or in its last block: its step (-1 when
 * it has none) and values in st->blockvals. */
static int last_frame(struct store *st, struct metric_cache *m, int64_t *step) {
    *step = -1;
    if (scratch_grow(st, m->n)) return -1;
    sqlite3_stmt *s = st->stmt[S_LAST_FRAME];
    sqlite3_bind_int64(s, 1, m->id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && (uint32_t)sqlite3_column_bytes(s, 1) == m->n * 4) {
        *step = sqlite3_column_int64(s, 0);
        memcpy(st->blockvals, sqlite3_column_blob(s, 1), (size_t)m->n * 4);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store_db_err(st, "reading the last frame");
    int64_t block;
    uint64_t mask;
    fblock_rows_walk(st->rows, m->id, 0, INT64_MAX, 1, m->n, 0, m->n);
    int r = fblock_rows_next(st->rows, &block, &mask, st->blockvals), ret = 0;
    fblock_rows_end(st->rows);
    if (r < 0) return store_rows_err(st, r, m->id, -1, "reading the last block");
    uint32_t nf = fblock_count(mask);
    int64_t last = r ? fblock_step(block, mask, nf - 1) : -1;
    if (last > *step) {
        memmove(st->blockvals, st->blockvals + (size_t)(nf - 1) * m->n, (size_t)m->n * 4);
        *step = last;
    }
    return ret;
}

/* Refreshes the latest rows of every metric of r from its frames and
 * blocks (after a rewind moved its newest frames away): a seek or two per
 * metric. */
static int latest_reload(struct store *st, struct run_cache *r) {
    char sql[160];
    snprintf(sql, sizeof sql, "DELETE FROM latest WHERE metric_id IN (SELECT id FROM metrics WHERE run_id = %lld)",
             (long long)r->id);
    if (store_exec(st, sql)) return -1;
    for (uint32_t i = 0; i < r->nmetrics; i++) {
        struct metric_cache *m = &r->metrics[i];
        int64_t step;
        if (last_frame(st, m, &step)) return -1;
        if (step < 0) continue;
        sqlite3_stmt *s = st->stmt[S_UPSERT_LATEST];
        sqlite3_bind_int64(s, 1, m->id);
        sqlite3_bind_int64(s, 2, step);
        sqlite3_bind_blob(s, 3, st->blockvals, (int)(m->n * sizeof(float)), SQLITE_STATIC);
        if (step_done(st, s, "writing latest value")) return -1;
    }
    return 0;
}

/* Starts a rewind of r to `step`: a branch row (its id above any still
 * being purged), the rewinds row and the event. */
static int rewind_start(struct store *st, struct run_cache *r, int64_t step, double time) {
    char sql[700];
    long long id = (long long)r->id, from = (long long)step;
    snprintf(sql, sizeof sql,
             "INSERT INTO branches(id, run_id, from_step, to_step, time) VALUES (max(coalesce((SELECT max(id) FROM branches), 0), "
             "coalesce((SELECT max(id) FROM purge WHERE kind = 1), 0)) + 1, %lld, %lld, %lld, %.6f);"
             "INSERT INTO rewinds(run_id, branch_id, from_step) VALUES (%lld, last_insert_rowid(), %lld);",
             id, from, (long long)r->last_step, time, id, from);
    if (store_exec(st, sql)) return -1;
    char text[128];
    snprintf(text, sizeof text, "rollback to step %lld (was at step %lld; the abandoned steps are kept as a branch)",
             from, (long long)r->last_step);
    if (store_event(st, r->id, 0, time, PROTO_WARN, text)) return -1;
    r->rewinding = 1;
    return 0;
}

int64_t store_run_changes(struct store *st, sqlite3_stmt *s, const char *what) {
    if (step_done(st, s, what)) return -1;
    return sqlite3_changes64(st->db);
}

/* Writes frame (metric_id, step) of n values into `frames`. */
static int frame_insert(struct store *st, int64_t metric_id, int64_t step, const float *v, uint32_t n, const char *what) {
    sqlite3_stmt *s = st->stmt[S_INSERT_FRAME];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_blob(s, 3, v, (int)(n * sizeof(float)), SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, integrity_stored(integrity_frame_crc(metric_id, step, v, n * sizeof(float))));
    return step_done(st, s, what);
}

/* Puts one frame (n values) into a branch's abandoned frames, or back
 * into `frames` when branch is 0. */
static int frame_put(struct store *st, int64_t branch, int64_t metric_id, int64_t step, const float *v, uint32_t n) {
    if (!branch) return frame_insert(st, metric_id, step, v, n, "moving a frame out of its block");
    sqlite3_stmt *s = st->stmt[S_INSERT_ABANDONED];
    sqlite3_bind_int64(s, 1, branch);
    sqlite3_bind_int64(s, 2, metric_id);
    sqlite3_bind_int64(s, 3, step);
    sqlite3_bind_blob(s, 4, v, (int)(n * sizeof(float)), SQLITE_STATIC);
    return step_done(st, s, "moving a frame out of its block");
}

/* Moves metric m's sealed blocks holding steps >= from into the branch,
 * the highest first, a block at a time, charging its frames to *left: the
 * frames at or after `from` go to the branch, those before it (in the
 * block holding `from`) back to `frames`, where the block is open again.
 * Returns 1 when the budget ran out (more may be left), 0 when no such
 * block is left, -1 on failure. */
static int rewind_blocks(struct store *st, struct metric_cache *m, int64_t from, int64_t branch, int64_t *left) {
    if (scratch_grow(st, m->n)) return -1;
    while (*left > 0) {
        int64_t block;
        uint64_t mask;
        fblock_rows_walk(st->rows, m->id, from / FBLOCK_STEPS, INT64_MAX, 1, m->n, 0, m->n);
        int r = fblock_rows_next(st->rows, &block, &mask, st->blockvals);
        fblock_rows_end(st->rows);
        if (r <= 0) return r ? store_rows_err(st, r, m->id, -1, "reading blocks to rewind") : 0;
        uint32_t nf = fblock_count(mask);
        for (uint32_t f = 0; f < nf; f++) {
            int64_t step = fblock_step(block, mask, f);
            if (frame_put(st, step >= from ? branch : 0, m->id, step, st->blockvals + (size_t)f * m->n, m->n))
                return -1;
        }
        if (store_rows_err(st, fblock_rows_delete(st->rows, m->id, block), m->id, block, "deleting a rewound block")) return -1;
        *left -= nf;
    }
    return 1;
}

int store_rewind(struct store *st, int64_t run_id, int64_t step, double time, int64_t budget) {
    struct run_cache *r = run_get(st, run_id);
    if (!r) return -1;
    if (budget < 1) budget = 1;
    if (!r->rewinding) {
        if (r->last_step < 0 || step > r->last_step) return 0;
        if (rewind_start(st, r, step, time)) return -1;
    }
    sqlite3_stmt *s = st->stmt[S_SELECT_REWIND];
    sqlite3_bind_int64(s, 1, run_id);
    int rc = sqlite3_step(s);
    int64_t branch = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    int64_t from = rc == SQLITE_ROW ? sqlite3_column_int64(s, 1) : 0;
    sqlite3_reset(s);
    if (rc != SQLITE_ROW) return rc == SQLITE_DONE ? store_set_err(st, SQLITE_CORRUPT, "rewind of run %lld lost", (long long)run_id)
                                                   : store_db_err(st, "reading rewind");
    int64_t left = budget, n;
    char sql[256];
    /* 1. rollups from the block holding `from` on (few rows, of at most 64
     * values, up to 20 bytes each, ~12 coded: each counts as 4 frames; a
     * total's row too), so no reader
     * sees a rollup over frames already moved */
    for (; r->rewind_phase == 0 && r->rewind_metric < r->nmetrics && left > 0; r->rewind_metric++) {
        const struct metric_cache *m = &r->metrics[r->rewind_metric];
        uint32_t chunks = ROLLUP_CHUNKS(m->n);
        for (int k = 1; k <= STORE_LEVELS && left > 0; k++) {
            /* the chunks' rows, then (c == chunks) the totals' */
            for (uint32_t c = 0; c <= chunks && left > 0; c++) {
                if (c == chunks && chunks == 1) break;
                s = st->stmt[c < chunks ? S_REWIND_ROLLUPS : S_REWIND_TOTALS];
                sqlite3_bind_int64(s, 1, m->id);
                sqlite3_bind_int(s, 2, k);
                sqlite3_bind_int64(s, 3, from / STORE_LEVEL_SIZE(k));
                sqlite3_bind_int64(s, 4, (left + 3) / 4);
                if (c < chunks) sqlite3_bind_int(s, 5, (int)c);
                if ((n = store_run_changes(st, s, "deleting rewound rollups")) < 0) return -1;
                left -= 4 * n;
            }
        }
        if (left <= 0) break; /* this metric may have more */
    }
    if (r->rewind_phase == 0 && r->rewind_metric >= r->nmetrics) {
        r->rewind_phase = 1;
        r->rewind_metric = 0;
    }
    /* 2. frames, the highest steps first, into the branch */
    for (; r->rewind_phase == 1 && r->rewind_metric < r->nmetrics && left > 0; r->rewind_metric++) {
        int64_t mid = r->metrics[r->rewind_metric].id, lo = from;
        s = st->stmt[S_REWIND_LOW];
        sqlite3_bind_int64(s, 1, mid);
        sqlite3_bind_int64(s, 2, from);
        sqlite3_bind_int64(s, 3, left - 1);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) lo = sqlite3_column_int64(s, 0);
        sqlite3_reset(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store_db_err(st, "reading frames to rewind");
        s = st->stmt[S_REWIND_MOVE];
        sqlite3_bind_int64(s, 1, mid);
        sqlite3_bind_int64(s, 2, lo);
        sqlite3_bind_int64(s, 3, branch);
        if (step_done(st, s, "moving frames to a branch")) return -1;
        s = st->stmt[S_REWIND_DELETE];
        sqlite3_bind_int64(s, 1, mid);
        sqlite3_bind_int64(s, 2, lo);
        if ((n = store_run_changes(st, s, "deleting rewound frames")) < 0) return -1;
        left -= n;
        if (rc == SQLITE_ROW) break; /* the budget ran out inside this metric */
    }
    if (r->rewind_phase == 1 && r->rewind_metric >= r->nmetrics) {
        r->rewind_phase = 2;
        r->rewind_metric = 0;
    }
    /* 3. sealed blocks, the highest first, into the branch */
    for (; r->rewind_phase == 2 && r->rewind_metric < r->nmetrics && left > 0; r->rewind_metric++) {
        int more = rewind_blocks(st, &r->metrics[r->rewind_metric], from, branch, &left);
        if (more < 0) return -1;
        if (more) break; /* the budget ran out inside this metric */
    }
    if (r->rewind_phase == 2 && r->rewind_metric >= r->nmetrics) r->rewind_phase = 3;
    /* 4. steps (small rows: 8 per frame's worth) */
    if (r->rewind_phase == 3 && left > 0) {
        int64_t want = left * 8;
        s = st->stmt[S_REWIND_STEPS];
        sqlite3_bind_int64(s, 1, run_id);
        sqlite3_bind_int64(s, 2, from);
        sqlite3_bind_int64(s, 3, want - 1);
        if ((n = store_run_changes(st, s, "deleting rewound steps")) < 0) return -1;
        if (n >= want) left = 0;
    } else if (r->rewind_phase < 3) {
        left = 0;
    }
    if (left <= 0) return 1;
    /* 5. done: the run continues from `from` */
    snprintf(sql, sizeof sql, "DELETE FROM rewinds WHERE run_id = %lld", (long long)run_id);
    if (store_exec(st, sql)) return -1;
    int64_t last_seq = r->last_seq;
    double updated = r->updated;
    run_forget(st, run_id);
    r = run_get(st, run_id); /* the metrics' last steps from what remains */
    if (!r) return -1;
    r->last_seq = last_seq;
    r->updated = updated;
    r->last_step = from - 1;
    if (run_save(st, r) || latest_reload(st, r)) return -1;
    return 0;
}

int store_needs_rewind(struct store *st, int64_t run_id, int64_t step) {
    struct run_cache *r = run_get(st, run_id);
    if (!r) return -1;
    return r->rewinding || (r->last_step >= 0 && step <= r->last_step);
}

int store_step(struct store *st, int64_t run_id, int64_t seq, const struct proto_msg *msg, double time,
               char *conflict, size_t cap) {
    struct run_cache *r = run_get(st, run_id);
    int conflicts = 0;
    if (!r) return -1;
    /* a caller that did not rewind in chunks first (store.h) has it done
     * here, whole, in its transaction */
    while (r->rewinding || (r->last_step >= 0 && msg->step <= r->last_step)) {
        if (store_rewind(st, run_id, msg->step, time, INT64_MAX / 16) < 0) return -1;
        r = run_get(st, run_id);
        if (!r) return -1;
    }
    sqlite3_stmt *s = st->stmt[S_INSERT_STEP];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, msg->step);
    sqlite3_bind_int64(s, 3, seq);
    sqlite3_bind_double(s, 4, time);
    if (step_done(st, s, "writing step")) return -1;
    for (uint32_t i = 0; i < msg->nmetrics; i++) {
        const struct proto_metric *pm = &msg->metrics[i];
        int conf;
        struct metric_cache *m = metric_get(st, r, pm, i, &conf);
        if (!m) return -1;
        if (conf || m->n != pm->rows * pm->cols) {
            if (!conflicts++ && cap) snprintf(conflict, cap, "%s", pm->name);
            continue;
        }
        if (rollup_advance(st, m, msg->step)) return -1;
        if (frame_insert(st, m->id, msg->step, msg->values + pm->offset, m->n, "writing frame")) return -1;
        s = st->stmt[S_UPSERT_LATEST];
        sqlite3_bind_int64(s, 1, m->id);
        sqlite3_bind_int64(s, 2, msg->step);
        sqlite3_bind_blob(s, 3, msg->values + pm->offset, (int)(m->n * sizeof(float)), SQLITE_STATIC);
        if (step_done(st, s, "writing latest value")) return -1;
        m->last_step = msg->step;
    }
    r->last_seq = seq;
    r->last_step = msg->step;
    r->updated = time;
    if (run_save(st, r)) return -1;
    return conflicts ? 1 : 0;
}

int store_event(struct store *st, int64_t run_id, int64_t seq, double time, int level, const char *text) {
    sqlite3_stmt *s = st->stmt[S_INSERT_EVENT];
    sqlite3_bind_int64(s, 1, run_id);
    if (seq > 0) sqlite3_bind_int64(s, 2, seq);
    else sqlite3_bind_null(s, 2);
    sqlite3_bind_double(s, 3, time);
    sqlite3_bind_text(s, 4, proto_level_name(level), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, text, -1, SQLITE_STATIC);
    if (step_done(st, s, "writing event")) return -1;
    if (seq > 0) {
        struct run_cache *r = run_get(st, run_id);
        if (!r) return -1;
        r->last_seq = seq;
        r->updated = time;
        if (run_save(st, r)) return -1;
    }
    return 0;
}

int store_run_status(struct store *st, int64_t run_id, int status, int64_t seq, double now) {
    sqlite3_stmt *s = st->stmt[S_RUN_STATUS];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_text(s, 2, proto_status_name(status), -1, SQLITE_STATIC); /* a static string */
    sqlite3_bind_double(s, 3, now);
    if (step_done(st, s, "setting run status")) return -1;
    if (seq > 0) {
        struct run_cache *r = run_get(st, run_id);
        if (!r) return -1;
        r->last_seq = seq;
        r->updated = now;
        if (run_save(st, r)) return -1;
    }
    /* a run that is not live sends nothing until its next hello: its cache
     * goes, so that the cache holds live runs only, however many are stored */
    if (status != PROTO_LIVE) run_forget(st, run_id);
    return 0;
}

int store_run_delete(struct store *st, int64_t run_id) {
    char sql[1024];
    long long id = (long long)run_id;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(st->db, "SELECT 1 FROM runs WHERE id = ?1", -1, &s, NULL) != SQLITE_OK)
        return store_db_err(st, "looking up run");
    sqlite3_bind_int64(s, 1, run_id);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc == SQLITE_DONE) return store_set_err(st, -3, "no run %lld", id);
    if (rc != SQLITE_ROW) return store_db_err(st, "looking up run");
    /* the small rows go now (runs cascades to metrics, events, alerts,
     * branches, rewinds); the bulk is listed in purge for store_purge */
    snprintf(sql, sizeof sql,
             "INSERT OR IGNORE INTO purge(kind, id) SELECT 0, id FROM metrics WHERE run_id = %lld;"
             "INSERT OR IGNORE INTO purge(kind, id) SELECT 1, id FROM branches WHERE run_id = %lld;"
             "INSERT OR IGNORE INTO purge(kind, id) VALUES (2, %lld);"
             "DELETE FROM latest WHERE metric_id IN (SELECT id FROM metrics WHERE run_id = %lld);"
             "DELETE FROM runs WHERE id = %lld;",
             id, id, id, id, id);
    if (store_exec(st, sql)) return -1;
    run_forget(st, run_id);
    return 0;
}

int64_t store_run_last_seq(struct store *st, int64_t run_id) {
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(st->db, "SELECT last_seq FROM runs WHERE id = ?1", -1, &s, NULL) != SQLITE_OK) return -1;
    sqlite3_bind_int64(s, 1, run_id);
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

int64_t store_db_bytes(struct store *st) {
    int64_t pages = pragma_int(st, "PRAGMA page_count");
    int64_t size = pragma_int(st, "PRAGMA page_size");
    return pages < 0 || size < 0 ? -1 : pages * size;
}

const char *store_path(struct store *st) { return sqlite3_db_filename(st->db, "main"); }

static int64_t store_wal_bytes(struct store *st) { return store_wal_bytes_of(sqlite3_db_filename(st->db, "main")); }

int64_t store_wal_bytes_of(const char *db) {
    char path[4096];
    struct stat sb;
    if (!db || !*db || snprintf(path, sizeof path, "%s-wal", db) >= (int)sizeof path) return -1;
    if (stat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    return (int64_t)sb.st_size;
}

int64_t store_wal_used(struct store *st) { return st->wal_frames * (st->page_size + 24); }

int store_checkpoint(struct store *st, int restart, int busy_ms, int64_t *wal_bytes) {
    int log = 0, done = 0;
    sqlite3_busy_timeout(st->db, busy_ms);
    int mode = restart > 1 ? SQLITE_CHECKPOINT_TRUNCATE : restart ? SQLITE_CHECKPOINT_RESTART : SQLITE_CHECKPOINT_PASSIVE;
    int rc = sqlite3_wal_checkpoint_v2(st->db, NULL, mode, &log, &done);
    sqlite3_busy_timeout(st->db, 5000);
    if (wal_bytes) *wal_bytes = store_wal_bytes(st);
    if (rc == SQLITE_OK && restart) st->wal_frames = 0; /* the next write starts the log over */
    if (rc == SQLITE_BUSY) return 1;
    if (rc != SQLITE_OK) return store_db_err(st, "checkpointing the WAL");
    return 0;
}

int store_set_max_pages(struct store *st, int64_t max_pages) {
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %lld", (long long)(max_pages > 0 ? max_pages : 4294967294LL));
    return store_exec(st, sql);
}

int store_alert_transition(struct store *st, const struct store_alert *a, int64_t *alert_id) {
    sqlite3_stmt *s = NULL;
    int ret = -1;
    int64_t id = 0;
    /* the open episode of this group, if any (also one left by an earlier daemon) */
    if (sqlite3_prepare_v2(st->db, "SELECT id FROM alerts WHERE run_id = ?1 AND rule = ?2 AND state = 'firing' "
                           "ORDER BY id DESC LIMIT 1", -1, &s, NULL) != SQLITE_OK) goto dberr;
    sqlite3_bind_int64(s, 1, a->run_id);
    sqlite3_bind_text(s, 2, a->rule, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) id = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    s = NULL;
    int resolved = strcmp(a->transition, "resolved") == 0;
    if (!id) {
        if (resolved) { ret = 0; goto out; } /* nothing open: never a resolved without a firing */
        if (sqlite3_prepare_v2(st->db, "INSERT INTO alerts(run_id, rule, severity, fingerprint, state, starts_at, "
                               "start_step, last_step, value, cells, payload) VALUES (?1, ?2, ?3, ?4, 'firing', ?5, ?6, "
                               "?7, ?8, ?9, ?10)", -1, &s, NULL) != SQLITE_OK) goto dberr;
        sqlite3_bind_int64(s, 1, a->run_id);
        sqlite3_bind_text(s, 2, a->rule, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, a->severity, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, a->fingerprint, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 5, a->starts_at);
        sqlite3_bind_int64(s, 6, a->start_step);
        sqlite3_bind_int64(s, 7, a->step);
        if (isfinite(a->value)) sqlite3_bind_double(s, 8, a->value);
        else sqlite3_bind_null(s, 8);
        sqlite3_bind_text(s, 9, a->cells_json, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 10, a->payload, -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE) goto dberr;
        id = sqlite3_last_insert_rowid(st->db);
    } else {
        if (sqlite3_prepare_v2(st->db, "UPDATE alerts SET state = ?2, ends_at = ?3, last_step = ?4, value = ?5, "
                               "cells = ?6, payload = ?7, reason = ?8 WHERE id = ?1", -1, &s, NULL) != SQLITE_OK) goto dberr;
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_text(s, 2, resolved ? "resolved" : "firing", -1, SQLITE_STATIC);
        if (resolved) sqlite3_bind_double(s, 3, a->ends_at);
        else sqlite3_bind_null(s, 3);
        sqlite3_bind_int64(s, 4, a->step);
        if (isfinite(a->value)) sqlite3_bind_double(s, 5, a->value);
        else sqlite3_bind_null(s, 5);
        sqlite3_bind_text(s, 6, a->cells_json, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 7, a->payload, -1, SQLITE_STATIC);
        if (resolved && a->reason) sqlite3_bind_text(s, 8, a->reason, -1, SQLITE_STATIC);
        else sqlite3_bind_null(s, 8);
        if (sqlite3_step(s) != SQLITE_DONE) goto dberr;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (sqlite3_prepare_v2(st->db, "INSERT INTO alert_transitions(alert_id, time, step, transition, value, cells) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6)", -1, &s, NULL) != SQLITE_OK) goto dberr;
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_double(s, 2, a->time);
    sqlite3_bind_int64(s, 3, a->step);
    sqlite3_bind_text(s, 4, a->transition, -1, SQLITE_STATIC);
    if (isfinite(a->value)) sqlite3_bind_double(s, 5, a->value);
    else sqlite3_bind_null(s, 5);
    sqlite3_bind_text(s, 6, a->cells_json, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_DONE) goto dberr;
    if (alert_id) *alert_id = id;
    ret = 0;
    goto out;
dberr:
    store_db_err(st, "writing alert");
out:
    sqlite3_finalize(s);
    return ret;
}

int store_alerts_close_run(struct store *st, int64_t run_id, double now) {
    sqlite3_stmt *s = st->stmt[S_ALERTS_CLOSE_RUN];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_double(s, 2, now);
    return step_done(st, s, "closing the run's alerts");
}

int store_run_is_live(struct store *st, int64_t run_id) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(st->db, "SELECT status = 'live' FROM runs WHERE id = ?1", -1, &s, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_int64(s, 1, run_id);
    int rc = sqlite3_step(s);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) != 0 : rc == SQLITE_DONE ? 0 : -1;
    sqlite3_finalize(s);
    return v;
}

/* ---- run summary and verdict (issue 15; schema/005_runs.sql) ---- */

int store_run_verdict(struct store *st, int64_t run_id, const char *verdict, int64_t since_step,
                      const char *heads_json, const char *rule, const char *evidence_json) {
    sqlite3_stmt *s = st->stmt[S_RUN_VERDICT];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_text(s, 2, verdict, -1, SQLITE_STATIC);
    if (since_step >= 0) sqlite3_bind_int64(s, 3, since_step);
    else sqlite3_bind_null(s, 3);
    sqlite3_bind_text(s, 4, heads_json ? heads_json : "[]", -1, SQLITE_STATIC);
    if (rule) sqlite3_bind_text(s, 5, rule, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 5);
    if (evidence_json) sqlite3_bind_text(s, 6, evidence_json, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 6);
    int failed = step_done(st, s, "writing the verdict");
    sqlite3_clear_bindings(s); /* the strings are the caller's */
    return failed ? -1 : 0;
}

int store_run_summary_step(struct store *st, int64_t run_id, const struct proto_msg *msg) {
    double loss = NAN, ent = NAN;
    int has_loss = 0;
    for (uint32_t i = 0; i < msg->nmetrics; i++) {
        const struct proto_metric *pm = &msg->metrics[i];
        if (pm->kind == PROTO_SCALAR && !strcmp(pm->name, "loss")) {
            loss = msg->values[pm->offset];
            has_loss = 1;
        } else if (pm->kind == PROTO_HEAD && !strcmp(pm->name, "entropy_norm")) {
            const float *v = msg->values + pm->offset;
            for (uint32_t k = 0; k < pm->rows * pm->cols; k++)
                if (isfinite(v[k]) && !(v[k] >= ent)) ent = v[k];
        }
    }
    if (!has_loss && isnan(ent)) return 0;
    if (!st->summary_stmt &&
        sqlite3_prepare_v3(st->db, "INSERT INTO run_summary(run_id, last_loss, min_entropy) VALUES (?1, ?2, ?3) "
                           "ON CONFLICT(run_id) DO UPDATE SET "
                           "last_loss = CASE WHEN ?4 THEN excluded.last_loss ELSE last_loss END, "
                           "min_entropy = CASE WHEN excluded.min_entropy IS NULL THEN min_entropy "
                           "WHEN min_entropy IS NULL OR excluded.min_entropy < min_entropy THEN excluded.min_entropy "
                           "ELSE min_entropy END",
                           -1, SQLITE_PREPARE_PERSISTENT, &st->summary_stmt, NULL) != SQLITE_OK)
        return store_db_err(st, "preparing the run summary");
    sqlite3_stmt *s = st->summary_stmt;
    sqlite3_bind_int64(s, 1, run_id);
    if (has_loss && isfinite(loss)) sqlite3_bind_double(s, 2, loss);
    else sqlite3_bind_null(s, 2); /* a NaN loss is stored as NULL: the verdict says diverged */
    if (isfinite(ent)) sqlite3_bind_double(s, 3, ent);
    else sqlite3_bind_null(s, 3);
    sqlite3_bind_int(s, 4, has_loss);
    return step_done(st, s, "writing the run summary");
}

void store_set_lossy_bits(struct store *st, int bits) { st->lossy_bits = bits >= 1 && bits <= 22 ? bits : 0; }

void store_release_memory(struct store *st) { sqlite3_db_release_memory(st->db); }
