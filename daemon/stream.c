/* stream.c: the SSE event ring. See stream.h for the contract. */
#include "stream.h"
#include "strbuf.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "query.h"
#include "now.h"

/* What an event is, for the clients' subscriptions (stream_sub). */
enum { EV_STEP = 1, EV_TICK = 2, EV_LAYERS = 4, EV_CELLS = 8, EV_OTHER = 16 };

struct ev {
    uint64_t n;
    int64_t run;
    unsigned cls;       /* EV_* */
    const char *metric; /* a cells event's metric (inside text's allocation), else "" */
    char *text;         /* "id: ..\nevent: ..\ndata: ..\n\n" */
    size_t len;
};

/* One metric of a run's accumulator: its values are [off, off + rows*cols). */
struct tick_metric {
    char name[PROTO_MAX_NAME + 1];
    int kind; /* enum proto_kind */
    uint32_t rows, cols, off;
    int64_t step; /* the last step that carried it in this tick */
    int seen;     /* carried by a step of this tick */
};

/* A token bucket: an event may go when it holds a token; it holds
 * STREAM_BURST tokens at most and gains one per interval. So a few steps
 * sent by hand after a quiet spell go out at once (a dashboard shows them
 * within the second), and a run logging ten steps a second gets one event
 * per interval, holding all its steps (a held step goes with the next step
 * or the writer's tick, once a token is back). */
struct tick_bucket {
    double tokens;
    double at_ms; /* monotonic time tokens was counted */
};

/* A live run's steps since its last tick (writer thread only). */
struct tick_run {
    int64_t run;
    struct tick_bucket tick, rows; /* when the tick and the rows events may go */
    int64_t first, last;           /* steps of this tick */
    int64_t rows_first;            /* the first step of the rows events' figures */
    uint32_t rows_n;
    int dirty;   /* got steps in the commit being published */
    double time; /* the last step's time */
    uint32_t n;  /* steps in this tick */
    struct tick_metric *m;
    uint32_t nm, capm;
    float *mn, *mx, *lastv; /* per value: min, max (finite values), last (NaN kept) */
    double *sum;
    uint32_t *cnt; /* finite values summed */
    uint32_t nv, capv;
};

struct stream {
    struct stream_config cfg;
    uint64_t boot; /* start time in ms: the id prefix */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* signalled on publish and shutdown */
    struct ev *ring;      /* events first..last live at index n % max_events */
    uint64_t first, last; /* first > last when empty */
    size_t bytes;
    int shutdown;
    struct stream_stats stats;
    struct tick_run **tr; /* the accumulators (writer thread only, no lock) */
    size_t ntr;
};

struct stream_client {
    struct stream *s;
    int64_t run;
    uint64_t next; /* the next event number to deliver */
    unsigned want; /* EV_* classes delivered */
    int ncells;
    char cells[STREAM_MAX_CELLS][PROTO_MAX_NAME + 1];
    int started;
    char *pend; /* text not yet handed out */
    size_t plen, poff;
    struct timespec deadline; /* when to send the next keep-alive */
    int (*gone)(void *);      /* see stream_client_watch; NULL: not asked */
    void *gone_ctx;
};

struct stream *stream_create(const struct stream_config *cfg, char *err, size_t errlen) {
    struct stream *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    if (cfg) s->cfg = *cfg;
    if (!s->cfg.max_events) s->cfg.max_events = 16384;
    if (!s->cfg.max_bytes) s->cfg.max_bytes = (size_t)32 << 20;
    if (s->cfg.keepalive_ms <= 0) s->cfg.keepalive_ms = 15000;
    if (s->cfg.tick_ms <= 0) s->cfg.tick_ms = 1000;
    if (s->cfg.rows_ms <= 0) s->cfg.rows_ms = 1000;
    s->ring = calloc(s->cfg.max_events, sizeof *s->ring);
    if (!s->ring) goto oom;
    s->boot = (uint64_t)(now_wall() * 1000);
    s->first = 1;
    s->last = 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    return s;
oom:
    if (s) free(s->ring);
    free(s);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

static void tick_run_free(struct tick_run *t) {
    if (!t) return;
    free(t->m);
    free(t->mn);
    free(t->mx);
    free(t->lastv);
    free(t->sum);
    free(t->cnt);
    free(t);
}

void stream_destroy(struct stream *s) {
    if (!s) return;
    for (size_t i = 0; i < s->ntr; i++) tick_run_free(s->tr[i]);
    free(s->tr);
    for (uint64_t n = s->first; n <= s->last; n++) free(s->ring[n % s->cfg.max_events].text);
    free(s->ring);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void stream_shutdown(struct stream *s) {
    pthread_mutex_lock(&s->mu);
    s->shutdown = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void drop_oldest(struct stream *s) {
    struct ev *e = &s->ring[s->first % s->cfg.max_events];
    s->bytes -= e->len;
    free(e->text);
    e->text = NULL;
    s->first++;
}

/* Publishes one event of class cls; metric (NULL: none) is kept for the
 * clients' cells filter, in the text's allocation. */
static int publish_ev(struct stream *s, const char *kind, unsigned cls, const char *metric, int64_t run_id,
                      const char *json, size_t len) {
    size_t ml = metric ? strlen(metric) : 0;
    size_t cap = len + 128 + ml + 1;
    char *text = malloc(cap);
    if (!text) return -1;
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->last + 1;
    int hl = snprintf(text, cap, "id: %" PRIu64 "-%" PRIu64 "\nevent: %s\ndata: ", s->boot, n, kind);
    memcpy(text + hl, json, len);
    memcpy(text + hl + len, "\n\n", 2);
    size_t tl = (size_t)hl + len + 2;
    char *mcopy = text + tl;
    memcpy(mcopy, metric ? metric : "", ml + 1);
    while (s->first <= s->last && (s->last - s->first + 1 >= s->cfg.max_events || s->bytes + tl > s->cfg.max_bytes))
        drop_oldest(s);
    struct ev *e = &s->ring[n % s->cfg.max_events];
    e->n = n;
    e->run = run_id;
    e->cls = cls;
    e->metric = mcopy;
    e->text = text;
    e->len = tl;
    s->bytes += tl;
    s->last = n;
    s->stats.published++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int stream_publish(struct stream *s, const char *kind, int64_t run_id, const char *json, size_t len) {
    return publish_ev(s, kind, strcmp(kind, "step") == 0 ? EV_STEP : EV_OTHER, NULL, run_id, json, len);
}

/* ---- events of a commit --------------------------------------------- */

/* printf is slow for floats, and this runs in the writer thread for every
 * step: query.h's formatter prints the same digits several times faster. */
#define put_f32 strbuf_f32

static void step_event(struct stream *s, const struct writer_item *it, double ct) {
    const struct proto_msg *m = &it->msg;
    struct strbuf b = {0};
    strbuf_printf(&b, "{\"run\":%lld,\"step\":%lld,\"time\":%.17g,\"ct\":%.17g,\"scalars\":{", (long long)it->run_id,
                  (long long)m->step, it->time, ct);
    int first = 1;
    for (uint32_t i = 0; i < m->nmetrics; i++) {
        const struct proto_metric *pm = &m->metrics[i];
        if (pm->kind != PROTO_SCALAR) continue;
        strbuf_printf(&b, "%s\"%s\":", first ? "" : ",", pm->name);
        put_f32(&b, m->values[pm->offset]);
        first = 0;
    }
    strbuf_puts(&b, "},\"layers\":{");
    first = 1;
    const struct proto_metric *ent = NULL;
    for (uint32_t i = 0; i < m->nmetrics; i++) {
        const struct proto_metric *pm = &m->metrics[i];
        if (pm->kind == PROTO_HEAD && strcmp(pm->name, "entropy") == 0) ent = pm;
        if (pm->kind != PROTO_LAYER) continue;
        strbuf_printf(&b, "%s\"%s\":[", first ? "" : ",", pm->name);
        for (uint32_t l = 0; l < pm->rows; l++) {
            if (l) strbuf_add(&b, ",", 1);
            put_f32(&b, m->values[pm->offset + l]);
        }
        strbuf_add(&b, "]", 1);
        first = 0;
    }
    strbuf_add(&b, "}", 1);
    if (ent) {
        /* per layer, over the heads' finite values */
        for (int pass = 0; pass < 2; pass++) {
            strbuf_puts(&b, pass == 0 ? ",\"entropy\":{\"min\":[" : "],\"mean\":[");
            for (uint32_t l = 0; l < ent->rows; l++) {
                float mn = NAN;
                double sum = 0;
                uint32_t c = 0;
                for (uint32_t h = 0; h < ent->cols; h++) {
                    float x = m->values[ent->offset + l * ent->cols + h];
                    if (!isfinite(x)) continue;
                    if (!c || x < mn) mn = x;
                    sum += x;
                    c++;
                }
                if (l) strbuf_add(&b, ",", 1);
                if (!c) strbuf_add(&b, "null", 4);
                else if (pass == 0) put_f32(&b, mn);
                else strbuf_f64(&b, sum / c);
            }
        }
        strbuf_puts(&b, "]}");
    }
    strbuf_add(&b, "}", 1);
    if (!b.failed) stream_publish(s, "step", it->run_id, b.p, b.len);
    strbuf_free(&b);
}

/* ---- ticks: a live run's steps folded into a few events a second ----- */

/* Summaries go to dashboards that draw them at a pixel's resolution: four
 * significant digits, shorter than the step event's round-trip digits. */
static void put4(struct strbuf *b, double x) {
    if (!isfinite(x)) {
        strbuf_add(b, "null", 4);
        return;
    }
    strbuf_printf(b, "%.4g", x);
}

static struct tick_run *tick_find(struct stream *s, int64_t run, size_t *at) {
    for (size_t i = 0; i < s->ntr; i++)
        if (s->tr[i]->run == run) {
            if (at) *at = i;
            return s->tr[i];
        }
    return NULL;
}

/* Clears the figures of the scalars (rows 0) or of the layer and head
 * metrics (rows 1); the metrics' layout stays for the next tick. */
static void tick_clear(struct tick_run *t, int rows) {
    if (rows) t->rows_n = 0;
    else t->n = 0;
    for (uint32_t i = 0; i < t->nm; i++) {
        struct tick_metric *m = &t->m[i];
        if ((m->kind != PROTO_SCALAR) != rows) continue;
        m->seen = 0;
        for (uint32_t v = m->off; v < m->off + m->rows * m->cols; v++) {
            t->mn[v] = INFINITY;
            t->mx[v] = -INFINITY;
            t->sum[v] = 0;
            t->cnt[v] = 0;
            t->lastv[v] = NAN;
        }
    }
}

/* Makes room for nv more values; -1 out of memory or past the bound. */
static int tick_grow(struct tick_run *t, uint32_t more) {
    if ((uint64_t)t->nv + more > STREAM_MAX_TICK_VALUES) return -1;
    uint32_t need = t->nv + more;
    if (need <= t->capv) return 0;
    uint32_t cap = t->capv ? t->capv : 256;
    while (cap < need) cap *= 2;
    float *mn = realloc(t->mn, cap * sizeof *mn);
    if (mn) t->mn = mn;
    float *mx = realloc(t->mx, cap * sizeof *mx);
    if (mx) t->mx = mx;
    float *lv = realloc(t->lastv, cap * sizeof *lv);
    if (lv) t->lastv = lv;
    double *sum = realloc(t->sum, cap * sizeof *sum);
    if (sum) t->sum = sum;
    uint32_t *cnt = realloc(t->cnt, cap * sizeof *cnt);
    if (cnt) t->cnt = cnt;
    if (!mn || !mx || !lv || !sum || !cnt) return -1;
    t->capv = cap;
    return 0;
}

/* The slot of metric pm in t (added when new); NULL when it cannot be held
 * or its shape changed (then it is left out of this tick). */
static struct tick_metric *tick_slot(struct tick_run *t, const struct proto_metric *pm) {
    for (uint32_t i = 0; i < t->nm; i++) {
        struct tick_metric *m = &t->m[i];
        if (strcmp(m->name, pm->name) != 0) continue;
        return m->kind == pm->kind && m->rows == pm->rows && m->cols == pm->cols ? m : NULL;
    }
    uint32_t n = pm->rows * pm->cols;
    if (t->nm == t->capm) {
        uint32_t cap = t->capm ? t->capm * 2 : 16;
        struct tick_metric *mm = realloc(t->m, cap * sizeof *mm);
        if (!mm) return NULL;
        t->m = mm;
        t->capm = cap;
    }
    if (tick_grow(t, n)) return NULL;
    struct tick_metric *m = &t->m[t->nm++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", pm->name);
    m->kind = pm->kind;
    m->rows = pm->rows;
    m->cols = pm->cols;
    m->off = t->nv;
    for (uint32_t v = t->nv; v < t->nv + n; v++) {
        t->mn[v] = INFINITY;
        t->mx[v] = -INFINITY;
        t->sum[v] = 0;
        t->cnt[v] = 0;
        t->lastv[v] = NAN;
    }
    t->nv += n;
    return m;
}

/* Publishes t's tick event and clears its scalars. */
static void tick_emit(struct stream *s, struct tick_run *t, double ct) {
    if (!t->n) return;
    struct strbuf b = {0};
    strbuf_printf(&b, "{\"run\":%lld,\"step\":%lld,\"from\":%lld,\"n\":%u,\"time\":%.17g,\"ct\":%.17g,\"scalars\":{",
                  (long long)t->run, (long long)t->last, (long long)t->first, t->n, t->time, ct);
    int first = 1;
    for (uint32_t i = 0; i < t->nm; i++) {
        const struct tick_metric *m = &t->m[i];
        if (!m->seen || m->kind != PROTO_SCALAR) continue;
        uint32_t v = m->off;
        strbuf_printf(&b, "%s\"%s\":[", first ? "" : ",", m->name);
        put4(&b, t->cnt[v] ? t->mn[v] : NAN);
        strbuf_add(&b, ",", 1);
        put4(&b, t->cnt[v] ? t->sum[v] / t->cnt[v] : NAN);
        strbuf_add(&b, ",", 1);
        put4(&b, t->cnt[v] ? t->mx[v] : NAN);
        strbuf_add(&b, ",", 1);
        put4(&b, t->lastv[v]);
        strbuf_add(&b, "]", 1);
        first = 0;
    }
    strbuf_puts(&b, "}}");
    if (!b.failed) publish_ev(s, "tick", EV_TICK, NULL, t->run, b.p, b.len);
    strbuf_free(&b);
    tick_clear(t, 0);
}

/* Publishes t's layers event and a cells event per head metric, and
 * clears their figures. */
static void rows_emit(struct stream *s, struct tick_run *t) {
    if (!t->rows_n) return;
    struct strbuf b = {0};
    int first;
    {
        strbuf_printf(&b, "{\"run\":%lld,\"step\":%lld,\"from\":%lld,\"layers\":{", (long long)t->run,
                      (long long)t->last, (long long)t->rows_first);
        for (int pass = 0; pass < 2; pass++) {
            if (pass) strbuf_puts(&b, "},\"heads\":{");
            first = 1;
            for (uint32_t i = 0; i < t->nm; i++) {
                const struct tick_metric *m = &t->m[i];
                if (!m->seen || m->kind != (pass ? PROTO_HEAD : PROTO_LAYER)) continue;
                strbuf_printf(&b, "%s\"%s\":", first ? "" : ",", m->name);
                first = 0;
                if (!pass) { /* a layer metric: its mean per layer */
                    strbuf_add(&b, "[", 1);
                    for (uint32_t l = 0; l < m->rows; l++) {
                        uint32_t v = m->off + l;
                        if (l) strbuf_add(&b, ",", 1);
                        put4(&b, t->cnt[v] ? t->sum[v] / t->cnt[v] : NAN);
                    }
                    strbuf_add(&b, "]", 1);
                    continue;
                }
                /* a head metric, per layer over its heads and the tick's steps */
                static const char *const key[] = {"{\"min\":[", "],\"mean\":[", "],\"max\":["};
                for (int k = 0; k < 3; k++) {
                    strbuf_puts(&b, key[k]);
                    for (uint32_t l = 0; l < m->rows; l++) {
                        double mn = INFINITY, mx = -INFINITY, sum = 0;
                        uint64_t c = 0;
                        for (uint32_t hd = 0; hd < m->cols; hd++) {
                            uint32_t v = m->off + l * m->cols + hd;
                            if (!t->cnt[v]) continue;
                            if (t->mn[v] < mn) mn = t->mn[v];
                            if (t->mx[v] > mx) mx = t->mx[v];
                            sum += t->sum[v];
                            c += t->cnt[v];
                        }
                        if (l) strbuf_add(&b, ",", 1);
                        put4(&b, !c ? NAN : k == 0 ? mn : k == 1 ? sum / (double)c : mx);
                    }
                }
                strbuf_puts(&b, "]}");
            }
        }
        strbuf_puts(&b, "}}");
        if (!b.failed) publish_ev(s, "layers", EV_LAYERS, NULL, t->run, b.p, b.len);
        /* cells: each head metric at its last step, shaped as GET .../frame answers */
        for (uint32_t i = 0; i < t->nm && !b.failed; i++) {
            const struct tick_metric *m = &t->m[i];
            if (!m->seen || m->kind != PROTO_HEAD) continue;
            b.len = 0;
            strbuf_printf(&b,
                          "{\"run\":%lld,\"metric\":\"%s\",\"kind\":\"head\",\"step\":%lld,\"layers\":%u,\"heads\":%u,"
                          "\"values\":[",
                          (long long)t->run, m->name, (long long)m->step, m->rows, m->cols);
            for (uint32_t l = 0; l < m->rows; l++) {
                strbuf_add(&b, l ? ",[" : "[", l ? 2 : 1);
                for (uint32_t hd = 0; hd < m->cols; hd++) {
                    if (hd) strbuf_add(&b, ",", 1);
                    put4(&b, t->lastv[m->off + l * m->cols + hd]);
                }
                strbuf_add(&b, "]", 1);
            }
            strbuf_puts(&b, "]}");
            if (!b.failed) publish_ev(s, "cells", EV_CELLS, m->name, t->run, b.p, b.len);
        }
    }
    strbuf_free(&b);
    tick_clear(t, 1);
}

/* Refills b for the time since it was last counted; takes a token and
 * returns 1 when it holds one. */
static int take_token(struct tick_bucket *b, double now, int interval_ms) {
    if (!b->at_ms) return 1; /* not counted yet (no step): nothing is held */
    b->tokens += (now - b->at_ms) / interval_ms;
    if (b->tokens > STREAM_BURST) b->tokens = STREAM_BURST;
    b->at_ms = now;
    if (b->tokens < 1) return 0;
    b->tokens -= 1;
    return 1;
}

/* Folds one step into its run's accumulator, publishing the tick first
 * when it is due. */
static void tick_step(struct stream *s, const struct writer_item *it, double ct) {
    const struct proto_msg *msg = &it->msg;
    struct tick_run *t = tick_find(s, it->run_id, NULL);
    if (!t) {
        if (s->ntr >= STREAM_MAX_TICK_RUNS) return; /* bounded: this run is not summarised */
        struct tick_run **tr = realloc(s->tr, (s->ntr + 1) * sizeof *tr);
        if (!tr) return;
        s->tr = tr;
        if (!(t = calloc(1, sizeof *t))) return;
        t->run = it->run_id;
        s->tr[s->ntr++] = t;
    }
    double now = now_mono_ms();
    if (!t->tick.at_ms) {
        t->tick = (struct tick_bucket){STREAM_BURST, now};
        t->rows = (struct tick_bucket){STREAM_BURST, now};
    }
    if (t->n == 0) t->first = msg->step;
    if (t->rows_n == 0) t->rows_first = msg->step;
    t->n++;
    t->rows_n++;
    t->last = msg->step;
    t->time = it->time;
    for (uint32_t i = 0; i < msg->nmetrics; i++) {
        const struct proto_metric *pm = &msg->metrics[i];
        struct tick_metric *m = tick_slot(t, pm);
        if (!m) continue;
        m->seen = 1;
        m->step = msg->step;
        uint32_t n = pm->rows * pm->cols;
        const float *x = msg->values + pm->offset;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t v = m->off + k;
            t->lastv[v] = x[k];
            if (!isfinite(x[k])) continue;
            if (x[k] < t->mn[v]) t->mn[v] = x[k];
            if (x[k] > t->mx[v]) t->mx[v] = x[k];
            t->sum[v] += x[k];
            t->cnt[v]++;
        }
    }
    t->dirty = 1;
}

/* After a commit's items: each run that got steps publishes what its
 * buckets allow. Per commit, not per step: a trainer's batch of 200 steps
 * costs one token. */
static void tick_commit(struct stream *s, double ct) {
    double now = now_mono_ms();
    for (size_t i = 0; i < s->ntr; i++) {
        struct tick_run *t = s->tr[i];
        if (!t->dirty) continue;
        t->dirty = 0;
        if (t->n && take_token(&t->tick, now, s->cfg.tick_ms)) tick_emit(s, t, ct);
        if (t->rows_n && take_token(&t->rows, now, s->cfg.rows_ms)) rows_emit(s, t);
    }
}

/* A run ended, went stale or was deleted: its last tick goes out (unless
 * deleted) and its accumulator is freed. */
static void tick_end(struct stream *s, int64_t run, int publish, double ct) {
    size_t at;
    struct tick_run *t = tick_find(s, run, &at);
    if (!t) return;
    if (publish) {
        tick_emit(s, t, ct);
        rows_emit(s, t);
    }
    tick_run_free(t);
    s->tr[at] = s->tr[--s->ntr];
}

void stream_on_tick(struct stream *s, double now) {
    (void)now;
    double ms = now_mono_ms(), ct = now_wall();
    for (size_t i = 0; i < s->ntr; i++) {
        struct tick_run *t = s->tr[i];
        if (t->n && take_token(&t->tick, ms, s->cfg.tick_ms)) tick_emit(s, t, ct);
        if (t->rows_n && take_token(&t->rows, ms, s->cfg.rows_ms)) rows_emit(s, t);
    }
}

static void run_event(struct stream *s, int64_t run_id, const char *name, const char *status) {
    char buf[512];
    int n;
    if (name)
        n = snprintf(buf, sizeof buf, "{\"run\":%lld,\"name\":\"%s\",\"status\":\"%s\"}", (long long)run_id, name,
                     status);
    else n = snprintf(buf, sizeof buf, "{\"run\":%lld,\"status\":\"%s\"}", (long long)run_id, status);
    stream_publish(s, "run", run_id, buf, (size_t)n);
}

void stream_on_commit(struct stream *s, const struct writer_item *items) {
    double ct = now_wall();
    for (const struct writer_item *it = items; it; it = it->next) {
        if (!it->applied) continue; /* rejected by the store: nothing to announce */
        switch (it->kind) {
        case WRITER_STEP:
            step_event(s, it, ct);
            tick_step(s, it, ct);
            break;
        case WRITER_HELLO:
            /* the writer set the run's id (the hello carries its name);
             * run names are limited by the protocol to JSON-safe characters */
            if (it->run_id > 0) run_event(s, it->run_id, it->msg.run, "live");
            break;
        case WRITER_END:
            tick_end(s, it->run_id, 1, ct);
            run_event(s, it->run_id, NULL, proto_status_name(it->msg.status));
            break;
        case WRITER_STALE:
            tick_end(s, it->run_id, 1, ct);
            run_event(s, it->run_id, NULL, "stale");
            break;
        case WRITER_DELETE:
            tick_end(s, it->run_id, 0, ct);
            run_event(s, it->run_id, NULL, "deleted");
            break;
        default: break;
        }
    }
    tick_commit(s, ct);
}

/* ---- clients --------------------------------------------------------- */

static void deadline_from_now(struct stream_client *c) {
    clock_gettime(CLOCK_MONOTONIC, &c->deadline);
    int ms = c->s->cfg.keepalive_ms;
    c->deadline.tv_sec += ms / 1000;
    c->deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (c->deadline.tv_nsec >= 1000000000L) {
        c->deadline.tv_sec++;
        c->deadline.tv_nsec -= 1000000000L;
    }
}

/* Whether c subscribed to e (stream_sub). */
static int wanted(const struct stream_client *c, const struct ev *e) {
    if (!(e->cls & c->want)) return 0;
    if (e->cls != EV_CELLS) return 1;
    for (int i = 0; i < c->ncells; i++)
        if (strcmp(c->cells[i], e->metric) == 0) return 1;
    return 0;
}

int stream_client_subscribe(struct stream_client *c, const struct stream_sub *sub) {
    int n = sub->ncells < 0 ? 0 : sub->ncells > STREAM_MAX_CELLS ? STREAM_MAX_CELLS : sub->ncells;
    for (int i = 0; i < n; i++)
        if (!sub->cells[i] || strlen(sub->cells[i]) > PROTO_MAX_NAME) return -1;
    pthread_mutex_lock(&c->s->mu);
    c->want = EV_OTHER | (sub->ticks ? EV_TICK | (sub->layers ? EV_LAYERS : 0) | (n ? EV_CELLS : 0) : EV_STEP);
    c->ncells = sub->ticks ? n : 0;
    for (int i = 0; i < c->ncells; i++) snprintf(c->cells[i], sizeof c->cells[i], "%s", sub->cells[i]);
    pthread_mutex_unlock(&c->s->mu);
    return 0;
}

static int set_pending(struct stream_client *c, const char *text, size_t len) {
    char *p = malloc(len ? len : 1);
    if (!p) return -1;
    memcpy(p, text, len);
    free(c->pend);
    c->pend = p;
    c->plen = len;
    c->poff = 0;
    return 0;
}

struct stream_client *stream_client_open(struct stream *s, int64_t run_filter, const char *last_event_id) {
    struct stream_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->s = s;
    c->run = run_filter;
    c->want = EV_STEP | EV_OTHER;
    const char *reason = NULL;
    pthread_mutex_lock(&s->mu);
    c->next = s->last + 1;
    if (last_event_id && *last_event_id) {
        unsigned long long boot, n;
        int used = 0;
        if (sscanf(last_event_id, "%llu-%llu%n", &boot, &n, &used) != 2 || last_event_id[used])
            reason = "unreadable Last-Event-ID";
        else if (boot != s->boot) reason = "the daemon restarted since that event";
        else if (n > s->last) reason = "Last-Event-ID is ahead of the stream";
        else if (n + 1 < s->first) reason = "events after Last-Event-ID are no longer held";
        else c->next = n + 1;
    }
    if (reason) s->stats.resets++;
    s->stats.clients++;
    uint64_t now_last = s->last;
    pthread_mutex_unlock(&s->mu);

    char hello[512];
    int n = snprintf(hello, sizeof hello, "retry: 2000\n: entropyd stream\n\n");
    if (reason)
        n += snprintf(hello + n, sizeof hello - (size_t)n,
                      "id: %" PRIu64 "-%" PRIu64 "\nevent: reset\ndata: {\"reason\":\"%s\"}\n\n", s->boot, now_last,
                      reason);
    if (set_pending(c, hello, (size_t)n)) {
        stream_client_close(c);
        return NULL;
    }
    deadline_from_now(c);
    return c;
}

ssize_t stream_client_read(struct stream_client *c, char *buf, size_t max) {
    struct stream *s = c->s;
    size_t w = 0;
    if (c->poff < c->plen) {
        w = c->plen - c->poff < max ? c->plen - c->poff : max;
        memcpy(buf, c->pend + c->poff, w);
        c->poff += w;
        return (ssize_t)w;
    }
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->shutdown) {
            pthread_mutex_unlock(&s->mu);
            return -1;
        }
        if (c->next < s->first) {
            /* fell behind the ring while connected: same as resuming too late */
            s->stats.resets++;
            c->next = s->last + 1;
            int n = snprintf(buf, max, "id: %" PRIu64 "-%" PRIu64 "\nevent: reset\ndata: {\"reason\":\"%s\"}\n\n",
                             s->boot, s->last, "the client fell behind the stream");
            pthread_mutex_unlock(&s->mu);
            deadline_from_now(c);
            return n < (int)max ? n : (ssize_t)max;
        }
        while (c->next <= s->last) {
            struct ev *e = &s->ring[c->next % s->cfg.max_events];
            if ((c->run && e->run != c->run) || !wanted(c, e)) {
                c->next++;
                continue;
            }
            if (w + e->len <= max) {
                memcpy(buf + w, e->text, e->len);
                w += e->len;
                c->next++;
                continue;
            }
            if (w == 0 && set_pending(c, e->text, e->len) == 0) {
                c->next++;
                size_t k = e->len < max ? e->len : max;
                memcpy(buf, c->pend, k);
                c->poff = k;
                w = k;
            }
            break;
        }
        if (w) break;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > c->deadline.tv_sec ||
            (now.tv_sec == c->deadline.tv_sec && now.tv_nsec >= c->deadline.tv_nsec)) {
            pthread_mutex_unlock(&s->mu);
            deadline_from_now(c);
            static const char ka[] = ": keep-alive\n\n";
            w = sizeof ka - 1 < max ? sizeof ka - 1 : max;
            memcpy(buf, ka, w);
            return (ssize_t)w;
        }
        if (c->gone) {
            /* wake at least every STREAM_WATCH_MS to ask whether the client is still there */
            struct timespec wake = now;
            wake.tv_nsec += STREAM_WATCH_MS * 1000000L;
            if (wake.tv_nsec >= 1000000000L) {
                wake.tv_sec++;
                wake.tv_nsec -= 1000000000L;
            }
            if (wake.tv_sec > c->deadline.tv_sec ||
                (wake.tv_sec == c->deadline.tv_sec && wake.tv_nsec > c->deadline.tv_nsec))
                wake = c->deadline;
            pthread_cond_timedwait(&s->cv, &s->mu, &wake);
            if (c->next > s->last && c->gone(c->gone_ctx)) {
                pthread_mutex_unlock(&s->mu);
                return -1;
            }
        } else {
            pthread_cond_timedwait(&s->cv, &s->mu, &c->deadline);
        }
    }
    pthread_mutex_unlock(&s->mu);
    deadline_from_now(c);
    return (ssize_t)w;
}

void stream_client_watch(struct stream_client *c, int (*gone)(void *ctx), void *ctx) {
    c->gone = gone;
    c->gone_ctx = ctx;
}

void stream_client_close(struct stream_client *c) {
    if (!c) return;
    pthread_mutex_lock(&c->s->mu);
    c->s->stats.clients--;
    pthread_mutex_unlock(&c->s->mu);
    free(c->pend);
    free(c);
}

void stream_get_stats(struct stream *s, struct stream_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->ring_events = s->last + 1 - s->first;
    out->ring_bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}

void stream_metrics(struct stream *s, struct strbuf *b) {
    struct stream_stats ss;
    stream_get_stats(s, &ss);
    strbuf_prom(b, "entropyd_stream_clients", "gauge", "Open /api/stream connections.", (double)ss.clients);
    strbuf_prom(b, "entropyd_stream_events_total", "counter", "Events published to the stream.", (double)ss.published);
    strbuf_prom(b, "entropyd_stream_resets_total", "counter", "Stream clients that resumed from before the ring.",
                (double)ss.resets);
}
