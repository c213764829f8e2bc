/* sreparam.h - σReparam for one linear layer (science.md §3).
 *
 * A reparametrized linear layer uses W_hat = (gamma / sigma(W)) W where sigma is
 * the spectral norm of W estimated by ONE power-iteration step per training
 * step, with the vectors u (in) and v (out) kept between steps.  This module
 * knows nothing of the model: it works on caller-owned buffers described by an
 * sreparam_linear.  It is not a general SVD library; sreparam_top_singular()
 * (LAPACK, double precision) exists for initialization and for tests.
 *
 * W_hat is a scalar times W, so a model need not materialize it: it runs its
 * matmuls on W with sreparam_scale() as the GEMM's alpha, and maps the
 * gradient with sreparam_grad_sigma() (see model.c).  sreparam_forward() and
 * sreparam_backward() are the plain, materializing forms: for probes that
 * want W_hat itself, and as the reference the fused form is tested against.
 *
 * Weights are row-major (out x in), as in y = W x + b. */
#ifndef SREPARAM_H
#define SREPARAM_H

#include <stdint.h>

typedef struct {
    int out, in;   /* shape of W */
    float *w;      /* (out, in) trained weight; not owned */
    float *dw;     /* (out, in) its gradient (added into); not owned */
    float *gamma;  /* scalar learnable gain; not owned */
    float *dgamma; /* its gradient (added into); not owned */
    float *weff;   /* (out, in) W_hat, written by sreparam_forward; not owned; may be NULL */
    float *u;      /* (in)  right singular vector estimate, unit norm; not owned */
    float *v;      /* (out) left singular vector estimate, unit norm; not owned */
    float sigma;   /* current estimate of sigma(W) = v^T W u */
} sreparam_linear;

/* One power-iteration step on the current W: v <- normalize(W u),
 * u <- normalize(W^T v), then sigma = v^T W u (which equals ||W^T v||).
 * Reads W once: W^T (W u) is accumulated row by row while W u is formed,
 * and the normalization of v is a scalar applied afterwards.  work holds
 * `in` floats of scratch.  A zero W sets v and sigma to 0, keeps u. */
void sreparam_power_step(sreparam_linear *l, float *work);

/* sigma = v^T W u with the stored vectors and no update (eval mode). */
float sreparam_sigma(const sreparam_linear *l);

/* gamma / sigma: W_hat = sreparam_scale(l) * W. */
float sreparam_scale(const sreparam_linear *l);

/* weff = sreparam_scale(l) * w. */
void sreparam_forward(sreparam_linear *l);

/* The gradient through sigma, given gw = <G, W> for G = dL/dW_hat, with u
 * and v held constant:
 *   dgamma += gw / sigma                         (only if learn_gamma)
 * and returns c = gamma gw / sigma^2, the coefficient of the rank-one term of
 *   dW = (gamma / sigma) G - c v u^T,
 * which the caller applies (the model fuses it with its gradient reduction). */
float sreparam_grad_sigma(sreparam_linear *l, double gw, int learn_gamma);

/* Reference form of the whole backward for a materialized G (out, in):
 * dgamma as above and dw += (gamma / sigma) G - c v u^T.  Adds into dw and
 * dgamma; reads g, w, u, v, gamma, sigma. */
void sreparam_backward(sreparam_linear *l, const float *g, int learn_gamma);

/* Largest singular value of w (out x in) by LAPACK SVD in double precision.
 * If u (in) / v (out) are not NULL they receive the top right / left singular
 * vectors (unit norm).  Returns -1 if LAPACK fails or memory runs out. */
double sreparam_top_singular(const float *w, int out, int in, float *u, float *v);

#endif
