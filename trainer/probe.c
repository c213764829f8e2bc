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
 * logit row, non-increasing in s.  For row i (keys 0..i, T_i = i+1):
 * a_ij = x~_i^T P x~_j / sqrt(d), so ||a_i|| <= ||x~_i|| ||P||_2/sqrt(d)
 * ||X~_{0..i}||_2 <= ||x~_i|| sigma ||X~||_2, using the spectral norm of the
 * whole example X (a prefix's norm is no larger) and the row's own norm
 * (tighter than the paper's ||X||_2^2, and valid per row).  The model's q and
 * k have biases: q_i = W_Q x_i + b_Q is x~_i = [x_i; 1] times [W_Q | b_Q], so
 * when a layer's q/k biases are not all zero, P, x~_i and X~ carry that extra
 * column (a second power iteration per head; sigma_qk itself stays the norm
 * of the weights only, as specified).  Power iteration approaches a norm
 * from below, so the bound is valid up to its convergence: persistent vectors
 * (converged by PROBE_WARMUP_ITERS steps on the first call, when they are
 * cold) and PROBE_DEFAULT_ITERS steps per call keep it converged while the
 * weights move slowly; tests/test_probe.c checks entropy >= bound.
 *
 * Entropy uses a vectorizable Cephes-style log (relative error ~1e-7) with
 * 16 partial sums, and integer max/min on the probabilities' bit patterns
 * (non-negative floats order like their bits), so GCC vectorizes the pass
 * without -ffast-math. */
#include "probe.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const probe_lin_sigma_names[MODEL_LIN_PER_LAYER] = {"sigma_qkv", "sigma_attproj",
                                                                "sigma_fc", "sigma_fcproj"};
const char *const probe_lin_gamma_names[MODEL_LIN_PER_LAYER] = {"gamma_qkv", "gamma_attproj",
                                                                "gamma_fc", "gamma_fcproj"};

/* One thread's scratch. */
typedef struct {
    float *xn;       /* (T) ||x_i|| */
    float *tmp_t;    /* (T) */
    float *tmp_c;    /* (C+1) */
    float *tmp_d;    /* (2d) */
    float *mm;       /* (d*d) */
    float *scores;   /* (T*T) one example's q.k of a head, for rows whose probabilities underflow */
} probe_scratch;

#define PROBE_WARMUP_ITERS 50

struct probe {
    probe_config cfg;
    int L, H, C, d, B, T, nlin;
    probe_metrics out;
    float *metric_mem;
    float *u_qk;     /* (L*H, C) right vectors for sigma_qk */
    float *u_aug;    /* (L*H, C+1) right vectors of the bias-augmented product */
    float *xv;       /* (L, C+1) right vector of X~ (shared by the examples of a layer) */
    float *sig_b;    /* (L*H) the bound's sigma of each head */
    float *rn;       /* (L, B, T) ||x~_i|| of each row of the examples used */
    float *xs;       /* (L, B) ||X~_b||_2 */
    int *aug;        /* (L) layer has non-zero q/k biases */
    int nscratch;    /* threads the scratch below is sized for */
    probe_scratch *scr;
    /* the current call, for the worker threads */
    model *m;
    int nb;
    int iters;       /* power steps this call: more on the first (cold vectors) */
    long calls;
    float *inv_log;  /* (T+1) 1/log(i) for i >= 2 */
    float *sq_ratio; /* (T+1) sqrt(i/(i-1)) */
    float *sq_prod;  /* (T+1) sqrt(i(i-1)) */
    float *lin_u;    /* --reparam none: own power-iteration vectors per linear */
    float *lin_v;
    size_t *lin_off_u, *lin_off_v;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void random_unit(float *v, int n, uint64_t *rng)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) { v[i] = model_random_normal(rng); s += (double)v[i] * v[i]; }
    float k = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
    for (int i = 0; i < n; i++) v[i] *= k;
}

probe *probe_create(const model *m, const probe_config *cfg)
{
    probe *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cfg.examples = cfg && cfg->examples >= 0 ? cfg->examples : PROBE_DEFAULT_EXAMPLES;
    p->cfg.iters = cfg && cfg->iters > 0 ? cfg->iters : PROBE_DEFAULT_ITERS;
    int L = p->L = m->cfg.layers, H = p->H = m->cfg.heads, C = p->C = m->cfg.dim;
    int d = p->d = C / H, T = p->T = m->T;
    p->B = m->B;
    p->nlin = m->num_linear;
    size_t LH = (size_t)L * H;
    /* 7 head metrics, 2 + 2*4 layer metrics */
    p->metric_mem = calloc(7 * LH + 10 * (size_t)L, sizeof(float));
    p->u_qk = malloc(sizeof(float) * LH * C);
    p->u_aug = malloc(sizeof(float) * LH * (C + 1));
    p->xv = malloc(sizeof(float) * L * (C + 1));
    p->sig_b = malloc(sizeof(float) * LH);
    p->rn = malloc(sizeof(float) * L * p->B * T);
    p->xs = malloc(sizeof(float) * L * p->B);
    p->aug = malloc(sizeof(int) * L);
    p->nscratch = m->nthreads > 0 ? m->nthreads : 1;
    p->scr = calloc(p->nscratch, sizeof *p->scr);
    if (!p->scr) goto err;
    for (int t = 0; t < p->nscratch; t++) {
        probe_scratch *sc = &p->scr[t];
        sc->xn = malloc(sizeof(float) * T);
        sc->tmp_t = malloc(sizeof(float) * T);
        sc->tmp_c = malloc(sizeof(float) * (C + 1));
        sc->tmp_d = malloc(sizeof(float) * d * 2);
        sc->mm = malloc(sizeof(float) * d * d);
        sc->scores = malloc(sizeof(float) * T * T);
        if (!sc->xn || !sc->tmp_t || !sc->tmp_c || !sc->tmp_d || !sc->mm || !sc->scores) goto err;
    }
    p->inv_log = malloc(sizeof(float) * (T + 1));
    p->sq_ratio = malloc(sizeof(float) * (T + 1));
    p->sq_prod = malloc(sizeof(float) * (T + 1));
    p->lin_off_u = malloc(sizeof(size_t) * (p->nlin + 1));
    p->lin_off_v = malloc(sizeof(size_t) * (p->nlin + 1));
    if (!p->metric_mem || !p->u_qk || !p->u_aug || !p->xv || !p->sig_b || !p->rn || !p->xs || !p->aug || !p->inv_log || !p->sq_ratio || !p->sq_prod || !p->lin_off_u || !p->lin_off_v)
        goto err;
    size_t su = 0, sv = 0;
    for (int i = 0; i < p->nlin; i++) {
        const sreparam_linear *l = model_linear(m, i);
        p->lin_off_u[i] = su; p->lin_off_v[i] = sv;
        su += (size_t)l->in; sv += (size_t)l->out;
    }
    p->lin_off_u[p->nlin] = su; p->lin_off_v[p->nlin] = sv;
    if (m->cfg.reparam == MODEL_REPARAM_NONE) {
        p->lin_u = malloc(sizeof(float) * su);
        p->lin_v = calloc(sv, sizeof(float));
        if (!p->lin_u || !p->lin_v) goto err;
    }
    uint64_t rng = 0x5eed5eedULL;
    for (size_t k = 0; k < LH; k++) {
        random_unit(p->u_qk + k * C, C, &rng);
        random_unit(p->u_aug + k * (C + 1), C + 1, &rng);
    }
    for (int l = 0; l < L; l++) random_unit(p->xv + (size_t)l * (C + 1), C + 1, &rng);
    if (p->lin_u)
        for (int i = 0; i < p->nlin; i++)
            random_unit(p->lin_u + p->lin_off_u[i], model_linear(m, i)->in, &rng);
    p->inv_log[0] = p->inv_log[1] = 0.0f;
    p->sq_ratio[0] = p->sq_ratio[1] = p->sq_prod[0] = p->sq_prod[1] = 0.0f;
    for (int i = 2; i <= T; i++) {
        p->inv_log[i] = (float)(1.0 / log((double)i));
        p->sq_ratio[i] = (float)sqrt((double)i / (i - 1));
        p->sq_prod[i] = (float)sqrt((double)i * (i - 1));
    }

    probe_metrics *o = &p->out;
    float *f = p->metric_mem;
    o->layers = L; o->heads = H;
    o->entropy = f; f += LH;
    o->entropy_norm = f; f += LH;
    o->max_logit = f; f += LH;
    o->sigma_qk = f; f += LH;
    o->entropy_bound = f; f += LH;
    o->eig_mean = f; f += LH;
    o->eig_var = f; f += LH;
    o->rank_ratio = f; f += L;
    o->cos_sim = f; f += L;
    for (int k = 0; k < MODEL_LIN_PER_LAYER; k++) {
        o->lin_sigma[k] = f; f += L;
        o->lin_gamma[k] = f; f += L;
    }
    return p;
err:
    probe_destroy(p);
    return NULL;
}

void probe_destroy(probe *p)
{
    if (!p) return;
    free(p->metric_mem); free(p->u_qk); free(p->u_aug); free(p->xv); free(p->sig_b);
    for (int t = 0; p->scr && t < p->nscratch; t++) {
        probe_scratch *sc = &p->scr[t];
        free(sc->xn); free(sc->tmp_t); free(sc->tmp_c); free(sc->tmp_d); free(sc->mm); free(sc->scores);
    }
    free(p->scr); free(p->rn); free(p->xs); free(p->aug); free(p->inv_log); free(p->sq_ratio); free(p->sq_prod);
    free(p->lin_u); free(p->lin_v); free(p->lin_off_u); free(p->lin_off_v);
    free(p);
}

double probe_entropy_bound(int T, double s)
{
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
static inline float bound_f(const probe *p, int T, float s)
{
    if (T <= 1) return 0.0f;
    float r = s * p->sq_ratio[T];
    if (!(r <= 60.0f)) return r > 60.0f ? 0.0f : NAN;
    float beta = expf(-r), den = 1.0f + (float)(T - 1) * beta;
    return logf(den) + s * p->sq_prod[T] * beta / den;
}

/* log(x) from the bits of a positive normal float (Cephes logf; relative
 * error ~1e-7).  Zero and denormals come out finite, near -87: harmless,
 * they are multiplied by themselves (so 0 log 0 = 0 without a select). */
static inline float log_bits(uint32_t bits)
{
    int e = (int)(bits >> 23) - 126;
    uint32_t mb = (bits & 0x007fffffu) | 0x3f000000u;
    float mf;
    memcpy(&mf, &mb, sizeof mf);                 /* in [0.5, 1) */
    /* branch-free (GCC does not if-convert float selects under
     * -ftrapping-math): below sqrt(1/2) take 2m and one less exponent */
    float lt = (float)(mf < 0.70710678f);
    float x = mf - 1.0f + lt * mf;
    float fe = (float)e - lt;
    float z = x * x;
    float y = ((((((((7.0376836292E-2f * x - 1.1514610310E-1f) * x + 1.1676998740E-1f) * x
                    - 1.2420140846E-1f) * x + 1.4249322787E-1f) * x - 1.6668057665E-1f) * x
                 + 2.0000714765E-1f) * x - 2.4999993993E-1f) * x + 3.3333331174E-1f) * x * z;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    return x + y + 0.693359375f * fe;
}


/* Entropy -sum a log a of a[0..n) (zeros contribute 0), and the bit
 * patterns of its largest and smallest entries.  Reads a[0..nread) with
 * nread >= n: entries past n must be 0 (the causal mask's upper triangle),
 * so whole 16-lane blocks can be read instead of a scalar tail; they are
 * kept out of the minimum. */
__attribute__((noinline)) static float row_entropy(const float *a, int n, int nread, uint32_t *hi_out, uint32_t *lo_out)
{
    float acc[LANES] = {0};
    uint32_t hi[LANES], lo[LANES];
    for (int k = 0; k < LANES; k++) { hi[k] = 0; lo[k] = UINT32_MAX; }
    int j = 0;
    for (; j + LANES <= nread; j += LANES) {
        for (int k = 0; k < LANES; k++) {
            float x = a[j + k];
            uint32_t b;
            memcpy(&b, &x, sizeof b);
            uint32_t valid = 0u - (uint32_t)(j + k < n);   /* all ones or 0, no branch */
            uint32_t bm = (b & valid) | ~valid;
            hi[k] = b > hi[k] ? b : hi[k];
            lo[k] = bm < lo[k] ? bm : lo[k];
            acc[k] += x * log_bits(b);
        }
    }
    for (; j < n; j++) {
        float x = a[j];
        uint32_t b;
        memcpy(&b, &x, sizeof b);
        hi[0] = b > hi[0] ? b : hi[0];
        lo[0] = b < lo[0] ? b : lo[0];
        acc[0] += x * log_bits(b);
    }
    float s = 0.0f;
    uint32_t h = 0, l = UINT32_MAX;
    for (int k = 0; k < LANES; k++) {
        s += acc[k];
        h = hi[k] > h ? hi[k] : h;
        l = lo[k] < l ? lo[k] : l;
    }
    *hi_out = h;
    *lo_out = l;
    return -s;
}

/* 8 partial sums: vectorizable without -ffast-math */
static inline float dot(const float *a, const float *b, int n)
{
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

/* ||P||_2 / sqrt(d) for P = Wq~^T Wk~ with Wq~ = [Wq | bq] (d x (C+a)),
 * Wk~ likewise, a = 1 when bq/bk are given (else 0).  Rows of Wq, Wk are C
 * long.  u (C+a) is the persistent right vector; `iters` steps.  Matvecs go
 * through the d-dim factor: O(C d) each, P is never formed. */
static float qk_power(const float *Wq, const float *bq, const float *Wk, const float *bk, int C,
                      int d, float *u, float *t, float *w, int iters)
{
    int a = bq != NULL;
    float sigma = 0.0f;
    for (int it = 0; it < iters; it++) {
        for (int r = 0; r < d; r++) t[r] = dot(Wk + (size_t)r * C, u, C) + (a ? bk[r] * u[C] : 0.0f);
        memset(w, 0, sizeof(float) * (C + a));
        for (int r = 0; r < d; r++) {
            const float *q = Wq + (size_t)r * C;
            float tr = t[r];
            for (int c = 0; c < C; c++) w[c] += q[c] * tr;
            if (a) w[C] += bq[r] * tr;
        }
        float nw = sqrtf(dot(w, w, C + a));
        if (!(nw > 0.0f) || !isfinite(nw)) return isfinite(nw) ? 0.0f : NAN;
        for (int c = 0; c < C + a; c++) w[c] /= nw;             /* v */
        for (int r = 0; r < d; r++) t[r] = dot(Wq + (size_t)r * C, w, C) + (a ? bq[r] * w[C] : 0.0f);
        memset(u, 0, sizeof(float) * (C + a));
        for (int r = 0; r < d; r++) {
            const float *k = Wk + (size_t)r * C;
            float tr = t[r];
            for (int c = 0; c < C; c++) u[c] += k[c] * tr;
            if (a) u[C] += bk[r] * tr;
        }
        float nz = sqrtf(dot(u, u, C + a));                      /* ||P^T v|| <= ||P|| */
        if (!(nz > 0.0f) || !isfinite(nz)) {
            /* keep a usable vector for the next call */
            for (int c = 0; c < C + a; c++) u[c] = w[c];
            return isfinite(nz) ? 0.0f : NAN;
        }
        for (int c = 0; c < C + a; c++) u[c] /= nz;
        sigma = nz;
    }
    return sigma / sqrtf((float)d);
}

/* ||X~||_2 for X (T x C) with a column of ones appended when a = 1; v (C+a)
 * persistent.  Returns ||X~^T X~ v|| / ||X~ v|| of the last step, which lies
 * between ||X~ v|| and the true norm. */
static float x_power(const float *X, int T, int C, int a, float *v, float *w, float *z, int iters)
{
    float est = 0.0f;
    for (int it = 0; it < iters; it++) {
        for (int i = 0; i < T; i++) w[i] = dot(X + (size_t)i * C, v, C) + (a ? v[C] : 0.0f);
        memset(z, 0, sizeof(float) * (C + a));
        float sw = 0.0f;
        for (int i = 0; i < T; i++) {
            const float *x = X + (size_t)i * C;
            float wi = w[i];
            for (int c = 0; c < C; c++) z[c] += x[c] * wi;
            sw += wi;
        }
        if (a) z[C] = sw;
        float nw = sqrtf(dot(w, w, T)), nz = sqrtf(dot(z, z, C + a));
        if (!(nw > 0.0f) || !(nz > 0.0f) || !isfinite(nz)) return isfinite(nz) ? 0.0f : NAN;
        for (int c = 0; c < C + a; c++) v[c] = z[c] / nz;
        est = nz / nw;
    }
    return est;
}

/* One power step on a linear layer's W with the probe's own vectors (used
 * with --reparam none, where the model keeps no sigma). */
static float lin_power(const sreparam_linear *l, float *u, float *v)
{
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

static int any_nonzero(const float *x, int n)
{
    for (int i = 0; i < n; i++)
        if (x[i] != 0.0f) return 1;
    return 0;
}

/* Per-head weight metrics of layer l: sigma_qk, the bound's sigma, eig_mean, eig_var. */
static void head_weights(probe *p, model *m, int l, int aug, probe_scratch *sc)
{
    int H = p->H, C = p->C, d = p->d;
    const float *W = model_qkv_weight(m, l);
    const float *bias = m->params.qkvb + (size_t)l * 3 * C;
    float *t = sc->tmp_d, *w = sc->tmp_c;
    double inv_sd = 1.0 / sqrt((double)d);
    for (int h = 0; h < H; h++) {
        size_t k = (size_t)l * H + h;
        const float *Wq = W + (size_t)h * d * C, *Wk = W + (size_t)C * C + (size_t)h * d * C;
        float s = qk_power(Wq, NULL, Wk, NULL, C, d, p->u_qk + k * C, t, w, p->iters);
        p->out.sigma_qk[k] = s;
        p->sig_b[k] = aug ? qk_power(Wq, bias + h * d, Wk, bias + C + h * d, C, d,
                                     p->u_aug + k * (C + 1), t, w, p->iters)
                          : s;
        /* M = Wk_h Wq_h^T (d x d) has the non-zero eigenvalues of W_Q^h W_K^h^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, C, 1.0f, Wk, C, Wq, C, 0.0f,
                    sc->mm, d);
        double tr = 0.0, tr2 = 0.0;
        for (int a = 0; a < d; a++) {
            tr += sc->mm[a * d + a];
            for (int b = 0; b < d; b++) tr2 += (double)sc->mm[a * d + b] * sc->mm[b * d + a];
        }
        double mean = tr / C * inv_sd;
        p->out.eig_mean[k] = (float)mean;
        p->out.eig_var[k] = (float)(tr2 / C / d - mean * mean);
    }
}

/* One layer: weight metrics, row norms, rank_ratio, cos_sim, ||X~_b||_2. */
static void layer_pass(probe *p, int l, probe_scratch *sc)
{
    model *m = p->m;
    int C = p->C, T = m->cur_T, nb = p->nb;
    const float *bias = m->params.qkvb + (size_t)l * 3 * C;
    int aug = p->aug[l] = any_nonzero(bias, 2 * C);
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
        for (int c = 0; c < C; c++) { double mc = mean[c] / T; mu2 += mc * mc; }
        /* mean of the unit rows */
        memset(mean, 0, sizeof(float) * C);
        for (int i = 0; i < T; i++) {
            const float *x = Xb + (size_t)i * C;
            float k = xn[i] > 0.0f ? 1.0f / xn[i] : 0.0f;
            for (int c = 0; c < C; c++) mean[c] += x[c] * k;
        }
        for (int c = 0; c < C; c++) { double mc = mean[c] / T; um2 += mc * mc; }
        double res2 = fro2 - T * mu2;
        rank_sum += fro2 > 0 ? sqrt(res2 > 0 ? res2 / fro2 : 0.0) : 0.0;
        cos_sum += T > 1 ? (T * um2 - 1.0) / (T - 1) : 1.0;
        /* examples in order, one persistent vector per layer: warm starts */
        p->xs[(size_t)l * p->B + b] = x_power(Xb, T, C, aug, p->xv + (size_t)l * (C + 1), sc->tmp_t,
                                              mean, p->iters);
    }
    p->out.rank_ratio[l] = (float)(rank_sum / nb);
    p->out.cos_sim[l] = (float)(cos_sum / nb);
}

/* One head (after its layer's layer_pass): the pass over its attention rows. */
static void head_pass(probe *p, int l, int h, probe_scratch *sc)
{
    model *m = p->m;
    int H = p->H, C = p->C, d = p->d, T = m->cur_T, nb = p->nb;
    size_t k = (size_t)l * H + h;
    const float *qkv = model_qkv(m, l), *att = model_attention(m, l);
    float inv_sd = 1.0f / sqrtf((float)d);
    double e_sum = 0.0, en_sum = 0.0, b_sum = 0.0;
    float ml = 0.0f;
    for (int b = 0; b < nb; b++) {
        const float *A = att + (size_t)(b * H + h) * T * T;
        const float *qb = qkv + (size_t)b * T * 3 * C + h * d;
        const float *kb = qb + C;
        const float *rn = p->rn + ((size_t)l * p->B + b) * T;
        float sx = p->sig_b[k] * p->xs[(size_t)l * p->B + b];
        int have_scores = 0; /* sc->scores holds this example's Q K^T */
        for (int i = 0; i < T; i++) {
            const float *row = A + (size_t)i * T;
            uint32_t hi, lo;
            int nread = (i + LANES) / LANES * LANES;
            float e = row_entropy(row, i + 1, nread <= T ? nread : i + 1, &hi, &lo);
            e_sum += e;
            en_sum += e * p->inv_log[i + 1];
            b_sum += bound_f(p, i + 1, sx * rn[i]);
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
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, d, 1.0f, qb, 3 * C, kb, 3 * C,
                                0.0f, sc->scores, T);
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
            if (!(am <= ml)) ml = am;   /* NaN propagates */
        }
    }
    p->out.entropy[k] = (float)(e_sum / ((double)nb * T));
    p->out.entropy_norm[k] = T > 1 ? (float)(en_sum / ((double)nb * (T - 1))) : NAN;
    p->out.entropy_bound[k] = (float)(b_sum / ((double)nb * T));
    p->out.max_logit[k] = ml;
}

/* model_parallel task: whole layers round-robin over the threads, so one
 * hand-off covers everything (each hand-off to a worker can cost a scheduler
 * slice on a busy machine). */
static void probe_task(void *ctx, int t, int nt)
{
    probe *p = ctx;
    for (int l = t; l < p->L; l += nt) {
        layer_pass(p, l, &p->scr[t]);
        for (int h = 0; h < p->H; h++) head_pass(p, l, h, &p->scr[t]);
    }
}

const probe_metrics *probe_compute(probe *p, model *m)
{
    double t0 = now_s();
    probe_metrics *o = &p->out;
    int B = m->cur_B;
    p->m = m;
    p->nb = p->cfg.examples > 0 && p->cfg.examples < B ? p->cfg.examples : B;
    o->examples_used = p->nb;
    /* Cold random vectors underestimate the norms, which would lift the
     * bound above the truth: converge them on the first call. */
    p->iters = p->calls++ == 0 && p->cfg.iters < PROBE_WARMUP_ITERS ? PROBE_WARMUP_ITERS : p->cfg.iters;
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
