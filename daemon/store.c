/* store.c: entropyd's SQLite write side: opening and migrating the
 * database, transactions, the run cache, runs and events, the WAL. See
 * store.h for the contract and schema/storage.md for the layout. It knows
 * SQL and blobs, nothing of sockets or threads (the writer thread calls
 * it). What a step writes is store_step.c, what the alert engine writes
 * store_alerts.c, what takes data away in bounded chunks store_purge.c;
 * what they share is store_int.h. */
#include "store.h"
#include "store_int.h"

#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static const char *const stmt_sql[S_COUNT] = {
    [S_INSERT_FRAME] = "INSERT OR REPLACE INTO frames(metric_id, step, data, crc) VALUES (?1, ?2, ?3, ?4)",
    [S_INSERT_STEP] = "INSERT OR REPLACE INTO steps(run_id, step, seq, time) VALUES (?1, ?2, ?3, ?4)",
    /* an id above every live one and every one still being purged: frames
     * of a deleted metric must never be taken for a new one's */
    [S_INSERT_METRIC] =
        "INSERT INTO metrics(id, run_id, name, kind) VALUES (max(coalesce((SELECT max(id) FROM metrics), 0), "
        "coalesce((SELECT max(id) FROM purge WHERE kind = 0), 0)) + 1, ?1, ?2, ?3)",
    /* crc: integrity.h (migration 11) */
    [S_INSERT_ROLLUP] = "INSERT OR REPLACE INTO rollups(metric_id, level, chunk, block, nframes, data, crc) "
                        "VALUES (?1, ?2, ?6, ?3, ?4, ?5, ?7)",
    [S_INSERT_TOTAL] = "INSERT OR REPLACE INTO rollup_totals(metric_id, level, block, nframes, data, crc) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?7)",
    [S_SEAL_FRAMES] =
        "SELECT step, data, crc FROM frames WHERE metric_id = ?1 AND step >= ?2 AND step < ?3 ORDER BY step",
    [S_SEAL_DELETE] = "DELETE FROM frames WHERE metric_id = ?1 AND step >= ?2 AND step < ?3",
    [S_INSERT_ABANDONED] = "INSERT INTO abandoned_frames(branch_id, metric_id, step, data) VALUES (?1, ?2, ?3, ?4)",
    [S_LAST_FRAME] = "SELECT step, data FROM frames WHERE metric_id = ?1 ORDER BY step DESC LIMIT 1",
    [S_SELECT_ROLLUPS] =
        "SELECT nframes, data, crc, block FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 "
        "AND block >= ?3 AND block < ?4",
    [S_UPDATE_RUN] = "UPDATE runs SET last_seq = ?2, last_step = ?3, updated = ?4 WHERE id = ?1",
    [S_INSERT_EVENT] = "INSERT INTO events(run_id, seq, time, level, text) VALUES (?1, ?2, ?3, ?4, ?5)",
    [S_SELECT_RUN] = "SELECT layers, heads, last_seq, last_step, updated, "
                     "(SELECT count(*) FROM rewinds WHERE run_id = ?1) FROM runs WHERE id = ?1",
    /* the last step, or a step of the last block (which is all that
     * sealing needs, store.c rollup_advance), -1 for none */
    [S_SELECT_METRICS] =
        "SELECT m.id, m.name, m.kind, max(coalesce((SELECT max(step) FROM frames f WHERE f.metric_id = m.id), -1), "
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
    [S_REWIND_ROLLUPS] =
        "DELETE FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 AND block IN "
        "(SELECT block FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 AND block >= ?3 LIMIT ?4)",
    [S_REWIND_TOTALS] = "DELETE FROM rollup_totals WHERE metric_id = ?1 AND level = ?2 AND block IN (SELECT block "
                        "FROM rollup_totals WHERE metric_id = ?1 AND level = ?2 AND block >= ?3 LIMIT ?4)",
    [S_PURGE_NEXT] = "SELECT kind, id FROM purge LIMIT 1",
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_SAVEPOINT] = "SAVEPOINT item",
    [S_RELEASE] = "RELEASE item",
    [S_RUN_BY_NAME] = "SELECT id, layers, heads, last_seq FROM runs WHERE name = ?1",
    [S_RUN_RESUME] =
        "UPDATE runs SET status = 'live', updated = ?2, seq_len = ?3, meta = coalesce(?4, meta) WHERE id = ?1",
    /* ids come from id_seq (migration 3) so a deleted run's id is never reused */
    [S_RUN_ID_NEXT] =
        "UPDATE id_seq SET last = max(last, (SELECT coalesce(max(id), 0) FROM runs)) + 1 WHERE name = 'runs'",
    [S_RUN_CREATE] =
        "INSERT INTO runs(id, name, status, created, updated, seq_len, meta, layers, heads) "
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

/* ---- rollup rows: the rollup migration recodes them, store_step.c
 * writes the blocks it seals */

/* The crc of a row (integrity.h): its checksum, inverted when poisoned
 * (the row was pooled from a damaged one: it must read as damaged). */
static int64_t row_crc(uint32_t c, int poisoned) { return poisoned ? integrity_poisoned(c) : integrity_stored(c); }

/* Writes the n cells at a as rollup block `block` of level `level` of
 * metric `metric_id`, coded (rollup.h): a row per chunk of cells, and the
 * total's row for a metric of several chunks. st->aggrow is the scratch
 * (room for ROLLUP_MAX_BYTES(n)). */
int store_rollup_put(struct store *st, int64_t metric_id, const struct rollup_cell *a, uint32_t n, int level,
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
        sqlite3_bind_int64(
            s, 7, row_crc(integrity_rollup_crc(metric_id, level, c, block, nframes, st->aggrow, len), poisoned));
        if (store_step_done(st, s, "writing rollup")) return -1;
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
    return store_step_done(st, s, "writing rollup total");
}

static int64_t pragma_int(struct store *st, const char *sql) {
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK) return -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* Migration 9's part in C (schema/009_rollup_chunks.sql): the rollup rows
 * of metrics wider than a chunk, left in rollups_v8, decoded and written
 * again as chunk rows and a total's row each (what the writer writes now,
 * store_rollup_put); then rollups_v8 goes. A row that does not decode as its
 * metric's values is kept as it is in chunk 0, where a reader reports it
 * as corrupt (schema/storage.md), as it would have before. */
static int migrate_rollup_chunks(struct store *st) {
    sqlite3_stmt *s = NULL, *ins = NULL;
    struct rollup_cell *cells = NULL;
    uint32_t cap = 0;
    int rc, ret = -1;
    if (sqlite3_prepare_v2(st->db,
                           "SELECT o.metric_id, o.level, o.block, o.nframes, o.data, "
                           "CASE m.kind WHEN 2 THEN r.layers * r.heads WHEN 1 THEN r.layers ELSE 1 END "
                           "FROM rollups_v8 o JOIN metrics m ON m.id = o.metric_id JOIN runs r ON r.id = m.run_id "
                           "ORDER BY o.metric_id, o.level, o.block",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(st->db,
                           "INSERT INTO rollups(metric_id, level, chunk, block, nframes, data) "
                           "VALUES (?1, ?2, 0, ?3, ?4, ?5)",
                           -1, &ins, NULL) != SQLITE_OK ||
        /* the tables as they are at migration 9, without migration 11's
         * crc (store_rollup_put's ?7 is left unbound: these rows get NULL, as
         * every row before migration 11) */
        sqlite3_prepare_v3(st->db,
                           "INSERT OR REPLACE INTO rollups(metric_id, level, chunk, block, nframes, data) "
                           "VALUES (?1, ?2, ?6, ?3, ?4, ?5)",
                           -1, 0, &st->stmt[S_INSERT_ROLLUP], NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(st->db,
                           "INSERT OR REPLACE INTO rollup_totals(metric_id, level, block, nframes, data) "
                           "VALUES (?1, ?2, ?3, ?4, ?5)",
                           -1, 0, &st->stmt[S_INSERT_TOTAL], NULL) != SQLITE_OK) {
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
        if (n && level >= 1 && level <= ROLLUP_LEVELS && nf >= 0 && nf <= ROLLUP_LEVEL_SIZE(level) && d &&
            !rollup_decode(d, len, n, (uint32_t)nf, 0, n, cells)) {
            if (store_rollup_put(st, mid, cells, n, level, block, nf, 0)) goto out;
            continue;
        }
        sqlite3_bind_int64(ins, 1, mid);
        sqlite3_bind_int(ins, 2, level);
        sqlite3_bind_int64(ins, 3, block);
        sqlite3_bind_int64(ins, 4, nf);
        sqlite3_bind_blob(ins, 5, d ? (const void *)d : "", (int)len, SQLITE_TRANSIENT);
        if (store_step_done(st, ins, "keeping a rollup row")) goto out;
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
                             "use a newer entropyd or another --db",
                             (long long)have, known);
    for (int i = (int)have; i < known; i++) {
        char sql[64];
        if (store_exec(st, "BEGIN IMMEDIATE")) return -1;
        if (store_exec(st, (const char *)migrations[i].data) ||
            (i < MIGRATION_CODE_N && migration_code[i] && migration_code[i](st))) {
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

/* SQLite's WAL header starts with one of these (big-endian). */
#define WAL_MAGIC_LE 0x377f0682u
#define WAL_MAGIC_BE 0x377f0683u
#define WAL_HEADER 32

/* 1 when the 4 bytes at fd's start are a WAL magic, 0 when not, -1 when
 * they cannot be read. */
static int wal_header_ok(int fd) {
    unsigned char b[4];
    if (pread(fd, b, 4, 0) != 4) return -1;
    uint32_t m = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
    return m == WAL_MAGIC_LE || m == WAL_MAGIC_BE;
}

int store_wal_check(const char *db_path, int64_t wal_bytes, struct store_wal_id *id, char *why, size_t whylen) {
    char path[4096];
    struct stat sb;
    if (!db_path || !*db_path || snprintf(path, sizeof path, "%s-wal", db_path) >= (int)sizeof path) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) return -1;
        if (wal_bytes <= 0 && !id->known) return 0; /* no WAL yet */
        snprintf(why, whylen, "the WAL file %s is gone while SQLite counts %lld bytes of committed frames in it", path,
                 (long long)(wal_bytes > 0 ? wal_bytes : 0));
        return 1;
    }
    int ret = -1;
    if (fstat(fd, &sb) != 0) goto out;
    if (id->known && (sb.st_dev != id->dev || sb.st_ino != id->ino)) {
        snprintf(why, whylen, "the WAL file %s was replaced (another file, inode %llu, is there now)", path,
                 (unsigned long long)sb.st_ino);
        ret = 1;
        goto out;
    }
    id->dev = sb.st_dev;
    id->ino = sb.st_ino;
    id->known = 1;
    if (wal_bytes > 0 && sb.st_size < WAL_HEADER + wal_bytes) {
        snprintf(why, whylen,
                 "the WAL file %s is %lld bytes while SQLite counts %lld bytes of committed frames "
                 "after its 32-byte header: it was truncated under the daemon",
                 path, (long long)sb.st_size, (long long)wal_bytes);
        ret = 1;
        goto out;
    }
    if (sb.st_size >= WAL_HEADER) {
        int h = wal_header_ok(fd);
        if (h < 0) goto out;
        if (!h) {
            snprintf(why, whylen,
                     "the WAL file %s has no WAL header (it was truncated or overwritten under the "
                     "daemon, then written again)",
                     path);
            ret = 1;
            goto out;
        }
    }
    ret = 0;
out:
    close(fd);
    return ret;
}

int store_wal_mark_lost(const char *db_path, const char *why) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s-wal-lost", db_path) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "%s (noticed at %lld, Unix seconds)\n", why, (long long)time(NULL));
    return fclose(f) == 0 ? 0 : -1;
}

/* Refuses a database whose WAL was lost: marked by an earlier daemon, or
 * a WAL file of at least a header's length that is not a WAL (SQLite would
 * take it for an empty log and drop the frames in it, the database then
 * missing acknowledged commits or inconsistent). 0, or -1 with err. */
static int wal_lost_at_open(const char *path, char *err, size_t errlen) {
    char p[4096], note[600] = "";
    static const char *const what_to_do =
        ": the database may miss acknowledged steps and be inconsistent. Run `entropyd --check` on it to see "
        "what is damaged; to start anyway, move %s-wal aside and remove %s-wal-lost (docs/reliability.md, "
        "\"A lost WAL\")";
    snprintf(p, sizeof p, "%s-wal-lost", path);
    FILE *f = fopen(p, "r");
    if (f) {
        if (!fgets(note, sizeof note, f)) snprintf(note, sizeof note, "(no reason recorded)");
        fclose(f);
        note[strcspn(note, "\n")] = 0;
        int n = snprintf(err, errlen, "database %s: its WAL was lost under an earlier daemon: %s", path, note);
        if (n >= 0 && (size_t)n < errlen) snprintf(err + n, errlen - (size_t)n, what_to_do, path, path);
        return -1;
    }
    snprintf(p, sizeof p, "%s-wal", path);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat sb;
    int bad = fstat(fd, &sb) == 0 && sb.st_size >= WAL_HEADER && wal_header_ok(fd) == 0;
    close(fd);
    if (!bad) return 0;
    int n = snprintf(err, errlen,
                     "database %s: its WAL file %s (%lld bytes) has no WAL header, so SQLite would drop "
                     "what it holds",
                     path, p, (long long)sb.st_size);
    if (n >= 0 && (size_t)n < errlen) snprintf(err + n, errlen - (size_t)n, what_to_do, path, path);
    return -1;
}

struct store *store_open(const char *path, char *err, size_t errlen) {
    if (wal_lost_at_open(path, err, errlen)) return NULL;
    struct store *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "cannot open database %s: %s", path, st->db ? sqlite3_errmsg(st->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(st->db, 5000);
    /* page_size only takes effect before the first table exists. 16 KiB
     * pages pack the frame rows (~600 bytes for 12x12) with little waste. */
    if (store_exec(st, "PRAGMA page_size = 16384") || store_exec(st, "PRAGMA journal_mode = WAL") ||
        store_exec(st, "PRAGMA synchronous = NORMAL") || store_exec(st, "PRAGMA foreign_keys = ON") ||
        store_exec(st, "PRAGMA secure_delete = " SECURE_DELETE) || store_exec(st, "PRAGMA cache_size = -65536") ||
        /* the WAL file is cut back to this size whenever it restarts
         * (store_checkpoint, writer.h); see schema/storage.md "WAL" */
        store_exec(st, "PRAGMA journal_size_limit = " STORE_WAL_LIMIT_STR) || migrate(st)) {
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
    if (store_step_done(st, st->stmt[S_BEGIN], "BEGIN")) return -1;
    st->in_txn = 1;
    return 0;
}

int store_begin_nowait(struct store *st) {
    sqlite3_busy_timeout(st->db, 0);
    int rc = store_begin(st);
    sqlite3_busy_timeout(st->db, 5000);
    return rc;
}

int store_step_done(struct store *st, sqlite3_stmt *s, const char *what) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return store_db_err(st, what);
    return 0;
}

int store_commit(struct store *st) {
    if (store_step_done(st, st->stmt[S_COMMIT], "COMMIT")) return -1;
    st->in_txn = 0;
    return 0;
}

int store_savepoint(struct store *st) { return store_step_done(st, st->stmt[S_SAVEPOINT], "opening a savepoint"); }
int store_in_transaction(struct store *st) { return st->in_txn && !sqlite3_get_autocommit(st->db); }
int store_release(struct store *st) { return store_step_done(st, st->stmt[S_RELEASE], "releasing a savepoint"); }

void store_rollback_to(struct store *st) {
    sqlite3_exec(st->db, "ROLLBACK TO item; RELEASE item", NULL, NULL, NULL);
    drop_caches(st);
}

/* Writes the run's bookkeeping columns from its cache. */
int store_run_save(struct store *st, struct run_cache *r) {
    sqlite3_stmt *s = st->stmt[S_UPDATE_RUN];
    sqlite3_bind_int64(s, 1, r->id);
    sqlite3_bind_int64(s, 2, r->last_seq);
    if (r->last_step >= 0) sqlite3_bind_int64(s, 3, r->last_step);
    else sqlite3_bind_null(s, 3);
    sqlite3_bind_double(s, 4, r->updated);
    return store_step_done(st, s, "updating run");
}

void store_rollback(struct store *st) {
    if (sqlite3_get_autocommit(st->db) == 0) sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    st->in_txn = 0;
    drop_caches(st); /* the cache may describe rows that no longer exist */
}

/* Finds or loads the cache of run id. NULL with an error if it fails. */
struct run_cache *store_run_get(struct store *st, int64_t id) {
    for (uint32_t i = 0; i < st->nruns; i++)
        if (st->runs[i]->id == id) return st->runs[i];
    struct run_cache *r = calloc(1, sizeof *r);
    if (!r) {
        store_set_err(st, SQLITE_NOMEM, "out of memory");
        return NULL;
    }
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
        if (rc == SQLITE_DONE) store_set_err(st, STORE_ENORUN, "no run %lld", (long long)id);
        else store_db_err(st, "loading run");
        return NULL;
    }
    s = st->stmt[S_SELECT_METRICS];
    sqlite3_bind_int64(s, 1, id);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (r->nmetrics == r->cap) {
            uint32_t cap = r->cap ? r->cap * 2 : 16;
            struct metric_cache *m = realloc(r->metrics, cap * sizeof *m);
            if (!m) {
                rc = SQLITE_NOMEM;
                break;
            }
            r->metrics = m;
            r->cap = cap;
        }
        struct metric_cache *m = &r->metrics[r->nmetrics++];
        m->id = sqlite3_column_int64(s, 0);
        snprintf(m->name, sizeof m->name, "%s", (const char *)sqlite3_column_text(s, 1));
        m->kind = sqlite3_column_int(s, 2);
        m->n = m->kind == PROTO_SCALAR  ? 1
               : m->kind == PROTO_LAYER ? (uint32_t)r->layers
                                        : (uint32_t)(r->layers * r->heads);
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

void store_run_forget(struct store *st, int64_t id) {
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

int store_run_open(struct store *st, const char *name, int64_t layers, int64_t heads, int64_t seq_len, const char *meta,
                   double now, struct store_run_info *out) {
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
            return store_set_err(st, STORE_ESHAPE, "run %s has %lld layers x %lld heads, not %lld x %lld", name,
                                 (long long)out->layers, (long long)out->heads, (long long)layers, (long long)heads);
        s = st->stmt[S_RUN_RESUME];
        sqlite3_bind_int64(s, 1, out->id);
    } else if (rc == SQLITE_DONE) {
        if (store_step_done(st, st->stmt[S_RUN_ID_NEXT], "creating run")) return -1;
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
    int failed = store_step_done(st, s, "writing run");
    sqlite3_clear_bindings(s); /* name and meta are the caller's */
    if (failed) return -1;
    if (out->created) out->id = sqlite3_last_insert_rowid(st->db);
    return 0;
}

int store_event(struct store *st, int64_t run_id, int64_t seq, double time, int level, const char *text) {
    sqlite3_stmt *s = st->stmt[S_INSERT_EVENT];
    sqlite3_bind_int64(s, 1, run_id);
    if (seq > 0) sqlite3_bind_int64(s, 2, seq);
    else sqlite3_bind_null(s, 2);
    sqlite3_bind_double(s, 3, time);
    sqlite3_bind_text(s, 4, proto_level_name(level), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, text, -1, SQLITE_STATIC);
    if (store_step_done(st, s, "writing event")) return -1;
    if (seq > 0) {
        struct run_cache *r = store_run_get(st, run_id);
        if (!r) return -1;
        r->last_seq = seq;
        r->updated = time;
        if (store_run_save(st, r)) return -1;
    }
    return 0;
}

int store_run_status(struct store *st, int64_t run_id, int status, int64_t seq, double now) {
    sqlite3_stmt *s = st->stmt[S_RUN_STATUS];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_text(s, 2, proto_status_name(status), -1, SQLITE_STATIC); /* a static string */
    sqlite3_bind_double(s, 3, now);
    if (store_step_done(st, s, "setting run status")) return -1;
    if (seq > 0) {
        struct run_cache *r = store_run_get(st, run_id);
        if (!r) return -1;
        r->last_seq = seq;
        r->updated = now;
        if (store_run_save(st, r)) return -1;
    }
    /* a run that is not live sends nothing until its next hello: its cache
     * goes, so that the cache holds live runs only, however many are stored */
    if (status != PROTO_LIVE) store_run_forget(st, run_id);
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
    if (rc == SQLITE_DONE) return store_set_err(st, STORE_ENORUN, "no run %lld", id);
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
    store_run_forget(st, run_id);
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
    int mode = restart > 1 ? SQLITE_CHECKPOINT_TRUNCATE
               : restart   ? SQLITE_CHECKPOINT_RESTART
                           : SQLITE_CHECKPOINT_PASSIVE;
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

void store_set_lossy_bits(struct store *st, int bits) { st->lossy_bits = bits >= 1 && bits <= 22 ? bits : 0; }

void store_release_memory(struct store *st) { sqlite3_db_release_memory(st->db); }
