/* test_sreparam.c - power iteration converges to the top singular value
 * (LAPACK SVD in double) on random matrices; one step per call keeps its
 * vectors and matches the two matrix-vector products it fuses; the
 * reparametrized weight's backward matches finite differences of a double
 * reference (science.md §3). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"
#include "sreparam.h"

static uint64_t rng = 99;
static float work[1024]; /* power-step scratch, >= the widest `in` below */

static sreparam_linear make(int out, int in, float *gamma) {
    sreparam_linear l = {0};
    l.out = out;
    l.in = in;
    l.w = malloc(sizeof(float) * out * in);
    l.dw = calloc((size_t)out * in, sizeof(float));
    l.weff = malloc(sizeof(float) * out * in);
    l.u = malloc(sizeof(float) * in);
    l.v = calloc(out, sizeof(float));
    l.gamma = gamma;
    l.dgamma = calloc(1, sizeof(float));
    for (int i = 0; i < out * in; i++) l.w[i] = model_random_normal(&rng);
    double s = 0;
    for (int i = 0; i < in; i++) {
        l.u[i] = model_random_normal(&rng);
        s += l.u[i] * l.u[i];
    }
    for (int i = 0; i < in; i++) l.u[i] /= (float)sqrt(s);
    return l;
}

static void unmake(sreparam_linear *l) {
    free(l->w);
    free(l->dw);
    free(l->weff);
    free(l->u);
    free(l->v);
    free(l->dgamma);
}

static void test_power_converges(void **state) {
    (void)state;
    int shapes[][2] = {{48, 16}, {16, 48}, {64, 64}, {384, 128}, {128, 512}, {3, 1}};
    float gamma = 1.0f;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        sreparam_linear l = make(shapes[k][0], shapes[k][1], &gamma);
        double truth = sreparam_top_singular(l.w, l.out, l.in, NULL, NULL);
        assert_true(truth > 0);
        float prev = 0.0f;
        int steps = 0;
        for (; steps < 3000; steps++) {
            sreparam_power_step(&l, work);
            /* power iteration on W^T W: the estimate never decreases (up to rounding) */
            assert_true(l.sigma >= prev * (1.0f - 1e-5f));
            prev = l.sigma;
        }
        double rel = fabs(l.sigma - truth) / truth;
        /* the stored vectors give the same sigma without an update */
        double again = sreparam_sigma(&l);
        printf("%4dx%-4d sigma %.6f  LAPACK %.6f  rel err %.2e  (v^T W u %.6f)\n", l.out, l.in, l.sigma, truth, rel,
               again);
        assert_true(rel < 1e-4);
        assert_true(fabs(again - truth) / truth < 1e-4);
        unmake(&l);
    }
}

/* The one-step-per-training-step scheme: with W changing slowly, the kept
 * vectors track the top singular value. */
static void test_power_tracks_slow_change(void **state) {
    (void)state;
    float gamma = 1.0f;
    sreparam_linear l = make(96, 32, &gamma);
    for (int i = 0; i < 500; i++) sreparam_power_step(&l, work);
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < l.out * l.in; i++) l.w[i] += 0.001f * model_random_normal(&rng);
        sreparam_power_step(&l, work);
    }
    double truth = sreparam_top_singular(l.w, l.out, l.in, NULL, NULL);
    printf("tracking: sigma %.6f LAPACK %.6f\n", l.sigma, truth);
    assert_true(fabs(l.sigma - truth) / truth < 1e-3);
    unmake(&l);
}

/* One fused step against v = W u / ||W u||, u = W^T v / ||W^T v||,
 * sigma = ||W^T v||, in double. */
static void test_power_step_reference(void **state) {
    (void)state;
    float gamma = 1.0f;
    sreparam_linear l = make(37, 21, &gamma);
    double v[37], u[21], nv = 0, nu = 0;
    for (int o = 0; o < 37; o++) {
        v[o] = 0;
        for (int i = 0; i < 21; i++) v[o] += (double)l.w[o * 21 + i] * l.u[i];
        nv += v[o] * v[o];
    }
    for (int o = 0; o < 37; o++) v[o] /= sqrt(nv);
    for (int i = 0; i < 21; i++) {
        u[i] = 0;
        for (int o = 0; o < 37; o++) u[i] += (double)l.w[o * 21 + i] * v[o];
        nu += u[i] * u[i];
    }
    nu = sqrt(nu);
    sreparam_power_step(&l, work);
    assert_true(fabs(l.sigma - nu) < 1e-5 * nu);
    for (int o = 0; o < 37; o++) assert_true(fabs(l.v[o] - v[o]) < 1e-5);
    for (int i = 0; i < 21; i++) assert_true(fabs(l.u[i] - u[i] / nu) < 1e-5);
    /* a zero W: sigma 0, u kept */
    float u0 = l.u[0];
    memset(l.w, 0, sizeof(float) * 37 * 21);
    sreparam_power_step(&l, work);
    assert_true(l.sigma == 0.0f && l.u[0] == u0);
    unmake(&l);
}

static void test_top_singular_vectors(void **state) {
    (void)state;
    float gamma = 1.0f;
    sreparam_linear l = make(20, 12, &gamma);
    float *u = malloc(sizeof(float) * 12), *v = malloc(sizeof(float) * 20);
    double s = sreparam_top_singular(l.w, 20, 12, u, v);
    /* W u = s v */
    for (int o = 0; o < 20; o++) {
        double y = 0;
        for (int i = 0; i < 12; i++) y += l.w[o * 12 + i] * u[i];
        assert_true(fabs(y - s * v[o]) < 1e-4 * s);
    }
    free(u);
    free(v);
    unmake(&l);
}

/* L(W, gamma) = <R, gamma W / (v^T W u)> with u, v constant, in double. */
static double ref_loss(const double *W, double gamma, const float *u, const float *v, const float *R, int out, int in) {
    double s = 0, L = 0;
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) s += v[o] * W[o * in + i] * u[i];
    for (int k = 0; k < out * in; k++) L += R[k] * gamma * W[k] / s;
    return L;
}

static void test_backward_fd(void **state) {
    (void)state;
    for (int learn = 0; learn < 2; learn++) {
        float gamma = 1.7f, G[35];
        sreparam_linear l = make(7, 5, &gamma);
        sreparam_power_step(&l, work);
        sreparam_power_step(&l, work);
        sreparam_forward(&l);
        for (int k = 0; k < 35; k++) {
            assert_true(fabsf(l.weff[k] - gamma / l.sigma * l.w[k]) < 1e-6f);
            G[k] = model_random_normal(&rng); /* G = R */
        }
        sreparam_backward(&l, G, learn);
        double W[35], h = 1e-6, md = 0, mn = 0;
        for (int k = 0; k < 35; k++) W[k] = l.w[k];
        for (int k = 0; k < 35; k++) {
            double s = W[k];
            W[k] = s + h;
            double lp = ref_loss(W, gamma, l.u, l.v, G, 7, 5);
            W[k] = s - h;
            double lm = ref_loss(W, gamma, l.u, l.v, G, 7, 5);
            W[k] = s;
            double n = (lp - lm) / (2 * h);
            md = fmax(md, fabs(n - l.dw[k]));
            mn = fmax(mn, fabs(n));
        }
        double gp = ref_loss(W, gamma + h, l.u, l.v, G, 7, 5);
        double gm = ref_loss(W, gamma - h, l.u, l.v, G, 7, 5);
        double ng = (gp - gm) / (2 * h);
        printf("sreparam backward: dW rel err %.3e, dgamma %.6f vs numeric %.6f (learn_gamma %d)\n", md / mn, *l.dgamma,
               ng, learn);
        assert_true(md / mn < 1e-4);
        if (learn) assert_true(fabs(*l.dgamma - ng) < 1e-4 * (1 + fabs(ng)));
        else assert_true(*l.dgamma == 0.0f);
        unmake(&l);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_power_converges),      cmocka_unit_test(test_power_tracks_slow_change),
        cmocka_unit_test(test_power_step_reference), cmocka_unit_test(test_top_singular_vectors),
        cmocka_unit_test(test_backward_fd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
