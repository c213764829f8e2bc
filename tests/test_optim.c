/* test_optim.c - the optimizers against hand-computed updates, split-range
 * updates equal whole updates bit for bit, frozen and decay groups, the
 * learning-rate schedule and clipping. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "optim.h"

static void test_adamw_by_hand(void **s) {
    (void)s;
    optim *o = optim_create(OPTIM_ADAMW, 2, 0.9f, 0.95f, 1e-8f, 0.1f);
    assert_non_null(o);
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f};
    optim_group grp = {0, 2, 1, 0};
    for (int step = 1; step <= 2; step++) {
        float ref[2];
        for (int i = 0; i < 2; i++) {
            /* m, v after `step` identical gradients */
            double m = (1 - pow(0.9, step)) * g[i], v = (1 - pow(0.95, step)) * g[i] * g[i];
            double mh = m / (1 - pow(0.9, step)), vh = v / (1 - pow(0.95, step));
            ref[i] = (float)(p[i] - 0.01 * (mh / (sqrt(vh) + 1e-8) + 0.1 * p[i]));
        }
        optim_step(o, p, g, &grp, 1, 0.01f);
        printf("adamw step %d: %.7f %.7f (ref %.7f %.7f)\n", step, p[0], p[1], ref[0], ref[1]);
        for (int i = 0; i < 2; i++) assert_true(fabsf(p[i] - ref[i]) < 1e-6f);
    }
    optim_destroy(o);
}

static void test_sgd_momentum_adam(void **s) {
    (void)s;
    optim_group grp = {0, 1, 1, 0};
    float p = 1.0f, g = 2.0f;
    optim *o = optim_create(OPTIM_SGD, 1, 0.9f, 0.95f, 1e-8f, 0.5f);
    optim_step(o, &p, &g, &grp, 1, 0.1f); /* L2: g + wd p = 2.5 */
    assert_true(fabsf(p - 0.75f) < 1e-6f);
    optim_destroy(o);
    p = 1.0f;
    o = optim_create(OPTIM_MOMENTUM, 1, 0.9f, 0.95f, 1e-8f, 0.0f);
    optim_step(o, &p, &g, &grp, 1, 0.1f); /* m = 2 */
    optim_step(o, &p, &g, &grp, 1, 0.1f); /* m = 3.8 */
    assert_true(fabsf(p - (1.0f - 0.2f - 0.38f)) < 1e-6f);
    assert_int_equal(o->state_n, 1);
    optim_destroy(o);
    p = 1.0f;
    o = optim_create(OPTIM_ADAM, 1, 0.9f, 0.95f, 1e-8f, 0.0f);
    optim_step(o, &p, &g, &grp, 1, 0.1f); /* first Adam step moves by lr * sign */
    assert_true(fabsf(p - 0.9f) < 1e-6f);
    assert_int_equal(o->state_n, 2);
    optim_destroy(o);
    assert_null(optim_create(7, 1, 0.9f, 0.95f, 1e-8f, 0.0f));
}

static void test_split_equals_whole_and_groups(void **s) {
    (void)s;
    enum { N = 1000 };
    static float p1[N], p2[N], g[N];
    for (int i = 0; i < N; i++) {
        p1[i] = p2[i] = sinf(i);
        g[i] = cosf(i * 0.7f);
    }
    optim_group grp[3] = {{0, 300, 1, 0}, {300, 200, 0, 1}, {500, 500, 0, 0}};
    optim *a = optim_create(OPTIM_ADAMW, N, 0.9f, 0.95f, 1e-8f, 0.1f);
    optim *b = optim_create(OPTIM_ADAMW, N, 0.9f, 0.95f, 1e-8f, 0.1f);
    for (int step = 0; step < 3; step++) {
        optim_begin_step(a);
        optim_update(a, p1, g, 0.5f, grp, 3, 1e-2f, 0, N);
        optim_begin_step(b);
        size_t cut[] = {0, 123, 301, 777, N};
        for (int k = 0; k < 4; k++) optim_update(b, p2, g, 0.5f, grp, 3, 1e-2f, cut[k], cut[k + 1]);
    }
    assert_memory_equal(p1, p2, sizeof p1);
    for (int i = 300; i < 500; i++) assert_true(p1[i] == sinf(i)); /* frozen */
    optim_destroy(a);
    optim_destroy(b);
}

static void test_schedule_and_clip(void **s) {
    (void)s;
    assert_true(fabsf(optim_lr(1.0f, 0, 4, 100, OPTIM_SCHEDULE_COSINE) - 0.25f) < 1e-6f);
    assert_true(fabsf(optim_lr(1.0f, 3, 4, 100, OPTIM_SCHEDULE_COSINE) - 1.0f) < 1e-6f);
    assert_true(fabsf(optim_lr(1.0f, 4, 4, 100, OPTIM_SCHEDULE_COSINE) - 1.0f) < 1e-6f);
    assert_true(fabsf(optim_lr(1.0f, 99, 4, 100, OPTIM_SCHEDULE_COSINE) - 0.1f) < 1e-6f);
    float mid = optim_lr(1.0f, 50, 0, 101, OPTIM_SCHEDULE_COSINE);
    assert_true(fabsf(mid - 0.55f) < 1e-5f);
    assert_true(optim_lr(1.0f, 70, 0, 100, OPTIM_SCHEDULE_CONSTANT) == 1.0f);
    assert_true(optim_lr(2.0f, 0, 0, 100, OPTIM_SCHEDULE_CONSTANT) == 2.0f); /* warmup 0 */
    float g[4] = {3, 4, 0, 0}, norm;
    assert_true(fabsf(optim_clip_scale(optim_sumsq(g, 0, 4), 1.0f, &norm) - 0.2f) < 1e-7f);
    assert_true(fabsf(norm - 5.0f) < 1e-6f);
    assert_true(optim_clip_scale(25.0, 0.0f, &norm) == 1.0f);
    assert_true(optim_clip_scale(NAN, 1.0f, &norm) == 1.0f && isnan(norm));
    assert_true(fabsf(optim_clip(g, 4, 1.0f) - 5.0f) < 1e-6f);
    assert_true(fabsf(g[0] - 0.6f) < 1e-6f && fabsf(g[1] - 0.8f) < 1e-6f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_by_hand),
        cmocka_unit_test(test_sgd_momentum_adam),
        cmocka_unit_test(test_split_equals_whole_and_groups),
        cmocka_unit_test(test_schedule_and_clip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
