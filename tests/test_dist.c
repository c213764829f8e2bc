/* test_dist.c - the single-process build of dist.h (what build/sigmatrain
 * links): a job of size 1 whose collectives leave the buffers alone; row
 * shards that cover a batch exactly for any rank count; the identity hash.
 * The MPI build is tested end to end by tests/e2e_mpi.py (mpirun -np 2).
 * dist.c is included so that shards can be checked for ranks of a larger
 * job (struct dist is private). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../trainer/dist.c"

static void test_single_process_job(void **s) {
    (void)s;
    char err[128] = "";
    int argc = 1;
    char *args[] = {"x", NULL}, **argv = args;
    dist *d = dist_create(&argc, &argv, 0, err, sizeof err);
    assert_non_null(d);
    assert_int_equal(dist_compiled_with_mpi(), 0);
    assert_int_equal(dist_rank(d), 0);
    assert_int_equal(dist_size(d), 1);
    float g[3] = {1.0f, -2.0f, 3.5f};
    assert_int_equal(dist_allreduce_grads(d, g, 3, 1.0f, err, sizeof err), 0);
    assert_true(g[0] == 1.0f && g[1] == -2.0f && g[2] == 3.5f); /* untouched, bit for bit */
    double v = 0.25;
    assert_int_equal(dist_sum(d, &v, 1, 1.0, err, sizeof err), 0);
    assert_true(v == 0.25);
    const void *bufs[1] = {g};
    size_t bytes[1] = {sizeof g};
    assert_int_equal(dist_check_same(d, bufs, bytes, 1, err, sizeof err), 0);
    int n = -1;
    const char *const *names = (const char *const *)1;
    const float *vals = (const float *)1;
    assert_int_equal(dist_rank_stats(d, 100, 0.1, 0.01, &n, &names, &vals, err, sizeof err), 0);
    assert_int_equal(n, 0); /* no per-rank scalars for a job of one */
    assert_null(names);
    assert_null(vals);
    int b0, nb;
    dist_shard(d, 7, &b0, &nb);
    assert_int_equal(b0, 0);
    assert_int_equal(nb, 7);
    assert_int_equal(dist_comm_calls(d), 0);
    dist_destroy(d, 0);
    dist_destroy(NULL, 1);
}

static void test_shards_cover_the_batch(void **s) {
    (void)s;
    for (int size = 1; size <= 9; size++)
        for (int B = size; B <= 40; B++) {
            int next = 0, lo = B, hi = 0;
            for (int r = 0; r < size; r++) {
                struct dist d;
                memset(&d, 0, sizeof d);
                d.rank = r;
                d.size = size;
                int b0, nb;
                dist_shard(&d, B, &b0, &nb);
                assert_int_equal(b0, next); /* contiguous, in rank order */
                assert_true(nb >= 1);
                next = b0 + nb;
                if (nb < lo) lo = nb;
                if (nb > hi) hi = nb;
            }
            assert_int_equal(next, B); /* every row once */
            assert_true(hi - lo <= 1); /* even */
        }
}

static void test_hash(void **s) {
    (void)s;
    float a[1000];
    for (int i = 0; i < 1000; i++) a[i] = (float)i * 0.37f - 100.0f;
    uint64_t h0 = dist_hash(a, sizeof a, 1);
    assert_true(h0 == dist_hash(a, sizeof a, 1));
    /* one bit anywhere, including the unaligned tail, changes it */
    unsigned char *p = (unsigned char *)a;
    for (size_t k = 0; k < sizeof a; k += 397) {
        p[k] ^= 1;
        assert_true(dist_hash(a, sizeof a, 1) != h0);
        p[k] ^= 1;
    }
    assert_true(dist_hash(a, 13, 1) != dist_hash(a, 12, 1));
    a[0] = 0.0f;
    uint64_t hz = dist_hash(a, sizeof a, 1);
    a[0] = -0.0f; /* a different bit pattern is a difference: ranks must agree bit for bit */
    assert_true(dist_hash(a, sizeof a, 1) != hz);
    /* chaining buffers is what dist_check_same does */
    assert_true(dist_hash(a + 500, 2000, dist_hash(a, 2000, 7)) == dist_hash(a + 500, 2000, dist_hash(a, 2000, 7)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_process_job),
        cmocka_unit_test(test_shards_cover_the_batch),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
