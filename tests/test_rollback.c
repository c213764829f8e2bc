/* test_rollback.c - in-memory run snapshots (trainer/rollback.h): a restore
 * brings back parameters, optimizer moments and t, sigma estimates,
 * power-iteration vectors and the step bit for bit; it picks the newest
 * snapshot from before the given step, drops the newer ones, keeps only the
 * newest `keep`, and answers -1 when none is old enough. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rollback.h"

typedef struct {
    model *m;
    optim *o;
    ckpt_meta r;
} run;

static void setup_run(run *x) {
    model_config cfg = {.vocab = 16,
                        .max_seq = 8,
                        .layers = 1,
                        .heads = 2,
                        .dim = 8,
                        .norm = MODEL_NORM_PRE,
                        .reparam = MODEL_REPARAM_SIGMA,
                        .gamma_init = MODEL_GAMMA_SIGMA};
    x->m = model_create(&cfg, 2, 8, 1);
    assert_non_null(x->m);
    x->o = optim_create(OPTIM_ADAM, x->m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f);
    assert_non_null(x->o);
    memset(&x->r, 0, sizeof x->r);
    x->r.rng = 7;
    model_init(x->m, &x->r.rng);
}

/* Changes every part of the state, as `step` training steps would. */
static void advance(run *x, long step) {
    for (size_t i = 0; i < x->m->num_params; i++) x->m->params_memory[i] += 0.001f * (float)step;
    for (size_t i = 0; i < x->o->state_n; i++) x->o->state[i] = (float)step + (float)i * 1e-3f;
    for (int i = 0; i < x->m->num_linear; i++) x->m->lin[i].sigma = (float)step;
    for (size_t i = 0; i < x->m->pi_size; i++) x->m->pi_memory[i] = (float)step * 0.5f;
    x->o->t = step;
    x->r.step = step;
    x->r.optim_t = step;
    x->r.rng = 1000 + (uint64_t)step;
    x->r.data_pos = 64 * (uint64_t)step;
}

static float *copy_params(const run *x) {
    float *p = malloc(x->m->num_params * sizeof(float));
    assert_non_null(p);
    memcpy(p, x->m->params_memory, x->m->num_params * sizeof(float));
    return p;
}

static void test_restore_newest_before(void **s) {
    (void)s;
    run x;
    setup_run(&x);
    rollback *rb = rollback_create(4);
    assert_non_null(rb);
    advance(&x, 10);
    float *p10 = copy_params(&x);
    assert_int_equal(rollback_take(rb, &x.r, x.m, x.o), 0);
    advance(&x, 20);
    assert_int_equal(rollback_take(rb, &x.r, x.m, x.o), 0);
    advance(&x, 27);
    x.r.lr = 0.5f;
    assert_int_equal(rollback_restore(rb, 10, &x.r, x.m, x.o), -1); /* none before step 10 */
    assert_int_equal(x.r.step, 27);
    assert_int_equal(rollback_restore(rb, 15, &x.r, x.m, x.o), 10);
    assert_memory_equal(x.m->params_memory, p10, x.m->num_params * sizeof(float));
    assert_true(x.o->state[0] == 10.0f && x.o->state[x.o->state_n - 1] == 10.0f + (float)(x.o->state_n - 1) * 1e-3f);
    assert_true(x.m->lin[0].sigma == 10.0f && x.m->pi_memory[x.m->pi_size - 1] == 5.0f);
    assert_int_equal(x.o->t, 10);
    assert_int_equal(x.r.step, 10);
    assert_int_equal(x.r.optim_t, 10);
    assert_int_equal(x.r.rng, 1010);
    assert_int_equal(x.r.data_pos, 640);
    assert_true(x.r.lr == 0.5f); /* the run's definition is left alone */
    /* the snapshot at 20 belonged to the abandoned steps */
    advance(&x, 13);
    assert_int_equal(rollback_restore(rb, 100, &x.r, x.m, x.o), 10);
    rollback_destroy(rb);
    free(p10);
    optim_destroy(x.o);
    model_destroy(x.m);
}

static void test_keeps_the_newest(void **s) {
    (void)s;
    run x;
    setup_run(&x);
    rollback *rb = rollback_create(2);
    assert_non_null(rb);
    for (long step = 0; step <= 30; step += 10) {
        advance(&x, step);
        assert_int_equal(rollback_take(rb, &x.r, x.m, x.o), 0);
    }
    assert_int_equal(rollback_restore(rb, 20, &x.r, x.m, x.o), -1); /* 0 and 10 evicted */
    assert_int_equal(rollback_restore(rb, 25, &x.r, x.m, x.o), 20);
    assert_true(x.m->lin[0].sigma == 20.0f);
    rollback_destroy(rb);
    rollback_destroy(NULL);
    optim_destroy(x.o);
    model_destroy(x.m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restore_newest_before),
        cmocka_unit_test(test_keeps_the_newest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
