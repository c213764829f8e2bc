/* store_purge.c: the store taking data away in bounded chunks, so that no
 * other trainer waits behind it for long: the purge of deleted runs
 * (store_run_delete lists their bulk in the `purge` table, store_purge
 * deletes it a budget at a time) and raw retention (store_retain_raw). See
 * store.h for the contract, schema/storage.md for the tables. */
#include "store.h"
#include "store_int.h"

#include <stdio.h>

#include "fblock.h"
#include "fblock_rows.h"

/* ---- the purge of deleted runs ---------------------------------------- */

/* A piece's budget counts units of about a 12 x 12 frame's bytes. A row
 * is charged by its size, so that a piece deletes about as many bytes
 * whatever the model's width: a 32 x 32 head metric's frame is 8 units, a
 * scalar's 1. Before, every row was one unit, and a budget grown on cheap
 * rows deleted 65,536 frames of a 32 x 32 run in one piece (a 153 MiB WAL,
 * 0.8 s of the writer). */
#define PURGE_UNIT_BYTES 576

/* The purged tables whose rows row_units sizes, and the query of each:
 * the largest `data` among the next ?2 rows of ?1 (rows that a DELETE of
 * them visits anyway). */
enum { PT_ROLLUPS, PT_TOTALS, PT_FRAMES, PT_ABANDONED };
static const char *const size_sql[] = {
    [PT_ROLLUPS] = "SELECT max(length(data)) FROM (SELECT data FROM rollups WHERE metric_id = ?1 LIMIT ?2)",
    [PT_TOTALS] = "SELECT max(length(data)) FROM (SELECT data FROM rollup_totals WHERE metric_id = ?1 LIMIT ?2)",
    [PT_FRAMES] = "SELECT max(length(data)) FROM (SELECT data FROM frames WHERE metric_id = ?1 LIMIT ?2)",
    [PT_ABANDONED] = "SELECT max(length(data)) FROM (SELECT data FROM abandoned_frames WHERE branch_id = ?1 LIMIT ?2)",
};

/* The units a row of table t of purge entry id costs: judged by the
 * largest of the next `look` such rows, so that rows of a scalar followed
 * by a head metric's are charged as the head metric's (1 when there are
 * none); -1 on error. */
static int64_t row_units(struct store *st, int t, int64_t id, int64_t look) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(st->db, size_sql[t], -1, &s, NULL) != SQLITE_OK)
        return store_db_err(st, "sizing purged rows");
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, look);
    int rc = sqlite3_step(s);
    int64_t len = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW) return store_db_err(st, "sizing purged rows");
    return len > PURGE_UNIT_BYTES ? (len + PURGE_UNIT_BYTES - 1) / PURGE_UNIT_BYTES : 1;
}

/* Runs one bounded DELETE (sql, with `want` rows as its limit) and charges
 * its rows to *left at `cost` units a row, or `per` rows a unit. Returns 1
 * if the limit was reached (more may remain), 0 if the table is done, -1
 * on error. */
static int purge_table(struct store *st, const char *sql, int64_t want, int64_t cost, int per, int64_t *left) {
    if (store_exec(st, sql)) return -1;
    int64_t n = sqlite3_changes64(st->db);
    if (n >= want) {
        *left = 0;
        return 1;
    }
    *left -= (n * cost + per - 1) / per;
    if (*left < 1) *left = 1; /* the last tables of an entry are checked, then it goes */
    return 0;
}

/* Up to `left` units of rows of table t of purge entry id, at the size of
 * its rows: the DELETE's limit in rows, and the cost of each (*cost). */
static int64_t rows_for(struct store *st, int t, int64_t id, int64_t left, int64_t *cost) {
    if ((*cost = row_units(st, t, id, left)) < 0) return -1;
    int64_t rows = left / *cost;
    return rows > 1 ? rows : 1;
}

/* Deletes up to *left units of one purge entry, and the entry itself once
 * nothing of it is left. */
static int purge_one(struct store *st, int kind, int64_t id, int64_t *left) {
    char sql[320];
    long long i = (long long)id;
    int64_t rows, cost;
    int r;
    if (kind == 0) {
        if ((rows = rows_for(st, PT_ROLLUPS, id, *left, &cost)) < 0) return -1;
        snprintf(sql, sizeof sql,
                 "DELETE FROM rollups WHERE metric_id = %lld AND (level, chunk, block) IN (SELECT level, "
                 "chunk, block FROM rollups WHERE metric_id = %lld LIMIT %lld)",
                 i, i, (long long)rows);
        if ((r = purge_table(st, sql, rows, cost, 1, left))) return r < 0 ? -1 : 0;
        if ((rows = rows_for(st, PT_TOTALS, id, *left, &cost)) < 0) return -1;
        snprintf(sql, sizeof sql,
                 "DELETE FROM rollup_totals WHERE metric_id = %lld AND (level, block) IN (SELECT level, "
                 "block FROM rollup_totals WHERE metric_id = %lld LIMIT %lld)",
                 i, i, (long long)rows);
        if ((r = purge_table(st, sql, rows, cost, 1, left))) return r < 0 ? -1 : 0;
        if ((rows = rows_for(st, PT_FRAMES, id, *left, &cost)) < 0) return -1;
        snprintf(sql, sizeof sql,
                 "DELETE FROM frames WHERE id IN (SELECT id FROM frames WHERE metric_id = %lld "
                 "LIMIT %lld)",
                 i, (long long)rows);
        if ((r = purge_table(st, sql, rows, cost, 1, left))) return r < 0 ? -1 : 0;
        /* a block is about as much work as the 64 frames it codes (its
         * width unknown here: WRITER_JOB_BUDGET_MAX bounds it) */
        int64_t blocks = (*left + FBLOCK_STEPS - 1) / FBLOCK_STEPS;
        int64_t nb = fblock_rows_delete_below(st->rows, id, INT64_MAX, blocks);
        if (nb < 0) return store_rows_err(st, (int)nb, -1, -1, "purging blocks");
        if (nb >= blocks) {
            *left = 0;
            return 0;
        }
        *left -= nb * FBLOCK_STEPS;
        if (*left < 1) *left = 1;
        if (store_rows_err(st, fblock_rows_forget(st->rows, id), -1, -1, "purging blocks")) return -1;
        snprintf(sql, sizeof sql, "DELETE FROM latest WHERE metric_id = %lld", i);
        if (store_exec(st, sql)) return -1;
    } else if (kind == 1) {
        if ((rows = rows_for(st, PT_ABANDONED, id, *left, &cost)) < 0) return -1;
        snprintf(sql, sizeof sql,
                 "DELETE FROM abandoned_frames WHERE rowid IN (SELECT rowid FROM abandoned_frames "
                 "WHERE branch_id = %lld LIMIT %lld)",
                 i, (long long)rows);
        if ((r = purge_table(st, sql, rows, cost, 1, left))) return r < 0 ? -1 : 0;
    } else {
        int64_t want = *left * 8; /* steps rows are small: 8 to a frame's worth */
        snprintf(sql, sizeof sql,
                 "DELETE FROM steps WHERE run_id = %lld AND step <= coalesce((SELECT step FROM steps "
                 "WHERE run_id = %lld ORDER BY step LIMIT 1 OFFSET %lld), 9223372036854775807)",
                 i, i, (long long)want - 1);
        if ((r = purge_table(st, sql, want, 1, 8, left))) return r < 0 ? -1 : 0;
    }
    snprintf(sql, sizeof sql, "DELETE FROM purge WHERE kind = %d AND id = %lld", kind, i);
    return store_exec(st, sql);
}

int store_purge(struct store *st, int64_t budget) {
    int64_t left = budget < 1 ? 1 : budget;
    for (;;) {
        sqlite3_stmt *s = st->stmt[S_PURGE_NEXT];
        int rc = sqlite3_step(s);
        int kind = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
        int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(s, 1) : 0;
        sqlite3_reset(s);
        if (rc == SQLITE_DONE) return 0;
        if (rc != SQLITE_ROW) return store_db_err(st, "reading purge");
        if (left <= 0) return 1;
        if (kind < 0 || kind > 2) return store_set_err(st, SQLITE_CORRUPT, "purge kind %d", kind);
        if (purge_one(st, kind, id, &left)) return -1;
    }
}

/* ---- raw retention (--retain-raw) --------------------------------------
 * The writer's retention job calls store_retain_raw between batches. It
 * deletes sealed blocks only, never rollups, steps or the open block, so
 * every query keeps its exact summaries (schema/storage.md). */

/* Runs the one-row statement s (bound by the caller): 1 with the row's
 * first two columns (NULL reads as -1), 0 for no row, -1 on error. */
static int retain_row(struct store *st, sqlite3_stmt *s, int64_t *a, double *b) {
    int rc = sqlite3_step(s), ret = rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
    if (rc == SQLITE_ROW) {
        *a = sqlite3_column_type(s, 0) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 0);
        *b = sqlite3_column_type(s, 1) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 1);
    }
    sqlite3_reset(s);
    if (ret < 0) store_db_err(st, "reading for retention");
    return ret;
}

/* The first step of run_id whose time is at or after `since` (steps'
 * times grow with their steps): a binary search over the run's steps,
 * about 20 seeks for a million of them. */
static int retain_step_since(struct store *st, sqlite3_stmt *next, int64_t run_id, int64_t last, double since,
                             int64_t *out) {
    int64_t lo = 0, hi = last + 1, step;
    double t;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        sqlite3_bind_int64(next, 1, run_id);
        sqlite3_bind_int64(next, 2, mid);
        int r = retain_row(st, next, &step, &t);
        if (r < 0) return -1;
        if (!r || t >= since) hi = mid;
        else lo = step + 1;
    }
    *out = lo;
    return 0;
}

/* The first step of run_id whose raw frames are kept, or -1 to keep them
 * all (no steps yet, or a rewind in progress: it moves blocks itself). */
static int retain_cutoff(struct store *st, sqlite3_stmt *run, sqlite3_stmt *next, int64_t run_id, int64_t keep_steps,
                         double keep_s, double now, int64_t *cut) {
    int64_t last;
    double rewinding;
    *cut = -1;
    sqlite3_bind_int64(run, 1, run_id);
    int r = retain_row(st, run, &last, &rewinding);
    if (r <= 0 || last < 0 || rewinding > 0) return r < 0 ? -1 : 0;
    if (keep_steps > 0) *cut = last - keep_steps + 1;
    else if (retain_step_since(st, next, run_id, last, now - keep_s, cut)) return -1;
    return 0;
}

/* Deletes up to `limit` rows of metric_id below `below` with del (bound
 * here: ?1 metric, ?2 below, ?3 limit). Returns the rows deleted, -1. */
static int64_t retain_delete(struct store *st, sqlite3_stmt *del, int64_t metric_id, int64_t below, int64_t limit) {
    sqlite3_bind_int64(del, 1, metric_id);
    sqlite3_bind_int64(del, 2, below);
    sqlite3_bind_int64(del, 3, limit);
    return store_run_changes(st, del, "deleting raw frames past retention");
}

int store_retain_raw(struct store *st, int64_t keep_steps, double keep_s, double now, int64_t *cursor, int64_t budget) {
    static const char *const sql[] = {
        "SELECT id, run_id FROM metrics WHERE id > ?1 ORDER BY id LIMIT 1",
        "SELECT last_step, (SELECT count(*) FROM rewinds WHERE run_id = ?1) FROM runs WHERE id = ?1",
        "SELECT step, time FROM steps WHERE run_id = ?1 AND step >= ?2 ORDER BY step LIMIT 1",
        "DELETE FROM frames WHERE id IN (SELECT id FROM frames WHERE metric_id = ?1 AND step < ?2 LIMIT ?3)",
    };
    enum { R_METRIC, R_RUN, R_NEXT, R_FRAMES, R_COUNT };
    sqlite3_stmt *s[R_COUNT] = {0};
    int ret = -1;
    int64_t left = budget < FBLOCK_STEPS ? FBLOCK_STEPS : budget, run_seen = 0, cut = -1;
    if (keep_steps <= 0 && !(keep_s > 0)) return 0;
    for (int i = 0; i < R_COUNT; i++)
        if (sqlite3_prepare_v2(st->db, sql[i], -1, &s[i], NULL) != SQLITE_OK) {
            store_db_err(st, "preparing retention");
            goto out;
        }
    for (;;) {
        int64_t mid, run_id;
        double rid;
        sqlite3_bind_int64(s[R_METRIC], 1, *cursor);
        int r = retain_row(st, s[R_METRIC], &mid, &rid);
        if (r < 0) goto out;
        if (!r) { /* the pass is complete */
            *cursor = 0;
            ret = 0;
            break;
        }
        if (left <= 0) {
            ret = 1;
            break;
        }
        run_id = (int64_t)rid;
        if (run_id != run_seen && retain_cutoff(st, s[R_RUN], s[R_NEXT], run_id, keep_steps, keep_s, now, &cut))
            goto out;
        run_seen = run_id;
        left -= 4; /* looking costs a few seeks */
        if (cut >= FBLOCK_STEPS) {
            /* whole blocks before the cut: a block is about as much work as
             * the 64 frames it codes */
            int64_t want = (left + FBLOCK_STEPS - 1) / FBLOCK_STEPS, n;
            if ((n = fblock_rows_delete_below(st->rows, mid, cut / FBLOCK_STEPS, want)) < 0) {
                store_rows_err(st, (int)n, -1, -1, "deleting blocks past retention");
                goto out;
            }
            left -= n * FBLOCK_STEPS;
            if (n >= want) continue; /* this metric may have more */
            /* raw frames of a database from before blocks (migration 6) */
            want = left > 1 ? left : 1;
            if ((n = retain_delete(st, s[R_FRAMES], mid, cut / FBLOCK_STEPS * FBLOCK_STEPS, want)) < 0) goto out;
            left -= n;
            if (n >= want) continue;
        }
        *cursor = mid;
    }
out:
    for (int i = 0; i < R_COUNT; i++) sqlite3_finalize(s[i]);
    return ret;
}
