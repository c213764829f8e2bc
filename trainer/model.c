/* model.c - forward and backward of the GPT model in model.h.
 *
 * Kernel conventions (llm.c): X_forward(out, inputs..., sizes),
 * X_backward(d-inputs..., d-outputs, saved inputs..., sizes).  Gradients of
 * PARAMETERS are always added into.  Gradients of ACTIVATIONS are overwritten
 * by matmul/attention backward, scaled in place by gelu/crossentropy backward
 * and added into by layernorm_backward; each kernel's comment says which.  Why
 * not "always add" as in llm.c: that needs the activation-gradient buffers
 * zeroed every step, several MB of memset that costs more than the σReparam
 * bookkeeping we try to keep under 3%.  Instead one layer's worth of scratch
 * per shard is reused across layers.
 *
 * Parallelism: a batch is split into shards of examples (forward_shard,
 * backward_shard), one per thread, each calling OpenBLAS single-threaded;
 * shards write private parameter gradients that JOB_REDUCE adds up in a fixed
 * order.  The rest of a step (σReparam, clearing, the optimizer through
 * model_parallel) is split over the same threads by ranges. */
#include "model.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- random */

uint32_t model_random_u32(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

float model_random_f32(uint64_t *state)
{
    return (float)(model_random_u32(state) >> 8) / 16777216.0f;
}

float model_random_normal(uint64_t *state)
{
    float u1 = 1.0f - model_random_f32(state); /* (0, 1] so the log is finite */
    float u2 = model_random_f32(state);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

/* Kernels are kept out of line so that profiles attribute time to them. */
#define KERNEL static __attribute__((noinline))

static float truncated_normal(uint64_t *rng, float std)
{
    float z;
    do z = model_random_normal(rng); while (fabsf(z) > 2.0f);
    return z * std;
}

/* ---------------------------------------------------------- fast math */

/* exp(x) for x in float range, relative error ~2e-7: Cephes expf (Cody-Waite
 * range reduction, degree-6 polynomial) with a round-to-nearest trick instead
 * of floorf, so that GCC vectorizes the loops that call it (libm's expf is a
 * call per element). */
static inline float fast_expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float r = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float f = x - r * 0.693359375f - r * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
    p = p * f * f + f + 1.0f;
    /* NaN must stay NaN (p carries it) without an undefined NaN -> int cast */
    float re = r == r ? r : 0.0f;
    union { int32_t i; float f; } e;
    e.i = ((int32_t)re + 127) << 23;
    return p * e.f;
}

static inline float fast_tanhf(float x)
{
    return 1.0f - 2.0f / (fast_expf(2.0f * x) + 1.0f);
}

/* ------------------------------------------------------------- kernels */

KERNEL void encoder_forward(float *restrict out, const int *restrict inp,
                            const float *restrict wte, const float *restrict wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((long)b * T + t) * C;
            const float *we = wte + (long)inp[b * T + t] * C;
            const float *pe = wpe + (long)t * C;
            for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
}

/* Adds into dwte, dwpe. */
KERNEL void encoder_backward(float *dwte, float *dwpe, const float *dout,
                             const int *inp, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((long)b * T + t) * C;
            float *dwe = dwte + (long)inp[b * T + t] * C;
            float *dpe = dwpe + (long)t * C;
            for (int i = 0; i < C; i++) { dwe[i] += d[i]; dpe[i] += d[i]; }
        }
}

/* Row reductions with 16 partial sums: without -ffast-math GCC may not
 * reorder a float sum, so a single accumulator would not vectorize. */
#define LANES 16
static inline float red_sum(const float *x, int n)
{
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += x[i + k];
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    for (; i < n; i++) s += x[i];
    return s;
}

static inline float red_sqdev(const float *x, float m, int n)
{
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) { float d = x[i + k] - m; acc[k] += d * d; }
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    for (; i < n; i++) { float d = x[i] - m; s += d * d; }
    return s;
}

KERNEL void layernorm_forward(float *restrict out, float *restrict mean, float *restrict rstd,
                              const float *restrict inp, const float *restrict w,
                              const float *restrict bias, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (long)n * C;
        float m = red_sum(x, C) / C;
        float v = red_sqdev(x, m, C) / C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (long)n * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* Adds into dinp, dw, dbias. */
KERNEL void layernorm_backward(float *restrict dinp, float *restrict dw, float *restrict dbias,
                               const float *restrict dout, const float *restrict inp,
                               const float *restrict w, const float *restrict mean,
                               const float *restrict rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *d = dout + (long)n * C;
        const float *x = inp + (long)n * C;
        float *dx = dinp + (long)n * C;
        float m = mean[n], s = rstd[n];
        float a1[LANES] = {0}, a2[LANES] = {0};
        int i0 = 0;
        for (; i0 + LANES <= C; i0 += LANES)
            for (int k = 0; k < LANES; k++) {
                float dn = w[i0 + k] * d[i0 + k];
                a1[k] += dn;
                a2[k] += dn * (x[i0 + k] - m) * s;
            }
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int k = 0; k < LANES; k++) { dnorm_mean += a1[k]; dnorm_norm_mean += a2[k]; }
        for (; i0 < C; i0++) {
            float dn = w[i0] * d[i0];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * (x[i0] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dn = w[i] * d[i];
            dbias[i] += d[i];
            dw[i] += norm * d[i];
            dx[i] += (dn - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

void model_matmul_reference(float *out, const float *inp, const float *w,
                            const float *bias, int N, int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) s += inp[(long)n * C + i] * w[(long)o * C + i];
            out[(long)n * OC + o] = s;
        }
}

/* out (N, OC) = inp (N, C) @ w^T + bias (may be NULL) + residual (may be
 * NULL, same shape as out: the residual add is fused into the bias pass). */
KERNEL void matmul_forward(float *restrict out, const float *restrict inp,
                           const float *restrict w, const float *restrict bias,
                           const float *restrict residual, int N, int C, int OC)
{
    float beta = 0.0f;
    if (bias || residual) {
        for (int n = 0; n < N; n++) {
            float *o = out + (long)n * OC;
            const float *r = residual ? residual + (long)n * OC : NULL;
            if (bias && r) for (int i = 0; i < OC; i++) o[i] = r[i] + bias[i];
            else if (bias) for (int i = 0; i < OC; i++) o[i] = bias[i];
            else for (int i = 0; i < OC; i++) o[i] = r[i];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C,
                beta, out, OC);
}

/* OVERWRITES dinp (if not NULL); dw = dw_beta * dw + dout^T inp; adds into dbias. */
KERNEL void matmul_backward(float *restrict dinp, float *restrict dw, float *restrict dbias,
                            const float *restrict dout, const float *restrict inp,
                            const float *restrict w, int N, int C, int OC, float dw_beta)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC,
                    w, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                dw_beta, dw, C);
    if (dbias)
        for (int n = 0; n < N; n++) {
            const float *d = dout + (long)n * OC;
            for (int o = 0; o < OC; o++) dbias[o] += d[o];
        }
}

/* Row maximum.  A float max reduction does not vectorize without
 * -ffinite-math-only, so it is written with GCC vector extensions (lowered
 * to whatever the target has).  NaNs are skipped: a NaN logit still turns
 * its softmax row into NaN through exp. */
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

static inline float red_max(const float *x, int n)
{
    float mx = x[0];
    int i = 0;
    if (n >= 16) {
        vf16 m, v;
        memcpy(&m, x, sizeof m);
        for (i = 16; i + 16 <= n; i += 16) {
            memcpy(&v, x + i, sizeof v);
            vi16 gt = v > m;
            m = (vf16)((gt & (vi16)v) | (~gt & (vi16)m));
        }
        for (int k = 0; k < 16; k++) mx = m[k] > mx ? m[k] : mx;
    }
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

static inline float red_dot(const float *x, const float *y, int n)
{
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += x[i + k] * y[i + k];
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

/* Causal softmax of one row in place: entries 0..i kept, the rest zeroed.
 * A NaN logit makes the row NaN (max and sum propagate it), never hides it. */
static void causal_softmax_row(float *restrict a, int i, int T)
{
    int n = i + 1;
    float mx = red_max(a, n);
    for (int j = 0; j < n; j++) a[j] = fast_expf(a[j] - mx);
    float inv = 1.0f / red_sum(a, n);
    for (int j = 0; j < n; j++) a[j] *= inv;
    for (int j = n; j < T; j++) a[j] = 0.0f;
}

/* Causal attention in row blocks of att_block queries: block [r0, r1) only
 * needs keys [0, r1), which skips most of the masked upper triangle in the
 * QK^T and AV products and their gradients (37% of the attention FLOPs at
 * T = 128 with blocks of 32).  A variable so that tests can shrink it. */
static int att_block = 32;

/* qkv (B, T, 3C) -> att (B, NH, T, T), out (B, T, C). */
KERNEL void attention_forward(float *out, float *att, const float *qkv, int B, int T,
                              int C, int NH)
{
    int hs = C / NH, C3 = 3 * C, bs = att_block;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (long)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((long)b * NH + h) * T * T;
            float *o = out + (long)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += bs) {
                int r1 = r0 + bs < T ? r0 + bs : T, m = r1 - r0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, scale,
                            q + (long)r0 * C3, C3, k, C3, 0.0f, a + (long)r0 * T, T);
                for (int i = r0; i < r1; i++) causal_softmax_row(a + (long)i * T, i, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f,
                            a + (long)r0 * T, T, v, C3, 0.0f, o + (long)r0 * C, C);
            }
        }
}

/* OVERWRITES dqkv (B, T, 3C); datt is (T, T) scratch. */
KERNEL void attention_backward(float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C,
                               int NH)
{
    int hs = C / NH, C3 = 3 * C, bs = att_block;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            long off = (long)b * T * C3 + h * hs;
            const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((long)b * NH + h) * T * T;
            const float *d = dout + (long)b * T * C + h * hs;
            /* query blocks: datt = dout V^T, softmax backward, dQ = dpre K */
            for (int r0 = 0; r0 < T; r0 += bs) {
                int r1 = r0 + bs < T ? r0 + bs : T, m = r1 - r0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, 1.0f,
                            d + (long)r0 * C, C, v, C3, 0.0f, datt + (long)r0 * T, T);
                for (int i = r0; i < r1; i++) {
                    const float *ar = a + (long)i * T;
                    float *dr = datt + (long)i * T;
                    float s = red_dot(ar, dr, i + 1);
                    for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - s) * scale;
                    for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f,
                            datt + (long)r0 * T, T, k, C3, 0.0f, dq + (long)r0 * C3, C3);
            }
            /* key blocks: only queries i >= c0 see keys [c0, c1) */
            for (int c0 = 0; c0 < T; c0 += bs) {
                int c1 = c0 + bs < T ? c0 + bs : T, m = c1 - c0, n = T - c0;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, hs, n, 1.0f,
                            a + (long)c0 * T + c0, T, d + (long)c0 * C, C, 0.0f,
                            dv + (long)c0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, hs, n, 1.0f,
                            datt + (long)c0 * T + c0, T, q + (long)c0 * C3, C3, 0.0f,
                            dk + (long)c0 * C3, C3);
            }
        }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* out = gelu(x + bias) for x (N, OC); x is then OVERWRITTEN with
 * gelu'(x + bias), which is all the backward needs (the pre-activation itself
 * is not used again), so the backward does not recompute tanh. */
KERNEL void gelu_forward(float *restrict out, float *restrict x, const float *restrict bias,
                         int N, int OC)
{
    for (int n = 0; n < N; n++) {
        float *xr = x + (long)n * OC, *o = out + (long)n * OC;
        for (int i = 0; i < OC; i++) {
            float u = xr[i] + bias[i];
            float t = fast_tanhf(GELU_SCALE * (u + 0.044715f * u * u * u));
            float dt = (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * u * u);
            o[i] = 0.5f * u * (1.0f + t);
            xr[i] = 0.5f * (1.0f + t) + 0.5f * u * dt;
        }
    }
}

/* d *= deriv (deriv from gelu_forward): the gradient through GELU, in place. */
KERNEL void gelu_backward(float *restrict d, const float *restrict deriv, long n)
{
    for (long i = 0; i < n; i++) d[i] *= deriv[i];
}

/* probs (N, V) holds logits on entry and softmax on return; losses[n] gets
 * -log p[target] when targets is not NULL.  Returns the sum of the losses. */
KERNEL double softmax_crossentropy_forward(float *probs, float *losses, const int *targets,
                                          int N, int V)
{
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float *p = probs + (long)n * V;
        float mx = p[0];
        for (int i = 1; i < V; i++) mx = p[i] > mx ? p[i] : mx;
        float zt = targets ? p[targets[n]] : 0.0f;
        float s = 0.0f;
        for (int i = 0; i < V; i++) { float e = fast_expf(p[i] - mx); p[i] = e; s += e; }
        float inv = 1.0f / s;
        for (int i = 0; i < V; i++) p[i] *= inv;
        if (targets) {
            /* log-sum-exp form: finite even when p[target] underflows */
            losses[n] = logf(s) + mx - zt;
            total += losses[n];
        }
    }
    return total;
}

/* probs becomes dlogits of the loss sum scaled by inv (1 / tokens of the
 * whole batch), in place. */
KERNEL void crossentropy_backward(float *probs, const int *targets, int N, int V, float inv)
{
    for (int n = 0; n < N; n++) {
        float *p = probs + (long)n * V;
        for (int i = 0; i < V; i++) p[i] *= inv;
        p[targets[n]] -= inv;
    }
}

/* ------------------------------------------------------------ the model */

size_t model_param_sizes(const model_config *cfg, size_t s[MODEL_NUM_PARAMS])
{
    size_t V = cfg->vocab, T = cfg->max_seq, L = cfg->layers, C = cfg->dim;
    s[MODEL_WTE] = V * C;
    s[MODEL_WPE] = T * C;
    s[MODEL_LN1W] = L * C;
    s[MODEL_LN1B] = L * C;
    s[MODEL_QKVW] = L * 3 * C * C;
    s[MODEL_QKVB] = L * 3 * C;
    s[MODEL_ATTPROJW] = L * C * C;
    s[MODEL_ATTPROJB] = L * C;
    s[MODEL_LN2W] = L * C;
    s[MODEL_LN2B] = L * C;
    s[MODEL_FCW] = L * 4 * C * C;
    s[MODEL_FCB] = L * 4 * C;
    s[MODEL_FCPROJW] = L * C * 4 * C;
    s[MODEL_FCPROJB] = L * C;
    s[MODEL_LNFW] = C;
    s[MODEL_LNFB] = C;
    s[MODEL_LMW] = V * C;
    s[MODEL_GAMMA] = 4 * L + 1;
    size_t n = 0;
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) n += s[i];
    return n;
}

int model_config_check(const model_config *c, char *err, size_t errlen)
{
    const char *msg = NULL;
    if (c->vocab < 2 || c->vocab > 65536) msg = "vocab must be in [2, 65536]";
    else if (c->max_seq < 1 || c->max_seq > 16384) msg = "seq-len must be in [1, 16384]";
    else if (c->layers < 1 || c->layers > 256) msg = "layers must be in [1, 256]";
    else if (c->heads < 1 || c->dim < 1 || c->dim > 65536) msg = "heads and dim must be positive";
    else if (c->dim % c->heads != 0) msg = "dim must be divisible by heads";
    else if (c->norm < 0 || c->norm > 2) msg = "bad norm mode";
    else if (c->reparam < 0 || c->reparam > 2) msg = "bad reparam mode";
    else if (c->gamma_init < 0 || c->gamma_init > 1) msg = "bad gamma init";
    if (msg) { snprintf(err, errlen, "%s", msg); return -1; }
    return 0;
}

static void carve_params(model_params *p, float *mem, const size_t *s)
{
    float **ptrs[MODEL_NUM_PARAMS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw,
        &p->attprojb, &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb,
        &p->lnfw, &p->lnfb, &p->lmw, &p->gamma};
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) { *ptrs[i] = mem; mem += s[i]; }
}

static size_t carve_acts(model_acts *a, float *mem, const model_config *c, size_t B, size_t T)
{
    size_t L = c->layers, C = c->dim, H = c->heads, V = c->vocab, BT = B * T;
    struct { float **p; size_t n; } t[] = {
        {&a->encoded, BT * C},       {&a->ln1, L * BT * C},      {&a->ln1_mean, L * BT},
        {&a->ln1_rstd, L * BT},      {&a->qkv, L * BT * 3 * C},  {&a->atty, L * BT * C},
        {&a->att, L * B * H * T * T}, {&a->residual2, L * BT * C}, {&a->ln2, L * BT * C},
        {&a->ln2_mean, L * BT},      {&a->ln2_rstd, L * BT},     {&a->fch, L * BT * 4 * C},
        {&a->fch_gelu, L * BT * 4 * C}, {&a->residual3, L * BT * C}, {&a->lnf, BT * C},
        {&a->lnf_mean, BT},          {&a->lnf_rstd, BT},         {&a->probs, BT * V},
        {&a->losses, BT}};
    size_t n = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (mem) *t[i].p = mem + n;
        n += t[i].n;
    }
    return n;
}

static void *worker_main(void *arg);

/* Jobs of the worker threads (see run_shard). */
enum { JOB_FORWARD = 1, JOB_BACKWARD, JOB_REDUCE, JOB_REPARAM_FWD, JOB_TASK,
       JOB_ZERO };

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t scratch_size(const model_config *c, size_t B, size_t T)
{
    return 11 * B * T * (size_t)c->dim + T * T; /* see backward_shard */
}

model *model_create(const model_config *cfg, int B, int T, int threads)
{
    char err[128];
    if (model_config_check(cfg, err, sizeof err) != 0 || B < 1 || T < 1 || T > cfg->max_seq)
        return NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->num_params = model_param_sizes(cfg, m->param_sizes);
    m->params_memory = calloc(m->num_params, sizeof(float));
    m->grads_memory = calloc(m->num_params, sizeof(float));
    size_t na = carve_acts(&m->acts, NULL, cfg, B, T);
    m->acts_memory = calloc(na, sizeof(float));
    int L = cfg->layers, C = cfg->dim;
    m->num_linear = MODEL_LIN_PER_LAYER * L + 1;
    m->lin = calloc(m->num_linear, sizeof *m->lin);
    /* u (in) + v (out) per linear: per layer C+3C, C+C, C+4C, 4C+C; head C+V */
    m->pi_size = (size_t)L * (4 + 2 + 5 + 5) * C + C + cfg->vocab;
    m->pi_memory = calloc(m->pi_size, sizeof(float));
    if (!m->params_memory || !m->grads_memory || !m->acts_memory || !m->lin ||
        !m->pi_memory)
        goto err;
    carve_params(&m->params, m->params_memory, m->param_sizes);
    carve_params(&m->grads, m->grads_memory, m->param_sizes);
    carve_acts(&m->acts, m->acts_memory, cfg, B, T);

    size_t nw = m->param_sizes[MODEL_QKVW] + m->param_sizes[MODEL_ATTPROJW] +
                m->param_sizes[MODEL_FCW] + m->param_sizes[MODEL_FCPROJW] +
                m->param_sizes[MODEL_LMW];
    if (cfg->reparam != MODEL_REPARAM_NONE) {
        m->eff_memory = calloc(nw, sizeof(float));
        m->deff_memory = calloc(nw, sizeof(float));
        m->deff_size = nw;
        if (!m->eff_memory || !m->deff_memory) goto err;
    }
    if (threads < 1) threads = 1;
    if (threads > B) threads = B;
    m->shards = calloc(threads, sizeof *m->shards);
    if (!m->shards) goto err;
    m->nthreads = threads;
    for (int t = 0; t < threads; t++) {
        model_shard *sh = &m->shards[t];
        int nb = B * (t + 1) / threads - B * t / threads;
        sh->m = m;
        sh->id = t;
        sh->scratch = calloc(scratch_size(cfg, nb, T), sizeof(float));
        sh->grads_memory = t ? calloc(m->num_params, sizeof(float)) : m->grads_memory;
        sh->deff = t && m->deff_memory ? calloc(nw, sizeof(float)) : m->deff_memory;
        if (!sh->scratch || !sh->grads_memory || (m->deff_memory && !sh->deff)) goto err;
        carve_params(&sh->grads, sh->grads_memory, m->param_sizes);
    }
    /* Spread the linears over the threads, largest first onto the least loaded. */
    m->lin_owner = calloc(m->num_linear, sizeof(int));
    if (!m->lin_owner) goto err;
    {
        double load[256] = {0};
        int nt = threads < 256 ? threads : 256;
        for (int i = 0; i < m->num_linear; i++) m->lin_owner[i] = -1;
        for (int done = 0; done < m->num_linear; done++) {
            int best = -1;
            for (int i = 0; i < m->num_linear; i++)
                if (m->lin_owner[i] < 0 && (best < 0 || (long)m->lin[i].out * m->lin[i].in >
                                                         (long)m->lin[best].out * m->lin[best].in))
                    best = i;
            int tmin = 0;
            for (int t = 1; t < nt; t++) if (load[t] < load[tmin]) tmin = t;
            m->lin_owner[best] = tmin;
            load[tmin] += (double)m->lin[best].out * m->lin[best].in;
        }
    }
    m->one = 1.0f;
    if (pthread_mutex_init(&m->mu, NULL) != 0) goto err;
    if (pthread_cond_init(&m->go, NULL) != 0) { pthread_mutex_destroy(&m->mu); goto err; }
    if (pthread_cond_init(&m->done, NULL) != 0) {
        pthread_cond_destroy(&m->go); pthread_mutex_destroy(&m->mu); goto err;
    }
    m->sync_ok = 1;
    openblas_set_num_threads(1);
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&m->shards[t].thread, NULL, worker_main, &m->shards[t]) != 0) goto err;
        m->shards[t].started = 1;
    }
    float *pi = m->pi_memory, *eff = m->eff_memory, *deff = m->deff_memory;
    for (int i = 0; i < m->num_linear; i++) {
        sreparam_linear *l = &m->lin[i];
        int layer = i / MODEL_LIN_PER_LAYER, k = i % MODEL_LIN_PER_LAYER;
        float *w, *dw;
        if (i == m->num_linear - 1) {
            l->out = cfg->vocab; l->in = C;
            w = m->params.lmw; dw = m->grads.lmw;
        } else if (k == MODEL_LIN_QKV) {
            l->out = 3 * C; l->in = C;
            w = m->params.qkvw + (size_t)layer * 3 * C * C; dw = m->grads.qkvw + (w - m->params.qkvw);
        } else if (k == MODEL_LIN_ATTPROJ) {
            l->out = C; l->in = C;
            w = m->params.attprojw + (size_t)layer * C * C; dw = m->grads.attprojw + (w - m->params.attprojw);
        } else if (k == MODEL_LIN_FC) {
            l->out = 4 * C; l->in = C;
            w = m->params.fcw + (size_t)layer * 4 * C * C; dw = m->grads.fcw + (w - m->params.fcw);
        } else {
            l->out = C; l->in = 4 * C;
            w = m->params.fcprojw + (size_t)layer * 4 * C * C; dw = m->grads.fcprojw + (w - m->params.fcprojw);
        }
        l->w = w;
        l->dw = dw;
        l->gamma = m->params.gamma + i;
        l->dgamma = m->grads.gamma + i;
        l->u = pi; pi += l->in;
        l->v = pi; pi += l->out;
        l->sigma = 1.0f;
        if (cfg->reparam == MODEL_REPARAM_NONE) {
            l->weff = w;
            l->dweff = dw;
        } else {
            size_t n = (size_t)l->out * l->in;
            l->weff = eff; eff += n;
            l->dweff = deff; deff += n;
        }
    }
    return m;
err:
    model_destroy(m);
    return NULL;
}

void model_destroy(model *m)
{
    if (!m) return;
    free(m->params_memory);
    free(m->grads_memory);
    free(m->acts_memory);
    if (m->sync_ok) {
        pthread_mutex_lock(&m->mu);
        m->quit = 1;
        pthread_cond_broadcast(&m->go);
        pthread_mutex_unlock(&m->mu);
    }
    for (int t = 0; m->shards && t < m->nthreads; t++) {
        model_shard *sh = &m->shards[t];
        if (sh->started) pthread_join(sh->thread, NULL);
        free(sh->scratch);
        if (t) { free(sh->grads_memory); free(sh->deff); }
    }
    free(m->shards);
    if (m->sync_ok) {
        pthread_cond_destroy(&m->go);
        pthread_cond_destroy(&m->done);
        pthread_mutex_destroy(&m->mu);
    }
    free(m->lin);
    free(m->lin_owner);
    free(m->pi_memory);
    free(m->eff_memory);
    free(m->deff_memory);
    free(m);
}

static void random_unit(float *x, int n, uint64_t *rng)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) { x[i] = model_random_normal(rng); s += (double)x[i] * x[i]; }
    float inv = (float)(1.0 / sqrt(s));
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void model_init(model *m, uint64_t *rng)
{
    const model_config *c = &m->cfg;
    model_params *p = &m->params;
    const size_t *s = m->param_sizes;
    float std_res = 0.02f / sqrtf(2.0f * c->layers);
    memset(m->params_memory, 0, m->num_params * sizeof(float));
    struct { float *t; size_t n; float std; } w[] = {
        {p->wte, s[MODEL_WTE], 0.02f},       {p->wpe, s[MODEL_WPE], 0.02f},
        {p->qkvw, s[MODEL_QKVW], 0.02f},     {p->attprojw, s[MODEL_ATTPROJW], std_res},
        {p->fcw, s[MODEL_FCW], 0.02f},       {p->fcprojw, s[MODEL_FCPROJW], std_res},
        {p->lmw, s[MODEL_LMW], 0.02f}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        for (size_t j = 0; j < w[i].n; j++) w[i].t[j] = truncated_normal(rng, w[i].std);
    for (size_t j = 0; j < s[MODEL_LN1W]; j++) p->ln1w[j] = p->ln2w[j] = 1.0f;
    for (size_t j = 0; j < s[MODEL_LNFW]; j++) p->lnfw[j] = 1.0f;
    for (int i = 0; i < m->num_linear; i++) {
        sreparam_linear *l = &m->lin[i];
        *l->gamma = 1.0f;
        l->sigma = 1.0f;
        if (c->reparam == MODEL_REPARAM_NONE) continue;
        if (c->reparam == MODEL_REPARAM_SIGMA && c->gamma_init == MODEL_GAMMA_SIGMA) {
            double top = sreparam_top_singular(l->w, l->out, l->in, l->u, l->v);
            if (top <= 0.0) { /* LAPACK failure: fall back to a long power iteration */
                random_unit(l->u, l->in, rng);
                for (int k = 0; k < 200; k++) sreparam_power_step(l);
                top = l->sigma;
            }
            l->sigma = (float)top;
            *l->gamma = (float)top;
        } else {
            random_unit(l->u, l->in, rng);
            int steps = c->reparam == MODEL_REPARAM_SPECTRAL ? 15 : 1;
            for (int k = 0; k < steps; k++) sreparam_power_step(l);
            if (c->reparam == MODEL_REPARAM_SIGMA) random_unit(l->u, l->in, rng);
            /* gamma one: u is a fresh random unit vector (paper pseudocode); v from
             * one step only so that an eval before training has a defined sigma. */
        }
    }
}

static void run_all(model *m, int job);

void model_zero_grad(model *m)
{
    run_all(m, JOB_ZERO);
}

void model_parallel(model *m, model_task fn, void *ctx)
{
    m->task = fn;
    m->task_ctx = ctx;
    run_all(m, JOB_TASK);
}

/* Per-layer activation pointers (offsets between layers use the capacity
 * B x T, contents the forward's B, T), shifted to example b0. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *fch_gelu, *residual3;
} layer_acts;

static layer_acts layer_at(model *m, int l, int b0)
{
    size_t BT = (size_t)m->B * m->T, C = m->cfg.dim, H = m->cfg.heads;
    size_t att = (size_t)m->B * H * m->T * m->T;
    size_t r = (size_t)b0 * m->cur_T; /* first row of the shard */
    model_acts *a = &m->acts;
    layer_acts la = {
        a->ln1 + l * BT * C + r * C, a->ln1_mean + l * BT + r, a->ln1_rstd + l * BT + r,
        a->qkv + l * BT * 3 * C + r * 3 * C, a->atty + l * BT * C + r * C,
        a->att + l * att + (size_t)b0 * H * m->cur_T * m->cur_T,
        a->residual2 + l * BT * C + r * C, a->ln2 + l * BT * C + r * C,
        a->ln2_mean + l * BT + r, a->ln2_rstd + l * BT + r,
        a->fch + l * BT * 4 * C + r * 4 * C, a->fch_gelu + l * BT * 4 * C + r * 4 * C,
        a->residual3 + l * BT * C + r * C};
    return la;
}

static layer_acts layer_of(model *m, int l) { return layer_at(m, l, 0); }

/* The input of block l (the residual stream entering it), from example b0. */
static float *block_input(model *m, int l, int b0)
{
    if (l == 0) return m->acts.encoded + (size_t)b0 * m->cur_T * m->cfg.dim;
    layer_acts p = layer_at(m, l - 1, b0);
    return m->cfg.norm == MODEL_NORM_POST ? p.ln2 : p.residual3;
}

/* Forward of examples [b0, b0 + B); returns the sum of their token losses. */
static double forward_shard(model *m, int b0, int B)
{
    const model_config *c = &m->cfg;
    int L = c->layers, C = c->dim, NH = c->heads, V = c->vocab, T = m->cur_T, BT = B * T;
    model_params *p = &m->params;
    size_t r = (size_t)b0 * T;
    float *x = m->acts.encoded + r * C;
    encoder_forward(x, m->inputs + r, p->wte, p->wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        layer_acts a = layer_at(m, l, b0);
        const sreparam_linear *lin = m->lin + l * MODEL_LIN_PER_LAYER;
        float *ain = x, *min, *skip;
        if (c->norm == MODEL_NORM_PRE) {
            layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p->ln1w + l * C, p->ln1b + l * C, BT, C);
            ain = a.ln1;
        }
        matmul_forward(a.qkv, ain, lin[MODEL_LIN_QKV].weff, p->qkvb + l * 3 * C, NULL, BT, C, 3 * C);
        attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
        matmul_forward(a.residual2, a.atty, lin[MODEL_LIN_ATTPROJ].weff, p->attprojb + l * C, x, BT, C, C);
        if (c->norm == MODEL_NORM_PRE) {
            layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p->ln2w + l * C, p->ln2b + l * C, BT, C);
            min = a.ln2; skip = a.residual2;
        } else if (c->norm == MODEL_NORM_POST) {
            layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual2, p->ln1w + l * C, p->ln1b + l * C, BT, C);
            min = skip = a.ln1;
        } else {
            min = skip = a.residual2;
        }
        matmul_forward(a.fch, min, lin[MODEL_LIN_FC].weff, NULL, NULL, BT, C, 4 * C);
        gelu_forward(a.fch_gelu, a.fch, p->fcb + l * 4 * C, BT, 4 * C); /* bias fused */
        matmul_forward(a.residual3, a.fch_gelu, lin[MODEL_LIN_FCPROJ].weff, p->fcprojb + l * C, skip, BT, 4 * C, C);
        x = a.residual3;
        if (c->norm == MODEL_NORM_POST) {
            layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual3, p->ln2w + l * C, p->ln2b + l * C, BT, C);
            x = a.ln2;
        }
    }
    if (c->norm != MODEL_NORM_NONE) {
        float *lnf = m->acts.lnf + r * C;
        layernorm_forward(lnf, m->acts.lnf_mean + r, m->acts.lnf_rstd + r, x, p->lnfw, p->lnfb, BT, C);
        x = lnf;
    }
    float *probs = m->acts.probs + r * V;
    matmul_forward(probs, x, m->lin[m->num_linear - 1].weff, NULL, NULL, BT, C, V);
    return softmax_crossentropy_forward(probs, m->acts.losses + r, m->targets ? m->targets + r : NULL, BT, V);
}

KERNEL void add_into(float *restrict dst, const float *restrict src, long n)
{
    for (long i = 0; i < n; i++) dst[i] += src[i];
}

/* With σReparam the shards never write the gradients of the linear weights
 * (they write dL/dW_hat; sreparam_backward fills dW once, after the
 * reduction), so those ranges are neither cleared nor reduced: σReparam then
 * moves no more memory than the plain model. */
static int skip_in_grads(const model *m, int t)
{
    /* gamma's gradient only ever comes from sreparam_backward, which runs
     * concurrently with the reduction: it must not be touched here */
    return t == MODEL_GAMMA ||
           (m->cfg.reparam != MODEL_REPARAM_NONE &&
            (t == MODEL_QKVW || t == MODEL_ATTPROJW || t == MODEL_FCW || t == MODEL_FCPROJW ||
             t == MODEL_LMW));
}

/* Backward of examples [b0, b0 + B) into shard sh's gradient buffers. */
static void backward_shard(model *m, model_shard *sh, int b0, int B)
{
    const model_config *c = &m->cfg;
    int L = c->layers, C = c->dim, NH = c->heads, V = c->vocab, T = m->cur_T, BT = B * T;
    long BTC = (long)BT * C;
    size_t r = (size_t)b0 * T;
    model_params *p = &m->params, *g = &sh->grads;
    float dwb = c->reparam == MODEL_REPARAM_NONE ? 1.0f : 0.0f; /* see dweff in model_create */
    float *s = sh->scratch;
    float *dx = s, *dtmp = s + BTC, *da = s + 2 * BTC, *datty = s + 3 * BTC;
    float *dqkv = s + 4 * BTC, *dfch_gelu = s + 7 * BTC;
    float *datt = s + 11 * BTC;
    float *tmp;
    /* this shard's copy of a linear's dL/dW_hat */
#define DWEFF(i) (c->reparam == MODEL_REPARAM_NONE                                   \
                      ? sh->grads_memory + (m->lin[i].dweff - m->grads_memory)          \
                      : sh->deff + (m->lin[i].dweff - m->deff_memory))

    if (sh != &m->shards[0]) { /* private buffer: clear what this pass adds into */
        size_t off = 0;
        for (int t = 0; t < MODEL_NUM_PARAMS; t++) {
            if (!skip_in_grads(m, t)) memset(sh->grads_memory + off, 0, sizeof(float) * m->param_sizes[t]);
            off += m->param_sizes[t];
        }
    }
    float *probs = m->acts.probs + r * V;
    crossentropy_backward(probs, m->targets + r, BT, V, 1.0f / ((float)m->cur_B * T));
    float *xlast = block_input(m, L, b0);
    int hi = m->num_linear - 1;
    const sreparam_linear *head = &m->lin[hi];
    if (c->norm != MODEL_NORM_NONE) {
        matmul_backward(dtmp, DWEFF(hi), NULL, probs, m->acts.lnf + r * C, head->weff, BT, C, V, dwb);
        memset(dx, 0, sizeof(float) * BTC);
        layernorm_backward(dx, g->lnfw, g->lnfb, dtmp, xlast, p->lnfw, m->acts.lnf_mean + r, m->acts.lnf_rstd + r, BT, C);
    } else {
        matmul_backward(dx, DWEFF(hi), NULL, probs, xlast, head->weff, BT, C, V, dwb);
    }
    for (int l = L - 1; l >= 0; l--) {
        layer_acts a = layer_at(m, l, b0);
        int li = l * MODEL_LIN_PER_LAYER;
        const sreparam_linear *lin = m->lin + li;
        float *xin = block_input(m, l, b0);
        float *min = c->norm == MODEL_NORM_PRE ? a.ln2 : c->norm == MODEL_NORM_POST ? a.ln1 : a.residual2;
        float *ain = c->norm == MODEL_NORM_PRE ? a.ln1 : xin;
        if (c->norm == MODEL_NORM_POST) { /* out = LN2(r3) */
            memset(dtmp, 0, sizeof(float) * BTC);
            layernorm_backward(dtmp, g->ln2w + l * C, g->ln2b + l * C, dx, a.residual3, p->ln2w + l * C, a.ln2_mean, a.ln2_rstd, BT, C);
            tmp = dx; dx = dtmp; dtmp = tmp;
        }
        /* dx = d(residual3); MLP branch */
        matmul_backward(dfch_gelu, DWEFF(li + MODEL_LIN_FCPROJ), g->fcprojb + l * C, dx, a.fch_gelu, lin[MODEL_LIN_FCPROJ].weff, BT, 4 * C, C, dwb);
        gelu_backward(dfch_gelu, a.fch, (long)BT * 4 * C); /* now d(fc pre-activation) */
        matmul_backward(da, DWEFF(li + MODEL_LIN_FC), g->fcb + l * 4 * C, dfch_gelu, min, lin[MODEL_LIN_FC].weff, BT, C, 4 * C, dwb);
        if (c->norm == MODEL_NORM_PRE) {
            layernorm_backward(dx, g->ln2w + l * C, g->ln2b + l * C, da, a.residual2, p->ln2w + l * C, a.ln2_mean, a.ln2_rstd, BT, C);
        } else if (c->norm == MODEL_NORM_POST) { /* n = LN1(r2) feeds both skip and MLP */
            add_into(dx, da, BTC);
            memset(dtmp, 0, sizeof(float) * BTC);
            layernorm_backward(dtmp, g->ln1w + l * C, g->ln1b + l * C, dx, a.residual2, p->ln1w + l * C, a.ln1_mean, a.ln1_rstd, BT, C);
            tmp = dx; dx = dtmp; dtmp = tmp;
        } else {
            add_into(dx, da, BTC);
        }
        /* dx = d(residual2); attention branch */
        matmul_backward(datty, DWEFF(li + MODEL_LIN_ATTPROJ), g->attprojb + l * C, dx, a.atty, lin[MODEL_LIN_ATTPROJ].weff, BT, C, C, dwb);
        attention_backward(dqkv, datt, datty, a.qkv, a.att, B, T, C, NH);
        matmul_backward(da, DWEFF(li + MODEL_LIN_QKV), g->qkvb + l * 3 * C, dqkv, ain, lin[MODEL_LIN_QKV].weff, BT, C, 3 * C, dwb);
        if (c->norm == MODEL_NORM_PRE)
            layernorm_backward(dx, g->ln1w + l * C, g->ln1b + l * C, da, xin, p->ln1w + l * C, a.ln1_mean, a.ln1_rstd, BT, C);
        else
            add_into(dx, da, BTC);
    }
    encoder_backward(g->wte, g->wpe, dx, m->inputs + r, B, T, C);
#undef DWEFF
}

/* ---- worker threads: data parallel over the examples of a batch ---------
 * Each shard runs the whole forward/backward of its examples with
 * single-threaded OpenBLAS calls; see model.h for why. */

static void shard_range(const model *m, int t, int *b0, int *nb)
{
    int B = m->cur_B, n = m->nthreads < B ? m->nthreads : B;
    if (t >= n) { *b0 = 0; *nb = 0; return; }
    *b0 = B * t / n;
    *nb = B * (t + 1) / n - *b0;
}

/* Splits [0, n) evenly over the threads. */
static void split_range(const model *m, int t, size_t n, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)t / (size_t)m->nthreads;
    *hi = n * (size_t)(t + 1) / (size_t)m->nthreads;
}


static void run_shard(model *m, int t)
{
    int b0, nb;
    shard_range(m, t, &b0, &nb);
    model_shard *sh = &m->shards[t];
    size_t lo, hi;
    switch (m->job) {
    case JOB_FORWARD:
        sh->loss_sum = nb ? forward_shard(m, b0, nb) : 0.0;
        break;
    case JOB_BACKWARD:
        if (nb) backward_shard(m, sh, b0, nb);
        else sh->idle = 1;
        break;
    case JOB_REDUCE: { /* grads (and dW_hat) of shards 1.. into shard 0, fixed order */
        size_t off = 0;
        for (int p = 0; p < MODEL_NUM_PARAMS; p++) {
            size_t n = m->param_sizes[p];
            if (!skip_in_grads(m, p)) {
                split_range(m, t, n, &lo, &hi);
                for (int k = 1; k < m->nthreads; k++)
                    if (!m->shards[k].idle)
                        add_into(m->grads_memory + off + lo, m->shards[k].grads_memory + off + lo, (long)(hi - lo));
            }
            off += n;
        }
        /* dW_hat by linear, on the thread that owns it, which can then map it
         * to dW and dgamma at once (no second dispatch): σReparam's backward. */
        sh->reparam_seconds = 0.0;
        for (int i = 0; m->deff_memory && i < m->num_linear; i++) {
            if (m->lin_owner[i] != t) continue;
            sreparam_linear *l = &m->lin[i];
            long n = (long)l->out * l->in;
            size_t o = (size_t)(l->dweff - m->deff_memory);
            for (int k = 1; k < m->nthreads; k++)
                if (!m->shards[k].idle) add_into(l->dweff, m->shards[k].deff + o, n);
            double t0 = now_seconds();
            sreparam_backward(l, m->cfg.reparam == MODEL_REPARAM_SIGMA);
            sh->reparam_seconds += now_seconds() - t0;
        }
        break;
    }
    case JOB_REPARAM_FWD: /* this thread's linears (balanced by size at create) */
        for (int i = 0; i < m->num_linear; i++) {
            if (m->lin_owner[i] != t) continue;
            sreparam_linear *l = &m->lin[i];
            if (m->train) sreparam_power_step(l);
            else l->sigma = sreparam_sigma(l);
            sreparam_forward(l);
        }
        break;
    case JOB_TASK:
        m->task(m->task_ctx, t, m->nthreads);
        break;
    case JOB_ZERO:
        split_range(m, t, m->num_params, &lo, &hi);
        memset(m->grads_memory + lo, 0, (hi - lo) * sizeof(float));
        break;
    }
}

#define SPIN 4000 /* pause instructions, ~0.1-0.5 ms */

static void *worker_main(void *arg)
{
    model_shard *sh = arg;
    model *m = sh->m;
    unsigned seen = 0;
    for (;;) {
        /* Jobs come in bursts (σReparam, forward, backward, reduce): spin a
         * little before sleeping so a new job starts without a futex wake-up. */
        for (int i = 0; i < SPIN && __atomic_load_n(&m->gen, __ATOMIC_ACQUIRE) == seen; i++)
            __builtin_ia32_pause();
        pthread_mutex_lock(&m->mu);
        while (m->gen == seen && !m->quit) pthread_cond_wait(&m->go, &m->mu);
        if (m->quit) { pthread_mutex_unlock(&m->mu); return NULL; }
        seen = m->gen;
        pthread_mutex_unlock(&m->mu);
        run_shard(m, sh->id);
        pthread_mutex_lock(&m->mu);
        if (--m->pending == 0) pthread_cond_signal(&m->done);
        pthread_mutex_unlock(&m->mu);
    }
}

/* Runs a job on every shard (shard 0 on this thread) and waits for all. */
static void run_all(model *m, int job)
{
    m->job = job;
    if (job == JOB_FORWARD || job == JOB_BACKWARD)
        for (int t = 0; t < m->nthreads; t++) m->shards[t].idle = 0;
    if (m->nthreads > 1) {
        pthread_mutex_lock(&m->mu);
        m->pending = m->nthreads - 1;
        m->gen++;
        pthread_cond_broadcast(&m->go);
        pthread_mutex_unlock(&m->mu);
    }
    run_shard(m, 0);
    if (m->nthreads > 1) {
        for (int i = 0; i < SPIN && __atomic_load_n(&m->pending, __ATOMIC_ACQUIRE) > 0; i++)
            __builtin_ia32_pause();
        pthread_mutex_lock(&m->mu);
        while (m->pending > 0) pthread_cond_wait(&m->done, &m->mu);
        pthread_mutex_unlock(&m->mu);
    }
}

float model_forward(model *m, const int *inputs, const int *targets, int B, int T, int train)
{
    const model_config *c = &m->cfg;
    m->cur_B = B; m->cur_T = T;
    m->inputs = inputs; m->targets = targets;
    if (c->reparam != MODEL_REPARAM_NONE) {
        double t0 = now_seconds();
        m->train = train;
        run_all(m, JOB_REPARAM_FWD);
        m->reparam_seconds += now_seconds() - t0;
    }
    run_all(m, JOB_FORWARD);
    double total = 0.0;
    for (int t = 0; t < m->nthreads; t++) total += m->shards[t].loss_sum;
    m->mean_loss = targets ? (float)(total / ((double)B * T)) : -1.0f;
    return m->mean_loss;
}

void model_backward(model *m)
{
    run_all(m, JOB_BACKWARD);
    /* The reduction moves the same amount of memory with and without
     * σReparam (see skip_in_grads), so only sreparam_backward inside it is
     * counted as σReparam's cost (the slowest thread's share). */
    if (m->nthreads > 1 || m->cfg.reparam != MODEL_REPARAM_NONE) {
        run_all(m, JOB_REDUCE);
        double worst = 0.0;
        for (int t = 0; t < m->nthreads; t++)
            if (m->shards[t].reparam_seconds > worst) worst = m->shards[t].reparam_seconds;
        m->reparam_seconds += worst;
    }
}

float *model_attention(model *m, int layer) { return layer_of(m, layer).att; }
float *model_qkv(model *m, int layer) { return layer_of(m, layer).qkv; }

float *model_attn_input(model *m, int layer)
{
    return m->cfg.norm == MODEL_NORM_PRE ? layer_of(m, layer).ln1 : block_input(m, layer, 0);
}

const float *model_qkv_weight(const model *m, int layer)
{
    return m->lin[layer * MODEL_LIN_PER_LAYER + MODEL_LIN_QKV].weff;
}

int model_linear_index(const model *m, int layer, int which)
{
    if (layer >= m->cfg.layers) return m->num_linear - 1;
    return layer * MODEL_LIN_PER_LAYER + which;
}

const sreparam_linear *model_linear(const model *m, int index) { return &m->lin[index]; }
