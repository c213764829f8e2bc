/* sreparam.c - power iteration and the reparametrized weight's forward and
 * backward.  See sreparam.h for the contract, science.md §3 for the formulas. */
#include "sreparam.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>

static double dot_f(const float *a, const float *b, long n) {
    double s = 0.0; /* double: <G, W> sums up to ~1e6 terms of mixed sign */
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Dot product with 16 partial sums, so that it vectorizes without
 * -ffast-math (a single float accumulator may not be reordered). */
static float dot16(const float *restrict x, const float *restrict y, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[i + k] * y[i + k];
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += acc[k];
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

void sreparam_power_step(sreparam_linear *l, float *work) {
    int out = l->out, in = l->in;
    float *restrict wt = work; /* W^T (W u), before v's normalization */
    for (int i = 0; i < in; i++) wt[i] = 0.0f;
    for (int o = 0; o < out; o++) { /* the row stays in L1 between its two uses */
        const float *restrict row = l->w + (long)o * in;
        float vo = dot16(row, l->u, in);
        l->v[o] = vo;
        for (int i = 0; i < in; i++) wt[i] += vo * row[i];
    }
    float nv = cblas_snrm2(out, l->v, 1);
    if (!(nv > 0.0f)) {
        l->sigma = 0.0f;
        return;
    }
    cblas_sscal(out, 1.0f / nv, l->v, 1);
    /* W^T v = wt / ||W u||;  u <- W^T v normalized;  sigma = ||W^T v||. */
    float nu = cblas_snrm2(in, wt, 1) / nv;
    if (!(nu > 0.0f)) {
        l->sigma = 0.0f;
        return;
    }
    float k = 1.0f / (nu * nv);
    for (int i = 0; i < in; i++) l->u[i] = wt[i] * k;
    l->sigma = nu;
}

float sreparam_sigma(const sreparam_linear *l) {
    double s = 0.0;
    for (int o = 0; o < l->out; o++) s += (double)l->v[o] * dot_f(l->w + (long)o * l->in, l->u, l->in);
    return (float)s;
}

float sreparam_scale(const sreparam_linear *l) { return *l->gamma / l->sigma; }

void sreparam_forward(sreparam_linear *l) {
    long n = (long)l->out * l->in;
    float scale = sreparam_scale(l);
    const float *w = l->w;
    float *we = l->weff;
    for (long i = 0; i < n; i++) we[i] = scale * w[i];
}

float sreparam_grad_sigma(sreparam_linear *l, double gw, int learn_gamma) {
    float sigma = l->sigma;
    if (learn_gamma) *l->dgamma += (float)(gw / sigma);
    return (float)(*l->gamma * gw / ((double)sigma * sigma));
}

void sreparam_backward(sreparam_linear *l, const float *g, int learn_gamma) {
    long n = (long)l->out * l->in;
    float a = sreparam_scale(l);
    float c = sreparam_grad_sigma(l, dot_f(g, l->w, n), learn_gamma);
    for (int o = 0; o < l->out; o++) {
        float cv = c * l->v[o];
        float *dw = l->dw + (long)o * l->in;
        const float *go = g + (long)o * l->in;
        for (int i = 0; i < l->in; i++) dw[i] += a * go[i] - cv * l->u[i];
    }
}

double sreparam_top_singular(const float *w, int out, int in, float *u, float *v) {
    int k = out < in ? out : in;
    double *a = malloc(sizeof(double) * (size_t)out * in);
    double *s = malloc(sizeof(double) * (size_t)k);
    double *uu = malloc(sizeof(double) * (size_t)out * k);
    double *vt = malloc(sizeof(double) * (size_t)k * in);
    double *superb = malloc(sizeof(double) * (size_t)(k > 1 ? k : 2));
    double top = -1.0;
    if (!a || !s || !uu || !vt || !superb) goto out;
    for (long i = 0; i < (long)out * in; i++) a[i] = w[i];
    if (LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', out, in, a, in, s, uu, k, vt, in, superb) != 0) goto out;
    top = s[0];
    if (v)
        for (int o = 0; o < out; o++) v[o] = (float)uu[(long)o * k];
    if (u)
        for (int i = 0; i < in; i++) u[i] = (float)vt[i];
out:
    free(a);
    free(s);
    free(uu);
    free(vt);
    free(superb);
    return top;
}
