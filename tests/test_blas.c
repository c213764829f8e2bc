/* test_blas.c - the sgemm ceilings return positive figures for valid thread
 * counts and 0 otherwise, and leave OpenBLAS single-threaded (the model's
 * shards rely on it).  Timing figures themselves belong to bench/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cblas.h>
#include <cmocka.h>

#include "blas.h"

static void test_concurrent(void **state) {
    (void)state;
    for (int threads = 1; threads <= 2; threads++) {
        double cpu = -1.0, g = blas_sgemm_concurrent(threads, &cpu);
        assert_true(g > 0.0);
        assert_true(cpu > 0.0);
        assert_int_equal(openblas_get_num_threads(), 1);
    }
    double cpu = -1.0;
    assert_true(blas_sgemm_concurrent(0, &cpu) == 0.0);
    assert_true(cpu == 0.0);
    assert_true(blas_sgemm_concurrent(257, &cpu) == 0.0);
}

static void test_peak(void **state) {
    (void)state;
    double multi = -1.0, conc = -1.0, g = blas_sgemm_peak(2, &multi, &conc);
    assert_true(multi > 0.0 && conc > 0.0);
    assert_true(g == (multi > conc ? multi : conc));
    assert_int_equal(openblas_get_num_threads(), 1);
    assert_true(blas_sgemm_peak(0, &multi, &conc) == 0.0);
    assert_true(multi == 0.0 && conc == 0.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
