/* sreparam.h - σReparam for one linear layer (science.md §3).
 *
 * A reparametrized linear layer uses W_hat = (gamma / sigma(W)) W where sigma is
 * the spectral norm of W estimated by ONE power-iteration step per training
 * step, with the vectors u (in) and v (out) kept between steps.  This module
 * knows nothing of the model: it works on caller-owned buffers described by an
 * sreparam_linear.  It is not a general SVD library; sreparam_top_singular()
 * (LAPACK, double precision) exists for initialization and for tests.
 *
 * Weights are row-major (out x in), as in y = W x + b. */
#ifndef SREPARAM_H
#define SREPARAM_H

#include <stdint.h>

typedef struct {
    int out, in;     /* shape of W */
    float *w;        /* (out, in) trained weight; not owned */
    float *dw;       /* (out, in) its gradient (added into); not owned */
    float *gamma;    /* scalar learnable gain; not owned */
    float *dgamma;   /* its gradient (added into); not owned */
    float *weff;     /* (out, in) effective weight W_hat, written by sreparam_forward; not owned */
    float *dweff;    /* (out, in) dL/dW_hat, filled by the model's backward; not owned */
    float *u;        /* (in)  right singular vector estimate, unit norm; not owned */
    float *v;        /* (out) left singular vector estimate, unit norm; not owned */
    float sigma;     /* current estimate of sigma(W) = v^T W u */
} sreparam_linear;

/* One power-iteration step on the current W: v <- normalize(W u),
 * u <- normalize(W^T v), then sigma = v^T W u (which equals ||W^T v||).
 * A zero W leaves u, v unchanged and sets sigma to 0. */
void sreparam_power_step(sreparam_linear *l);

/* sigma = v^T W u with the stored vectors and no update (eval mode). */
float sreparam_sigma(const sreparam_linear *l);

/* weff = (gamma / sigma) * w, using l->sigma. */
void sreparam_forward(sreparam_linear *l);

/* Maps G = dweff to the trained parameters, with u and v held constant:
 *   dgamma += <G, W> / sigma                     (only if learn_gamma)
 *   dw     += (gamma / sigma) G - (gamma / sigma^2) <G, W> v u^T
 * Adds into dw and dgamma; reads dweff, w, u, v, gamma, sigma. */
void sreparam_backward(sreparam_linear *l, int learn_gamma);

/* Largest singular value of w (out x in) by LAPACK SVD in double precision.
 * If u (in) / v (out) are not NULL they receive the top right / left singular
 * vectors (unit norm).  Returns -1 if LAPACK fails or memory runs out. */
double sreparam_top_singular(const float *w, int out, int in, float *u, float *v);

#endif
