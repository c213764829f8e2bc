/* stream.c: the SSE event ring. See stream.h for the contract. */
#include "stream.h"

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

struct ev {
    uint64_t n;
    int64_t run;
    char *text;  /* "id: ..\nevent: ..\ndata: ..\n\n" */
    size_t len;
};

struct stream {
    struct stream_config cfg;
    uint64_t boot;            /* start time in ms: the id prefix */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* signalled on publish and shutdown */
    struct ev *ring;          /* events first..last live at index n % max_events */
    uint64_t first, last;     /* first > last when empty */
    size_t bytes;
    int shutdown;
    struct stream_stats stats;
};

struct stream_client {
    struct stream *s;
    int64_t run;
    uint64_t next;            /* the next event number to deliver */
    int started;
    char *pend;               /* text not yet handed out */
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

void stream_destroy(struct stream *s) {
    if (!s) return;
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

int stream_publish(struct stream *s, const char *kind, int64_t run_id, const char *json, size_t len) {
    size_t cap = len + 128;
    char *text = malloc(cap);
    if (!text) return -1;
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->last + 1;
    int hl = snprintf(text, cap, "id: %" PRIu64 "-%" PRIu64 "\nevent: %s\ndata: ", s->boot, n, kind);
    memcpy(text + hl, json, len);
    memcpy(text + hl + len, "\n\n", 2);
    size_t tl = (size_t)hl + len + 2;
    while (s->first <= s->last &&
           (s->last - s->first + 1 >= s->cfg.max_events || s->bytes + tl > s->cfg.max_bytes))
        drop_oldest(s);
    struct ev *e = &s->ring[n % s->cfg.max_events];
    e->n = n;
    e->run = run_id;
    e->text = text;
    e->len = tl;
    s->bytes += tl;
    s->last = n;
    s->stats.published++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
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

static void run_event(struct stream *s, int64_t run_id, const char *name, const char *status) {
    char buf[512];
    int n;
    if (name) n = snprintf(buf, sizeof buf, "{\"run\":%lld,\"name\":\"%s\",\"status\":\"%s\"}", (long long)run_id, name, status);
    else n = snprintf(buf, sizeof buf, "{\"run\":%lld,\"status\":\"%s\"}", (long long)run_id, status);
    stream_publish(s, "run", run_id, buf, (size_t)n);
}

void stream_on_commit(struct stream *s, const struct writer_item *items) {
    double ct = now_wall();
    for (const struct writer_item *it = items; it; it = it->next) {
        if (!it->applied) continue; /* rejected by the store: nothing to announce */
        switch (it->kind) {
        case WRITER_STEP: step_event(s, it, ct); break;
        case WRITER_HELLO:
            /* the writer set the run's id (the hello carries its name);
             * run names are limited by the protocol to JSON-safe characters */
            if (it->run_id > 0) run_event(s, it->run_id, it->msg.run, "live");
            break;
        case WRITER_END: run_event(s, it->run_id, NULL, proto_status_name(it->msg.status)); break;
        case WRITER_STALE: run_event(s, it->run_id, NULL, "stale"); break;
        case WRITER_DELETE: run_event(s, it->run_id, NULL, "deleted"); break;
        default: break;
        }
    }
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
    const char *reason = NULL;
    pthread_mutex_lock(&s->mu);
    c->next = s->last + 1;
    if (last_event_id && *last_event_id) {
        unsigned long long boot, n;
        int used = 0;
        if (sscanf(last_event_id, "%llu-%llu%n", &boot, &n, &used) != 2 || last_event_id[used])
            reason = "unreadable Last-Event-ID";
        else if (boot != s->boot)
            reason = "the daemon restarted since that event";
        else if (n > s->last)
            reason = "Last-Event-ID is ahead of the stream";
        else if (n + 1 < s->first)
            reason = "events after Last-Event-ID are no longer held";
        else
            c->next = n + 1;
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
            int n = snprintf(buf, max, "id: %" PRIu64 "-%" PRIu64 "\nevent: reset\ndata: {\"reason\":\"%s\"}\n\n", s->boot,
                             s->last, "the client fell behind the stream");
            pthread_mutex_unlock(&s->mu);
            deadline_from_now(c);
            return n < (int)max ? n : (ssize_t)max;
        }
        while (c->next <= s->last) {
            struct ev *e = &s->ring[c->next % s->cfg.max_events];
            if (c->run && e->run != c->run) {
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
            if (wake.tv_sec > c->deadline.tv_sec || (wake.tv_sec == c->deadline.tv_sec && wake.tv_nsec > c->deadline.tv_nsec))
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
