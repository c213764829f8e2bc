/* http.c: the routes and handlers of entropyd's HTTP API, and the answers
 * they send. The contract is in http.h, the routes and their parameters in
 * docs/http-api.md. Not here: the guards a request passes first
 * (http_guard.c), the dashboard's files (http_static.c), the figures of
 * /metrics (metrics.c).
 *
 * Request flow (libmicrohttpd): the access handler is called once with the
 * headers (we allocate the request state into *req_cls), then with each
 * piece of a body (we refuse bodies), then once more to answer. The state
 * is freed in the completion callback; streamed answers (export, SSE) own
 * their own state, freed by the response's free callback. */
#include "http_int.h"
#include "alert_rules.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "integrity.h"
#include "net.h"
#include "now.h"

#define HTTP_DELETE_WAIT_MS 10000
#define HTTP_MAX_POINTS 100000
#define HTTP_MAX_EVENTS 10000
#define HTTP_MAX_RUNS_PAGE 1000

/* Commit latency histogram bounds, seconds. */
static const double hist_le[HTTP_HIST_N] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define HIST_N HTTP_HIST_N

/* ---- responses ------------------------------------------------------- */

enum MHD_Result http_respond(struct http *h, struct MHD_Connection *c, unsigned status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    pthread_mutex_lock(&h->mu);
    if (status / 100 < 6) h->responses[status / 100]++;
    pthread_mutex_unlock(&h->mu);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Answers with the buffer's text (taken over and freed). */
enum MHD_Result http_send_buf(struct http *h, struct MHD_Connection *c, unsigned status, const char *ctype,
                              struct strbuf *b) {
    if (b->failed) {
        strbuf_free(b);
        static const char oom[] = "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        if (r) MHD_add_response_header(r, "Content-Type", "application/json");
        return http_respond(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR, r);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(b->len, b->p ? b->p : (void *)"",
                                                             b->p ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        strbuf_free(b);
        return MHD_NO;
    }
    memset(b, 0, sizeof *b);
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    return http_respond(h, c, status, r);
}

enum MHD_Result http_send_json(struct http *h, struct MHD_Connection *c, unsigned status, struct strbuf *b) {
    return http_send_buf(h, c, status, "application/json", b);
}

static const char *error_code(unsigned status) {
    switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 403: return "forbidden";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 409: return "conflict";
    case 413: return "payload_too_large";
    case 503: return "unavailable";
    default: return status >= 500 ? "internal" : "error";
    }
}

enum MHD_Result http_send_error(struct http *h, struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct strbuf b = {0};
    strbuf_printf(&b, "{\"error\":{\"code\":\"%s\",\"message\":", error_code(status));
    strbuf_json_str(&b, msg);
    strbuf_puts(&b, "}}");
    if (status == 401) {
        struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            strbuf_free(&b);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"entropyd\"");
        return http_respond(h, c, status, r);
    }
    return http_send_json(h, c, status, &b);
}

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

/* The HTTP server's own figures: commit latency (from the writer's hook),
 * connection slots, responses by status class. */
void http_metrics(struct http *h, struct strbuf *b) {
    pthread_mutex_lock(&h->mu);
    uint64_t hist[HIST_N + 1], cnt = h->hist_count, resp[6];
    double sum = h->hist_sum;
    memcpy(hist, h->hist, sizeof hist);
    memcpy(resp, h->responses, sizeof resp);
    pthread_mutex_unlock(&h->mu);
    strbuf_prom_head(b, "entropyd_commit_seconds", "histogram", "Time to commit one writer transaction.");
    uint64_t acc = 0;
    for (size_t i = 0; i < HIST_N; i++) {
        acc += hist[i];
        strbuf_printf(b, "entropyd_commit_seconds_bucket{le=\"%g\"} %llu\n", hist_le[i], (unsigned long long)acc);
    }
    strbuf_printf(b, "entropyd_commit_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cnt);
    strbuf_printf(b, "entropyd_commit_seconds_sum %.9g\nentropyd_commit_seconds_count %llu\n", sum,
                  (unsigned long long)cnt);
    strbuf_prom(b, "entropyd_http_connections_evicted_total", "counter",
                "Idle HTTP connections closed to make room for a newcomer (every slot was taken).",
                (double)http_slots_evicted(h->slots));
    strbuf_prom(b, "entropyd_http_connections_timed_out_total", "counter",
                "HTTP connections closed for sending no request (or no complete headers) in --http-timeout-s.",
                (double)http_slots_timed_out(h->slots));
    strbuf_prom(
        b, "entropyd_http_connections_reserved_total", "counter",
        "HTTP connections admitted into a slot reserved for /healthz and /metrics (every other slot served a request).",
        (double)http_slots_reserved_total(h->slots));
    strbuf_prom_head(b, "entropyd_http_responses_total", "counter", "HTTP responses by status class.");
    for (int k = 2; k <= 5; k++)
        strbuf_printf(b, "entropyd_http_responses_total{class=\"%dxx\"} %llu\n", k, (unsigned long long)resp[k]);
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
    (void)version;
    (void)upload_data;
    struct http *h = cls;
    struct req *r = *req_cls;
    if (!r) { /* http_on_uri found no memory */
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *req_cls = r;
    }
    if (!r->seen) { /* the first call: headers only */
        r->seen = 1;
        http_slots_busy(h->slots, c); /* a request in progress: its slot is not pushed out */
        return MHD_YES;
    }
    if (*upload_data_size) { /* bodies are refused; read and drop, answer at the end */
        r->had_body = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int is_api = strncmp(url, "/api/", 5) == 0 || strcmp(url, "/api") == 0 || strcmp(url, "/metrics") == 0 ||
                 strcmp(url, "/healthz") == 0;
    if (r->had_body) return http_send_error(h, c, 413, "request bodies are not accepted");
    /* a reserved slot (http_slots.h) is a health check's, not a newcomer's */
    if (http_slots_reserved(c) && strcmp(url, "/healthz") != 0 && strcmp(url, "/metrics") != 0)
        return http_send_error(h, c, 503,
                               "every HTTP connection slot serves a request (--http-max-conns): "
                               "only /healthz and /metrics are answered now");
    if (!http_host_allowed(h, c))
        return http_send_error(h, c, 403,
                               "Host %.200s is not this daemon's: use its address or localhost, or start it "
                               "with --allow-host NAME",
                               MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST));
    if (r->bad_query) return http_send_error(h, c, 400, "%s", r->bad_query);
    if (!is_get && !(h->token && http_authorized(h, c) == 1) && !http_same_origin(c))
        return http_send_error(h, c, 403,
                               "a %s from another site's page: only the daemon's own pages (or a request with "
                               "the token) may change data",
                               method);
    if (!is_api) {
        if (!is_get) return http_send_error(h, c, 405, "method %s not allowed here", method);
        return http_static(h, c, url);
    }
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

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode toe) {
    struct http *h = cls;
    (void)toe;
    http_slots_idle(h->slots, c);
    free(*req_cls);
    *req_cls = NULL;
}

/* ---- lifecycle ------------------------------------------------------- */

static int resolve(const char *listen, struct sockaddr_storage *ss, socklen_t *len, char *err, size_t errlen) {
    char h[256], port_text[8];
    int port;
    if (net_split_hostport(listen, h, sizeof h, &port)) {
        snprintf(err, errlen, "--http wants HOST:PORT (port 0..65535), got \"%s\"", listen);
        return -1;
    }
    snprintf(port_text, sizeof port_text, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    int rc = getaddrinfo(h, port_text, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "--http: cannot resolve \"%s\": %s", h, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

struct http *http_create(const struct http_config *cfg, char *err, size_t errlen) {
    struct http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->cfg = *cfg;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg->token && *cfg->token && !(h->token = strdup(cfg->token))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!(h->rules = alert_rules_load(cfg->rules_path, err, errlen))) goto fail;
    if (cfg->web_root) {
        char real[PATH_MAX];
        if (!realpath(cfg->web_root, real)) {
            snprintf(err, errlen, "--web-root %s: %s", cfg->web_root, strerror(errno));
            goto fail;
        }
        if (!(h->web_root = strdup(real))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(cfg->listen ? cfg->listen : "127.0.0.1:8080", &ss, &sl, err, errlen)) goto fail;
    http_guard_listen(h, cfg->listen ? cfg->listen : "127.0.0.1:8080");
    int max_conns = cfg->max_conns > 0 ? cfg->max_conns : 512;
    int per_ip = cfg->max_conns_per_ip > 0 ? cfg->max_conns_per_ip : max_conns / 4 < 8 ? 8 : max_conns / 4;
    int timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 60;
    if (!(h->slots = http_slots_create((unsigned)max_conns, timeout_s * 1e3))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* the port argument only names the port in libmicrohttpd's messages:
     * the address given with MHD_OPTION_SOCK_ADDR is what is bound */
    uint16_t port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    h->d = MHD_start_daemon(flags, port, http_slots_admit, h->slots, on_request, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss,
                            /* max_conns are held; the spare ones admit newcomers
                             * while the idle connections they pushed out close */
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conns + HTTP_SLOTS_SPARE + HTTP_SLOTS_RESERVED,
                            MHD_OPTION_NOTIFY_CONNECTION, http_slots_notify, h->slots,
                            /* a client that stops reading (an export, a stream) is
                             * closed after this long without progress; one that
                             * sends no request this long, by http_tick */
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                            (size_t)(128 * 1024), MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_URI_LOG_CALLBACK, http_on_uri, h,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_ip, MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "cannot serve HTTP on %s (address in use?)",
                 cfg->listen ? cfg->listen : "127.0.0.1:8080");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    return h;
fail:
    http_destroy(h);
    return NULL;
}

int http_port(const struct http *h) { return h->port; }

void http_tick(struct http *h) { http_slots_sweep(h->slots, now_mono_ms()); }

void http_on_commit(struct http *h, const struct writer_item *items, double commit_ms) {
    double s = commit_ms / 1e3;
    size_t i = 0;
    while (i < HIST_N && s > hist_le[i]) i++;
    pthread_mutex_lock(&h->mu);
    h->hist[i]++;
    h->hist_sum += s;
    h->hist_count++;
    int woke = 0;
    for (const struct writer_item *it = items; it; it = it->next)
        if (it->kind == WRITER_DELETE && it->conn > h->done_ticket) {
            h->done_ticket = it->conn;
            woke = 1;
        }
    if (woke) pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

void http_destroy(struct http *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    http_slots_destroy(h->slots);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h->token);
    free(h->web_root);
    alert_rules_free(h->rules);
    free(h);
}
