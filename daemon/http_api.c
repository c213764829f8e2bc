/* http_api.c: the routes of entropyd's HTTP API (/api/..., /metrics,
 * /healthz): the table that matches a request to its handler, the checks
 * of each route's query parameters, and the handlers, which read through
 * the query pool (query.h), the live stream (stream.h) or the writer (a
 * DELETE). The routes and their parameters are documented in
 * docs/http-api.md. Not here: the checks every request passes before its
 * route is looked up (http_server.c, http_guard.c), the answers' helpers
 * (http.c), the server's lifecycle (http_server.c), the dashboard's files (http_static.c), the
 * figures of /metrics (metrics.c). The contract is in http_int.h. */
#include "http.h"
#include "http_int.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "integrity.h"

#define HTTP_DELETE_WAIT_MS 10000
#define HTTP_MAX_POINTS 100000
#define HTTP_MAX_EVENTS 10000
#define HTTP_MAX_RUNS_PAGE 1000

/* The answer for a query.h return code other than QUERY_OK. */
static enum MHD_Result send_query_error(struct http *h, struct MHD_Connection *c, int rc, const char *err) {
    unsigned st = rc == QUERY_NOT_FOUND ? 404 : rc == QUERY_BAD ? 400 : 500;
    if (st == 500) fprintf(stderr, "entropyd: http: %s\n", err);
    return http_send_error(h, c, st, "%s", err);
}

/* ---- parameters ------------------------------------------------------ */

struct params {
    const char *const *allowed; /* NULL-terminated */
    const char *unknown;        /* the first parameter not allowed */
};

static enum MHD_Result param_check(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    (void)value;
    struct params *p = cls;
    if (strcmp(key, "token") == 0) return MHD_YES;
    for (const char *const *a = p->allowed; *a; a++) {
        size_t n = strlen(*a);
        if (n && (*a)[n - 1] == '*' ? strncmp(*a, key, n - 1) == 0 && key[n - 1] : strcmp(*a, key) == 0)
            return MHD_YES; /* "meta.*": any key with that prefix */
    }
    p->unknown = key;
    return MHD_NO;
}

/* 0 when every query parameter is in allowed; else -1 with *unknown set. */
static int params_ok(struct MHD_Connection *c, const char *const *allowed, const char **unknown) {
    struct params p = {.allowed = allowed};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, param_check, &p);
    *unknown = p.unknown;
    return p.unknown ? -1 : 0;
}

/* Parses a decimal integer in [lo, hi], nothing else in the string. */
static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return -1;
    const char *p = s;
    if (*p == '-') p++;
    if (*p < '0' || *p > '9') return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Index of the non-empty word v in names (NULL-terminated), or -1. */
static int choice(const char *v, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (*names[i] && strcmp(v, names[i]) == 0) return i;
    return -1;
}

/* Reads optional integer parameter name into *out (untouched when absent).
 * Returns 1 if present, 0 if absent, -1 if malformed. */
static int int_param(struct MHD_Connection *c, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return 0;
    return parse_i64(v, lo, hi, out) ? -1 : 1;
}

/* The accepted words of the series choices, indexed by their enum values
 * (enum query_agg, enum query_split; "" for a value that cannot be asked
 * for by name). */
static const char *const agg_names[] = {
    [QUERY_AGG_MEAN] = "mean", [QUERY_AGG_MIN] = "min", [QUERY_AGG_MAX] = "max", NULL};
static const char *const split_names[] = {
    [QUERY_SPLIT_NONE] = "", [QUERY_SPLIT_HEAD] = "head", [QUERY_SPLIT_LAYER] = "layer", NULL};

/* Reads optional parameter name, one of the non-empty words in names.
 * Returns its index, -2 if absent, -1 if not one of them. */
static int choice_param(struct MHD_Connection *c, const char *name, const char *const *names) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return -2;
    return choice(v, names);
}

#define BAD_INT(name, lo, hi) \
    http_send_error(h, c, 400, "parameter %s must be an integer in %lld..%lld", name, (long long)(lo), (long long)(hi))


/* ---- handlers -------------------------------------------------------- */

typedef enum MHD_Result handler_fn(struct http *h, struct MHD_Connection *c, int64_t id);

/* Borrows a read connection; when none can be had, answers 503 and
 * returns NULL with the answer's result in *res. */
static struct query *take_query(struct http *h, struct MHD_Connection *c, enum MHD_Result *res) {
    char err[256];
    struct query *q = query_acquire(h->cfg.pool, err, sizeof err);
    if (!q) {
        fprintf(stderr, "entropyd: http: %s\n", err);
        *res = http_send_error(h, c, 503, "database unavailable: %s", err);
    }
    return q;
}

/* One read of the JSON API: writes its answer into b and returns QUERY_OK,
 * or a QUERY_* code with a message in err. */
typedef int read_fn(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen);

/* The tail of every read handler: borrows a pool connection, runs fn,
 * gives the connection back, and answers 200 with what fn wrote, or fn's
 * error (404, 400, 500; 503 when no connection could be had). */
static enum MHD_Result answer_read(struct http *h, struct MHD_Connection *c, read_fn *fn, const void *arg) {
    enum MHD_Result res;
    struct query *q = take_query(h, c, &res);
    if (!q) return res;
    struct strbuf b = {0};
    char err[256];
    int rc = fn(q, arg, &b, err, sizeof err);
    query_release(h->cfg.pool, q);
    if (rc) {
        strbuf_free(&b);
        return send_query_error(h, c, rc, err);
    }
    return http_send_json(h, c, 200, &b);
}

/* The meta.KEY=VALUE filters of a runs request. */
struct meta_filters {
    struct query_runs_req *req;
    char paths[QUERY_RUNS_MAX_META][96];
    int bad; /* 1: too many; 2: a key that is not a path */
};

static enum MHD_Result meta_collect(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    struct meta_filters *m = cls;
    if (strncmp(key, "meta.", 5) != 0) return MHD_YES;
    const char *k = key + 5;
    size_t n = strlen(k);
    int ok = n > 0 && n < sizeof m->paths[0] - 3 && k[0] != '.' && k[n - 1] != '.' && !strstr(k, "..");
    for (size_t i = 0; ok && i < n; i++)
        ok = (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= '0' && k[i] <= '9') ||
             k[i] == '_' || k[i] == '-' || k[i] == '.';
    if (!ok) {
        m->bad = 2;
        return MHD_NO;
    }
    if (m->req->nmeta == QUERY_RUNS_MAX_META) {
        m->bad = 1;
        return MHD_NO;
    }
    snprintf(m->paths[m->req->nmeta], sizeof m->paths[0], "$.%s", k);
    m->req->meta_path[m->req->nmeta] = m->paths[m->req->nmeta];
    m->req->meta_value[m->req->nmeta++] = value ? value : "";
    return MHD_YES;
}

/* Reads an optional number of seconds; 1 present, 0 absent, -1 malformed. */
static int time_param(struct MHD_Connection *c, const char *name, double *out) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return 0;
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (!*v || *end || errno || !(d > -1e15 && d < 1e15)) return -1;
    *out = d;
    return 1;
}

static int read_runs(struct query *q, const void *req, struct strbuf *b, char *err, size_t errlen) {
    return query_runs_page(q, req, b, err, errlen);
}

/* GET /api/runs: every run as a JSON array (the original answer), or, with
 * any of limit/cursor, one page {runs, next, sort, order, total}. Filters:
 * status, verdict, q (name substring), created_from/created_to, meta.KEY. */
static enum MHD_Result h_runs(struct http *h, struct MHD_Connection *c, int64_t id) {
    (void)id;
    static const char *const statuses[] = {"live", "stale", "finished", "failed", "aborted", NULL};
    static const char *const verdicts[] = {"healthy", "collapsing", "collapsed", "diverged", "stalled", "sharp", NULL};
    static const char *const orders[] = {"asc", "desc", NULL};
    struct query_runs_req req = {0};
    struct meta_filters mf = {.req = &req};
    req.status = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "status");
    if (req.status && choice(req.status, statuses) < 0)
        return http_send_error(h, c, 400, "status must be live, stale, finished, failed or aborted");
    req.verdict = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "verdict");
    if (req.verdict && choice(req.verdict, verdicts) < 0)
        return http_send_error(h, c, 400, "verdict must be healthy, collapsing, collapsed, diverged, stalled or sharp");
    req.search = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q");
    if (req.search && strlen(req.search) > PROTO_MAX_RUN)
        return http_send_error(h, c, 400, "q is longer than a run name");
    if ((req.has_from = time_param(c, "created_from", &req.created_from)) < 0)
        return http_send_error(h, c, 400, "created_from must be Unix seconds");
    if ((req.has_to = time_param(c, "created_to", &req.created_to)) < 0)
        return http_send_error(h, c, 400, "created_to must be Unix seconds");
    const char *sort = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "sort");
    if (sort) {
        req.sort = -1;
        for (int i = 0; i < QUERY_SORT_COUNT; i++)
            if (!strcmp(sort, query_runs_sort_name(i))) req.sort = i;
        if (req.sort < 0)
            return http_send_error(h, c, 400,
                                   "sort must be id, name, created, updated, last_step, last_loss, "
                                   "min_entropy_norm or verdict");
    }
    int o = choice_param(c, "order", orders);
    if (o == -1) return http_send_error(h, c, 400, "order must be asc or desc");
    req.desc = o == 1;
    req.cursor = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    if (req.cursor && strlen(req.cursor) > PROTO_MAX_RUN + 40) return http_send_error(h, c, 400, "cursor too long");
    int lim = int_param(c, "limit", 1, HTTP_MAX_RUNS_PAGE, &req.limit);
    if (lim < 0) return BAD_INT("limit", 1, HTTP_MAX_RUNS_PAGE);
    if (!lim && req.cursor) req.limit = 50;
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, meta_collect, &mf);
    if (mf.bad == 1) return http_send_error(h, c, 400, "at most %d meta.KEY filters", QUERY_RUNS_MAX_META);
    if (mf.bad == 2)
        return http_send_error(h, c, 400, "a meta filter is meta.KEY or meta.KEY.SUBKEY (letters, digits, _ -)");
    return answer_read(h, c, read_runs, &req);
}

struct run_req {
    int64_t id;
    const struct alert_rules *rules;
};

static int read_run(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen) {
    const struct run_req *r = arg;
    return query_run(q, r->id, r->rules, b, err, errlen);
}

static enum MHD_Result h_run(struct http *h, struct MHD_Connection *c, int64_t id) {
    struct run_req r = {id, h->rules};
    return answer_read(h, c, read_run, &r);
}

/* A series; `from` past the metric's last step with no `to` is a request
 * that does not fit the data (400, as from > to is), not an empty answer. */
static int read_series(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen) {
    const struct query_series_req *r = arg;
    struct query_series_range range;
    int rc = query_series(q, r, b, &range, err, errlen);
    if (rc || !r->has_from || r->has_to) return rc;
    /* with no to asked for, the answer's to is the metric's last step */
    if (r->from > range.to) {
        snprintf(err, errlen, "from %lld is past the last step of %s (%lld)", (long long)r->from, r->metric,
                 (long long)range.to);
        return QUERY_BAD;
    }
    return rc;
}

/* Reads the step range and bucket count of a series or timeline request
 * (from, to, points). Returns 0, or -1 once it has answered a bad one
 * (*ret: what to return). */
static int range_params(struct http *h, struct MHD_Connection *c, int *has_from, int64_t *from, int *has_to,
                        int64_t *to, int64_t *points, enum MHD_Result *ret) {
    int p;
    if ((p = int_param(c, "from", 0, INT64_MAX / 2, from)) < 0) *ret = BAD_INT("from", 0, INT64_MAX / 2);
    else if (*has_from = p, (p = int_param(c, "to", 0, INT64_MAX / 2, to)) < 0) *ret = BAD_INT("to", 0, INT64_MAX / 2);
    else if (*has_to = p, int_param(c, "points", 1, HTTP_MAX_POINTS, points) < 0)
        *ret = BAD_INT("points", 1, HTTP_MAX_POINTS);
    else if (*has_from && *has_to && *from > *to) *ret = http_send_error(h, c, 400, "from is after to");
    else return 0;
    return -1;
}

static enum MHD_Result h_series(struct http *h, struct MHD_Connection *c, int64_t id) {
    struct query_series_req r = {.run_id = id, .layer = -1, .head = -1, .points = 1000};
    r.metric = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "metric");
    if (!r.metric || !*r.metric) return http_send_error(h, c, 400, "parameter metric is required");
    int p;
    if (int_param(c, "layer", 0, 1 << 20, &r.layer) < 0) return BAD_INT("layer", 0, 1 << 20);
    if (int_param(c, "head", 0, 1 << 20, &r.head) < 0) return BAD_INT("head", 0, 1 << 20);
    enum MHD_Result bad;
    if (range_params(h, c, &r.has_from, &r.from, &r.has_to, &r.to, &r.points, &bad)) return bad;
    if ((p = choice_param(c, "agg", agg_names)) == -1)
        return http_send_error(h, c, 400, "agg must be mean, min or max");
    if (p >= 0) r.agg = p;
    if ((p = choice_param(c, "split", split_names)) == -1)
        return http_send_error(h, c, 400, "split must be head or layer");
    if (p >= 0) r.split = p;
    return answer_read(h, c, read_series, &r);
}

static int read_timeline(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen) {
    return query_timeline(q, arg, b, err, errlen);
}

static enum MHD_Result h_timeline(struct http *h, struct MHD_Connection *c, int64_t id) {
    struct query_timeline_req r = {.run_id = id, .layer = -1, .points = 300};
    static const char *const rows[] = {"head", "layer", NULL};
    r.metric = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "metric");
    if (!r.metric || !*r.metric) return http_send_error(h, c, 400, "parameter metric is required");
    int p;
    if (int_param(c, "layer", 0, 1 << 20, &r.layer) < 0) return BAD_INT("layer", 0, 1 << 20);
    enum MHD_Result bad;
    if (range_params(h, c, &r.has_from, &r.from, &r.has_to, &r.to, &r.points, &bad)) return bad;
    if ((p = choice_param(c, "rows", rows)) == -1) return http_send_error(h, c, 400, "rows must be head or layer");
    r.fold_layers = p == 1;
    return answer_read(h, c, read_timeline, &r);
}

struct frame_req {
    int64_t run_id;
    const char *metric;
    int has_step;
    int64_t step;
};

static int read_frame(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen) {
    const struct frame_req *r = arg;
    return query_frame(q, r->run_id, r->metric, r->has_step, r->step, b, err, errlen);
}

static enum MHD_Result h_frame(struct http *h, struct MHD_Connection *c, int64_t id) {
    const char *metric = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "metric");
    if (!metric || !*metric) return http_send_error(h, c, 400, "parameter metric is required");
    int64_t step = 0;
    int has = int_param(c, "step", 0, INT64_MAX, &step);
    if (has < 0) return BAD_INT("step", 0, INT64_MAX);
    struct frame_req fr = {id, metric, has, step};
    return answer_read(h, c, read_frame, &fr);
}

struct events_req {
    int64_t run_id, after, before;
    int newest_first;
    int64_t limit;
};

static int read_events(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen) {
    const struct events_req *r = arg;
    return query_events(q, r->run_id, r->after, r->before, r->newest_first, r->limit, b, err, errlen);
}

static enum MHD_Result h_events(struct http *h, struct MHD_Connection *c, int64_t id) {
    static const char *const orders[] = {"asc", "desc", NULL};
    int64_t after = 0, before = 0, limit = 1000;
    int has_after, has_before;
    if ((has_after = int_param(c, "after", 0, INT64_MAX, &after)) < 0) return BAD_INT("after", 0, INT64_MAX);
    if ((has_before = int_param(c, "before", 1, INT64_MAX, &before)) < 0) return BAD_INT("before", 1, INT64_MAX);
    if (int_param(c, "limit", 1, HTTP_MAX_EVENTS, &limit) < 0) return BAD_INT("limit", 1, HTTP_MAX_EVENTS);
    int o = choice_param(c, "order", orders);
    if (o == -1) return http_send_error(h, c, 400, "order must be asc or desc");
    /* before= pages towards older events, newest first; so does order=desc */
    int newest_first = has_before || o == 1;
    if (has_after && newest_first)
        return http_send_error(h, c, 400, "after pages oldest first: not with before or order=desc");
    if (has_before && o == 0) return http_send_error(h, c, 400, "before pages newest first: not with order=asc");
    struct events_req er = {id, after, before, newest_first, limit};
    return answer_read(h, c, read_events, &er);
}

struct alerts_req {
    const char *state;
    int64_t run_id, limit;
};

static int read_alerts(struct query *q, const void *arg, struct strbuf *b, char *err, size_t errlen) {
    const struct alerts_req *r = arg;
    return query_alerts(q, r->state, r->run_id, r->limit, b, err, errlen);
}

/* GET /api/alerts?state=&run=&limit= and GET /api/runs/{id}/alerts?state=&limit= */
static enum MHD_Result alerts_answer(struct http *h, struct MHD_Connection *c, int64_t run_id) {
    int64_t limit = 1000;
    if (int_param(c, "limit", 1, 100000, &limit) < 0) return BAD_INT("limit", 1, 100000);
    const char *state = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state");
    if (state && !*state) state = NULL;
    struct alerts_req ar = {state, run_id, limit};
    return answer_read(h, c, read_alerts, &ar);
}

static enum MHD_Result h_alerts(struct http *h, struct MHD_Connection *c, int64_t id) {
    (void)id;
    int64_t run = 0;
    if (int_param(c, "run", 1, INT64_MAX, &run) < 0) return BAD_INT("run", 1, INT64_MAX);
    return alerts_answer(h, c, run);
}

static enum MHD_Result h_run_alerts(struct http *h, struct MHD_Connection *c, int64_t id) {
    return alerts_answer(h, c, id);
}

/* An export in progress: owned by its response. */
struct export_state {
    struct query_pool *pool;
    struct query *q;
    struct query_export *x;
};

static ssize_t export_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct export_state *e = cls;
    ssize_t n = query_export_read(e->x, buf, max);
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    return n;
}

static void export_free(void *cls) {
    struct export_state *e = cls;
    query_export_end(e->x);
    query_release(e->pool, e->q);
    free(e);
}

static enum MHD_Result h_export(struct http *h, struct MHD_Connection *c, int64_t id) {
    const char *f = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
    int format;
    if (!f || strcmp(f, "csv") == 0) format = QUERY_CSV;
    else if (strcmp(f, "jsonl") == 0) format = QUERY_JSONL;
    else return http_send_error(h, c, 400, "format must be csv or jsonl");
    struct export_state *e = calloc(1, sizeof *e);
    if (!e) return http_send_error(h, c, 500, "out of memory");
    e->pool = h->cfg.pool;
    enum MHD_Result res;
    if (!(e->q = take_query(h, c, &res))) {
        free(e);
        return res;
    }
    char err[256];
    int rc;
    e->x = query_export_begin(e->q, id, format, &rc, err, sizeof err);
    if (!e->x) {
        query_release(e->pool, e->q);
        free(e);
        return send_query_error(h, c, rc, err);
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, export_read, e, export_free);
    if (!r) {
        export_free(e);
        return MHD_NO;
    }
    char disp[96];
    snprintf(disp, sizeof disp, "attachment; filename=\"run-%lld.%s\"", (long long)id,
             format == QUERY_CSV ? "csv" : "jsonl");
    MHD_add_response_header(r, "Content-Type", format == QUERY_CSV ? "text/csv" : "application/x-ndjson");
    MHD_add_response_header(r, "Content-Disposition", disp);
    return http_respond(h, c, 200, r);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = stream_client_read(cls, buf, max);
    return n < 0 ? MHD_CONTENT_READER_END_OF_STREAM : n;
}

static void sse_free(void *cls) { stream_client_close(cls); }

/* For stream_client_watch: 1 once the client's socket (ctx: its fd) has
 * hung up. */
static int sse_gone(void *ctx) {
    struct pollfd p = {.fd = (int)(intptr_t)ctx, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static enum MHD_Result h_stream(struct http *h, struct MHD_Connection *c, int64_t id) {
    (void)id;
    int64_t run = 0;
    if (int_param(c, "run", 1, INT64_MAX, &run) < 0) return BAD_INT("run", 1, INT64_MAX);
    /* ticks=1 [layers=1] [cells=M1,M2]: summaries instead of steps (stream.h) */
    struct stream_sub sub = {0};
    int64_t flag = 0;
    if (int_param(c, "ticks", 0, 1, &flag) < 0) return BAD_INT("ticks", 0, 1);
    sub.ticks = (int)flag;
    flag = 0;
    if (int_param(c, "layers", 0, 1, &flag) < 0) return BAD_INT("layers", 0, 1);
    sub.layers = (int)flag;
    char names[STREAM_MAX_CELLS * (PROTO_MAX_NAME + 1)];
    const char *cells = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cells");
    if (cells && *cells) {
        if (strlen(cells) >= sizeof names)
            return http_send_error(h, c, 400, "cells names at most %d metrics", STREAM_MAX_CELLS);
        memcpy(names, cells, strlen(cells) + 1);
        for (char *p = names, *save = NULL, *tok; (tok = strtok_r(p, ",", &save)); p = NULL) {
            if (sub.ncells == STREAM_MAX_CELLS || strlen(tok) > PROTO_MAX_NAME)
                return http_send_error(h, c, 400, "cells names at most %d metrics", STREAM_MAX_CELLS);
            sub.cells[sub.ncells++] = tok;
        }
    }
    if ((sub.layers || sub.ncells) && !sub.ticks)
        return http_send_error(h, c, 400, "layers and cells come with ticks=1");
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (!last) last = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "last_event_id");
    struct stream_client *sc = stream_client_open(h->cfg.stream, run, last);
    if (!sc) return http_send_error(h, c, 500, "out of memory");
    stream_client_subscribe(sc, &sub); /* the names were checked above */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) stream_client_watch(sc, sse_gone, (void *)(intptr_t)ci->connect_fd);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, sse_read, sc, sse_free);
    if (!r) {
        stream_client_close(sc);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return http_respond(h, c, 200, r);
}

static enum MHD_Result h_delete(struct http *h, struct MHD_Connection *c, int64_t id) {
    enum MHD_Result res;
    struct query *q = take_query(h, c, &res);
    if (!q) return res;
    char status[16], err[256];
    int rc = query_run_status(q, id, status, sizeof status, err, sizeof err);
    query_release(h->cfg.pool, q);
    if (rc) return send_query_error(h, c, rc, err);
    if (strcmp(status, "live") == 0)
        return http_send_error(h, c, 409, "run %lld is live: a trainer is connected to it; delete it once it has ended",
                               (long long)id);
    struct writer_item *it = calloc(1, sizeof *it);
    if (!it) return http_send_error(h, c, 500, "out of memory");
    it->kind = WRITER_DELETE;
    it->run_id = id;
    /* the ticket is taken and submitted under the lock so that tickets
     * reach the writer (and so commit) in order */
    pthread_mutex_lock(&h->mu);
    uint64_t ticket = it->conn = ++h->next_ticket;
    writer_submit(h->cfg.writer, it);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += HTTP_DELETE_WAIT_MS / 1000;
    while (h->done_ticket < ticket)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &dl) == ETIMEDOUT) break;
    int done = h->done_ticket >= ticket;
    pthread_mutex_unlock(&h->mu);
    if (done) { /* committed: but the writer may have rejected the item */
        if (!(q = take_query(h, c, &res))) return res;
        rc = query_run_status(q, id, status, sizeof status, err, sizeof err);
        query_release(h->cfg.pool, q);
        if (rc == QUERY_OK && strcmp(status, "live") == 0)
            return http_send_error(h, c, 409,
                                   "run %lld became live (a trainer resumed it) before it was deleted; it was kept",
                                   (long long)id);
        if (rc == QUERY_OK)
            return http_send_error(h, c, 500, "run %lld could not be deleted (see the daemon's log)", (long long)id);
    }
    struct strbuf b = {0};
    strbuf_printf(&b, done ? "{\"deleted\":%lld}" : "{\"deleting\":%lld}", (long long)id);
    return http_send_json(h, c, done ? 200 : 202, &b);
}

static enum MHD_Result h_healthz(struct http *h, struct MHD_Connection *c, int64_t id) {
    (void)id;
    struct writer_stats ws;
    writer_get_stats(h->cfg.writer, &ws);
    struct strbuf b = {0};
    /* a damaged stored row, once met by a reader or the writer, keeps the
     * daemon unhealthy until a restart: its data is not what was stored
     * (docs/reliability.md, "Damaged storage") */
    uint64_t bad = integrity_errors();
    strbuf_printf(&b, "{\"status\":\"%s\",\"db_failing\":%s,\"integrity_errors\":%llu",
                  ws.wal_lost  ? "wal_lost"
                  : ws.failing ? "failing"
                  : bad        ? "db_corrupt"
                               : "ok",
                  ws.failing ? "true" : "false", (unsigned long long)bad);
    if (ws.wal_lost) { /* for good: docs/reliability.md, "A lost WAL" */
        strbuf_puts(&b, ",\"reason\":");
        strbuf_json_str(&b, ws.wal_lost_why);
    }
    strbuf_puts(&b, "}");
    return http_send_json(h, c, ws.failing || bad ? 503 : 200, &b);
}

/* GET /metrics: this server's figures, then every other module's (the
 * configured writer, metrics.c's metrics_write). */
static enum MHD_Result h_metrics(struct http *h, struct MHD_Connection *c, int64_t id) {
    (void)id;
    struct strbuf b = {0};
    http_metrics(h, &b);
    char err[256];
    int st = h->cfg.metrics ? h->cfg.metrics(h->cfg.metrics_ctx, &b, err, sizeof err) : 0;
    if (st) {
        strbuf_free(&b);
        fprintf(stderr, "entropyd: http: %s\n", err);
        return http_send_error(h, c, (unsigned)st, st == 503 ? "database unavailable: %s" : "%s", err);
    }
    return http_send_buf(h, c, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
}

/* ---- routing --------------------------------------------------------- */

/* Routes under /api (and /metrics, /healthz). path has "{id}" where a run
 * id goes; params lists the query parameters the route accepts. */
struct route {
    const char *method;
    const char *path;
    handler_fn *fn;
    int auth;
    const char *const *params;
};

static const char *const p_none[] = {NULL};
static const char *const p_runs[] = {"status", "verdict", "q",      "created_from", "created_to", "sort",
                                     "order",  "limit",   "cursor", "meta.*",       NULL};
static const char *const p_series[] = {"metric", "layer", "head", "from", "to", "points", "agg", "split", NULL};
static const char *const p_frame[] = {"metric", "step", NULL};
static const char *const p_timeline[] = {"metric", "layer", "rows", "from", "to", "points", NULL};
static const char *const p_events[] = {"after", "before", "order", "limit", NULL};
static const char *const p_export[] = {"format", NULL};
static const char *const p_stream[] = {"run", "last_event_id", "ticks", "layers", "cells", NULL};
static const char *const p_alerts[] = {"state", "run", "limit", NULL};
static const char *const p_run_alerts[] = {"state", "limit", NULL};

static const struct route routes[] = {
    {"GET", "/api/runs", h_runs, 1, p_runs},
    {"GET", "/api/runs/{id}", h_run, 1, p_none},
    {"DELETE", "/api/runs/{id}", h_delete, 1, p_none},
    {"GET", "/api/runs/{id}/series", h_series, 1, p_series},
    {"GET", "/api/runs/{id}/frame", h_frame, 1, p_frame},
    {"GET", "/api/runs/{id}/timeline", h_timeline, 1, p_timeline},
    {"GET", "/api/runs/{id}/events", h_events, 1, p_events},
    {"GET", "/api/runs/{id}/export", h_export, 1, p_export},
    {"GET", "/api/stream", h_stream, 1, p_stream},
    {"GET", "/api/alerts", h_alerts, 1, p_alerts},
    {"GET", "/api/runs/{id}/alerts", h_run_alerts, 1, p_run_alerts},
    {"GET", "/metrics", h_metrics, 1, p_none},
    {"GET", "/healthz", h_healthz, 0, p_none},
    {NULL, NULL, NULL, 0, NULL}, /* not found */
};

/* Matches url against a route path. Returns 1 on a match (with the id),
 * 2 on a match by name ("{id}" given as by-name/NAME: the name, one path
 * segment, into name), 0 on none, -1 when the shape matches but the id is
 * not a run id. */
static int match(const char *pattern, const char *url, int64_t *id, char *name, size_t namecap) {
    const char *brace = strstr(pattern, "{id}");
    if (!brace) return strcmp(pattern, url) == 0;
    size_t pre = (size_t)(brace - pattern);
    if (strncmp(pattern, url, pre) != 0) return 0;
    const char *seg = url + pre;
    int by_name = strncmp(seg, "by-name/", 8) == 0;
    if (by_name) seg += 8;
    const char *end = strchr(seg, '/');
    size_t n = end ? (size_t)(end - seg) : strlen(seg);
    if (n == 0 || strcmp(brace + 4, end ? end : "") != 0) return by_name && n == 0 && !end ? -1 : 0;
    if (by_name) {
        if (n >= namecap) return -1;
        memcpy(name, seg, n);
        name[n] = 0;
        return 2;
    }
    char tmp[32];
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, seg, n);
    tmp[n] = 0;
    return parse_i64(tmp, 1, INT64_MAX, id) ? -1 : 1;
}

/* The id of the run named name: 0 with the answer in *res when there is
 * none (404) or the database is unavailable (503). */
static int64_t id_by_name(struct http *h, struct MHD_Connection *c, const char *name, enum MHD_Result *res) {
    struct query *q = take_query(h, c, res);
    if (!q) return 0;
    int64_t id = query_run_id(q, name);
    query_release(h->cfg.pool, q);
    if (!id) *res = http_send_error(h, c, 404, "no run named \"%s\"", name);
    return id;
}

/* Looks url up in the routes and answers it: 401 where a route needs the
 * token and the request lacks it, 400 for a bad run id or an unknown
 * parameter, 405 for a path without the method, 404 for no route. */
enum MHD_Result http_api_answer(struct http *h, struct MHD_Connection *c, const char *url, const char *method) {
    int path_matched = 0;
    for (const struct route *rt = routes; rt->path; rt++) {
        int64_t id = 0;
        char name[PROTO_MAX_RUN + 1];
        int m = match(rt->path, url, &id, name, sizeof name);
        if (m == 0) continue;
        int auth = rt->auth ? http_authorized(h, c) : 1;
        if (auth != 1) return http_deny(h, c, auth);
        if (m < 0) return http_send_error(h, c, 400, "a run is a positive integer id or by-name/NAME");
        path_matched = 1;
        int ok = strcmp(rt->method, method) == 0 || (strcmp(rt->method, "GET") == 0 && strcmp(method, "HEAD") == 0);
        if (!ok) continue;
        const char *unknown;
        if (params_ok(c, rt->params, &unknown)) return http_send_error(h, c, 400, "unknown parameter %s", unknown);
        if (m == 2) {
            enum MHD_Result res;
            if (!(id = id_by_name(h, c, name, &res))) return res;
        }
        return rt->fn(h, c, id);
    }
    if (path_matched) return http_send_error(h, c, 405, "method %s not allowed on %s", method, url);
    int auth = http_authorized(h, c);
    if (auth != 1) return http_deny(h, c, auth);
    return http_send_error(h, c, 404, "no such endpoint: %s", url);
}
