/* probe.h - collapse metrics of a sigmatrain model, read from what its last
 * forward pass holds (attention probabilities, qkv activations, layer inputs,
 * effective weights).  Definitions, normalizations and sources:
 * docs/science.md.
 *
 * What it is: per layer and head `entropy`, `entropy_norm`, `max_logit`,
 * `sigma_qk`, `entropy_bound`, `logit_scale`, `eig_mean`, `eig_var`; per layer `rank_ratio`,
 * `cos_sim`; per linear layer sigma(W) and gamma.  What it is not: a
 * telemetry client (telemetry.h moves the numbers) and never a forward pass.
 *
 * Batch subset.  The per-head and per-layer metrics are computed on the first
 * `examples` examples of the batch (default 4, PROBE_DEFAULT_EXAMPLES): the
 * entropy needs a logarithm per attention probability, B*H*T*T/2 per layer,
 * which on the benchmark config (B=16) costs more than the 3% budget of a
 * training step.  The examples are fresh every step (the loader moves on), so
 * the curves still cover the data; `examples = 0` uses the whole batch.
 *
 * Cost per logged step (nb examples used, d = C/H):
 *   entropy, entropy_norm, max_logit   O(nb H T^2) per layer (one pass over
 *       the probabilities with an 8-lane log) + O(nb H T d) dot products;
 *   entropy_bound, logit_scale   per example and layer the Gram matrix of
 *                   X_b (O(T C min(T, C))), Lanczos on it and one
 *                   Cholesky test (O(min(T, C)^3)); O(1) per row;
 *   sigma_qk        O(C d^2 + d^3) per head (two d x d Gram matrices, one
 *                   Cholesky, Lanczos and a Cholesky test on d x d, or
 *                   dsyevr for d <= 16; twice with a query bias), see probe.c;
 *   eig_mean/var    O(C d^2 + d^3) per head (one d x d product, LAPACK dgeev),
 *                   on every eig_every-th call only (default 8);
 *   rank_ratio, cos_sim  O(nb T C) per layer;
 *   sigma(W)        read from σReparam's own estimate; with --reparam none one
 *                   power-iteration step per linear layer (O(size of W)).
 *
 * All memory is allocated by probe_create, sized for the model's capacity
 * (B, T) and thread count; probe_compute allocates nothing and makes no
 * system call of its own.  It borrows the model's worker threads
 * (one model_parallel call, whole layers round-robin), which
 * idle between the forward and the backward; results do not depend on the
 * thread count beyond float rounding.  One probe, one caller thread. */
#ifndef PROBE_H
#define PROBE_H

#include "model.h"

#define PROBE_DEFAULT_EXAMPLES 4
#define PROBE_DEFAULT_ITERS 2
#define PROBE_DEFAULT_EIG_EVERY 8

typedef struct {
    int examples;  /* examples of the batch used (first ones); 0 = all;
                        default (negative) PROBE_DEFAULT_EXAMPLES */
    int iters;     /* unused since the norms behind sigma_qk and the bound
                        are certified (kept for callers' configs); <= 0:
                        PROBE_DEFAULT_ITERS */
    int eig_every; /* eig_mean/eig_var on every eig_every-th call (the first
                        included): a dgeev per head costs about as much as
                        all the rest of the probe at d = 32; <= 0:
                        PROBE_DEFAULT_EIG_EVERY */
} probe_config;

/* Metrics of the last probe_compute.  Head arrays are (L, H) row-major
 * [layer][head]; layer arrays (L).  Owned by the probe. */
typedef struct {
    int layers, heads;
    float *entropy;                        /* mean over examples and rows of Ent(A_i), nats */
    float *entropy_norm;                   /* mean over examples and rows i >= 1 of Ent(A_i)/log(i+1) */
    float *max_logit;                      /* max |a_ij| over examples and unmasked (i, j), scaled logits */
    float *sigma_qk;                       /* ||W_Q^h W_K^h^T||_2 / sqrt(d), certified: never below the
                             exact value, at most ~1e-7 relative above it */
    float *entropy_bound;                  /* Theorem 3.1 per row (T_i keys, argument s_i below),
                             averaged like entropy; never above the exact bound */
    float *logit_scale;                    /* max over examples and rows of s_i = ||[W_Q^h|b_Q^h]^T W_K^h||_2
                             / sqrt(d) * ||[x_i; 1]|| * ||X_b||_2: a certified upper bound
                             on the centred L2 norm of every logit row */
    float *eig_mean;                       /* mean of the d eigenvalues of M = W_K^h^T W_Q^h / sqrt(d)
                             (real: the trace is) */
    float *eig_var;                        /* mean over those d of |lambda - eig_mean|^2 (complex
                             lambda from LAPACK dgeev): >= 0 */
    float *rank_ratio;                     /* ||X - 1 mean(X)||_F / ||X||_F of the attention input */
    float *cos_sim;                        /* mean pairwise cosine similarity of its rows */
    float *lin_sigma[MODEL_LIN_PER_LAYER]; /* sigma(W) per layer: qkv, attproj, fc, fcproj */
    float *lin_gamma[MODEL_LIN_PER_LAYER]; /* gamma per layer (1 with --reparam none) */
    float lm_sigma, lm_gamma;              /* the LM head */
    int eig_fresh;                         /* eig_mean/eig_var were computed by the last call
                             (else they hold an earlier call's values) */
    int examples_used;                     /* nb of the last compute */
    double seconds;                        /* wall time of the last probe_compute */
} probe_metrics;

/* Names of lin_sigma[k] / lin_gamma[k] as telemetry metrics:
 * "sigma_qkv", "gamma_qkv", "sigma_attproj", ... ; and "sigma_lmhead",
 * "gamma_lmhead" for the scalars. */
extern const char *const probe_lin_sigma_names[MODEL_LIN_PER_LAYER];
extern const char *const probe_lin_gamma_names[MODEL_LIN_PER_LAYER];

typedef struct probe probe;

/* Allocates a probe for model m (its L, H, C, capacity B x T) and seeds the
 * power-iteration vectors deterministically.  cfg may be NULL (defaults).
 * Returns NULL when out of memory.  probe_destroy accepts NULL. */
probe *probe_create(const model *m, const probe_config *cfg);
void probe_destroy(probe *p);

/* Computes every metric from m's last forward (m->cur_B, m->cur_T): call it
 * after model_forward and before the optimizer changes the parameters (the
 * biases and, with --reparam none, the weights are read from the parameters;
 * the attention they produced is the forward's).  Advances the persistent
 * power-iteration warm starts (the certified values do not depend on them).
 * Returns the metrics (owned by p, overwritten by the next call).  Allocates
 * nothing. */
const probe_metrics *probe_compute(probe *p, model *m);

/* Theorem 3.1 (science.md §2): the lowest entropy (nats) of a softmax over
 * T logits whose centred L2 norm is at most s.  T <= 1 gives 0, s <= 0 gives
 * log T.  Non-increasing in s. */
double probe_entropy_bound(int T, double s);

#endif
