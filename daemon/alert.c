/* alert.c: the alert engine (alert.h): its runs, held in a hash table
 * while live, fed committed items and clock ticks in order. A rule's
 * per-cell state and evaluation are alert_eval.c's, transitions and
 * verdicts alert_verdict.c's, the JSON alert_json.c's (alert_int.h holds
 * what they share); the rules it evaluates are parsed by alert_rules.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alert_int.h"

struct alert_engine *alert_engine_create(const struct alert_rules *rules) {
    struct alert_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->rules = rules;
    e->nbuckets = 64;
    if (!(e->buckets = calloc(e->nbuckets, sizeof *e->buckets))) {
        free(e);
        return NULL;
    }
    return e;
}

void alert_engine_set_resume(struct alert_engine *e, alert_resume_fn *fn, void *ctx) {
    e->resume = fn;
    e->resume_ctx = ctx;
}

static void run_free(const struct alert_rules *rules, struct run_state *r) {
    if (r->groups)
        for (int i = 0; i < rules->n; i++) alert_group_free(&r->groups[i]);
    free(r->groups);
    free(r->name);
    free(r);
}

static void clear_transitions(struct alert_engine *e) {
    for (int i = 0; i < e->ntr; i++) free(e->tr_cells[i]);
    e->ntr = 0;
    e->verdict_changed = 0;
    while (e->released) {
        struct run_state *n = e->released->hnext;
        run_free(e->rules, e->released);
        e->released = n;
    }
}

void alert_engine_destroy(struct alert_engine *e) {
    if (!e) return;
    clear_transitions(e);
    free(e->tr);
    free(e->tr_cells);
    for (size_t b = 0; b < e->nbuckets; b++)
        while (e->buckets[b]) {
            struct run_state *n = e->buckets[b]->hnext;
            run_free(e->rules, e->buckets[b]);
            e->buckets[b] = n;
        }
    free(e->buckets);
    free(e);
}

static size_t bucket_of(const struct alert_engine *e, int64_t id) {
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 32) & (e->nbuckets - 1);
}

/* Doubles the table (best effort: a failed grow keeps the old one). */
static void runs_grow(struct alert_engine *e) {
    size_t nb = e->nbuckets * 2;
    struct run_state **b = calloc(nb, sizeof *b);
    if (!b) return;
    struct run_state **old = e->buckets;
    size_t onb = e->nbuckets;
    e->buckets = b;
    e->nbuckets = nb;
    for (size_t i = 0; i < onb; i++)
        while (old[i]) {
            struct run_state *r = old[i];
            old[i] = r->hnext;
            size_t k = bucket_of(e, r->id);
            r->hnext = b[k];
            b[k] = r;
        }
    free(old);
}

static struct run_state *run_find(struct alert_engine *e, int64_t id, int create) {
    for (struct run_state *r = e->buckets[bucket_of(e, id)]; r; r = r->hnext)
        if (r->id == id) return r;
    if (!create) return NULL;
    struct run_state *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = id;
    r->last_step = -1;
    r->vsince = -1;
    char nm[32];
    snprintf(nm, sizeof nm, "run-%lld", (long long)id);
    r->name = strdup(nm);
    r->groups = calloc((size_t)(e->rules->n ? e->rules->n : 1), sizeof *r->groups);
    if (!r->name || !r->groups) {
        run_free(e->rules, r);
        return NULL;
    }
    if (e->nruns >= 2 * e->nbuckets) runs_grow(e);
    size_t k = bucket_of(e, id);
    r->hnext = e->buckets[k];
    e->buckets[k] = r;
    e->nruns++;
    return r;
}

/* Takes a run out of the table; it is freed at the next feed (the
 * transitions of this one still point at its name). */
static void run_release(struct alert_engine *e, struct run_state *r) {
    for (struct run_state **p = &e->buckets[bucket_of(e, r->id)]; *p; p = &(*p)->hnext)
        if (*p == r) {
            *p = r->hnext;
            e->nruns--;
            r->hnext = e->released;
            e->released = r;
            return;
        }
}

/* Bytes a run's state holds. */
static uint64_t run_bytes(const struct alert_engine *e, const struct run_state *r) {
    uint64_t b = sizeof *r + (size_t)e->rules->n * sizeof *r->groups;
    for (int k = 0; k < e->rules->n; k++) b += alert_group_bytes(&e->rules->rules[k], &r->groups[k]);
    return b;
}

void alert_engine_usage(const struct alert_engine *e, uint64_t *runs, uint64_t *bytes) {
    uint64_t b = 0;
    for (size_t i = 0; i < e->nbuckets; i++)
        for (const struct run_state *r = e->buckets[i]; r; r = r->hnext) b += run_bytes(e, r);
    *runs = e->nruns;
    *bytes = b;
}

uint64_t alert_released_bytes(const struct alert_engine *e) {
    uint64_t b = 0;
    for (const struct run_state *r = e->released; r; r = r->hnext) b += run_bytes(e, r);
    return b;
}

int alert_feed(struct alert_engine *e, const struct writer_item *it, double now) {
    clear_transitions(e);
    struct run_state *r = run_find(e, it->run_id, 1);
    if (!r) return -1;
    /* the daemon's clock, never the trainer's `time` (data only): a skewed
     * trainer clock would make stalled fire and resolve at every step, and
     * give Alertmanager a startsAt it rejects */
    double time = now;
    int n = 0, t;
    switch (it->kind) {
    case WRITER_HELLO:
        if (it->msg.run[0]) {
            char *name = strdup(it->msg.run);
            if (!name) return -1; /* keeps the old name */
            free(r->name);
            r->name = name;
        }
        r->layers = it->msg.layers;
        r->heads = it->msg.heads;
        r->live = 1;
        r->stale = r->failed = 0;
        r->last_seen = time;
        alert_verdict_update(e, r, 1);
        return 0;
    case WRITER_STEP: {
        const struct proto_msg *m = &it->msg;
        if (r->layers == 0) { /* no hello seen (engine started mid-run): learn the shape from the data */
            for (uint32_t i = 0; i < m->nmetrics; i++)
                if (m->metrics[i].kind == PROTO_HEAD) {
                    r->layers = m->metrics[i].rows;
                    r->heads = m->metrics[i].cols;
                }
        }
        if (r->last_step >= 0 && m->step <= r->last_step) {
            if ((t = alert_run_rewind(e, r, m->step, time)) < 0) return -1;
            n += t;
        }
        r->last_step = m->step;
        r->last_seen = time;
        r->live = 1;
        r->stale = 0;
        e->stats.steps++;
        struct timespec t0, t1; /* CPU time of this thread: the cost, whatever else runs */
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        for (int i = 0; i < e->rules->n; i++) {
            const struct alert_rule *rule = &e->rules->rules[i];
            if (rule->op == ALERT_OP_STALLED) continue;
            t = alert_eval_rule(e, rule, r, &r->groups[i], m, m->step, time);
            if (t < 0) return -1;
            n += t;
        }
        t = alert_stalled_eval(e, r, time, m->step, 1);
        if (t < 0) return -1;
        n += t;
        alert_verdict_update(e, r, 0);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        e->stats.eval_ms += (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        return n;
    }
    case WRITER_EVENT:
        r->last_seen = time;
        t = alert_stalled_eval(e, r, time, r->last_step, 1);
        if (t >= 0) alert_verdict_update(e, r, 0);
        return t;
    case WRITER_END:
        /* the verdict is taken before the end resolves what fired: a
         * collapse still firing at the end is the run's verdict */
        r->live = 0;
        r->stale = 0;
        r->failed = it->msg.status == PROTO_FAILED;
        alert_verdict_update(e, r, 1);
        t = alert_resolve_all(e, r, r->last_step, time, ALERT_REASON_RUN_ENDED);
        run_release(e, r);
        return t;
    case WRITER_STALE:
        r->live = 0;
        r->stale = 1;
        t = alert_stalled_eval(e, r, time, r->last_step, 1);
        if (t >= 0) alert_verdict_update(e, r, 0);
        return t;
    default: /* WRITER_DELETE and anything newer: forget the run */
        t = alert_resolve_all(e, r, r->last_step, time, ALERT_REASON_RUN_DELETED);
        r->live = 0;
        run_release(e, r);
        return t;
    }
}

int alert_tick(struct alert_engine *e, double now) {
    clear_transitions(e);
    int n = 0;
    for (size_t b = 0; b < e->nbuckets; b++)
        for (struct run_state *r = e->buckets[b]; r; r = r->hnext) {
            if (!r->live) continue;
            int t = alert_stalled_eval(e, r, now, r->last_step, 0);
            if (t < 0) return -1;
            n += t;
            /* one verdict per tick (the API holds one): the next ticks report the rest */
            if (t > 0 || r->vdirty) {
                r->vdirty = e->verdict_changed;
                if (!e->verdict_changed) alert_verdict_update(e, r, 0);
            }
        }
    return n;
}

const struct alert_verdict *alert_verdict_changed(const struct alert_engine *e) {
    return e->verdict_changed ? &e->verdict : NULL;
}

const struct alert_transition *alert_transition_at(const struct alert_engine *e, int i) {
    return i >= 0 && i < e->ntr ? &e->tr[i] : NULL;
}

void alert_get_stats(const struct alert_engine *e, struct alert_stats *out) { *out = e->stats; }
