/* query_remote.c: the reads of the remote-write pusher (remote_write.c):
 * the runs and their rollbacks, a run's shape and metrics, its steps past
 * a cursor, and the samples still to deliver. Declared in query.h. It
 * reads only; the cursor, the encoding and the POST are remote_write.c's.
 * Each statement is prepared at its first use on a connection and kept
 * with it (query_db.c finalizes them). */
#include "query_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { R_RUNS, R_SHAPE, R_METRICS, R_STEPS, R_SAMPLES, R_COUNT };
_Static_assert(R_COUNT == QUERY_REMOTE_STMTS, "query_db.h sizes struct query's remote[] for these");

static const char *const r_sql[R_COUNT] = {
    [R_RUNS] = "SELECT id, coalesce(last_step, -9223372036854775807 - 1), "
               "coalesce((SELECT max(id) FROM branches b WHERE b.run_id = r.id), 0) FROM runs r ORDER BY id",
    [R_SHAPE] = "SELECT name, layers, heads, EXISTS (SELECT 1 FROM rewinds w WHERE w.run_id = r.id), "
                "(SELECT max(id) FROM branches b WHERE b.run_id = r.id AND b.id > ?2), "
                "(SELECT min(from_step) FROM branches b WHERE b.run_id = r.id AND b.id > ?2) "
                "FROM runs r WHERE id = ?1",
    [R_METRICS] = "SELECT id, name, kind FROM metrics WHERE run_id = ?1 ORDER BY id",
    [R_STEPS] = "SELECT step, time FROM steps WHERE run_id = ?1 AND step > ?2 ORDER BY step LIMIT ?3",
    [R_SAMPLES] = "SELECT (SELECT count(*) FROM steps WHERE run_id = ?1 AND step > ?2) * "
                  "(1 + coalesce((SELECT sum(CASE kind WHEN 0 THEN 1 WHEN 1 THEN r.layers "
                  "ELSE r.layers * r.heads END) FROM metrics WHERE run_id = ?1), 0)) "
                  "FROM runs r WHERE id = ?1",
};

/* Statement i of q, prepared now if this is its first use; NULL with a
 * message (when err is not NULL) on failure. */
static sqlite3_stmt *stmt(struct query *q, int i, char *err, size_t errlen) {
    if (!q->remote[i] &&
        sqlite3_prepare_v3(q->db, r_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &q->remote[i], NULL) != SQLITE_OK) {
        if (err) query_db_fail(q, err, errlen, "preparing a remote-write read");
        sqlite3_finalize(q->remote[i]);
        q->remote[i] = NULL;
    }
    return q->remote[i];
}

int query_read_begin(struct query *q, char *err, size_t errlen) { return query_db_begin(q, err, errlen); }

void query_read_end(struct query *q) { query_db_end(q); }

int query_rw_runs(struct query *q, struct query_rw_run **runs, size_t *n, char *err, size_t errlen) {
    *runs = NULL;
    *n = 0;
    sqlite3_stmt *s = stmt(q, R_RUNS, err, errlen);
    if (!s) return QUERY_ERR;
    size_t cap = 0;
    int rc, ret = QUERY_OK;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            struct query_rw_run *m = realloc(*runs, cap * sizeof *m);
            if (!m) {
                snprintf(err, errlen, "out of memory");
                ret = QUERY_ERR;
                break;
            }
            *runs = m;
        }
        (*runs)[(*n)++] =
            (struct query_rw_run){sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 2)};
    }
    if (ret == QUERY_OK && rc != SQLITE_DONE) ret = query_db_fail(q, err, errlen, "listing runs for remote-write");
    sqlite3_reset(s);
    if (ret != QUERY_OK) {
        free(*runs);
        *runs = NULL;
        *n = 0;
    }
    return ret;
}

int query_rw_shape(struct query *q, int64_t run_id, int64_t branch, struct query_rw_shape *out, char *err,
                   size_t errlen) {
    sqlite3_stmt *s = stmt(q, R_SHAPE, err, errlen);
    if (!s) return QUERY_ERR;
    memset(out, 0, sizeof *out);
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, branch);
    int rc = sqlite3_step(s), ret = 0;
    if (rc == SQLITE_ROW) {
        snprintf(out->name, sizeof out->name, "%s", (const char *)sqlite3_column_text(s, 0));
        out->layers = sqlite3_column_int64(s, 1);
        out->heads = sqlite3_column_int64(s, 2);
        out->rewinding = sqlite3_column_int(s, 3);
        if (sqlite3_column_type(s, 4) != SQLITE_NULL) {
            out->new_branch = sqlite3_column_int64(s, 4);
            out->new_from = sqlite3_column_int64(s, 5);
        }
        ret = 1;
    } else if (rc != SQLITE_DONE) {
        ret = query_db_fail(q, err, errlen, "reading a run for remote-write");
    }
    sqlite3_reset(s);
    return ret;
}

int query_rw_metrics(struct query *q, int64_t run_id, query_rw_metric_fn fn, void *ctx, char *err, size_t errlen) {
    sqlite3_stmt *s = stmt(q, R_METRICS, err, errlen);
    if (!s) return QUERY_ERR;
    sqlite3_bind_int64(s, 1, run_id);
    int rc, ret = QUERY_OK;
    while (ret == QUERY_OK && (rc = sqlite3_step(s)) == SQLITE_ROW)
        ret = fn(ctx, sqlite3_column_int64(s, 0), (const char *)sqlite3_column_text(s, 1), sqlite3_column_int(s, 2));
    if (ret == QUERY_OK && rc != SQLITE_DONE) ret = query_db_fail(q, err, errlen, "reading metrics for remote-write");
    sqlite3_reset(s);
    return ret;
}

int query_rw_steps(struct query *q, int64_t run_id, int64_t after, int64_t limit, query_rw_step_fn fn, void *ctx,
                   char *err, size_t errlen) {
    sqlite3_stmt *s = stmt(q, R_STEPS, err, errlen);
    if (!s) return QUERY_ERR;
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, after);
    sqlite3_bind_int64(s, 3, limit);
    int rc, ret = QUERY_OK;
    while (ret == QUERY_OK && (rc = sqlite3_step(s)) == SQLITE_ROW)
        ret = fn(ctx, sqlite3_column_int64(s, 0), sqlite3_column_double(s, 1));
    if (ret == QUERY_OK && rc != SQLITE_DONE) ret = query_db_fail(q, err, errlen, "reading steps for remote-write");
    sqlite3_reset(s);
    return ret;
}

int64_t query_rw_samples_after(struct query *q, int64_t run_id, int64_t after) {
    sqlite3_stmt *s = stmt(q, R_SAMPLES, NULL, 0);
    if (!s) return -1;
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, after);
    int rc = sqlite3_step(s);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : rc == SQLITE_DONE ? 0 : -1;
    sqlite3_reset(s);
    return v;
}
