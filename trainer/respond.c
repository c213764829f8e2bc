/* respond.c - the --on-alert policy (see respond.h). */
#include "respond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rollback.h"

const char *const respond_action_names[4] = {"warn", "checkpoint", "rollback", "stop"};

struct respond {
    respond_config c;
    rollback *rb;  /* RESPOND_ACT_ROLLBACK only */
    int rollbacks; /* done so far */
};

respond *respond_create(const respond_config *c, const ckpt_meta *r, const model *m, const optim *opt) {
    respond *rs = calloc(1, sizeof *rs);
    if (!rs) return NULL;
    rs->c = *c;
    if (c->action == RESPOND_ACT_ROLLBACK) {
        rs->rb = rollback_create(c->rollback_keep);
        if (!rs->rb || rollback_take(rs->rb, r, m, opt) != 0) goto err;
    }
    return rs;
err:
    respond_destroy(rs);
    return NULL;
}

void respond_destroy(respond *rs) {
    if (!rs) return;
    rollback_destroy(rs->rb);
    free(rs);
}

static int rule_selected(const char *rules, const char *rule) {
    if (!rules) return 1;
    size_t n = strlen(rule);
    for (const char *p = rules; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, rule, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* Saves the run's state now (see respond_config.save_path). */
static int save_now(const respond *rs, monitor *mon, const ckpt_meta *r, const model *m, const optim *opt) {
    char path[4096], err[512];
    if (rs->c.save_path) ckpt_path(path, sizeof path, rs->c.save_path, (long)r->step);
    else
        snprintf(path, sizeof path, "%s/%s-step%lld.ckpt", rs->c.spool_dir ? rs->c.spool_dir : ".",
                 monitor_run_name(mon), (long long)r->step);
    if (ckpt_save(path, r, m, opt, err, sizeof err) != 0) {
        fprintf(stderr, "sigmatrain: save: %s\n", err);
        return -1;
    }
    printf("saved %s\n", path);
    return 0;
}

/* The next firing alert the run answers, from the daemon's lines received
 * so far; one whose condition began after the run's step (the abandoned
 * branch of a rollback) is passed over (monitor.h drops those that began
 * after the restored step). */
static int take_alert(const respond *rs, monitor *mon, const ckpt_meta *r, monitor_alert *al) {
    while (mon && monitor_next_alert(mon, al))
        if (rule_selected(rs->c.rules, al->rule) && al->start_step <= r->step) return 1;
    return 0;
}

/* stop, or a rollback that cannot be done: save, report, end the run */
static respond_result stop(respond *rs, monitor *mon, dist *dd, const monitor_alert *al, const char *why,
                           const ckpt_meta *r, const model *m, const optim *opt) {
    char text[512];
    snprintf(text, sizeof text, "stopping at step %lld (alert %s, started at step %ld): %s", (long long)r->step,
             al->rule, al->start_step, why);
    printf("%s\n", text);
    monitor_event(mon, "warn", text);
    if (dist_rank(dd) == 0 && save_now(rs, mon, r, m, opt) != 0) return RESPOND_ERROR;
    return RESPOND_STOP;
}

/* Answers one alert, the same on every rank (rank 0 alone saves and
 * prints to the daemon: mon is NULL elsewhere). */
static respond_result answer(respond *rs, monitor *mon, dist *dd, const monitor_alert *al, ckpt_meta *r, model *m,
                             optim *opt) {
    char text[512];
    if (rs->c.action == RESPOND_ACT_CHECKPOINT) {
        if (dist_rank(dd) == 0 && save_now(rs, mon, r, m, opt) != 0) return RESPOND_ERROR;
        snprintf(text, sizeof text, "checkpoint at step %lld (alert %s)", (long long)r->step, al->rule);
        monitor_event(mon, "info", text);
        return RESPOND_GO_ON;
    }
    if (rs->c.action == RESPOND_ACT_STOP) return stop(rs, mon, dd, al, "--on-alert stop", r, m, opt);
    if (rs->rollbacks >= rs->c.max_rollbacks) return stop(rs, mon, dd, al, "--max-rollbacks reached", r, m, opt);
    long from = (long)r->step, to = rollback_restore(rs->rb, al->start_step, r, m, opt);
    if (to < 0) return stop(rs, mon, dd, al, "no snapshot from before the alert's start", r, m, opt);
    rs->rollbacks++;
    r->lr *= rs->c.lr_scale;
    snprintf(text, sizeof text,
             "rollback from step %ld to step %ld (alert %s, started at step %ld); lr now %g; "
             "rollback %d of at most %d",
             from, to, al->rule, al->start_step, r->lr, rs->rollbacks, rs->c.max_rollbacks);
    printf("%s\n", text);
    monitor_event(mon, "warn", text);
    monitor_rolled_back(mon, to); /* alerts about the abandoned steps no longer count */
    return RESPOND_ROLLED_BACK;
}

respond_result respond_after_step(respond *rs, monitor *mon, dist *dd, ckpt_meta *r, model *m, optim *opt, char *err,
                                  size_t errlen) {
    if (rs->rb && r->step % rs->c.rollback_every == 0 && rollback_take(rs->rb, r, m, opt) != 0) {
        fprintf(stderr, "sigmatrain: out of memory\n");
        return RESPOND_ERROR;
    }
    if (rs->c.action == RESPOND_ACT_WARN) return RESPOND_GO_ON; /* monitor prints alerts */
    /* rank 0 takes the alert and broadcasts its start step */
    monitor_alert al = {.rule = ""};
    long msg[2] = {take_alert(rs, mon, r, &al), 0};
    msg[1] = msg[0] ? al.start_step : 0;
    if (dist_bcast_longs(dd, msg, 2, err, errlen) != 0) return RESPOND_DIST_FAILED;
    if (!msg[0]) return RESPOND_GO_ON;
    al.start_step = msg[1];
    return answer(rs, mon, dd, &al, r, m, opt);
}
