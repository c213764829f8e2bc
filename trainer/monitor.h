/* monitor.h - sigmatrain's telemetry glue: runs the probe (probe.h) on
 * logged steps and streams its metrics with the training scalars through a
 * telemetry client (telemetry.h); prints what the daemon sends back (errors,
 * alerts, the client's own notes) and a closing summary.
 *
 * What it is not: the protocol client (telemetry.h) or the metrics
 * (probe.h).  It knows the model (model.h) but not the command line: the
 * caller builds the hello's meta JSON.
 *
 * Per step, the training loop calls, from one thread:
 *   monitor_wants(mo, step)   -> is this step logged (step % log_every == 0)?
 *   monitor_probe(mo, m)      right after model_forward of a logged step,
 *                             before the optimizer changes the parameters;
 *   monitor_step(...)         after the update: enqueues the step (scalars,
 *                             probe metrics); polls the daemon's lines;
 *   monitor_eval(mo, step, v) after an eval at that step, if one follows.
 * None of these makes a system call or allocates (except printing a line
 * the daemon sent, which is rare).  monitor_destroy ends the run.
 *
 * Steps carry: scalars loss, lr, grad_norm, tokens_per_s (over the steps
 * since the previous logged step, evals excluded), eval_loss (on eval steps),
 * probe_ms; layer metrics rank_ratio, cos_sim, sigma_qkv, gamma_qkv,
 * sigma_attproj, gamma_attproj, sigma_fc, gamma_fc, sigma_fcproj,
 * gamma_fcproj; scalars sigma_lmhead, gamma_lmhead; head metrics entropy,
 * entropy_norm, max_logit, sigma_qk, entropy_bound, logit_scale, eig_mean, eig_var.  An
 * eval at a step that is not logged sends a step with the scalars only. */
#ifndef MONITOR_H
#define MONITOR_H

#include <stdio.h>

#include "model.h"
#include "probe.h"

typedef struct {
    const char *address;    /* "unix:PATH" | "tcp:HOST:PORT" (required) */
    const char *run;        /* NULL: generated */
    const char *spool_dir;  /* NULL: a private temporary spool */
    const char *token;      /* or NULL */
    const char *meta_json;  /* hello meta (a JSON object) or NULL */
    int log_every;          /* >= 1 */
    size_t queue_slots;     /* 0: telemetry's default */
    size_t spool_max_bytes; /* 0: telemetry's default */
    probe_config probe;
    long tokens_per_step; /* B * T, for tokens_per_s */
    FILE *log;            /* where daemon lines and the summary go (stderr if NULL) */
    int ab_block;         /* benchmark: > 0 alternates blocks of ab_block steps with
                                 telemetry (probe + enqueue) and without, and reports the
                                 step times of both in the summary; needs log_every 1 */
    long ab_max_steps;    /* steps the A/B arrays are sized for */
    int extra_scalars;    /* room for monitor_extra_scalars per step (0: none) */
    int end_grace_ms;     /* monitor_destroy keeps reconnecting this long for the last
                                 acks (0: 30 s; negative: no wait) */
} monitor_config;

typedef struct monitor monitor;

/* Creates the probe and the telemetry client (which starts connecting in
 * the background; creation never waits for the daemon).  Returns NULL with
 * a message in err on a bad address, run name, spool directory or out of
 * memory.  Strings are copied. */
monitor *monitor_create(const monitor_config *cfg, const model *m, char *err, size_t errlen);

/* The run name (given or generated), valid until monitor_destroy. */
const char *monitor_run_name(const monitor *mo);

int monitor_wants(const monitor *mo, long step);
void monitor_probe(monitor *mo, model *m);

/* Enqueues step `step` if it is logged or eval_follows (then the step stays
 * open until monitor_eval adds eval_loss).  Polls the daemon's lines.
 * Both accept NULL mo (no --daemon): nothing happens. */
void monitor_step(monitor *mo, long step, float loss, float lr, float grad_norm, int eval_follows);
void monitor_eval(monitor *mo, long step, float eval_loss);

/* Scalars for the next monitor_step of a logged step (e.g. dist.h's
 * per-rank figures), at most cfg->extra_scalars of them beyond the built-in
 * ones.  Names and values are not copied: they must stay valid until that
 * monitor_step, which consumes them.  Accepts NULL mo. */
void monitor_extra_scalars(monitor *mo, int n, const char *const *names, const float *values);

/* A firing alert line received from the daemon (any rule): what the
 * trainer needs to act on it (sigmatrain --on-alert). */
typedef struct {
    char rule[129];  /* 1..128 bytes (a rules file's names: proto.h's PROTO_MAX_RULE) */
    long start_step; /* the step at which the condition began to hold */
    long step;       /* the step of the firing transition */
} monitor_alert;

/* Where the last rollback left the run: a FIRING the daemon evaluated on a
 * step stamped before `at` (the trainer's clock) whose condition began
 * after step `to` (the restored step) rests on abandoned steps; the daemon
 * resolves such alerts when the repeated steps arrive.  at 0: no rollback. */
typedef struct {
    double at;
    long to;
} monitor_rewind;

/* The mark of a rollback to step `restored` when the last step sent was
 * stamped `last_stamp` (later steps are stamped at least 2 us after it; the
 * daemon echoes stamps rounded to 1 us). */
monitor_rewind monitor_rewind_after(double last_stamp, long restored);

/* Reads one alert line of the daemon (schema/protocol.md, proto_parse_alert).  Returns 1 and
 * fills *out when it is a FIRING transition to act on; 0 for any other
 * transition, a malformed line, or a FIRING about abandoned steps (rw; its
 * "step_time" is the stamp of the step it was evaluated on).  A FIRING that
 * began at or before the restored step still counts: it is about steps the
 * run kept, and the daemon does not send it again. */
int monitor_alert_parse(const char *line, const monitor_rewind *rw, monitor_alert *out);

/* Takes the oldest firing alert received by the polls of monitor_step (at
 * most 16 are kept; the oldest is dropped beyond).  Returns 1 and fills
 * *out, or 0 when there is none.  Accepts NULL mo (returns 0). */
int monitor_next_alert(monitor *mo, monitor_alert *out);

/* The run was rolled back to step `restored`: forgets the firing alerts not
 * yet taken that began after it, and from now on ignores such FIRINGs about
 * steps sent before this call (monitor_alert_parse).  Accepts NULL. */
void monitor_rolled_back(monitor *mo, long restored);

/* Sends an event (level "info" | "warn" | "error") with the run's steps,
 * after any open step.  Accepts NULL. */
void monitor_event(monitor *mo, const char *level, const char *text);

/* Commits an open step, waits for the daemon's acks (at most 10 s while
 * connected, 0.5 s otherwise), prints the summary line
 * "telemetry: run R | sent N | acked N | spooled N | dropped N (...) | ...",
 * ends the run with status ("finished", "failed", "aborted"; NULL leaves it
 * resumable) through telemetry_finish (reconnecting for up to end_grace_ms,
 * a progress line a second while it waits) and frees.  Returns 0 when everything was acknowledged, 1 otherwise.
 * Accepts NULL (returns 0). */
int monitor_destroy(monitor *mo, const char *status);

/* Uploader: connects as run `cfg->run` with the spool `cfg->spool_dir`
 * (shape layers x heads, seq_len: as the run was created), sends nothing
 * new and waits at most timeout_ms until the daemon acknowledged every
 * spooled message; prints the summary.  Returns 0 when all were
 * acknowledged, 1 on timeout, -1 on a bad config (message in err). */
int monitor_upload(const monitor_config *cfg, int layers, int heads, int seq_len, int timeout_ms, char *err,
                   size_t errlen);

#endif
