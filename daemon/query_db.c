/* query_db.c: the read connections of the query module and their pool,
 * and the helpers the query families share (query_db.h). */
#include "query_db.h"

#include "integrity.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const q_sql[Q_COUNT] = {
    [Q_RUN] = "SELECT layers, heads, status FROM runs WHERE id = ?1",
    [Q_METRIC] = "SELECT id, kind FROM metrics WHERE run_id = ?1 AND name = ?2",
    /* two subqueries: SQLite answers a lone min() or max() from the index
     * in one seek, but scans every row when both are in one query */
    [Q_STEP_RANGE] = "SELECT (SELECT min(step) FROM frames WHERE metric_id = ?1), "
                     "(SELECT max(step) FROM frames WHERE metric_id = ?1)",
    [Q_ROLLUPS] = "SELECT block, nframes, data, crc FROM rollups WHERE metric_id = ?1 AND level = ?2 AND chunk = ?5 "
                  "AND block BETWEEN ?3 AND ?4 ORDER BY block",
    [Q_TOTALS] = "SELECT block, nframes, data, crc FROM rollup_totals WHERE metric_id = ?1 AND level = ?2 "
                 "AND block BETWEEN ?3 AND ?4 ORDER BY block",
    [Q_FRAMES] = "SELECT step, data, crc FROM frames WHERE metric_id = ?1 AND step BETWEEN ?2 AND ?3 ORDER BY step",
    [Q_FRAME_AT] = "SELECT step, data, crc FROM frames WHERE metric_id = ?1 AND step <= ?2 ORDER BY step DESC LIMIT 1",
    [Q_ROLLUP_FIRST] = "SELECT min(block) FROM rollups WHERE metric_id = ?1 AND level = 1 AND chunk = 0",
};


struct query_pool {
    char *path;
    int keep, nidle;
    pthread_mutex_t mu;
    struct query *idle;
};

static void conn_close(struct query *q) {
    if (!q) return;
    for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(q->stmt[i]);
    for (int i = 0; i < QUERY_REMOTE_STMTS; i++) sqlite3_finalize(q->remote[i]);
    fblock_rows_close(q->rows);
    sqlite3_close(q->db);
    fblock_codec_destroy(q->codec);
    free(q);
}

static struct query *conn_open(const char *path, char *err, size_t errlen) {
    struct query *q = calloc(1, sizeof *q);
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(path, &q->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot open database %s: %s", path, q->db ? sqlite3_errmsg(q->db) : "out of memory");
        goto fail;
    }
    if (!(q->codec = fblock_codec_create())) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(q->db, 5000);
    /* mmap lets reads of frames and rollups skip a pread and a copy into
     * the page cache (a fifth of a raw-window series' time went to pread):
     * as much of the file as SQLite allows (it clamps the value to its
     * SQLITE_MAX_MMAP_SIZE, 2 GiB in Debian's build) */
    sqlite3_exec(q->db, "PRAGMA mmap_size = 68719476736; PRAGMA cache_size = -16384", NULL, NULL, NULL);
    for (int i = 0; i < Q_COUNT; i++) {
        if (sqlite3_prepare_v3(q->db, q_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &q->stmt[i], NULL) != SQLITE_OK) {
            snprintf(err, errlen, "database %s: preparing a query: %s", path, sqlite3_errmsg(q->db));
            goto fail;
        }
    }
    if (!(q->rows = fblock_rows_open(q->db, q->codec))) {
        snprintf(err, errlen, "database %s: preparing the block queries: %s", path, sqlite3_errmsg(q->db));
        goto fail;
    }
    return q;
fail:
    conn_close(q);
    return NULL;
}

struct query_pool *query_pool_open(const char *path, int keep, char *err, size_t errlen) {
    struct query_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(path))) {
        free(p);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->keep = keep > 0 ? keep : 8;
    pthread_mutex_init(&p->mu, NULL);
    /* open one now so that a bad path fails at start, not at the first request */
    struct query *q = query_acquire(p, err, errlen);
    if (!q) {
        query_pool_close(p);
        return NULL;
    }
    query_release(p, q);
    return p;
}

void query_pool_close(struct query_pool *p) {
    if (!p) return;
    while (p->idle) {
        struct query *n = p->idle->next;
        conn_close(p->idle);
        p->idle = n;
    }
    pthread_mutex_destroy(&p->mu);
    free(p->path);
    free(p);
}

struct query *query_acquire(struct query_pool *p, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    struct query *q = p->idle;
    if (q) {
        p->idle = q->next;
        p->nidle--;
    }
    pthread_mutex_unlock(&p->mu);
    if (!q) q = conn_open(p->path, err, errlen);
    if (q) q->next = NULL;
    return q;
}

void query_release(struct query_pool *p, struct query *q) {
    if (!q) return;
    if (!sqlite3_get_autocommit(q->db)) sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
    pthread_mutex_lock(&p->mu);
    if (p->nidle < p->keep) {
        q->next = p->idle;
        p->idle = q;
        p->nidle++;
        q = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    conn_close(q);
}

int query_db_fail(struct query *q, char *err, size_t errlen, const char *what) {
    int ec = sqlite3_errcode(q->db);
    if (q->fault[0] || ec == SQLITE_CORRUPT || ec == SQLITE_NOTADB) integrity_note();
    if (q->fault[0]) snprintf(err, errlen, "corrupt database %s: %s", what, q->fault);
    else snprintf(err, errlen, "database error %s: %s", what, sqlite3_errmsg(q->db));
    q->fault[0] = 0;
    return QUERY_ERR;
}

void query_db_what(char *what, size_t len, const char *doing, int64_t run_id, const char *metric) {
    snprintf(what, len, "%s of run %lld, metric \"%.64s\"", doing, (long long)run_id, metric);
}

int query_db_corrupt(struct query *q, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->fault, sizeof q->fault, fmt, ap);
    va_end(ap);
    return -1;
}

int query_db_begin(struct query *q, char *err, size_t errlen) {
    if (sqlite3_exec(q->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return query_db_fail(q, err, errlen, "starting a read");
    return QUERY_OK;
}

void query_db_end(struct query *q) {
    if (!sqlite3_get_autocommit(q->db)) sqlite3_exec(q->db, "COMMIT", NULL, NULL, NULL);
}

const char *query_kind_name(int kind) { return kind == 0 ? "scalar" : kind == 1 ? "layer" : "head"; }

int query_run_get(struct query *q, int64_t id, struct query_runinfo *ri, char *err, size_t errlen) {
    sqlite3_stmt *s = q->stmt[Q_RUN];
    sqlite3_bind_int64(s, 1, id);
    int rc = sqlite3_step(s), ret = QUERY_OK;
    if (rc == SQLITE_ROW) {
        ri->layers = sqlite3_column_int64(s, 0);
        ri->heads = sqlite3_column_int64(s, 1);
        snprintf(ri->status, sizeof ri->status, "%s", (const char *)sqlite3_column_text(s, 2));
    } else if (rc == SQLITE_DONE) {
        snprintf(err, errlen, "no run %lld", (long long)id);
        ret = QUERY_NOT_FOUND;
    } else {
        ret = query_db_fail(q, err, errlen, "reading the run");
    }
    sqlite3_reset(s);
    return ret;
}

int query_metric_get(struct query *q, int64_t run_id, const char *name, int64_t *id, int *kind, char *err,
                     size_t errlen) {
    sqlite3_stmt *s = q->stmt[Q_METRIC];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s), ret = QUERY_OK;
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        *kind = sqlite3_column_int(s, 1);
    } else if (rc == SQLITE_DONE) {
        snprintf(err, errlen, "run %lld has no metric named \"%.64s\"", (long long)run_id, name);
        ret = QUERY_NOT_FOUND;
    } else {
        ret = query_db_fail(q, err, errlen, "reading the metric");
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return ret;
}
