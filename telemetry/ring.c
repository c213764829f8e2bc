/* ring.c -- the bounded single-producer ring of preallocated slots: the
 * producer's hot path (telemetry_step_*, no syscall, no lock, no
 * allocation) and the sender's end, which formats each slot as a line and
 * hands it to the spool. */
#include "telemetry_int.h"

#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Validates and copies a metric name; -1 when invalid. */
static int copy_name(char *dst, const char *name) {
    size_t n = strnlen(name, TELEMETRY_NAME_MAX + 1);
    if (!proto_valid_name(name, n)) return -1;
    memcpy(dst, name, n + 1);
    return 0;
}

telemetry_step *telemetry_step_begin(telemetry *t, int64_t step, double time) {
    size_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
    size_t tl = atomic_load_explicit(&t->tail, memory_order_acquire);
    t->open = NULL;
    if (step < 0) return NULL;
    if (h - tl >= t->cap) {
        ST_ADD(t, st_dropped_queue, 1);
        return NULL;
    }
    telemetry_step *s = &t->slots[h % t->cap];
    s->kind = MSG_STEP;
    s->step = step;
    s->time = isfinite(time) ? time : -1;
    s->n_scalar = s->n_layer = s->n_head = 0;
    t->open = s;
    return s;
}

int telemetry_step_scalar(telemetry_step *s, const char *name, double value) {
    if (!s || !name) return TELEMETRY_EINVAL;
    if (s->n_scalar == s->owner->max_s) return TELEMETRY_EFULL;
    if (copy_name(s->scalar_names[s->n_scalar], name)) return TELEMETRY_EINVAL;
    s->scalars[s->n_scalar++] = (float)value;
    return TELEMETRY_OK;
}

float *telemetry_step_layer_buf(telemetry_step *s, const char *name) {
    if (!s || !name || s->n_layer == s->owner->max_l) return NULL;
    if (copy_name(s->layer_names[s->n_layer], name)) return NULL;
    return s->layers + (size_t)s->n_layer++ * (size_t)s->owner->L;
}

float *telemetry_step_heads_buf(telemetry_step *s, const char *name) {
    if (!s || !name || s->n_head == s->owner->max_h) return NULL;
    if (copy_name(s->head_names[s->n_head], name)) return NULL;
    return s->heads + (size_t)s->n_head++ * (size_t)s->owner->L * (size_t)s->owner->H;
}

int telemetry_step_layer(telemetry_step *s, const char *name, const float *values) {
    if (!s || !name || !values) return TELEMETRY_EINVAL;
    if (s->n_layer == s->owner->max_l) return TELEMETRY_EFULL;
    float *dst = telemetry_step_layer_buf(s, name);
    if (!dst) return TELEMETRY_EINVAL;
    memcpy(dst, values, (size_t)s->owner->L * sizeof(float));
    return TELEMETRY_OK;
}

int telemetry_step_heads(telemetry_step *s, const char *name, const float *values) {
    if (!s || !name || !values) return TELEMETRY_EINVAL;
    if (s->n_head == s->owner->max_h) return TELEMETRY_EFULL;
    float *dst = telemetry_step_heads_buf(s, name);
    if (!dst) return TELEMETRY_EINVAL;
    memcpy(dst, values, (size_t)s->owner->L * (size_t)s->owner->H * sizeof(float));
    return TELEMETRY_OK;
}

static void publish(telemetry *t) {
    size_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
    atomic_store_explicit(&t->head, h + 1, memory_order_release);
    ST_ADD(t, st_enqueued, 1);
    t->open = NULL;
    /* A paced sender sleeps up to its interval (conn.c): once the ring is
     * half full it is woken, one system call until it has drained, so that
     * a fast loop is not dropped while it sleeps. */
    if (t->interval_ms && h + 1 - atomic_load_explicit(&t->tail, memory_order_relaxed) >= t->cap / 2 &&
        !atomic_exchange_explicit(&t->kicked, 1, memory_order_relaxed))
        telemetry_wake(t);
}

int telemetry_step_commit(telemetry *t, telemetry_step *s) {
    if (!s || s != t->open) return TELEMETRY_EINVAL;
    publish(t);
    return TELEMETRY_OK;
}

/* Copies n names into the slot's table; -1 when one is bad. */
static int copy_names(name_t *dst, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!names[i] || copy_name(dst[i], names[i])) return -1;
    return 0;
}

int telemetry_step_log(telemetry *t, int64_t step, double time, int n_scalar, const char *const *scalar_names,
                       const double *scalars, int n_layer, const char *const *layer_names, const float *layers,
                       int n_head, const char *const *head_names, const float *heads) {
    if (!t || step < 0 || n_scalar < 0 || n_layer < 0 || n_head < 0 || n_scalar > t->max_s || n_layer > t->max_l ||
        n_head > t->max_h || (n_scalar && (!scalar_names || !scalars)) || (n_layer && (!layer_names || !layers)) ||
        (n_head && (!head_names || !heads)))
        return TELEMETRY_EINVAL;
    telemetry_step *s = telemetry_step_begin(t, step, time);
    if (!s) return TELEMETRY_EFULL;
    if (copy_names(s->scalar_names, scalar_names, n_scalar) || copy_names(s->layer_names, layer_names, n_layer) ||
        copy_names(s->head_names, head_names, n_head)) {
        t->open = NULL; /* the slot was never published: dropped unseen */
        return TELEMETRY_EINVAL;
    }
    for (int i = 0; i < n_scalar; i++) s->scalars[i] = (float)scalars[i];
    size_t L = (size_t)t->L, LH = L * (size_t)t->H;
    if (n_layer) memcpy(s->layers, layers, (size_t)n_layer * L * sizeof(float));
    if (n_head) memcpy(s->heads, heads, (size_t)n_head * LH * sizeof(float));
    s->n_scalar = n_scalar;
    s->n_layer = n_layer;
    s->n_head = n_head;
    publish(t);
    return TELEMETRY_OK;
}

static int valid_level(const char *l) { return proto_level_parse(l) >= 0; }

/* What an end may say (live and stale are the daemon's). */
int telemetry_valid_status(const char *s) { return proto_status_parse(s) >= PROTO_FINISHED; }

/* A non-step message into the ring. text (may be NULL) is taken over. */
int telemetry_ring_put(telemetry *t, int kind, const char *level, char *text) {
    size_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
    size_t tl = atomic_load_explicit(&t->tail, memory_order_acquire);
    if (h - tl >= t->cap) {
        free(text);
        ST_ADD(t, st_dropped_queue, 1);
        return TELEMETRY_EFULL;
    }
    telemetry_step *s = &t->slots[h % t->cap];
    s->kind = kind;
    snprintf(s->level, sizeof s->level, "%s", level);
    s->text = text;
    s->time = now_wall();
    publish(t);
    return TELEMETRY_OK;
}

int telemetry_event(telemetry *t, const char *level, const char *text) {
    if (!t || !valid_level(level) || !text) return TELEMETRY_EINVAL;
    size_t n = strnlen(text, EVENT_TEXT_MAX);
    char *copy = malloc(n + 1);
    if (!copy) return TELEMETRY_EFULL;
    memcpy(copy, text, n);
    copy[n] = 0;
    return telemetry_ring_put(t, MSG_EVENT, level, copy);
}

/* Carves every slot's arrays out of one allocation. */
int telemetry_ring_alloc(telemetry *t) {
    size_t L = (size_t)t->L, LH = L * (size_t)t->H;
    size_t per = (size_t)t->max_s * (sizeof(name_t) + sizeof(float)) +
                 (size_t)t->max_l * (sizeof(name_t) + L * sizeof(float)) +
                 (size_t)t->max_h * (sizeof(name_t) + LH * sizeof(float));
    per = (per + 63) & ~(size_t)63;
    if (t->cap == 0) { /* default: 256 slots, or fewer within 64 MiB (big models) */
        t->cap = ((size_t)64 << 20) / per;
        if (t->cap > 256) t->cap = 256;
        if (t->cap < 16) t->cap = 16;
    }
    t->slots = calloc(t->cap, sizeof *t->slots);
    t->slot_mem = malloc(per * t->cap);
    if (!t->slots || !t->slot_mem) return -1;
    /* Touch every page now, so the hot path never takes a page fault.
     * (Not memset to 0: compilers turn malloc + memset(0) into calloc,
     * which leaves fresh mmap()ed pages untouched.) */
    for (size_t off = 0; off < per * t->cap; off += 4096) ((volatile char *)t->slot_mem)[off] = 1;
    for (size_t i = 0; i < t->cap; i++) {
        telemetry_step *s = &t->slots[i];
        char *m = t->slot_mem + i * per;
        s->owner = t;
        /* floats first: the 65-byte names would misalign them */
        s->scalars = (float *)m;
        m += (size_t)t->max_s * sizeof(float);
        s->layers = (float *)m;
        m += (size_t)t->max_l * L * sizeof(float);
        s->heads = (float *)m;
        m += (size_t)t->max_h * LH * sizeof(float);
        s->scalar_names = (name_t *)m;
        m += (size_t)t->max_s * sizeof(name_t);
        s->layer_names = (name_t *)m;
        m += (size_t)t->max_l * sizeof(name_t);
        s->head_names = (name_t *)m;
    }
    return 0;
}

/* Formats the slot's JSON body at t->fmt + BODY_AT; returns its length. */
static size_t format_body(telemetry *t, const telemetry_step *s) {
    char *b = t->fmt + BODY_AT;
    if (s->kind == MSG_EVENT)
        return proto_write_event_body(b, proto_level_parse(s->level), s->text, strlen(s->text), s->time);
    if (s->kind == MSG_END) return proto_write_end_body(b, proto_status_parse(s->level));
    struct proto_step_view v = {
        .step = s->step,
        .time = s->time,
        .L = t->L,
        .H = t->H,
        .n_scalar = s->n_scalar,
        .n_layer = s->n_layer,
        .n_head = s->n_head,
        .scalar_names = (const proto_name *)s->scalar_names,
        .scalars = s->scalars,
        .layer_names = (const proto_name *)s->layer_names,
        .layers = s->layers,
        .head_names = (const proto_name *)s->head_names,
        .heads = s->heads,
    };
    return proto_write_step_body(b, &v);
}

/* Sends a warn event about losses once the spool has room for it. */
static void report_drops(telemetry *t) {
    uint64_t q = ST_GET(t, st_dropped_queue), s = ST_GET(t, st_dropped_spool), o = ST_GET(t, st_dropped_oversize);
    if (q + s + o == t->reported_drops || t->spool_total + t->wlen + 1024 > t->spool_max) return;
    char text[256];
    int tn =
        snprintf(text, sizeof text,
                 "telemetry client dropped %llu messages so far (queue full: %llu, spool full: %llu, "
                 "over 4 MiB: %llu)",
                 (unsigned long long)(q + s + o), (unsigned long long)q, (unsigned long long)s, (unsigned long long)o);
    char *b = t->fmt + BODY_AT;
    size_t n = proto_write_event_body(b, PROTO_WARN, text, (size_t)tn, now_wall());
    if (telemetry_spool_add(t, b, n) == 0) t->reported_drops = q + s + o;
}

/* Moves up to DRAIN_BATCH messages from the ring into the spool. */
int telemetry_ring_drain(telemetry *t) {
    size_t tl = atomic_load_explicit(&t->tail, memory_order_relaxed);
    size_t h = atomic_load_explicit(&t->head, memory_order_acquire);
    int n = 0;
    atomic_store_explicit(&t->kicked, 0, memory_order_relaxed);
    if (tl != h) report_drops(t);
    while (tl != h && n < DRAIN_BATCH) {
        telemetry_step *s = &t->slots[tl % t->cap];
        size_t blen = format_body(t, s);
        free(s->text);
        s->text = NULL;
        atomic_store_explicit(&t->tail, ++tl, memory_order_release);
        /* over its run's line limit (proto.h): the daemon would refuse it */
        if (blen + SEQ_PREFIX_MAX > proto_line_max((int64_t)t->L * t->H)) ST_ADD(t, st_dropped_oversize, 1);
        else telemetry_spool_add(t, t->fmt + BODY_AT, blen);
        n++;
    }
    telemetry_spool_flush(t);
    if (n) atomic_fetch_add_explicit(&t->done, (uint64_t)n, memory_order_release);
    return n;
}
