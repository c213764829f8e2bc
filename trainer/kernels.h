/* kernels.h: the GPT model's compute kernels (trainer/model.c calls
 * them; tests/test_model.c checks each against a reference), with the
 * naive reference matmul kept beside the fast one. Pure functions of
 * their arguments on caller-owned buffers; no allocation, no threads (the
 * model shards a batch and calls them per shard). Not the model's layout
 * or its passes (model.h).
 *
 * Conventions (llm.c): kernel_X_forward(out, inputs..., sizes),
 * kernel_X_backward(d-inputs..., d-outputs, saved inputs..., sizes).
 * Gradients of PARAMETERS are always added into. Gradients of ACTIVATIONS
 * are overwritten by matmul/attention backward, scaled in place by
 * gelu/crossentropy backward and added into by kernel_layernorm_backward; each
 * comment says which. Why not "always add" as in llm.c: that needs the
 * activation-gradient buffers zeroed every step, several MB of memset that
 * costs more than the σReparam bookkeeping we try to keep under 3%.
 * Shapes in comments are row-major: (B, T, C) is B x T x C floats. */
#ifndef KERNELS_H
#define KERNELS_H

#include <stdint.h>

/* exp(x) for x in float range, relative error ~2e-7: Cephes expf (Cody-Waite
 * range reduction, degree-6 polynomial) with a round-to-nearest trick instead
 * of floorf, so that GCC vectorizes the loops that call it (libm's expf is a
 * call per element).  No branch may remain for that (GELU's and softmax's
 * loops were scalar while one did): the exponent is taken from the bits of
 * the rounding sum itself, not by a float -> int conversion (undefined for a
 * NaN, so it needed one), in unsigned arithmetic, so a NaN's garbage
 * exponent is defined behaviour; the NaN itself is carried by p. */
static inline float kernel_fast_expf(float x) {
    /* clamp to [-87, 88] by bit masks: GCC does not if-convert the two
     * float selects (trapping math), and a NaN compares false and stays */
    union {
        float f;
        uint32_t u;
    } xb = {x}, lo = {-87.0f}, hi = {88.0f};
    uint32_t ml = -(uint32_t)(x < -87.0f), mh = -(uint32_t)(x > 88.0f);
    xb.u = (xb.u & ~ml) | (lo.u & ml);
    xb.u = (xb.u & ~mh) | (hi.u & mh);
    x = xb.f;
    union {
        float f;
        uint32_t u;
    } t = {x * 1.44269504088896341f + 12582912.0f}, e;
    float r = t.f - 12582912.0f; /* round(x / ln 2), in [-126, 127] */
    float f = x - r * 0.693359375f - r * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
    p = p * f * f + f + 1.0f;
    /* 12582912 = 1.5 x 2^23 = 0x4B400000: its low mantissa bits hold r */
    e.u = (t.u - 0x4B400000u + 127u) << 23;
    return p * e.f;
}

static inline float kernel_fast_tanhf(float x) { return 1.0f - 2.0f / (kernel_fast_expf(2.0f * x) + 1.0f); }

/* out (B, T, C) = wte[inp] + wpe[t]. */
void kernel_encoder_forward(float *restrict out, const int *restrict inp, const float *restrict wte,
                            const float *restrict wpe, int B, int T, int C);

/* Adds into dwte, dwpe. */
void kernel_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);

/* out (N, C) = layernorm(inp) * w + bias; saves mean and rstd (N) for the
 * backward. */
void kernel_layernorm_forward(float *restrict out, float *restrict mean, float *restrict rstd,
                              const float *restrict inp, const float *restrict w, const float *restrict bias, int N,
                              int C);

/* Adds into dinp, dw, dbias. */
void kernel_layernorm_backward(float *restrict dinp, float *restrict dw, float *restrict dbias,
                               const float *restrict dout, const float *restrict inp, const float *restrict w,
                               const float *restrict mean, const float *restrict rstd, int N, int C);

/* out (N, OC) = alpha inp (N, C) @ w^T + bias (may be NULL) + residual (may
 * be NULL, same shape as out: the residual add is fused into the bias pass).
 * alpha is σReparam's gamma / sigma (1 without it): W_hat is never formed. */
void kernel_matmul_forward(float *restrict out, const float *restrict inp, const float *restrict w, float alpha,
                           const float *restrict bias, const float *restrict residual, int N, int C, int OC);

/* Backward of kernel_matmul_forward with the same alpha: dinp (if not NULL) is
 * OVERWRITTEN with alpha dout @ w; dw = dw_beta dw + alpha dout^T inp; adds
 * into dbias (may be NULL). */
void kernel_matmul_backward(float *restrict dinp, float *restrict dw, float *restrict dbias, const float *restrict dout,
                            const float *restrict inp, const float *restrict w, float alpha, int N, int C, int OC,
                            float dw_beta);

/* qkv (B, T, 3C) -> att (B, NH, T, T), out (B, T, C). */
void kernel_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);

/* OVERWRITES dqkv (B, T, 3C); datt is (T, T) scratch. */
void kernel_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                               int T, int C, int NH);

/* out = gelu(x + bias) for x (N, OC); x is then OVERWRITTEN with
 * gelu'(x + bias), which is all the backward needs (the pre-activation itself
 * is not used again), so the backward does not recompute tanh. */
void kernel_gelu_forward(float *restrict out, float *restrict x, const float *restrict bias, int N, int OC);

/* d *= deriv (deriv from kernel_gelu_forward): the gradient through GELU, in place. */
void kernel_gelu_backward(float *restrict d, const float *restrict deriv, long n);

/* probs (N, V) holds logits on entry and softmax on return; losses[n] gets
 * -log p[target] when targets is not NULL.  Returns the sum of the losses. */
double kernel_softmax_crossentropy_forward(float *probs, float *losses, const int *targets, int N, int V);

/* probs becomes dlogits of the loss sum scaled by inv (1 / tokens of the
 * whole batch), in place. */
void kernel_crossentropy_backward(float *probs, const int *targets, int N, int V, float inv);

/* dst += src over n floats. */
void kernel_add_into(float *restrict dst, const float *restrict src, long n);

/* The naive triple-loop reference of kernel_matmul_forward (alpha 1, no
 * residual): out (N, OC) = inp (N, C) @ w^T (OC, C) + bias (OC, may be
 * NULL). For tests. */
void kernel_matmul_reference(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC);

/* <x, y> over n floats, accumulated in double (n up to BT x 4C). */
double kernel_dot_double(const float *restrict x, const float *restrict y, long n);

/* The causal attention's query block (rows; default 32). Tests shrink it
 * to cover several blocks and a ragged last one; set it before any thread
 * runs the attention. */
void kernel_set_att_block(int rows);
int kernel_att_block(void);

#endif
