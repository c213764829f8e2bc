/* query_db.h: what the query families (query.c, query_series.c,
 * query_frames.c, query_timeline.c, query_export.c, query_remote.c) share
 * inside the query module: a read connection with its prepared statements,
 * its read transactions, and the lookups every family starts with. Only
 * the query module's files include it (remote_write.c reads through
 * query_remote.c's functions in query.h): query.h is the module's
 * contract. */
#ifndef QUERY_DB_H
#define QUERY_DB_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "fblock.h"
#include "fblock_rows.h"
#include "query.h"

/* The statements every connection prepares once (persistent) at open;
 * query_remote.c's are prepared at their first use, into remote[]. */
enum {
    Q_RUN,          /* layers, heads, status of a run */
    Q_METRIC,       /* id, kind of a run's metric */
    Q_STEP_RANGE,   /* min, max step of a metric's raw frames */
    Q_ROLLUPS,      /* block, nframes, data of a level's block range, one chunk */
    Q_TOTALS,       /* block, nframes, total of a level's block range (a metric of several chunks) */
    Q_FRAMES,       /* step, data of a step range */
    Q_FRAME_AT,     /* the last raw frame <= step */
    Q_ROLLUP_FIRST, /* a metric's first level-1 rollup block */
    Q_COUNT
};

#define QUERY_REMOTE_STMTS 5

/* One read-only connection; a thread uses it between query_acquire and
 * query_release (the pool, query_db.c). */
struct query {
    sqlite3 *db;
    sqlite3_stmt *stmt[Q_COUNT];
    sqlite3_stmt *remote[QUERY_REMOTE_STMTS]; /* query_remote.c's, NULL until used */
    struct fblock_codec *codec;               /* decodes blocks (fblock.h) */
    struct fblock_rows *rows;                 /* reads sealed blocks' rows (fblock_rows.h), with codec */
    char fault[160];                          /* why a read failed when SQLite did not (a stored row of the
                                    wrong size): query_db_fail reports it, then clears it */
    struct query *next;
};

/* Formats "database error <what>: <sqlite message>" into err (or, when
 * query_db_corrupt noted one, "corrupt database <what>: <the fault>");
 * returns QUERY_ERR. A fault, or SQLite's SQLITE_CORRUPT, counts as an
 * integrity error (integrity_note: /metrics, /healthz). */
int query_db_fail(struct query *q, char *err, size_t errlen, const char *what);
/* "<doing> of run <id>, metric \"<name>\"" into what: query_db_fail's
 * `what` for a read of one metric, so that its error names the run and
 * the metric (the fault names the steps). */
void query_db_what(char *what, size_t len, const char *doing, int64_t run_id, const char *metric);
/* Notes that a stored row is corrupt (printf-style message, e.g. a frame
 * whose size does not match its metric's shape) for query_db_fail to
 * report; returns -1. A read never skips such a row silently. */
int query_db_corrupt(struct query *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Starts a read transaction (one committed state for what follows). */
int query_db_begin(struct query *q, char *err, size_t errlen);
/* Ends it if one is open. */
void query_db_end(struct query *q);

/* "scalar", "layer" or "head" for a metric kind 0, 1, 2. */
const char *query_kind_name(int kind);

struct query_runinfo {
    int64_t layers, heads;
    char status[16];
};

/* The run's shape and status; QUERY_NOT_FOUND with a message if none. */
int query_run_get(struct query *q, int64_t id, struct query_runinfo *ri, char *err, size_t errlen);
/* A run's metric id and kind by name; QUERY_NOT_FOUND with a message if none. */
int query_metric_get(struct query *q, int64_t run_id, const char *name, int64_t *id, int *kind, char *err,
                     size_t errlen);

/* ---- a metric's frames, raw or in sealed blocks (query_frames.c) ---- */

/* Calls fn(ctx, step, vals, n) for every frame of metric_id (n values
 * each) with lo <= step <= hi, in step order, wherever it is stored; only
 * cells [c0, c1) of vals are valid (the others are not decoded). In the
 * caller's read transaction. Returns 0, fn's first nonzero return, or
 * QUERY_ERR with *failed set (the database failed, a block did not
 * decode, or out of memory). */
int query_walk(struct query *q, int64_t metric_id, uint32_t n, uint32_t c0, uint32_t c1, int64_t lo, int64_t hi,
               query_frame_fn fn, void *ctx, int *failed);

/* The first and last stored step of a metric: 1, or 0 when it has no
 * frame, -1 on a database error. */
int query_step_range(struct query *q, int64_t metric_id, int64_t *first, int64_t *last);

/* Where a metric's raw frames begin when the steps before were dropped by
 * raw retention (--retain-raw) and only their rollups are left: sets
 * *rolled to the first step of its first level-1 rollup (a multiple of
 * 64) and returns 1 when that block lies wholly before `first` (the first
 * raw step, query_step_range), 0 when every rolled-up step has its raw
 * frame, -1 on a database error. */
int query_raw_horizon(struct query *q, int64_t metric_id, int64_t first, int64_t *rolled);

/* ---- a series request's buckets as a grid (query_series.c) ---- */

/* The buckets query_series would answer for a request, with only each
 * series' minimum kept: what the collapse timeline (query_timeline.c)
 * draws. Owned by the grid; query_grid_free releases them. */
struct query_grid {
    int kind;         /* the metric's kind: 1 layer, 2 head (0 scalar) */
    int64_t L, H;     /* its shape (1 where it has no such axis) */
    int64_t from, to; /* the range asked for, as query_series answers it */
    int64_t width, resolution, raw_from;
    int64_t nb;            /* buckets listed (those holding a frame) */
    int64_t *step, *end;   /* nb each: first and last step of each, clipped to the range */
    uint32_t ngroups;      /* series, layer-major */
    int64_t *layer, *head; /* ngroups each; head -1 for a series of a whole layer */
    float *min;            /* ngroups x nb, series-major; NaN where a bucket held no finite value */
};

/* Fills g for req as query_series answers it (same checks, same return
 * codes), in the caller's read transaction (query_db_begin). On failure g
 * holds nothing. */
int query_series_grid(struct query *q, const struct query_series_req *req, struct query_grid *g, char *err,
                      size_t errlen);
/* Frees what g holds (a zeroed or failed grid too). */
void query_grid_free(struct query_grid *g);

#endif
