/* test_probe.c - the collapse metrics of trainer/probe.c against independent
 * references: Theorem 3.1's known values, entropy >= entropy_bound on random
 * and briefly trained models (with and without q/k biases), uniform and
 * one-hot attention, sigma_qk and linear sigma vs LAPACK SVD, eig_mean/var vs
 * LAPACKE_dsyev, max_logit vs every logit recomputed from q and k (including
 * the underflow fallback), rank_ratio/cos_sim on constructed inputs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <lapacke.h>

#include "model.h"
#include "optim.h"
#include "probe.h"
#include "sreparam.h"

enum { TL = 2, TH = 4, TC = 32, TT = 24, TB = 3, TV = 32 };

static model *make_model_threads(int reparam, uint64_t seed, int threads)
{
    model_config cfg = {.vocab = TV, .max_seq = TT, .layers = TL, .heads = TH, .dim = TC,
                        .norm = MODEL_NORM_PRE, .reparam = reparam, .gamma_init = MODEL_GAMMA_SIGMA};
    model *m = model_create(&cfg, TB, TT, threads);
    assert_non_null(m);
    uint64_t rng = seed;
    model_init(m, &rng);
    return m;
}

static model *make_model(int reparam, uint64_t seed) { return make_model_threads(reparam, seed, 1); }

static void random_tokens(int *in, int *tg, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++) {
        in[i] = (int)(model_random_u32(rng) % TV);
        tg[i] = (int)(model_random_u32(rng) % TV);
    }
}

static void forward(model *m, uint64_t seed)
{
    static int in[TB * TT], tg[TB * TT];
    uint64_t rng = seed;
    random_tokens(in, tg, TB * TT, &rng);
    float loss = model_forward(m, in, tg, TB, TT, 0);
    assert_true(isfinite(loss));
}

/* Scales the QKV weights (the parameters: --reparam none) and sets the q/k
 * biases to bias_std * N(0,1). */
static void shape_qkv(model *m, float scale, float bias_std, uint64_t seed)
{
    uint64_t rng = seed;
    size_t n = (size_t)TL * 3 * TC * TC;
    for (size_t i = 0; i < n; i++) m->params.qkvw[i] *= scale;
    for (size_t i = 0; i < (size_t)TL * 3 * TC; i++)
        m->params.qkvb[i] = bias_std * model_random_normal(&rng);
}

static void test_bound_known_values(void **state)
{
    (void)state;
    assert_float_equal(probe_entropy_bound(8, 3.0), 0.957457, 1e-6);
    double s[] = {0, 1, 2, 5, 10}, want[] = {5.283, 5.278, 5.242, 3.672, 0.095};
    for (int i = 0; i < 5; i++) assert_float_equal(probe_entropy_bound(197, s[i]), want[i], 1e-3);
    assert_float_equal(probe_entropy_bound(197, 20), 0.0, 1e-4);
    assert_float_equal(probe_entropy_bound(1, 0.5), 0.0, 0.0);
    /* non-increasing in s */
    double prev = 1e9;
    for (double x = 0; x < 30; x += 0.25) {
        double b = probe_entropy_bound(50, x);
        assert_true(b <= prev + 1e-12);
        prev = b;
    }
}

/* entropy >= entropy_bound per head; returns the smallest entropy - bound
 * and how many heads have a bound of at least half their entropy (so the
 * check is not vacuous). */
static void check_bound(const probe_metrics *r, const char *what, int *tight)
{
    for (int k = 0; k < TL * TH; k++) {
        assert_true(isfinite(r->entropy[k]) && isfinite(r->entropy_bound[k]));
        if (r->entropy_bound[k] > r->entropy[k] + 1e-4f)
            fail_msg("%s head %d: entropy %.6f < bound %.6f", what, k, r->entropy[k], r->entropy_bound[k]);
        assert_true(r->entropy_bound[k] >= 0.0f);
        if (r->entropy_bound[k] > 0.5f * r->entropy[k]) (*tight)++;
    }
}

static void test_bound_random(void **state)
{
    (void)state;
    float scales[] = {0.3f, 1.0f, 3.0f, 10.0f, 30.0f};
    float biases[] = {0.0f, 0.05f, 0.5f};
    int tight = 0, cases = 0;
    for (int si = 0; si < 5; si++)
        for (int bi = 0; bi < 3; bi++) {
            model *m = make_model(MODEL_REPARAM_NONE, 7 + si * 3 + bi);
            shape_qkv(m, scales[si], biases[bi], 100 + si);
            forward(m, 11 + si);
            probe_config pc = {.examples = 0, .iters = 300};
            probe *p = probe_create(m, &pc);
            assert_non_null(p);
            const probe_metrics *r = probe_compute(p, m);
            char what[64];
            snprintf(what, sizeof what, "scale %g bias %g", scales[si], biases[bi]);
            check_bound(r, what, &tight);
            printf("%-22s entropy[0] %.4f bound[0] %.4f sigma_qk[0] %.4f max_logit[0] %.3f\n", what,
                   r->entropy[0], r->entropy_bound[0], r->sigma_qk[0], r->max_logit[0]);
            cases++;
            probe_destroy(p);
            model_destroy(m);
        }
    printf("heads with bound >= entropy/2: %d of %d\n", tight, cases * TL * TH);
    assert_true(tight >= TL * TH * 3); /* the small scales give near-tight bounds */
}

/* The trainer's settings (2 power steps per call): the first call, with cold
 * vectors, must already give a valid bound where it is tight, and so must
 * the following calls as the weights move. */
static void test_bound_default_iters(void **state)
{
    (void)state;
    int tight = 0;
    for (int seed = 0; seed < 4; seed++) {
        model *m = make_model(MODEL_REPARAM_NONE, 200 + seed);
        shape_qkv(m, 1.0f + seed, 0.02f, 300 + seed);
        forward(m, 400 + seed);
        probe *p = probe_create(m, NULL);
        check_bound(probe_compute(p, m), "first call, default iters", &tight);
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < TL * 3 * TC * TC; i++) m->params.qkvw[i] *= 1.01f;
            forward(m, 500 + k);
            check_bound(probe_compute(p, m), "later call, default iters", &tight);
        }
        probe_destroy(p);
        model_destroy(m);
    }
    assert_true(tight > 0);
}

static void test_bound_trained(void **state)
{
    (void)state;
    int reparams[] = {MODEL_REPARAM_SIGMA, MODEL_REPARAM_NONE};
    for (int ri = 0; ri < 2; ri++) {
        model *m = make_model(reparams[ri], 5);
        optim *o = optim_create(OPTIM_ADAMW, m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f);
        optim_group g = {.offset = 0, .n = m->num_params, .decay = 0, .frozen = 0};
        static int in[TB * TT], tg[TB * TT];
        uint64_t rng = 3;
        for (int step = 0; step < 40; step++) {
            /* a learnable pattern: next token = token + 1 */
            for (int i = 0; i < TB * TT; i++) {
                in[i] = (int)(model_random_u32(&rng) % TV);
                tg[i] = (in[i] + 1) % TV;
            }
            model_forward(m, in, tg, TB, TT, 1);
            model_zero_grad(m);
            model_backward(m);
            optim_clip(m->grads_memory, m->num_params, 1.0f);
            optim_step(o, m->params_memory, m->grads_memory, &g, 1, 1e-2f);
        }
        assert_true(fabsf(m->params.qkvb[0]) > 0.0f); /* biases were trained */
        forward(m, 77);
        probe_config pc = {.examples = 0, .iters = 500};
        probe *p = probe_create(m, &pc);
        const probe_metrics *r = probe_compute(p, m);
        int tight = 0;
        check_bound(r, reparams[ri] == MODEL_REPARAM_SIGMA ? "trained sigma" : "trained none", &tight);
        printf("trained reparam %d: entropy[0] %.4f bound[0] %.4f max_logit[0] %.3f\n", reparams[ri],
               r->entropy[0], r->entropy_bound[0], r->max_logit[0]);
        probe_destroy(p);
        optim_destroy(o);
        model_destroy(m);
    }
}

/* Overwrites every head's attention with uniform (kind 0) or one-hot on key
 * 0 (kind 1) rows. */
static void set_attention(model *m, int kind)
{
    for (int l = 0; l < TL; l++) {
        float *a = model_attention(m, l);
        for (int bh = 0; bh < TB * TH; bh++)
            for (int i = 0; i < TT; i++)
                for (int j = 0; j < TT; j++)
                    a[((size_t)bh * TT + i) * TT + j] =
                        j > i ? 0.0f : kind == 0 ? 1.0f / (i + 1) : (j == 0 ? 1.0f : 0.0f);
    }
}

static void test_uniform_and_onehot(void **state)
{
    (void)state;
    model *m = make_model(MODEL_REPARAM_NONE, 9);
    forward(m, 1);
    probe_config pc = {.examples = 0, .iters = 2};
    probe *p = probe_create(m, &pc);
    set_attention(m, 0);
    const probe_metrics *r = probe_compute(p, m);
    double want = 0.0;
    for (int i = 0; i < TT; i++) want += log(i + 1.0);
    want /= TT;
    for (int k = 0; k < TL * TH; k++) {
        assert_float_equal(r->entropy[k], want, 2e-5 * want);
        assert_float_equal(r->entropy_norm[k], 1.0, 2e-5);
    }
    set_attention(m, 1);
    r = probe_compute(p, m);
    for (int k = 0; k < TL * TH; k++) {
        assert_float_equal(r->entropy[k], 0.0, 1e-7);
        assert_float_equal(r->entropy_norm[k], 0.0, 1e-7);
        assert_true(r->entropy_bound[k] <= 1e-6f || r->entropy_bound[k] >= 0.0f);
    }
    /* the subset: only the first example counts */
    pc.examples = 1;
    probe *p1 = probe_create(m, &pc);
    set_attention(m, 0);
    float *a = model_attention(m, 0);
    for (int h = 0; h < TH; h++) /* example 1 of layer 0: one-hot */
        for (int i = 0; i < TT; i++)
            for (int j = 0; j <= i; j++) a[(((size_t)1 * TH + h) * TT + i) * TT + j] = j == i;
    r = probe_compute(p1, m);
    assert_int_equal(r->examples_used, 1);
    assert_float_equal(r->entropy[0], want, 2e-5 * want);
    probe_destroy(p1);
    probe_destroy(p);
    model_destroy(m);
}

static void test_sigma_qk_and_eig(void **state)
{
    (void)state;
    model *m = make_model(MODEL_REPARAM_NONE, 21);
    shape_qkv(m, 5.0f, 0.1f, 4);
    /* layer 1: make W_K^h = S W_Q^h with S symmetric so W_Q^h W_K^h^T is symmetric */
    int d = TC / TH;
    uint64_t rng = 8;
    float *W = m->params.qkvw + (size_t)3 * TC * TC;
    for (int h = 0; h < TH; h++) {
        float S[64 * 64];
        for (int a = 0; a < d; a++)
            for (int b = 0; b <= a; b++) S[a * d + b] = S[b * d + a] = model_random_normal(&rng) + (a == b) * 0.5f * h;
        float *Wq = W + (size_t)h * d * TC, *Wk = W + (size_t)TC * TC + (size_t)h * d * TC;
        for (int a = 0; a < d; a++)
            for (int c = 0; c < TC; c++) {
                double s = 0;
                for (int b = 0; b < d; b++) s += S[a * d + b] * Wq[b * TC + c];
                Wk[a * TC + c] = (float)s;
            }
    }
    forward(m, 2);
    probe_config pc = {.examples = 0, .iters = 1000};
    probe *p = probe_create(m, &pc);
    const probe_metrics *r = probe_compute(p, m);
    float *P = malloc(sizeof(float) * TC * TC);
    double *Pd = malloc(sizeof(double) * TC * TC), ev[TC];
    for (int l = 0; l < TL; l++)
        for (int h = 0; h < TH; h++) {
            const float *Wl = m->params.qkvw + (size_t)l * 3 * TC * TC;
            const float *Wq = Wl + (size_t)h * d * TC, *Wk = Wl + (size_t)TC * TC + (size_t)h * d * TC;
            /* P = Wq_h^T Wk_h (C x C) = W_Q^h W_K^h^T */
            for (int a = 0; a < TC; a++)
                for (int b = 0; b < TC; b++) {
                    double s = 0;
                    for (int k = 0; k < d; k++) s += (double)Wq[k * TC + a] * Wk[k * TC + b];
                    P[a * TC + b] = (float)s;
                    Pd[a * TC + b] = s / sqrt(d);
                }
            double truth = sreparam_top_singular(P, TC, TC, NULL, NULL) / sqrt(d);
            double got = r->sigma_qk[l * TH + h];
            printf("layer %d head %d: sigma_qk %.6f  LAPACK %.6f  rel %.2e\n", l, h, got, truth,
                   fabs(got - truth) / truth);
            assert_true(fabs(got - truth) <= 1e-3 * truth);
            /* trace identities hold for any head; dsyev where symmetric (layer 1) */
            double tr = 0, tr2 = 0;
            for (int a = 0; a < TC; a++) {
                tr += Pd[a * TC + a];
                for (int b = 0; b < TC; b++) tr2 += Pd[a * TC + b] * Pd[b * TC + a];
            }
            double mean = tr / TC, var = tr2 / TC - mean * mean;
            if (l == 1) {
                assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', TC, Pd, TC, ev), 0);
                double s1 = 0, s2 = 0;
                for (int a = 0; a < TC; a++) s1 += ev[a];
                mean = s1 / TC;
                for (int a = 0; a < TC; a++) s2 += (ev[a] - mean) * (ev[a] - mean);
                var = s2 / TC;
                printf("  eig mean %.6f (dsyev %.6f) var %.6f (dsyev %.6f)\n", r->eig_mean[l * TH + h],
                       mean, r->eig_var[l * TH + h], var);
            }
            /* tolerances relative to the eigenvalues' scale, sqrt(|tr(P P)| / C) */
            double scale2 = fabs(tr2) / TC;
            assert_float_equal(r->eig_mean[l * TH + h], mean, 1e-4 * sqrt(scale2));
            assert_float_equal(r->eig_var[l * TH + h], var, 1e-4 * scale2);
        }
    free(P);
    free(Pd);
    probe_destroy(p);
    model_destroy(m);
}

static void test_max_logit(void **state)
{
    (void)state;
    float scales[] = {1.0f, 60.0f}; /* the second underflows probabilities: the exact fallback */
    for (int si = 0; si < 2; si++) {
        model *m = make_model(MODEL_REPARAM_NONE, 31 + si);
        shape_qkv(m, scales[si], 0.2f, 5);
        forward(m, 3);
        probe_config pc = {.examples = 2, .iters = 2};
        probe *p = probe_create(m, &pc);
        const probe_metrics *r = probe_compute(p, m);
        int d = TC / TH, under = 0;
        for (int l = 0; l < TL; l++) {
            const float *qkv = model_qkv(m, l), *att = model_attention(m, l);
            for (int h = 0; h < TH; h++) {
                double best = 0;
                for (int b = 0; b < 2; b++)
                    for (int i = 0; i < TT; i++)
                        for (int j = 0; j <= i; j++) {
                            double s = 0;
                            for (int k = 0; k < d; k++)
                                s += (double)qkv[((size_t)b * TT + i) * 3 * TC + h * d + k] *
                                     qkv[((size_t)b * TT + j) * 3 * TC + TC + h * d + k];
                            s = fabs(s / sqrt(d));
                            if (s > best) best = s;
                            under += att[(((size_t)b * TH + h) * TT + i) * TT + j] < 1.2e-38f;
                        }
                double got = r->max_logit[l * TH + h];
                if (!(fabs(got - best) <= 1e-4 * best + 1e-5))
                    fail_msg("layer %d head %d: max_logit %.6f, recomputed %.6f", l, h, got, best);
                assert_true(fabs(got - best) <= 1e-4 * best + 1e-5);
            }
        }
        printf("scale %g: max_logit[0] %.4f, probabilities below FLT_MIN: %d\n", scales[si],
               r->max_logit[0], under);
        if (si == 1) assert_true(under > 0);
        probe_destroy(p);
        model_destroy(m);
    }
}

static void test_rank_and_cos(void **state)
{
    (void)state;
    model *m = make_model(MODEL_REPARAM_NONE, 41);
    forward(m, 4);
    probe *p = probe_create(m, &(probe_config){.examples = 0, .iters = 2});
    /* --norm pre: the attention input is the LN1 buffer; overwrite it */
    float *x0 = model_attn_input(m, 0), *x1 = model_attn_input(m, 1);
    uint64_t rng = 6;
    float row[TC];
    for (int c = 0; c < TC; c++) row[c] = model_random_normal(&rng);
    for (int b = 0; b < TB; b++)
        for (int i = 0; i < TT; i++) {
            memcpy(x0 + ((size_t)b * TT + i) * TC, row, sizeof row);        /* identical rows */
            for (int c = 0; c < TC; c++)                                     /* orthogonal rows */
                x1[((size_t)b * TT + i) * TC + c] = c == i ? 2.0f + i : 0.0f;
        }
    const probe_metrics *r = probe_compute(p, m);
    assert_float_equal(r->rank_ratio[0], 0.0, 1e-3);
    assert_float_equal(r->cos_sim[0], 1.0, 1e-5);
    assert_float_equal(r->cos_sim[1], 0.0, 1e-5);
    /* rows c_i e_i: ||X - 1 mean||^2 = sum c_i^2 (1 - 1/T) */
    assert_float_equal(r->rank_ratio[1], sqrt(1.0 - 1.0 / TT), 1e-5);
    probe_destroy(p);
    model_destroy(m);
}

static void test_linear_sigma(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        model *m = make_model(mode ? MODEL_REPARAM_SIGMA : MODEL_REPARAM_NONE, 51);
        forward(m, 5);
        probe *p = probe_create(m, NULL);
        const probe_metrics *r = NULL;
        for (int k = 0; k < (mode ? 1 : 400); k++) r = probe_compute(p, m);
        for (int l = 0; l < TL; l++)
            for (int w = 0; w < MODEL_LIN_PER_LAYER; w++) {
                const sreparam_linear *lin = model_linear(m, model_linear_index(m, l, w));
                double truth = sreparam_top_singular(lin->w, lin->out, lin->in, NULL, NULL);
                assert_true(fabs(r->lin_sigma[w][l] - truth) <= 1e-3 * truth);
                assert_float_equal(r->lin_gamma[w][l], mode ? *lin->gamma : 1.0f, 0.0);
            }
        const sreparam_linear *lm = model_linear(m, model_linear_index(m, TL, 0));
        double truth = sreparam_top_singular(lm->w, lm->out, lm->in, NULL, NULL);
        assert_true(fabs(r->lm_sigma - truth) <= 1e-3 * truth);
        probe_destroy(p);
        model_destroy(m);
    }
}

/* The probe borrows the model's worker threads: same metrics as on one thread. */
static void test_threads_agree(void **state)
{
    (void)state;
    model *m1 = make_model_threads(MODEL_REPARAM_NONE, 61, 1), *m2 = make_model_threads(MODEL_REPARAM_NONE, 61, 2);
    shape_qkv(m1, 5.0f, 0.1f, 9);
    shape_qkv(m2, 5.0f, 0.1f, 9);
    forward(m1, 8);
    forward(m2, 8);
    probe_config pc = {.examples = 0, .iters = 3};
    probe *p1 = probe_create(m1, &pc), *p2 = probe_create(m2, &pc);
    const probe_metrics *a = probe_compute(p1, m1), *b = probe_compute(p2, m2);
    const float *va[] = {a->entropy, a->entropy_norm, a->max_logit, a->sigma_qk, a->entropy_bound, a->eig_mean, a->eig_var};
    const float *vb[] = {b->entropy, b->entropy_norm, b->max_logit, b->sigma_qk, b->entropy_bound, b->eig_mean, b->eig_var};
    for (int k = 0; k < 7; k++)
        for (int i = 0; i < TL * TH; i++) assert_float_equal(va[k][i], vb[k][i], 1e-4 * (fabs(va[k][i]) + 1e-3));
    for (int l = 0; l < TL; l++) {
        assert_float_equal(a->rank_ratio[l], b->rank_ratio[l], 1e-5);
        assert_float_equal(a->cos_sim[l], b->cos_sim[l], 1e-5);
    }
    probe_destroy(p1);
    probe_destroy(p2);
    model_destroy(m1);
    model_destroy(m2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_known_values),
        cmocka_unit_test(test_uniform_and_onehot),
        cmocka_unit_test(test_bound_random),
        cmocka_unit_test(test_bound_default_iters),
        cmocka_unit_test(test_bound_trained),
        cmocka_unit_test(test_sigma_qk_and_eig),
        cmocka_unit_test(test_max_logit),
        cmocka_unit_test(test_rank_and_cos),
        cmocka_unit_test(test_linear_sigma),
        cmocka_unit_test(test_threads_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
