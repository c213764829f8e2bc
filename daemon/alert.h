/* alert.h: the engine that evaluates alert rules (alert_rules.h).
 *
 * The engine is fed every committed item, in
 * commit order (alert_feed), plus a clock tick (alert_tick) for the one
 * time-based rule kind (stalled). It keeps per-run, per-rule, per-cell
 * state in memory and returns transitions: an alert group (run x rule)
 * starts FIRING when its first cell has held the condition for `for`
 * steps, and is RESOLVED when its last firing cell has been clear for
 * `keep_firing_for` steps. A group never resolves without having fired,
 * and fires once per episode (deduplicated); heads that join or leave a
 * firing group produce UPDATE transitions, which are stored and streamed but
 * not notified.
 *
 * Pure: no I/O, no threads. Not thread-safe:
 * one engine is driven by one thread (the writer's commit hook). */
#ifndef ALERT_H
#define ALERT_H

#include <stddef.h>
#include <stdint.h>

#include "alert_rules.h"
#include "writer.h"

enum alert_state { ALERT_FIRING = 1, ALERT_RESOLVED, ALERT_UPDATE };

/* Why a group resolved. A run that ends (or is deleted) resolves what was
 * still firing: that is not a recovery, and says so ("reason": "run_ended"
 * in the JSON, an annotation `reason` for Alertmanager), while `resolved`
 * stays right for paging. */
enum alert_reason { ALERT_REASON_CLEARED = 0, ALERT_REASON_RUN_ENDED, ALERT_REASON_RUN_DELETED };

/* "run_ended", "run_deleted", or NULL for a recovery. */
const char *alert_reason_name(int reason);

/* One cell that holds (or held) the condition: layer/head are -1 where the
 * scope has no such axis. */
struct alert_cell {
    int32_t layer, head;
    float value;
};

/* The most cells a transition or a verdict lists: the first
 * ALERT_MAX_CELLS_LISTED in layer-major order, with the count of them all
 * beside. A collapse of a third of a 1024 x 1024-head run's cells would
 * otherwise be a 15 MB alert: stored twice, streamed, and sent to the
 * trainer as one line over its connection's output budget (the daemon
 * closed it), and a 4 MB verdict rebuilt at every step and served by every
 * /api/runs page that lists the run. */
#define ALERT_MAX_CELLS_LISTED 256

/* A firing group whose heads join or leave is updated (stored, streamed,
 * sent to the trainer) at most once per ALERT_UPDATE_MIN_S seconds of the
 * feed's clock: a cell set that changed within the second goes out with
 * the first step after it. Heads flickering across a threshold changed
 * the set at every step, and an update of up to ALERT_MAX_CELLS_LISTED
 * cells per step and rule tripled the WAL's growth and cut ingest to a
 * third. Firing, resolving, a rollback's abandoned heads and the end of a
 * run are never held back. */
#define ALERT_UPDATE_MIN_S 1.0

/* A transition of an alert group. Owned by the engine until the next
 * alert_feed/alert_tick call; copy what must outlive it. */
struct alert_transition {
    int state; /* enum alert_state */
    const struct alert_rule *rule;
    int64_t run_id;
    const char *run_name;
    uint64_t fingerprint;      /* of {alertname, run, rule labels} */
    double starts_at, ends_at; /* Unix seconds, the daemon's clock; ends_at 0 while firing */
    double at;                 /* when this transition happened (the daemon's clock) */
    int64_t start_step, step;  /* step the episode began; step of this transition */
    int ncells_total;          /* cells firing now (FIRING, UPDATE) or last (RESOLVED) */
    int ncells;                /* of them listed in cells: at most ALERT_MAX_CELLS_LISTED */
    const struct alert_cell *cells;
    double value; /* the worst value among all ncells_total cells */
    int reason;   /* enum alert_reason: why a RESOLVED resolved */
    int resumed;  /* FIRING only: the episode an earlier daemon opened goes on
                                   * (alert_resume_fn): starts_at and start_step are its own */
};

/* A run's verdict as the engine sees it: the state, the step the condition
 * behind it began (-1 if none), the rule behind it (NULL if none) and, for
 * collapsing/collapsed/sharp, the cells (heads) that hold it: ncells of them
 * listed (at most ALERT_MAX_CELLS_LISTED), ncells_total in all. Owned by
 * the engine until the next feed or tick. */
struct alert_verdict {
    int64_t run_id;
    int state; /* enum alert_verdict_state */
    int64_t since_step;
    const struct alert_rule *rule;
    int ncells, ncells_total;
    const struct alert_cell *cells;
    /* a collapse rule with unless_training, once its opening level is known:
     * the guard metric's opening and smoothed levels and the rule's
     * unless_below (the loss trains when smoothed < below x opening); NAN
     * otherwise. As of the verdict's last change (not re-reported as the
     * loss moves), and at the run's end. */
    double loss_opening, loss_smoothed, train_below;
};

struct alert_engine;

/* The engine borrows rules: they must outlive it. */
struct alert_engine *alert_engine_create(const struct alert_rules *rules);
void alert_engine_destroy(struct alert_engine *e);

/* Asked when a group fires for the first time in this engine: 1 when an
 * episode of (run, rule) opened by an earlier daemon is still open (the
 * daemon was stopped or killed while it fired), with its start in
 * *starts_at and *start_step; else 0 and both untouched. The FIRING then
 * carries `resumed` and the episode's own start, which its RESOLVED keeps. */
typedef int alert_resume_fn(void *ctx, int64_t run_id, const char *rule, double *starts_at, int64_t *start_step);
void alert_engine_set_resume(struct alert_engine *e, alert_resume_fn *fn, void *ctx);

/* Feeds one committed item (hello, step, event, end, stale, delete) of a
 * run, received at `now` on the daemon's clock (Unix seconds, the clock
 * alert_tick is given): staleness, startsAt and endsAt are on that clock,
 * and the item's own `time` (the trainer's) is never read. Returns the
 * number of transitions it caused, readable with alert_transition_at()
 * until the next feed or tick; -1 out of memory (the engine stays usable). */
int alert_feed(struct alert_engine *e, const struct writer_item *it, double now);

/* Advances the clock (Unix seconds) for stalled rules. Same returns. */
int alert_tick(struct alert_engine *e, double now);

const struct alert_transition *alert_transition_at(const struct alert_engine *e, int i);

/* The run's verdict when the last alert_feed changed it (a hello, a step
 * whose evaluation moved a verdict rule, the end, stale), else NULL. The
 * verdict a run had when it ended or went stale is final: it is computed
 * before that item resolves the run's alerts, so a collapse firing at the
 * end is `collapsed`, not healthy. Valid until the next feed or tick. */
const struct alert_verdict *alert_verdict_changed(const struct alert_engine *e);

/* Runs whose state the engine holds (live ones: a run that ends, goes stale
 * or is deleted is released), and the bytes of per-cell state they hold. */
void alert_engine_usage(const struct alert_engine *e, uint64_t *runs, uint64_t *bytes);

/* Bytes of per-cell state the last alert_feed released (a run that ended
 * or was deleted), 0 if none. */
uint64_t alert_released_bytes(const struct alert_engine *e);

/* Formats a transition as an Alertmanager alert object (labels,
 * annotations with {run} {rule} {metric} {step} {value} {cells}
 * substituted, startsAt, endsAt, fingerprint, status) plus entropyd's
 * fields (run_id, step, start_step, cells: the listed ones, ncells: all). Returns malloc'd text the
 * caller frees, or NULL. */
char *alert_transition_json(const struct alert_transition *t);

/* Evaluation counters, for /metrics and the benchmark. */
struct alert_stats {
    uint64_t steps, evaluations, transitions;
    double eval_ms; /* CPU time spent evaluating steps */
};
void alert_get_stats(const struct alert_engine *e, struct alert_stats *out);

#endif
