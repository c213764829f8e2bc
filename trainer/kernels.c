/* kernels.c: the GPT model's compute kernels; the contract and the
 * conventions are in kernels.h. Not the model (model.c). */
#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Kernels are kept out of line so that profiles attribute time to them. */
#define KERNEL __attribute__((noinline))

KERNEL void kernel_encoder_forward(float *restrict out, const int *restrict inp, const float *restrict wte,
                                   const float *restrict wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((long)b * T + t) * C;
            const float *we = wte + (long)inp[b * T + t] * C;
            const float *pe = wpe + (long)t * C;
            for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
}

/* Adds into dwte, dwpe. */
KERNEL void kernel_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((long)b * T + t) * C;
            float *dwe = dwte + (long)inp[b * T + t] * C;
            float *dpe = dwpe + (long)t * C;
            for (int i = 0; i < C; i++) {
                dwe[i] += d[i];
                dpe[i] += d[i];
            }
        }
}

/* Row reductions with 16 partial sums: without -ffast-math GCC may not
 * reorder a float sum, so a single accumulator would not vectorize. */
#define LANES 16
static inline float red_sum(const float *x, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += x[i + k];
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    for (; i < n; i++) s += x[i];
    return s;
}

static inline float red_sqdev(const float *x, float m, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) {
            float d = x[i + k] - m;
            acc[k] += d * d;
        }
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += acc[k];
    for (; i < n; i++) {
        float d = x[i] - m;
        s += d * d;
    }
    return s;
}

KERNEL void kernel_layernorm_forward(float *restrict out, float *restrict mean, float *restrict rstd,
                                     const float *restrict inp, const float *restrict w, const float *restrict bias,
                                     int N, int C) {
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
KERNEL void kernel_layernorm_backward(float *restrict dinp, float *restrict dw, float *restrict dbias,
                                      const float *restrict dout, const float *restrict inp, const float *restrict w,
                                      const float *restrict mean, const float *restrict rstd, int N, int C) {
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
        for (int k = 0; k < LANES; k++) {
            dnorm_mean += a1[k];
            dnorm_norm_mean += a2[k];
        }
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

void kernel_matmul_reference(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) s += inp[(long)n * C + i] * w[(long)o * C + i];
            out[(long)n * OC + o] = s;
        }
}

/* out (N, OC) = alpha inp (N, C) @ w^T + bias (may be NULL) + residual (may
 * be NULL, same shape as out: the residual add is fused into the bias pass).
 * alpha is σReparam's gamma / sigma (1 without it): W_hat is never formed. */
KERNEL void kernel_matmul_forward(float *restrict out, const float *restrict inp, const float *restrict w, float alpha,
                                  const float *restrict bias, const float *restrict residual, int N, int C, int OC) {
    float beta = 0.0f;
    if (bias || residual) {
        for (int n = 0; n < N; n++) {
            float *o = out + (long)n * OC;
            const float *r = residual ? residual + (long)n * OC : NULL;
            if (bias && r)
                for (int i = 0; i < OC; i++) o[i] = r[i] + bias[i];
            else if (bias)
                for (int i = 0; i < OC; i++) o[i] = bias[i];
            else
                for (int i = 0; i < OC; i++) o[i] = r[i];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, alpha, inp, C, w, C, beta, out, OC);
}

double kernel_dot_double(const float *restrict x, const float *restrict y, long n) {
    double acc[8] = {0};
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * y[i + k];
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += acc[k];
    for (; i < n; i++) s += (double)x[i] * y[i];
    return s;
}

/* Backward of kernel_matmul_forward with the same alpha: dinp (if not NULL) is
 * OVERWRITTEN with alpha dout @ w; dw = dw_beta dw + alpha dout^T inp; adds
 * into dbias (may be NULL). */
KERNEL void kernel_matmul_backward(float *restrict dinp, float *restrict dw, float *restrict dbias,
                                   const float *restrict dout, const float *restrict inp, const float *restrict w,
                                   float alpha, int N, int C, int OC, float dw_beta) {
    if (dinp) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, alpha, dout, OC, w, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, alpha, dout, OC, inp, C, dw_beta, dw, C);
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

static inline float red_max(const float *x, int n) {
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

static inline float red_dot(const float *x, const float *y, int n) {
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
static void causal_softmax_row(float *restrict a, int i, int T) {
    int n = i + 1;
    float mx = red_max(a, n);
    for (int j = 0; j < n; j++) a[j] = kernel_fast_expf(a[j] - mx);
    float inv = 1.0f / red_sum(a, n);
    for (int j = 0; j < n; j++) a[j] *= inv;
    for (int j = n; j < T; j++) a[j] = 0.0f;
}

/* Causal attention in row blocks of att_block queries: block [r0, r1) only
 * needs keys [0, r1), which skips most of the masked upper triangle in the
 * QK^T and AV products and their gradients (37% of the attention FLOPs at
 * T = 128 with blocks of 32).  A variable so that tests can shrink it. */
static int att_block = 32;

void kernel_set_att_block(int rows) { att_block = rows; }
int kernel_att_block(void) { return att_block; }

/* qkv (B, T, 3C) -> att (B, NH, T, T), out (B, T, C). */
KERNEL void kernel_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
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
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, scale, q + (long)r0 * C3, C3, k, C3,
                            0.0f, a + (long)r0 * T, T);
                for (int i = r0; i < r1; i++) causal_softmax_row(a + (long)i * T, i, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f, a + (long)r0 * T, T, v, C3,
                            0.0f, o + (long)r0 * C, C);
            }
        }
}

/* OVERWRITES dqkv (B, T, 3C); datt is (T, T) scratch. */
KERNEL void kernel_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                                      int B, int T, int C, int NH) {
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
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, 1.0f, d + (long)r0 * C, C, v, C3, 0.0f,
                            datt + (long)r0 * T, T);
                for (int i = r0; i < r1; i++) {
                    const float *ar = a + (long)i * T;
                    float *dr = datt + (long)i * T;
                    float s = red_dot(ar, dr, i + 1);
                    for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - s) * scale;
                    for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f, datt + (long)r0 * T, T, k, C3,
                            0.0f, dq + (long)r0 * C3, C3);
            }
            /* key blocks: only queries i >= c0 see keys [c0, c1) */
            for (int c0 = 0; c0 < T; c0 += bs) {
                int c1 = c0 + bs < T ? c0 + bs : T, m = c1 - c0, n = T - c0;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, hs, n, 1.0f, a + (long)c0 * T + c0, T,
                            d + (long)c0 * C, C, 0.0f, dv + (long)c0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, hs, n, 1.0f, datt + (long)c0 * T + c0, T,
                            q + (long)c0 * C3, C3, 0.0f, dk + (long)c0 * C3, C3);
            }
        }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* out = gelu(x + bias) for x (N, OC); x is then OVERWRITTEN with
 * gelu'(x + bias), which is all the backward needs (the pre-activation itself
 * is not used again), so the backward does not recompute tanh. */
KERNEL void kernel_gelu_forward(float *restrict out, float *restrict x, const float *restrict bias, int N, int OC) {
    for (int n = 0; n < N; n++) {
        float *xr = x + (long)n * OC, *o = out + (long)n * OC;
        for (int i = 0; i < OC; i++) {
            float u = xr[i] + bias[i];
            float t = kernel_fast_tanhf(GELU_SCALE * (u + 0.044715f * u * u * u));
            float dt = (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * u * u);
            o[i] = 0.5f * u * (1.0f + t);
            xr[i] = 0.5f * (1.0f + t) + 0.5f * u * dt;
        }
    }
}

/* d *= deriv (deriv from kernel_gelu_forward): the gradient through GELU, in place. */
KERNEL void kernel_gelu_backward(float *restrict d, const float *restrict deriv, long n) {
    for (long i = 0; i < n; i++) d[i] *= deriv[i];
}

/* probs (N, V) holds logits on entry and softmax on return; losses[n] gets
 * -log p[target] when targets is not NULL.  Returns the sum of the losses. */
KERNEL double kernel_softmax_crossentropy_forward(float *probs, float *losses, const int *targets, int N, int V) {
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float *p = probs + (long)n * V;
        float mx = p[0];
        for (int i = 1; i < V; i++) mx = p[i] > mx ? p[i] : mx;
        float zt = targets ? p[targets[n]] : 0.0f;
        float s = 0.0f;
        for (int i = 0; i < V; i++) {
            float e = kernel_fast_expf(p[i] - mx);
            p[i] = e;
            s += e;
        }
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
KERNEL void kernel_crossentropy_backward(float *probs, const int *targets, int N, int V, float inv) {
    for (int n = 0; n < N; n++) {
        float *p = probs + (long)n * V;
        for (int i = 0; i < V; i++) p[i] *= inv;
        p[targets[n]] -= inv;
    }
}


KERNEL void kernel_add_into(float *restrict dst, const float *restrict src, long n) {
    for (long i = 0; i < n; i++) dst[i] += src[i];
}
