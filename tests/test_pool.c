/* test_pool.c - every thread index runs each task exactly once, tasks see
 * the caller's writes made before pool_run and the caller sees theirs after
 * it, a one-thread pool runs on the caller, and pool_split covers a range
 * without gaps or overlaps. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pool.h"

typedef struct {
    int runs[8]; /* per thread index: times run in this task */
    int nthreads_seen[8];
    pthread_t who[8];
    long input, out[8];
} task_state;

static void count_task(void *ctx, int t, int n) {
    task_state *s = ctx;
    s->runs[t]++;
    s->nthreads_seen[t] = n;
    s->who[t] = pthread_self();
    s->out[t] = s->input * (t + 1);
}

static void test_each_thread_once(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        pool *p = pool_create(n);
        assert_non_null(p);
        for (int round = 0; round < 200; round++) { /* back-to-back tasks: the spin path */
            task_state s;
            memset(&s, 0, sizeof s);
            s.input = round + 1;
            pool_run(p, count_task, &s);
            for (int t = 0; t < n; t++) {
                assert_int_equal(s.runs[t], 1);
                assert_int_equal(s.nthreads_seen[t], n);
                assert_int_equal(s.out[t], (long)(round + 1) * (t + 1));
            }
            for (int t = n; t < 8; t++) assert_int_equal(s.runs[t], 0);
            assert_true(pthread_equal(s.who[0], pthread_self()));
            for (int t = 1; t < n; t++) assert_false(pthread_equal(s.who[t], pthread_self()));
        }
        pool_destroy(p);
    }
    pool_destroy(NULL);
}

static void test_zero_threads_is_one(void **state) {
    (void)state;
    pool *p = pool_create(0);
    assert_non_null(p);
    task_state s;
    memset(&s, 0, sizeof s);
    pool_run(p, count_task, &s);
    assert_int_equal(s.runs[0], 1);
    assert_int_equal(s.nthreads_seen[0], 1);
    pool_destroy(p);
}

static void test_split(void **state) {
    (void)state;
    size_t sizes[] = {0, 1, 7, 1000, 1001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int n = 1; n <= 5; n++) {
            size_t prev = 0;
            for (int t = 0; t < n; t++) {
                size_t lo, hi;
                pool_split(t, n, sizes[k], &lo, &hi);
                assert_true(lo == prev && hi >= lo);
                assert_true(hi - lo <= sizes[k] / n + 1);
                prev = hi;
            }
            assert_true(prev == sizes[k]);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_thread_once),
        cmocka_unit_test(test_zero_threads_is_one),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
