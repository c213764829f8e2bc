/* query_frames.c: reading raw frames -- one (query_frame, GET .../frame)
 * or a step range of them (query_frames, for readers such as the
 * remote-write pusher). The one place that knows how a frame's values are
 * stored (schema/storage.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "query_db.h"

/* Values of one frame as JSON: a number for a scalar, [L] for a layer
 * metric, [[H] x L] for a head metric. */
static void emit_values(struct strbuf *out, const unsigned char *d, int kind, int64_t L, int64_t H) {
    float x;
    if (kind == 0) {
        memcpy(&x, d, 4);
        strbuf_add(out, "[", 1);
        strbuf_f32(out, x);
        strbuf_add(out, "]", 1);
        return;
    }
    strbuf_add(out, "[", 1);
    for (int64_t l = 0; l < L; l++) {
        if (l) strbuf_add(out, ",", 1);
        if (kind == 2) strbuf_add(out, "[", 1);
        for (int64_t h = 0; h < H; h++) {
            if (h) strbuf_add(out, ",", 1);
            memcpy(&x, d + 4 * (size_t)(l * H + h), 4);
            strbuf_f32(out, x);
        }
        if (kind == 2) strbuf_add(out, "]", 1);
    }
    strbuf_add(out, "]", 1);
}

int query_frame(struct query *q, int64_t run_id, const char *metric, int has_step, int64_t step,
                struct strbuf *out, char *err, size_t errlen) {
    struct query_runinfo ri;
    int64_t mid;
    int kind, ret;
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = query_run_get(q, run_id, &ri, err, errlen)) || (ret = query_metric_get(q, run_id, metric, &mid, &kind, err, errlen)))
        goto out;
    int64_t L = kind == 0 ? 1 : ri.layers, H = kind == 2 ? ri.heads : 1;
    sqlite3_stmt *s = q->stmt[Q_FRAME_AT];
    sqlite3_bind_int64(s, 1, mid);
    sqlite3_bind_int64(s, 2, has_step ? step : INT64_MAX);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && (size_t)sqlite3_column_bytes(s, 1) == (size_t)(L * H) * 4) {
        strbuf_printf(out, "{\"run\":%lld,\"metric\":", (long long)run_id);
        strbuf_json_str(out, metric);
        strbuf_printf(out, ",\"kind\":\"%s\",\"step\":%lld,\"layers\":%lld,\"heads\":%lld,\"values\":", query_kind_name(kind),
                         (long long)sqlite3_column_int64(s, 0), (long long)L, (long long)H);
        emit_values(out, sqlite3_column_blob(s, 1), kind, L, H);
        strbuf_add(out, "}", 1);
        ret = QUERY_OK;
    } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
        snprintf(err, errlen, "%s has no frame at or before that step", metric);
        ret = QUERY_NOT_FOUND;
    } else {
        ret = query_db_fail(q, err, errlen, "reading the frame");
    }
    sqlite3_reset(s);
out:
    query_db_end(q);
    return ret;
}

int query_frames(struct query *q, int64_t metric_id, uint32_t n, int64_t lo, int64_t hi, query_frame_fn fn, void *ctx,
                 char *err, size_t errlen) {
    float *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    if (!vals) {
        snprintf(err, errlen, "out of memory");
        return QUERY_ERR;
    }
    sqlite3_stmt *s = q->stmt[Q_FRAMES];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, lo);
    sqlite3_bind_int64(s, 3, hi);
    int rc, ret = QUERY_OK;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if ((size_t)sqlite3_column_bytes(s, 1) != (size_t)n * 4) continue; /* not this metric's shape: skip */
        memcpy(vals, sqlite3_column_blob(s, 1), (size_t)n * 4);
        if ((ret = fn(ctx, sqlite3_column_int64(s, 0), vals, n)) != 0) break;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) ret = query_db_fail(q, err, errlen, "reading frames");
    sqlite3_reset(s);
    free(vals);
    return ret;
}
