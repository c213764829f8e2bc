/* query_frames.c: reading raw frames -- one (query_frame, GET .../frame)
 * or a step range of them (query_frames, for readers such as the
 * remote-write pusher). The one place that knows how a frame's values are
 * stored (schema/storage.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fblock.h"
#include "integrity.h"
#include "query_db.h"
#include "rollup.h"
#include "store.h"

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

/* A raw frame of metric_id that does not hold its n values is corrupt:
 * noted for query_db_fail (the reader gets an error, never a silent gap);
 * returns -1. */
static int frame_corrupt(struct query *q, int64_t metric_id, int64_t step, int bytes, uint32_t n) {
    return query_db_corrupt(q, "the frame of metric %lld at step %lld has %d bytes, its shape %u values (%zu bytes)",
                            (long long)metric_id, (long long)step, bytes, n, (size_t)n * 4);
}

/* Row s's frame (step, data in column 1, crc in 2) fails its checksum
 * (integrity.h; a row without one, from before migration 11, passes):
 * noted as corrupt, -1; else 0. */
static int frame_check(struct query *q, int64_t metric_id, int64_t step, sqlite3_stmt *s) {
    if (sqlite3_column_type(s, 2) == SQLITE_NULL ||
        sqlite3_column_int64(s, 2) == integrity_stored(integrity_frame_crc(metric_id, step, sqlite3_column_blob(s, 1),
                                                                           (size_t)sqlite3_column_bytes(s, 1))))
        return 0;
    return query_db_corrupt(q, "steps %lld..%lld: the raw frame of metric %lld at step %lld fails its checksum",
                            (long long)step, (long long)step, (long long)metric_id, (long long)step);
}

/* The next raw frame of the walk's statement into *step / vals (copied:
 * a blob need not be aligned); 0 at the end (*step = INT64_MAX), -1 on
 * error, a row of another size included (frame_corrupt). */
static int raw_next(struct query *q, int64_t metric_id, sqlite3_stmt *s, uint32_t n, int64_t *step, float *vals) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *step = sqlite3_column_int64(s, 0);
        int bytes = sqlite3_column_bytes(s, 1);
        if (frame_check(q, metric_id, *step, s)) return -1;
        if ((size_t)bytes != (size_t)n * 4) return frame_corrupt(q, metric_id, *step, bytes, n);
        memcpy(vals, sqlite3_column_blob(s, 1), (size_t)n * 4);
        return 1;
    }
    *step = INT64_MAX;
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Notes why a read of metric_id's blocks failed (fblock_rows.h code rc)
 * for query_db_fail; returns -1. */
static int rows_fail(struct query *q, int64_t metric_id, int rc) {
    if (rc == FBLOCK_ECORRUPT) {
        int64_t block, chunk;
        const char *why = fblock_rows_fault(q->rows, &block, &chunk);
        char part[32] = "";
        if (chunk >= 0) snprintf(part, sizeof part, ", chunk %lld", (long long)chunk);
        return query_db_corrupt(q, "steps %lld..%lld: the sealed block %lld%s of metric %lld %s",
                                (long long)(block * FBLOCK_STEPS), (long long)(block * FBLOCK_STEPS + FBLOCK_STEPS - 1),
                                (long long)block, part, (long long)metric_id,
                                strcmp(why, "checksum mismatch") == 0 ? "fails its checksum" : why);
    }
    if (rc == FBLOCK_ENOMEM)
        return query_db_corrupt(q, "out of memory decoding a block of metric %lld", (long long)metric_id);
    return -1; /* the database's own error */
}

int query_walk(struct query *q, int64_t metric_id, uint32_t n, uint32_t c0, uint32_t c1, int64_t lo, int64_t hi,
               query_frame_fn fn, void *ctx, int *failed) {
    /* row 0 holds the next raw frame, rows 1.. the frames of a block */
    float *vals = malloc((size_t)(n ? n : 1) * (FBLOCK_STEPS + 1) * sizeof *vals);
    sqlite3_stmt *raw = q->stmt[Q_FRAMES];
    int ret = 0, rc = 0;
    int64_t rstep = INT64_MAX, steps[FBLOCK_STEPS], block;
    uint64_t mask;
    *failed = 0;
    if (!vals) goto fail;
    sqlite3_bind_int64(raw, 1, metric_id);
    sqlite3_bind_int64(raw, 2, lo);
    sqlite3_bind_int64(raw, 3, hi);
    fblock_rows_walk(q->rows, metric_id, lo > 0 ? lo / FBLOCK_STEPS : 0, hi < 0 ? -1 : hi / FBLOCK_STEPS, 0, n, c0, c1);
    if (raw_next(q, metric_id, raw, n, &rstep, vals) < 0) goto fail;
    while (!ret && (rc = fblock_rows_next(q->rows, &block, &mask, vals + n)) == 1) {
        uint32_t nf = fblock_steps(block, mask, steps);
        for (uint32_t f = 0; f < nf && !ret; f++) {
            /* raw frames are after the blocks but in an upgraded database
             * (migration 6): merge them in by step all the same */
            while (!ret && rstep < steps[f]) {
                if ((ret = fn(ctx, rstep, vals, n))) break;
                if (raw_next(q, metric_id, raw, n, &rstep, vals) < 0) goto fail;
            }
            if (!ret && steps[f] >= lo && steps[f] <= hi) ret = fn(ctx, steps[f], vals + (size_t)(f + 1) * n, n);
        }
    }
    if (!ret && rc < 0) {
        rows_fail(q, metric_id, rc);
        goto fail;
    }
    while (!ret && rstep != INT64_MAX) {
        if ((ret = fn(ctx, rstep, vals, n))) break;
        if (raw_next(q, metric_id, raw, n, &rstep, vals) < 0) goto fail;
    }
    goto out;
fail:
    *failed = 1;
    ret = QUERY_ERR;
out:
    sqlite3_reset(raw);
    fblock_rows_end(q->rows);
    free(vals);
    return ret;
}

/* The first (last = 0) or last step of a metric's blocks: 1, 0 for none, -1. */
static int block_edge(struct query *q, int64_t metric_id, int last, int64_t *step) {
    int64_t block;
    uint64_t mask;
    int ret = fblock_rows_edge(q->rows, metric_id, last, &block, &mask);
    if (ret == 1) {
        uint32_t nf = fblock_count(mask);
        if (!nf) return -1;
        *step = fblock_step(block, mask, last ? nf - 1 : 0);
    }
    return ret < 0 ? -1 : ret;
}

int query_step_range(struct query *q, int64_t metric_id, int64_t *first, int64_t *last) {
    sqlite3_stmt *s = q->stmt[Q_STEP_RANGE];
    sqlite3_bind_int64(s, 1, metric_id);
    int rc = sqlite3_step(s), have = 0;
    if (rc == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) {
        *first = sqlite3_column_int64(s, 0);
        *last = sqlite3_column_int64(s, 1);
        have = 1;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW) return -1;
    int64_t bf = 0, bl = 0;
    int r1 = block_edge(q, metric_id, 0, &bf), r2 = block_edge(q, metric_id, 1, &bl);
    if (r1 < 0 || r2 < 0) return -1;
    if (r1 && (!have || bf < *first)) *first = bf;
    if (r2 && (!have || bl > *last)) *last = bl;
    return have || r1;
}

int query_raw_horizon(struct query *q, int64_t metric_id, int64_t first, int64_t *rolled) {
    sqlite3_stmt *s = q->stmt[Q_ROLLUP_FIRST];
    sqlite3_bind_int64(s, 1, metric_id);
    int rc = sqlite3_step(s), ret = rc == SQLITE_ROW ? 0 : -1;
    if (rc == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) {
        int64_t b = sqlite3_column_int64(s, 0);
        *rolled = b * ROLLUP_LEVEL_SIZE(1);
        ret = b < first / ROLLUP_LEVEL_SIZE(1);
    }
    sqlite3_reset(s);
    return ret;
}

/* The last frame of a metric at or before `step`, raw or in a block, into
 * vals (n values): its step, -1 when there is none, -2 on failure. */
static int64_t frame_at(struct query *q, int64_t metric_id, uint32_t n, int64_t step, float *vals) {
    int64_t found = -1;
    sqlite3_stmt *s = q->stmt[Q_FRAME_AT];
    sqlite3_bind_int64(s, 1, metric_id);
    sqlite3_bind_int64(s, 2, step);
    int rc = sqlite3_step(s), corrupt = 0;
    if (rc == SQLITE_ROW) {
        found = sqlite3_column_int64(s, 0);
        int bytes = sqlite3_column_bytes(s, 1);
        if (frame_check(q, metric_id, found, s)) corrupt = -1;
        else if ((size_t)bytes == (size_t)n * 4) memcpy(vals, sqlite3_column_blob(s, 1), (size_t)n * 4);
        else corrupt = frame_corrupt(q, metric_id, found, bytes, n);
    }
    sqlite3_reset(s);
    if ((rc != SQLITE_ROW && rc != SQLITE_DONE) || corrupt) return -2;
    /* the block holding `step` may start after it: then the one before */
    float *all = malloc((size_t)n * FBLOCK_STEPS * sizeof *all);
    int64_t block;
    uint64_t mask;
    int r = all ? 0 : FBLOCK_ENOMEM;
    fblock_rows_walk(q->rows, metric_id, 0, step < 0 ? -1 : step / FBLOCK_STEPS, 1, n, 0, n);
    for (int tries = 0; !r && tries < 2 && (r = fblock_rows_next(q->rows, &block, &mask, all)) == 1; tries++) {
        r = 0;
        uint32_t nf = fblock_count(mask), f = nf;
        while (f > 0 && fblock_step(block, mask, f - 1) > step) f--;
        if (!f) continue;
        int64_t at = fblock_step(block, mask, f - 1);
        if (at > found) {
            memcpy(vals, all + (size_t)(f - 1) * n, (size_t)n * 4);
            found = at;
        }
        break;
    }
    fblock_rows_end(q->rows);
    free(all);
    if (r < 0) {
        rows_fail(q, metric_id, r);
        return -2;
    }
    return found;
}

int query_frame(struct query *q, int64_t run_id, const char *metric, int has_step, int64_t step, struct strbuf *out,
                char *err, size_t errlen) {
    struct query_runinfo ri;
    int64_t mid;
    int kind, ret;
    float *vals = NULL;
    if (query_db_begin(q, err, errlen)) return QUERY_ERR;
    if ((ret = query_run_get(q, run_id, &ri, err, errlen)) ||
        (ret = query_metric_get(q, run_id, metric, &mid, &kind, err, errlen)))
        goto out;
    int64_t L = kind == 0 ? 1 : ri.layers, H = kind == 2 ? ri.heads : 1;
    if (!(vals = malloc((size_t)(L * H) * sizeof *vals))) {
        snprintf(err, errlen, "out of memory");
        ret = QUERY_ERR;
        goto out;
    }
    int64_t at = frame_at(q, mid, (uint32_t)(L * H), has_step ? step : INT64_MAX, vals);
    if (at >= 0) {
        strbuf_printf(out, "{\"run\":%lld,\"metric\":", (long long)run_id);
        strbuf_json_str(out, metric);
        strbuf_printf(out, ",\"kind\":\"%s\",\"step\":%lld,\"layers\":%lld,\"heads\":%lld,\"values\":",
                      query_kind_name(kind), (long long)at, (long long)L, (long long)H);
        emit_values(out, (const unsigned char *)vals, kind, L, H);
        strbuf_add(out, "}", 1);
        ret = QUERY_OK;
    } else if (at == -1) {
        snprintf(err, errlen, "%s has no frame at or before that step", metric);
        ret = QUERY_NOT_FOUND;
    } else {
        char what[160];
        query_db_what(what, sizeof what, "reading the frame", run_id, metric);
        ret = query_db_fail(q, err, errlen, what);
    }
out:
    free(vals);
    query_db_end(q);
    return ret;
}

int query_frames(struct query *q, int64_t metric_id, uint32_t n, int64_t lo, int64_t hi, query_frame_fn fn, void *ctx,
                 char *err, size_t errlen) {
    /* blocks and raw rows are two statements: one snapshot for both */
    int own = sqlite3_get_autocommit(q->db), failed;
    if (own && query_db_begin(q, err, errlen)) return QUERY_ERR;
    int ret = query_walk(q, metric_id, n, 0, n, lo, hi, fn, ctx, &failed);
    if (failed) query_db_fail(q, err, errlen, "reading frames");
    if (own) query_db_end(q);
    return ret;
}
