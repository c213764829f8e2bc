/* alerter.c: alert engine + storage + stream + trainer + notifier. See alerter.h. */
#include "alerter.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <malloc.h>

#include "now.h"
#include "proto.h"
#include "query.h"
#include "strbuf.h"
#include "stream.h"

/* A run whose alert state was at least this large gives memory back when it
 * ends (alerter_on_commit). */
#define ALERTER_RELEASE_BYTES (16u << 20)

/* A verdict a step changed, waiting to ride in the writer's next
 * transaction (precommit, the writer's hook). */
struct pending_verdict {
    int64_t run_id;
    const char *state; /* alert_verdict_name: static */
    int64_t since_step;
    char *heads;      /* "[[l,h],...]", malloc'd */
    char *evidence;   /* JSON object or NULL, malloc'd */
    const char *rule; /* the rule's name (the rules outlive the alerter's use) or NULL */
    int in_txn;       /* written into the transaction being committed */
};

struct alerter {
    struct alert_rules *rules;
    struct alert_engine *engine;
    struct notify *notify;
    struct store *store;
    struct stream *stream;
    struct writer *writer;
    struct query_pool *pool; /* may be NULL: no episode of an earlier daemon is resumed */
    pthread_mutex_t mu;      /* guards stats */
    struct alerter_stats stats;
    /* Writer thread only: the verdicts steps changed since the last commit
     * that stored them, one per run (the newest). */
    struct pending_verdict *pv;
    size_t npv, cappv;
};

/* alert_resume_fn: the newest episode of (run, rule) still firing in the
 * database, which an earlier daemon opened (this one resolves its own
 * before they can fire again). Read through a pool connection: it is rare
 * (a group's first firing in this process) and needs no write lock. */
static int resume_episode(void *ctx, int64_t run_id, const char *rule, double *starts_at, int64_t *start_step) {
    struct alerter *m = ctx;
    char err[256];
    struct query *q = query_acquire(m->pool, err, sizeof err);
    if (!q) return 0;
    struct strbuf b = {0};
    int rc = query_alerts(q, "firing", run_id, 256, &b, err, sizeof err);
    query_release(m->pool, q);
    int found = 0;
    cJSON *arr = rc == QUERY_OK ? cJSON_ParseWithLength(b.p, b.len) : NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, arr) { /* newest first */
        const char *r = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "rule"));
        const cJSON *sa = cJSON_GetObjectItemCaseSensitive(a, "starts_at");
        const cJSON *ss = cJSON_GetObjectItemCaseSensitive(a, "start_step");
        if (r && !strcmp(r, rule) && cJSON_IsNumber(sa) && cJSON_IsNumber(ss)) {
            *starts_at = sa->valuedouble;
            *start_step = (int64_t)ss->valuedouble;
            found = 1;
            break;
        }
    }
    cJSON_Delete(arr);
    strbuf_free(&b);
    return found;
}

struct alerter *alerter_create(const struct alerter_config *cfg, char *err, size_t errlen) {
    struct alerter *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->store = cfg->store;
    m->stream = cfg->stream;
    m->rules = alert_rules_load(cfg->rules_path, err, errlen);
    if (!m->rules) goto fail;
    m->engine = alert_engine_create(m->rules);
    if (!m->engine) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    m->pool = cfg->pool;
    if (m->pool) alert_engine_set_resume(m->engine, resume_episode, m);
    m->notify = notify_create(&cfg->notify, err, errlen);
    if (!m->notify) goto fail;
    return m;
fail:
    alerter_destroy(m, 0);
    return NULL;
}

static int precommit(void *ctx);

void alerter_set_writer(struct alerter *m, struct writer *w) {
    m->writer = w;
    if (w) writer_set_precommit(w, precommit, m);
}

void alerter_destroy(struct alerter *m, int wait_ms) {
    if (!m) return;
    notify_destroy(m->notify, wait_ms);
    for (size_t i = 0; i < m->npv; i++) {
        free(m->pv[i].heads);
        free(m->pv[i].evidence);
    }
    free(m->pv);
    alert_engine_destroy(m->engine);
    alert_rules_free(m->rules);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static char *cells_json(const struct alert_transition *t) {
    size_t cap = 16 + (size_t)t->ncells * 64, off = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[off++] = '[';
    for (int i = 0; i < t->ncells; i++) {
        const struct alert_cell *c = &t->cells[i];
        char v[32];
        if (isfinite(c->value)) snprintf(v, sizeof v, "%.6g", c->value);
        else snprintf(v, sizeof v, "null");
        /* an axis the rule's scope lacks (-1) is left out, as in the alert object */
        off += (size_t)snprintf(s + off, cap - off, "%s{", i ? "," : "");
        if (c->layer >= 0) off += (size_t)snprintf(s + off, cap - off, "\"layer\":%d,", c->layer);
        if (c->head >= 0) off += (size_t)snprintf(s + off, cap - off, "\"head\":%d,", c->head);
        off += (size_t)snprintf(s + off, cap - off, "\"value\":%s}", v);
    }
    snprintf(s + off, cap - off, "]");
    return s;
}

static const char *transition_name(int state) {
    return state == ALERT_FIRING ? "firing" : state == ALERT_RESOLVED ? "resolved" : "update";
}

/* Sends one transition everywhere it goes. step_time: the "time" of the
 * step message whose evaluation made it (the trainer's clock), echoed to
 * the trainer so that it can tell verdicts on steps a rollback abandoned
 * from fresh ones; NAN when none (a tick, or a step without time). */
static void dispatch(struct alerter *m, const struct alert_transition *t, int in_txn, double step_time) {
    char *json = alert_transition_json(t);
    char *cells = cells_json(t);
    char fp[20];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)t->fingerprint);
    if (!json || !cells) {
        fprintf(stderr, "entropyd: out of memory formatting an alert\n");
        goto out;
    }
    struct store_alert sa = {.run_id = t->run_id,
                             .rule = t->rule->name,
                             .severity = t->rule->severity,
                             .fingerprint = fp,
                             .transition = transition_name(t->state),
                             .time = t->at,
                             .starts_at = t->starts_at,
                             .ends_at = t->ends_at,
                             .start_step = t->start_step,
                             .step = t->step,
                             .value = t->value,
                             .cells_json = cells,
                             .payload = json,
                             .reason = t->state == ALERT_RESOLVED ? alert_reason_name(t->reason) : NULL};
    int failed = 0;
    if (!in_txn) failed = store_begin(m->store);
    if (!failed) failed = store_alert_transition(m->store, &sa, NULL);
    if (!in_txn && !failed) failed = store_commit(m->store);
    if (failed) {
        if (!in_txn) store_rollback(m->store);
        fprintf(stderr, "entropyd: could not store alert %s (%s): %s\n", t->rule->name, sa.transition,
                store_errmsg(m->store));
        pthread_mutex_lock(&m->mu);
        m->stats.store_errors++;
        pthread_mutex_unlock(&m->mu);
    }
    /* the run's trainer and the event stream get the protocol's alert line (proto.h) */
    struct proto_alert_view av = {.transition = sa.transition,
                                  .rule = t->rule->name,
                                  .severity = t->rule->severity,
                                  .start_step = t->start_step,
                                  .step = t->step,
                                  .step_time = step_time,
                                  .alert = json};
    char *line = malloc(proto_alert_max(&av));
    if (line) proto_write_alert(line, &av);
    if (line) {
        if (m->stream) stream_publish(m->stream, "alert", t->run_id, line, strlen(line));
        if (m->writer) writer_post_line(m->writer, t->run_id, line);
        free(line);
    } else {
        fprintf(stderr, "entropyd: out of memory formatting an alert\n");
    }
    if (t->state != ALERT_UPDATE && notify_post(m->notify, sa.transition, t->rule->name, t->run_name, json, t->resumed))
        fprintf(stderr, "entropyd: out of memory queueing a notification\n");
    pthread_mutex_lock(&m->mu);
    if (t->state == ALERT_FIRING) {
        m->stats.firing++;
        m->stats.resumed += (uint64_t)t->resumed;
    } else if (t->state == ALERT_RESOLVED && m->stats.firing > 0) m->stats.firing--;
    pthread_mutex_unlock(&m->mu);
out:
    free(json);
    free(cells);
}

static void dispatch_all(struct alerter *m, int n, double step_time) {
    for (int i = 0; i < n; i++) {
        const struct alert_transition *t = alert_transition_at(m->engine, i);
        if (t) dispatch(m, t, 0, step_time);
    }
}

/* The verdict's heads as JSON, "[[layer,head],...]" (malloc'd, or NULL). */
static char *verdict_heads(const struct alert_verdict *v) {
    size_t cap = 4 + (size_t)v->ncells * 24, off = 0;
    char *heads = malloc(cap);
    if (!heads) return NULL;
    off += (size_t)snprintf(heads, cap, "[");
    for (int i = 0; i < v->ncells; i++)
        off += (size_t)snprintf(heads + off, cap - off, "%s[%d,%d]", i ? "," : "", v->cells[i].layer, v->cells[i].head);
    snprintf(heads + off, cap - off, "]");
    return heads;
}

/* The verdict's evidence beside its heads as JSON (malloc'd), or NULL when
 * it has none (or out of memory: the verdict is stored without it). */
static char *verdict_evidence(const struct alert_verdict *v) {
    if (!isfinite(v->loss_opening)) return NULL;
    char *s = NULL;
    if (asprintf(&s, "{\"loss_opening\":%.6g,\"loss_smoothed\":%.6g,\"train_below\":%.6g}", v->loss_opening,
                 isfinite(v->loss_smoothed) ? v->loss_smoothed : v->loss_opening, v->train_below) < 0)
        return NULL;
    return s;
}

static void verdict_failed(struct alerter *m, int64_t run_id) {
    fprintf(stderr, "entropyd: could not store the verdict of run %lld: %s\n", (long long)run_id,
            store_errmsg(m->store));
    pthread_mutex_lock(&m->mu);
    m->stats.store_errors++;
    pthread_mutex_unlock(&m->mu);
}

static int verdict_write(struct alerter *m, const struct pending_verdict *p) {
    return store_run_verdict(m->store, p->run_id, p->state, p->since_step, p->heads, p->rule, p->evidence);
}

static void pending_drop(struct alerter *m, size_t i) {
    free(m->pv[i].heads);
    free(m->pv[i].evidence);
    m->pv[i] = m->pv[--m->npv];
}

/* Drops run_id's pending verdict (a newer one was stored). */
static void pending_forget(struct alerter *m, int64_t run_id) {
    for (size_t i = 0; i < m->npv; i++)
        if (m->pv[i].run_id == run_id) {
            pending_drop(m, i);
            return;
        }
}

/* Stores the pending verdicts in a small transaction of their own (a tick
 * with no batch since, so that a run gone quiet has its verdict within a
 * second). */
static void pending_flush(struct alerter *m) {
    if (!m->npv) return;
    int failed = store_begin_nowait(m->store); /* a busy database must not stall the writer's batches */
    for (size_t i = 0; !failed && i < m->npv; i++) failed = verdict_write(m, &m->pv[i]);
    if (!failed) failed = store_commit(m->store);
    if (failed) {
        store_rollback(m->store);
        verdict_failed(m, m->pv[0].run_id); /* kept: the next batch or tick tries again */
        return;
    }
    while (m->npv) pending_drop(m, m->npv - 1);
}

/* writer_precommit_fn: the pending verdicts go into the batch's
 * transaction, just before its commit (again if the batch is applied
 * again); they are dropped once it committed (alerter_on_commit). */
static int precommit(void *ctx) {
    struct alerter *m = ctx;
    for (size_t i = 0; i < m->npv; i++) {
        if (verdict_write(m, &m->pv[i])) {
            verdict_failed(m, m->pv[i].run_id);
            return -1;
        }
        m->pv[i].in_txn = 1;
    }
    return 0;
}

/* A run's new verdict (alert.h). One a step changed waits for the writer's
 * next transaction (precommit) or the next tick, whichever comes first: at a
 * step whose heads cross a threshold back and forth it changes at every
 * step, and a transaction of its own per change cost the daemon as much as
 * a third of its CPU at a training loop's pace. Any other (a hello, an end,
 * stale, an event, a tick) is stored at once in a small transaction of its
 * own, before the acks of the batch that caused it go out: an acked end has
 * its final verdict stored. */
static void store_verdict(struct alerter *m, const struct alert_verdict *v, int defer) {
    char *heads = verdict_heads(v);
    if (!heads) {
        fprintf(stderr, "entropyd: out of memory storing the verdict of run %lld\n", (long long)v->run_id);
        return;
    }
    struct pending_verdict p = {.run_id = v->run_id,
                                .state = alert_verdict_name(v->state),
                                .since_step = v->since_step,
                                .heads = heads,
                                .rule = v->rule ? v->rule->name : NULL,
                                .evidence = verdict_evidence(v)};
    if (defer) {
        size_t i = 0;
        while (i < m->npv && m->pv[i].run_id != v->run_id) i++;
        if (i == m->npv) {
            if (m->npv == m->cappv) {
                size_t cap = m->cappv ? 2 * m->cappv : 8;
                struct pending_verdict *pv = realloc(m->pv, cap * sizeof *pv);
                if (!pv) goto now; /* then at once, as before */
                m->pv = pv;
                m->cappv = cap;
            }
            m->npv++;
        } else {
            free(m->pv[i].heads);
            free(m->pv[i].evidence);
        }
        m->pv[i] = p;
        return;
    }
now:
    pending_forget(m, v->run_id);
    int failed = store_begin_nowait(m->store);
    if (!failed) failed = verdict_write(m, &p);
    if (!failed) failed = store_commit(m->store);
    if (failed) {
        store_rollback(m->store);
        verdict_failed(m, v->run_id);
    }
    free(heads);
    free(p.evidence);
}

/* Copies the engine's counters for other threads to read. */
static void publish_stats(struct alerter *m) {
    pthread_mutex_lock(&m->mu);
    alert_get_stats(m->engine, &m->stats.engine);
    alert_engine_usage(m->engine, &m->stats.state_runs, &m->stats.state_bytes);
    pthread_mutex_unlock(&m->mu);
}

void alerter_on_commit(struct alerter *m, const struct writer_item *items) {
    int released = 0;
    /* what precommit wrote is in the database now */
    for (size_t i = m->npv; i-- > 0;)
        if (m->pv[i].in_txn) pending_drop(m, i);
    for (const struct writer_item *it = items; it; it = it->next) {
        released |= it->applied && it->kind == WRITER_DELETE;
        if (!it->applied) continue; /* rejected by the store */
        int n = alert_feed(m->engine, it, now_wall());
        if (n < 0) fprintf(stderr, "entropyd: alert engine out of memory\n");
        released |= alert_released_bytes(m->engine) >= ALERTER_RELEASE_BYTES;
        dispatch_all(m, n, it->kind == WRITER_STEP && it->msg.has_time ? it->msg.time : NAN);
        const struct alert_verdict *v = alert_verdict_changed(m->engine);
        if (v) store_verdict(m, v, it->kind == WRITER_STEP);
        if (it->kind == WRITER_END) {
            /* episodes opened by an earlier daemon that this one never saw */
            if (store_alerts_close_run(m->store, it->run_id, it->time))
                fprintf(stderr, "entropyd: closing alerts of run %lld: %s\n", (long long)it->run_id,
                        store_errmsg(m->store));
        }
    }
    if (released) {
        /* A large run that ended released its alert state (alert.c), or a
         * run was deleted: its pages in the writer's cache and the heap its
         * messages used go back too, so that memory returns to what it was
         * before (the cache refills from the OS's file cache as live runs
         * write). Not after every end: dropping the cache and trimming the
         * heap cost the next messages ~ms, and small runs leave little. */
        store_release_memory(m->store);
        malloc_trim(0);
    }
    publish_stats(m);
}

void alerter_on_tick(struct alerter *m, double now) {
    int n = alert_tick(m->engine, now);
    if (n < 0) fprintf(stderr, "entropyd: alert engine out of memory\n");
    dispatch_all(m, n, NAN);
    const struct alert_verdict *v = alert_verdict_changed(m->engine);
    if (v) store_verdict(m, v, 0);
    pending_flush(m);
    publish_stats(m);
}

void alerter_get_stats(struct alerter *m, struct alerter_stats *out) {
    pthread_mutex_lock(&m->mu);
    *out = m->stats;
    pthread_mutex_unlock(&m->mu);
    notify_get_stats(m->notify, &out->notify);
}

void alerter_metrics(struct alerter *m, struct strbuf *b) {
    struct alerter_stats as;
    alerter_get_stats(m, &as);
    strbuf_prom(b, "entropyd_alert_steps_total", "counter", "Steps the alert rules evaluated.",
                (double)as.engine.steps);
    strbuf_prom(b, "entropyd_alert_evaluation_seconds_total", "counter", "CPU time spent evaluating alert rules.",
                as.engine.eval_ms / 1e3);
    strbuf_prom(b, "entropyd_alert_transitions_total", "counter", "Alert transitions (firing, resolved, update).",
                (double)as.engine.transitions);
    strbuf_prom(b, "entropyd_alert_groups_firing", "gauge", "Alert groups (run x rule) firing now.", (double)as.firing);
    strbuf_prom(b, "entropyd_alert_resumed_total", "counter",
                "Firings that went on with an episode an earlier daemon opened (not paged again).", (double)as.resumed);
    strbuf_prom(b, "entropyd_alert_state_runs", "gauge", "Runs whose alert state is held (live ones).",
                (double)as.state_runs);
    strbuf_prom(b, "entropyd_alert_state_bytes", "gauge",
                "Memory of the alert rules' per-cell state (docs/alerts.md: bytes per head and rule).",
                (double)as.state_bytes);
    strbuf_prom(b, "entropyd_alert_store_errors_total", "counter",
                "Alert transitions or verdicts the database refused.", (double)as.store_errors);
    const struct notify_stats *ns = &as.notify;
    strbuf_prom(b, "entropyd_notifications_queued_total", "counter",
                "Alert transitions handed to the notifier (firing and resolved).", (double)ns->queued);
    strbuf_prom(b, "entropyd_alertmanager_firing", "gauge",
                "Alerts in the firing set re-sent to Alertmanager (0: nothing is re-sent).", (double)ns->am_firing);
    /* one worker per receiver: each line is one sink's own figure */
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } per_sink[] = {
        {"entropyd_notifications_sent_total", "counter",
         "Notifications delivered, by sink (alertmanager: POSTs of its set, re-sends included).",
         offsetof(struct notify_sink_stats, sent)},
        {"entropyd_notifications_failed_total", "counter",
         "Notifications not delivered, by sink (webhook: given up after its retries; alertmanager: every failed POST).",
         offsetof(struct notify_sink_stats, failed)},
        {"entropyd_notifications_dropped_total", "counter",
         "Notifications dropped, by sink: its queue full, or shutdown (alertmanager: resolved alerts never delivered).",
         offsetof(struct notify_sink_stats, dropped)},
        {"entropyd_notification_retries_total", "counter", "Attempts retried, by sink.",
         offsetof(struct notify_sink_stats, retries)},
        {"entropyd_notifications_pending", "gauge",
         "Notifications waiting for their receiver, by sink (alertmanager: alerts changed since its last POST).",
         offsetof(struct notify_sink_stats, pending)},
    };
    const struct {
        const char *label;
        const struct notify_sink_stats *st;
    } sinks[] = {{"webhook", &ns->webhook}, {"alertmanager", &ns->alertmanager}, {"exec", &ns->exec}};
    for (size_t i = 0; i < sizeof per_sink / sizeof per_sink[0]; i++) {
        strbuf_prom_head(b, per_sink[i].name, per_sink[i].type, per_sink[i].help);
        for (size_t k = 0; k < sizeof sinks / sizeof sinks[0]; k++) {
            uint64_t v;
            memcpy(&v, (const char *)sinks[k].st + per_sink[i].off, sizeof v);
            strbuf_printf(b, "%s{sink=\"%s\"} %llu\n", per_sink[i].name, sinks[k].label, (unsigned long long)v);
        }
    }
}

void alerter_set_external_url(struct alerter *m, const char *url) { notify_set_external_url(m->notify, url); }
