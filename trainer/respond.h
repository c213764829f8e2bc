/* respond.h - sigmatrain's answer to the daemon's firing alerts
 * (--on-alert warn|checkpoint|rollback|stop): which alerts count, the
 * in-memory snapshots a rollback returns to, and what each answer does to
 * the run's state.
 *
 * What it is not: the alert lines themselves (monitor.h parses and queues
 * them) or the snapshots' storage (rollback.h).  Under MPI every rank calls
 * respond_after_step at every step: rank 0 takes the alert, every rank
 * carries out the same answer on its identical state. */
#ifndef RESPOND_H
#define RESPOND_H

#include <stddef.h>

#include "ckpt.h"
#include "dist.h"
#include "model.h"
#include "monitor.h"
#include "optim.h"

enum { RESPOND_ACT_WARN, RESPOND_ACT_CHECKPOINT, RESPOND_ACT_ROLLBACK, RESPOND_ACT_STOP };

/* The names of the actions above, indexed by them: --on-alert's values. */
extern const char *const respond_action_names[4];

typedef struct {
    int action;            /* RESPOND_ACT_* */
    const char *rules;     /* comma-separated rule names to act on; NULL: any */
    const char *save_path; /* where checkpoint/stop save ("{step}" replaced); NULL:
                                 SPOOL_DIR/RUN-step{step}.ckpt, "." without a spool */
    const char *spool_dir; /* or NULL */
    int rollback_every;    /* snapshot every N steps (rollback), >= 1 */
    int rollback_keep;     /* snapshots kept (rollback), >= 1 */
    int max_rollbacks;     /* a firing alert after this many rollbacks stops the run */
    float lr_scale;        /* the learning rate is multiplied by it at each rollback */
} respond_config;

/* What the run does after respond_after_step. */
typedef enum {
    RESPOND_GO_ON,       /* nothing happened, or a checkpoint was saved */
    RESPOND_ROLLED_BACK, /* r (step, optimizer t, lr), the model and the optimizer are
                            at the snapshot; the caller moves its loop to r->step and
                            keeps its data cursor (the abandoned batches are skipped) */
    RESPOND_STOP,        /* end the run "aborted" (a checkpoint was saved) */
    RESPOND_ERROR,       /* a save or a snapshot failed (printed) */
    RESPOND_DIST_FAILED  /* the broadcast failed: the message is in err */
} respond_result;

typedef struct respond respond;

/* Strings in c are not copied: they must outlive the respond.  With
 * RESPOND_ACT_ROLLBACK takes the first snapshot of the run's state now.
 * Returns NULL when out of memory. */
respond *respond_create(const respond_config *c, const ckpt_meta *r, const model *m, const optim *opt);
/* Accepts NULL. */
void respond_destroy(respond *rs);

/* Called after every completed step r->step: takes the snapshot when one
 * is due, then answers at most one firing alert that mon received (mon is
 * NULL on ranks other than 0: they hear nothing and follow rank 0) and
 * that began at or before r->step.  Prints what it does and sends it to
 * the daemon as an event. */
respond_result respond_after_step(respond *rs, monitor *mon, dist *dd, ckpt_meta *r, model *m, optim *opt, char *err,
                                  size_t errlen);

#endif
