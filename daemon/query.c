/* query.c: read-only queries for the HTTP API. See query.h for the contract
 * and schema/storage.md for the blob layouts and the series recipe. */
#include "query.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"

/* ---- buffer ---------------------------------------------------------- */

static int buf_reserve(struct query_buf *b, size_t n) {
    if (b->failed) return -1;
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void query_buf_add(struct query_buf *b, const char *s, size_t n) {
    if (buf_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void query_buf_puts(struct query_buf *b, const char *s) { query_buf_add(b, s, strlen(s)); }

void query_buf_printf(struct query_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        query_buf_add(b, tmp, (size_t)n);
        return;
    }
    if (buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void query_buf_json_str(struct query_buf *b, const char *s) {
    size_t len = strlen(s);
    char tmp[512];
    size_t need = proto_json_string(tmp, sizeof tmp, s, len);
    if (need <= sizeof tmp - 1) {
        query_buf_add(b, tmp, need);
        return;
    }
    if (buf_reserve(b, need + 1)) return;
    proto_json_string(b->p + b->len, need + 1, s, len);
    b->len += need;
    b->p[b->len] = 0;
}

void query_buf_free(struct query_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Appends a decimal integer (printf is slow enough to matter in series
 * answers of 100,000 buckets). */
static void buf_i64(struct query_buf *b, int64_t v) {
    char tmp[24], *p = tmp + sizeof tmp;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *--p = '-';
    query_buf_add(b, p, (size_t)(tmp + sizeof tmp - p));
}

/* Writes finite d with nd (<= 15) significant digits, trailing zeros
 * dropped, in the style of %g; returns the length. printf("%.9g") is
 * exact but slow (multi-precision), and series answers print up to 500,000
 * numbers. Here one double multiplication scales d: its error (<= 1 ulp,
 * ~1e-16) is far below the last digit kept, so 9 digits of a float32 still
 * read back to the same float32, which the tests check. */
static int fmt_sig(char *out, double d, int nd) {
    static const double p10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    char *o = out;
    if (d == 0) {
        *o++ = '0';
        return 1;
    }
    if (d < 0) {
        *o++ = '-';
        d = -d;
    }
    int e = (int)floor(log10(d));
    uint64_t m = 0, lim = (uint64_t)p10[nd];
    for (int tries = 0; tries < 3; tries++) {
        int sh = nd - 1 - e;
        double sc = sh >= 0 ? (sh <= 22 ? d * p10[sh] : d * pow(10, sh)) : (-sh <= 22 ? d / p10[-sh] : d / pow(10, -sh));
        m = (uint64_t)llround(sc);
        if (m >= lim) {
            if (sc >= (double)lim) { /* log10 was one low */
                e++;
                continue;
            }
            m = lim / 10; /* rounding carried: 9.999999996 -> 10.0000000 */
            e++;
        } else if (m < lim / 10) { /* log10 was one high */
            e--;
            continue;
        }
        break;
    }
    char dig[20];
    for (int i = nd - 1; i >= 0; i--) {
        dig[i] = (char)('0' + m % 10);
        m /= 10;
    }
    int n = nd;
    while (n > 1 && dig[n - 1] == '0') n--;
    if (e >= -5 && e < nd) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) *o++ = i < n ? dig[i] : '0';
            if (n > e + 1) {
                *o++ = '.';
                for (int i = e + 1; i < n; i++) *o++ = dig[i];
            }
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -e - 1; i++) *o++ = '0';
            for (int i = 0; i < n; i++) *o++ = dig[i];
        }
    } else {
        *o++ = dig[0];
        if (n > 1) {
            *o++ = '.';
            for (int i = 1; i < n; i++) *o++ = dig[i];
        }
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    return (int)(o - out);
}

/* A float as JSON: 9 significant digits, which read back to the same
 * float32; null when not finite. */
void query_buf_f32(struct query_buf *b, float x) {
    if (!isfinite(x)) {
        query_buf_add(b, "null", 4);
        return;
    }
    char tmp[40];
    query_buf_add(b, tmp, (size_t)fmt_sig(tmp, x, 9));
}

/* A mean: 12 significant digits, beyond what float32 inputs carry. */
void query_buf_f64(struct query_buf *b, double x) {
    if (!isfinite(x)) {
        query_buf_add(b, "null", 4);
        return;
    }
    char tmp[40];
    query_buf_add(b, tmp, (size_t)fmt_sig(tmp, x, 12));
}

/* ---- pool ------------------------------------------------------------ */

enum {
    Q_RUN,          /* layers, heads, status of a run */
    Q_METRIC,       /* id, kind of a run's metric */
    Q_STEP_RANGE,   /* min, max step of a metric's frames */
    Q_ROLLUPS,      /* block, nframes, data of a level's block range */
    Q_FRAMES,       /* step, data of a step range */
    Q_FRAME_AT,     /* the last frame <= step */
    Q_COUNT
};

static const char *const q_sql[Q_COUNT] = {
    [Q_RUN] = "SELECT layers, heads, status FROM runs WHERE id = ?1",
    [Q_METRIC] = "SELECT id, kind FROM metrics WHERE run_id = ?1 AND name = ?2",
    /* two subqueries: SQLite answers a lone min() or max() from the index
     * in one seek, but scans every row when both are in one query */
    [Q_STEP_RANGE] = "SELECT (SELECT min(step) FROM frames WHERE metric_id = ?1), "
                     "(SELECT max(step) FROM frames WHERE metric_id = ?1)",
    [Q_ROLLUPS] = "SELECT block, nframes, data FROM rollups WHERE metric_id = ?1 AND level = ?2 "
                  "AND block BETWEEN ?3 AND ?4 ORDER BY block",
    [Q_FRAMES] = "SELECT step, data FROM frames WHERE metric_id = ?1 AND step BETWEEN ?2 AND ?3 ORDER BY step",
    [Q_FRAME_AT] = "SELECT step, data FROM frames WHERE metric_id = ?1 AND step <= ?2 ORDER BY step DESC LIMIT 1",
};

struct query {
    sqlite3 *db;
    sqlite3_stmt *stmt[Q_COUNT];
    struct query *next;
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
    sqlite3_close(q->db);
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
    sqlite3_busy_timeout(q->db, 5000);
    /* mmap lets reads of frames and rollups skip a copy into the page cache */
    sqlite3_exec(q->db, "PRAGMA mmap_size = 1073741824; PRAGMA cache_size = -16384", NULL, NULL, NULL);
    for (int i = 0; i < Q_COUNT; i++) {
        if (sqlite3_prepare_v3(q->db, q_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &q->stmt[i], NULL) != SQLITE_OK) {
            snprintf(err, errlen, "database %s: preparing a query: %s", path, sqlite3_errmsg(q->db));
            goto fail;
        }
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

/* ---- helpers --------------------------------------------------------- */

static int db_fail(struct query *q, char *err, size_t errlen, const char *what) {
    snprintf(err, errlen, "database error %s: %s", what, sqlite3_errmsg(q->db));
    return QUERY_ERR;
}

static int begin(struct query *q, char *err, size_t errlen) {
    if (sqlite3_exec(q->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) return db_fail(q, err, errlen, "starting a read");
    return QUERY_OK;
}

static void end(struct query *q) {
    if (!sqlite3_get_autocommit(q->db)) sqlite3_exec(q->db, "COMMIT", NULL, NULL, NULL);
}

static const char *kind_name(int kind) { return kind == 0 ? "scalar" : kind == 1 ? "layer" : "head"; }

struct runinfo {
    int64_t layers, heads;
    char status[16];
};

static int run_get(struct query *q, int64_t id, struct runinfo *ri, char *err, size_t errlen) {
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
        ret = db_fail(q, err, errlen, "reading the run");
    }
    sqlite3_reset(s);
    return ret;
}

static int metric_get(struct query *q, int64_t run_id, const char *name, int64_t *id, int *kind, char *err,
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
        ret = db_fail(q, err, errlen, "reading the metric");
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return ret;
}

/* ---- runs ------------------------------------------------------------ */

static cJSON *run_json(sqlite3_stmt *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "id", (double)sqlite3_column_int64(s, 0));
    cJSON_AddStringToObject(o, "name", (const char *)sqlite3_column_text(s, 1));
    cJSON_AddStringToObject(o, "status", (const char *)sqlite3_column_text(s, 2));
    cJSON_AddNumberToObject(o, "created", sqlite3_column_double(s, 3));
    cJSON_AddNumberToObject(o, "updated", sqlite3_column_double(s, 4));
    if (sqlite3_column_type(s, 5) == SQLITE_NULL) cJSON_AddNullToObject(o, "last_step");
    else cJSON_AddNumberToObject(o, "last_step", (double)sqlite3_column_int64(s, 5));
    cJSON_AddNumberToObject(o, "last_seq", (double)sqlite3_column_int64(s, 6));
    cJSON_AddNumberToObject(o, "layers", (double)sqlite3_column_int64(s, 7));
    cJSON_AddNumberToObject(o, "heads", (double)sqlite3_column_int64(s, 8));
    cJSON_AddNumberToObject(o, "seq_len", (double)sqlite3_column_int64(s, 9));
    /* meta was validated as a JSON object by the protocol parser */
    cJSON_AddRawToObject(o, "meta", (const char *)sqlite3_column_text(s, 10));
    cJSON_AddNumberToObject(o, "alerts_firing", (double)sqlite3_column_int64(s, 11));
    /* the summary the daemon keeps as data arrives (schema/005_runs.sql) */
    cJSON *v = cJSON_AddObjectToObject(o, "verdict");
    const char *state = (const char *)sqlite3_column_text(s, 12);
    cJSON_AddStringToObject(v, "state", state ? state : "healthy");
    if (sqlite3_column_type(s, 13) == SQLITE_NULL) cJSON_AddNullToObject(v, "since_step");
    else cJSON_AddNumberToObject(v, "since_step", (double)sqlite3_column_int64(s, 13));
    const char *heads = (const char *)sqlite3_column_text(s, 14);
    cJSON_AddRawToObject(v, "heads", heads ? heads : "[]"); /* JSON the daemon wrote */
    if (sqlite3_column_type(s, 15) == SQLITE_NULL) cJSON_AddNullToObject(v, "rule");
    else cJSON_AddStringToObject(v, "rule", (const char *)sqlite3_column_text(s, 15));
    if (sqlite3_column_type(s, 16) == SQLITE_NULL) cJSON_AddNullToObject(o, "last_loss");
    else cJSON_AddNumberToObject(o, "last_loss", sqlite3_column_double(s, 16));
    if (sqlite3_column_type(s, 17) == SQLITE_NULL) cJSON_AddNullToObject(o, "min_entropy_norm");
    else cJSON_AddNumberToObject(o, "min_entropy_norm", sqlite3_column_double(s, 17));
    return o;
}

#define RUN_SELECT                                                                                              \
    "SELECT runs.id, runs.name, runs.status, runs.created, runs.updated, runs.last_step, runs.last_seq, "     \
    "runs.layers, runs.heads, runs.seq_len, runs.meta, "                                                       \
    "(SELECT count(*) FROM alerts a WHERE a.run_id = runs.id AND a.state = 'firing'), "                       \
    "s.verdict, s.since_step, s.heads, s.rule, s.last_loss, s.min_entropy"
#define RUN_FROM " FROM runs LEFT JOIN run_summary s ON s.run_id = runs.id "

static int emit_json(cJSON *root, struct query_buf *out, char *err, size_t errlen) {
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) {
        snprintf(err, errlen, "out of memory");
        return QUERY_ERR;
    }
    query_buf_puts(out, txt);
    free(txt);
    return QUERY_OK;
}

/* The filters of a runs list, all bound: ?1 status, ?2 verdict, ?3 name
 * substring, ?4/?5 created range, ?10..?25 meta path/value pairs (a NULL
 * path is no filter). Fixed text: no SQL is built from a request. */
#define META_F(p, v) " AND (?" #p " IS NULL OR CAST(json_extract(runs.meta, ?" #p ") AS TEXT) IS ?" #v ")"
#define RUNS_WHERE " WHERE (?2 IS NULL OR coalesce(s.verdict, 'healthy') = ?2) AND " RUNS_FILTERS
/* The same without the verdict (for a count that needs no summary): ?2 unused. */
#define RUNS_WHERE_NO_SUMMARY " WHERE ?2 IS NULL AND " RUNS_FILTERS
#define RUNS_FILTERS                                                                                            \
    "(?1 IS NULL OR runs.status = ?1) "                                                                         \
    "AND (?3 IS NULL OR instr(lower(runs.name), lower(?3)) > 0) "                                              \
    "AND (?4 IS NULL OR runs.created >= ?4) AND (?5 IS NULL OR runs.created <= ?5)"                           \
    META_F(10, 11) META_F(12, 13) META_F(14, 15) META_F(16, 17) META_F(18, 19) META_F(20, 21) META_F(22, 23)  \
    META_F(24, 25)

/* One page: the filters, then (sort key, id) past the cursor (?6, ?7) as
 * a row value, in that order, at most ?8 rows (-1: all). Column 18 is the
 * sort key, for the next cursor. */
#define RUNS_PAGE(EXPR, CMP, DIR)                                                                               \
    RUN_SELECT ", " EXPR RUN_FROM RUNS_WHERE " AND (" EXPR ", runs.id) " CMP " (?6, ?7) ORDER BY " EXPR " " DIR \
               ", runs.id " DIR " LIMIT ?8"
#define RUNS_SORT(NAME, EXPR, TEXT) \
    {NAME, TEXT, {RUNS_PAGE(EXPR, ">", "ASC"), RUNS_PAGE(EXPR, "<", "DESC")}}

/* Sort keys of the runs list: the name a request uses and its statements
 * (ascending, descending). NULLs sort as a sentinel so that a cursor can
 * compare them. */
static const struct {
    const char *name;
    int text;
    const char *sql[2];
} run_sorts[] = {
    [QUERY_SORT_ID] = RUNS_SORT("id", "runs.id", 0),
    [QUERY_SORT_NAME] = RUNS_SORT("name", "runs.name", 1),
    [QUERY_SORT_CREATED] = RUNS_SORT("created", "runs.created", 0),
    [QUERY_SORT_UPDATED] = RUNS_SORT("updated", "runs.updated", 0),
    [QUERY_SORT_LAST_STEP] = RUNS_SORT("last_step", "coalesce(runs.last_step, -1)", 0),
    [QUERY_SORT_LAST_LOSS] = RUNS_SORT("last_loss", "coalesce(s.last_loss, 1e308)", 0),
    [QUERY_SORT_MIN_ENTROPY] = RUNS_SORT("min_entropy_norm", "coalesce(s.min_entropy, 1e308)", 0),
    [QUERY_SORT_VERDICT] = RUNS_SORT("verdict", "(CASE s.verdict WHEN 'collapsed' THEN 4 WHEN 'diverged' THEN 3 "
                                                "WHEN 'collapsing' THEN 2 WHEN 'stalled' THEN 1 ELSE 0 END)", 0),
};

const char *query_runs_sort_name(int sort) {
    return sort >= 0 && sort < QUERY_SORT_COUNT ? run_sorts[sort].name : NULL;
}

static void runs_bind(sqlite3_stmt *s, const struct query_runs_req *req) {
    if (req->status) sqlite3_bind_text(s, 1, req->status, -1, SQLITE_STATIC);
    if (req->verdict) sqlite3_bind_text(s, 2, req->verdict, -1, SQLITE_STATIC);
    if (req->search && *req->search) sqlite3_bind_text(s, 3, req->search, -1, SQLITE_STATIC);
    if (req->has_from) sqlite3_bind_double(s, 4, req->created_from);
    if (req->has_to) sqlite3_bind_double(s, 5, req->created_to);
    for (int i = 0; i < req->nmeta && i < QUERY_RUNS_MAX_META; i++) {
        sqlite3_bind_text(s, 10 + 2 * i, req->meta_path[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 11 + 2 * i, req->meta_value[i], -1, SQLITE_STATIC);
    }
}

/* A cursor is "ID:KEY", the id and sort key of the last run of a page
 * (KEY a number, or the name for the name sort). */
static int cursor_parse(const char *c, int text, int64_t *id, double *num, const char **str) {
    char *end;
    errno = 0;
    long long v = strtoll(c, &end, 10);
    if (errno || end == c || *end != ':' || v < 0) return -1;
    *id = v;
    if (text) {
        *str = end + 1;
        return 0;
    }
    const char *k = end + 1;
    *num = strtod(k, &end);
    return end == k || *end ? -1 : 0;
}

int query_runs_page(struct query *q, const struct query_runs_req *req, struct query_buf *out, char *err,
                    size_t errlen) {
    sqlite3_stmt *s = NULL;
    cJSON *root = NULL, *arr = NULL;
    int ret = QUERY_ERR, rc;
    int sort = req->sort >= 0 && req->sort < QUERY_SORT_COUNT ? req->sort : QUERY_SORT_ID;
    int64_t cid = 0;
    double cnum = 0;
    const char *cstr = NULL;
    if (req->nmeta > QUERY_RUNS_MAX_META) {
        snprintf(err, errlen, "at most %d meta filters", QUERY_RUNS_MAX_META);
        return QUERY_BAD;
    }
    if (req->cursor && cursor_parse(req->cursor, run_sorts[sort].text, &cid, &cnum, &cstr)) {
        snprintf(err, errlen, "cursor is not one this daemon gave out (for sort=%s)", run_sorts[sort].name);
        return QUERY_BAD;
    }
    if (begin(q, err, errlen)) return QUERY_ERR;
    if (sqlite3_prepare_v2(q->db, run_sorts[sort].sql[req->desc ? 1 : 0], -1, &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "listing runs");
        goto out;
    }
    runs_bind(s, req);
    if (req->cursor) {
        if (cstr) sqlite3_bind_text(s, 6, cstr, -1, SQLITE_STATIC);
        else sqlite3_bind_double(s, 6, cnum);
        sqlite3_bind_int64(s, 7, cid);
    } else if (req->desc) {
        sqlite3_bind_zeroblob(s, 6, 0); /* a blob sorts after every number and text */
    } else {
        sqlite3_bind_double(s, 6, -INFINITY); /* before every key, numbers and text */
    }
    /* one more than asked, to know whether there is a next page */
    sqlite3_bind_int64(s, 8, req->limit > 0 ? req->limit + 1 : -1);
    if (!(arr = cJSON_CreateArray())) goto oom;
    int64_t count = 0;
    char next[PROTO_MAX_RUN + 64] = "";
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (req->limit > 0 && count == req->limit) break; /* there is a next page */
        cJSON *o = run_json(s);
        if (!o) goto oom;
        cJSON_AddItemToArray(arr, o);
        count++;
        if (req->limit > 0) {
            if (run_sorts[sort].text)
                snprintf(next, sizeof next, "%lld:%s", (long long)sqlite3_column_int64(s, 0),
                         (const char *)sqlite3_column_text(s, 18));
            else
                snprintf(next, sizeof next, "%lld:%.17g", (long long)sqlite3_column_int64(s, 0),
                         sqlite3_column_double(s, 18));
        }
    }
    int more = rc == SQLITE_ROW;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        ret = db_fail(q, err, errlen, "listing runs");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (req->limit <= 0) { /* the old answer: a bare array of every run that matches */
        ret = emit_json(arr, out, err, errlen);
        arr = NULL;
        goto out;
    }
    if (!(root = cJSON_CreateObject())) goto oom;
    cJSON_AddItemToObject(root, "runs", arr);
    arr = NULL;
    if (more) cJSON_AddStringToObject(root, "next", next);
    else cJSON_AddNullToObject(root, "next");
    cJSON_AddStringToObject(root, "sort", run_sorts[sort].name);
    cJSON_AddStringToObject(root, "order", req->desc ? "desc" : "asc");
    /* how many match in all, for the page's "N runs" */
    /* Unfiltered (the runs page's first screen), SQLite counts the b-tree
     * without reading rows (0.01 ms at 10,000 runs; filtered, every run is
     * read: ~7 ms). The summary is joined only for a verdict filter (one row
     * per run at most: the count is the same, without a lookup per run). */
    int filtered = req->status || req->verdict || (req->search && *req->search) || req->has_from || req->has_to ||
                   req->nmeta;
    if (sqlite3_prepare_v2(q->db, !filtered ? "SELECT count(*) FROM runs"
                                  : req->verdict ? "SELECT count(*)" RUN_FROM RUNS_WHERE
                                                 : "SELECT count(*) FROM runs" RUNS_WHERE_NO_SUMMARY,
                           -1, &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "counting runs");
        goto out;
    }
    if (filtered) runs_bind(s, req);
    if (sqlite3_step(s) != SQLITE_ROW) {
        ret = db_fail(q, err, errlen, "counting runs");
        goto out;
    }
    cJSON_AddNumberToObject(root, "total", (double)sqlite3_column_int64(s, 0));
    ret = emit_json(root, out, err, errlen);
    root = NULL;
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
    ret = QUERY_ERR;
out:
    cJSON_Delete(arr);
    cJSON_Delete(root);
    sqlite3_finalize(s);
    end(q);
    return ret;
}

int query_runs(struct query *q, const char *status, struct query_buf *out, char *err, size_t errlen) {
    struct query_runs_req req = {.status = status};
    return query_runs_page(q, &req, out, err, errlen);
}

int query_run(struct query *q, int64_t id, struct query_buf *out, char *err, size_t errlen) {
    sqlite3_stmt *s = NULL;
    cJSON *o = NULL;
    int ret = QUERY_ERR, rc;
    if (begin(q, err, errlen)) return QUERY_ERR;
    if (sqlite3_prepare_v2(q->db, RUN_SELECT RUN_FROM "WHERE runs.id = ?1", -1, &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "reading the run");
        goto out;
    }
    sqlite3_bind_int64(s, 1, id);
    rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        snprintf(err, errlen, "no run %lld", (long long)id);
        ret = QUERY_NOT_FOUND;
        goto out;
    }
    if (rc != SQLITE_ROW || !(o = run_json(s))) {
        ret = db_fail(q, err, errlen, "reading the run");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    cJSON *m = cJSON_AddObjectToObject(o, "metrics");
    cJSON *kinds[3] = {cJSON_AddArrayToObject(m, "scalars"), cJSON_AddArrayToObject(m, "layers"),
                       cJSON_AddArrayToObject(m, "heads")};
    if (sqlite3_prepare_v2(q->db, "SELECT name, kind FROM metrics WHERE run_id = ?1 ORDER BY name", -1, &s,
                           NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "listing metrics");
        goto out;
    }
    sqlite3_bind_int64(s, 1, id);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int k = sqlite3_column_int(s, 1);
        if (k >= 0 && k < 3 && kinds[k])
            cJSON_AddItemToArray(kinds[k], cJSON_CreateString((const char *)sqlite3_column_text(s, 0)));
    }
    if (rc != SQLITE_DONE) {
        ret = db_fail(q, err, errlen, "listing metrics");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (sqlite3_prepare_v2(q->db, "SELECT min(step) FROM steps WHERE run_id = ?1", -1, &s, NULL) != SQLITE_OK ||
        (sqlite3_bind_int64(s, 1, id), sqlite3_step(s)) != SQLITE_ROW) {
        ret = db_fail(q, err, errlen, "reading the first step");
        goto out;
    }
    if (sqlite3_column_type(s, 0) == SQLITE_NULL) cJSON_AddNullToObject(o, "first_step");
    else cJSON_AddNumberToObject(o, "first_step", (double)sqlite3_column_int64(s, 0));
    ret = emit_json(o, out, err, errlen);
    o = NULL;
out:
    cJSON_Delete(o);
    sqlite3_finalize(s);
    end(q);
    return ret;
}

int query_run_status(struct query *q, int64_t id, char *status, size_t cap, char *err, size_t errlen) {
    struct runinfo ri;
    int rc = run_get(q, id, &ri, err, errlen);
    if (rc == QUERY_OK) snprintf(status, cap, "%s", ri.status);
    return rc;
}

int64_t query_run_id(struct query *q, const char *name) {
    sqlite3_stmt *s;
    int64_t id = 0;
    if (sqlite3_prepare_v2(q->db, "SELECT id FROM runs WHERE name = ?1", -1, &s, NULL) != SQLITE_OK) return 0;
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) id = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return id;
}

/* ---- series ---------------------------------------------------------- */

/* One bucket's pool of values (of one series). */
struct bucket {
    float mn, mx;
    double sum;
    uint64_t count, nonfinite;
};

/* One series of the answer: where its cells are, and how many it pools. */
struct group {
    int64_t layer, head; /* -1: not a single layer / head */
    uint32_t ncells;
};

/* A series query being answered. Each selected cell of a frame (a value
 * index, cells[c]) feeds one group (group[c]); the buckets form a table of
 * nb rows (time) by ngroups columns, so one pass over a frame or a rollup
 * row fills every series, and a split answer reads what one series does. */
struct series {
    struct query *q;
    int64_t metric_id;
    uint32_t n;            /* values per frame */
    uint32_t *cells;       /* selected value indices */
    uint32_t *group;       /* the group of each selected cell */
    uint32_t ncells;
    struct group *groups;
    uint32_t ngroups;
    int64_t a, w;          /* bucket i covers [a + i*w, a + (i+1)*w), clipped to the range */
    int64_t last;          /* the metric's last stored step */
    int64_t nb;
    struct bucket *b;      /* b[i * ngroups + g]: bucket i of group g */
    uint64_t *frames;      /* frames in bucket i (the same for every group) */
};

static void series_free(struct series *sr) {
    free(sr->cells);
    free(sr->group);
    free(sr->groups);
    free(sr->b);
    free(sr->frames);
}

static void bucket_merge(struct bucket *b, float mn, float mx, double sum, uint64_t c) {
    if (!c) return;
    if (!b->count || mn < b->mn) b->mn = mn;
    if (!b->count || mx > b->mx) b->mx = mx;
    b->sum += sum;
    b->count += c;
}

static int add_raw(struct series *sr, int64_t lo, int64_t hi) {
    sqlite3_stmt *s = sr->q->stmt[Q_FRAMES];
    int rc;
    sqlite3_bind_int64(s, 1, sr->metric_id);
    sqlite3_bind_int64(s, 2, lo);
    sqlite3_bind_int64(s, 3, hi);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(s, 0);
        const unsigned char *d = sqlite3_column_blob(s, 1);
        if ((size_t)sqlite3_column_bytes(s, 1) != (size_t)sr->n * 4) continue;
        int64_t i = (step - sr->a) / sr->w;
        struct bucket *row = &sr->b[i * sr->ngroups];
        sr->frames[i]++;
        for (uint32_t c = 0; c < sr->ncells; c++) {
            struct bucket *b = &row[sr->group[c]];
            float x;
            memcpy(&x, d + 4 * (size_t)sr->cells[c], 4);
            if (isfinite(x)) bucket_merge(b, x, x, x, 1);
            else b->nonfinite++;
        }
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : -1;
}

static int add_rollups(struct series *sr, int level, int64_t b0, int64_t b1) {
    sqlite3_stmt *s = sr->q->stmt[Q_ROLLUPS];
    int64_t size = STORE_LEVEL_SIZE(level);
    int rc;
    sqlite3_bind_int64(s, 1, sr->metric_id);
    sqlite3_bind_int(s, 2, level);
    sqlite3_bind_int64(s, 3, b0);
    sqlite3_bind_int64(s, 4, b1);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t block = sqlite3_column_int64(s, 0);
        int64_t nframes = sqlite3_column_int64(s, 1);
        const unsigned char *d = sqlite3_column_blob(s, 2);
        if ((size_t)sqlite3_column_bytes(s, 2) != (size_t)sr->n * STORE_ROLLUP_BYTES) continue;
        int64_t i = (block * size - sr->a) / sr->w;
        struct bucket *row = &sr->b[i * sr->ngroups];
        sr->frames[i] += (uint64_t)nframes;
        for (uint32_t c = 0; c < sr->ncells; c++) {
            struct bucket *b = &row[sr->group[c]];
            const unsigned char *e = d + (size_t)sr->cells[c] * STORE_ROLLUP_BYTES;
            float mn, mx;
            double sum;
            uint32_t cnt;
            memcpy(&mn, e, 4);
            memcpy(&mx, e + 4, 4);
            memcpy(&sum, e + 8, 8);
            memcpy(&cnt, e + 16, 4);
            bucket_merge(b, mn, mx, sum, cnt);
            b->nonfinite += (uint64_t)nframes - cnt;
        }
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Adds the steps [lo, hi] using level k's complete blocks where they fit,
 * lower levels for the unaligned edges and the tail the level does not
 * cover yet, and raw frames at the bottom. Every block used lies inside one
 * bucket because bucket edges are multiples of the top level's size. */
static int cover(struct series *sr, int64_t lo, int64_t hi, int k) {
    if (lo > hi) return 0;
    if (k == 0) return add_raw(sr, lo, hi);
    int64_t size = STORE_LEVEL_SIZE(k);
    int64_t complete = sr->last / size * size; /* level k has every block below this */
    int64_t top = hi < complete - 1 ? hi : complete - 1;
    int64_t b0 = (lo + size - 1) / size, b1 = (top + 1) / size - 1;
    if (top < lo || b0 > b1) return cover(sr, lo, hi, k - 1);
    if (cover(sr, lo, b0 * size - 1, k - 1)) return -1;
    if (add_rollups(sr, k, b0, b1)) return -1;
    return cover(sr, (b1 + 1) * size, hi, k - 1);
}

/* QUERY_BAD (with a message) when the request's layer, head and split do
 * not fit a metric of this kind with L x H cells. */
static int series_check(const struct query_series_req *req, int kind, int64_t L, int64_t H, char *err,
                        size_t errlen) {
    const char *m = req->metric;
    if (req->agg < QUERY_AGG_MEAN || req->agg > QUERY_AGG_MAX || req->split < QUERY_SPLIT_NONE ||
        req->split > QUERY_SPLIT_LAYER)
        snprintf(err, errlen, "bad agg or split");
    else if (kind == 0 && (req->layer >= 0 || req->head >= 0))
        snprintf(err, errlen, "%s is a scalar: it has no layer or head", m);
    else if (kind == 1 && req->head >= 0)
        snprintf(err, errlen, "%s is a layer metric: it has no head", m);
    else if (req->layer >= L || req->head >= H)
        snprintf(err, errlen, "%s has %lld layers x %lld heads; layer or head out of range", m, (long long)L,
                 (long long)H);
    else if (req->split == QUERY_SPLIT_HEAD && kind != 2)
        snprintf(err, errlen, "split=head needs a head metric; %s is a %s metric", m, kind_name(kind));
    else if (req->split == QUERY_SPLIT_HEAD && req->head >= 0)
        snprintf(err, errlen, "split=head gives one series per head: leave out head");
    else if (req->split == QUERY_SPLIT_LAYER && kind == 0)
        snprintf(err, errlen, "split=layer needs a head or layer metric; %s is a scalar", m);
    else if (req->split == QUERY_SPLIT_LAYER && (req->layer >= 0 || req->head >= 0))
        snprintf(err, errlen, "split=layer gives one series per layer: leave out layer and head");
    else
        return QUERY_OK;
    return QUERY_BAD;
}

/* Selects the request's cells (every layer / head where left out) of a
 * frame of L x H values and assigns each to its series (enum query_split). */
static int series_select(struct series *sr, const struct query_series_req *req, int64_t L, int64_t H, char *err,
                         size_t errlen) {
    int64_t l0 = req->layer >= 0 ? req->layer : 0, l1 = req->layer >= 0 ? req->layer + 1 : L;
    int64_t h0 = req->head >= 0 ? req->head : 0, h1 = req->head >= 0 ? req->head + 1 : H;
    sr->n = (uint32_t)(L * H);
    sr->ncells = (uint32_t)((l1 - l0) * (h1 - h0));
    sr->ngroups = req->split == QUERY_SPLIT_HEAD    ? sr->ncells
                  : req->split == QUERY_SPLIT_LAYER ? (uint32_t)(l1 - l0)
                                                    : 1;
    sr->cells = malloc(sr->ncells * sizeof *sr->cells);
    sr->group = malloc(sr->ncells * sizeof *sr->group);
    sr->groups = calloc(sr->ngroups, sizeof *sr->groups);
    if (!sr->cells || !sr->group || !sr->groups) {
        snprintf(err, errlen, "out of memory");
        return QUERY_ERR;
    }
    uint32_t c = 0;
    for (int64_t l = l0; l < l1; l++)
        for (int64_t h = h0; h < h1; h++, c++) {
            uint32_t g = req->split == QUERY_SPLIT_HEAD ? c : req->split == QUERY_SPLIT_LAYER ? (uint32_t)(l - l0) : 0;
            struct group *gr = &sr->groups[g];
            sr->cells[c] = (uint32_t)(l * H + h);
            sr->group[c] = g;
            if (!gr->ncells++) {
                gr->layer = req->split ? l : req->layer;
                gr->head = req->split == QUERY_SPLIT_HEAD ? h : req->split ? -1 : req->head;
            }
        }
    return QUERY_OK;
}

/* Chooses the buckets over [lo, hi] (sr->a, w, nb) for at most `points` of
 * them; returns the rollup level their edges align to. */
static int series_plan(struct series *sr, int64_t lo, int64_t hi, int64_t points) {
    /* the largest level no wider than a bucket needs to be */
    uint64_t span = (uint64_t)(hi - lo) + 1;
    uint64_t w0 = (span + (uint64_t)points - 1) / (uint64_t)points;
    int k = 0;
    while (k < STORE_LEVELS && (uint64_t)STORE_LEVEL_SIZE(k + 1) <= w0) k++;
    /* Buckets of 32..63 steps would read up to 64 raw frames per bucket;
     * 64-step buckets from level 1 cost at most half the resolution
     * (never fewer than points/2 buckets) and bound raw reads to the
     * edges. */
    if (k == 0 && 2 * w0 >= (uint64_t)STORE_LEVEL_SIZE(1)) k = 1;
    int64_t size = k ? STORE_LEVEL_SIZE(k) : 1;
    sr->a = lo / size * size;
    uint64_t reach = (uint64_t)(hi - sr->a) + 1;
    uint64_t w = (reach + (uint64_t)points - 1) / (uint64_t)points;
    w = (w + (uint64_t)size - 1) / (uint64_t)size * (uint64_t)size;
    sr->w = (int64_t)w;
    sr->nb = (int64_t)((reach + w - 1) / w);
    return k;
}

enum stat { STAT_MIN, STAT_MAX, STAT_MEAN, STAT_COUNT, STAT_NONFINITE };

/* Appends "name":[...], statistic `what` of group g in each listed bucket
 * (one holding a frame). */
static void emit_stat(struct query_buf *out, const char *name, const struct series *sr, uint32_t g, int what) {
    query_buf_printf(out, "\"%s\":[", name);
    int first = 1;
    for (int64_t i = 0; i < sr->nb; i++) {
        if (!sr->frames[i]) continue;
        const struct bucket *b = &sr->b[i * sr->ngroups + g];
        if (!first) query_buf_add(out, ",", 1);
        first = 0;
        if (what == STAT_COUNT) buf_i64(out, (int64_t)b->count);
        else if (what == STAT_NONFINITE) buf_i64(out, (int64_t)b->nonfinite);
        else if (!b->count) query_buf_add(out, "null", 4);
        else if (what == STAT_MIN) query_buf_f32(out, b->mn);
        else if (what == STAT_MAX) query_buf_f32(out, b->mx);
        else query_buf_f64(out, b->sum / (double)b->count);
    }
    query_buf_add(out, "]", 1);
}

/* Appends ,"min":[..],"max":..,"mean":..,"count":..,"nonfinite":.. of group
 * g, and ,"value":[..] (the agg statistic) when it pools several cells. */
static void emit_group(struct query_buf *out, const struct series *sr, uint32_t g, int agg) {
    static const char *const names[] = {[STAT_MIN] = "min", [STAT_MAX] = "max", [STAT_MEAN] = "mean",
                                        [STAT_COUNT] = "count", [STAT_NONFINITE] = "nonfinite"};
    static const int agg_stat[] = {[QUERY_AGG_MEAN] = STAT_MEAN, [QUERY_AGG_MIN] = STAT_MIN,
                                   [QUERY_AGG_MAX] = STAT_MAX};
    for (int what = STAT_MIN; what <= STAT_NONFINITE; what++) {
        query_buf_add(out, ",", 1);
        emit_stat(out, names[what], sr, g, what);
    }
    if (sr->groups[g].ncells > 1) {
        query_buf_add(out, ",", 1);
        emit_stat(out, "value", sr, g, agg_stat[agg]);
    }
}

/* Appends "name":[...], the first (last = 0) or last step of each listed
 * bucket, clipped to [lo, hi]. */
static void emit_edges(struct query_buf *out, const char *name, const struct series *sr, int last, int64_t lo,
                       int64_t hi) {
    query_buf_printf(out, "\"%s\":[", name);
    int first = 1;
    for (int64_t i = 0; i < sr->nb; i++) {
        if (!sr->frames[i]) continue;
        int64_t st = last ? sr->a + (i + 1) * sr->w - 1 : sr->a + i * sr->w;
        if (st < lo) st = lo;
        if (st > hi) st = hi;
        if (!first) query_buf_add(out, ",", 1);
        buf_i64(out, st);
        first = 0;
    }
    query_buf_add(out, "]", 1);
}

/* The answer (query.h): the shared fields, then the one series' arrays, or
 * with a split the list of series. */
static void series_emit(struct query_buf *out, const struct series *sr, const struct query_series_req *req, int kind,
                        int64_t from, int64_t to, int64_t lo, int64_t hi) {
    static const char *const aggs[] = {"mean", "min", "max"};
    static const char *const splits[] = {"none", "head", "layer"};
    int pooled = 0;
    for (uint32_t g = 0; g < sr->ngroups; g++) pooled |= sr->groups[g].ncells > 1;
    query_buf_printf(out, "{\"run\":%lld,\"metric\":", (long long)req->run_id);
    query_buf_json_str(out, req->metric);
    query_buf_printf(out, ",\"kind\":\"%s\"", kind_name(kind));
    if (req->layer >= 0) query_buf_printf(out, ",\"layer\":%lld", (long long)req->layer);
    else query_buf_puts(out, ",\"layer\":null");
    if (req->head >= 0) query_buf_printf(out, ",\"head\":%lld", (long long)req->head);
    else query_buf_puts(out, ",\"head\":null");
    if (req->split) query_buf_printf(out, ",\"split\":\"%s\"", splits[req->split]);
    if (pooled) query_buf_printf(out, ",\"agg\":\"%s\"", aggs[req->agg]);
    else query_buf_puts(out, ",\"agg\":null");
    query_buf_printf(out, ",\"from\":%lld,\"to\":%lld,\"width\":%lld,", (long long)from, (long long)to,
                     (long long)sr->w);
    emit_edges(out, "step", sr, 0, lo, hi);
    query_buf_add(out, ",", 1);
    emit_edges(out, "end", sr, 1, lo, hi);
    if (!req->split) {
        emit_group(out, sr, 0, req->agg);
    } else {
        query_buf_puts(out, ",\"series\":[");
        for (uint32_t g = 0; g < sr->ngroups; g++) {
            const struct group *gr = &sr->groups[g];
            query_buf_printf(out, "%s{\"layer\":%lld,\"head\":", g ? "," : "", (long long)gr->layer);
            if (gr->head >= 0) buf_i64(out, gr->head);
            else query_buf_puts(out, "null");
            emit_group(out, sr, g, req->agg);
            query_buf_add(out, "}", 1);
        }
        query_buf_add(out, "]", 1);
    }
    query_buf_add(out, "}", 1);
}

int query_series(struct query *q, const struct query_series_req *req, struct query_buf *out, char *err,
                 size_t errlen) {
    struct series sr = {.q = q};
    struct runinfo ri;
    int kind, ret;
    int64_t first = 0;
    if (begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = run_get(q, req->run_id, &ri, err, errlen)) ||
        (ret = metric_get(q, req->run_id, req->metric, &sr.metric_id, &kind, err, errlen)))
        goto out;
    int64_t L = kind == 0 ? 1 : ri.layers, H = kind == 2 ? ri.heads : 1;
    if ((ret = series_check(req, kind, L, H, err, errlen)) || (ret = series_select(&sr, req, L, H, err, errlen)))
        goto out;

    ret = QUERY_ERR;
    sqlite3_stmt *s = q->stmt[Q_STEP_RANGE];
    sqlite3_bind_int64(s, 1, sr.metric_id);
    int rc = sqlite3_step(s);
    int empty = rc != SQLITE_ROW || sqlite3_column_type(s, 0) == SQLITE_NULL;
    if (!empty) {
        first = sqlite3_column_int64(s, 0);
        sr.last = sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW) {
        ret = db_fail(q, err, errlen, "reading the step range");
        goto out;
    }
    int64_t from = req->has_from ? req->from : first, to = req->has_to ? req->to : sr.last;
    int64_t lo = from > first ? from : first, hi = to < sr.last ? to : sr.last;
    sr.w = 1;
    int k = !empty && lo <= hi ? series_plan(&sr, lo, hi, req->points) : 0;
    /* the bound holds for an empty range too: each series is still listed */
    if ((uint64_t)(sr.nb ? sr.nb : 1) * sr.ngroups > QUERY_MAX_SERIES_BUCKETS) {
        snprintf(err, errlen, "%u series x %lld buckets is more than %d: ask for fewer points%s", sr.ngroups,
                 (long long)(sr.nb ? sr.nb : 1), QUERY_MAX_SERIES_BUCKETS,
                 req->split == QUERY_SPLIT_HEAD && req->layer < 0 ? " or one layer" : "");
        ret = QUERY_BAD;
        goto out;
    }
    if (sr.nb > 0) {
        sr.b = calloc((size_t)sr.nb * sr.ngroups, sizeof *sr.b);
        sr.frames = calloc((size_t)sr.nb, sizeof *sr.frames);
        if (!sr.b || !sr.frames) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        if (cover(&sr, lo, hi, k)) {
            ret = db_fail(q, err, errlen, "reading the series");
            goto out;
        }
    }
    series_emit(out, &sr, req, kind, from, to, lo, hi);
    ret = QUERY_OK;
out:
    series_free(&sr);
    end(q);
    return ret;
}

/* ---- frame ----------------------------------------------------------- */

/* Values of one frame as JSON: a number for a scalar, [L] for a layer
 * metric, [[H] x L] for a head metric. */
static void emit_values(struct query_buf *out, const unsigned char *d, int kind, int64_t L, int64_t H) {
    float x;
    if (kind == 0) {
        memcpy(&x, d, 4);
        query_buf_add(out, "[", 1);
        query_buf_f32(out, x);
        query_buf_add(out, "]", 1);
        return;
    }
    query_buf_add(out, "[", 1);
    for (int64_t l = 0; l < L; l++) {
        if (l) query_buf_add(out, ",", 1);
        if (kind == 2) query_buf_add(out, "[", 1);
        for (int64_t h = 0; h < H; h++) {
            if (h) query_buf_add(out, ",", 1);
            memcpy(&x, d + 4 * (size_t)(l * H + h), 4);
            query_buf_f32(out, x);
        }
        if (kind == 2) query_buf_add(out, "]", 1);
    }
    query_buf_add(out, "]", 1);
}

int query_frame(struct query *q, int64_t run_id, const char *metric, int has_step, int64_t step,
                struct query_buf *out, char *err, size_t errlen) {
    struct runinfo ri;
    int64_t mid;
    int kind, ret;
    if (begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = run_get(q, run_id, &ri, err, errlen)) || (ret = metric_get(q, run_id, metric, &mid, &kind, err, errlen)))
        goto out;
    int64_t L = kind == 0 ? 1 : ri.layers, H = kind == 2 ? ri.heads : 1;
    sqlite3_stmt *s = q->stmt[Q_FRAME_AT];
    sqlite3_bind_int64(s, 1, mid);
    sqlite3_bind_int64(s, 2, has_step ? step : INT64_MAX);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && (size_t)sqlite3_column_bytes(s, 1) == (size_t)(L * H) * 4) {
        query_buf_printf(out, "{\"run\":%lld,\"metric\":", (long long)run_id);
        query_buf_json_str(out, metric);
        query_buf_printf(out, ",\"kind\":\"%s\",\"step\":%lld,\"layers\":%lld,\"heads\":%lld,\"values\":", kind_name(kind),
                         (long long)sqlite3_column_int64(s, 0), (long long)L, (long long)H);
        emit_values(out, sqlite3_column_blob(s, 1), kind, L, H);
        query_buf_add(out, "}", 1);
        ret = QUERY_OK;
    } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
        snprintf(err, errlen, "%s has no frame at or before that step", metric);
        ret = QUERY_NOT_FOUND;
    } else {
        ret = db_fail(q, err, errlen, "reading the frame");
    }
    sqlite3_reset(s);
out:
    end(q);
    return ret;
}

/* ---- events ---------------------------------------------------------- */

int query_events(struct query *q, int64_t run_id, int64_t after, int64_t before, int newest_first, int64_t limit,
                 struct query_buf *out, char *err, size_t errlen) {
    struct runinfo ri;
    sqlite3_stmt *s = NULL;
    cJSON *root = NULL;
    int ret, rc;
    if (begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = run_get(q, run_id, &ri, err, errlen))) goto out;
    ret = QUERY_ERR;
    if (sqlite3_prepare_v2(q->db,
                           newest_first ? "SELECT id, seq, time, level, text FROM events WHERE run_id = ?1 AND id < ?2 "
                                          "ORDER BY id DESC LIMIT ?3"
                                        : "SELECT id, seq, time, level, text FROM events WHERE run_id = ?1 AND id > ?2 "
                                          "ORDER BY id LIMIT ?3",
                           -1, &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "listing events");
        goto out;
    }
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, newest_first ? (before > 0 ? before : INT64_MAX) : after);
    sqlite3_bind_int64(s, 3, limit + 1); /* one more: is there more? */
    root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "events") : NULL;
    if (!arr) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    cJSON_AddNumberToObject(root, "run", (double)run_id);
    int64_t listed = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (listed++ == limit) break;
        cJSON *e = cJSON_CreateObject();
        if (!e) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        cJSON_AddItemToArray(arr, e);
        cJSON_AddNumberToObject(e, "id", (double)sqlite3_column_int64(s, 0));
        if (sqlite3_column_type(s, 1) == SQLITE_NULL) cJSON_AddNullToObject(e, "seq");
        else cJSON_AddNumberToObject(e, "seq", (double)sqlite3_column_int64(s, 1));
        cJSON_AddNumberToObject(e, "time", sqlite3_column_double(s, 2));
        cJSON_AddStringToObject(e, "level", (const char *)sqlite3_column_text(s, 3));
        cJSON_AddStringToObject(e, "text", (const char *)sqlite3_column_text(s, 4));
    }
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        ret = db_fail(q, err, errlen, "listing events");
        goto out;
    }
    cJSON_AddBoolToObject(root, "more", rc == SQLITE_ROW);
    ret = emit_json(root, out, err, errlen);
    root = NULL;
out:
    cJSON_Delete(root);
    sqlite3_finalize(s);
    end(q);
    return ret;
}

/* ---- export ---------------------------------------------------------- */

/* An export reads a chunk of frames of one metric per read transaction,
 * never holding one open while the client reads: a slow client cannot pin
 * the WAL (writer.h). */
#define EXPORT_CHUNK_BYTES (256 * 1024)

struct export_metric {
    int64_t id;
    int kind;
    char name[PROTO_MAX_NAME + 1];
};

struct query_export {
    struct query *q;
    int64_t run_id;
    int format;
    int64_t L, H;
    int state;          /* 0: header, 1: next frame, 2: values of the frame, 3: done */
    struct export_metric *metrics;
    uint32_t nmetrics, mi; /* the metrics of the run, the one being read */
    int64_t after;      /* the chunk after this step comes next (INT64_MIN at a metric's start) */
    /* the chunk: cn frames of n values each, ci the next to emit */
    int64_t *steps;
    double *times;
    float *data;
    uint32_t cn, ci, ccap;
    char name[PROTO_MAX_NAME + 1];
    int kind;
    int64_t step;
    double time;
    const float *vals;  /* the current frame, in the chunk */
    uint32_t n, i;      /* values in the frame, next to emit */
    char piece[512];    /* the text being handed out */
    size_t plen, poff;
};

static uint32_t metric_values(const struct query_export *x, int kind) {
    return kind == 0 ? 1 : kind == 1 ? (uint32_t)x->L : (uint32_t)(x->L * x->H);
}

struct query_export *query_export_begin(struct query *q, int64_t run_id, int format, int *rc, char *err,
                                        size_t errlen) {
    struct query_export *x = calloc(1, sizeof *x);
    struct runinfo ri;
    sqlite3_stmt *s = NULL;
    *rc = QUERY_ERR;
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    x->q = q;
    x->run_id = run_id;
    x->format = format;
    x->after = INT64_MIN;
    if (begin(q, err, errlen)) goto fail;
    if ((*rc = run_get(q, run_id, &ri, err, errlen))) goto fail;
    *rc = QUERY_ERR;
    x->L = ri.layers;
    x->H = ri.heads;
    if (sqlite3_prepare_v2(q->db, "SELECT id, name, kind FROM metrics WHERE run_id = ?1 ORDER BY id", -1, &s, NULL) !=
        SQLITE_OK) {
        db_fail(q, err, errlen, "starting the export");
        goto fail;
    }
    sqlite3_bind_int64(s, 1, run_id);
    int r;
    uint32_t cap = 0;
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        if (x->nmetrics == cap) {
            cap = cap ? cap * 2 : 16;
            struct export_metric *m = realloc(x->metrics, cap * sizeof *m);
            if (!m) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            x->metrics = m;
        }
        struct export_metric *m = &x->metrics[x->nmetrics++];
        m->id = sqlite3_column_int64(s, 0);
        m->kind = sqlite3_column_int(s, 2);
        snprintf(m->name, sizeof m->name, "%s", (const char *)sqlite3_column_text(s, 1));
    }
    if (r != SQLITE_DONE) {
        db_fail(q, err, errlen, "starting the export");
        goto fail;
    }
    sqlite3_finalize(s);
    end(q);
    *rc = QUERY_OK;
    return x;
fail:
    sqlite3_finalize(s);
    query_export_end(x);
    return NULL;
}

/* Reads the next chunk of the current metric's frames, in its own read
 * transaction. Returns the frames read (0: the metric is done, -2: none
 * to emit in this chunk but more may follow), -1 on error. */
static int export_chunk(struct query_export *x) {
    const struct export_metric *m = &x->metrics[x->mi];
    uint32_t n = metric_values(x, m->kind);
    uint32_t want = EXPORT_CHUNK_BYTES / (4 * (n ? n : 1));
    if (want < 1) want = 1;
    if (want > x->ccap) {
        int64_t *st = realloc(x->steps, want * sizeof *st);
        if (st) x->steps = st;
        double *tm = realloc(x->times, want * sizeof *tm);
        if (tm) x->times = tm;
        float *d = realloc(x->data, (size_t)want * n * sizeof *d);
        if (d) x->data = d;
        if (!st || !tm || !d) return -1;
        x->ccap = want;
    }
    sqlite3_stmt *s = NULL;
    int ret = -1, r;
    uint32_t rows = 0;
    char err[256];
    if (begin(x->q, err, sizeof err)) return -1;
    if (sqlite3_prepare_v2(x->q->db,
                           "SELECT f.step, s.time, f.data FROM frames f "
                           "LEFT JOIN steps s ON s.run_id = ?1 AND s.step = f.step "
                           "WHERE f.metric_id = ?2 AND f.step > ?3 ORDER BY f.step LIMIT ?4",
                           -1, &s, NULL) != SQLITE_OK)
        goto out;
    sqlite3_bind_int64(s, 1, x->run_id);
    sqlite3_bind_int64(s, 2, m->id);
    sqlite3_bind_int64(s, 3, x->after);
    sqlite3_bind_int64(s, 4, want);
    x->cn = x->ci = 0;
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(s, 0);
        x->after = step;
        rows++;
        if ((uint32_t)sqlite3_column_bytes(s, 2) != n * 4) continue; /* shapes are fixed per run */
        x->steps[x->cn] = step;
        x->times[x->cn] = sqlite3_column_double(s, 1);
        memcpy(x->data + (size_t)x->cn * n, sqlite3_column_blob(s, 2), (size_t)n * 4);
        x->cn++;
    }
    /* a chunk of only odd-shaped rows has nothing to emit but is not the end */
    if (r == SQLITE_DONE) ret = x->cn ? (int)x->cn : rows ? -2 : 0;
out:
    sqlite3_finalize(s);
    end(x->q);
    return ret;
}

static void piece_value(struct query_export *x) {
    uint32_t i = x->i;
    float v = x->vals[i];
    char num[32] = "";
    int csv = x->format == QUERY_CSV;
    if (isfinite(v)) snprintf(num, sizeof num, "%.9g", (double)v);
    else if (!csv) snprintf(num, sizeof num, "null");
    if (csv) {
        char lh[48] = ",";
        if (x->kind == 1) snprintf(lh, sizeof lh, "%u,", i);
        else if (x->kind == 2) snprintf(lh, sizeof lh, "%lld,%lld", (long long)(i / x->H), (long long)(i % x->H));
        x->plen = (size_t)snprintf(x->piece, sizeof x->piece, "%s,%s,%lld,%.17g,%s,%s\n", x->name,
                                   kind_name(x->kind), (long long)x->step, x->time, lh, num);
        return;
    }
    /* jsonl: [v] / [v,v] / [[v,v],[v,v]] */
    size_t p = 0;
    uint32_t cols = x->kind == 2 ? (uint32_t)x->H : x->n;
    if (i == 0) x->piece[p++] = '[';
    if (x->kind == 2 && i % cols == 0) {
        if (i) x->piece[p++] = ',';
        x->piece[p++] = '[';
    } else if (i) {
        x->piece[p++] = ',';
    }
    p += (size_t)snprintf(x->piece + p, sizeof x->piece - p, "%s", num);
    if (x->kind == 2 && i % cols == cols - 1) x->piece[p++] = ']';
    if (i == x->n - 1) p += (size_t)snprintf(x->piece + p, sizeof x->piece - p, "]}\n");
    x->plen = p;
}

/* Produces the next piece of text into x->piece. Returns 1, 0 at the end,
 * -1 on a database error. */
static int next_piece(struct query_export *x) {
    x->poff = x->plen = 0;
    for (;;) {
        if (x->state == 0) {
            x->state = 1;
            if (x->format == QUERY_CSV) {
                x->plen = (size_t)snprintf(x->piece, sizeof x->piece, "metric,kind,step,time,layer,head,value\n");
                return 1;
            }
        } else if (x->state == 1) {
            if (x->ci == x->cn) {
                if (x->mi >= x->nmetrics) {
                    x->state = 3;
                    return 0;
                }
                int r = export_chunk(x);
                if (r == -1) return -1;
                if (r == 0) { /* this metric is done */
                    x->mi++;
                    x->after = INT64_MIN;
                }
                continue;
            }
            const struct export_metric *m = &x->metrics[x->mi];
            snprintf(x->name, sizeof x->name, "%s", m->name);
            x->kind = m->kind;
            x->n = metric_values(x, m->kind);
            x->step = x->steps[x->ci];
            x->time = x->times[x->ci];
            x->vals = x->data + (size_t)x->ci * x->n;
            x->ci++;
            x->i = 0;
            x->state = 2;
            if (x->format == QUERY_JSONL) {
                x->plen = (size_t)snprintf(x->piece, sizeof x->piece,
                                           "{\"metric\":\"%s\",\"kind\":\"%s\",\"step\":%lld,\"time\":%.17g,\"values\":",
                                           x->name, kind_name(x->kind), (long long)x->step, x->time);
                return 1;
            }
        } else if (x->state == 2) {
            if (x->i >= x->n) {
                x->state = 1;
                continue;
            }
            piece_value(x);
            x->i++;
            return 1;
        } else {
            return 0;
        }
    }
}

ssize_t query_export_read(struct query_export *x, char *buf, size_t max) {
    size_t w = 0;
    while (w < max) {
        if (x->poff == x->plen) {
            int r = next_piece(x);
            if (r < 0) return w ? (ssize_t)w : -1;
            if (r == 0) break;
        }
        size_t n = x->plen - x->poff;
        if (n > max - w) n = max - w;
        memcpy(buf + w, x->piece + x->poff, n);
        x->poff += n;
        w += n;
    }
    return (ssize_t)w;
}

void query_export_end(struct query_export *x) {
    if (!x) return;
    end(x->q);
    free(x->metrics);
    free(x->steps);
    free(x->times);
    free(x->data);
    free(x);
}

/* ---- prometheus ------------------------------------------------------ */

/* Appends s as a Prometheus label value (backslash, quote, newline escaped). */
static void buf_label(struct query_buf *b, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == '\\' || *p == '"') query_buf_add(b, "\\", 1);
        if (*p == '\n') query_buf_puts(b, "\\n");
        else query_buf_add(b, p, 1);
    }
}

/* The runs /metrics exports: live ones, and the others until keep_s after
 * their last update (their end). ?1 is the oldest `updated` kept. */
#define PROM_EXPORTED "(r.status = 'live' OR r.updated >= ?1)"

int query_prometheus(struct query *q, int heads, double now, double keep_s, struct query_buf *out, char *err,
                     size_t errlen) {
    sqlite3_stmt *s = NULL;
    int ret = QUERY_ERR, rc;
    double since = now - (keep_s > 0 ? keep_s : 0);
    if (begin(q, err, errlen)) return QUERY_ERR;
    if (sqlite3_prepare_v2(q->db, "SELECT name, status, last_step FROM runs r WHERE " PROM_EXPORTED " ORDER BY id", -1,
                           &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "listing runs");
        goto out;
    }
    sqlite3_bind_double(s, 1, since);
    query_buf_puts(out, "# HELP entropyd_run_last_step Highest stored step of a run.\n"
                        "# TYPE entropyd_run_last_step gauge\n");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (sqlite3_column_type(s, 2) == SQLITE_NULL) continue;
        query_buf_printf(out, "entropyd_run_last_step{run=\"%s\",status=\"%s\"} %lld\n", sqlite3_column_text(s, 0),
                         sqlite3_column_text(s, 1), (long long)sqlite3_column_int64(s, 2));
    }
    if (rc != SQLITE_DONE) {
        ret = db_fail(q, err, errlen, "listing runs");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    /* one row of `latest` per exported metric (migration 4): the cost is
     * the number of series, not the history behind them */
    if (sqlite3_prepare_v2(q->db,
                           "SELECT r.name, m.name, m.kind, r.heads, l.data FROM runs r "
                           "JOIN metrics m ON m.run_id = r.id "
                           "JOIN latest l ON l.metric_id = m.id "
                           "WHERE m.kind <= ?2 AND " PROM_EXPORTED " ORDER BY m.kind, r.id, m.name",
                           -1, &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "reading latest values");
        goto out;
    }
    sqlite3_bind_double(s, 1, since);
    sqlite3_bind_int(s, 2, heads ? 2 : 1);
    int kind_seen = -1;
    static const char *const help[3] = {
        "# HELP entropyd_scalar Latest value of each scalar metric of each run (NaN when not finite).\n"
        "# TYPE entropyd_scalar gauge\n",
        "# HELP entropyd_layer Latest value of each layer metric of each run, per layer.\n"
        "# TYPE entropyd_layer gauge\n",
        "# HELP entropyd_head Latest value of each head metric of each run, per layer and head.\n"
        "# TYPE entropyd_head gauge\n"};
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *run = (const char *)sqlite3_column_text(s, 0), *name = (const char *)sqlite3_column_text(s, 1);
        int kind = sqlite3_column_int(s, 2);
        int64_t H = sqlite3_column_int64(s, 3);
        const unsigned char *d = sqlite3_column_blob(s, 4);
        int n = sqlite3_column_bytes(s, 4) / 4;
        if (kind < 0 || kind > 2 || H <= 0) continue;
        if (kind != kind_seen) query_buf_puts(out, help[kind]);
        kind_seen = kind;
        for (int i = 0; i < n; i++) {
            float x;
            char num[32];
            memcpy(&x, d + 4 * (size_t)i, 4);
            if (isnan(x)) snprintf(num, sizeof num, "NaN");
            else if (isinf(x)) snprintf(num, sizeof num, x > 0 ? "+Inf" : "-Inf");
            else snprintf(num, sizeof num, "%.9g", (double)x);
            /* run and metric names are restricted by the protocol to
             * characters that need no escaping in a label value */
            if (kind == 0) query_buf_printf(out, "entropyd_scalar{run=\"%s\",metric=\"%s\"} %s\n", run, name, num);
            else if (kind == 1)
                query_buf_printf(out, "entropyd_layer{run=\"%s\",metric=\"%s\",layer=\"%d\"} %s\n", run, name, i, num);
            else
                query_buf_printf(out, "entropyd_head{run=\"%s\",metric=\"%s\",layer=\"%lld\",head=\"%lld\"} %s\n", run,
                                 name, (long long)(i / H), (long long)(i % H), num);
        }
    }
    if (rc != SQLITE_DONE) {
        ret = db_fail(q, err, errlen, "reading latest values");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    /* One series per firing alert, value 1. Not named ALERTS: that is
     * Prometheus' own series for its rules, and ours would mix with them. */
    if (sqlite3_prepare_v2(q->db, "SELECT a.rule, r.name, a.severity FROM alerts a JOIN runs r ON r.id = a.run_id "
                                  "WHERE a.state = 'firing' AND " PROM_EXPORTED " ORDER BY a.id", -1, &s, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    sqlite3_bind_double(s, 1, since);
    query_buf_puts(out, "# HELP entropyd_alerts_firing Alerts firing now, one series per run and rule.\n"
                        "# TYPE entropyd_alerts_firing gauge\n");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        /* rule names come from the rules file: escape them as label values */
        query_buf_puts(out, "entropyd_alerts_firing{alertname=\"");
        buf_label(out, (const char *)sqlite3_column_text(s, 0));
        query_buf_printf(out, "\",run=\"%s\",severity=\"", sqlite3_column_text(s, 1));
        buf_label(out, (const char *)sqlite3_column_text(s, 2));
        query_buf_puts(out, "\"} 1\n");
    }
    if (rc != SQLITE_DONE) {
        ret = db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    ret = QUERY_OK;
out:
    sqlite3_finalize(s);
    end(q);
    return ret;
}

int64_t query_wal_bytes(struct query *q) { return store_wal_bytes_of(sqlite3_db_filename(q->db, "main")); }

int64_t query_db_bytes(struct query *q) {
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(q->db, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()", -1,
                           &s, NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* ---- alerts -------------------------------------------------------------- */

int query_alerts(struct query *q, const char *state, int64_t run_id, int64_t limit, struct query_buf *out, char *err,
                 size_t errlen) {
    sqlite3_stmt *s = NULL, *t = NULL;
    int ret = QUERY_ERR, rc;
    if (state && strcmp(state, "firing") && strcmp(state, "resolved")) {
        snprintf(err, errlen, "state must be firing or resolved");
        return QUERY_BAD;
    }
    if (begin(q, err, errlen)) return QUERY_ERR;
    if (run_id) {
        if (sqlite3_prepare_v2(q->db, "SELECT 1 FROM runs WHERE id = ?1", -1, &s, NULL) != SQLITE_OK) {
            ret = db_fail(q, err, errlen, "looking up run");
            goto out;
        }
        sqlite3_bind_int64(s, 1, run_id);
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
        s = NULL;
        if (rc != SQLITE_ROW) {
            snprintf(err, errlen, "no run %lld", (long long)run_id);
            ret = QUERY_NOT_FOUND;
            goto out;
        }
    }
    if (sqlite3_prepare_v2(q->db,
                           "SELECT a.id, a.run_id, r.name, a.rule, a.severity, a.fingerprint, a.state, a.starts_at, "
                           "a.ends_at, a.start_step, a.last_step, a.value, a.cells, a.payload, a.reason "
                           "FROM alerts a JOIN runs r ON r.id = a.run_id "
                           "WHERE (?1 IS NULL OR a.state = ?1) AND (?2 = 0 OR a.run_id = ?2) "
                           "ORDER BY a.id DESC LIMIT ?3", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(q->db, "SELECT time, step, transition, value FROM alert_transitions "
                                  "WHERE alert_id = ?1 ORDER BY id", -1, &t, NULL) != SQLITE_OK) {
        ret = db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    if (state) sqlite3_bind_text(s, 1, state, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 1);
    sqlite3_bind_int64(s, 2, run_id);
    sqlite3_bind_int64(s, 3, limit);
    query_buf_puts(out, "[");
    int first = 1;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        query_buf_printf(out, "%s{\"id\":%lld,\"run_id\":%lld,\"run\":", first ? "" : ",",
                         (long long)sqlite3_column_int64(s, 0), (long long)sqlite3_column_int64(s, 1));
        first = 0;
        query_buf_json_str(out, (const char *)sqlite3_column_text(s, 2));
        query_buf_puts(out, ",\"rule\":");
        query_buf_json_str(out, (const char *)sqlite3_column_text(s, 3));
        query_buf_puts(out, ",\"severity\":");
        query_buf_json_str(out, (const char *)sqlite3_column_text(s, 4));
        query_buf_puts(out, ",\"fingerprint\":");
        query_buf_json_str(out, (const char *)sqlite3_column_text(s, 5));
        query_buf_puts(out, ",\"state\":");
        query_buf_json_str(out, (const char *)sqlite3_column_text(s, 6));
        /* why it resolved: null for a recovery (or while firing), "run_ended" when its run ended */
        query_buf_puts(out, ",\"reason\":");
        if (sqlite3_column_type(s, 14) == SQLITE_NULL) query_buf_puts(out, "null");
        else query_buf_json_str(out, (const char *)sqlite3_column_text(s, 14));
        query_buf_printf(out, ",\"starts_at\":%.3f", sqlite3_column_double(s, 7));
        if (sqlite3_column_type(s, 8) == SQLITE_NULL) query_buf_puts(out, ",\"ends_at\":null");
        else query_buf_printf(out, ",\"ends_at\":%.3f", sqlite3_column_double(s, 8));
        query_buf_printf(out, ",\"start_step\":%lld,\"last_step\":%lld", (long long)sqlite3_column_int64(s, 9),
                         (long long)sqlite3_column_int64(s, 10));
        if (sqlite3_column_type(s, 11) == SQLITE_NULL) query_buf_puts(out, ",\"value\":null");
        else query_buf_printf(out, ",\"value\":%.9g", sqlite3_column_double(s, 11));
        /* cells and payload are JSON the daemon itself wrote */
        query_buf_puts(out, ",\"cells\":");
        query_buf_puts(out, (const char *)sqlite3_column_text(s, 12));
        query_buf_puts(out, ",\"alert\":");
        query_buf_puts(out, (const char *)sqlite3_column_text(s, 13));
        query_buf_puts(out, ",\"transitions\":[");
        sqlite3_bind_int64(t, 1, sqlite3_column_int64(s, 0));
        int tf = 1;
        while ((rc = sqlite3_step(t)) == SQLITE_ROW) {
            query_buf_printf(out, "%s{\"time\":%.3f,\"step\":%lld,\"transition\":", tf ? "" : ",",
                             sqlite3_column_double(t, 0), (long long)sqlite3_column_int64(t, 1));
            tf = 0;
            query_buf_json_str(out, (const char *)sqlite3_column_text(t, 2));
            if (sqlite3_column_type(t, 3) == SQLITE_NULL) query_buf_puts(out, ",\"value\":null}");
            else query_buf_printf(out, ",\"value\":%.9g}", sqlite3_column_double(t, 3));
        }
        sqlite3_reset(t);
        if (rc != SQLITE_DONE) {
            ret = db_fail(q, err, errlen, "reading alert transitions");
            goto out;
        }
        query_buf_puts(out, "]}");
    }
    if (rc != SQLITE_DONE) {
        ret = db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    query_buf_puts(out, "]");
    ret = out->failed ? QUERY_ERR : QUERY_OK;
    if (out->failed) snprintf(err, errlen, "out of memory");
out:
    sqlite3_finalize(s);
    sqlite3_finalize(t);
    end(q);
    return ret;
}
