/* query.c: the read-only queries of the HTTP API other than series and
 * export (query_series.c, query_export.c): runs, a run, a frame, events,
 * alerts and the Prometheus text. See query.h for the contract and
 * schema/storage.md for the blob layouts. */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alert_rules.h"
#include "query_db.h"
#include "store.h"

/* ---- runs ------------------------------------------------------------ */

/* o.key = column col of s: a number, or null when the column is NULL. */
static void add_number_or_null(cJSON *o, const char *key, sqlite3_stmt *s, int col) {
    if (sqlite3_column_type(s, col) == SQLITE_NULL) cJSON_AddNullToObject(o, key);
    else cJSON_AddNumberToObject(o, key, sqlite3_column_double(s, col));
}

/* o.key = a Unix time with every bit of the stored double (%.17g): cJSON
 * prints 15 digits when they read back within an ulp, and a client that
 * sends a run's `created` back as a created_from bound must match it. */
static void add_time(cJSON *o, const char *key, double t) {
    char num[40];
    snprintf(num, sizeof num, "%.17g", isfinite(t) ? t : 0.0);
    cJSON_AddRawToObject(o, key, num);
}

static cJSON *run_json(sqlite3_stmt *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "id", (double)sqlite3_column_int64(s, 0));
    cJSON_AddStringToObject(o, "name", (const char *)sqlite3_column_text(s, 1));
    cJSON_AddStringToObject(o, "status", (const char *)sqlite3_column_text(s, 2));
    add_time(o, "created", sqlite3_column_double(s, 3));
    add_time(o, "updated", sqlite3_column_double(s, 4));
    add_number_or_null(o, "last_step", s, 5);
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
    add_number_or_null(v, "since_step", s, 13);
    const char *heads = (const char *)sqlite3_column_text(s, 14);
    cJSON_AddRawToObject(v, "heads", heads ? heads : "[]"); /* JSON the daemon wrote */
    if (sqlite3_column_type(s, 15) == SQLITE_NULL) cJSON_AddNullToObject(v, "rule");
    else cJSON_AddStringToObject(v, "rule", (const char *)sqlite3_column_text(s, 15));
    /* JSON the daemon wrote (alerter.c verdict_evidence) */
    const char *evidence = (const char *)sqlite3_column_text(s, 18);
    if (evidence) cJSON_AddRawToObject(v, "evidence", evidence);
    else cJSON_AddNullToObject(v, "evidence");
    add_number_or_null(o, "last_loss", s, 16);
    add_number_or_null(o, "min_entropy_norm", s, 17);
    return o;
}

#define RUN_SELECT                                                                                        \
    "SELECT runs.id, runs.name, runs.status, runs.created, runs.updated, runs.last_step, runs.last_seq, " \
    "runs.layers, runs.heads, runs.seq_len, runs.meta, "                                                  \
    "(SELECT count(*) FROM alerts a WHERE a.run_id = runs.id AND a.state = 'firing'), "                   \
    "s.verdict, s.since_step, s.heads, s.rule, s.last_loss, s.min_entropy, s.evidence"
#define RUN_FROM " FROM runs LEFT JOIN run_summary s ON s.run_id = runs.id "

static int emit_json(cJSON *root, struct strbuf *out, char *err, size_t errlen) {
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) {
        snprintf(err, errlen, "out of memory");
        return QUERY_ERR;
    }
    strbuf_puts(out, txt);
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
#define RUNS_FILTERS                                                                                              \
    "(?1 IS NULL OR runs.status = ?1) "                                                                           \
    "AND (?3 IS NULL OR instr(lower(runs.name), lower(?3)) > 0) "                                                 \
    "AND (?4 IS NULL OR runs.created >= ?4) AND (?5 IS NULL OR runs.created <= ?5)" META_F(10, 11) META_F(12, 13) \
        META_F(14, 15) META_F(16, 17) META_F(18, 19) META_F(20, 21) META_F(22, 23) META_F(24, 25)

/* One page: the filters, then (sort key, id) past the cursor (?6, ?7) as
 * a row value, in that order, at most ?8 rows (-1: all). Column 19 is the
 * sort key, for the next cursor. */
#define RUNS_PAGE(EXPR, CMP, DIR)                                                                               \
    RUN_SELECT ", " EXPR RUN_FROM RUNS_WHERE " AND (" EXPR ", runs.id) " CMP " (?6, ?7) ORDER BY " EXPR " " DIR \
               ", runs.id " DIR " LIMIT ?8"
#define RUNS_SORT(NAME, EXPR, TEXT)                                               \
    {                                                                             \
        NAME, TEXT, { RUNS_PAGE(EXPR, ">", "ASC"), RUNS_PAGE(EXPR, "<", "DESC") } \
    }

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
    [QUERY_SORT_VERDICT] = RUNS_SORT("verdict",
                                     "(CASE s.verdict WHEN 'collapsed' THEN 5 WHEN 'diverged' THEN 4 "
                                     "WHEN 'collapsing' THEN 3 WHEN 'stalled' THEN 2 WHEN 'sharp' THEN 1 "
                                     "ELSE 0 END)",
                                     0),
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

int query_runs_page(struct query *q, const struct query_runs_req *req, struct strbuf *out, char *err, size_t errlen) {
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
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if (sqlite3_prepare_v2(q->db, run_sorts[sort].sql[req->desc ? 1 : 0], -1, &s, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "listing runs");
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
                         (const char *)sqlite3_column_text(s, 19));
            else
                snprintf(next, sizeof next, "%lld:%.17g", (long long)sqlite3_column_int64(s, 0),
                         sqlite3_column_double(s, 19));
        }
    }
    int more = rc == SQLITE_ROW;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        ret = query_db_fail(q, err, errlen, "listing runs");
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
    int filtered =
        req->status || req->verdict || (req->search && *req->search) || req->has_from || req->has_to || req->nmeta;
    if (sqlite3_prepare_v2(q->db,
                           !filtered      ? "SELECT count(*) FROM runs"
                           : req->verdict ? "SELECT count(*)" RUN_FROM RUNS_WHERE
                                          : "SELECT count(*) FROM runs" RUNS_WHERE_NO_SUMMARY,
                           -1, &s, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "counting runs");
        goto out;
    }
    if (filtered) runs_bind(s, req);
    if (sqlite3_step(s) != SQLITE_ROW) {
        ret = query_db_fail(q, err, errlen, "counting runs");
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
    query_db_end(q);
    return ret;
}

/* Whether array a (of strings) holds name. */
static int has_name(const cJSON *a, const char *name) {
    const cJSON *it;
    cJSON_ArrayForEach(it, a) if (cJSON_IsString(it) && !strcmp(it->valuestring, name)) return 1;
    return 0;
}

/* "rules_unavailable" (query_run): every rule reading a metric of its
 * scope's kind that the run's metrics (kinds: scalars, layers, heads)
 * lack. An out-of-memory leaves the list short. */
static void add_rules_unavailable(cJSON *o, cJSON *const kinds[3], const struct alert_rules *rules) {
    static const char *const kind_name[3] = {"scalar", "layer", "head"};
    cJSON *arr = cJSON_AddArrayToObject(o, "rules_unavailable");
    for (int i = 0; arr && rules && i < rules->n; i++) {
        const struct alert_rule *r = &rules->rules[i];
        if (r->scope == ALERT_SCOPE_RUN) continue; /* reads no metric */
        int k = r->scope == ALERT_SCOPE_HEAD ? 2 : r->scope == ALERT_SCOPE_LAYER ? 1 : 0;
        const char *reads[4] = {r->metric, r->and_metric, r->bound_metric, r->rising_metric};
        cJSON *missing = NULL;
        for (int j = 0; j < 4; j++) {
            if (!reads[j] || has_name(kinds[k], reads[j])) continue;
            int dup = 0;
            for (int p = 0; p < j; p++) dup |= reads[p] && !strcmp(reads[p], reads[j]);
            if (dup) continue;
            if (!missing) {
                cJSON *e = cJSON_CreateObject();
                if (!e) return;
                cJSON_AddItemToArray(arr, e);
                cJSON_AddStringToObject(e, "rule", r->name);
                if (!(missing = cJSON_AddArrayToObject(e, "missing"))) return;
            }
            char what[128]; /* metric names are at most 64 bytes */
            snprintf(what, sizeof what, "%s metric %s", kind_name[k], reads[j]);
            cJSON_AddItemToArray(missing, cJSON_CreateString(what));
        }
    }
}

int query_run(struct query *q, int64_t id, const struct alert_rules *rules, struct strbuf *out, char *err,
              size_t errlen) {
    sqlite3_stmt *s = NULL;
    cJSON *o = NULL;
    int ret = QUERY_ERR, rc;
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if (sqlite3_prepare_v2(q->db, RUN_SELECT RUN_FROM "WHERE runs.id = ?1", -1, &s, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "reading the run");
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
        ret = query_db_fail(q, err, errlen, "reading the run");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    cJSON *m = cJSON_AddObjectToObject(o, "metrics");
    cJSON *kinds[3] = {cJSON_AddArrayToObject(m, "scalars"), cJSON_AddArrayToObject(m, "layers"),
                       cJSON_AddArrayToObject(m, "heads")};
    if (sqlite3_prepare_v2(q->db, "SELECT name, kind FROM metrics WHERE run_id = ?1 ORDER BY name", -1, &s, NULL) !=
        SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "listing metrics");
        goto out;
    }
    sqlite3_bind_int64(s, 1, id);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int k = sqlite3_column_int(s, 1);
        if (k >= 0 && k < 3 && kinds[k])
            cJSON_AddItemToArray(kinds[k], cJSON_CreateString((const char *)sqlite3_column_text(s, 0)));
    }
    if (rc != SQLITE_DONE) {
        ret = query_db_fail(q, err, errlen, "listing metrics");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (cJSON_GetArraySize(kinds[0]) + cJSON_GetArraySize(kinds[1]) + cJSON_GetArraySize(kinds[2]) > 0)
        add_rules_unavailable(o, kinds, rules);
    if (sqlite3_prepare_v2(q->db, "SELECT min(step) FROM steps WHERE run_id = ?1", -1, &s, NULL) != SQLITE_OK ||
        (sqlite3_bind_int64(s, 1, id), sqlite3_step(s)) != SQLITE_ROW) {
        ret = query_db_fail(q, err, errlen, "reading the first step");
        goto out;
    }
    add_number_or_null(o, "first_step", s, 0);
    ret = emit_json(o, out, err, errlen);
    o = NULL;
out:
    cJSON_Delete(o);
    sqlite3_finalize(s);
    query_db_end(q);
    return ret;
}

int query_run_status(struct query *q, int64_t id, char *status, size_t cap, char *err, size_t errlen) {
    struct query_runinfo ri;
    int rc = query_run_get(q, id, &ri, err, errlen);
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

/* ---- events ---------------------------------------------------------- */

int query_events(struct query *q, int64_t run_id, int64_t after, int64_t before, int newest_first, int64_t limit,
                 struct strbuf *out, char *err, size_t errlen) {
    struct query_runinfo ri;
    sqlite3_stmt *s = NULL;
    cJSON *root = NULL;
    int ret, rc;
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = query_run_get(q, run_id, &ri, err, errlen))) goto out;
    ret = QUERY_ERR;
    if (sqlite3_prepare_v2(q->db,
                           newest_first ? "SELECT id, seq, time, level, text FROM events WHERE run_id = ?1 AND id < ?2 "
                                          "ORDER BY id DESC LIMIT ?3"
                                        : "SELECT id, seq, time, level, text FROM events WHERE run_id = ?1 AND id > ?2 "
                                          "ORDER BY id LIMIT ?3",
                           -1, &s, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "listing events");
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
        add_number_or_null(e, "seq", s, 1);
        cJSON_AddNumberToObject(e, "time", sqlite3_column_double(s, 2));
        cJSON_AddStringToObject(e, "level", (const char *)sqlite3_column_text(s, 3));
        cJSON_AddStringToObject(e, "text", (const char *)sqlite3_column_text(s, 4));
    }
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        ret = query_db_fail(q, err, errlen, "listing events");
        goto out;
    }
    cJSON_AddBoolToObject(root, "more", rc == SQLITE_ROW);
    ret = emit_json(root, out, err, errlen);
    root = NULL;
out:
    cJSON_Delete(root);
    sqlite3_finalize(s);
    query_db_end(q);
    return ret;
}

/* ---- prometheus ------------------------------------------------------ */

/* Appends s as a Prometheus label value (backslash, quote, newline escaped). */
static void buf_label(struct strbuf *b, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == '\\' || *p == '"') strbuf_add(b, "\\", 1);
        if (*p == '\n') strbuf_puts(b, "\\n");
        else strbuf_add(b, p, 1);
    }
}

/* The runs /metrics exports: live ones, and the others until keep_s after
 * their last update (their end). ?1 is the oldest `updated` kept. */
#define PROM_EXPORTED "(r.status = 'live' OR r.updated >= ?1)"

int query_prometheus(struct query *q, int heads, double now, double keep_s, struct strbuf *out, char *err,
                     size_t errlen) {
    sqlite3_stmt *s = NULL;
    int ret = QUERY_ERR, rc;
    double since = now - (keep_s > 0 ? keep_s : 0);
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if (sqlite3_prepare_v2(q->db, "SELECT name, status, last_step FROM runs r WHERE " PROM_EXPORTED " ORDER BY id", -1,
                           &s, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "listing runs");
        goto out;
    }
    sqlite3_bind_double(s, 1, since);
    strbuf_puts(out, "# HELP entropyd_run_last_step Highest stored step of a run.\n"
                     "# TYPE entropyd_run_last_step gauge\n");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (sqlite3_column_type(s, 2) == SQLITE_NULL) continue;
        strbuf_printf(out, "entropyd_run_last_step{run=\"%s\",status=\"%s\"} %lld\n", sqlite3_column_text(s, 0),
                      sqlite3_column_text(s, 1), (long long)sqlite3_column_int64(s, 2));
    }
    if (rc != SQLITE_DONE) {
        ret = query_db_fail(q, err, errlen, "listing runs");
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
        ret = query_db_fail(q, err, errlen, "reading latest values");
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
        if (kind != kind_seen) strbuf_puts(out, help[kind]);
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
            if (kind == 0) strbuf_printf(out, "entropyd_scalar{run=\"%s\",metric=\"%s\"} %s\n", run, name, num);
            else if (kind == 1)
                strbuf_printf(out, "entropyd_layer{run=\"%s\",metric=\"%s\",layer=\"%d\"} %s\n", run, name, i, num);
            else
                strbuf_printf(out, "entropyd_head{run=\"%s\",metric=\"%s\",layer=\"%lld\",head=\"%lld\"} %s\n", run,
                              name, (long long)(i / H), (long long)(i % H), num);
        }
    }
    if (rc != SQLITE_DONE) {
        ret = query_db_fail(q, err, errlen, "reading latest values");
        goto out;
    }
    sqlite3_finalize(s);
    s = NULL;
    /* One series per firing alert, value 1. Not named ALERTS: that is
     * Prometheus' own series for its rules, and ours would mix with them. */
    if (sqlite3_prepare_v2(q->db,
                           "SELECT a.rule, r.name, a.severity FROM alerts a JOIN runs r ON r.id = a.run_id "
                           "WHERE a.state = 'firing' AND " PROM_EXPORTED " ORDER BY a.id",
                           -1, &s, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    sqlite3_bind_double(s, 1, since);
    strbuf_puts(out, "# HELP entropyd_alerts_firing Alerts firing now, one series per run and rule.\n"
                     "# TYPE entropyd_alerts_firing gauge\n");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        /* rule names come from the rules file: escape them as label values */
        strbuf_puts(out, "entropyd_alerts_firing{alertname=\"");
        buf_label(out, (const char *)sqlite3_column_text(s, 0));
        strbuf_printf(out, "\",run=\"%s\",severity=\"", sqlite3_column_text(s, 1));
        buf_label(out, (const char *)sqlite3_column_text(s, 2));
        strbuf_puts(out, "\"} 1\n");
    }
    if (rc != SQLITE_DONE) {
        ret = query_db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    ret = QUERY_OK;
out:
    sqlite3_finalize(s);
    query_db_end(q);
    return ret;
}

int64_t query_wal_bytes(struct query *q) { return store_wal_bytes_of(sqlite3_db_filename(q->db, "main")); }

int64_t query_db_bytes(struct query *q) {
    sqlite3_stmt *s;
    int64_t v = -1;
    if (sqlite3_prepare_v2(q->db, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()", -1, &s,
                           NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* ---- alerts -------------------------------------------------------------- */

int query_alerts(struct query *q, const char *state, int64_t run_id, int64_t limit, struct strbuf *out, char *err,
                 size_t errlen) {
    sqlite3_stmt *s = NULL, *t = NULL;
    int ret = QUERY_ERR, rc;
    if (state && strcmp(state, "firing") && strcmp(state, "resolved")) {
        snprintf(err, errlen, "state must be firing or resolved");
        return QUERY_BAD;
    }
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if (run_id) {
        if (sqlite3_prepare_v2(q->db, "SELECT 1 FROM runs WHERE id = ?1", -1, &s, NULL) != SQLITE_OK) {
            ret = query_db_fail(q, err, errlen, "looking up run");
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
                           "ORDER BY a.id DESC LIMIT ?3",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(q->db,
                           "SELECT time, step, transition, value FROM alert_transitions "
                           "WHERE alert_id = ?1 ORDER BY id",
                           -1, &t, NULL) != SQLITE_OK) {
        ret = query_db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    if (state) sqlite3_bind_text(s, 1, state, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 1);
    sqlite3_bind_int64(s, 2, run_id);
    sqlite3_bind_int64(s, 3, limit);
    strbuf_puts(out, "[");
    int first = 1;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        strbuf_printf(out, "%s{\"id\":%lld,\"run_id\":%lld,\"run\":", first ? "" : ",",
                      (long long)sqlite3_column_int64(s, 0), (long long)sqlite3_column_int64(s, 1));
        first = 0;
        strbuf_json_str(out, (const char *)sqlite3_column_text(s, 2));
        strbuf_puts(out, ",\"rule\":");
        strbuf_json_str(out, (const char *)sqlite3_column_text(s, 3));
        strbuf_puts(out, ",\"severity\":");
        strbuf_json_str(out, (const char *)sqlite3_column_text(s, 4));
        strbuf_puts(out, ",\"fingerprint\":");
        strbuf_json_str(out, (const char *)sqlite3_column_text(s, 5));
        strbuf_puts(out, ",\"state\":");
        strbuf_json_str(out, (const char *)sqlite3_column_text(s, 6));
        /* why it resolved: null for a recovery (or while firing), "run_ended" when its run ended */
        strbuf_puts(out, ",\"reason\":");
        if (sqlite3_column_type(s, 14) == SQLITE_NULL) strbuf_puts(out, "null");
        else strbuf_json_str(out, (const char *)sqlite3_column_text(s, 14));
        strbuf_printf(out, ",\"starts_at\":%.3f", sqlite3_column_double(s, 7));
        if (sqlite3_column_type(s, 8) == SQLITE_NULL) strbuf_puts(out, ",\"ends_at\":null");
        else strbuf_printf(out, ",\"ends_at\":%.3f", sqlite3_column_double(s, 8));
        strbuf_printf(out, ",\"start_step\":%lld,\"last_step\":%lld", (long long)sqlite3_column_int64(s, 9),
                      (long long)sqlite3_column_int64(s, 10));
        if (sqlite3_column_type(s, 11) == SQLITE_NULL) strbuf_puts(out, ",\"value\":null");
        else strbuf_printf(out, ",\"value\":%.9g", sqlite3_column_double(s, 11));
        /* cells and payload are JSON the daemon itself wrote */
        strbuf_puts(out, ",\"cells\":");
        strbuf_puts(out, (const char *)sqlite3_column_text(s, 12));
        strbuf_puts(out, ",\"alert\":");
        strbuf_puts(out, (const char *)sqlite3_column_text(s, 13));
        strbuf_puts(out, ",\"transitions\":[");
        sqlite3_bind_int64(t, 1, sqlite3_column_int64(s, 0));
        int tf = 1;
        while ((rc = sqlite3_step(t)) == SQLITE_ROW) {
            strbuf_printf(out, "%s{\"time\":%.3f,\"step\":%lld,\"transition\":", tf ? "" : ",",
                          sqlite3_column_double(t, 0), (long long)sqlite3_column_int64(t, 1));
            tf = 0;
            strbuf_json_str(out, (const char *)sqlite3_column_text(t, 2));
            if (sqlite3_column_type(t, 3) == SQLITE_NULL) strbuf_puts(out, ",\"value\":null}");
            else strbuf_printf(out, ",\"value\":%.9g}", sqlite3_column_double(t, 3));
        }
        sqlite3_reset(t);
        if (rc != SQLITE_DONE) {
            ret = query_db_fail(q, err, errlen, "reading alert transitions");
            goto out;
        }
        strbuf_puts(out, "]}");
    }
    if (rc != SQLITE_DONE) {
        ret = query_db_fail(q, err, errlen, "reading alerts");
        goto out;
    }
    strbuf_puts(out, "]");
    ret = out->failed ? QUERY_ERR : QUERY_OK;
    if (out->failed) snprintf(err, errlen, "out of memory");
out:
    sqlite3_finalize(s);
    sqlite3_finalize(t);
    query_db_end(q);
    return ret;
}
