/* test_model.c - finite-difference gradient checks of every layer's backward
 * and of the whole model in all --reparam x --norm modes, against a
 * double-precision reference written independently here (naive loops).  The
 * analytic gradients come from the fp32 model; the numeric ones from central
 * differences of the double reference, so the check also catches forward
 * bugs.  Each check prints the relative error max|a - n| / max|n| per tensor. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define UNIT_TESTING 1
#include "kernels.h"
#include "model.h"

static uint64_t rng_state = 42;
static double rnd(void) { return model_random_normal(&rng_state); }

static float *frand(size_t n, double scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rnd() * scale);
    return x;
}
static double *to_d(const float *x, size_t n) {
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* ---------------------------------------------------- double reference */

static void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[n * C + i] - m) * (x[n * C + i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++) out[n * C + i] = (x[n * C + i] - m) * s * w[i] + b[i];
    }
}

static void ref_matmul(double *out, const double *x, const double *w, const double *b, double alpha, int N, int C,
                       int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int i = 0; i < C; i++) s += x[n * C + i] * w[o * C + i];
            out[n * OC + o] = alpha * s + (b ? b[o] : 0.0);
        }
}

static void ref_attention(double *out, const double *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double *a = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * 3 * C + h * hs;
                double mx = -1e300, s = 0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int e = 0; e < hs; e++) d += q[e] * k[e];
                    a[j] = d / sqrt((double)hs);
                    if (a[j] > mx) mx = a[j];
                }
                for (int j = 0; j <= i; j++) {
                    a[j] = exp(a[j] - mx);
                    s += a[j];
                }
                for (int e = 0; e < hs; e++) {
                    double y = 0;
                    for (int j = 0; j <= i; j++) y += a[j] / s * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + e];
                    out[(b * T + i) * C + h * hs + e] = y;
                }
            }
    free(a);
}

static double ref_gelu1(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static double ref_ce(const double *logits, const int *tg, int N, int V) {
    double tot = 0;
    for (int n = 0; n < N; n++) {
        double mx = -1e300, s = 0;
        for (int i = 0; i < V; i++)
            if (logits[n * V + i] > mx) mx = logits[n * V + i];
        for (int i = 0; i < V; i++) s += exp(logits[n * V + i] - mx);
        tot += log(s) + mx - logits[n * V + tg[n]];
    }
    return tot / N;
}

/* -------------------------------------------------------- comparison */

/* Prints and returns max|a - n| / max|n| over n entries. */
static double relerr(const char *what, const float *a, const double *num, size_t n) {
    double md = 0, mn = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - num[i]);
        if (d > md) md = d;
        if (fabs(num[i]) > mn) mn = fabs(num[i]);
    }
    double r = mn > 0 ? md / mn : md;
    printf("  %-28s rel err %.3e (max |grad| %.3e)\n", what, r, mn);
    return r;
}

/* Central difference of f with respect to x[0..n). */
typedef double (*lossfn)(void *ctx);
static void numgrad(double *g, double *x, size_t n, lossfn f, void *ctx) {
    const double h = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double s = x[i];
        x[i] = s + h;
        double lp = f(ctx);
        x[i] = s - h;
        double lm = f(ctx);
        x[i] = s;
        g[i] = (lp - lm) / (2 * h);
    }
}

#define TOL 2e-3

/* ------------------------------------------------------- layer checks */

typedef struct {
    int N, C, OC;
    double *x, *w, *b, *R, alpha;
} mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    double *out = malloc(sizeof(double) * c->N * c->OC), L = 0;
    ref_matmul(out, c->x, c->w, c->b, c->alpha, c->N, c->C, c->OC);
    for (int i = 0; i < c->N * c->OC; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void test_matmul(void **state) {
    (void)state;
    int N = 6, C = 5, OC = 7;
    float *x = frand(N * C, 1), *w = frand(OC * C, 1), *b = frand(OC, 1), *R = frand(N * OC, 1);
    float *out = calloc(N * OC, 4), *ref = calloc(N * OC, 4);
    kernel_matmul_forward(out, x, w, 1.0f, b, NULL, N, C, OC);
    kernel_matmul_reference(ref, x, w, b, N, C, OC);
    for (int i = 0; i < N * OC; i++) assert_true(fabsf(out[i] - ref[i]) < 1e-4f);
    /* alpha scales the product only: out = 0.5 x w^T + b */
    float *half = calloc(N * OC, 4), *nob = calloc(N * OC, 4);
    kernel_matmul_forward(half, x, w, 0.5f, b, NULL, N, C, OC);
    kernel_matmul_reference(nob, x, w, NULL, N, C, OC);
    for (int i = 0; i < N * OC; i++) assert_true(fabsf(half[i] - 0.5f * nob[i] - b[i % OC]) < 1e-4f);
    free(half);
    free(nob);
    /* fused residual: out = x w^T + b + res */
    float *res = frand(N * OC, 1), *out2 = calloc(N * OC, 4);
    kernel_matmul_forward(out2, x, w, 1.0f, b, res, N, C, OC);
    for (int i = 0; i < N * OC; i++) assert_true(fabsf(out2[i] - ref[i] - res[i]) < 1e-4f);
    kernel_matmul_forward(out2, x, w, 1.0f, NULL, res, N, C, OC);
    kernel_matmul_reference(ref, x, w, NULL, N, C, OC);
    for (int i = 0; i < N * OC; i++) assert_true(fabsf(out2[i] - ref[i] - res[i]) < 1e-4f);
    free(res);
    free(out2);
    float *dx = calloc(N * C, 4), *dw = calloc(OC * C, 4), *db = calloc(OC, 4);
    kernel_matmul_backward(dx, dw, db, R, x, w, 0.7f, N, C, OC, 1.0f);
    mm_ctx c = {N, C, OC, to_d(x, N * C), to_d(w, OC * C), to_d(b, OC), to_d(R, N * OC), 0.7};
    double *g = malloc(sizeof(double) * OC * C);
    printf("matmul:\n");
    numgrad(g, c.x, N * C, mm_loss, &c);
    assert_true(relerr("dinp", dx, g, N * C) < TOL);
    numgrad(g, c.w, OC * C, mm_loss, &c);
    assert_true(relerr("dweight", dw, g, OC * C) < TOL);
    numgrad(g, c.b, OC, mm_loss, &c);
    assert_true(relerr("dbias", db, g, OC) < TOL);
    free(x);
    free(w);
    free(b);
    free(R);
    free(out);
    free(ref);
    free(dx);
    free(dw);
    free(db);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.R);
    free(g);
}

typedef struct {
    int N, C;
    double *x, *w, *b, *R;
} ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    double *out = malloc(sizeof(double) * c->N * c->C), L = 0;
    ref_layernorm(out, c->x, c->w, c->b, c->N, c->C);
    for (int i = 0; i < c->N * c->C; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void test_layernorm(void **state) {
    (void)state;
    int N = 4, C = 37; /* two 16-lane blocks and a tail */
    float *x = frand(N * C, 1), *w = frand(C, 1), *b = frand(C, 1), *R = frand(N * C, 1);
    float *out = calloc(N * C, 4), *mean = calloc(N, 4), *rstd = calloc(N, 4);
    kernel_layernorm_forward(out, mean, rstd, x, w, b, N, C);
    float *dx = calloc(N * C, 4), *dw = calloc(C, 4), *db = calloc(C, 4);
    kernel_layernorm_backward(dx, dw, db, R, x, w, mean, rstd, N, C);
    ln_ctx c = {N, C, to_d(x, N * C), to_d(w, C), to_d(b, C), to_d(R, N * C)};
    double *ro = malloc(sizeof(double) * N * C), *g = malloc(sizeof(double) * N * C);
    ref_layernorm(ro, c.x, c.w, c.b, N, C);
    for (int i = 0; i < N * C; i++) assert_true(fabs(out[i] - ro[i]) < 1e-5);
    printf("layernorm:\n");
    numgrad(g, c.x, N * C, ln_loss, &c);
    assert_true(relerr("dinp", dx, g, N * C) < TOL);
    numgrad(g, c.w, C, ln_loss, &c);
    assert_true(relerr("dweight", dw, g, C) < TOL);
    numgrad(g, c.b, C, ln_loss, &c);
    assert_true(relerr("dbias", db, g, C) < TOL);
    free(x);
    free(w);
    free(b);
    free(R);
    free(out);
    free(mean);
    free(rstd);
    free(dx);
    free(dw);
    free(db);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.R);
    free(ro);
    free(g);
}

typedef struct {
    int B, T, C, NH;
    double *qkv, *R;
} at_ctx;
static double at_loss(void *p) {
    at_ctx *c = p;
    int n = c->B * c->T * c->C;
    double *out = malloc(sizeof(double) * n), L = 0;
    ref_attention(out, c->qkv, c->B, c->T, c->C, c->NH);
    for (int i = 0; i < n; i++) L += out[i] * c->R[i];
    free(out);
    return L;
}

static void check_attention(int T) {
    int B = 2, C = 8, NH = 2, n = B * T * C;
    float *qkv = frand(3 * n, 1), *R = frand(n, 1);
    float *out = calloc(n, 4), *att = calloc(B * NH * T * T, 4);
    kernel_attention_forward(out, att, qkv, B, T, C, NH);
    /* causal and normalized */
    for (int r = 0; r < B * NH * T; r++) {
        int i = r % T;
        double s = 0;
        for (int j = 0; j < T; j++) {
            if (j > i) assert_true(att[r * T + j] == 0.0f);
            s += att[r * T + j];
        }
        assert_true(fabs(s - 1.0) < 1e-5);
    }
    at_ctx c = {B, T, C, NH, to_d(qkv, 3 * n), to_d(R, n)};
    double *ro = malloc(sizeof(double) * n), *g = malloc(sizeof(double) * 3 * n);
    ref_attention(ro, c.qkv, B, T, C, NH);
    for (int i = 0; i < n; i++) assert_true(fabs(out[i] - ro[i]) < 1e-5);
    float *dqkv = calloc(3 * n, 4), *datt = calloc(T * T, 4);
    kernel_attention_backward(dqkv, datt, R, qkv, att, B, T, C, NH);
    printf("attention T=%d block=%d:\n", T, kernel_att_block());
    numgrad(g, c.qkv, 3 * n, at_loss, &c);
    assert_true(relerr("dqkv", dqkv, g, 3 * n) < TOL);
    free(qkv);
    free(R);
    free(out);
    free(att);
    free(c.qkv);
    free(c.R);
    free(ro);
    free(g);
    free(dqkv);
    free(datt);
}

/* T = 37: rows long enough for the 16-lane reductions, plus tails */
static void test_attention(void **state) {
    (void)state;
    check_attention(5);
    check_attention(37);
    kernel_set_att_block(16); /* several query/key blocks and a ragged last one */
    check_attention(37);
    kernel_set_att_block(2);
    check_attention(5);
    kernel_set_att_block(32);
}

typedef struct {
    int n;
    double *x, *R;
} ge_ctx;
static double ge_loss(void *p) {
    ge_ctx *c = p;
    double L = 0;
    for (int i = 0; i < c->n; i++) L += ref_gelu1(c->x[i]) * c->R[i];
    return L;
}

static void test_gelu(void **state) {
    (void)state;
    int N = 4, OC = 37, n = N * OC; /* lanes and tails */
    float *x = frand(n, 2), *R = frand(n, 1), *out = calloc(n, 4), *dx = calloc(n, 4);
    float *bias = frand(OC, 0.5), *xb = malloc(sizeof(float) * n);
    x[0] = 12.0f;
    x[1] = -12.0f;
    x[2] = -bias[2]; /* saturated tails and the origin */
    for (int i = 0; i < n; i++) xb[i] = x[i] + bias[i % OC];
    float *deriv = malloc(sizeof(float) * n);
    memcpy(deriv, x, sizeof(float) * n);
    kernel_gelu_forward(out, deriv, bias, N, OC);
    for (int i = 0; i < n; i++) assert_true(fabs(out[i] - ref_gelu1(xb[i])) < 1e-5 * (1 + fabs(xb[i])));
    memcpy(dx, R, sizeof(float) * n);
    kernel_gelu_backward(dx, deriv, n);
    ge_ctx c = {n, to_d(xb, n), to_d(R, n)};
    double *g = malloc(sizeof(double) * n);
    printf("gelu:\n");
    numgrad(g, c.x, n, ge_loss, &c);
    assert_true(relerr("dinp", dx, g, n) < TOL);
    free(x);
    free(R);
    free(out);
    free(dx);
    free(bias);
    free(xb);
    free(deriv);
    free(c.x);
    free(c.R);
    free(g);
}

typedef struct {
    int N, V;
    double *z;
    const int *tg;
} ce_ctx;
static double ce_loss(void *p) {
    ce_ctx *c = p;
    return ref_ce(c->z, c->tg, c->N, c->V);
}

static void test_crossentropy(void **state) {
    (void)state;
    int N = 6, V = 11, tg[6] = {0, 3, 10, 5, 5, 7};
    float *z = frand(N * V, 3), *probs = malloc(sizeof(float) * N * V), *losses = calloc(N, 4);
    memcpy(probs, z, sizeof(float) * N * V);
    ce_ctx c = {N, V, to_d(z, N * V), tg};
    double sum = kernel_softmax_crossentropy_forward(probs, losses, tg, N, V);
    printf("crossentropy: loss %.6f ref %.6f\n", sum / N, ref_ce(c.z, tg, N, V));
    assert_true(fabs(sum / N - ref_ce(c.z, tg, N, V)) < 1e-5);
    kernel_crossentropy_backward(probs, tg, N, V, 1.0f / N);
    double *g = malloc(sizeof(double) * N * V);
    numgrad(g, c.z, N * V, ce_loss, &c);
    assert_true(relerr("dlogits", probs, g, N * V) < TOL);
    /* huge logits stay finite */
    float big[3] = {1000.0f, -1000.0f, 0.0f};
    float l;
    int t1 = 1;
    kernel_softmax_crossentropy_forward(big, &l, &t1, 1, 3);
    assert_true(isfinite(l) && fabsf(l - 2000.0f) < 1e-2f);
    free(z);
    free(probs);
    free(losses);
    free(c.z);
    free(g);
}

/* The embedding layer: out = wte[token] + wpe[t]; its backward scatters. */
static void test_encoder(void **state) {
    (void)state;
    int B = 2, T = 3, C = 4, V = 5, inp[6] = {1, 4, 1, 0, 1, 3};
    float *wte = frand(V * C, 1), *wpe = frand(T * C, 1), *R = frand(B * T * C, 1);
    float *out = calloc(B * T * C, 4), *dwte = calloc(V * C, 4), *dwpe = calloc(T * C, 4);
    kernel_encoder_forward(out, inp, wte, wpe, B, T, C);
    kernel_encoder_backward(dwte, dwpe, R, inp, B, T, C);
    /* the loss <R, out> is linear: its exact gradient is the scatter of R */
    double gte[20] = {0}, gpe[12] = {0};
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++) {
                assert_true(out[(b * T + t) * C + i] == wte[inp[b * T + t] * C + i] + wpe[t * C + i]);
                gte[inp[b * T + t] * C + i] += R[(b * T + t) * C + i];
                gpe[t * C + i] += R[(b * T + t) * C + i];
            }
    printf("encoder:\n");
    assert_true(relerr("dwte", dwte, gte, V * C) < 1e-6);
    assert_true(relerr("dwpe", dwpe, gpe, T * C) < 1e-6);
    free(wte);
    free(wpe);
    free(R);
    free(out);
    free(dwte);
    free(dwpe);
}

static void test_fast_exp(void **state) {
    (void)state;
    double worst = 0;
    for (float x = -80.0f; x < 80.0f; x += 0.0137f) {
        double r = fabs(kernel_fast_expf(x) - exp(x)) / exp(x);
        if (r > worst) worst = r;
    }
    printf("fast_expf: max rel err %.2e\n", worst);
    assert_true(worst < 1e-6);
    assert_true(kernel_fast_expf(-1000.0f) >= 0.0f && kernel_fast_expf(-1000.0f) < 1e-37f);
    assert_true(isfinite(kernel_fast_expf(1000.0f)));
    assert_true(isnan(kernel_fast_expf(NAN))); /* divergence must stay visible */
}

/* --------------------------------------------------------- whole model */

typedef struct {
    model *m;
    double *P; /* parameters, double copy of the flat buffer */
    int B, T;
    const int *in, *tg;
} mdl_ctx;

#define PD(c, field) ((c)->P + ((c)->m->params.field - (c)->m->params_memory))

/* The whole model in double: same parameter layout, u and v taken from the
 * float model as constants, sigma = v^T W u recomputed in double. */
static double ref_model_loss(void *p) {
    mdl_ctx *c = p;
    model *m = c->m;
    const model_config *cf = &m->cfg;
    int B = c->B, T = c->T, C = cf->dim, L = cf->layers, V = cf->vocab, BT = B * T;
    double *x = malloc(sizeof(double) * BT * C), *ln = malloc(sizeof(double) * BT * C);
    double *qkv = malloc(sizeof(double) * BT * 3 * C), *y = malloc(sizeof(double) * BT * C);
    double *h = malloc(sizeof(double) * BT * 4 * C), *t = malloc(sizeof(double) * BT * C);
    double *logits = malloc(sizeof(double) * BT * V);
    for (int r = 0; r < BT; r++)
        for (int i = 0; i < C; i++) x[r * C + i] = PD(c, wte)[c->in[r] * C + i] + PD(c, wpe)[(r % T) * C + i];
    /* effective scale of linear i: gamma / (v^T W u) */
    double scale[1024];
    for (int i = 0; i < m->num_linear; i++) {
        const sreparam_linear *l = &m->lin[i];
        if (cf->reparam == MODEL_REPARAM_NONE) {
            scale[i] = 1.0;
            continue;
        }
        const double *W = c->P + (l->w - m->params_memory);
        double s = 0;
        for (int o = 0; o < l->out; o++)
            for (int k = 0; k < l->in; k++) s += l->v[o] * W[o * l->in + k] * l->u[k];
        double gamma = cf->reparam == MODEL_REPARAM_SIGMA ? c->P[l->gamma - m->params_memory] : 1.0;
        scale[i] = gamma / s;
    }
#define W_OF(i) (c->P + (m->lin[i].w - m->params_memory))
    for (int l = 0; l < L; l++) {
        int li = l * MODEL_LIN_PER_LAYER;
        const double *ain = x;
        if (cf->norm == MODEL_NORM_PRE) {
            ref_layernorm(ln, x, PD(c, ln1w) + l * C, PD(c, ln1b) + l * C, BT, C);
            ain = ln;
        }
        ref_matmul(qkv, ain, W_OF(li), PD(c, qkvb) + l * 3 * C, scale[li], BT, C, 3 * C);
        ref_attention(y, qkv, B, T, C, cf->heads);
        ref_matmul(t, y, W_OF(li + 1), PD(c, attprojb) + l * C, scale[li + 1], BT, C, C);
        for (int i = 0; i < BT * C; i++) x[i] += t[i];
        const double *min = x;
        if (cf->norm == MODEL_NORM_PRE) {
            ref_layernorm(ln, x, PD(c, ln2w) + l * C, PD(c, ln2b) + l * C, BT, C);
            min = ln;
        } else if (cf->norm == MODEL_NORM_POST) {
            ref_layernorm(ln, x, PD(c, ln1w) + l * C, PD(c, ln1b) + l * C, BT, C);
            memcpy(x, ln, sizeof(double) * BT * C);
        }
        ref_matmul(h, min, W_OF(li + 2), PD(c, fcb) + l * 4 * C, scale[li + 2], BT, C, 4 * C);
        for (int i = 0; i < BT * 4 * C; i++) h[i] = ref_gelu1(h[i]);
        ref_matmul(t, h, W_OF(li + 3), PD(c, fcprojb) + l * C, scale[li + 3], BT, 4 * C, C);
        for (int i = 0; i < BT * C; i++) x[i] += t[i];
        if (cf->norm == MODEL_NORM_POST) {
            ref_layernorm(ln, x, PD(c, ln2w) + l * C, PD(c, ln2b) + l * C, BT, C);
            memcpy(x, ln, sizeof(double) * BT * C);
        }
    }
    const double *xf = x;
    if (cf->norm != MODEL_NORM_NONE) {
        ref_layernorm(ln, x, PD(c, lnfw), PD(c, lnfb), BT, C);
        xf = ln;
    }
    ref_matmul(logits, xf, W_OF(m->num_linear - 1), NULL, scale[m->num_linear - 1], BT, C, V);
#undef W_OF
    double loss = ref_ce(logits, c->tg, BT, V);
    free(x);
    free(ln);
    free(qkv);
    free(y);
    free(h);
    free(t);
    free(logits);
    return loss;
}

static const char *const TENSOR_NAMES[MODEL_NUM_PARAMS] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                                                           "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                                                           "fcprojw",  "fcprojb",  "lnfw", "lnfb", "lmw",  "gamma"};

/* When >= 0, check_model sets this linear's gamma to 0 (W_hat = 0: its dW
 * is zero, its dgamma is not, and the <dX, X> / alpha route cannot be used). */
static int zero_gamma_linear = -1;

static void check_model(int reparam, int norm, int gamma_init, int threads) {
    model_config cfg = {.vocab = 11,
                        .max_seq = 6,
                        .layers = 2,
                        .heads = 2,
                        .dim = 8,
                        .norm = norm,
                        .reparam = reparam,
                        .gamma_init = gamma_init};
    int B = 3, T = 5;
    model *m = model_create(&cfg, B, T, threads);
    assert_non_null(m);
    uint64_t rng = 7;
    model_init(m, &rng);
    /* Larger, non-trivial parameters than GPT-2's init so every gradient is
     * well above float rounding: weights x10, random LN gains and biases. */
    for (size_t i = 0; i < m->num_params - m->param_sizes[MODEL_GAMMA]; i++)
        m->params_memory[i] = m->params_memory[i] * 10.0f + (float)(0.1 * rnd());
    for (int i = 0; i < m->num_linear; i++)
        if (reparam == MODEL_REPARAM_SIGMA) *m->lin[i].gamma = (float)(0.5 + fabs(rnd()));
    if (zero_gamma_linear >= 0) *m->lin[zero_gamma_linear].gamma = 0.0f;
    int in[15], tg[15];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)(model_random_u32(&rng) % 11);
        tg[i] = (int)(model_random_u32(&rng) % 11);
    }
    float loss = model_forward(m, in, tg, B, T, 1);
    model_zero_grad(m);
    model_backward(m);
    mdl_ctx c = {m, to_d(m->params_memory, m->num_params), B, T, in, tg};
    double ref = ref_model_loss(&c);
    printf("model reparam=%s norm=%s gamma-init=%s threads=%d: loss %.7f ref %.7f\n",
           reparam == 0   ? "none"
           : reparam == 1 ? "sigma"
                          : "spectral",
           norm == 0   ? "pre"
           : norm == 1 ? "post"
                       : "none",
           gamma_init ? "one" : "sigma", threads, loss, ref);
    assert_true(fabs(loss - ref) < 1e-4 * (1 + fabs(ref)));
    double *g = malloc(sizeof(double) * m->num_params);
    numgrad(g, c.P, m->num_params, ref_model_loss, &c);
    double worst = 0;
    size_t off = 0;
    for (int t = 0; t < MODEL_NUM_PARAMS; t++) {
        size_t n = m->param_sizes[t];
        int unused = (norm == MODEL_NORM_NONE && (t == MODEL_LN1W || t == MODEL_LN1B || t == MODEL_LN2W ||
                                                  t == MODEL_LN2B || t == MODEL_LNFW || t == MODEL_LNFB)) ||
                     (t == MODEL_GAMMA && reparam != MODEL_REPARAM_SIGMA);
        if (unused) {
            /* no gradient may appear where the model has no dependence */
            for (size_t i = 0; i < n; i++) assert_true(m->grads_memory[off + i] == 0.0f);
        } else {
            double r = relerr(TENSOR_NAMES[t], m->grads_memory + off, g + off, n);
            if (r > worst) worst = r;
        }
        off += n;
    }
    printf("  worst %.3e\n", worst);
    assert_true(worst < TOL);
    free(g);
    free(c.P);
    model_destroy(m);
}

static void test_model_reparam_none(void **s) {
    (void)s;
    for (int norm = 0; norm < 3; norm++) check_model(MODEL_REPARAM_NONE, norm, 0, 1);
}
static void test_model_reparam_sigma(void **s) {
    (void)s;
    for (int norm = 0; norm < 3; norm++) check_model(MODEL_REPARAM_SIGMA, norm, 0, 1);
    check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_PRE, MODEL_GAMMA_ONE, 1);
}
static void test_model_reparam_spectral(void **s) {
    (void)s;
    for (int norm = 0; norm < 3; norm++) check_model(MODEL_REPARAM_SPECTRAL, norm, 0, 1);
}
/* The data-parallel path (shards + gradient reduction) gives the same gradients. */
static void test_model_threads(void **s) {
    (void)s;
    check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_PRE, 0, 2);
    check_model(MODEL_REPARAM_NONE, MODEL_NORM_POST, 0, 3);
    kernel_set_att_block(2); /* blocked causal attention inside the whole model */
    check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_PRE, 0, 2);
    kernel_set_att_block(32);
}

/* <G, W> by activations only, then by weights only (gamma != 0). */
static void test_model_gw_routes(void **s) {
    (void)s;
    for (int r = 0; r < 2; r++) {
        model_set_gw_weights_below(r ? 0.0 : 1e30);
        check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_PRE, 0, 1);
        check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_POST, 0, 2);
        check_model(MODEL_REPARAM_SPECTRAL, MODEL_NORM_PRE, 0, 3);
    }
    model_set_gw_weights_below(1.5);
}

/* gamma = 0 on one linear (its FC), with one and two threads. */
static void test_model_zero_gamma(void **s) {
    (void)s;
    zero_gamma_linear = MODEL_LIN_FC;
    check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_PRE, 0, 1);
    check_model(MODEL_REPARAM_SIGMA, MODEL_NORM_PRE, 0, 2);
    zero_gamma_linear = -1;
}

/* With gamma-init sigma the model starts with W_hat == W: gamma / sigma is
 * 1 for every linear, and the QKV weight a probe reads is W. */
static void test_model_init_identity(void **s) {
    (void)s;
    model_config cfg = {.vocab = 16,
                        .max_seq = 8,
                        .layers = 2,
                        .heads = 2,
                        .dim = 16,
                        .norm = MODEL_NORM_PRE,
                        .reparam = MODEL_REPARAM_SIGMA,
                        .gamma_init = MODEL_GAMMA_SIGMA};
    model *m = model_create(&cfg, 2, 8, 1);
    uint64_t rng = 3;
    model_init(m, &rng);
    int in[16] = {0}, tg[16] = {0};
    model_forward(m, in, tg, 2, 8, 1);
    double worst = 0;
    for (int i = 0; i < m->num_linear; i++) {
        double d = fabs(sreparam_scale(&m->lin[i]) - 1.0);
        if (d > worst) worst = d;
    }
    for (int l = 0; l < cfg.layers; l++) {
        const float *weff = model_qkv_weight(m, l), *w = m->lin[model_linear_index(m, l, MODEL_LIN_QKV)].w;
        for (int k = 0; k < 3 * 16 * 16; k++) {
            double d = fabs(weff[k] - w[k]) / (fabs(w[k]) + 1e-3);
            if (d > worst) worst = d;
        }
    }
    printf("init W_hat vs W: max rel diff %.2e\n", worst);
    assert_true(worst < 1e-4);
    model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_exp),
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_model_reparam_none),
        cmocka_unit_test(test_model_reparam_sigma),
        cmocka_unit_test(test_model_reparam_spectral),
        cmocka_unit_test(test_model_threads),
        cmocka_unit_test(test_model_gw_routes),
        cmocka_unit_test(test_model_zero_gamma),
        cmocka_unit_test(test_model_init_identity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
