/* query_export.c: the export of every stored value of a run, chunk by
 * chunk (query_export_* in query.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "query_db.h"
#include "store.h"

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
    int state; /* 0: header, 1: next frame, 2: values of the frame, 3: done */
    struct export_metric *metrics;
    uint32_t nmetrics, mi; /* the metrics of the run, the one being read */
    int64_t after;         /* the chunk after this step comes next (INT64_MIN at a metric's start) */
    /* the chunk: cn frames of n values each, ci the next to emit */
    int64_t *steps;
    double *times;
    float *data;
    uint32_t cn, ci, ccap;
    char name[PROTO_MAX_NAME + 1];
    int kind;
    int64_t step;
    double time;
    const float *vals; /* the current frame, in the chunk */
    uint32_t n, i;     /* values in the frame, next to emit */
    char piece[512];   /* the text being handed out */
    size_t plen, poff;
};

static uint32_t metric_values(const struct query_export *x, int kind) {
    return kind == 0 ? 1 : kind == 1 ? (uint32_t)x->L : (uint32_t)(x->L * x->H);
}

struct query_export *query_export_begin(struct query *q, int64_t run_id, int format, int *rc, char *err,
                                        size_t errlen) {
    struct query_export *x = calloc(1, sizeof *x);
    struct query_runinfo ri;
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
    if (query_db_begin(q, err, errlen)) goto fail;
    if ((*rc = query_run_get(q, run_id, &ri, err, errlen))) goto fail;
    *rc = QUERY_ERR;
    x->L = ri.layers;
    x->H = ri.heads;
    if (sqlite3_prepare_v2(q->db, "SELECT id, name, kind FROM metrics WHERE run_id = ?1 ORDER BY id", -1, &s, NULL) !=
        SQLITE_OK) {
        query_db_fail(q, err, errlen, "starting the export");
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
        query_db_fail(q, err, errlen, "starting the export");
        goto fail;
    }
    sqlite3_finalize(s);
    query_db_end(q);
    *rc = QUERY_OK;
    return x;
fail:
    sqlite3_finalize(s);
    query_export_end(x);
    return NULL;
}

/* One frame into the chunk (a query_walk callback); stops it when full. */
struct chunk_fill {
    struct query_export *x;
    sqlite3_stmt *time; /* the step's time */
    uint32_t want;
};

static int chunk_add(void *ctx, int64_t step, const float *v, uint32_t n) {
    struct chunk_fill *cf = ctx;
    struct query_export *x = cf->x;
    sqlite3_bind_int64(cf->time, 2, step);
    int rc = sqlite3_step(cf->time);
    x->times[x->cn] = rc == SQLITE_ROW ? sqlite3_column_double(cf->time, 0) : 0; /* as a LEFT JOIN read it */
    sqlite3_reset(cf->time);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return QUERY_ERR;
    x->steps[x->cn] = step;
    memcpy(x->data + (size_t)x->cn * n, v, (size_t)n * 4);
    x->after = step;
    return ++x->cn == cf->want;
}

/* Reads the next chunk of the current metric's frames, in its own read
 * transaction. Returns the frames read (0: the metric is done), -1 on
 * error. */
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
    struct chunk_fill cf = {.x = x, .want = want};
    int ret = -1, failed;
    char err[256];
    if (query_db_begin(x->q, err, sizeof err)) return -1;
    if (sqlite3_prepare_v2(x->q->db, "SELECT time FROM steps WHERE run_id = ?1 AND step = ?2", -1, &cf.time, NULL) !=
        SQLITE_OK)
        goto out;
    sqlite3_bind_int64(cf.time, 1, x->run_id);
    x->cn = x->ci = 0;
    int r =
        query_walk(x->q, m->id, n, 0, n, x->after == INT64_MIN ? 0 : x->after + 1, INT64_MAX, chunk_add, &cf, &failed);
    if (!failed && r >= 0) ret = (int)x->cn;
    else if (failed) {
        /* the answer's status is sent: the stream ends with an error
         * (a broken chunked body), and the log says why */
        char what[160];
        query_db_what(what, sizeof what, "exporting", x->run_id, m->name);
        query_db_fail(x->q, err, sizeof err, what);
        fprintf(stderr, "entropyd: export stopped: %s\n", err);
    }
out:
    sqlite3_finalize(cf.time);
    query_db_end(x->q);
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
                                   query_kind_name(x->kind), (long long)x->step, x->time, lh, num);
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
                x->plen = (size_t)snprintf(
                    x->piece, sizeof x->piece,
                    "{\"metric\":\"%s\",\"kind\":\"%s\",\"step\":%lld,\"time\":%.17g,\"values\":", x->name,
                    query_kind_name(x->kind), (long long)x->step, x->time);
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
    query_db_end(x->q);
    free(x->metrics);
    free(x->steps);
    free(x->times);
    free(x->data);
    free(x);
}
