/* query.h: the read side of the database, for the HTTP API.
 *
 * A pool of read-only SQLite connections (WAL lets them read beside the
 * writer thread without blocking it). A request thread takes one connection
 * with query_acquire(), runs queries on it, and gives it back with
 * query_release(); a connection is used by one thread at a time. Every
 * query runs inside its own read transaction, so what it reads is one
 * committed state (the rollups agree with the frames).
 *
 * Queries write their answer as JSON (or Prometheus text) into a growable
 * struct strbuf (strbuf.h). Nothing here builds SQL from request text: every value is a
 * bound parameter.
 *
 * Return codes: QUERY_OK, or one of the negative codes below with a one-line
 * message in the caller's err buffer. This module is not the HTTP layer: it
 * knows no status codes, only what went wrong. */
#ifndef QUERY_H
#define QUERY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"
#include "strbuf.h"

enum query_rc {
    QUERY_OK = 0,
    QUERY_ERR = -1,       /* the database failed (or out of memory) */
    QUERY_NOT_FOUND = -2, /* no such run or metric */
    QUERY_BAD = -3,       /* the request does not fit the data (layer out of range...) */
};


struct query_pool;
struct query;

/* Opens a pool over the database at path (which must exist: the daemon's
 * store creates it first). Connections open lazily; at most `keep` idle
 * ones are kept. Returns NULL with a message on failure. */
struct query_pool *query_pool_open(const char *path, int keep, char *err, size_t errlen);
/* Closes every idle connection and frees the pool. Every acquired
 * connection must have been released. Accepts NULL. */
void query_pool_close(struct query_pool *p);

/* Takes an idle connection or opens one. NULL with a message on failure. */
struct query *query_acquire(struct query_pool *p, char *err, size_t errlen);
/* Gives a connection back (accepts NULL). */
void query_release(struct query_pool *p, struct query *q);

/* Sort keys of the runs list (query_runs_page). */
enum query_runs_sort {
    QUERY_SORT_ID = 0,
    QUERY_SORT_NAME,
    QUERY_SORT_CREATED,
    QUERY_SORT_UPDATED,
    QUERY_SORT_LAST_STEP,
    QUERY_SORT_LAST_LOSS,
    QUERY_SORT_MIN_ENTROPY,
    QUERY_SORT_VERDICT,
    QUERY_SORT_COUNT
};
/* The request word of a sort key ("id", "name", "created", "updated",
 * "last_step", "last_loss", "min_entropy_norm", "verdict"), NULL if none. */
const char *query_runs_sort_name(int sort);

#define QUERY_RUNS_MAX_META 8

/* A runs list request. Every string is borrowed and bound as a parameter. */
struct query_runs_req {
    const char *status;   /* NULL: any */
    const char *verdict;  /* NULL: any ("healthy" also matches runs without a summary) */
    const char *search;   /* case-insensitive substring of the name; NULL: any */
    int has_from, has_to; /* created time range, Unix seconds, inclusive */
    double created_from, created_to;
    int nmeta;                                  /* meta filters: json_extract(meta, path) as text == value */
    const char *meta_path[QUERY_RUNS_MAX_META]; /* "$.reparam", "$.model.layers" */
    const char *meta_value[QUERY_RUNS_MAX_META];
    int sort; /* enum query_runs_sort */
    int desc;
    int64_t limit;      /* runs per page; 0: every match as a bare array */
    const char *cursor; /* "next" of the previous page; NULL: the first page */
};

/* GET /api/runs: the runs that match req, each a run object (as
 * query_run's, without metrics) with its verdict and summary, in the order
 * asked (ties by id). With limit 0 the answer is a JSON array of every
 * match (the answer /api/runs always gave); else an object {runs, next,
 * sort, order, total}: at most limit runs, next the cursor of the next page
 * (null on the last), total the number of matches. Pages are keyset
 * cursors (no OFFSET): the next page starts past the last (key, id) seen.
 * QUERY_BAD for a cursor this daemon did not give out for this sort. */
int query_runs_page(struct query *q, const struct query_runs_req *req, struct strbuf *out, char *err, size_t errlen);

/* GET /api/runs/{id}: the run object plus its metric names by kind, its
 * first step and, once it has metrics, "rules_unavailable": the rules of
 * rules (borrowed; NULL: none listed) that read a metric this run never
 * sent, each {"rule", "missing": ["head metric sigma_qk", ...]}: they are
 * not evaluated for it (docs/alerts.md). QUERY_NOT_FOUND if no such run. */
struct alert_rules;
int query_run(struct query *q, int64_t id, const struct alert_rules *rules, struct strbuf *out, char *err,
              size_t errlen);

/* A run's status ("live", ...) into status (cap bytes). QUERY_NOT_FOUND if
 * no such run. */
int query_run_status(struct query *q, int64_t id, char *status, size_t cap, char *err, size_t errlen);

/* A run's id by name, or 0 if there is none (or on error). */
int64_t query_run_id(struct query *q, const char *name);

enum query_agg { QUERY_AGG_MEAN = 0, QUERY_AGG_MIN, QUERY_AGG_MAX };

/* How a series request splits the selected cells into series. */
enum query_split {
    QUERY_SPLIT_NONE = 0, /* one series pooling every selected cell */
    QUERY_SPLIT_HEAD,     /* head metrics: one series per selected cell (layer, head) */
    QUERY_SPLIT_LAYER,    /* head or layer metrics: one series per layer (its heads pooled) */
};

/* At most this many series x buckets in one answer (a split answer of
 * 1,024 heads at 256 points; larger ones are QUERY_BAD). */
#define QUERY_MAX_SERIES_BUCKETS 262144

/* A series request; layer/head are -1 when left out, has_from/has_to 0
 * when left out (then the metric's first / last step). */
struct query_series_req {
    int64_t run_id;
    const char *metric;
    int64_t layer, head;
    int has_from, has_to;
    int64_t from, to;
    int64_t points; /* buckets at most, >= 1 */
    int agg;        /* enum query_agg, used when a series pools more than one cell */
    int split;      /* enum query_split */
};

/* GET /api/runs/{id}/series: at most `points` buckets over [from, to],
 * each with exact min, max, mean and count of the finite values in it and
 * the count of non-finite ones, read from the rollups where they cover
 * the bucket and from raw frames elsewhere (schema/storage.md). Buckets
 * holding no frame are left out.
 *
 * The selected cells are the metric's cells in layer/head (every layer or
 * head where left out). Without split they pool into one series, answered
 * as {run, metric, kind, layer, head, agg, from, to, width, step, end, min,
 * max, mean, count, nonfinite[, value]}. With a split the answer has the
 * same fields up to `end` plus "split", and instead of the arrays
 * "series": [{layer, head, min, max, mean, count, nonfinite[, value]}], one
 * per layer (QUERY_SPLIT_LAYER; head null) or per selected cell
 * (QUERY_SPLIT_HEAD), layer-major, every series over the same buckets (a
 * bucket is listed when it holds any frame). `value` (the `agg` statistic)
 * is there for series pooling more than one cell. Every series is exactly
 * what the unsplit request for its cells would answer: splitting reads the
 * same frames and rollup rows as one series does.
 *
 * QUERY_NOT_FOUND for an unknown run or metric. QUERY_BAD for a layer/head
 * out of range or given for a metric without that axis; for a split of a
 * scalar, QUERY_SPLIT_HEAD of a layer metric or with a head, QUERY_SPLIT_LAYER
 * with a layer or head; and for more than QUERY_MAX_SERIES_BUCKETS series x
 * buckets.
 *
 * range, when not NULL, receives the answer's from and to (the metric's
 * first / last step where the request left them out; to is 0 for a metric
 * with no step), so that a caller may judge the range without reading the
 * JSON back. Set on QUERY_OK only. */
struct query_series_range {
    int64_t from, to;
};
int query_series(struct query *q, const struct query_series_req *req, struct strbuf *out,
                 struct query_series_range *range, char *err, size_t errlen);

/* A collapse timeline request (query_timeline); layer -1 when left out. */
struct query_timeline_req {
    int64_t run_id;
    const char *metric; /* a head or layer metric */
    int64_t layer;      /* rows=head: only this layer's heads */
    int fold_layers;    /* a row per layer (min over its heads) instead of one per head */
    int has_from, has_to;
    int64_t from, to;
    int64_t points; /* buckets at most, >= 1 */
};

/* GET /api/runs/{id}/timeline: the bucket minimum of a head metric for
 * every head (layer-major; only layer's with `layer`), or with fold_layers
 * for every layer (the minimum over its heads), over the buckets a
 * split series request of the same range and points has (query_series:
 * rollups where they cover a bucket). A layer metric has a row per layer.
 * The answer: {run, metric, kind, rows ("head" | "layer"), layer, layers,
 * heads, from, to, width, resolution, step, end, time, end_time, cells
 * ([[layer, head|null]] per row), lo, hi, min}: time and end_time are the
 * trainer's clock at each bucket's first and last stored step; min is the
 * base64 of rows x buckets little-endian uint16 codes, row-major, code c
 * <= 65534 meaning lo + c * (hi - lo) / 65534 and 65535 no finite value
 * (docs/http-api.md). QUERY_NOT_FOUND for an unknown run or metric;
 * QUERY_BAD for a scalar, a layer out of range, layer with fold_layers or
 * for a layer metric, and past QUERY_MAX_SERIES_BUCKETS rows x buckets. */
int query_timeline(struct query *q, const struct query_timeline_req *req, struct strbuf *out, char *err, size_t errlen);

/* GET /api/runs/{id}/frame: the metric's values at the last step <= step
 * (has_step 0: the latest). QUERY_NOT_FOUND when no run, metric or frame. */
int query_frame(struct query *q, int64_t run_id, const char *metric, int has_step, int64_t step, struct strbuf *out,
                char *err, size_t errlen);

/* Calls fn(ctx, step, vals, n) for every stored frame of metric_id with
 * lo <= step <= hi, in step order; vals holds the frame's n values
 * (float32, NaN where the trainer sent null), borrowed for the call. Runs
 * in the caller's read transaction if one is open (query_db_begin is not
 * public: a reader wanting one snapshot across calls holds q between them
 * inside a transaction of its own), else in one of its own. fn
 * returns 0 to go on; any other value stops the walk and is returned.
 * QUERY_ERR with a message if the database fails. */
typedef int (*query_frame_fn)(void *ctx, int64_t step, const float *vals, uint32_t n);
int query_frames(struct query *q, int64_t metric_id, uint32_t n, int64_t lo, int64_t hi, query_frame_fn fn, void *ctx,
                 char *err, size_t errlen);

/* GET /api/runs/{id}/events: at most limit events. Oldest first from
 * after (id > after), or, with newest_first, newest first from before
 * (id < before; before 0: from the newest). The answer is {run, events,
 * more}: more is true when further events lie past the last one listed in
 * that direction (page on with after= / before= its id). QUERY_NOT_FOUND if
 * no such run. */
int query_events(struct query *q, int64_t run_id, int64_t after, int64_t before, int newest_first, int64_t limit,
                 struct strbuf *out, char *err, size_t errlen);

/* Export of every stored value of a run, produced piece by piece so that
 * nothing larger than a chunk of frames (256 KiB) is held. Each chunk of a
 * metric's frames is read in its own short read transaction, so that a
 * client reading slowly never pins the WAL: the export is therefore not one
 * snapshot. It lists the metrics the run had when it began, each in step
 * order; steps committed meanwhile may appear, and a rollback or delete
 * meanwhile shows from the next chunk on. */
enum query_format { QUERY_CSV = 0, QUERY_JSONL };
struct query_export;
/* Starts an export on q (which stays borrowed until query_export_end).
 * NULL with *rc set (QUERY_NOT_FOUND, QUERY_ERR) and a message on failure. */
struct query_export *query_export_begin(struct query *q, int64_t run_id, int format, int *rc, char *err, size_t errlen);
/* Fills buf with up to max bytes of the export. Returns the bytes written,
 * 0 at the end, -1 if the database failed midway. */
ssize_t query_export_read(struct query_export *x, char *buf, size_t max);
/* Ends the read transaction and frees. Accepts NULL. */
void query_export_end(struct query_export *x);

/* Prometheus text of the latest value of every scalar and layer metric of
 * the exported runs (and of every head metric when heads is set), each
 * run's last step, and entropyd_alerts_firing{alertname, run, severity} 1
 * per firing alert. Exported are the live runs and the others whose last
 * update (their end) is at most keep_s seconds before now. Reads one row
 * of the `latest` table per metric exported: the cost does not grow with
 * the runs' history. */
int query_prometheus(struct query *q, int heads, double now, double keep_s, struct strbuf *out, char *err,
                     size_t errlen);

/* Alerts (docs/alerts.md, "Querying alerts"): a JSON array of alert episodes, newest first,
 * each with its transitions. state is NULL, "firing" or "resolved" (else
 * QUERY_BAD); run_id 0 means every run (else QUERY_NOT_FOUND when no such
 * run); at most limit episodes. */
int query_alerts(struct query *q, const char *state, int64_t run_id, int64_t limit, struct strbuf *out, char *err,
                 size_t errlen);

/* Bytes of the database file (page_count * page_size), -1 on error. */
int64_t query_db_bytes(struct query *q);

/* Bytes of its WAL file (0 when there is none), -1 on error. */
int64_t query_wal_bytes(struct query *q);

/* ---- what the remote-write pusher reads (query_remote.c) --------------
 * Each statement is prepared once per connection, at its first use. The
 * pusher calls these between query_read_begin and query_read_end when
 * what it reads must be one committed state. */

/* Opens a read transaction on q (one committed state for what follows);
 * QUERY_OK or QUERY_ERR with a message. */
int query_read_begin(struct query *q, char *err, size_t errlen);
/* Ends it if one is open. */
void query_read_end(struct query *q);

/* A stored run as the pusher tracks it. */
struct query_rw_run {
    int64_t id;
    int64_t last_step; /* INT64_MIN before any step */
    int64_t branch;    /* its newest rollback (branches.id), 0 if none */
};

/* Every stored run, in id order, into *runs (malloc'd, the caller frees;
 * NULL when none) and *n. QUERY_OK, or QUERY_ERR with a message (*runs
 * NULL, *n 0). One statement, however many runs are stored. */
int query_rw_runs(struct query *q, struct query_rw_run **runs, size_t *n, char *err, size_t errlen);

/* A run's name and shape, and the newest rollback after `branch`. */
struct query_rw_shape {
    char name[PROTO_MAX_RUN + 1];
    int64_t layers, heads;
    int rewinding;      /* a rollback is being written: not to be read now */
    int64_t new_branch; /* the newest branch id > branch, 0 when none */
    int64_t new_from;   /* the lowest first step of those branches */
};
/* 1 with *out filled, 0 when there is no such run, QUERY_ERR with a
 * message. */
int query_rw_shape(struct query *q, int64_t run_id, int64_t branch, struct query_rw_shape *out, char *err,
                   size_t errlen);

/* Calls fn(ctx, id, name, kind) for each metric of the run in id order
 * (name borrowed for the call). QUERY_OK, fn's first nonzero return, or
 * QUERY_ERR with a message. */
typedef int (*query_rw_metric_fn)(void *ctx, int64_t id, const char *name, int kind);
int query_rw_metrics(struct query *q, int64_t run_id, query_rw_metric_fn fn, void *ctx, char *err, size_t errlen);

/* Calls fn(ctx, step, time) for the run's first `limit` steps after
 * `after`, in step order. QUERY_OK, fn's first nonzero return, or
 * QUERY_ERR with a message. */
typedef int (*query_rw_step_fn)(void *ctx, int64_t step, double time);
int query_rw_steps(struct query *q, int64_t run_id, int64_t after, int64_t limit, query_rw_step_fn fn, void *ctx,
                   char *err, size_t errlen);

/* The samples the run holds after step `after`: its steps after it times
 * (1 + its values per step), the one entropyd_run_last_step series
 * included. -1 on a database error. */
int64_t query_rw_samples_after(struct query *q, int64_t run_id, int64_t after);

#endif
