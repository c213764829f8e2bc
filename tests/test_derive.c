/* test_derive.c: entropy_norm derived from entropy at ingest
 * (daemon/derive.c). The divisor against a direct sum of the rows' log of
 * attended positions, causal and not; one-hot and uniform attention give
 * exactly 0 and 1; a head whose rows all have the same normalised entropy
 * gets exactly the probe's entropy_norm (the mean over rows i >= 1 of
 * Ent(A_i) / log T_i); NaN stays NaN; a step that sent entropy_norm itself,
 * or no entropy, is left as it was. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "derive.h"
#include "proto.h"

static char err[256];

static void parse(const char *line, struct proto_msg *m) {
    memset(m, 0, sizeof *m);
    assert_int_equal(proto_parse(line, strlen(line), m, err, sizeof err), PROTO_OK);
}

static const struct proto_metric *find(const struct proto_msg *m, const char *name) {
    for (uint32_t i = 0; i < m->nmetrics; i++)
        if (!strcmp(m->metrics[i].name, name)) return &m->metrics[i];
    return NULL;
}

static void test_divisor(void **state) {
    (void)state;
    for (int T = 2; T <= 4096; T *= 2) {
        double causal = 0;
        for (int i = 0; i < T; i++) causal += log(i + 1.0);
        causal /= T;
        assert_true(fabs(derive_entropy_max(T, 0) - causal) < 1e-9 * causal);
        assert_true(fabs(derive_entropy_max(T, 1) - log(T)) < 1e-12);
    }
    assert_true(derive_entropy_max(1, 0) == 0 && derive_entropy_max(1, 1) == 0);
}

/* Rows with the same normalised entropy r: row i of a causal head spreads
 * over i + 1 positions with entropy r log(i + 1), so the mean entropy is
 * r * derive_entropy_max and the derived value is r, the probe's own. */
static void test_equal_rows_give_the_probes_value(void **state) {
    (void)state;
    const int T = 128;
    const double r[4] = {0, 0.25, 0.5, 1};
    char line[1024];
    for (int noncausal = 0; noncausal <= 1; noncausal++) {
        float e[4];
        for (int h = 0; h < 4; h++) {
            double sum = 0;
            for (int i = 0; i < T; i++) sum += r[h] * log(noncausal ? T : i + 1.0);
            e[h] = (float)(sum / T);
        }
        snprintf(line, sizeof line,
                 "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"loss\":1},"
                 "\"heads\":{\"entropy\":[[%.9g,%.9g],[%.9g,null]],\"max_logit\":[[1,2],[3,4]]}}",
                 e[0], e[1], e[2]);
        struct proto_msg m;
        parse(line, &m);
        assert_int_equal(derive_step(&m, T, noncausal), 1);
        const struct proto_metric *en = find(&m, "entropy_norm");
        assert_non_null(en);
        assert_int_equal(en->kind, PROTO_HEAD);
        assert_int_equal(en->rows, 2);
        assert_int_equal(en->cols, 2);
        const float *v = m.values + en->offset;
        for (int h = 0; h < 3; h++) assert_true(fabs(v[h] - r[h]) < 1e-6);
        assert_true(isnan(v[3])); /* null in, NaN out */
        /* what was sent is untouched */
        const struct proto_metric *ml = find(&m, "max_logit");
        assert_true(m.values[ml->offset + 3] == 4.0f);
        assert_true(m.values[find(&m, "entropy")->offset] == e[0]);
        /* a second pass finds entropy_norm and adds nothing */
        uint32_t n = m.nmetrics;
        assert_int_equal(derive_step(&m, T, noncausal), 0);
        assert_int_equal(m.nmetrics, n);
        proto_msg_free(&m);
    }
}

static void test_nothing_to_derive(void **state) {
    (void)state;
    struct proto_msg m;
    /* the probe's own entropy_norm is kept */
    parse("{\"type\":\"step\",\"seq\":1,\"step\":0,\"heads\":{\"entropy\":[[0]],\"entropy_norm\":[[0.5]]}}", &m);
    assert_int_equal(derive_step(&m, 16, 0), 0);
    assert_true(m.values[find(&m, "entropy_norm")->offset] == 0.5f);
    proto_msg_free(&m);
    /* no entropy; entropy as a scalar is not a head's */
    parse("{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"entropy\":1}}", &m);
    assert_int_equal(derive_step(&m, 16, 0), 0);
    assert_int_equal(m.nmetrics, 1);
    proto_msg_free(&m);
    /* not a step */
    parse("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"x\"}", &m);
    assert_int_equal(derive_step(&m, 16, 0), 0);
    proto_msg_free(&m);
    /* seq_len 1: no row can spread, the derived value is NaN */
    parse("{\"type\":\"step\",\"seq\":1,\"step\":0,\"heads\":{\"entropy\":[[0]]}}", &m);
    assert_int_equal(derive_step(&m, 1, 0), 1);
    assert_true(isnan(m.values[find(&m, "entropy_norm")->offset]));
    proto_msg_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divisor),
        cmocka_unit_test(test_equal_rows_give_the_probes_value),
        cmocka_unit_test(test_nothing_to_derive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
