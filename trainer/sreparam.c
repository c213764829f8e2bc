/* sreparam.c - power iteration and the reparametrized weight's forward and
 * backward.  See sreparam.h for the contract, science.md §3 for the formulas. */
#include "sreparam.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>

static double dot_f(const float *a, const float *b, long n)
{
    double s = 0.0; /* double: <G, W> sums up to ~1e6 terms of mixed sign */
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

void sreparam_power_step(sreparam_linear *l)
{
    /* v <- W u */
    cblas_sgemv(CblasRowMajor, CblasNoTrans, l->out, l->in, 1.0f, l->w, l->in,
                l->u, 1, 0.0f, l->v, 1);
    float nv = cblas_snrm2(l->out, l->v, 1);
    if (!(nv > 0.0f)) { l->sigma = 0.0f; return; }
    cblas_sscal(l->out, 1.0f / nv, l->v, 1);
    /* u <- W^T v; sigma = v^T W u' = ||W^T v|| with u' the normalized W^T v. */
    cblas_sgemv(CblasRowMajor, CblasTrans, l->out, l->in, 1.0f, l->w, l->in,
                l->v, 1, 0.0f, l->u, 1);
    float nu = cblas_snrm2(l->in, l->u, 1);
    if (!(nu > 0.0f)) { l->sigma = 0.0f; return; }
    cblas_sscal(l->in, 1.0f / nu, l->u, 1);
    l->sigma = nu;
}

float sreparam_sigma(const sreparam_linear *l)
{
    double s = 0.0;
    for (int o = 0; o < l->out; o++)
        s += (double)l->v[o] * dot_f(l->w + (long)o * l->in, l->u, l->in);
    return (float)s;
}

void sreparam_forward(sreparam_linear *l)
{
    long n = (long)l->out * l->in;
    float scale = *l->gamma / l->sigma;
    const float *w = l->w;
    float *we = l->weff;
    for (long i = 0; i < n; i++) we[i] = scale * w[i];
}

void sreparam_backward(sreparam_linear *l, int learn_gamma)
{
    long n = (long)l->out * l->in;
    float sigma = l->sigma, gamma = *l->gamma;
    double gw = dot_f(l->dweff, l->w, n);
    if (learn_gamma) *l->dgamma += (float)(gw / sigma);
    float a = gamma / sigma;
    float c = (float)(gamma * gw / ((double)sigma * sigma));
    for (int o = 0; o < l->out; o++) {
        float cv = c * l->v[o];
        float *dw = l->dw + (long)o * l->in;
        const float *g = l->dweff + (long)o * l->in;
        const float *u = l->u;
        for (int i = 0; i < l->in; i++) dw[i] += a * g[i] - cv * u[i];
    }
}

double sreparam_top_singular(const float *w, int out, int in, float *u, float *v)
{
    int k = out < in ? out : in;
    double *a = malloc(sizeof(double) * (size_t)out * in);
    double *s = malloc(sizeof(double) * (size_t)k);
    double *uu = malloc(sizeof(double) * (size_t)out * k);
    double *vt = malloc(sizeof(double) * (size_t)k * in);
    double *superb = malloc(sizeof(double) * (size_t)(k > 1 ? k : 2));
    double top = -1.0;
    if (!a || !s || !uu || !vt || !superb) goto out;
    for (long i = 0; i < (long)out * in; i++) a[i] = w[i];
    if (LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', out, in, a, in, s, uu, k, vt, in,
                       superb) != 0)
        goto out;
    top = s[0];
    if (v) for (int o = 0; o < out; o++) v[o] = (float)uu[(long)o * k];
    if (u) for (int i = 0; i < in; i++) u[i] = (float)vt[i];
out:
    free(a); free(s); free(uu); free(vt); free(superb);
    return top;
}
