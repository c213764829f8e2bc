/* rollback.h - in-memory snapshots of a run for sigmatrain --on-alert
 * rollback: the state a checkpoint holds (parameters, optimizer moments,
 * sigma estimates and power-iteration vectors, step, optimizer t, rng, NaN
 * count, data cursor), kept in RAM every N steps, the newest `keep` of them.
 * No file, so rolling back never depends on --save or on disk space; the
 * cost is keep x (params + optimizer state) floats. */
#ifndef ROLLBACK_H
#define ROLLBACK_H

#include "ckpt.h"
#include "model.h"
#include "optim.h"

typedef struct rollback rollback;

/* keep >= 1 snapshots.  NULL when out of memory. */
rollback *rollback_create(int keep);
void rollback_destroy(rollback *rb);

/* Copies the current state (r->step etc. and the buffers) over the oldest
 * snapshot.  Returns 0, or -1 when out of memory. */
int rollback_take(rollback *rb, const ckpt_meta *r, const model *m, const optim *o);

/* Restores the newest snapshot whose step is < before_step into r (step,
 * rng, optim_t, nan_steps, data_pos; the run's definition, lr included, is
 * left alone), m and o; drops the snapshots newer than it (they belong to
 * the abandoned steps).  Returns the restored step, or -1 when there is no
 * such snapshot (nothing changed). */
long rollback_restore(rollback *rb, long before_step, ckpt_meta *r, model *m, optim *o);

#endif
