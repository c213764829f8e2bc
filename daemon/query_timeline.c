/* query_timeline.c: the collapse timeline's data (query_timeline in
 * query.h, GET /api/runs/{id}/timeline): every head's (or layer's) bucket
 * minimum of one metric over a step range, in one compact answer.
 *
 * The buckets are exactly a split series request's (query_series_grid:
 * rollups for whole blocks, raw frames only at the unaligned edges), so a
 * whole-run timeline reads rollup rows, never every raw frame. What this
 * file adds is the shape a heads x time picture wants: one value per cell
 * and bucket instead of five arrays per series (a 12 x 12 run at 300
 * buckets was 2 MB as split=head JSON), quantized to 16 bits over the
 * answer's own range, and the trainer's clock at each bucket's edges
 * (from the steps table) for the time axes. It is not a second series
 * engine: buckets, limits and errors are query_series's. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "query_db.h"

/* 16-bit codes: 0..TL_TOP span [lo, hi], TL_NONE marks no finite value. */
#define TL_TOP 65534u
#define TL_NONE 65535u

/* Appends the base64 (RFC 4648, padded) of n bytes. */
static void put_base64(struct strbuf *out, const unsigned char *p, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        q[0] = A[v >> 18 & 63];
        q[1] = A[v >> 12 & 63];
        q[2] = i + 1 < n ? A[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? A[v & 63] : '=';
        strbuf_add(out, q, 4);
    }
}

/* The trainer's time at the first stored step >= step (first) or the last
 * <= step, as JSON (null when there is none); s is reset here. */
static void put_time(struct strbuf *out, sqlite3_stmt *s, int64_t run_id, int64_t step) {
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_int64(s, 2, step);
    if (sqlite3_step(s) == SQLITE_ROW) strbuf_f64(out, sqlite3_column_double(s, 0));
    else strbuf_puts(out, "null");
}

/* Appends "name":[times of the grid's bucket edges] (first: their first
 * steps, else their last). */
static int put_times(struct strbuf *out, struct query *q, const char *name, const struct query_grid *g, int64_t run_id,
                     int first) {
    static const char *const sql[] = {
        "SELECT time FROM steps WHERE run_id = ?1 AND step <= ?2 ORDER BY step DESC LIMIT 1",
        "SELECT time FROM steps WHERE run_id = ?1 AND step >= ?2 ORDER BY step LIMIT 1"};
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(q->db, sql[first], -1, &s, NULL) != SQLITE_OK) return -1;
    strbuf_printf(out, ",\"%s\":[", name);
    for (int64_t i = 0; i < g->nb; i++) {
        if (i) strbuf_add(out, ",", 1);
        put_time(out, s, run_id, first ? g->step[i] : g->end[i]);
    }
    strbuf_add(out, "]", 1);
    int rc = sqlite3_errcode(q->db);
    sqlite3_finalize(s);
    return rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

static void put_steps(struct strbuf *out, const char *name, const int64_t *v, int64_t n) {
    strbuf_printf(out, ",\"%s\":[", name);
    for (int64_t i = 0; i < n; i++) {
        if (i) strbuf_add(out, ",", 1);
        strbuf_i64(out, v[i]);
    }
    strbuf_add(out, "]", 1);
}

/* ,"lo":..,"hi":..,"min":"<base64>": the grid's minima as 16-bit codes
 * over [lo, hi] (the lowest and highest of them), row-major. */
static int put_codes(struct strbuf *out, const struct query_grid *g) {
    size_t n = (size_t)g->nb * g->ngroups;
    float lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (isfinite(g->min[i])) {
            if (g->min[i] < lo) lo = g->min[i];
            if (g->min[i] > hi) hi = g->min[i];
        }
    unsigned char *b = malloc(n ? 2 * n : 1);
    if (!b) return -1;
    double span = hi > lo ? (double)hi - (double)lo : 0;
    for (size_t i = 0; i < n; i++) {
        float v = g->min[i];
        unsigned c = !isfinite(v) ? TL_NONE : span > 0 ? (unsigned)lround(((double)v - lo) / span * TL_TOP) : 0;
        b[2 * i] = (unsigned char)(c & 255);
        b[2 * i + 1] = (unsigned char)(c >> 8);
    }
    if (lo <= hi) {
        strbuf_puts(out, ",\"lo\":");
        strbuf_f32(out, lo);
        strbuf_puts(out, ",\"hi\":");
        strbuf_f32(out, hi);
    } else strbuf_puts(out, ",\"lo\":null,\"hi\":null");
    strbuf_puts(out, ",\"min\":\"");
    put_base64(out, b, 2 * n);
    strbuf_add(out, "\"", 1);
    free(b);
    return 0;
}

int query_timeline(struct query *q, const struct query_timeline_req *req, struct strbuf *out, char *err,
                   size_t errlen) {
    struct query_grid g = {0};
    struct query_runinfo ri;
    int64_t mid;
    int kind, ret;
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = query_run_get(q, req->run_id, &ri, err, errlen)) ||
        (ret = query_metric_get(q, req->run_id, req->metric, &mid, &kind, err, errlen)))
        goto out;
    if (kind == 0) {
        snprintf(err, errlen, "%s is a scalar: the timeline draws head and layer metrics", req->metric);
        ret = QUERY_BAD;
        goto out;
    }
    if (kind == 1 && req->layer >= 0) {
        snprintf(err, errlen, "%s is a layer metric: its rows are its layers, leave out layer", req->metric);
        ret = QUERY_BAD;
        goto out;
    }
    if (req->fold_layers && req->layer >= 0) {
        snprintf(err, errlen, "rows=layer gives one row per layer: leave out layer");
        ret = QUERY_BAD;
        goto out;
    }
    int per_head = kind == 2 && !req->fold_layers;
    struct query_series_req sq = {.run_id = req->run_id,
                                  .metric = req->metric,
                                  .layer = per_head ? req->layer : -1,
                                  .head = -1,
                                  .has_from = req->has_from,
                                  .has_to = req->has_to,
                                  .from = req->from,
                                  .to = req->to,
                                  .points = req->points,
                                  .agg = QUERY_AGG_MIN,
                                  .split = per_head ? QUERY_SPLIT_HEAD : QUERY_SPLIT_LAYER};
    if ((ret = query_series_grid(q, &sq, &g, err, errlen))) goto out;
    strbuf_printf(out, "{\"run\":%lld,\"metric\":", (long long)req->run_id);
    strbuf_json_str(out, req->metric);
    strbuf_printf(out, ",\"kind\":\"%s\",\"rows\":\"%s\",\"layer\":", query_kind_name(kind),
                  per_head ? "head" : "layer");
    if (per_head && req->layer >= 0) strbuf_i64(out, req->layer);
    else strbuf_puts(out, "null");
    strbuf_printf(out, ",\"layers\":%lld,\"heads\":%lld,\"from\":%lld,\"to\":%lld,\"width\":%lld,\"resolution\":%lld",
                  (long long)ri.layers, (long long)ri.heads, (long long)g.from, (long long)g.to, (long long)g.width,
                  (long long)g.resolution);
    put_steps(out, "step", g.step, g.nb);
    put_steps(out, "end", g.end, g.nb);
    ret = QUERY_ERR;
    if (put_times(out, q, "time", &g, req->run_id, 1) || put_times(out, q, "end_time", &g, req->run_id, 0)) {
        ret = query_db_fail(q, err, errlen, "reading the steps' times");
        goto out;
    }
    strbuf_puts(out, ",\"cells\":[");
    for (uint32_t k = 0; k < g.ngroups; k++) {
        strbuf_printf(out, "%s[%lld,", k ? "," : "", (long long)g.layer[k]);
        if (g.head[k] >= 0) strbuf_i64(out, g.head[k]);
        else strbuf_puts(out, "null");
        strbuf_add(out, "]", 1);
    }
    strbuf_add(out, "]", 1);
    if (put_codes(out, &g)) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    strbuf_add(out, "}", 1);
    ret = QUERY_OK;
out:
    query_grid_free(&g);
    query_db_end(q);
    return ret;
}
