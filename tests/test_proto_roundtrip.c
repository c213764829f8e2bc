/* test_proto_roundtrip.c: every message of protocol v1, written by the
 * writers of proto/proto_write.c and read back by the parser of the other
 * side (proto_parse for trainer -> daemon, proto_parse_reply for daemon ->
 * trainer), field by field; float formatting round-trips every float32
 * (random bit patterns, extremes, subnormals) and spells non-finite values
 * "null"; escaping survives quotes, control characters, UTF-8 and invalid
 * bytes. The daemon and the client link these same objects. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static char line[1 << 20];
static char err[256];

/* prefix + body -> proto_parse */
static int parse_seq_line(uint64_t seq, const char *body, size_t blen, struct proto_msg *m) {
    size_t n = proto_write_seq_prefix(line, seq);
    memcpy(line + n, body, blen);
    n += blen;
    assert_int_equal(line[n - 1], '\n');
    memset(m, 0, sizeof *m);
    return proto_parse(line, n - 1, m, err, sizeof err);
}

static void test_hello(void **state) {
    (void)state;
    const char *token = "s3cr\"et\\\n";
    size_t pub = 0;
    size_t n =
        proto_write_hello(line, sizeof line, "run.1@x+y", 12, 8, 256, 0, "{\"lr\":0.001,\"a\":[1,2]}", token, &pub);
    assert_true(n > 0 && pub < n);
    assert_int_equal(line[n - 1], '\n');
    struct proto_msg m = {0};
    assert_int_equal(proto_parse(line, n - 1, &m, err, sizeof err), PROTO_OK);
    assert_int_equal(m.type, PROTO_HELLO);
    assert_string_equal(m.run, "run.1@x+y");
    assert_int_equal(m.protocol, PROTO_VERSION);
    assert_int_equal(m.layers, 12);
    assert_int_equal(m.heads, 8);
    assert_int_equal(m.seq_len, 256);
    assert_int_equal(m.ack_delay_ms, PROTO_ACK_DELAY_MS);
    assert_string_equal(m.meta, "{\"lr\":0.001,\"a\":[1,2]}");
    assert_string_equal(m.token, token);
    assert_int_equal(m.noncausal, 0); /* causal, the default, is not written */
    assert_null(strstr(line, "causal"));
    proto_msg_free(&m);
    /* the public part (stored in a spool's hello.json) is a hello without token */
    memcpy(line + pub, "}", 1);
    assert_int_equal(proto_parse(line, pub + 1, &m, err, sizeof err), PROTO_OK);
    assert_null(m.token);
    proto_msg_free(&m);
    /* no meta, no token, full attention; too small a buffer writes nothing */
    n = proto_write_hello(line, sizeof line, "r", 1, 1, 1, 1, NULL, NULL, NULL);
    assert_non_null(strstr(line, "\"causal\":false"));
    assert_int_equal(proto_parse(line, n - 1, &m, err, sizeof err), PROTO_OK);
    assert_null(m.meta);
    assert_int_equal(m.noncausal, 1);
    proto_msg_free(&m);
    /* "causal" takes only a boolean */
    static const char bad[] = "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,"
                              "\"seq_len\":4,\"causal\":1}";
    assert_int_equal(proto_parse(bad, sizeof bad - 1, &m, err, sizeof err), PROTO_E_BAD_FIELD);
    assert_non_null(strstr(err, "causal"));
    proto_msg_free(&m);
    static const char yes[] = "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,"
                              "\"seq_len\":4,\"causal\": true}";
    assert_int_equal(proto_parse(yes, sizeof yes - 1, &m, err, sizeof err), PROTO_OK);
    assert_int_equal(m.noncausal, 0);
    proto_msg_free(&m);
    assert_int_equal(proto_write_hello(line, 16, "r", 1, 1, 1, 0, NULL, NULL, NULL), 0);
}

static void test_step(void **state) {
    (void)state;
    enum { L = 3, H = 5 };
    proto_name sn[3] = {"loss", "lr", "grad_norm"}, ln[2] = {"rank_ratio", "cos:sim"}, hn[2] = {"entropy", "max_logit"};
    float sv[3] = {2.5f, 1e-4f, NAN};
    float lv[2 * L], hv[2 * L * H];
    for (int i = 0; i < 2 * L; i++) lv[i] = 0.1f * (float)i - 0.2f;
    for (int i = 0; i < 2 * L * H; i++) hv[i] = (float)i * 1.37e3f;
    hv[7] = INFINITY;
    hv[8] = -INFINITY;
    for (int with_time = 0; with_time < 2; with_time++) {
        struct proto_step_view v = {.step = 123456789012,
                                    .time = with_time ? 1764500000.25 : -1,
                                    .L = L,
                                    .H = H,
                                    .n_scalar = 3,
                                    .n_layer = 2,
                                    .n_head = 2,
                                    .scalar_names = sn,
                                    .scalars = sv,
                                    .layer_names = ln,
                                    .layers = lv,
                                    .head_names = hn,
                                    .heads = hv};
        static char body[1 << 16];
        size_t n = proto_write_step_body(body, &v);
        assert_true(n <= proto_step_body_max(3, 2, 2, L, H));
        assert_null(memmem(body, n, "nan", 3));
        assert_null(memmem(body, n, "inf", 3));
        struct proto_msg m;
        assert_int_equal(parse_seq_line(77, body, n, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_STEP);
        assert_int_equal(m.seq, 77);
        assert_int_equal(m.step, 123456789012);
        assert_int_equal(m.has_time, with_time);
        if (with_time) assert_true(m.time == 1764500000.25);
        assert_int_equal(m.nmetrics, 7);
        for (uint32_t i = 0; i < m.nmetrics; i++) {
            const struct proto_metric *mt = &m.metrics[i];
            const float *want;
            uint32_t count;
            if (mt->kind == PROTO_SCALAR) {
                want = sv + i;
                count = 1;
                assert_string_equal(mt->name, sn[i]);
            } else if (mt->kind == PROTO_LAYER) {
                int k = (int)i - 3;
                want = lv + k * L;
                count = L;
                assert_string_equal(mt->name, ln[k]);
                assert_int_equal(mt->rows, L);
            } else {
                int k = (int)i - 5;
                want = hv + k * L * H;
                count = L * H;
                assert_string_equal(mt->name, hn[k]);
                assert_int_equal(mt->rows, L);
                assert_int_equal(mt->cols, H);
            }
            for (uint32_t j = 0; j < count; j++) {
                float got = m.values[mt->offset + j], w = want[j];
                if (isfinite(w)) assert_true(got == w);
                else assert_true(isnan(got)); /* null: stored as NaN */
            }
        }
        proto_msg_free(&m);
    }
}

static void test_event_and_end(void **state) {
    (void)state;
    /* quotes, backslash, control characters, UTF-8, and invalid bytes ('?') */
    const char text[] = "a \"q\" \\ \n\t\x01 caf\xc3\xa9 \xe2\x82\xac bad:\xff\xc3";
    static char body[4096];
    for (int level = PROTO_INFO; level <= PROTO_ERROR; level++) {
        size_t n = proto_write_event_body(body, level, text, strlen(text), level == PROTO_WARN ? -1 : 12.5);
        struct proto_msg m;
        assert_int_equal(parse_seq_line(5, body, n, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_EVENT);
        assert_int_equal(m.level, level);
        assert_string_equal(m.text, "a \"q\" \\ \n\t\x01 caf\xc3\xa9 \xe2\x82\xac bad:??");
        assert_int_equal(m.has_time, level != PROTO_WARN);
        proto_msg_free(&m);
        assert_int_equal(proto_level_parse(proto_level_name(level)), level);
    }
    for (int st = PROTO_FINISHED; st <= PROTO_ABORTED; st++) {
        size_t n = proto_write_end_body(body, st);
        struct proto_msg m;
        assert_int_equal(parse_seq_line(6, body, n, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_END);
        assert_int_equal(m.status, st);
        assert_int_equal(m.seq, 6);
        proto_msg_free(&m);
        assert_int_equal(proto_status_parse(proto_status_name(st)), st);
    }
    assert_int_equal(proto_level_parse("debug"), -1);
    assert_int_equal(proto_status_parse(NULL), -1);
}

static void test_replies(void **state) {
    (void)state;
    struct proto_reply r;
    size_t n = proto_write_welcome(line, sizeof line, 42, 18446744073709549568ull);
    assert_int_equal(proto_parse_reply(line, n - 1, &r), 0);
    assert_int_equal(r.type, PROTO_R_WELCOME);
    assert_int_equal(r.run_id, 42);
    assert_true(r.last_seq == 18446744073709549568ull); /* exact in a double */
    n = proto_write_ack(line, sizeof line, 9007199254740992ull);
    assert_int_equal(proto_parse_reply(line, n - 1, &r), 0);
    assert_int_equal(r.type, PROTO_R_ACK);
    assert_true(r.seq == 9007199254740992ull);
    for (int code = PROTO_E_LINE_TOO_LONG; code < PROTO_E_COUNT; code++) {
        n = proto_write_error(line, sizeof line, code, "expected \"seq\"\n 7", code % 2, 1000 + code);
        assert_int_equal(proto_parse_reply(line, n - 1, &r), 0);
        assert_int_equal(r.type, PROTO_R_ERROR);
        assert_int_equal(r.code, code);
        assert_string_equal(r.code_name, proto_err_name(code));
        assert_string_equal(r.message, "expected \"seq\"\n 7");
        assert_int_equal(r.has_seq, code % 2);
        if (code % 2) assert_int_equal(r.seq, 1000 + code);
    }
    const char *alert = "{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":\"entropy_collapse\","
                        "\"severity\":\"critical\",\"start_step\":80,\"step\":100,\"step_time\":1764500000.5,"
                        "\"alert\":{\"labels\":{}}}";
    assert_int_equal(proto_parse_reply(alert, strlen(alert), &r), 0);
    assert_int_equal(r.type, PROTO_R_ALERT);
    assert_string_equal(r.alert.transition, "firing");
    assert_string_equal(r.alert.rule, "entropy_collapse");
    assert_int_equal(r.alert.start_step, 80);
    assert_int_equal(r.alert.step, 100);
    assert_true(r.alert.has_step_time && r.alert.step_time == 1764500000.5);
    /* not JSON, no type, a welcome without last_seq: unknown, and no crash */
    assert_int_equal(proto_parse_reply("{\"type\":", 8, &r), -1);
    assert_int_equal(r.type, PROTO_R_UNKNOWN);
    assert_int_equal(proto_parse_reply("{\"type\":\"welcome\"}", 18, &r), -1);
    assert_int_equal(proto_parse_reply("{\"type\":\"news\"}", 15, &r), 0);
    assert_int_equal(r.type, PROTO_R_UNKNOWN);
    assert_string_equal(r.type_name, "news");
}

static uint32_t rng = 12345;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

static void test_floats(void **state) {
    (void)state;
    /* through the step parser: what the daemon stores is the float sent */
    enum { N = 4096 };
    static proto_name hn[1] = {"v"};
    static float hv[N];
    for (int i = 0; i < N; i++) {
        uint32_t b = next_u32();
        if (i < 8)
            b = (uint32_t[]){0x00000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
                             0x80000000u, 0x3dcccccdu, 0xff7fffffu, 0x33d6bf95u}[i];
        memcpy(&hv[i], &b, 4);
    }
    static char body[N * 32];
    struct proto_step_view v = {
        .step = 0, .time = -1, .L = 64, .H = N / 64, .n_head = 1, .head_names = hn, .heads = hv};
    size_t n = proto_write_step_body(body, &v);
    struct proto_msg m;
    assert_int_equal(parse_seq_line(1, body, n, &m), PROTO_OK);
    for (int i = 0; i < N; i++) {
        if (isfinite(hv[i])) assert_memory_equal(&m.values[i], &hv[i], 4);
        else assert_true(isnan(m.values[i]));
    }
    proto_msg_free(&m);
    char buf[PROTO_FLOAT_MAX + 1];
    buf[proto_format_float(buf, 0.1f)] = 0;
    assert_string_equal(buf, "0.1");
    buf[proto_format_float(buf, NAN)] = 0;
    assert_string_equal(buf, "null");
    buf[proto_format_float(buf, -INFINITY)] = 0;
    assert_string_equal(buf, "null");
    buf[proto_format_float(buf, 1e15f)] = 0;
    assert_true(strtof(buf, NULL) == 1e15f);
}

static void test_names(void **state) {
    (void)state;
    assert_true(proto_valid_name("a.b_c:d-E9", 10));
    assert_false(proto_valid_name("", 0));
    assert_false(proto_valid_name("a b", 3));
    assert_false(proto_valid_name("a@b", 3)); /* '@' is for run names only */
    assert_true(proto_valid_run("a@b+c", 5));
    char big[PROTO_MAX_RUN + 2];
    memset(big, 'x', sizeof big);
    assert_true(proto_valid_name(big, PROTO_MAX_NAME));
    assert_false(proto_valid_name(big, PROTO_MAX_NAME + 1));
    assert_true(proto_valid_run(big, PROTO_MAX_RUN));
    assert_false(proto_valid_run(big, PROTO_MAX_RUN + 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello),   cmocka_unit_test(test_step),   cmocka_unit_test(test_event_and_end),
        cmocka_unit_test(test_replies), cmocka_unit_test(test_floats), cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
