/* remote_write.c: the remote-write pusher (remote_write.h). It reads
 * committed steps, encodes them as a Prometheus WriteRequest by hand (the
 * four messages it needs are a few lines of protobuf wire format; see
 * docs/remote-write.md for why not libprotobuf-c), compresses with snappy
 * and POSTs them with libcurl. What it reads of the database is
 * query_remote.c's (query.h); it keeps the cursor of what was delivered.
 * It is not the /metrics exporter (query.c) and never writes the database. */
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "now.h"
#include "proto.h"
#include "query.h"
#include "remote_write.h"

/* A batch of a run covers at most this many steps (a scalar-only run
 * would otherwise take MAX_SAMPLES steps at once). */
#define RW_MAX_STEPS 4096

/* One run's delivery state, as the cursor file keeps it. */
struct rw_cursor {
    int64_t run_id;
    int64_t step;   /* the last step delivered or rejected; INT64_MIN: none yet */
    int64_t ts;     /* its sample timestamp (ms): every later step's is above it */
    int64_t branch; /* the newest rollback (branches.id) of the run taken into account */
};

struct rw_metric {
    int64_t id;
    char name[PROTO_MAX_NAME + 1];
    int kind;     /* 0 scalar, 1 layer, 2 head */
    uint32_t n;   /* values per frame */
    size_t cell0; /* its first value's index among the run's cells */
};

/* One batch: steps [0, nsteps) of a run and every value stored at them,
 * read in one read transaction. The run's series are its metrics' cells
 * in order, then entropyd_run_last_step (index `cells`). */
struct rw_batch {
    struct rw_cursor *cur;
    char run[PROTO_MAX_RUN + 1];
    int64_t heads;
    struct rw_metric *metrics;
    size_t nmetrics, cells;
    size_t k, nsteps;       /* steps room, steps read */
    int64_t *step, *ts;     /* [k] */
    float *vals;            /* [cells][k] */
    unsigned char *present; /* [nmetrics][k]: the metric has a frame at that step */
};

enum { RW_SENT = 0, RW_REJECTED = 1, RW_STOP = 2 };

struct remote_write {
    char *url, *cursor_path;
    int timeout_ms;
    struct query_pool *pool;
    CURL *curl;
    struct curl_slist *headers;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int dirty; /* a step was committed since the last pass (mu) */
    atomic_int stop;
    struct rw_cursor *cur; /* by run id (the thread's) */
    size_t ncur, capcur;
    struct strbuf pb; /* the request being built */
    char *z;          /* its snappy form */
    size_t zcap;
    double log_at; /* when a rejection was last logged */
    /* What the gauges read beside the thread, which may be stuck in a
     * request for its whole timeout: a copy of the cursor (mu) taken at
     * each change, and the start of the request in flight. */
    struct rw_cursor *pub; /* by run id */
    size_t npub, cappub;
    _Atomic double post_since; /* monotonic ms; 0: no request in flight */
    pthread_mutex_t gauge_mu;  /* one scrape counts the pending samples at a time */
    double pending_at;         /* when they were last counted (monotonic ms, gauge_mu) */
    uint64_t pending;          /* that count (gauge_mu) */
    _Atomic uint64_t sent, rejected, requests, failures, bytes;
    _Atomic double last_ok;
    atomic_int failing;
};

/* ---- the wire format ------------------------------------------------ */

static void pb_varint(struct strbuf *b, uint64_t v) {
    char t[10];
    size_t n = 0;
    do {
        t[n++] = (char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    strbuf_add(b, t, n);
}

static size_t pb_varint_len(uint64_t v) {
    size_t n = 1;
    while (v >>= 7) n++;
    return n;
}

/* A length-delimited field's bytes: tag, length, payload. */
static size_t pb_field_len(size_t n) { return 1 + pb_varint_len(n) + n; }

struct rw_label {
    const char *name, *value;
};

/* One TimeSeries (WriteRequest field 1): Label{1 name, 2 value} x nl,
 * then Sample{1 double value, 2 int64 timestamp} x n. Labels sorted by name
 * (the remote-write spec asks it). */
static void pb_series(struct strbuf *b, const struct rw_label *l, int nl, const int64_t *ts, const double *v,
                      size_t n) {
    size_t len = 0;
    for (int i = 0; i < nl; i++)
        len += pb_field_len(pb_field_len(strlen(l[i].name)) + pb_field_len(strlen(l[i].value)));
    for (size_t i = 0; i < n; i++) len += pb_field_len(1 + 8 + 1 + pb_varint_len((uint64_t)ts[i]));
    strbuf_add(b, "\x0a", 1);
    pb_varint(b, len);
    for (int i = 0; i < nl; i++) {
        size_t ln = strlen(l[i].name), lv = strlen(l[i].value);
        strbuf_add(b, "\x0a", 1);
        pb_varint(b, pb_field_len(ln) + pb_field_len(lv));
        strbuf_add(b, "\x0a", 1);
        pb_varint(b, ln);
        strbuf_add(b, l[i].name, ln);
        strbuf_add(b, "\x12", 1);
        pb_varint(b, lv);
        strbuf_add(b, l[i].value, lv);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char d[8];
        uint64_t bits;
        memcpy(&bits, &v[i], 8);
        for (int j = 0; j < 8; j++) d[j] = (unsigned char)(bits >> (8 * j));
        strbuf_add(b, "\x12", 1);
        pb_varint(b, 1 + 8 + 1 + pb_varint_len((uint64_t)ts[i]));
        strbuf_add(b, "\x09", 1);
        strbuf_add(b, (const char *)d, 8);
        strbuf_add(b, "\x10", 1);
        pb_varint(b, (uint64_t)ts[i]);
    }
}

/* Series s of bt as a TimeSeries with its samples at steps [i, j]; returns
 * the samples written (0: none stored there, nothing written). tsb and vb
 * have room for bt->k samples. */
static size_t encode_series(struct strbuf *b, const struct rw_batch *bt, size_t s, size_t i, size_t j, int64_t *tsb,
                            double *vb) {
    struct rw_label l[5];
    char layer[24], head[24];
    int nl = 0;
    size_t n = 0;
    if (s == bt->cells) {
        l[nl++] = (struct rw_label){"__name__", "entropyd_run_last_step"};
        l[nl++] = (struct rw_label){"run", bt->run};
        for (size_t t = i; t <= j; t++, n++) tsb[n] = bt->ts[t], vb[n] = (double)bt->step[t];
        pb_series(b, l, nl, tsb, vb, n);
        return n;
    }
    size_t m = 0;
    while (m + 1 < bt->nmetrics && bt->metrics[m + 1].cell0 <= s) m++;
    const struct rw_metric *mt = &bt->metrics[m];
    size_t c = s - mt->cell0;
    static const char *const names[] = {"entropyd_scalar", "entropyd_layer", "entropyd_head"};
    l[nl++] = (struct rw_label){"__name__", names[mt->kind]};
    if (mt->kind == 2) {
        snprintf(head, sizeof head, "%lld", (long long)(c % (size_t)bt->heads));
        snprintf(layer, sizeof layer, "%lld", (long long)(c / (size_t)bt->heads));
        l[nl++] = (struct rw_label){"head", head};
    } else {
        snprintf(layer, sizeof layer, "%zu", c);
    }
    if (mt->kind) l[nl++] = (struct rw_label){"layer", layer};
    l[nl++] = (struct rw_label){"metric", mt->name};
    l[nl++] = (struct rw_label){"run", bt->run};
    for (size_t t = i; t <= j; t++) {
        if (!bt->present[m * bt->k + t]) continue;
        tsb[n] = bt->ts[t];
        vb[n++] = (double)bt->vals[s * bt->k + t];
    }
    if (n) pb_series(b, l, nl, tsb, vb, n);
    return n;
}

/* ---- one request ---------------------------------------------------- */

static size_t keep_body(char *p, size_t size, size_t n, void *ctx) {
    struct strbuf *b = ctx;
    if (b->len < 300) strbuf_add(b, p, size * n < 300 ? size * n : 300);
    return size * n;
}

static int abort_on_stop(void *ctx, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    struct remote_write *rw = ctx;
    return atomic_load(&rw->stop);
}

/* POSTs rw->pb once (unused only in the unit test, which fakes it).
 * Returns RW_SENT (2xx), RW_REJECTED (400: the receiver refuses these
 * samples for good; Prometheus, Mimir and VictoriaMetrics say so for out of
 * order or too old) or -1: try again, for anything else, other 4xx
 * included (401, 403, 404: a configuration to fix, not samples to drop),
 * with the receiver's answer or curl's error in msg. */
static __attribute__((unused)) int post_once(struct remote_write *rw, char *msg, size_t msglen) {
    size_t need = snappy_max_compressed_length(rw->pb.len);
    if (need > rw->zcap) {
        char *z = realloc(rw->z, need);
        if (!z) {
            snprintf(msg, msglen, "out of memory");
            return -1;
        }
        rw->z = z, rw->zcap = need;
    }
    size_t zlen = rw->zcap;
    if (snappy_compress(rw->pb.p, rw->pb.len, rw->z, &zlen) != SNAPPY_OK) {
        snprintf(msg, msglen, "snappy failed");
        return -1;
    }
    struct strbuf body = {0};
    CURL *c = rw->curl;
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, rw->z);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)zlen);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    atomic_fetch_add(&rw->requests, 1);
    int ret = -1;
    if (cc != CURLE_OK) {
        snprintf(msg, msglen, "%s", curl_easy_strerror(cc));
    } else {
        snprintf(msg, msglen, "HTTP %ld: %.200s", code, body.p ? body.p : "");
        msg[strcspn(msg, "\n")] = 0;
        if (code >= 200 && code < 300) ret = RW_SENT, atomic_fetch_add(&rw->bytes, zlen);
        else if (code == 400) ret = RW_REJECTED;
    }
    strbuf_free(&body);
    return ret;
}

/* Sleeps ms unless stopped; returns 1 when stopped. */
static int nap(struct remote_write *rw, double ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(ms / 1e3);
    until.tv_nsec += (long)(fmod(ms, 1e3) * 1e6);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&rw->mu);
    while (!atomic_load(&rw->stop) && pthread_cond_timedwait(&rw->cv, &rw->mu, &until) != ETIMEDOUT) {}
    pthread_mutex_unlock(&rw->mu);
    return atomic_load(&rw->stop);
}

/* The request function; tests/test_remote_write.c puts a fake receiver here. */
#ifndef RW_POST
#define RW_POST post_once
#endif

/* Sends rw->pb until the receiver answers for good: RW_SENT, RW_REJECTED,
 * or RW_STOP when the daemon stops first. Failures back off exponentially. */
static int deliver(struct remote_write *rw) {
    double backoff = REMOTE_WRITE_BACKOFF_MIN_MS;
    char msg[300];
    for (;;) {
        if (atomic_load(&rw->stop)) return RW_STOP;
        atomic_store(&rw->post_since, now_mono_ms());
        int r = RW_POST(rw, msg, sizeof msg);
        atomic_store(&rw->post_since, 0.0);
        if (r >= 0) {
            if (atomic_exchange(&rw->failing, 0))
                fprintf(stderr, "entropyd: remote-write: the receiver answers again\n");
            if (r == RW_SENT) atomic_store(&rw->last_ok, now_wall());
            else if (now_mono_ms() - rw->log_at > 10000) {
                rw->log_at = now_mono_ms();
                fprintf(stderr, "entropyd: remote-write: samples refused (%s); they are skipped and counted\n", msg);
            }
            return r;
        }
        atomic_fetch_add(&rw->failures, 1);
        if (!atomic_exchange(&rw->failing, 1))
            fprintf(stderr, "entropyd: remote-write: %s: %s; retrying with backoff\n", rw->url, msg);
        if (nap(rw, backoff)) return RW_STOP;
        backoff = backoff * 2 > REMOTE_WRITE_BACKOFF_MAX_MS ? REMOTE_WRITE_BACKOFF_MAX_MS : backoff * 2;
    }
}

/* Sends series [s0, s1) of bt at steps [i, j]. A refused request is split
 * in halves by steps, down to single steps, which are then skipped: a
 * receiver refuses a whole request for one sample it cannot take. Returns
 * RW_SENT (everything delivered or skipped), RW_STOP, or -1 (out of
 * memory). */
static int send_range(struct remote_write *rw, const struct rw_batch *bt, size_t i, size_t j, size_t s0, size_t s1,
                      int64_t *tsb, double *vb) {
    rw->pb.len = 0;
    size_t n = 0;
    for (size_t s = s0; s < s1; s++) n += encode_series(&rw->pb, bt, s, i, j, tsb, vb);
    if (rw->pb.failed) {
        strbuf_free(&rw->pb);
        return -1;
    }
    if (n == 0) return RW_SENT;
    int r = deliver(rw);
    if (r == RW_SENT) atomic_fetch_add(&rw->sent, n);
    if (r != RW_REJECTED) return r;
    if (i == j) {
        atomic_fetch_add(&rw->rejected, n);
        return RW_SENT;
    }
    size_t mid = i + (j - i) / 2;
    if ((r = send_range(rw, bt, i, mid, s0, s1, tsb, vb)) != RW_SENT) return r;
    return send_range(rw, bt, mid + 1, j, s0, s1, tsb, vb);
}

/* Sends a whole batch: every series over its steps, in requests of at most
 * REMOTE_WRITE_MAX_SAMPLES samples (more only when one step of one series
 * range holds more). */
static int send_batch(struct remote_write *rw, const struct rw_batch *bt) {
    int64_t *tsb = malloc(bt->k * sizeof *tsb);
    double *vb = malloc(bt->k * sizeof *vb);
    int r = -1;
    if (!tsb || !vb) goto out;
    size_t per = REMOTE_WRITE_MAX_SAMPLES / bt->nsteps, series = bt->cells + 1;
    if (per < 1) per = 1;
    r = RW_SENT;
    for (size_t s0 = 0; s0 < series && r == RW_SENT; s0 += per)
        r = send_range(rw, bt, 0, bt->nsteps - 1, s0, s0 + per < series ? s0 + per : series, tsb, vb);
out:
    free(tsb);
    free(vb);
    return r;
}

/* ---- reading a batch ------------------------------------------------ */

static void batch_free(struct rw_batch *bt) {
    free(bt->metrics);
    free(bt->step);
    free(bt->ts);
    free(bt->vals);
    free(bt->present);
    memset(bt, 0, sizeof *bt);
}

static void cursor_publish(struct remote_write *rw);

/* The run's name and shape, and whether it can be read now (1), or not:
 * gone or in the middle of a rollback (0). A rollback newer than the
 * cursor's moves the cursor back before its first abandoned step. */
static int read_run(struct remote_write *rw, struct query *q, struct rw_batch *bt, int64_t *layers, char *err,
                    size_t errlen) {
    struct rw_cursor *c = bt->cur;
    struct query_rw_shape sh;
    int ret = query_rw_shape(q, c->run_id, c->branch, &sh, err, errlen);
    if (ret != 1) return ret;
    if (sh.rewinding) return 0;
    snprintf(bt->run, sizeof bt->run, "%s", sh.name);
    *layers = sh.layers;
    bt->heads = sh.heads;
    if (sh.new_branch) {
        c->branch = sh.new_branch;
        if (sh.new_from - 1 < c->step) c->step = sh.new_from - 1;
        cursor_publish(rw);
    }
    return 1;
}

struct metrics_ctx {
    struct rw_batch *bt;
    int64_t layers;
    size_t cap;
};

/* query_rw_metrics' callback: one metric of the batch's run. */
static int take_metric(void *ctx, int64_t id, const char *name, int kind) {
    struct metrics_ctx *mc = ctx;
    struct rw_batch *bt = mc->bt;
    if (bt->nmetrics == mc->cap) {
        mc->cap = mc->cap ? 2 * mc->cap : 16;
        struct rw_metric *m = realloc(bt->metrics, mc->cap * sizeof *m);
        if (!m) return 1;
        bt->metrics = m;
    }
    struct rw_metric *m = &bt->metrics[bt->nmetrics++];
    m->id = id;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->kind = kind;
    m->n = (uint32_t)(kind == 0 ? 1 : kind == 1 ? mc->layers : mc->layers * bt->heads);
    m->cell0 = bt->cells;
    bt->cells += m->n;
    return 0;
}

static int read_metrics(struct query *q, struct rw_batch *bt, int64_t layers, char *err, size_t errlen) {
    struct metrics_ctx mc = {bt, layers, 0};
    int rc = query_rw_metrics(q, bt->cur->run_id, take_metric, &mc, err, errlen);
    if (rc > 0) snprintf(err, errlen, "out of memory");
    return rc ? -1 : 0;
}

struct steps_ctx {
    struct rw_batch *bt;
    int64_t prev; /* the previous step's sample timestamp */
};

/* query_rw_steps' callback: a step and its sample timestamp, the
 * trainer's step time in ms raised to 1 ms past the previous step's where
 * it is not above it (the receiver takes a series' samples in increasing
 * time only). */
static int take_step(void *ctx, int64_t step, double time) {
    struct steps_ctx *sc = ctx;
    double t = time * 1e3;
    int64_t ms = isfinite(t) && fabs(t) < 9e18 ? llround(t) : 0;
    if (ms <= sc->prev) ms = sc->prev + 1;
    sc->bt->step[sc->bt->nsteps] = step;
    sc->bt->ts[sc->bt->nsteps++] = sc->prev = ms;
    return 0;
}

/* The next steps after the cursor (at most bt->k) and their timestamps. */
static int read_steps(struct query *q, struct rw_batch *bt, char *err, size_t errlen) {
    struct steps_ctx sc = {bt, bt->cur->ts};
    return query_rw_steps(q, bt->cur->run_id, bt->cur->step, (int64_t)bt->k, take_step, &sc, err, errlen) ? -1 : 0;
}

struct frame_ctx {
    struct rw_batch *bt;
    size_t m;
};

/* query_frames' callback: files a frame's values under its step. */
static int take_frame(void *ctx, int64_t step, const float *vals, uint32_t n) {
    struct frame_ctx *fc = ctx;
    struct rw_batch *bt = fc->bt;
    size_t lo = 0, hi = bt->nsteps;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (bt->step[mid] < step) lo = mid + 1;
        else hi = mid;
    }
    if (lo == bt->nsteps || bt->step[lo] != step) return 0; /* a frame without its step row: not ours to push */
    const struct rw_metric *m = &bt->metrics[fc->m];
    for (uint32_t c = 0; c < n; c++) bt->vals[(m->cell0 + c) * bt->k + lo] = vals[c];
    bt->present[fc->m * bt->k + lo] = 1;
    return 0;
}

/* The run's steps after the cursor and their values, into bt (whose
 * metrics are read). Returns 0 or -1 with a message. */
static int read_values(struct query *q, struct rw_batch *bt, char *err, size_t errlen) {
    size_t k = REMOTE_WRITE_MAX_SAMPLES / (bt->cells + 1);
    bt->k = k < 1 ? 1 : k > RW_MAX_STEPS ? RW_MAX_STEPS : k;
    bt->step = malloc(bt->k * sizeof *bt->step);
    bt->ts = malloc(bt->k * sizeof *bt->ts);
    bt->vals = malloc((bt->cells ? bt->cells : 1) * bt->k * sizeof *bt->vals);
    bt->present = calloc((bt->nmetrics ? bt->nmetrics : 1) * bt->k, 1);
    if (!bt->step || !bt->ts || !bt->vals || !bt->present) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int ret = read_steps(q, bt, err, errlen);
    for (size_t m = 0; ret == 0 && bt->nsteps && m < bt->nmetrics; m++) {
        struct frame_ctx fc = {bt, m};
        ret = query_frames(q, bt->metrics[m].id, bt->metrics[m].n, bt->step[0], bt->step[bt->nsteps - 1], take_frame,
                           &fc, err, errlen);
    }
    return ret ? -1 : 0;
}

/* Reads the next batch of cursor c's run in one read transaction.
 * Returns 1 with bt filled (the caller batch_free()s it), 0 when there is
 * nothing to send now, -1 with a message on failure. */
static int read_batch(struct remote_write *rw, struct query *q, struct rw_cursor *c, struct rw_batch *bt, char *err,
                      size_t errlen) {
    memset(bt, 0, sizeof *bt);
    bt->cur = c;
    int64_t layers = 0;
    if (query_read_begin(q, err, errlen)) return -1;
    int ret = read_run(rw, q, bt, &layers, err, errlen);
    if (ret == 1 && (read_metrics(q, bt, layers, err, errlen) || read_values(q, bt, err, errlen))) ret = -1;
    if (ret == 1 && bt->nsteps == 0) ret = 0;
    query_read_end(q);
    if (ret != 1) batch_free(bt);
    return ret;
}

/* ---- the cursor ----------------------------------------------------- */

/* The cursor of run_id, added (nothing delivered yet) if new; NULL when
 * out of memory. Runs come in id order mostly, so search from the end. */
static struct rw_cursor *cursor_get(struct remote_write *rw, int64_t run_id) {
    size_t lo = 0, hi = rw->ncur;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rw->cur[mid].run_id < run_id) lo = mid + 1;
        else hi = mid;
    }
    if (lo < rw->ncur && rw->cur[lo].run_id == run_id) return &rw->cur[lo];
    if (rw->ncur == rw->capcur) {
        size_t cap = rw->capcur ? 2 * rw->capcur : 64;
        struct rw_cursor *n = realloc(rw->cur, cap * sizeof *n);
        if (!n) return NULL;
        rw->cur = n, rw->capcur = cap;
    }
    memmove(&rw->cur[lo + 1], &rw->cur[lo], (rw->ncur - lo) * sizeof *rw->cur);
    rw->ncur++;
    rw->cur[lo] = (struct rw_cursor){.run_id = run_id, .step = INT64_MIN, .ts = INT64_MIN, .branch = 0};
    return &rw->cur[lo];
}

/* Copies the cursor for the gauges (remote_write_metrics), which read it
 * while the thread may be waiting on the receiver. Out of memory keeps
 * the previous copy. */
static void cursor_publish(struct remote_write *rw) {
    pthread_mutex_lock(&rw->mu);
    if (rw->ncur > rw->cappub) {
        struct rw_cursor *p = realloc(rw->pub, rw->ncur * sizeof *p);
        if (p) rw->pub = p, rw->cappub = rw->ncur;
    }
    if (rw->ncur <= rw->cappub) {
        if (rw->ncur) memcpy(rw->pub, rw->cur, rw->ncur * sizeof *rw->cur);
        rw->npub = rw->ncur;
    }
    pthread_mutex_unlock(&rw->mu);
}

/* Writes the cursor file (a temporary file renamed over it: a crash
 * leaves the old one or the new one) and publishes it. Returns 0 or -1. */
static int cursor_save(struct remote_write *rw) {
    cursor_publish(rw);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", rw->cursor_path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    fprintf(f, "entropyd-remote-write 1\nurl %s\n", rw->url);
    for (size_t i = 0; i < rw->ncur; i++)
        fprintf(f, "%lld %lld %lld %lld\n", (long long)rw->cur[i].run_id, (long long)rw->cur[i].step,
                (long long)rw->cur[i].ts, (long long)rw->cur[i].branch);
    int bad = ferror(f);
    bad |= fclose(f);
    if (bad || rename(tmp, rw->cursor_path) < 0) {
        fprintf(stderr, "entropyd: remote-write: cannot write %s: %s\n", rw->cursor_path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Reads the cursor file if there is one for this URL. */
static void cursor_load(struct remote_write *rw) {
    FILE *f = fopen(rw->cursor_path, "r");
    if (!f) return;
    char line[4200];
    int ok = fgets(line, sizeof line, f) && strcmp(line, "entropyd-remote-write 1\n") == 0 &&
             fgets(line, sizeof line, f) && strncmp(line, "url ", 4) == 0;
    line[strcspn(line, "\n")] = 0;
    if (ok && strcmp(line + 4, rw->url) != 0) {
        fprintf(stderr, "entropyd: remote-write: %s was for %s: everything stored goes to %s\n", rw->cursor_path,
                line + 4, rw->url);
        ok = 0;
    }
    int fresh = !ok;
    long long id, step, ts, branch;
    while (ok && fgets(line, sizeof line, f) && sscanf(line, "%lld %lld %lld %lld", &id, &step, &ts, &branch) == 4) {
        struct rw_cursor *c = cursor_get(rw, id);
        if (c) *c = (struct rw_cursor){.run_id = id, .step = step, .ts = ts, .branch = branch};
    }
    fclose(f);
    if (fresh) cursor_save(rw); /* the old receiver's progress is not this one's */
}

/* ---- the thread ----------------------------------------------------- */

/* The stored runs, in id order (malloc'd; *n of them), dropping the
 * cursors of runs deleted meanwhile. NULL with *n 0 when there are none
 * or on failure. One query, however many runs are stored. */
static struct query_rw_run *list_runs(struct remote_write *rw, struct query *q, size_t *n, char *err, size_t errlen) {
    struct query_rw_run *runs;
    if (query_rw_runs(q, &runs, n, err, errlen)) return NULL;
    size_t keep = 0;
    for (size_t i = 0, j = 0; i < rw->ncur; i++) {
        while (j < *n && runs[j].id < rw->cur[i].run_id) j++;
        if (j < *n && runs[j].id == rw->cur[i].run_id) rw->cur[keep++] = rw->cur[i];
    }
    rw->ncur = keep;
    return runs;
}

/* 1 when the run has steps past its cursor or a rollback not seen yet. */
static int has_news(const struct query_rw_run *r, const struct rw_cursor *c) {
    return r->last_step != c->step || r->branch != c->branch;
}

/* One pass over the runs: at most one batch of each run with news sent.
 * Returns the batches delivered, or -1 on a failure (logged). */
static int pass(struct remote_write *rw) {
    char err[512];
    struct query *q = query_acquire(rw->pool, err, sizeof err);
    if (!q) goto fail;
    size_t n;
    struct query_rw_run *runs = list_runs(rw, q, &n, err, sizeof err);
    int done = runs || !n ? 0 : -1;
    for (size_t i = 0; i < n && done >= 0 && !atomic_load(&rw->stop); i++) {
        struct rw_cursor *c = cursor_get(rw, runs[i].id);
        if (c && !has_news(&runs[i], c)) continue;
        struct rw_batch bt;
        int r = c ? read_batch(rw, q, c, &bt, err, sizeof err) : -1;
        if (r <= 0) {
            if (r < 0) done = -1;
            continue;
        }
        int64_t last_step = bt.step[bt.nsteps - 1], last_ts = bt.ts[bt.nsteps - 1];
        r = send_batch(rw, &bt);
        batch_free(&bt);
        if (r == RW_SENT) {
            c = cursor_get(rw, runs[i].id); /* the same entry: only list_runs moves them */
            c->step = last_step, c->ts = last_ts;
            cursor_save(rw);
            done++;
        } else if (r < 0) {
            snprintf(err, sizeof err, "out of memory building a request");
            done = -1;
        }
    }
    free(runs);
    query_release(rw->pool, q);
    if (done >= 0) return done;
fail:
    fprintf(stderr, "entropyd: remote-write: %s\n", err);
    return -1;
}

static void *run_thread(void *arg) {
    struct remote_write *rw = arg;
    while (!atomic_load(&rw->stop)) {
        int r = pass(rw);
        if (r > 0) continue;
        if (r < 0 && nap(rw, 1000)) break;
        /* caught up: wait for a commit (or a second, for anything missed) */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_mutex_lock(&rw->mu);
        while (!rw->dirty && !atomic_load(&rw->stop) && pthread_cond_timedwait(&rw->cv, &rw->mu, &until) != ETIMEDOUT) {
        }
        rw->dirty = 0;
        pthread_mutex_unlock(&rw->mu);
    }
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------ */

struct remote_write *remote_write_create(const struct remote_write_config *cfg, char *err, size_t errlen) {
    if (!cfg->url || (strncmp(cfg->url, "http://", 7) && strncmp(cfg->url, "https://", 8)) ||
        strpbrk(cfg->url, " \t\r\n")) {
        snprintf(err, errlen, "--remote-write wants an http:// or https:// URL, got \"%.200s\"",
                 cfg->url ? cfg->url : "");
        return NULL;
    }
    struct remote_write *rw = calloc(1, sizeof *rw);
    if (!rw) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&rw->mu, NULL);
    pthread_cond_init(&rw->cv, NULL);
    pthread_mutex_init(&rw->gauge_mu, NULL);
    rw->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
    rw->url = strdup(cfg->url);
    size_t plen = strlen(cfg->db_path) + sizeof ".remote-write";
    rw->cursor_path = malloc(plen);
    if (!rw->url || !rw->cursor_path) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(rw->cursor_path, plen, "%s.remote-write", cfg->db_path);
    /* the thread's connection, and the gauges' (remote_write_metrics) */
    rw->pool = query_pool_open(cfg->db_path, 2, err, errlen);
    if (!rw->pool) goto fail;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rw->curl = curl_easy_init();
    struct curl_slist *h = NULL;
    static const char *const hdr[] = {"Content-Type: application/x-protobuf", "Content-Encoding: snappy",
                                      "X-Prometheus-Remote-Write-Version: 0.1.0"};
    for (size_t i = 0; i < sizeof hdr / sizeof *hdr; i++) {
        struct curl_slist *n = curl_slist_append(h, hdr[i]);
        if (!n) break;
        rw->headers = h = n;
    }
    if (!rw->curl || !rw->headers) {
        snprintf(err, errlen, "cannot set up libcurl");
        goto fail;
    }
    CURL *c = rw->curl;
    curl_easy_setopt(c, CURLOPT_URL, rw->url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, rw->headers);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)rw->timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "entropyd");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, keep_body);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, abort_on_stop);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, rw);
    cursor_load(rw);
    cursor_publish(rw);
    rw->pending_at = -1e18;
    rw->log_at = -1e18;
    if (pthread_create(&rw->thread, NULL, run_thread, rw) != 0) {
        snprintf(err, errlen, "cannot start the remote-write thread");
        goto fail;
    }
    rw->started = 1;
    return rw;
fail:
    remote_write_destroy(rw);
    return NULL;
}

void remote_write_on_commit(struct remote_write *rw, const struct writer_item *items) {
    if (!rw) return;
    for (const struct writer_item *it = items; it; it = it->next) {
        if (it->kind != WRITER_STEP || !it->applied) continue;
        pthread_mutex_lock(&rw->mu);
        rw->dirty = 1;
        pthread_cond_signal(&rw->cv);
        pthread_mutex_unlock(&rw->mu);
        return;
    }
}

/* The published cursor of run_id (a copy), or one that has delivered
 * nothing when the run has none yet. Under rw->mu. */
static struct rw_cursor pub_cursor(const struct remote_write *rw, int64_t run_id) {
    size_t lo = 0, hi = rw->npub;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rw->pub[mid].run_id < run_id) lo = mid + 1;
        else hi = mid;
    }
    if (lo < rw->npub && rw->pub[lo].run_id == run_id) return rw->pub[lo];
    return (struct rw_cursor){.run_id = run_id, .step = INT64_MIN, .ts = INT64_MIN, .branch = 0};
}

/* The samples committed and not yet delivered, over every stored run
 * (runs created since the thread's last pass too), against the published
 * cursor: counted at most once a second, by the scrape, on the gauges'
 * own connection, so that a thread stuck in a request does not freeze
 * it. The last count when the database cannot be read. */
static uint64_t pending_samples(struct remote_write *rw) {
    pthread_mutex_lock(&rw->gauge_mu);
    if (rw->pool && now_mono_ms() - rw->pending_at >= 1000) {
        char err[256];
        struct query *q = query_acquire(rw->pool, err, sizeof err);
        struct query_rw_run *runs = NULL;
        size_t n = 0;
        if (q && query_read_begin(q, err, sizeof err) == QUERY_OK &&
            query_rw_runs(q, &runs, &n, err, sizeof err) == 0) {
            uint64_t total = 0;
            int ok = 1;
            for (size_t i = 0; ok && i < n; i++) {
                pthread_mutex_lock(&rw->mu);
                struct rw_cursor c = pub_cursor(rw, runs[i].id);
                pthread_mutex_unlock(&rw->mu);
                if (!has_news(&runs[i], &c)) continue;
                int64_t s = query_rw_samples_after(q, runs[i].id, c.step);
                if (s < 0) ok = 0;
                else total += (uint64_t)s;
            }
            if (ok) rw->pending = total, rw->pending_at = now_mono_ms();
        }
        if (q) query_read_end(q);
        free(runs);
        query_release(rw->pool, q);
    }
    uint64_t v = rw->pending;
    pthread_mutex_unlock(&rw->gauge_mu);
    return v;
}

void remote_write_metrics(void *ctx, struct strbuf *b) {
    struct remote_write *rw = ctx;
    if (!rw) return;
    /* failing from the first second of a hang: a request without an
     * answer for a second counts, not only one that timed out */
    double since = atomic_load(&rw->post_since);
    int failing = atomic_load(&rw->failing) || (since > 0 && now_mono_ms() - since >= 1000);
    const struct {
        const char *name, *type, *help;
        double v;
    } m[] = {
        {"entropyd_remote_write_samples_total", "counter", "Samples the remote-write receiver took.",
         (double)atomic_load(&rw->sent)},
        {"entropyd_remote_write_samples_rejected_total", "counter",
         "Samples the receiver refused for good (out of order, too old): skipped.", (double)atomic_load(&rw->rejected)},
        {"entropyd_remote_write_pending_samples", "gauge", "Samples committed and not yet delivered.",
         (double)pending_samples(rw)},
        {"entropyd_remote_write_requests_total", "counter", "Remote-write requests sent.",
         (double)atomic_load(&rw->requests)},
        {"entropyd_remote_write_requests_failed_total", "counter",
         "Remote-write requests that failed (receiver down, 5xx, 429, timeout) and were retried.",
         (double)atomic_load(&rw->failures)},
        {"entropyd_remote_write_sent_bytes_total", "counter", "Compressed bytes the receiver took.",
         (double)atomic_load(&rw->bytes)},
        {"entropyd_remote_write_failing", "gauge",
         "1 while the receiver fails or a request has waited a second for its answer.", failing},
        {"entropyd_remote_write_last_success_timestamp_seconds", "gauge",
         "Unix time of the last request the receiver took (0: none yet).", atomic_load(&rw->last_ok)},
    };
    for (size_t i = 0; i < sizeof m / sizeof *m; i++) strbuf_prom(b, m[i].name, m[i].type, m[i].help, m[i].v);
}

void remote_write_destroy(struct remote_write *rw) {
    if (!rw) return;
    if (rw->started) {
        pthread_mutex_lock(&rw->mu);
        atomic_store(&rw->stop, 1);
        pthread_cond_broadcast(&rw->cv);
        pthread_mutex_unlock(&rw->mu);
        pthread_join(rw->thread, NULL);
        cursor_save(rw);
    }
    if (rw->curl) curl_easy_cleanup(rw->curl);
    curl_slist_free_all(rw->headers);
    query_pool_close(rw->pool);
    pthread_mutex_destroy(&rw->mu);
    pthread_cond_destroy(&rw->cv);
    pthread_mutex_destroy(&rw->gauge_mu);
    free(rw->pub);
    strbuf_free(&rw->pb);
    free(rw->z);
    free(rw->cur);
    free(rw->url);
    free(rw->cursor_path);
    free(rw);
}
