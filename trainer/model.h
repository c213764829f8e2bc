/* model.h - a GPT-style decoder-only transformer in fp32 with handwritten
 * forward and backward passes (llm.c's train_gpt2.c layout), optionally with
 * σReparam on every linear layer.
 *
 * What it is: token + learned position embeddings, L blocks of causal
 * multi-head attention and a GELU (tanh approximation) MLP, a final LayerNorm
 * (not with --norm none) and an untied LM head without bias.  All parameters
 * live in ONE flat buffer carved by a size table (so gradients and optimizer
 * moments are flat arrays too); activations likewise.  Matmuls go through
 * OpenBLAS cblas_sgemm.  What it is not: an optimizer, a data loader or a
 * checkpoint writer (optim.h, data.h, ckpt.h).
 *
 * Norm placement (--norm):
 *   pre : r2 = x + Attn(LN1(x));  out = r2 + MLP(LN2(r2));  then LNf
 *   post: r2 = x + Attn(x); n = LN1(r2); r3 = n + MLP(n); out = LN2(r3); then LNf
 *   none: r2 = x + Attn(x);  out = r2 + MLP(r2);  no final norm
 *
 * ---- For probes (collapse metrics; see science.md) ---------------------------
 * After model_forward(), for layer l (0-based), with B, T the forward's sizes:
 *   - attention probabilities, post-softmax and causal (upper triangle is 0):
 *       model_attention(m, l) -> (B, H, T, T); row i of head h of example b at
 *       + ((b*H + h)*T + i)*T.  (Stride is the forward's T.)
 *   - the layer input X seen by attention (after LN1 in pre mode; the residual
 *       stream in post/none mode): model_attn_input(m, l) -> (B, T, C).
 *   - the effective (reparametrized) QKV weight W_hat: model_qkv_weight(m, l)
 *       -> (3C, C) row-major, rows [0,C) are W_Q, [C,2C) W_K, [2C,3C) W_V; the
 *       C x d slice W_Q^h of science.md is rows h*d..h*d+d-1 of W_Q, transposed
 *       (q = W_Q x, so q_h = rows h*d.. of W_Q applied to x).  Likewise W_K.
 *       With --reparam none this is the parameter itself.
 *   - per linear sigma (power-iteration estimate) and gamma:
 *       model_linear(m, model_linear_index(l, MODEL_LIN_QKV))->sigma, ->gamma.
 *       Linear order: per layer QKV, ATTPROJ, FC, FCPROJ; then the LM head at
 *       index 4L.  With --reparam none, sigma is 1 and gamma points to 1.
 *   - the qkv activations (B, T, 3C) (q | k | v per token): model_qkv(m, l).
 * Pointers stay valid until model_destroy(); contents change with each forward.
 * model_qkv_weight() forms W_hat on its first call after a forward (from the
 * forward's sigma); calls for different layers may run concurrently.
 * ------------------------------------------------------------------------------ */
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "sreparam.h"

typedef enum { MODEL_NORM_PRE = 0, MODEL_NORM_POST = 1, MODEL_NORM_NONE = 2 } model_norm;
typedef enum { MODEL_REPARAM_NONE = 0, MODEL_REPARAM_SIGMA = 1, MODEL_REPARAM_SPECTRAL = 2 } model_reparam;
typedef enum { MODEL_GAMMA_SIGMA = 0, MODEL_GAMMA_ONE = 1 } model_gamma_init;

typedef struct {
    int vocab;      /* V: 256 for byte-level data */
    int max_seq;    /* maxT: rows of the position embedding */
    int layers;     /* L */
    int heads;      /* H; dim must be divisible by heads */
    int dim;        /* C */
    int norm;       /* model_norm */
    int reparam;    /* model_reparam */
    int gamma_init; /* model_gamma_init (sigma mode only; spectral pins gamma = 1) */
} model_config;

/* Parameter tensors, in buffer order. */
enum {
    MODEL_WTE,
    MODEL_WPE,
    MODEL_LN1W,
    MODEL_LN1B,
    MODEL_QKVW,
    MODEL_QKVB,
    MODEL_ATTPROJW,
    MODEL_ATTPROJB,
    MODEL_LN2W,
    MODEL_LN2B,
    MODEL_FCW,
    MODEL_FCB,
    MODEL_FCPROJW,
    MODEL_FCPROJB,
    MODEL_LNFW,
    MODEL_LNFB,
    MODEL_LMW,
    MODEL_GAMMA,
    MODEL_NUM_PARAMS
};

/* Linear layers within a block. */
enum { MODEL_LIN_QKV, MODEL_LIN_ATTPROJ, MODEL_LIN_FC, MODEL_LIN_FCPROJ, MODEL_LIN_PER_LAYER };

typedef struct {
    float *wte;      /* (V, C) */
    float *wpe;      /* (maxT, C) */
    float *ln1w;     /* (L, C) */
    float *ln1b;     /* (L, C) */
    float *qkvw;     /* (L, 3C, C) */
    float *qkvb;     /* (L, 3C) */
    float *attprojw; /* (L, C, C) */
    float *attprojb; /* (L, C) */
    float *ln2w;     /* (L, C) */
    float *ln2b;     /* (L, C) */
    float *fcw;      /* (L, 4C, C) */
    float *fcb;      /* (L, 4C) */
    float *fcprojw;  /* (L, C, 4C) */
    float *fcprojb;  /* (L, C) */
    float *lnfw;     /* (C) */
    float *lnfb;     /* (C) */
    float *lmw;      /* (V, C) */
    float *gamma;    /* (4L + 1) σReparam gains, linear order as above */
} model_params;

typedef struct {
    float *encoded;   /* (B, T, C) */
    float *ln1;       /* (L, B, T, C) LN1 output (pre: of x; post: of r2) */
    float *ln1_mean;  /* (L, B, T) */
    float *ln1_rstd;  /* (L, B, T) */
    float *qkv;       /* (L, B, T, 3C) */
    float *atty;      /* (L, B, T, C) attention output before the projection */
    float *att;       /* (L, B, H, T, T) post-softmax attention */
    float *residual2; /* (L, B, T, C) x + attention projection */
    float *ln2;       /* (L, B, T, C) LN2 output (pre: of r2; post: of r3) */
    float *ln2_mean;  /* (L, B, T) */
    float *ln2_rstd;  /* (L, B, T) */
    float *fch;       /* (L, B, T, 4C) gelu'(fc pre-activation), see kernel_gelu_forward */
    float *fch_gelu;  /* (L, B, T, 4C) */
    float *residual3; /* (L, B, T, C) */
    float *lnf;       /* (B, T, C) */
    float *lnf_mean;  /* (B, T) */
    float *lnf_rstd;  /* (B, T) */
    float *probs;     /* (B, T, V) logits, then softmax; overwritten by backward */
    float *losses;    /* (B, T) */
} model_acts;

typedef struct model model;
typedef pool_task model_task; /* see model_parallel */

/* One worker's share of a batch: its own gradient buffers and scratch. */
typedef struct {
    float *grads_memory;    /* shard 0: the model's grads; others: private (num_params) */
    model_params grads;     /* carved from grads_memory */
    float *scratch;         /* one layer's backward scratch for this shard's examples;
                           * also the power steps' work vector (>= 4C floats) */
    double *gw;             /* (num_linear) last backward: <dX, X> of each linear, which
                           * is alpha <G, W> (see model.c: the gradient through sigma) */
    double loss_sum;        /* last forward: sum of this shard's token losses */
    double reparam_seconds; /* last job: time in σReparam work */
    int idle;               /* last job had no examples for this shard */
} model_shard;

struct model {
    model_config cfg;
    int B, T; /* activation capacity */
    size_t param_sizes[MODEL_NUM_PARAMS];
    size_t num_params;
    float *params_memory; /* (num_params) */
    float *grads_memory;  /* (num_params) */
    model_params params, grads;
    float *acts_memory;
    model_acts acts;
    /* σReparam state: one entry per linear layer (4L + 1).  W_hat is never
     * formed for the matmuls (they scale by gamma / sigma); only the QKV
     * weights are materialized, on demand, for probes. */
    int num_linear;
    sreparam_linear *lin;
    float *pi_memory; /* u and v vectors of every linear, in linear order (u then v) */
    size_t pi_size;
    float *qkv_eff; /* (L, 3C, C) W_hat of the QKV linears (reparam modes), else NULL */
    int *qkv_fresh; /* (L) qkv_eff of the layer matches the last forward */
    /* Data parallelism: nthreads shards of the batch's examples, shard 0 on
     * the calling thread.  Each shard calls OpenBLAS single-threaded: on these
     * small matrices OpenBLAS's own threads lose (measured 8.4k tokens/s with 2
     * OpenBLAS threads vs 13.1k with 1 on the benchmark config). */
    int nthreads;
    model_shard *shards;
    pool *pool;
    int job, train;  /* the job the pool is running (see run_shard) */
    int *lin_owner;  /* (num_linear) thread doing each linear's σReparam work */
    int *gw_route;   /* (num_linear) last backward: <G, W> by weights (1) or by
                           * activations (0), see model.c gw_by_weights */
    int grads_clear; /* model_zero_grad ran and no backward since */
    /* wall time spent on σReparam work (power steps, the <dX, X> products
     * of the gradient through sigma; the rank-one term rides on the gradient
     * reduction, which the plain model does too): for the overhead figure */
    double reparam_seconds;
    /* last forward's sizes and inputs */
    int cur_B, cur_T;
    const int *inputs, *targets;
    float mean_loss;
};

/* Validates a configuration; returns 0 or -1 with a message in err. */
int model_config_check(const model_config *cfg, char *err, size_t errlen);

/* Allocates a model able to run batches of up to B x T (T <= max_seq) on
 * `threads` threads (the caller's plus threads - 1 workers; results are
 * deterministic for a given thread count).  Sets OpenBLAS to one thread.
 * Parameters are left zero; call model_init().  Returns NULL on bad config,
 * out of memory or thread creation failure.  model_destroy() accepts NULL
 * and half-built models and joins the workers. */
model *model_create(const model_config *cfg, int B, int T, int threads);
void model_destroy(model *m);

/* GPT-2 style init from the xorshift state *rng (advanced): weights from a
 * truncated normal std 0.02 (residual projections 0.02/sqrt(2L)), biases 0,
 * LN gains 1; then σReparam vectors and gammas per the config (science.md §3):
 * sigma + gamma_init sigma: u, v from an SVD, gamma = sigma(W) so W_hat = W;
 * sigma + gamma_init one: random unit u, gamma = 1; spectral: random unit u,
 * 15 power steps, gamma = 1. */
void model_init(model *m, uint64_t *rng);

/* Forward pass on inputs (B, T) token ids.  If targets (B, T) is not NULL the
 * mean cross-entropy loss is returned, else -1.  train != 0 runs one power
 * iteration step per reparametrized linear (training mode); train == 0 uses
 * the stored vectors unchanged.  inputs/targets must stay alive until
 * model_backward().  B, T must not exceed the capacity. */
float model_forward(model *m, const int *inputs, const int *targets, int B, int T, int train);

/* Sets all parameter gradients to zero (split over the model's threads). */
void model_zero_grad(model *m);

/* Runs fn(ctx, thread, nthreads) once on each of the model's threads
 * (thread 0 is the caller; pool_run) and returns when all are done.  For
 * work on the flat parameter buffers, e.g. the optimizer update, and for
 * probes. */
void model_parallel(model *m, model_task fn, void *ctx);

/* Backward pass of the last forward (which must have had targets); ADDS into
 * the parameter gradients.  Destroys acts.probs. */
void model_backward(model *m);

/* Accessors for probes (see the comment block at the top). */
float *model_attention(model *m, int layer);
float *model_attn_input(model *m, int layer);
float *model_qkv(model *m, int layer);
const float *model_qkv_weight(model *m, int layer);
int model_linear_index(const model *m, int layer, int which);
const sreparam_linear *model_linear(const model *m, int index);

/* Useful matmul FLOPs of one training step of B x T tokens (forward +
 * backward = 3x forward): 2 x the linears' weights per token, plus the
 * causal half (T(T+1)/2 pairs) of attention's QK^T and AV, so a figure does
 * not flatter the blocked kernel, which computes a bit more. */
double model_step_flops(const model_config *cfg, int B, int T);

/* For tests: <G, W> of a linear is computed from the weights when
 * ratio x its outputs < B x T, else from the activations (default 1.5); 0
 * and 1e30 force one route. Call before model_forward. */
void model_set_gw_weights_below(double ratio);

/* Random helpers shared by the trainer (xorshift*, as in llm.c). */
uint32_t model_random_u32(uint64_t *state);
float model_random_normal(uint64_t *state); /* standard normal (Box-Muller) */

#endif
