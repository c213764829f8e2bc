/* probe.c - collapse metrics from a model's last forward (see probe.h).
 *
 * Choices worth knowing:
 *
 * max_logit is recovered, not recomputed.  Recomputing every logit from q
 * and k costs B*H*T*T/2*d multiply-adds per layer (~2.7 ms a step on the
 * benchmark config, the whole telemetry budget), and storing the logits in
 * the forward would cost the trainer memory and a write per logit on every
 * step, logged or not.  Within a row, softmax is monotone and
 * log A_ij - log A_ik = a_ij - a_ik, so one dot product per row gives
 * everything: the largest logit is a_ij* = q_i.k_j* / sqrt(d) at j* = argmax
 * A_ij, and the smallest is a_ij* + log(min A / max A).  Both extremes come
 * from the same pass that computes the entropy.  Only when min A / max A is
 * below 1e-36 (its logit is more than ~83 below the row's maximum, where the
 * probability may be clamped, denormal or 0) is that row's minimum
 * computed exactly from q and k: the cost grows only in collapsed heads.
 * (The model's softmax clamps exp's argument at -87, so a ratio below
 * e^-83 is not trusted either.)
 *
 * entropy_bound per row.  Theorem 3.1 bounds the entropy of a softmax over
 * T keys from below by a function of any s >= the centred L2 norm of the
 * logit row, non-increasing in s.  The key bias adds q_i . b_K to every
 * logit of row i, which the softmax ignores, so only the query bias
 * enters: a_ij = x~_i^T P~ x_j / sqrt(d) + (row constant) with
 * x~_i = [x_i; 1] and P~ = [W_Q^h | b_Q^h]^T W_K^h ((C+1) x C), so
 * ||a_i - mean|| <= ||x~_i|| ||P~||_2 / sqrt(d) ||X_b||_2 = s_i, using the
 * spectral norm of the whole example X_b (a prefix's is no larger).  (No
 * query bias: x~_i = x_i and P~ = W_Q^h W_K^h^T, the sigma_qk matrix.)
 * Every norm in s_i is certified, never an under-estimate (an
 * under-estimated norm would lift the bound above the truth):
 *  - ||P~||_2^2 = lambda_max(Lk^T G~q Lk) with the d x d Gram matrices
 *    G~q = [W_Q|b_Q][W_Q|b_Q]^T = Gq + b_Q b_Q^T, Gk = W_K W_K^T = Lk Lk^T
 *    (Cholesky): the C x C product is never formed;
 *  - ||X_b||_2^2 = lambda_max of X_b's Gram matrix, per example;
 *  - each lambda_max by top_eig_upper (Lanczos for a lower estimate, a
 *    Cholesky factorization of mu I - G to prove mu is above it, LAPACK
 *    dsyevr when that fails), rounded up to float; the row norms and the
 *    product get a 1 + 1e-5 factor for float rounding.
 * sigma_qk is ||W_Q^h W_K^h^T||_2 / sqrt(d) by the same route (weights
 * only, no bias), within ~1e-9 relative above the exact value.
 * logit_scale is the largest s_i of the head, the bound's argument.
 *
 * Eigenspectrum.  The d non-zero eigenvalues of W_Q^h W_K^h^T / sqrt(d)
 * are those of M = W_K^h^T W_Q^h / sqrt(d) (d x d), complex in general:
 * LAPACK dgeev.  eig_mean is their mean (real: the trace), eig_var the mean
 * of |lambda - eig_mean|^2, a variance of complex numbers, so >= 0.  Both
 * over d, not C: the C - d structural zeros come from the head split, not
 * from training (docs/science.md gives the conversion).
 *
 * Entropy uses a Cephes-style log on the floats' bits (relative error
 * ~1e-7) with 16 partial sums, and integer max/min on the probabilities'
 * bit patterns (non-negative floats order like their bits), written in GCC
 * vector extensions: GCC 12 left the same loop in plain C scalar, which made
 * the entropy pass ~3x slower (no -ffast-math either way). */
#include "probe.h"
#include "now.h"

#include <cblas.h>
#include <lapacke.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const probe_lin_sigma_names[MODEL_LIN_PER_LAYER] = {"sigma_qkv", "sigma_attproj", "sigma_fc",
                                                                "sigma_fcproj"};
const char *const probe_lin_gamma_names[MODEL_LIN_PER_LAYER] = {"gamma_qkv", "gamma_attproj", "gamma_fc",
                                                                "gamma_fcproj"};

/* Lanczos steps at most per certified eigenvalue (top_eig_upper). */
#ifndef PROBE_DIRECT_MAX
#define PROBE_DIRECT_MAX 16
#endif
#define PROBE_LANCZOS_MAX 24

/* One thread's scratch. */
typedef struct {
    float *xn;     /* (T) ||x_i|| */
    float *tmp_c;  /* (C) */
    float *scores; /* (T*T) one example's q.k of a head, for rows whose probabilities underflow */
    /* double precision, for the certified norms and the eigenspectrum */
    double *wq, *wk;               /* (d*C) a head's W_Q^h^T, W_K^h^T rows */
    double *gq, *lk, *s, *t1, *mm; /* (d*d) */
    float *gf;                     /* (nx*nx) an example's Gram matrix in float */
    double *g, *a;                 /* (nx*nx) its Gram matrix, the Cholesky test's matrix */
    double *v1, *v2;               /* (max(nx, d)) */
    double *q;                     /* ((PROBE_LANCZOS_MAX + 1) * max(nx, d)) Lanczos basis */
    double *work;                  /* LAPACK workspace (lwork) */
    int *iwork;                    /* (10*nx) */
} probe_scratch;


struct probe {
    probe_config cfg;
    int L, H, C, d, B, T, nlin;
    probe_metrics out;
    float *metric_mem;
    int nx;        /* min(T, C): the largest Gram matrix of an example's input */
    int lwork;     /* doubles in probe_scratch.work */
    double *v_qk;  /* (L*H, d) warm starts of the top eigenvector of S (sigma_qk) */
    double *v_aug; /* (L*H, d) and of the b_Q-augmented S~ (the bound's sigma) */
    double *v_x;   /* (L, nx) and of an example's Gram matrix (shared by the examples) */
    int *n_x;      /* (L) dimension v_x was last used with */
    float *sig_b;  /* (L*H) the bound's sigma of each head, rounded up */
    float *rn;     /* (L, B, T) ||x~_i|| of each row of the examples used */
    float *xs;     /* (L, B) ||X_b||_2, rounded up */
    int *aug;      /* (L) layer has a non-zero query bias */
    int nscratch;  /* threads the scratch below is sized for */
    probe_scratch *scr;
    /* the current call, for the worker threads */
    model *m;
    int nb;
    long calls;      /* probe_compute calls so far */
    float *inv_log;  /* (T+1) 1/log(i) for i >= 2 */
    float *sq_ratio; /* (T+1) sqrt(i/(i-1)) */
    float *sq_prod;  /* (T+1) sqrt(i(i-1)) */
    float *lin_u;    /* --reparam none: own power-iteration vectors per linear */
    float *lin_v;
    size_t *lin_off_u, *lin_off_v;
};

static double now_s(void) { return now_mono_ms() / 1e3; }

static void random_unit(float *v, int n, uint64_t *rng) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        v[i] = model_random_normal(rng);
        s += (double)v[i] * v[i];
    }
    float k = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
    for (int i = 0; i < n; i++) v[i] *= k;
}

/* Fills v (n) with the unit vector (1, ..., 1) / sqrt(n): a deterministic
 * warm start; the certification below does not depend on it. */
static void flat_unit(double *v, int n) {
    for (int i = 0; i < n; i++) v[i] = 1.0 / sqrt((double)n);
}

/* Doubles of LAPACK workspace, enough for each use: dgeev (no vectors) on
 * d x d, dsyevr on at most nv x nv (26 nv), with room for the Lanczos
 * tridiagonal (4 PROBE_LANCZOS_MAX^2). */
static int lapack_lwork(int d, int nv) {
    double q = 0.0, dummy = 0.0, wr = 0.0, wi = 0.0;
    int lw = 0;
    if (LAPACKE_dgeev_work(LAPACK_COL_MAJOR, 'N', 'N', d, &dummy, d, &wr, &wi, NULL, 1, NULL, 1, &q, -1) == 0)
        lw = (int)q;
    int n = lw > 4 * d ? lw : 4 * d;
    int lanczos = 26 * nv + 4 * PROBE_LANCZOS_MAX * PROBE_LANCZOS_MAX;
    return n < lanczos ? lanczos : n;
}

/* One worker thread's scratch, sized from p (T, C, d, nx, lwork) and nv =
 * max(nx, d). Returns -1 out of memory; what was allocated is freed by
 * probe_destroy. */
static int scratch_alloc(probe_scratch *sc, const probe *p, int nv) {
    int T = p->T, C = p->C, d = p->d, nx = p->nx;
    sc->xn = malloc(sizeof(float) * T);
    sc->tmp_c = malloc(sizeof(float) * C);
    sc->scores = malloc(sizeof(float) * T * T);
    sc->wq = malloc(sizeof(double) * d * C);
    sc->wk = malloc(sizeof(double) * d * C);
    sc->gq = malloc(sizeof(double) * d * d);
    sc->lk = malloc(sizeof(double) * d * d);
    sc->s = malloc(sizeof(double) * d * d);
    sc->t1 = malloc(sizeof(double) * d * d);
    sc->mm = malloc(sizeof(double) * d * d);
    sc->gf = malloc(sizeof(float) * (size_t)nx * nx);
    sc->g = malloc(sizeof(double) * (size_t)nv * nv);
    sc->a = malloc(sizeof(double) * (size_t)nv * nv);
    sc->v1 = malloc(sizeof(double) * nv);
    sc->v2 = malloc(sizeof(double) * nv);
    sc->q = malloc(sizeof(double) * (PROBE_LANCZOS_MAX + 1) * nv);
    sc->work = malloc(sizeof(double) * p->lwork);
    sc->iwork = malloc(sizeof(int) * 10 * nv);
    if (!sc->xn || !sc->tmp_c || !sc->scores || !sc->wq || !sc->wk || !sc->gq || !sc->lk || !sc->s || !sc->t1 ||
        !sc->mm || !sc->gf || !sc->g || !sc->a || !sc->v1 || !sc->v2 || !sc->q || !sc->work || !sc->iwork)
        return -1;
    return 0;
}

/* The per-row-length constants of the entropy pass, for rows of 0..T
 * keys (rows of 0 and 1 key have no entropy: 0). */
static void row_tables_fill(probe *p) {
    p->inv_log[0] = p->inv_log[1] = 0.0f;
    p->sq_ratio[0] = p->sq_ratio[1] = p->sq_prod[0] = p->sq_prod[1] = 0.0f;
    for (int i = 2; i <= p->T; i++) {
        p->inv_log[i] = (float)(1.0 / log((double)i));
        p->sq_ratio[i] = (float)sqrt((double)i / (i - 1));
        p->sq_prod[i] = (float)sqrt((double)i * (i - 1));
    }
}

/* Points the output's arrays into the one metric_mem buffer: 8 head
 * metrics (L*H each), then 2 + 2 * MODEL_LIN_PER_LAYER layer metrics. */
static void metrics_carve(probe *p) {
    int L = p->L, H = p->H;
    size_t LH = (size_t)L * H;
    probe_metrics *o = &p->out;
    float *f = p->metric_mem;
    o->layers = L;
    o->heads = H;
    float **head[] = {&o->entropy,       &o->entropy_norm, &o->max_logit, &o->sigma_qk,
                      &o->entropy_bound, &o->logit_scale,  &o->eig_mean,  &o->eig_var};
    for (size_t i = 0; i < sizeof head / sizeof *head; i++, f += LH) *head[i] = f;
    float **layer[2 + 2 * MODEL_LIN_PER_LAYER] = {&o->rank_ratio, &o->cos_sim};
    for (int k = 0; k < MODEL_LIN_PER_LAYER; k++) {
        layer[2 + 2 * k] = &o->lin_sigma[k];
        layer[3 + 2 * k] = &o->lin_gamma[k];
    }
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++, f += L) *layer[i] = f;
}

probe *probe_create(const model *m, const probe_config *cfg) {
    probe *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cfg.examples = cfg && cfg->examples >= 0 ? cfg->examples : PROBE_DEFAULT_EXAMPLES;
    p->cfg.iters = cfg && cfg->iters > 0 ? cfg->iters : PROBE_DEFAULT_ITERS;
    p->cfg.eig_every = cfg && cfg->eig_every > 0 ? cfg->eig_every : PROBE_DEFAULT_EIG_EVERY;
    int L = p->L = m->cfg.layers, H = p->H = m->cfg.heads, C = p->C = m->cfg.dim;
    int d = p->d = C / H, T = p->T = m->T;
    p->B = m->B;
    p->nlin = m->num_linear;
    int nx = p->nx = T < C ? T : C, nv = nx > d ? nx : d;
    size_t LH = (size_t)L * H;
    p->lwork = lapack_lwork(d, nv);
    /* 8 head metrics, 2 + 2*4 layer metrics */
    p->metric_mem = calloc(8 * LH + 10 * (size_t)L, sizeof(float));
    p->v_qk = malloc(sizeof(double) * LH * d);
    p->v_aug = malloc(sizeof(double) * LH * d);
    p->v_x = malloc(sizeof(double) * L * nv);
    p->n_x = calloc(L, sizeof(int));
    p->sig_b = malloc(sizeof(float) * LH);
    p->rn = malloc(sizeof(float) * L * p->B * T);
    p->xs = malloc(sizeof(float) * L * p->B);
    p->aug = malloc(sizeof(int) * L);
    p->nscratch = m->nthreads > 0 ? m->nthreads : 1;
    p->scr = calloc(p->nscratch, sizeof *p->scr);
    if (!p->scr) goto err;
    for (int t = 0; t < p->nscratch; t++)
        if (scratch_alloc(&p->scr[t], p, nv)) goto err;
    p->inv_log = malloc(sizeof(float) * (T + 1));
    p->sq_ratio = malloc(sizeof(float) * (T + 1));
    p->sq_prod = malloc(sizeof(float) * (T + 1));
    p->lin_off_u = malloc(sizeof(size_t) * (p->nlin + 1));
    p->lin_off_v = malloc(sizeof(size_t) * (p->nlin + 1));
    if (!p->metric_mem || !p->v_qk || !p->v_aug || !p->v_x || !p->n_x || !p->sig_b || !p->rn || !p->xs || !p->aug ||
        !p->inv_log || !p->sq_ratio || !p->sq_prod || !p->lin_off_u || !p->lin_off_v)
        goto err;
    size_t su = 0, sv = 0;
    for (int i = 0; i < p->nlin; i++) {
        const sreparam_linear *l = model_linear(m, i);
        p->lin_off_u[i] = su;
        p->lin_off_v[i] = sv;
        su += (size_t)l->in;
        sv += (size_t)l->out;
    }
    p->lin_off_u[p->nlin] = su;
    p->lin_off_v[p->nlin] = sv;
    if (m->cfg.reparam == MODEL_REPARAM_NONE) {
        p->lin_u = malloc(sizeof(float) * su);
        p->lin_v = calloc(sv, sizeof(float));
        if (!p->lin_u || !p->lin_v) goto err;
    }
    uint64_t rng = 0x5eed5eedULL;
    for (size_t k = 0; k < LH; k++) {
        flat_unit(p->v_qk + k * d, d);
        flat_unit(p->v_aug + k * d, d);
    }
    if (p->lin_u)
        for (int i = 0; i < p->nlin; i++) random_unit(p->lin_u + p->lin_off_u[i], model_linear(m, i)->in, &rng);
    row_tables_fill(p);
    metrics_carve(p);
    return p;
err:
    probe_destroy(p);
    return NULL;
}

void probe_destroy(probe *p) {
    if (!p) return;
    free(p->metric_mem);
    free(p->v_qk);
    free(p->v_aug);
    free(p->v_x);
    free(p->n_x);
    free(p->sig_b);
    for (int t = 0; p->scr && t < p->nscratch; t++) {
        probe_scratch *sc = &p->scr[t];
        free(sc->xn);
        free(sc->tmp_c);
        free(sc->scores);
        free(sc->wq);
        free(sc->wk);
        free(sc->gq);
        free(sc->lk);
        free(sc->s);
        free(sc->t1);
        free(sc->mm);
        free(sc->gf);
        free(sc->g);
        free(sc->a);
        free(sc->v1);
        free(sc->v2);
        free(sc->q);
        free(sc->work);
        free(sc->iwork);
    }
    free(p->scr);
    free(p->rn);
    free(p->xs);
    free(p->aug);
    free(p->inv_log);
    free(p->sq_ratio);
    free(p->sq_prod);
    free(p->lin_u);
    free(p->lin_v);
    free(p->lin_off_u);
    free(p->lin_off_v);
    free(p);
}

double probe_entropy_bound(int T, double s) {
    if (T <= 1) return 0.0;
    if (!(s > 0.0)) return log((double)T);
    double r = s * sqrt((double)T / (T - 1));
    /* beta < 1e-26: the bound is below 1e-20 nats; 0 is still a lower bound */
    if (r > 60.0) return 0.0;
    double beta = exp(-r);
    double den = 1.0 + (T - 1) * beta;
    return log(den) + s * sqrt((double)T * (T - 1)) * beta / den;
}

/* ---- the pass over one attention row ------------------------------------- */

#define LANES 16

/* probe_entropy_bound in float with tables, for the per-row hot path. */
static inline float bound_f(const probe *p, int T, float s) {
    if (T <= 1) return 0.0f;
    float r = s * p->sq_ratio[T];
    if (!(r <= 60.0f)) return r > 60.0f ? 0.0f : NAN;
    float beta = expf(-r), den = 1.0f + (float)(T - 1) * beta;
    return logf(den) + s * p->sq_prod[T] * beta / den;
}

/* 8 floats / ints in one vector register (GCC/Clang vector extensions):
 * GCC 12 leaves the lane loop below scalar (its SLP pass gives up on the
 * int/float mix), so the entropy pass is written in vectors.  Casts between
 * vector types of one size reinterpret the bits. */
#pragma GCC diagnostic ignored "-Wpsabi" /* static functions only: no ABI to keep (builds without AVX) */
typedef float probe_v8f __attribute__((vector_size(32)));
typedef int32_t probe_v8i __attribute__((vector_size(32)));

/* log(x) on 8 lanes from the bits of positive normal floats (Cephes logf;
 * relative error ~1e-7).  Zero and denormals come out finite, near -87:
 * harmless, they are multiplied by themselves (so 0 log 0 = 0 without a
 * select).  Below sqrt(1/2) the mantissa is doubled and the exponent
 * lowered, branch-free. */
static inline probe_v8f log_bits_v(probe_v8i bits) {
    probe_v8i e = (bits >> 23) - 126; /* bits >= 0: non-negative floats */
    probe_v8i mb = (bits & 0x007fffff) | 0x3f000000;
    probe_v8f mf = (probe_v8f)mb;
    probe_v8f lt = __builtin_convertvector(-(probe_v8i)(mf < 0.70710678f), probe_v8f);
    probe_v8f x = mf - 1.0f + lt * mf;
    probe_v8f fe = __builtin_convertvector(e, probe_v8f) - lt;
    probe_v8f z = x * x;
    probe_v8f y = ((((((((7.0376836292E-2f * x - 1.1514610310E-1f) * x + 1.1676998740E-1f) * x - 1.2420140846E-1f) * x +
                       1.4249322787E-1f) *
                          x -
                      1.6668057665E-1f) *
                         x +
                     2.0000714765E-1f) *
                        x -
                    2.4999993993E-1f) *
                       x +
                   3.3333331174E-1f) *
                  x * z;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    return x + y + 0.693359375f * fe;
}

/* One 16-lane block of row_entropy: entries j + k < n count. */
static inline void entropy_block(const float *a, int j, int n, probe_v8f *acc, probe_v8i *hi, probe_v8i *lo) {
    const probe_v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int half = 0; half < 2; half++) {
        probe_v8i b;
        memcpy(&b, a + j + 8 * half, sizeof b);
        probe_v8i v = lane + (j + 8 * half) < n;  /* all ones inside the row, else 0 */
        probe_v8i m = (b & v) | (INT32_MAX & ~v); /* outside: never the minimum */
        probe_v8i g = b > *hi, l = m < *lo;
        *hi = (b & g) | (*hi & ~g);
        *lo = (m & l) | (*lo & ~l);
        acc[half] += (probe_v8f)b * log_bits_v(b);
    }
}

/* Entropy -sum a log a of a[0..n) (zeros contribute 0), and the bit
 * patterns of its largest and smallest entries.  Reads a[0..nread) with
 * nread >= n: entries past n must be 0 (the causal mask's upper triangle),
 * so whole 16-lane blocks can be read instead of a scalar tail; they are
 * kept out of the minimum.  A last partial block (nread not a multiple of
 * 16) is copied into a zero-padded block.  Probabilities are non-negative,
 * so their bit patterns order like the floats as signed integers too. */
__attribute__((noinline)) static float row_entropy(const float *a, int n, int nread, uint32_t *hi_out,
                                                   uint32_t *lo_out) {
    probe_v8f acc[2] = {{0}, {0}};
    probe_v8i hi = {0}, lo = hi + INT32_MAX;
    int j = 0;
    for (; j + LANES <= nread; j += LANES) entropy_block(a, j, n, acc, &hi, &lo);
    if (j < n) {
        float tail[LANES] = {0};
        memcpy(tail, a + j, sizeof(float) * (n - j));
        entropy_block(tail, 0, n - j, acc, &hi, &lo);
    }
    float s = 0.0f;
    int32_t h = 0, l = INT32_MAX;
    for (int k = 0; k < 8; k++) {
        s += acc[0][k] + acc[1][k];
        h = hi[k] > h ? hi[k] : h;
        l = lo[k] < l ? lo[k] : l;
    }
    *hi_out = (uint32_t)h;
    *lo_out = (uint32_t)l;
    return -s;
}

/* 8 partial sums: vectorizable without -ffast-math */
static inline float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

/* ---- power iterations ------------------------------------------------------ */

/* Cholesky factorization in place of the symmetric n x n matrix A
 * (row-major, lower triangle read and written: A = L L^T).  Returns 0 when
 * every pivot was positive (A is positive definite up to rounding), -1 at
 * the first pivot that is not (or not finite).  4 partial sums so the inner
 * products vectorize without -ffast-math. */
static int chol(double *A, int n) {
    for (int j = 0; j < n; j++) {
        double *aj = A + (size_t)j * n;
        for (int i = j; i < n; i++) {
            double *ai = A + (size_t)i * n;
            double acc[4] = {0.0, 0.0, 0.0, 0.0};
            int k = 0;
            for (; k + 4 <= j; k += 4)
                for (int u = 0; u < 4; u++) acc[u] += ai[k + u] * aj[k + u];
            double t = ai[j] - ((acc[0] + acc[1]) + (acc[2] + acc[3]));
            for (; k < j; k++) t -= ai[k] * aj[k];
            if (i == j) {
                if (!(t > 0.0) || !isfinite(t)) return -1;
                aj[j] = sqrt(t);
            } else {
                ai[j] = t / aj[j];
            }
        }
    }
    return 0;
}

/* The eigenvector z (k) of the symmetric tridiagonal matrix (diagonal
 * alpha, off-diagonal beta) for its largest eigenvalue rho, by two steps of
 * inverse iteration with the shift rho (1 + 1e-10) + tiny: the shifted
 * matrix is negative definite, so elimination without pivoting is stable.
 * c (k) scratch.  Only a warm start: accuracy is not critical. */
static void ritz_vector(const double *alpha, const double *beta, int k, double rho, double *z, double *c) {
    double sigma = rho + 1e-10 * fabs(rho) + 1e-300;
    for (int i = 0; i < k; i++) z[i] = 1.0;
    for (int it = 0; it < 2; it++) {
        /* solve (sigma I - T) y = z in place (SPD tridiagonal: -beta off the diagonal) */
        double den = sigma - alpha[0];
        c[0] = -beta[0] / den;
        z[0] /= den;
        for (int i = 1; i < k; i++) {
            den = (sigma - alpha[i]) + beta[i - 1] * c[i - 1];
            c[i] = i < k - 1 ? -beta[i] / den : 0.0;
            z[i] = (z[i] + beta[i - 1] * z[i - 1]) / den;
        }
        for (int i = k - 2; i >= 0; i--) z[i] -= c[i] * z[i + 1];
        double nz = cblas_dnrm2(k, z, 1);
        if (!(nz > 0.0) || !isfinite(nz)) {
            for (int i = 0; i < k; i++) z[i] = i == 0;
            return;
        }
        for (int i = 0; i < k; i++) z[i] /= nz;
    }
}

/* The largest eigenvalue of the symmetric n x n matrix G (row-major, both
 * triangles; tr its trace, > 0) by LAPACK dsyevr, plus 1e-9 tr: dsyevr's
 * absolute error is ~n u ||G|| and tr >= ||G|| for a PSD G, so the result
 * is never below lambda_max at the sizes here (n <= 1024).  a (n*n) scratch;
 * work/iwork as for top_eig_upper.  NaN when LAPACK fails. */
static double top_eig_direct(const double *G, int n, double tr, double *a, double *work, int lwork, int *iwork) {
    memcpy(a, G, sizeof(double) * (size_t)n * n);
    int found = 0, isuppz[2];
    double ev = NAN;
    if (LAPACKE_dsyevr_work(LAPACK_COL_MAJOR, 'N', 'I', 'U', n, a, n, 0.0, 0.0, n, n, 0.0, &found, &ev, NULL, 1, isuppz,
                            work, lwork, iwork, 10 * n) != 0 ||
        found != 1)
        return NAN;
    return ev + 1e-9 * tr;
}

/* A certified upper bound on the largest eigenvalue of the symmetric
 * positive semi-definite n x n matrix G (row-major, both triangles), at most
 * ~1e-7 relative above it when the estimate below has converged, never
 * below it.  n <= PROBE_DIRECT_MAX: top_eig_direct (measured faster at
 * d = 12, slower at d = 32).  Else: Lanczos from the warm start v (n;
 * replaced by the Ritz vector) gives the top Ritz value rho <= lambda_max,
 * a lower bound (stopped by its residual, so a fresh, well-separated top
 * eigenvalue takes a few steps);
 * lambda_max <= mu iff mu I - G is positive semi-definite, which a Cholesky
 * factorization of mu I - G proves (tried at mu = rho (1 + delta) for
 * growing delta).  When every try fails (a near-tie, or a start orthogonal
 * to the top eigenvector), LAPACK's dsyevr gives the value.  The result is
 * inflated by 1e-9 relative: far above the rounding of forming G in double
 * from float inputs (~n u ||G||) and the factorization's backward error
 * (~2 n^2 u ||mu I - G||) at the sizes here (n <= 1024).
 * Scratch: a (n*n), q (PROBE_LANCZOS_MAX + 1) * n; work/iwork LAPACK
 * workspaces (lwork >= 26 n + 4 PROBE_LANCZOS_MAX^2, liwork >= 10 n).
 * NaN when G is not finite. */
static double top_eig_upper(const double *G, int n, double *v, double *q, double *a, double *work, int lwork,
                            int *iwork) {
    double tr = 0.0;
    for (int i = 0; i < n; i++) tr += G[(size_t)i * n + i];
    if (!isfinite(tr)) return NAN;
    if (!(tr > 0.0)) return 0.0; /* PSD with zero trace: G = 0 */
    if (n <= PROBE_DIRECT_MAX) return top_eig_direct(G, n, tr, a, work, lwork, iwork);
    double vn = cblas_dnrm2(n, v, 1);
    if (!(vn > 0.0) || !isfinite(vn)) {
        flat_unit(v, n);
        vn = 1.0;
    }
    for (int i = 0; i < n; i++) q[i] = v[i] / vn;
    /* Lanczos with full reorthogonalization: basis q_0..q_k (rows of q) */
    int kmax = n < PROBE_LANCZOS_MAX ? n : PROBE_LANCZOS_MAX, k = 0;
    double *alpha = work, *beta = work + PROBE_LANCZOS_MAX, *dd = beta + PROBE_LANCZOS_MAX,
           *ee = dd + PROBE_LANCZOS_MAX, *z = ee + PROBE_LANCZOS_MAX, *lw = z + PROBE_LANCZOS_MAX * PROBE_LANCZOS_MAX;
    double rho = 0.0;
    int have = 0;
    while (k < kmax) {
        double *qk = q + (size_t)k * n, *w = q + (size_t)(k + 1) * n;
        cblas_dgemv(CblasRowMajor, CblasNoTrans, n, n, 1.0, G, n, qk, 1, 0.0, w, 1);
        alpha[k] = cblas_ddot(n, w, 1, qk, 1);
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j <= k; j++) {
                const double *qj = q + (size_t)j * n;
                cblas_daxpy(n, -cblas_ddot(n, w, 1, qj, 1), qj, 1, w, 1);
            }
        k++;
        beta[k - 1] = cblas_dnrm2(n, w, 1);
        /* top eigenvalue of the k x k tridiagonal (alpha, beta), every step:
         * O(k^2), nothing beside the O(n^2) matrix-vector product */
        memcpy(dd, alpha, sizeof(double) * k);
        memcpy(ee, beta, sizeof(double) * k);
        int last = !(beta[k - 1] > 1e-14 * tr) || k == kmax; /* invariant subspace, or the end */
        if (LAPACKE_dsterf_work(k, dd, ee) != 0) break;
        rho = dd[k - 1];
        have = k;
        if (last) break;
        /* The Ritz value's error is about r^2 / gap (r = beta_k |z_k|, the
         * residual of the Ritz pair; gap to the next Ritz value): stop when
         * it is far below the Cholesky test's first margin.  A wrong stop
         * costs only tightness: the test then proves a larger mu. */
        if (k >= 2) {
            ritz_vector(alpha, beta, k, rho, z, lw);
            double r = beta[k - 1] * fabs(z[k - 1]), gap = rho - dd[k - 2];
            if (r * r <= 1e-9 * rho * gap) break;
        }
        cblas_dscal(n, 1.0 / beta[k - 1], w, 1);
    }
    if (have) { /* the Ritz vector, the next call's warm start */
        ritz_vector(alpha, beta, have, rho, z, lw);
        memset(v, 0, sizeof(double) * n);
        for (int j = 0; j < have; j++) cblas_daxpy(n, z[j], q + (size_t)j * n, 1, v, 1);
    }
    static const double deltas[] = {1e-7, 1e-5, 1e-4, 1e-3};
    for (size_t t = 0; rho > 0.0 && t < sizeof deltas / sizeof deltas[0]; t++) {
        double mu = rho * (1.0 + deltas[t]);
        for (int i = 0; i < n; i++) {
            const double *gi = G + (size_t)i * n;
            double *ai = a + (size_t)i * n;
            for (int j = 0; j <= i; j++) ai[j] = -gi[j];
            ai[i] += mu;
        }
        if ((n < 64 ? chol(a, n) : LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'U', n, a, n)) == 0) return mu * (1.0 + 1e-9);
    }
    return top_eig_direct(G, n, tr, a, work, lwork, iwork);
}

/* x rounded up to a float (never below x). */
static float up_f(double x) {
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

/* The Gram matrix G = A A^T (n x n, both triangles) of the row-major n x k
 * matrix A. */
static void gram(const double *A, int n, int k, double *G) {
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, n, k, 1.0, A, k, 0.0, G, n);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) G[(size_t)i * n + j] = G[(size_t)j * n + i];
}

/* One power step on a linear layer's W with the probe's own vectors (used
 * with --reparam none, where the model keeps no sigma). */
static float lin_power(const sreparam_linear *l, float *u, float *v) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, l->out, l->in, 1.0f, l->w, l->in, u, 1, 0.0f, v, 1);
    float nv = cblas_snrm2(l->out, v, 1);
    if (!(nv > 0.0f) || !isfinite(nv)) return isfinite(nv) ? 0.0f : NAN;
    cblas_sscal(l->out, 1.0f / nv, v, 1);
    cblas_sgemv(CblasRowMajor, CblasTrans, l->out, l->in, 1.0f, l->w, l->in, v, 1, 0.0f, u, 1);
    float s = cblas_snrm2(l->in, u, 1);
    if (s > 0.0f && isfinite(s)) cblas_sscal(l->in, 1.0f / s, u, 1);
    return s;
}

/* ---- the driver ------------------------------------------------------------ */

static int any_nonzero(const float *x, int n) {
    for (int i = 0; i < n; i++)
        if (x[i] != 0.0f) return 1;
    return 0;
}

/* In place: x = (x + x^T) / 2 for the n x n row-major x. */
static void symmetrize(double *x, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double m = 0.5 * (x[(size_t)i * n + j] + x[(size_t)j * n + i]);
            x[(size_t)i * n + j] = x[(size_t)j * n + i] = m;
        }
}

/* Per-head weight metrics of layer l: sigma_qk, the bound's sigma, eig_mean,
 * eig_var (see the file comment). */
static void head_weights(probe *p, model *m, int l, int aug, probe_scratch *sc) {
    int H = p->H, C = p->C, d = p->d;
    const float *W = model_qkv_weight(m, l);
    const float *bias = m->params.qkvb + (size_t)l * 3 * C;
    double inv_sd = 1.0 / sqrt((double)d);
    for (int h = 0; h < H; h++) {
        size_t k = (size_t)l * H + h;
        const float *Wq = W + (size_t)h * d * C, *Wk = W + (size_t)C * C + (size_t)h * d * C;
        for (size_t i = 0; i < (size_t)d * C; i++) {
            sc->wq[i] = Wq[i];
            sc->wk[i] = Wk[i];
        }
        gram(sc->wq, d, C, sc->gq);
        gram(sc->wk, d, C, sc->lk);
        /* Gk = Lk Lk^T; a singular Gk gets a jitter eps I, which can only
         * raise the norm (Gk + eps I >= Gk): still an upper bound */
        double trk = 0.0;
        for (int a = 0; a < d; a++) trk += sc->lk[a * d + a];
        double sig = NAN, sigb = NAN;
        if (trk == 0.0) {
            sig = sigb = 0.0; /* W_K^h = 0: every logit is row-constant */
        } else if (isfinite(trk)) {
            memcpy(sc->t1, sc->lk, sizeof(double) * d * d);
            int ok = chol(sc->lk, d) == 0;
            for (double eps = 1e-13 * trk / d; !ok && eps < 1e-2 * trk; eps *= 100.0) {
                memcpy(sc->lk, sc->t1, sizeof(double) * d * d);
                for (int a = 0; a < d; a++) sc->lk[a * d + a] += eps;
                ok = chol(sc->lk, d) == 0;
            }
            if (ok) {
                for (int a = 0; a < d; a++)
                    for (int b = a + 1; b < d; b++) sc->lk[a * d + b] = 0.0;
                /* S = Lk^T Gq Lk has the squared singular values of W_Q^h W_K^h^T */
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, sc->gq, d, sc->lk, d, 0.0, sc->t1,
                            d);
                cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, d, 1.0, sc->lk, d, sc->t1, d, 0.0, sc->s, d);
                symmetrize(sc->s, d);
                double mu = top_eig_upper(sc->s, d, p->v_qk + k * d, sc->q, sc->g, sc->work, p->lwork, sc->iwork);
                sig = sqrt(mu / d);
                sigb = sig;
                if (aug) {
                    /* [W_Q | b_Q]: S~ = S + u u^T with u = Lk^T b_Q */
                    const float *bq = bias + (size_t)h * d;
                    for (int a = 0; a < d; a++) {
                        double u = 0.0;
                        for (int r = a; r < d; r++) u += sc->lk[r * d + a] * bq[r];
                        sc->v2[a] = u;
                    }
                    for (int a = 0; a < d; a++)
                        for (int b = 0; b < d; b++) sc->t1[a * d + b] = sc->s[a * d + b] + sc->v2[a] * sc->v2[b];
                    double mub =
                        top_eig_upper(sc->t1, d, p->v_aug + k * d, sc->q, sc->g, sc->work, p->lwork, sc->iwork);
                    sigb = sqrt(mub / d);
                }
            }
        }
        p->out.sigma_qk[k] = up_f(sig);
        p->sig_b[k] = up_f(sigb);
        if (!p->out.eig_fresh) continue;
        /* eigenspectrum of M = W_K^h^T W_Q^h / sqrt(d) (d x d): the d
         * eigenvalues of W_Q^h W_K^h^T / sqrt(d) that can be non-zero.
         * The row-major buffer read as column-major is M^T: same spectrum. */
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, C, inv_sd, sc->wk, C, sc->wq, C, 0.0, sc->mm, d);
        double *wr = sc->v1, *wi = sc->v2, mean = NAN, var = NAN;
        if (LAPACKE_dgeev_work(LAPACK_COL_MAJOR, 'N', 'N', d, sc->mm, d, wr, wi, NULL, 1, NULL, 1, sc->work,
                               p->lwork) == 0) {
            double mr = 0.0, mi = 0.0;
            for (int a = 0; a < d; a++) {
                mr += wr[a];
                mi += wi[a];
            }
            mr /= d;
            mi /= d;
            double v = 0.0;
            for (int a = 0; a < d; a++) v += (wr[a] - mr) * (wr[a] - mr) + (wi[a] - mi) * (wi[a] - mi);
            mean = mr; /* the imaginary parts come in conjugate pairs: mi is rounding */
            var = v / d;
        }
        p->out.eig_mean[k] = (float)mean;
        p->out.eig_var[k] = (float)var;
    }
}

/* ||X_b||_2^2 for one example's (T x C) attention input, certified: the
 * Gram matrix in the smaller of the two dimensions, in float (half the cost
 * of double; X is float anyway), whose rounding error E is bounded by
 * ||E||_2 <= gamma_k ||X||_F^2 (k the inner dimension, gamma_k = k u / (1 - k u),
 * u = 2^-24, any summation order) and added; then top_eig_upper.  fro2 is
 * ||X_b||_F^2 (any over-estimate will do). */
static double x_norm2(probe *p, int l, const float *Xb, int T, double fro2, probe_scratch *sc) {
    int C = p->C, n = T < C ? T : C, k = T < C ? C : T, nv = p->nx > p->d ? p->nx : p->d;
    float *gf = sc->gf;
    if (n == T) cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, T, C, 1.0f, Xb, C, 0.0f, gf, T);
    else cblas_ssyrk(CblasRowMajor, CblasLower, CblasTrans, C, T, 1.0f, Xb, C, 0.0f, gf, C);
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) sc->g[(size_t)i * n + j] = sc->g[(size_t)j * n + i] = gf[(size_t)i * n + j];
    double u = FLT_EPSILON / 2, gamma = k * u / (1.0 - k * u);
    double *v = p->v_x + (size_t)l * nv;
    if (p->n_x[l] != n) {
        flat_unit(v, n);
        p->n_x[l] = n;
    }
    return top_eig_upper(sc->g, n, v, sc->q, sc->a, sc->work, p->lwork, sc->iwork) + gamma * fro2 * (1.0 + 1e-6);
}

/* One layer: weight metrics, row norms, rank_ratio, cos_sim, ||X_b||_2. */
static void layer_pass(probe *p, int l, probe_scratch *sc) {
    model *m = p->m;
    int C = p->C, T = m->cur_T, nb = p->nb;
    const float *bias = m->params.qkvb + (size_t)l * 3 * C;
    /* only the query bias enters the bound: q_i . b_K is constant along a
     * row, which the softmax ignores */
    int aug = p->aug[l] = any_nonzero(bias, C);
    head_weights(p, m, l, aug, sc);
    const float *X = model_attn_input(m, l);
    double rank_sum = 0.0, cos_sum = 0.0;
    for (int b = 0; b < nb; b++) {
        const float *Xb = X + (size_t)b * T * C;
        float *rn = p->rn + ((size_t)l * p->B + b) * T, *xn = sc->xn, *mean = sc->tmp_c;
        double fro2 = 0.0, mu2 = 0.0, um2 = 0.0;
        memset(mean, 0, sizeof(float) * C);
        for (int i = 0; i < T; i++) {
            const float *x = Xb + (size_t)i * C;
            float n2 = dot(x, x, C);
            fro2 += n2;
            xn[i] = sqrtf(n2);
            rn[i] = sqrtf(n2 + (float)aug);
            for (int c = 0; c < C; c++) mean[c] += x[c];
        }
        for (int c = 0; c < C; c++) {
            double mc = mean[c] / T;
            mu2 += mc * mc;
        }
        /* mean of the unit rows */
        memset(mean, 0, sizeof(float) * C);
        for (int i = 0; i < T; i++) {
            const float *x = Xb + (size_t)i * C;
            float k = xn[i] > 0.0f ? 1.0f / xn[i] : 0.0f;
            for (int c = 0; c < C; c++) mean[c] += x[c] * k;
        }
        for (int c = 0; c < C; c++) {
            double mc = mean[c] / T;
            um2 += mc * mc;
        }
        double res2 = fro2 - T * mu2;
        rank_sum += fro2 > 0 ? sqrt(res2 > 0 ? res2 / fro2 : 0.0) : 0.0;
        cos_sum += T > 1 ? (T * um2 - 1.0) / (T - 1) : 1.0;
        p->xs[(size_t)l * p->B + b] = up_f(sqrt(x_norm2(p, l, Xb, T, fro2, sc)));
    }
    p->out.rank_ratio[l] = (float)(rank_sum / nb);
    p->out.cos_sim[l] = (float)(cos_sum / nb);
}

/* One head (after its layer's layer_pass): the pass over its attention rows. */
static void head_pass(probe *p, int l, int h, probe_scratch *sc) {
    model *m = p->m;
    int H = p->H, C = p->C, d = p->d, T = m->cur_T, nb = p->nb;
    size_t k = (size_t)l * H + h;
    const float *qkv = model_qkv(m, l), *att = model_attention(m, l);
    float inv_sd = 1.0f / sqrtf((float)d);
    double e_sum = 0.0, en_sum = 0.0, b_sum = 0.0;
    float ml = 0.0f, smax = 0.0f;
    for (int b = 0; b < nb; b++) {
        const float *A = att + (size_t)(b * H + h) * T * T;
        const float *qb = qkv + (size_t)b * T * 3 * C + h * d;
        const float *kb = qb + C;
        const float *rn = p->rn + ((size_t)l * p->B + b) * T;
        /* 1 + 1e-5 covers the float rounding of the row norms rn (relative
         * error <= C u / 2 ~ 4e-6 at C = 128) and of this product */
        double sx = (double)p->sig_b[k] * p->xs[(size_t)l * p->B + b] * (1.0 + 1e-5);
        int have_scores = 0; /* sc->scores holds this example's Q K^T */
        for (int i = 0; i < T; i++) {
            const float *row = A + (size_t)i * T;
            uint32_t hi, lo;
            int nread = (i + LANES) / LANES * LANES;
            float e = row_entropy(row, i + 1, nread <= T ? nread : i + 1, &hi, &lo);
            e_sum += e;
            en_sum += e * p->inv_log[i + 1];
            float si = up_f(sx * rn[i]);
            b_sum += bound_f(p, i + 1, si);
            if (!(si <= smax)) smax = si; /* NaN propagates */
            /* logits at the row's extremes (see the file comment), anchored
             * on the diagonal a_ii when its probability is usable, else on
             * the argmax */
            const float *q = qb + (size_t)i * 3 * C;
            float mx, mn;
            memcpy(&mx, &hi, sizeof mx);
            memcpy(&mn, &lo, sizeof mn);
            float amax;
            if (row[i] / mx > 1e-36f) {
                amax = dot(q, kb + (size_t)i * 3 * C, d) * inv_sd + logf(mx / row[i]);
            } else {
                int js = 0;
                while (js < i && row[js] != mx) js++;
                amax = dot(q, kb + (size_t)js * 3 * C, d) * inv_sd;
            }
            float amin;
            float ratio = mn / mx;
            /* the forward clamps exp's argument at -87: trust the ratio
             * only well inside that range (e^-82.9) */
            if (ratio > 1e-36f) {
                amin = amax + logf(ratio);
            } else {
                /* recompute the row's logits; in a collapsed head most rows
                 * come here, so the whole example's Q K^T at once (one sgemm,
                 * rows of qkv are 3C apart) beats a dot product per logit */
                if (!have_scores) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, d, 1.0f, qb, 3 * C, kb, 3 * C, 0.0f,
                                sc->scores, T);
                    have_scores = 1;
                }
                const float *srow = sc->scores + (size_t)i * T;
                amin = amax;
                for (int j = 0; j <= i; j++) {
                    float a = srow[j] * inv_sd;
                    amin = a < amin ? a : amin;
                }
            }
            float am = fabsf(amax) > fabsf(amin) ? fabsf(amax) : fabsf(amin);
            if (!(am <= ml)) ml = am; /* NaN propagates */
        }
    }
    p->out.entropy[k] = (float)(e_sum / ((double)nb * T));
    p->out.entropy_norm[k] = T > 1 ? (float)(en_sum / ((double)nb * (T - 1))) : NAN;
    p->out.entropy_bound[k] = (float)(b_sum / ((double)nb * T));
    p->out.max_logit[k] = ml;
    p->out.logit_scale[k] = smax;
}

/* model_parallel task: whole layers round-robin over the threads, so one
 * hand-off covers everything (each hand-off to a worker can cost a scheduler
 * slice on a busy machine). */
static void probe_task(void *ctx, int t, int nt) {
    probe *p = ctx;
    for (int l = t; l < p->L; l += nt) {
        layer_pass(p, l, &p->scr[t]);
        for (int h = 0; h < p->H; h++) head_pass(p, l, h, &p->scr[t]);
    }
}

const probe_metrics *probe_compute(probe *p, model *m) {
    double t0 = now_s();
    probe_metrics *o = &p->out;
    int B = m->cur_B;
    p->m = m;
    p->nb = p->cfg.examples > 0 && p->cfg.examples < B ? p->cfg.examples : B;
    o->examples_used = p->nb;
    o->eig_fresh = p->calls++ % p->cfg.eig_every == 0;
    /* The model's worker threads idle between forward/backward jobs: the
     * probe borrows them (a model with one thread runs it here). */
    int par = m->nthreads > 1 && m->nthreads <= p->nscratch;
    if (par) model_parallel(m, probe_task, p);
    else probe_task(p, 0, 1);
    /* linear layers */
    int none = m->cfg.reparam == MODEL_REPARAM_NONE;
    for (int i = 0; i < p->nlin; i++) {
        const sreparam_linear *lin = model_linear(m, i);
        float s, g;
        if (none) {
            s = lin_power(lin, p->lin_u + p->lin_off_u[i], p->lin_v + p->lin_off_v[i]);
            g = 1.0f;
        } else {
            s = lin->sigma;
            g = *lin->gamma;
        }
        if (i == p->nlin - 1) {
            o->lm_sigma = s;
            o->lm_gamma = g;
        } else {
            o->lin_sigma[i % MODEL_LIN_PER_LAYER][i / MODEL_LIN_PER_LAYER] = s;
            o->lin_gamma[i % MODEL_LIN_PER_LAYER][i / MODEL_LIN_PER_LAYER] = g;
        }
    }
    o->seconds = now_s() - t0;
    return o;
}
