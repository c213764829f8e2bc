/* optim.h - optimizers over the model's flat parameter buffer, the learning
 * rate schedule and global-norm gradient clipping.  Knows nothing of the
 * model beyond "a flat array split into groups". */
#ifndef OPTIM_H
#define OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef enum { OPTIM_SGD = 0, OPTIM_MOMENTUM = 1, OPTIM_ADAM = 2, OPTIM_ADAMW = 3 } optim_kind;
typedef enum { OPTIM_SCHEDULE_CONSTANT = 0, OPTIM_SCHEDULE_COSINE = 1 } optim_schedule;

/* A contiguous range of the flat buffer with its own treatment. */
typedef struct {
    size_t offset, n;
    int decay;  /* weight decay applies (matrices and embeddings) */
    int frozen; /* not updated at all (e.g. gamma without σReparam) */
} optim_group;

typedef struct {
    int kind;           /* optim_kind */
    float beta1, beta2; /* Adam moments; beta1 is the momentum of --optimizer momentum */
    float eps;
    float weight_decay; /* L2 added to the gradient, except AdamW: decoupled */
    size_t n;           /* parameters */
    int64_t t;          /* updates done (Adam bias correction) */
    size_t state_n;     /* floats in state: 0 (sgd), n (momentum), 2n (adam) */
    float *state;       /* m then v; owned */
} optim;

/* Returns NULL on bad kind or out of memory.  Moments start at zero. */
optim *optim_create(int kind, size_t n, float beta1, float beta2, float eps, float weight_decay);
void optim_destroy(optim *o);

/* One whole update of params with grads at learning rate lr:
 * optim_begin_step() then optim_update() over everything with scale 1. */
void optim_step(optim *o, float *params, const float *grads, const optim_group *groups, int ngroups, float lr);

/* For updates split over threads: optim_begin_step() once (advances the
 * Adam step count t), then optim_update() on disjoint flat ranges [lo, hi),
 * possibly concurrently.  The gradient is used as grads * grad_scale (the
 * clipping factor) and is not modified.  Groups must cover the ranges to
 * update; params outside every group, or in frozen groups, are left alone. */
void optim_begin_step(optim *o);
void optim_update(optim *o, float *params, const float *grads, float grad_scale, const optim_group *groups, int ngroups,
                  float lr, size_t lo, size_t hi);

/* Sum of squares of grads[lo, hi) in double. */
double optim_sumsq(const float *grads, size_t lo, size_t hi);

/* Clipping factor for a gradient of squared norm sumsq: min(1, max_norm / norm)
 * (1 when max_norm is 0).  *norm receives the norm (NaN/Inf if not finite,
 * then the factor is 1 and the caller should skip the update). */
float optim_clip_scale(double sumsq, float max_norm, float *norm);

/* Global L2 norm of grads (double accumulation).  If max_norm > 0 and the
 * norm exceeds it, grads are scaled down to max_norm.  Returns the norm
 * before clipping (NaN/Inf when the gradient is not finite; then nothing is
 * scaled). */
float optim_clip(float *grads, size_t n, float max_norm);

/* Learning rate at step (0-based): linear warmup over `warmup` steps from
 * lr/warmup to lr, then constant, or cosine from lr down to lr/10 at the last
 * of `total` steps. */
float optim_lr(float lr, int step, int warmup, int total, int schedule);

#endif
