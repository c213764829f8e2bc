/* monitor.c - the probe and the telemetry client wired for sigmatrain (see
 * monitor.h). */
#include "monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "now.h"
#include "proto.h"
#include "telemetry.h"


#define MONITOR_ALERTS_MAX 16

struct monitor {
    telemetry *t;
    probe *p;
    FILE *log;
    int log_every;
    long tokens_per_step;
    const probe_metrics *pm; /* metrics of the probed step, or NULL */
    long probed_step;
    telemetry_step *open; /* a step kept open for its eval_loss */
    long open_step;
    /* timing (CLOCK_MONOTONIC seconds) */
    double last_logged;  /* time of the previous logged step (evals excluded) */
    long steps_since;    /* training steps since then */
    double first, last;  /* first and last monitor_step */
    double hook_seconds; /* probe + enqueue + poll, all steps */
    long logged, probed, steps;
    int connected_once;
    /* monitor_extra_scalars: added to the next logged step (not copied) */
    int extra_n;
    const char *const *extra_names;
    const float *extra_values;
    /* A/B benchmark: step times (s) of steps with [0] and without [1] telemetry */
    int ab_block;
    double *ab_t[2];
    long ab_n[2], ab_cap;
    double prev_step_t;
    char run[TELEMETRY_RUN_MAX + 1];
    /* firing alerts not yet taken by monitor_next_alert (oldest first) */
    monitor_alert alerts[MONITOR_ALERTS_MAX];
    int nalerts;
    monitor_rewind rewind; /* the last rollback (monitor_rolled_back) */
    double last_stamp;     /* time of the last step sent: stamps only increase */
    int end_grace_ms;
};

static double mono(void) { return now_mono_ms() / 1e3; }

static telemetry *open_client(const monitor_config *cfg, int layers, int heads, int seq_len, const char *meta,
                              char *err, size_t errlen) {
    telemetry_config tc;
    telemetry_config_init(&tc);
    tc.address = cfg->address;
    tc.run = cfg->run;
    tc.layers = layers;
    tc.heads = heads;
    tc.seq_len = seq_len;
    tc.meta_json = meta;
    tc.token = cfg->token;
    tc.spool_dir = cfg->spool_dir;
    tc.queue_slots = cfg->queue_slots;
    tc.spool_max_bytes = cfg->spool_max_bytes;
    /* 6 scalars + 2 lm head + a margin; 10 layer metrics; 7 head metrics */
    tc.max_scalars = 16 + (cfg->extra_scalars > 0 ? cfg->extra_scalars : 0);
    tc.max_layer_metrics = 12;
    tc.max_head_metrics = 8;
    return telemetry_create(&tc, err, errlen);
}

monitor *monitor_create(const monitor_config *cfg, const model *m, char *err, size_t errlen) {
    monitor *mo = calloc(1, sizeof *mo);
    if (!mo) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    mo->log = cfg->log ? cfg->log : stderr;
    mo->log_every = cfg->log_every > 0 ? cfg->log_every : 1;
    mo->end_grace_ms = cfg->end_grace_ms;
    mo->tokens_per_step = cfg->tokens_per_step;
    mo->p = probe_create(m, &cfg->probe);
    if (!mo->p) {
        snprintf(err, errlen, "probe: out of memory");
        goto err;
    }
    mo->t = open_client(cfg, m->cfg.layers, m->cfg.heads, m->T, cfg->meta_json, err, errlen);
    if (!mo->t) goto err;
    snprintf(mo->run, sizeof mo->run, "%s", telemetry_run_name(mo->t));
    mo->probed_step = -1;
    mo->open_step = -1;
    if (cfg->ab_block > 0) {
        mo->ab_block = cfg->ab_block;
        mo->ab_cap = cfg->ab_max_steps > 0 ? cfg->ab_max_steps : 1;
        mo->ab_t[0] = malloc(sizeof(double) * mo->ab_cap);
        mo->ab_t[1] = malloc(sizeof(double) * mo->ab_cap);
        if (!mo->ab_t[0] || !mo->ab_t[1]) {
            snprintf(err, errlen, "out of memory");
            goto err;
        }
    }
    return mo;
err:
    if (mo->t) telemetry_destroy(mo->t, NULL, 0);
    free(mo->ab_t[0]);
    free(mo->ab_t[1]);
    probe_destroy(mo->p);
    free(mo);
    return NULL;
}

const char *monitor_run_name(const monitor *mo) { return mo->run; }

/* A/B mode: blocks of ab_block steps alternate, with telemetry first. */
static int ab_off(const monitor *mo, long step) { return mo->ab_block > 0 && ((step - 1) / mo->ab_block) % 2 == 1; }

int monitor_wants(const monitor *mo, long step) { return mo && step % mo->log_every == 0 && !ab_off(mo, step); }

void monitor_probe(monitor *mo, model *m) {
    double t0 = mono();
    mo->pm = probe_compute(mo->p, m);
    mo->probed = 1;
    mo->hook_seconds += mono() - t0;
}

static void commit_open(monitor *mo);

int monitor_alert_parse(const char *line, const monitor_rewind *rw, monitor_alert *out) {
    struct proto_alert a;
    if (proto_parse_alert(line, strlen(line), &a) || strcmp(a.transition, "firing")) return 0;
    if (rw && rw->at > 0 && a.has_step_time && a.step_time < rw->at && (long)a.start_step > rw->to)
        return 0; /* evaluated before the rollback, on steps it abandoned */
    snprintf(out->rule, sizeof out->rule, "%s", a.rule);
    out->start_step = (long)a.start_step;
    out->step = (long)a.step;
    return 1;
}

/* Queues a firing alert line for monitor_next_alert (the oldest is
 * dropped when the queue is full). */
static void keep_firing(monitor *mo, const char *line) {
    monitor_alert al;
    if (!monitor_alert_parse(line, &mo->rewind, &al)) return;
    if (mo->nalerts == MONITOR_ALERTS_MAX) {
        memmove(mo->alerts, mo->alerts + 1, sizeof mo->alerts[0] * (MONITOR_ALERTS_MAX - 1));
        mo->nalerts--;
    }
    mo->alerts[mo->nalerts++] = al;
}

int monitor_next_alert(monitor *mo, monitor_alert *out) {
    if (!mo || mo->nalerts == 0) return 0;
    *out = mo->alerts[0];
    memmove(mo->alerts, mo->alerts + 1, sizeof mo->alerts[0] * (size_t)(mo->nalerts - 1));
    mo->nalerts--;
    return 1;
}

void monitor_rolled_back(monitor *mo, long restored) {
    if (!mo) return;
    int k = 0;
    for (int i = 0; i < mo->nalerts; i++) /* keep those about steps the run kept */
        if (mo->alerts[i].start_step <= restored) mo->alerts[k++] = mo->alerts[i];
    mo->nalerts = k;
    mo->rewind = monitor_rewind_after(mo->last_stamp, restored);
}

monitor_rewind monitor_rewind_after(double last_stamp, long restored) {
    /* Every step sent so far is stamped at or before last_stamp, every later
     * one at least 2 us after it; the daemon sees the stamps rounded to 1 us
     * (the protocol's %.6f).  1 us past the rounded last stamp separates them. */
    monitor_rewind rw = {.at = floor(last_stamp * 1e6 + 0.5) / 1e6 + 1e-6, .to = restored};
    return rw;
}

void monitor_event(monitor *mo, const char *level, const char *text) {
    if (!mo) return;
    commit_open(mo);
    telemetry_event(mo->t, level, text);
}

/* Prints the daemon's lines: errors (except `duplicate`, which only says
 * the data is already safe), alerts, the client's notes; the first welcome
 * and every reconnect. */
static void poll_lines(monitor *mo) {
    telemetry_msg msg;
    while (telemetry_poll(mo->t, &msg)) {
        if (!strcmp(msg.type, "error")) {
            if (!strstr(msg.line, "\"duplicate\"")) fprintf(mo->log, "telemetry: daemon error: %s\n", msg.line);
        } else if (!strcmp(msg.type, "alert")) {
            fprintf(mo->log, "ALERT: %s\n", msg.line);
            keep_firing(mo, msg.line);
        } else if (!strcmp(msg.type, "welcome")) {
            fprintf(mo->log, "telemetry: %s: %s\n", mo->connected_once ? "reconnected" : "connected", msg.line);
            mo->connected_once = 1;
        } else {
            fprintf(mo->log, "telemetry: %s\n", msg.line);
        }
        telemetry_msg_free(&msg);
    }
}

static void put_probe(telemetry_step *s, const probe_metrics *r) {
    telemetry_step_heads(s, "entropy", r->entropy);
    telemetry_step_heads(s, "entropy_norm", r->entropy_norm);
    telemetry_step_heads(s, "max_logit", r->max_logit);
    telemetry_step_heads(s, "sigma_qk", r->sigma_qk);
    telemetry_step_heads(s, "entropy_bound", r->entropy_bound);
    telemetry_step_heads(s, "logit_scale", r->logit_scale);
    if (r->eig_fresh) { /* computed on every few probe calls (probe.h) */
        telemetry_step_heads(s, "eig_mean", r->eig_mean);
        telemetry_step_heads(s, "eig_var", r->eig_var);
    }
    telemetry_step_layer(s, "rank_ratio", r->rank_ratio);
    telemetry_step_layer(s, "cos_sim", r->cos_sim);
    for (int k = 0; k < MODEL_LIN_PER_LAYER; k++) {
        telemetry_step_layer(s, probe_lin_sigma_names[k], r->lin_sigma[k]);
        telemetry_step_layer(s, probe_lin_gamma_names[k], r->lin_gamma[k]);
    }
    telemetry_step_scalar(s, "sigma_lmhead", r->lm_sigma);
    telemetry_step_scalar(s, "gamma_lmhead", r->lm_gamma);
    telemetry_step_scalar(s, "probe_ms", r->seconds * 1e3);
}

static void commit_open(monitor *mo) {
    if (mo->open) telemetry_step_commit(mo->t, mo->open);
    mo->open = NULL;
    mo->open_step = -1;
}

void monitor_step(monitor *mo, long step, float loss, float lr, float grad_norm, int eval_follows) {
    if (!mo) return;
    double t0 = mono();
    if (mo->ab_block > 0) {
        /* the interval since the previous step holds this whole step; the
         * first step of each block is left out (it may carry the sender's
         * work for the previous block) */
        int off = ab_off(mo, step);
        if (mo->prev_step_t > 0.0 && (step - 1) % mo->ab_block != 0 && mo->ab_n[off] < mo->ab_cap)
            mo->ab_t[off][mo->ab_n[off]++] = t0 - mo->prev_step_t;
        mo->prev_step_t = t0;
        if (off) {
            mo->probed = 0;
            poll_lines(mo);
            return;
        }
    }
    if (mo->first == 0.0) mo->first = mo->last_logged = t0;
    mo->last = t0;
    mo->steps_since++;
    mo->steps++;
    commit_open(mo);
    int logged = step % mo->log_every == 0;
    if (logged || eval_follows) {
        /* stamps only increase (by 2 us at least, so they stay apart at the
         * protocol's 1 us), whatever the wall clock does: monitor_rolled_back
         * tells steps sent before a rollback from later ones by them */
        double now = telemetry_now();
        mo->last_stamp = now > mo->last_stamp + 2e-6 ? now : mo->last_stamp + 2e-6;
        telemetry_step *s = telemetry_step_begin(mo->t, step, mo->last_stamp);
        if (s) {
            telemetry_step_scalar(s, "loss", loss);
            telemetry_step_scalar(s, "lr", lr);
            telemetry_step_scalar(s, "grad_norm", grad_norm);
            if (logged) {
                double dt = t0 - mo->last_logged;
                telemetry_step_scalar(s, "tokens_per_s",
                                      dt > 0 ? (double)mo->tokens_per_step * mo->steps_since / dt : NAN);
                mo->last_logged = t0;
                mo->steps_since = 0;
                if (mo->probed && mo->pm) put_probe(s, mo->pm);
                for (int i = 0; i < mo->extra_n; i++) telemetry_step_scalar(s, mo->extra_names[i], mo->extra_values[i]);
                mo->logged++;
            }
            if (eval_follows) {
                mo->open = s;
                mo->open_step = step;
            } else {
                telemetry_step_commit(mo->t, s);
            }
        }
    }
    mo->probed = 0;
    mo->extra_n = 0;
    poll_lines(mo);
    mo->hook_seconds += mono() - t0;
}

void monitor_extra_scalars(monitor *mo, int n, const char *const *names, const float *values) {
    if (!mo) return;
    mo->extra_n = n;
    mo->extra_names = names;
    mo->extra_values = values;
}

void monitor_eval(monitor *mo, long step, float eval_loss) {
    if (!mo) return;
    if (mo->open && mo->open_step == step) telemetry_step_scalar(mo->open, "eval_loss", eval_loss);
    commit_open(mo);
    /* evals stay out of tokens_per_s */
    mo->last_logged = mono();
    mo->steps_since = 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void ab_report(monitor *mo) {
    if (mo->ab_block <= 0 || mo->ab_n[0] < 3 || mo->ab_n[1] < 3) return;
    double mean[2], med[2];
    for (int k = 0; k < 2; k++) {
        double s = 0.0;
        for (long i = 0; i < mo->ab_n[k]; i++) s += mo->ab_t[k][i];
        mean[k] = s / mo->ab_n[k];
        qsort(mo->ab_t[k], mo->ab_n[k], sizeof(double), cmp_double);
        long n = mo->ab_n[k];
        med[k] = n % 2 ? mo->ab_t[k][n / 2] : 0.5 * (mo->ab_t[k][n / 2 - 1] + mo->ab_t[k][n / 2]);
    }
    fprintf(mo->log,
            "telemetry A/B (blocks of %d steps, same run): with %ld steps median %.2f ms mean %.2f ms, "
            "without %ld steps median %.2f ms mean %.2f ms -> overhead median %.2f%% mean %.2f%%\n",
            mo->ab_block, mo->ab_n[0], med[0] * 1e3, mean[0] * 1e3, mo->ab_n[1], med[1] * 1e3, mean[1] * 1e3,
            100.0 * (med[0] / med[1] - 1.0), 100.0 * (mean[0] / mean[1] - 1.0));
}

static void summary(FILE *log, const char *run, telemetry *t, const char *extra) {
    telemetry_stats st;
    telemetry_get_stats(t, &st);
    uint64_t dropped = st.dropped_queue + st.dropped_spool + st.dropped_oversize;
    fprintf(log,
            "telemetry: run %s | enqueued %llu | sent %llu | acked %llu of %llu | spooled %llu | "
            "unacked in spool %llu bytes | dropped %llu (queue %llu, spool %llu, oversize %llu) | "
            "connects %llu, reconnects %llu, failed connects %llu | daemon errors %llu%s\n",
            run, (unsigned long long)st.enqueued, (unsigned long long)st.sent, (unsigned long long)st.acked,
            (unsigned long long)(st.next_seq - 1), (unsigned long long)st.spooled, (unsigned long long)st.spool_bytes,
            (unsigned long long)dropped, (unsigned long long)st.dropped_queue, (unsigned long long)st.dropped_spool,
            (unsigned long long)st.dropped_oversize, (unsigned long long)st.connects, (unsigned long long)st.reconnects,
            (unsigned long long)st.connect_failures, (unsigned long long)st.errors, extra);
}

int monitor_destroy(monitor *mo, const char *status) {
    if (!mo) return 0;
    commit_open(mo);
    if (status) {
        char text[64];
        snprintf(text, sizeof text, "run ended: %s", status);
        telemetry_event(mo->t, "info", text);
    }
    telemetry_stats st;
    telemetry_get_stats(mo->t, &st);
    int wait = st.connected ? 10000 : 500;
    int rc = telemetry_flush(mo->t, wait);
    poll_lines(mo);
    char extra[200];
    double span = mo->last - mo->first;
    snprintf(extra, sizeof extra,
             " | %ld steps logged, telemetry hook (probe + enqueue) %.3f ms/step, %.2f%% of wall time", mo->logged,
             mo->steps ? 1e3 * mo->hook_seconds / mo->steps : 0.0, span > 0 ? 100.0 * mo->hook_seconds / span : 0.0);
    summary(mo->log, mo->run, mo->t, extra);
    ab_report(mo);
    /* the end message; reconnects for the grace period if the daemon is away */
    int grace = mo->end_grace_ms < 0 ? 0 : mo->end_grace_ms == 0 ? 30000 : mo->end_grace_ms;
    int rc2 = telemetry_finish(mo->t, status, grace, mo->log);
    mo->t = NULL;
    if (rc != TELEMETRY_OK || rc2 != TELEMETRY_OK)
        fprintf(mo->log, "telemetry: not everything was acknowledged; the rest stays in the spool "
                         "(upload it later with --upload-spool, same --run and --spool)\n");
    probe_destroy(mo->p);
    free(mo->ab_t[0]);
    free(mo->ab_t[1]);
    free(mo);
    return rc == TELEMETRY_OK && rc2 == TELEMETRY_OK ? 0 : 1;
}

int monitor_upload(const monitor_config *cfg, int layers, int heads, int seq_len, int timeout_ms, char *err,
                   size_t errlen) {
    if (!cfg->run || !cfg->spool_dir) {
        snprintf(err, errlen, "uploading needs the run name and the spool directory");
        return -1;
    }
    /* no meta: the daemon keeps the one the run was created with */
    telemetry *t = open_client(cfg, layers, heads, seq_len, NULL, err, errlen);
    if (!t) return -1;
    FILE *log = cfg->log ? cfg->log : stderr;
    int rc = telemetry_flush(t, timeout_ms);
    summary(log, telemetry_run_name(t), t, rc == TELEMETRY_OK ? "" : " | timed out: the rest stays spooled");
    telemetry_destroy(t, NULL, 0);
    return rc == TELEMETRY_OK ? 0 : 1;
}
