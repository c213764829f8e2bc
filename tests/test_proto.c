/* test_proto.c: unit tests of the protocol v1 line parser
 * (proto/proto_parse.c) and of the vocabulary it checks against
 * (proto/proto.c: names, escaping).
 *
 * Every message type with all its fields, number parsing against strtod,
 * string escapes and UTF-8 validation, every error code the parser returns,
 * a guard-page test (each line ends exactly where an inaccessible page
 * begins, so any read past the end crashes), proto_json_string round trips,
 * and a mutation loop over valid lines (under `make test SANITIZE=...` ASan
 * checks that none of it over-reads or leaks). Not covered here: the error
 * codes raised by ingest (no_hello, seq_gap, ...), and PROTO_E_INTERNAL,
 * which needs an allocation failure. */
#include <float.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto.h"

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) { /* xorshift64*: reproducible across runs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static unsigned rnd_below(unsigned n) { return (unsigned)(rnd() % n); }

static char errbuf[256];

/* Parses a NUL-terminated line into *m (zeroed first). */
static int parse(const char *line, struct proto_msg *m) {
    memset(m, 0, sizeof *m);
    return proto_parse(line, strlen(line), m, errbuf, sizeof errbuf);
}

/* Parses and checks the code; on a mismatch prints the line and the message. */
static void check_code_at(const char *line, size_t len, int want, const char *file, int lineno) {
    struct proto_msg m = {0};
    int got = proto_parse(line, len, &m, errbuf, sizeof errbuf);
    if (got != want)
        fail_msg("%s:%d: line %.200s%s: got %s (%s), want %s", file, lineno, line, len > 200 ? "..." : "",
                 proto_err_name(got), errbuf, proto_err_name(want));
    if (want != PROTO_OK && errbuf[0] == 0)
        fail_msg("%s:%d: error %s without a message", file, lineno, proto_err_name(got));
    proto_msg_free(&m);
}
#define CHECK(line, code) check_code_at((line), strlen(line), (code), __FILE__, __LINE__)

/* Builds a line from a format into a malloc'ed buffer. */
static char *fmt_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    assert_true(vasprintf(&s, fmt, ap) >= 0);
    va_end(ap);
    return s;
}

/* A string of n copies of c, malloc'ed. */
static char *rep(char c, size_t n) {
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = 0;
    return s;
}

static void assert_float_bits(float got, float want, const char *lit) {
    uint32_t g, w;
    memcpy(&g, &got, 4);
    memcpy(&w, &want, 4);
    if (g != w)
        fail_msg("literal %s: stored %.9g (0x%08x), strtod gives %.9g (0x%08x)", lit, (double)got, g, (double)want, w);
}

/* Structural invariants of any successfully parsed message. */
static void check_msg_invariants(const struct proto_msg *m) {
    assert_true(m->type >= PROTO_HELLO && m->type <= PROTO_END);
    uint32_t next = 0;
    for (uint32_t i = 0; i < m->nmetrics; i++) {
        const struct proto_metric *mt = &m->metrics[i];
        assert_int_equal(mt->offset, next);
        next += mt->rows * mt->cols;
        size_t n = strlen(mt->name);
        assert_true(n >= 1 && n <= PROTO_MAX_NAME);
    }
    assert_int_equal(next, m->nvalues);
    if (m->type == PROTO_HELLO) {
        assert_true(m->layers >= 1 && m->layers <= PROTO_MAX_DIM);
        assert_true(m->heads >= 1 && m->heads <= PROTO_MAX_DIM);
        assert_true(strlen(m->run) >= 1);
    }
    if (m->type != PROTO_HELLO) {
        assert_true(m->has_seq);
        assert_true(m->seq >= 1);
    }
}

/* ------------------------------------------------------------ messages */

#define HELLO_PRE "{\"type\":\"hello\",\"protocol\":1,"

static void test_hello_all_fields(void **state) {
    (void)state;
    const char *meta = "{\"lr\": 1e-3, \"tags\":[\"a\",\"b\\\"c\"] , \"n\":{\"x\":null,\"y\":[true,false]}}";
    char *line = fmt_line("{\"type\":\"hello\",\"protocol\":1,\"run\":\"Exp-1.a_b:c@d+e\",\"layers\":12,"
                          "\"heads\":8,\"seq_len\":256,\"meta\":  %s  ,\"token\":\"s3cr\\\"et\\u00e9\"}",
                          meta);
    struct proto_msg m;
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_HELLO);
    assert_int_equal(m.protocol, 1);
    assert_string_equal(m.run, "Exp-1.a_b:c@d+e");
    assert_int_equal(m.layers, 12);
    assert_int_equal(m.heads, 8);
    assert_int_equal(m.seq_len, 256);
    assert_non_null(m.meta);
    assert_string_equal(m.meta, meta); /* verbatim: whitespace and escapes kept */
    assert_non_null(m.token);
    assert_string_equal(m.token, "s3cr\"et\xc3\xa9");
    assert_int_equal(m.has_seq, 0);
    assert_int_equal(m.nmetrics, 0);
    check_msg_invariants(&m);
    proto_msg_free(&m);
    /* a zeroed message after free */
    assert_null(m.meta);
    assert_int_equal(m.type, PROTO_NONE);
    free(line);

    /* meta and token are optional; limits are inclusive */
    assert_int_equal(
        parse("{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":4096,\"heads\":256,\"seq_len\":1}", &m),
        PROTO_OK);
    assert_null(m.meta);
    assert_null(m.token);
    assert_int_equal(m.layers, 4096);
    assert_int_equal(m.heads, 256);
    proto_msg_free(&m);
    assert_int_equal(
        parse(
            "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1024,\"heads\":1024,\"seq_len\":1,\"meta\":{}}",
            &m),
        PROTO_OK);
    assert_string_equal(m.meta, "{}");
    assert_int_equal(m.ack_delay_ms, 0); /* absent: the client may wait for its acks */
    proto_msg_free(&m);
    /* ack_delay_ms: 0..PROTO_MAX_ACK_DELAY_MS; anything else is refused */
    assert_int_equal(parse(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"ack_delay_ms\":40}", &m),
                     PROTO_OK);
    assert_int_equal(m.ack_delay_ms, 40);
    proto_msg_free(&m);
    static const char *const bad_delay[] = {"-1", "60001", "1.5", "\"40\"", "null", "[40]", "1e300"};
    for (size_t i = 0; i < sizeof bad_delay / sizeof *bad_delay; i++) {
        char *l = fmt_line(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"ack_delay_ms\":%s}",
                           bad_delay[i]);
        assert_int_equal(parse(l, &m), PROTO_E_BAD_FIELD);
        proto_msg_free(&m);
        free(l);
    }
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"ack_delay_ms\":60000}", PROTO_OK);
}

static void test_step_all_fields(void **state) {
    (void)state;
    const char *line = "{\"type\":\"step\",\"seq\":42,\"step\":1000,\"time\":1764500000.25,"
                       "\"scalars\":{\"loss\":2.31,\"lr\":0.001,\"bad\":null},"
                       "\"layers\":{\"rank_ratio\":[0.9,0.8,null],\"x\":[1,2,3]},"
                       "\"heads\":{\"entropy\":[[1.2,1.3],[0.4,null],[-5,6e2]],\"attn.max:1\":[[7,8],[9,10],[11,12]]}}";
    struct proto_msg m;
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_STEP);
    assert_int_equal(m.has_seq, 1);
    assert_int_equal(m.seq, 42);
    assert_int_equal(m.step, 1000);
    assert_int_equal(m.has_time, 1);
    assert_true(m.time == 1764500000.25);
    assert_int_equal(m.nmetrics, 7);
    assert_int_equal(m.nvalues, 3 + 6 + 12);
    static const struct {
        const char *name;
        int kind;
        uint32_t rows, cols, offset;
    } want[] = {
        {"loss", PROTO_SCALAR, 1, 1, 0},      {"lr", PROTO_SCALAR, 1, 1, 1}, {"bad", PROTO_SCALAR, 1, 1, 2},
        {"rank_ratio", PROTO_LAYER, 3, 1, 3}, {"x", PROTO_LAYER, 3, 1, 6},   {"entropy", PROTO_HEAD, 3, 2, 9},
        {"attn.max:1", PROTO_HEAD, 3, 2, 15},
    };
    for (int i = 0; i < 7; i++) {
        assert_string_equal(m.metrics[i].name, want[i].name);
        assert_int_equal(m.metrics[i].kind, want[i].kind);
        assert_int_equal(m.metrics[i].rows, want[i].rows);
        assert_int_equal(m.metrics[i].cols, want[i].cols);
        assert_int_equal(m.metrics[i].offset, want[i].offset);
    }
    /* doubles narrowed like the parser narrows them */
    const double vals[] = {2.31, 0.001, NAN, 0.9, 0.8, NAN, 1, 2, 3, 1.2, 1.3, 0.4, NAN, -5, 600, 7, 8, 9, 10, 11, 12};
    for (int i = 0; i < 21; i++) {
        if (isnan(vals[i])) assert_true(isnan(m.values[i]));
        else assert_float_bits(m.values[i], (float)vals[i], "(table)");
    }
    check_msg_invariants(&m);
    proto_msg_free(&m);

    /* minimal step: no time, no metric objects; empty objects */
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":1,\"step\":0}", &m), PROTO_OK);
    assert_int_equal(m.has_time, 0);
    assert_int_equal(m.nmetrics, 0);
    assert_int_equal(m.nvalues, 0);
    assert_int_equal(m.step, 0);
    proto_msg_free(&m);
    assert_int_equal(
        parse("{ \"step\" : 7 , \"scalars\" : { } , \"layers\":{}, \"heads\":{} ,\"seq\":3,\"type\":\"step\" }", &m),
        PROTO_OK);
    assert_int_equal(m.step, 7);
    assert_int_equal(m.seq, 3);
    assert_int_equal(m.nmetrics, 0);
    proto_msg_free(&m);

    /* shapes are recorded as sent (ingest compares them with the run) */
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"a\":[]},"
                           "\"heads\":{\"b\":[[1,2,3,4]],\"c\":[[],[]]}}",
                           &m),
                     PROTO_OK);
    assert_int_equal(m.nmetrics, 3);
    assert_int_equal(m.metrics[0].rows, 0);
    assert_int_equal(m.metrics[1].rows, 1);
    assert_int_equal(m.metrics[1].cols, 4);
    assert_int_equal(m.metrics[2].rows, 2);
    assert_int_equal(m.metrics[2].cols, 0);
    assert_int_equal(m.metrics[2].offset, 4);
    assert_int_equal(m.nvalues, 4);
    proto_msg_free(&m);

    /* a larger step: values land at their offsets, layer-major */
    char *big = malloc(1 << 20);
    assert_non_null(big);
    int L = 24, H = 16;
    size_t n = (size_t)sprintf(big, "{\"type\":\"step\",\"seq\":9,\"step\":5,\"heads\":{");
    for (int k = 0; k < 3; k++) {
        n += (size_t)sprintf(big + n, "%s\"m%d\":[", k ? "," : "", k);
        for (int l = 0; l < L; l++) {
            big[n++] = '[';
            for (int h = 0; h < H; h++) n += (size_t)sprintf(big + n, "%s%d", h ? "," : "", k * 10000 + l * 100 + h);
            big[n++] = ']';
            if (l < L - 1) big[n++] = ',';
        }
        big[n++] = ']';
    }
    strcpy(big + n, "}}");
    assert_int_equal(parse(big, &m), PROTO_OK);
    assert_int_equal(m.nmetrics, 3);
    assert_int_equal(m.nvalues, 3 * L * H);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(m.metrics[k].rows, L);
        assert_int_equal(m.metrics[k].cols, H);
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++)
                assert_true(m.values[m.metrics[k].offset + l * H + h] == (float)(k * 10000 + l * 100 + h));
    }
    proto_msg_free(&m);
    free(big);
}

static void test_event_and_end(void **state) {
    (void)state;
    struct proto_msg m;
    static const char *const levels[] = {"info", "warn", "error"};
    for (int i = 0; i < 3; i++) {
        char *line =
            fmt_line("{\"type\":\"event\",\"seq\":%d,\"level\":\"%s\",\"text\":\"hello\\nworld %d\",\"time\":12.5}",
                     i + 1, levels[i], i);
        assert_int_equal(parse(line, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_EVENT);
        assert_int_equal(m.seq, i + 1);
        assert_int_equal(m.level, i);
        char want[32];
        snprintf(want, sizeof want, "hello\nworld %d", i);
        assert_string_equal(m.text, want);
        assert_int_equal(m.has_time, 1);
        assert_true(m.time == 12.5);
        assert_string_equal(proto_level_name(m.level), levels[i]);
        proto_msg_free(&m);
        free(line);
    }
    assert_int_equal(parse("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"\"}", &m), PROTO_OK);
    assert_string_equal(m.text, "");
    proto_msg_free(&m);

    static const char *const st[] = {"finished", "failed", "aborted"};
    static const int stv[] = {PROTO_FINISHED, PROTO_FAILED, PROTO_ABORTED};
    for (int i = 0; i < 3; i++) {
        char *line = fmt_line("{\"type\":\"end\",\"seq\":%d,\"status\":\"%s\"}", 100 + i, st[i]);
        assert_int_equal(parse(line, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_END);
        assert_int_equal(m.seq, 100 + i);
        assert_int_equal(m.status, stv[i]);
        assert_string_equal(proto_status_name(m.status), st[i]);
        proto_msg_free(&m);
        free(line);
    }
    assert_string_equal(proto_status_name(PROTO_LIVE), "live");
    assert_string_equal(proto_status_name(PROTO_STALE), "stale");
}

static void test_unknown_fields_and_crlf(void **state) {
    (void)state;
    struct proto_msg m;
    const char *line = "{\"future\":{\"a\":[1,2,{\"b\":null}],\"c\":\"x\\u00e9\\n\"},\"type\":\"end\",\"f2\":-1.5e3,"
                       "\"f3\":true,\"f4\":false,\"f5\":null,\"f6\":[],\"f7\":{},"
                       "\"a_very_long_unknown_key_longer_than_thirty_two_bytes_for_sure\":[\"\\ud83d\\ude00\"],"
                       "\"seq\":5,\"status\":\"failed\",\"\":0}";
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_END);
    assert_int_equal(m.seq, 5);
    assert_int_equal(m.status, PROTO_FAILED);
    proto_msg_free(&m);

    /* "\r" before the (removed) newline is tolerated; so is whitespace */
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}\r", PROTO_OK);
    CHECK(" \t{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"} \t\r", PROTO_OK);
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}\r\r", PROTO_OK);
    /* but a '\r' is not a value */
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}\rx", PROTO_E_BAD_JSON);
    /* the removed '\r' is not part of a string: an unterminated one stays so */
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\r", PROTO_E_BAD_JSON);
}

/* ------------------------------------------------------------ numbers */

/* Parses lit as a scalar value and as the time field and compares them
 * with strtod of the same literal. */
static void check_literal(const char *lit) {
    char line[1200];
    struct proto_msg m;
    snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"x\":%s}}", lit);
    int rc = parse(line, &m);
    if (rc != PROTO_OK) fail_msg("literal %s: %s (%s)", lit, proto_err_name(rc), errbuf);
    assert_int_equal(m.nvalues, 1);
    assert_float_bits(m.values[0], proto_to_f32(strtod(lit, NULL)), lit);
    proto_msg_free(&m);
    /* and inside a vector (a layer metric: the fast path of head and layer values) */
    snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"x\":[%s,%s]}}", lit, lit);
    rc = parse(line, &m);
    if (rc != PROTO_OK) fail_msg("vector of literal %s: %s (%s)", lit, proto_err_name(rc), errbuf);
    assert_int_equal(m.nvalues, 2);
    assert_float_bits(m.values[0], proto_to_f32(strtod(lit, NULL)), lit);
    assert_float_bits(m.values[1], proto_to_f32(strtod(lit, NULL)), lit);
    proto_msg_free(&m);

    double d = strtod(lit, NULL);
    if (d >= 0 && d < 1e11) { /* the time field's range */
        snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":0,\"time\":%s}", lit);
        rc = parse(line, &m);
        if (rc != PROTO_OK) fail_msg("time literal %s: %s (%s)", lit, proto_err_name(rc), errbuf);
        if (memcmp(&m.time, &d, sizeof d) != 0)
            fail_msg("time literal %s: parsed %.17g, strtod gives %.17g", lit, m.time, d);
        proto_msg_free(&m);
    }
}

static void test_number_fixed_literals(void **state) {
    (void)state;
    static const char *const lits[] = {
        "0",
        "-0",
        "0.0",
        "-0.0",
        "-0e0",
        "0e-400",
        "1",
        "-1",
        "1e-45",
        "-1e-45",
        "7e-46",
        "1.4e-45",
        "1.1754943e-38",
        "1.17549435e-38",
        "3.4e38",
        "3.4028234e38",
        "3.40282347e+38",
        "3.4028236e38",
        "1e39",
        "-1e39",
        "1E400",
        "1e-400",
        "0.1",
        "0.2",
        "0.30000000000000004",
        "123456789",
        "16777216",
        "16777217",
        "16777218",
        "9007199254740992",
        "9007199254740993",
        "18446744073709551615",
        "18446744073709551616",
        "123456789012345678901234567890",
        "1.000000000000000000000000001",
        "0.000000000000000000000000000000000000000000001234",
        "2.2250738585072014e-308",
        "4.9e-324",
        "1.7976931348623157e308",
        "1e22",
        "1e23",
        "1e-22",
        "1e-23",
        "9999999999999999999",
        "1E+2",
        "1e+0",
        "2.5E-3",
        "-123.456e-7",
        "1764500000.25",
        "99999999999.99",
        "0.5",
        "1.5",
        "2.5",
        "3.5",
        "33554431",
        "33554433",
        "0.00000000000000000000000000000000000001",
        "1.00000005960464477539062500",
        "1.00000005960464477539062499",
        "1.00000005960464477539062501",
        "1.0000000596046447753906250000000000001",
        "4503599627370497.5",
    };
    for (size_t i = 0; i < sizeof lits / sizeof *lits; i++) check_literal(lits[i]);

    struct proto_msg m;
    assert_int_equal(
        parse("{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":-0,\"b\":1e39,\"c\":-1e39,\"d\":1e-45}}", &m),
        PROTO_OK);
    assert_true(m.values[0] == 0 && signbit(m.values[0]));
    /* finite numbers beyond float32 saturate: finite, never Inf */
    assert_true(m.values[1] == FLT_MAX);
    assert_true(m.values[2] == -FLT_MAX);
    assert_true(m.values[3] == nextafterf(0, 1)); /* the smallest subnormal, not 0 */
    proto_msg_free(&m);
    assert_int_equal(
        parse("{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":3.5e38,\"b\":-3.5e38,\"c\":1E400}}", &m),
        PROTO_OK);
    for (int i = 0; i < 3; i++) assert_true(isfinite(m.values[i]));
    assert_true(m.values[0] == FLT_MAX && m.values[1] == -FLT_MAX && m.values[2] == FLT_MAX);
    proto_msg_free(&m);
}

/* Appends n random digits to s. */
static size_t put_digits(char *s, unsigned n, int nonzero_first) {
    for (unsigned i = 0; i < n; i++) s[i] = (char)('0' + (i == 0 && nonzero_first ? 1 + rnd_below(9) : rnd_below(10)));
    return n;
}

static void test_number_random_literals(void **state) {
    (void)state;
    char lit[128];
    for (int iter = 0; iter < 40000; iter++) {
        size_t n = 0;
        if (rnd_below(3) == 0) lit[n++] = '-';
        unsigned idig = rnd_below(4) == 0 ? 0 : 1 + rnd_below(rnd_below(4) == 0 ? 30 : 10);
        if (idig == 0) lit[n++] = '0';
        else n += put_digits(lit + n, idig, 1);
        if (rnd_below(2)) {
            lit[n++] = '.';
            unsigned fz = rnd_below(4) == 0 ? rnd_below(30) : 0; /* leading zeros of the fraction */
            for (unsigned i = 0; i < fz; i++) lit[n++] = '0';
            n += put_digits(lit + n, 1 + rnd_below(rnd_below(4) == 0 ? 30 : 10), 0);
        }
        if (rnd_below(2)) {
            lit[n++] = rnd_below(2) ? 'e' : 'E';
            unsigned s = rnd_below(3);
            if (s == 1) lit[n++] = '+';
            if (s == 2) lit[n++] = '-';
            int e = (int)rnd_below(rnd_below(3) == 0 ? 60 : 25);
            n += (size_t)sprintf(lit + n, rnd_below(8) == 0 ? "%03d" : "%d", e);
        }
        lit[n] = 0;
        check_literal(lit);
    }
    /* random float32 values printed with 6..9 significant digits read back exactly */
    for (int iter = 0; iter < 20000; iter++) {
        uint32_t bits = (uint32_t)rnd();
        float f;
        memcpy(&f, &bits, 4);
        if (!isfinite(f)) continue;
        snprintf(lit, sizeof lit, "%.*g", 6 + (int)rnd_below(4), (double)f);
        check_literal(lit);
        snprintf(lit, sizeof lit, "%.9e", (double)f);
        check_literal(lit);
    }
}

static void test_number_syntax_errors(void **state) {
    (void)state;
    static const char *const bad[] = {"01",        "-01", "1.",   ".5",  "-",    "+1",    "1e",
                                      "1e+",       "1e-", "1.e5", "--1", "0x10", "NaN",   "Infinity",
                                      "-Infinity", "1 2", "1,",   "tru", "nul",  "1.5.5", "1e5e5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char line[128];
        snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"x\":%s}}", bad[i]);
        CHECK(line, PROTO_E_BAD_JSON);
        snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":0,\"unknown\":%s}", bad[i]);
        CHECK(line, PROTO_E_BAD_JSON);
        snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"x\":[1,%s]}}", bad[i]);
        CHECK(line, PROTO_E_BAD_JSON);
    }
}

/* ------------------------------------------------------------ strings */

/* Parses an event whose text is the JSON source `src` and returns the
 * decoded text (malloc'ed) or NULL with the code in *code. */
static char *decode_text(const char *src, size_t srclen, int *code) {
    char *line = malloc(srclen + 64);
    assert_non_null(line);
    int n = sprintf(line, "{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"");
    memcpy(line + n, src, srclen);
    n += (int)srclen;
    n += sprintf(line + n, "\"}");
    struct proto_msg m = {0};
    *code = proto_parse(line, (size_t)n, &m, errbuf, sizeof errbuf);
    free(line);
    char *out = NULL;
    if (*code == PROTO_OK) out = strdup(m.text);
    proto_msg_free(&m);
    return out;
}

static void check_text(const char *src, const char *want) {
    int code;
    char *got = decode_text(src, strlen(src), &code);
    if (code != PROTO_OK) fail_msg("text \"%s\": %s (%s)", src, proto_err_name(code), errbuf);
    assert_string_equal(got, want);
    free(got);
}

static void check_text_err(const char *src, size_t len, int want) {
    int code;
    char *got = decode_text(src, len, &code);
    free(got);
    if (code != want)
        fail_msg("text \"%.*s\": got %s (%s), want %s", (int)len, src, proto_err_name(code), errbuf,
                 proto_err_name(want));
}
#define TEXT_ERR(s, code) check_text_err((s), sizeof(s) - 1, (code))

static void test_string_escapes(void **state) {
    (void)state;
    check_text("a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti", "a\"b\\c/d\be\ff\ng\rh\ti");
    check_text("\\u0041\\u00e9\\u00E9\\u20ac\\uFFFF\\u0001\\u001f\\u007f",
               "A\xc3\xa9\xc3\xa9\xe2\x82\xac\xef\xbf\xbf\x01\x1f\x7f");
    check_text("\\ud83d\\ude00", "\xf0\x9f\x98\x80"); /* U+1F600 */
    check_text("\\uD800\\uDC00", "\xf0\x90\x80\x80"); /* U+10000 */
    check_text("\\udbff\\udfff", "\xf4\x8f\xbf\xbf"); /* U+10FFFF */
    check_text("x\\ud83d\\ude00\\ud83d\\ude01y", "x\xf0\x9f\x98\x80\xf0\x9f\x98\x81y");
    check_text("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"); /* raw UTF-8 kept */
    check_text("\x7f", "\x7f");

    TEXT_ERR("\\ud83d", PROTO_E_BAD_JSON); /* lone high surrogate at the end */
    TEXT_ERR("\\ud83dx", PROTO_E_BAD_JSON);
    TEXT_ERR("\\ud83d\\u0041", PROTO_E_BAD_JSON); /* high + non-low */
    TEXT_ERR("\\ud83d\\ud83d", PROTO_E_BAD_JSON); /* high + high */
    TEXT_ERR("\\ud83d\\n", PROTO_E_BAD_JSON);
    TEXT_ERR("\\ude00", PROTO_E_BAD_JSON);        /* lone low surrogate */
    TEXT_ERR("\\ude00\\ud83d", PROTO_E_BAD_JSON); /* reversed pair */
    TEXT_ERR("\\u12", PROTO_E_BAD_JSON);
    TEXT_ERR("\\u12g4", PROTO_E_BAD_JSON);
    TEXT_ERR("\\uZZZZ", PROTO_E_BAD_JSON);
    TEXT_ERR("\\U0041", PROTO_E_BAD_JSON);
    TEXT_ERR("\\x41", PROTO_E_BAD_JSON);
    TEXT_ERR("\\a", PROTO_E_BAD_JSON);
    TEXT_ERR("\\'", PROTO_E_BAD_JSON);
    TEXT_ERR("\\0", PROTO_E_BAD_JSON);
    TEXT_ERR("a\tb", PROTO_E_BAD_JSON); /* raw control characters */
    TEXT_ERR("a\nb", PROTO_E_BAD_JSON);
    TEXT_ERR("a\x01", PROTO_E_BAD_JSON);
    TEXT_ERR("a\x1f", PROTO_E_BAD_JSON);
    TEXT_ERR("a\0b", PROTO_E_BAD_JSON);     /* a raw NUL byte */
    TEXT_ERR("\\u0000", PROTO_E_BAD_FIELD); /* NUL cannot live in a C string */

    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"abc", PROTO_E_BAD_JSON);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"abc\\\"}", PROTO_E_BAD_JSON);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"abc\\", PROTO_E_BAD_JSON);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"\\u00", PROTO_E_BAD_JSON);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"\\ud83d\\ude0", PROTO_E_BAD_JSON);
    /* escapes in keys are decoded before matching */
    CHECK("{\"typ\\u0065\":\"end\",\"s\\u0065q\":1,\"status\":\"f\\u0061iled\"}", PROTO_OK);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    static const struct {
        const char *s;
        int ok;
    } cases[] = {
        {"\xc2\x80", 1},
        {"\xdf\xbf", 1},
        {"\xe0\xa0\x80", 1},
        {"\xed\x9f\xbf", 1},
        {"\xee\x80\x80", 1},
        {"\xef\xbf\xbf", 1},
        {"\xf0\x90\x80\x80", 1},
        {"\xf4\x8f\xbf\xbf", 1},
        {"\xc0\x80", 0},
        {"\xc1\xbf", 0}, /* overlong 2-byte */
        {"\xe0\x80\xaf", 0},
        {"\xe0\x9f\xbf", 0}, /* overlong 3-byte */
        {"\xf0\x80\x80\xaf", 0},
        {"\xf0\x8f\xbf\xbf", 0}, /* overlong 4-byte */
        {"\xed\xa0\x80", 0},
        {"\xed\xbf\xbf", 0},
        {"\xed\xa0\xbd\xed\xb8\x80", 0}, /* surrogates (CESU) */
        {"\xf4\x90\x80\x80", 0},
        {"\xf5\x80\x80\x80", 0},
        {"\xf8\x88\x80\x80\x80", 0},
        {"\xfe", 0},
        {"\xff", 0},
        {"\x80", 0},
        {"\xbf", 0}, /* lone continuation */
        {"\xc3", 0},
        {"\xe2\x82", 0},
        {"\xf0\x9f\x98", 0}, /* truncated before the closing quote */
        {"\xc3x", 0},
        {"\xe2\x82x", 0},
        {"\xf0\x9f\x98x", 0}, /* truncated before ASCII */
        {"\xc3\xc3\xa9", 0},
        {"\xe2\x28\xa1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *s = cases[i].s;
        int want = cases[i].ok ? PROTO_OK : PROTO_E_BAD_JSON;
        int code;
        char *got = decode_text(s, strlen(s), &code);
        if (code != want)
            fail_msg("case %zu: got %s (%s), want %s", i, proto_err_name(code), errbuf, proto_err_name(want));
        if (got) assert_string_equal(got, s);
        free(got);
        /* the same inside a skipped field, a key, meta and a run name */
        char *line = fmt_line("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\",\"x\":[\"%s\"]}", s);
        CHECK(line, want);
        free(line);
        line = fmt_line("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\",\"%s\":1}", s);
        CHECK(line, want);
        free(line);
        line = fmt_line(
            "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":{\"k\":\"%s\"}}",
            s);
        CHECK(line, want);
        free(line);
        line =
            fmt_line("{\"type\":\"hello\",\"protocol\":1,\"run\":\"r%s\",\"layers\":1,\"heads\":1,\"seq_len\":1}", s);
        CHECK(line, cases[i].ok ? PROTO_E_BAD_FIELD : PROTO_E_BAD_JSON); /* valid UTF-8 is still not a run name */
        free(line);
    }
    /* a multi-byte sequence cut by the end of the line */
    static const char *const cut[] = {"\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xf0\x9f"};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) {
        char *line = fmt_line("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"%s", cut[i]);
        CHECK(line, PROTO_E_BAD_JSON);
        free(line);
    }
    /* non-ASCII outside strings */
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}\xc2\xa0", PROTO_E_BAD_JSON);
    CHECK("\xef\xbb\xbf{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}", PROTO_E_BAD_JSON); /* BOM */
}

/* ------------------------------------------------------------ errors */

static void test_bad_json(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        " ",
        "\r",
        "[]",
        "null",
        "1",
        "\"s\"",
        "true",
        "{",
        "}",
        "{\"type\":\"end\"",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"} x",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}{}",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"},",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}}",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\",}",
        "{\"type\":\"end\" \"seq\":1}",
        "{\"type\" \"end\"}",
        "{\"type\":}",
        "{,}",
        "{\"a\":1,,\"b\":2}",
        "{type:\"end\"}",
        "{'type':'end'}",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"",
        "{\"x\":[1,2}",
        "{\"x\":[1,2,]}",
        "{\"x\":{\"a\"}}",
        "{\"x\":{\"a\":}}",
        "{\"x\":{1:2}}",
        "{\"x\":[}",
        "{\"x\":]}",
        "{\"x\":tRue}",
        "{\"x\":nulll}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"a\":[1,2}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"heads\":{\"a\":[[1,2],[3,4]}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"heads\":{\"a\":[[1,2] [3,4]]}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":1 \"b\":2}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\" 1}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":1,}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"a\":[1,]}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"a\":[,1]}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"layers\":{\"a\":[nul]}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":1e}}",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\"",
        "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":{\"a\":1",
        "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":{\"a\":1,}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(bad[i], PROTO_E_BAD_JSON);
    /* the message says where */
    struct proto_msg m;
    assert_int_equal(parse("{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"} x", &m), PROTO_E_BAD_JSON);
    assert_non_null(strstr(errbuf, "at byte"));
    proto_msg_free(&m);
}

/* An object with depth arrays nested in an unknown field, holding "1"
 * (or nothing) innermost. */
static char *nested(int depth, int inner) {
    char *s = malloc((size_t)depth * 2 + 128);
    assert_non_null(s);
    int n = sprintf(s, "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\",\"x\":");
    for (int i = 0; i < depth; i++) s[n++] = '[';
    if (inner) s[n++] = '1';
    for (int i = 0; i < depth; i++) s[n++] = ']';
    strcpy(s + n, "}");
    return s;
}

static void test_nesting(void **state) {
    (void)state;
    char *s = nested(32, 1);
    CHECK(s, PROTO_OK);
    free(s);
    s = nested(63, 1); /* the object plus 63 arrays plus a number: 64 levels */
    CHECK(s, PROTO_OK);
    free(s);
    s = nested(65, 1);
    CHECK(s, PROTO_E_BAD_JSON);
    assert_non_null(strstr(errbuf, "nesting"));
    free(s);
    s = nested(66, 0);
    CHECK(s, PROTO_E_BAD_JSON);
    free(s);
    /* far deeper than any stack could recurse: must fail early, not crash */
    s = nested(1000000, 1);
    CHECK(s, PROTO_E_BAD_JSON);
    free(s);
    /* objects nest too, in meta */
    char *line = malloc(200000);
    int n = sprintf(
        line, "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":");
    for (int i = 0; i < 20000; i++) n += sprintf(line + n, "{\"a\":");
    n += sprintf(line + n, "1");
    for (int i = 0; i < 20000; i++) line[n++] = '}';
    strcpy(line + n, "}");
    CHECK(line, PROTO_E_BAD_JSON);
    free(line);
}

static void test_line_too_long(void **state) {
    (void)state;
    /* a valid line of exactly PROTO_MAX_LINE bytes (padded with spaces) parses */
    const char *body = "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"}";
    size_t blen = strlen(body);
    char *line = malloc(PROTO_MAX_LINE + 2);
    assert_non_null(line);
    memcpy(line, body, blen);
    memset(line + blen, ' ', PROTO_MAX_LINE + 2 - blen);
    struct proto_msg m = {0};
    assert_int_equal(proto_parse(line, PROTO_MAX_LINE, &m, errbuf, sizeof errbuf), PROTO_OK);
    proto_msg_free(&m);
    /* one byte more is refused before being looked at */
    assert_int_equal(proto_parse(line, PROTO_MAX_LINE + 1, &m, errbuf, sizeof errbuf), PROTO_E_LINE_TOO_LONG);
    assert_true(errbuf[0] != 0);
    assert_int_equal(m.type, PROTO_NONE);
    proto_msg_free(&m);
    free(line);
}

static void test_bad_type(void **state) {
    (void)state;
    CHECK("{}", PROTO_E_BAD_TYPE);
    CHECK("{\"seq\":1,\"status\":\"failed\"}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":\"hi\",\"seq\":1}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":\"\"}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":\"HELLO\"}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":\"welcome\",\"run_id\":1,\"last_seq\":0}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":\"end \"}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":\"a-type-name-that-is-much-longer-than-any-buffer-for-types\"}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":1}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":null}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":[\"end\"]}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":{\"a\":1}}", PROTO_E_BAD_TYPE);
    CHECK("{\"type\":true}", PROTO_E_BAD_TYPE);
    /* a non-string type whose value is not even valid JSON is bad_json */
    CHECK("{\"type\":[1,}", PROTO_E_BAD_JSON);
}

static void test_missing_field(void **state) {
    (void)state;
    static const char *const names[] = {"protocol", "run", "layers", "heads", "seq_len"};
    static const char *const values[] = {"1", "\"r\"", "2", "3", "4"};
    for (int skip = 0; skip < 5; skip++) {
        char line[256];
        int n = sprintf(line, "{\"type\":\"hello\"");
        for (int i = 0; i < 5; i++)
            if (i != skip) n += sprintf(line + n, ",\"%s\":%s", names[i], values[i]);
        strcpy(line + n, "}");
        CHECK(line, PROTO_E_MISSING_FIELD);
        if (!strstr(errbuf, names[skip])) fail_msg("message \"%s\" does not name %s", errbuf, names[skip]);
    }
    CHECK("{\"type\":\"step\",\"step\":1}", PROTO_E_MISSING_FIELD);
    assert_non_null(strstr(errbuf, "seq"));
    CHECK("{\"type\":\"step\",\"seq\":1}", PROTO_E_MISSING_FIELD);
    assert_non_null(strstr(errbuf, "step"));
    CHECK("{\"type\":\"step\",\"seq\":1,\"scalars\":{\"a\":1}}", PROTO_E_MISSING_FIELD);
    CHECK("{\"type\":\"event\",\"level\":\"info\",\"text\":\"t\"}", PROTO_E_MISSING_FIELD);
    CHECK("{\"type\":\"event\",\"seq\":1,\"text\":\"t\"}", PROTO_E_MISSING_FIELD);
    assert_non_null(strstr(errbuf, "level"));
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\"}", PROTO_E_MISSING_FIELD);
    assert_non_null(strstr(errbuf, "text"));
    CHECK("{\"type\":\"end\",\"status\":\"failed\"}", PROTO_E_MISSING_FIELD);
    CHECK("{\"type\":\"end\",\"seq\":1}", PROTO_E_MISSING_FIELD);
    assert_non_null(strstr(errbuf, "status"));
    CHECK("{\"type\":\"end\"}", PROTO_E_MISSING_FIELD);
}

#define STEP_PRE "{\"type\":\"step\",\"seq\":1,\"step\":0,"

static void test_bad_field(void **state) {
    (void)state;
    /* seq and step */
    static const char *const bad_seq[] = {
        "0", "-1", "1.5", "1.0", "1e2", "\"1\"", "null", "true", "[1]", "9007199254740993", "1e300"};
    for (size_t i = 0; i < sizeof bad_seq / sizeof *bad_seq; i++) {
        char line[160];
        snprintf(line, sizeof line, "{\"type\":\"end\",\"seq\":%s,\"status\":\"failed\"}", bad_seq[i]);
        CHECK(line, PROTO_E_BAD_FIELD);
        snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":1,\"step\":%s}",
                 bad_seq[i][0] == '0' ? "-1" : bad_seq[i]);
        CHECK(line, PROTO_E_BAD_FIELD);
    }
    CHECK("{\"type\":\"end\",\"seq\":9007199254740992,\"status\":\"failed\"}", PROTO_OK);
    CHECK("{\"type\":\"end\",\"seq\":9223372036854775808,\"status\":\"failed\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"end\",\"seq\":123456789012345678901234567890,\"status\":\"failed\"}", PROTO_E_BAD_FIELD);
    {
        struct proto_msg m;
        assert_int_equal(parse("{\"type\":\"end\",\"seq\":9007199254740992,\"status\":\"failed\"}", &m), PROTO_OK);
        assert_int_equal(m.seq, INT64_C(9007199254740992));
        proto_msg_free(&m);
        assert_int_equal(
            parse(
                "{\"type\":\"hello\",\"protocol\":1,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1099511627776}",
                &m),
            PROTO_OK);
        assert_int_equal(m.seq_len, INT64_C(1) << 40);
        proto_msg_free(&m);
    }
    CHECK("{\"type\":\"step\",\"seq\":1,\"step\":-0}", PROTO_OK); /* -0 is 0 */
    CHECK("{\"type\":\"step\",\"seq\":1,\"step\":-5}", PROTO_E_BAD_FIELD);
    /* time */
    CHECK(STEP_PRE "\"time\":\"now\"}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"time\":null}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"time\":-1}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"time\":1e12}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"time\":0}", PROTO_OK);
    /* hello dimensions */
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":0,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":5000,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":4097,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":-3,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":2.5,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":\"2\",\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":0,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":4097,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":2048,\"heads\":1024,\"seq_len\":1}", PROTO_E_BAD_FIELD); /* 2^21 cells */
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":4096,\"heads\":4096,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":0}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":-1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":{\"a\":[1]},\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":{},\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":3}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":3}", PROTO_E_BAD_FIELD);
}

static void test_bad_field_names(void **state) {
    (void)state;
    /* run names */
    static const char *const bad_runs[] = {"",         "a b", "a/b", "a\\\\b", "a\\\"b", "caf\xc3\xa9",
                                           "a\\u0009", "a,b", "a#b", "[x]"};
    for (size_t i = 0; i < sizeof bad_runs / sizeof *bad_runs; i++) {
        char *line = fmt_line(HELLO_PRE "\"run\":\"%s\",\"layers\":1,\"heads\":1,\"seq_len\":1}", bad_runs[i]);
        CHECK(line, PROTO_E_BAD_FIELD);
        free(line);
    }
    CHECK(HELLO_PRE "\"run\":1,\"layers\":1,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":null,\"layers\":1,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_FIELD);
    char *name = rep('a', PROTO_MAX_RUN);
    char *line = fmt_line(HELLO_PRE "\"run\":\"%s\",\"layers\":1,\"heads\":1,\"seq_len\":1}", name);
    struct proto_msg m;
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_int_equal(strlen(m.run), PROTO_MAX_RUN);
    proto_msg_free(&m);
    free(line);
    free(name);
    name = rep('a', PROTO_MAX_RUN + 1);
    line = fmt_line(HELLO_PRE "\"run\":\"%s\",\"layers\":1,\"heads\":1,\"seq_len\":1}", name);
    CHECK(line, PROTO_E_BAD_FIELD);
    free(line);
    free(name);
    /* escaped, a 128-byte name is 128 bytes: decoded length counts */
    name = malloc(PROTO_MAX_RUN * 6 + 1);
    for (int i = 0; i < PROTO_MAX_RUN; i++) memcpy(name + 6 * i, "\\u0061", 6);
    name[PROTO_MAX_RUN * 6] = 0;
    line = fmt_line(HELLO_PRE "\"run\":\"%s\",\"layers\":1,\"heads\":1,\"seq_len\":1}", name);
    CHECK(line, PROTO_OK);
    free(line);
    free(name);

    /* metric names */
    static const char *const bad_names[] = {"", "a b", "a/b", "a@b", "a+b", "\\u00e9", "a\\n"};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
        line = fmt_line(STEP_PRE "\"scalars\":{\"%s\":1}}", bad_names[i]);
        CHECK(line, PROTO_E_BAD_FIELD);
        free(line);
        line = fmt_line(STEP_PRE "\"heads\":{\"%s\":[[1]]}}", bad_names[i]);
        CHECK(line, PROTO_E_BAD_FIELD);
        free(line);
    }
    name = rep('m', PROTO_MAX_NAME);
    line = fmt_line(STEP_PRE "\"layers\":{\"%s\":[1]}}", name);
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_string_equal(m.metrics[0].name, name);
    proto_msg_free(&m);
    free(line);
    free(name);
    name = rep('m', PROTO_MAX_NAME + 1);
    line = fmt_line(STEP_PRE "\"layers\":{\"%s\":[1]}}", name);
    CHECK(line, PROTO_E_BAD_FIELD);
    free(line);
    free(name);
}

static void test_bad_field_metrics(void **state) {
    (void)state;
    struct proto_msg m;
    /* duplicates, within a kind and across kinds */
    CHECK(STEP_PRE "\"scalars\":{\"a\":1,\"a\":2}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":{\"a\":1},\"layers\":{\"a\":[2]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":{\"a\":[1]},\"heads\":{\"a\":[[2]]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":{\"a\":1,\"b\":2,\"A\":3}}", PROTO_OK); /* case matters */
    /* at most 256 metrics per kind */
    for (int kind = 0; kind < 3; kind++) {
        for (int count = PROTO_MAX_METRICS; count <= PROTO_MAX_METRICS + 1; count++) {
            char *buf = malloc(20000);
            int n = sprintf(buf, STEP_PRE "\"%s\":{", kind == 0 ? "scalars" : kind == 1 ? "layers" : "heads");
            for (int i = 0; i < count; i++)
                n += sprintf(buf + n, "%s\"m%d\":%s", i ? "," : "", i, kind == 0 ? "1" : kind == 1 ? "[1]" : "[[1]]");
            strcpy(buf + n, "}}");
            assert_int_equal(parse(buf, &m), count <= PROTO_MAX_METRICS ? PROTO_OK : PROTO_E_BAD_FIELD);
            if (count <= PROTO_MAX_METRICS) assert_int_equal(m.nmetrics, count);
            proto_msg_free(&m);
            free(buf);
        }
    }
    /* 256 of each kind in one step is fine: the limit is per kind */
    {
        char *buf = malloc(60000);
        int n = sprintf(buf, STEP_PRE);
        static const char *const kinds[] = {"scalars", "layers", "heads"}, *const vals[] = {"1", "[1]", "[[1]]"};
        for (int k = 0; k < 3; k++) {
            n += sprintf(buf + n, "%s\"%s\":{", k ? "," : "", kinds[k]);
            for (int i = 0; i < PROTO_MAX_METRICS; i++)
                n += sprintf(buf + n, "%s\"k%d_%d\":%s", i ? "," : "", k, i, vals[k]);
            buf[n++] = '}';
        }
        strcpy(buf + n, "}");
        assert_int_equal(parse(buf, &m), PROTO_OK);
        assert_int_equal(m.nmetrics, 3 * PROTO_MAX_METRICS);
        check_msg_invariants(&m);
        proto_msg_free(&m);
        free(buf);
    }
    /* metric containers and values of the wrong type */
    CHECK(STEP_PRE "\"scalars\":[1]}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":1}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":null}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":[1]}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":\"x\"}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":{\"a\":\"1\"}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":{\"a\":true}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":{\"a\":[1]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"scalars\":{\"a\":{}}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":{\"a\":1}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":{\"a\":[[1]]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":{\"a\":[1,\"2\"]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"layers\":{\"a\":[1,false]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":{\"a\":[1,2]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":{\"a\":[[1],2]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":{\"a\":[[[1]]]}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":{\"a\":{\"b\":[1]}}}", PROTO_E_BAD_FIELD);
    CHECK(STEP_PRE "\"heads\":{\"a\":null}}", PROTO_E_BAD_FIELD);
}

static void test_bad_field_events(void **state) {
    (void)state;
    struct proto_msg m;
    char *line;
    /* event and end fields */
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"debug\",\"text\":\"t\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"INFO\",\"text\":\"t\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":0,\"text\":\"t\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"an-absurdly-long-level-name-beyond-any-buffer\",\"text\":\"t\"}",
          PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":5}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":null}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"live\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"stale\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":\"done\"}", PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"end\",\"seq\":1,\"status\":1}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":[]}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":\"{}\"}", PROTO_E_BAD_FIELD);
    CHECK(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"token\":1}", PROTO_E_BAD_FIELD);
    /* token: at most 256 bytes */
    char *text = rep('k', 256);
    line = fmt_line(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"token\":\"%s\"}", text);
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_string_equal(m.token, text);
    proto_msg_free(&m);
    free(line);
    free(text);
    text = rep('k', 257);
    line = fmt_line(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"token\":\"%s\"}", text);
    CHECK(line, PROTO_E_BAD_FIELD);
    free(line);
    free(text);
    /* event text: 64 KiB is the limit, counted decoded */
    text = rep('t', PROTO_MAX_TEXT);
    line = fmt_line("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"%s\"}", text);
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_int_equal(strlen(m.text), PROTO_MAX_TEXT);
    proto_msg_free(&m);
    free(line);
    free(text);
    text = rep('t', PROTO_MAX_TEXT + 1);
    line = fmt_line("{\"type\":\"event\",\"seq\":1,\"level\":\"info\",\"text\":\"%s\"}", text);
    CHECK(line, PROTO_E_BAD_FIELD);
    free(line);
    free(text);
    /* meta: at most 1 MiB of JSON text */
    text = rep('x', PROTO_MAX_META - 8);
    line = fmt_line(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":{\"a\":\"%s\"}}", text);
    assert_int_equal(parse(line, &m), PROTO_OK);
    assert_int_equal(strlen(m.meta), PROTO_MAX_META);
    proto_msg_free(&m);
    free(line);
    free(text);
    text = rep('x', PROTO_MAX_META - 7);
    line = fmt_line(HELLO_PRE "\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1,\"meta\":{\"a\":\"%s\"}}", text);
    CHECK(line, PROTO_E_BAD_FIELD);
    free(line);
    free(text);
    /* an over-long literal the fast path cannot take is refused, not cut */
    text = rep('1', 600);
    line = fmt_line(STEP_PRE "\"scalars\":{\"a\":%s}}", text);
    CHECK(line, PROTO_E_BAD_FIELD);
    free(line);
    free(text);
}

static void test_bad_shape_and_protocol(void **state) {
    (void)state;
    CHECK(STEP_PRE "\"heads\":{\"a\":[[1,2],[3]]}}", PROTO_E_BAD_SHAPE);
    CHECK(STEP_PRE "\"heads\":{\"a\":[[1],[2,3]]}}", PROTO_E_BAD_SHAPE);
    CHECK(STEP_PRE "\"heads\":{\"a\":[[1,2],[3,4],[]]}}", PROTO_E_BAD_SHAPE);
    CHECK(STEP_PRE "\"heads\":{\"a\":[[],[null]]}}", PROTO_E_BAD_SHAPE);
    CHECK(STEP_PRE "\"heads\":{\"a\":[[1,2],[3,4]],\"b\":[[1],[2],[3]]}}", PROTO_OK); /* shapes may differ per metric */
    CHECK(HELLO_PRE "\"protocol\":2,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}", PROTO_E_BAD_PROTOCOL);
    CHECK("{\"type\":\"hello\",\"protocol\":2,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}",
          PROTO_E_BAD_PROTOCOL);
    CHECK("{\"type\":\"hello\",\"protocol\":0,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}",
          PROTO_E_BAD_PROTOCOL);
    CHECK("{\"type\":\"hello\",\"protocol\":-1,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}",
          PROTO_E_BAD_PROTOCOL);
    CHECK("{\"type\":\"hello\",\"protocol\":100000,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}",
          PROTO_E_BAD_PROTOCOL);
    CHECK("{\"type\":\"hello\",\"protocol\":2}", PROTO_E_BAD_PROTOCOL); /* the version is judged first */
    CHECK("{\"type\":\"hello\",\"protocol\":\"1\",\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}",
          PROTO_E_BAD_FIELD);
    CHECK("{\"type\":\"hello\",\"protocol\":1.5,\"run\":\"r\",\"layers\":1,\"heads\":1,\"seq_len\":1}",
          PROTO_E_BAD_FIELD);
}

static void test_seq_reported_on_error(void **state) {
    (void)state;
    struct proto_msg m;
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":7,\"step\":-1}", &m), PROTO_E_BAD_FIELD);
    assert_int_equal(m.has_seq, 1);
    assert_int_equal(m.seq, 7);
    proto_msg_free(&m);
    assert_int_equal(parse("{\"seq\":9,\"type\":\"bogus\"}", &m), PROTO_E_BAD_TYPE);
    assert_true(m.has_seq && m.seq == 9);
    proto_msg_free(&m);
    assert_int_equal(parse("{\"seq\":11}", &m), PROTO_E_BAD_TYPE);
    assert_true(m.has_seq && m.seq == 11);
    proto_msg_free(&m);
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":12}", &m), PROTO_E_MISSING_FIELD);
    assert_true(m.has_seq && m.seq == 12);
    proto_msg_free(&m);
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":13,\"step\":1,\"heads\":{\"a\":[[1],[1,2]]}}", &m),
                     PROTO_E_BAD_SHAPE);
    assert_true(m.has_seq && m.seq == 13);
    proto_msg_free(&m);
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":14,\"step\":1,\"scalars\":{\"a\":1} garbage", &m),
                     PROTO_E_BAD_JSON);
    assert_true(m.has_seq && m.seq == 14);
    proto_msg_free(&m);
    assert_int_equal(parse("{\"type\":\"end\",\"seq\":15,\"status\":\"failed\"} x", &m), PROTO_E_BAD_JSON);
    assert_true(m.has_seq && m.seq == 15);
    proto_msg_free(&m);
    /* an error before seq was read: no seq */
    assert_int_equal(parse("{\"type\":\"step\",\"step\":-1,\"seq\":7}", &m), PROTO_E_BAD_FIELD);
    assert_int_equal(m.has_seq, 0);
    proto_msg_free(&m);
    /* a bad seq is not a readable seq */
    assert_int_equal(parse("{\"type\":\"step\",\"seq\":0,\"step\":1}", &m), PROTO_E_BAD_FIELD);
    assert_int_equal(m.has_seq, 0);
    proto_msg_free(&m);
}

static void test_err_buffer(void **state) {
    (void)state;
    struct proto_msg m = {0};
    const char *line = "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"} trailing garbage here";
    char small[8];
    memset(small, 'Z', sizeof small);
    assert_int_equal(proto_parse(line, strlen(line), &m, small, sizeof small), PROTO_E_BAD_JSON);
    assert_true(memchr(small, 0, sizeof small) != NULL);
    proto_msg_free(&m);
    char one[1] = {'Z'};
    assert_int_equal(proto_parse(line, strlen(line), &m, one, 1), PROTO_E_BAD_JSON);
    assert_int_equal(one[0], 0);
    proto_msg_free(&m);
    /* errlen 0: nothing written */
    char none[1] = {'Z'};
    assert_int_equal(proto_parse(line, strlen(line), &m, none, 0), PROTO_E_BAD_JSON);
    assert_int_equal(none[0], 'Z');
    proto_msg_free(&m);
    /* success clears the buffer */
    strcpy(errbuf, "stale");
    assert_int_equal(proto_parse(line, 40, &m, errbuf, sizeof errbuf), PROTO_OK);
    assert_string_equal(errbuf, "");
    proto_msg_free(&m);
    /* error names */
    static const char *const names[] = {
        "ok",           "line_too_long", "bad_json",        "bad_type",      "missing_field", "bad_field", "bad_shape",
        "bad_protocol", "no_hello",      "shape_mismatch",  "kind_conflict", "seq_gap",       "duplicate", "run_ended",
        "unauthorized", "superseded",    "too_many_errors", "internal",      "db_failing"};
    assert_int_equal(sizeof names / sizeof *names, PROTO_E_COUNT);
    for (int i = 0; i < PROTO_E_COUNT; i++) assert_string_equal(proto_err_name(i), names[i]);
    assert_string_equal(proto_err_name(-1), "internal");
    assert_string_equal(proto_err_name(PROTO_E_COUNT), "internal");
    assert_string_equal(proto_level_name(7), "info");
    assert_string_equal(proto_status_name(-2), "live");
}

/* ------------------------------------------------------------ guard page */

static const char *const valid_lines[] = {
    "{\"type\":\"hello\",\"protocol\":1,\"run\":\"run-1\",\"layers\":2,\"heads\":2,\"seq_len\":64,\"meta\":{\"a\":[1,{\"b\":\"c\\u00e9\"}],\"t\":true,\"f\":false,\"n\":null},\"token\":\"tok\"}",
    "{\"type\":\"step\",\"seq\":12,\"step\":340,\"time\":1764500000.25,\"scalars\":{\"loss\":2.31,\"lr\":1e-3,\"x\":null,\"y\":-0.5E+2},"
    "\"layers\":{\"rank_ratio\":[0.9,null]},\"heads\":{\"entropy\":[[1.2,1.3],[0.4,null]],\"m\":[[1,2],[3,4]]},\"extra\":[\"\\ud83d\\ude00\"]}",
    "{\"type\":\"event\",\"seq\":3,\"level\":\"warn\",\"text\":\"a\\\"b\\\\c\\u20ac\xe2\x82\xac\xf0\x9f\x98\x80\\n\",\"time\":5}",
    "{\"type\":\"end\",\"seq\":4,\"status\":\"aborted\"}\r",
    "{ \"type\" : \"end\" , \"seq\" : 4 , \"status\" : \"finished\" }",
};

static void test_guard_page(void **state) {
    (void)state;
    /* three pages: the first and the last inaccessible, so reads before a
     * line that starts on the middle page's first byte crash too */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *base = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(base != MAP_FAILED);
    assert_int_equal(mprotect(base, page, PROT_NONE), 0);
    assert_int_equal(mprotect(base + 2 * page, page, PROT_NONE), 0);
    char *front = base + page, *guard = base + 2 * page;
    size_t tested = 0;
    for (size_t i = 0; i < sizeof valid_lines / sizeof *valid_lines; i++) {
        size_t len = strlen(valid_lines[i]);
        assert_true(len <= page);
        /* the whole line parses, and so does each prefix (mostly errors) */
        for (size_t cut = 0; cut <= len; cut++) {
            char *p = guard - cut;
            memcpy(p, valid_lines[i], cut);
            struct proto_msg m = {0};
            int rc = proto_parse(p, cut, &m, errbuf, sizeof errbuf);
            if (cut == len && rc != PROTO_OK) fail_msg("line %zu: %s (%s)", i, proto_err_name(rc), errbuf);
            assert_true(rc >= PROTO_OK && rc <= PROTO_E_BAD_PROTOCOL);
            if (rc == PROTO_OK) check_msg_invariants(&m); /* (a prefix without the final '\r') */
            proto_msg_free(&m);
            /* the same prefix starting right after the front guard */
            memmove(front, guard - cut, cut);
            rc = proto_parse(front, cut, &m, errbuf, sizeof errbuf);
            assert_true(rc >= PROTO_OK && rc <= PROTO_E_BAD_PROTOCOL);
            proto_msg_free(&m);
            tested++;
        }
        /* and each suffix, which starts mid-token */
        for (size_t skip = 1; skip < len; skip++) {
            char *p = guard - (len - skip);
            memcpy(p, valid_lines[i] + skip, len - skip);
            struct proto_msg m = {0};
            int rc = proto_parse(p, len - skip, &m, errbuf, sizeof errbuf);
            assert_true(rc >= PROTO_OK && rc <= PROTO_E_BAD_PROTOCOL);
            proto_msg_free(&m);
        }
    }
    /* lines that end inside every kind of token */
    static const char *const ends[] = {
        "{\"x\":\"\\",
        "{\"x\":\"\\u",
        "{\"x\":\"\\u0",
        "{\"x\":\"\\u00e",
        "{\"x\":\"\\ud83d",
        "{\"x\":\"\\ud83d\\",
        "{\"x\":\"\\ud83d\\u",
        "{\"x\":\"\\ud83d\\ude0",
        "{\"x\":\"\xc3",
        "{\"x\":\"\xe2\x82",
        "{\"x\":\"\xf0\x9f\x98",
        "{\"x\":t",
        "{\"x\":tru",
        "{\"x\":n",
        "{\"x\":fals",
        "{\"x\":-",
        "{\"x\":1.",
        "{\"x\":1e",
        "{\"x\":1e-",
        "{\"x\":12345678901234567890123",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":nul",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"scalars\":{\"a\":1.5e",
        "{\"type\":\"step\",\"seq\":1,\"step\":0,\"heads\":{\"a\":[[1",
        "\r",
        "{\r",
        "{\"type\":\"end\",\"seq\":1,\"status\":\"failed\"",
        "{\"x\":[[[[[",
        "{\"x\":{\"a\":{\"b\"",
    };
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        size_t len = strlen(ends[i]);
        char *p = guard - len;
        memcpy(p, ends[i], len);
        struct proto_msg m = {0};
        int rc = proto_parse(p, len, &m, errbuf, sizeof errbuf);
        assert_int_equal(rc, PROTO_E_BAD_JSON);
        proto_msg_free(&m);
        memcpy(front, ends[i], len);
        assert_int_equal(proto_parse(front, len, &m, errbuf, sizeof errbuf), PROTO_E_BAD_JSON);
        proto_msg_free(&m);
    }
    /* zero-length lines next to either guard */
    struct proto_msg m = {0};
    assert_int_equal(proto_parse(guard, 0, &m, errbuf, sizeof errbuf), PROTO_E_BAD_JSON);
    proto_msg_free(&m);
    assert_int_equal(proto_parse(front, 0, &m, errbuf, sizeof errbuf), PROTO_E_BAD_JSON);
    proto_msg_free(&m);
    munmap(base, 3 * page);
    assert_true(tested > 500);
}

/* ------------------------------------------------------------ proto_json_string */

static void roundtrip(const char *s, size_t len) {
    char out[4096];
    size_t n = proto_json_string(out, sizeof out, s, len);
    assert_true(n < sizeof out);
    assert_int_equal(strlen(out), n);
    assert_int_equal(out[0], '"');
    assert_int_equal(out[n - 1], '"');
    for (size_t i = 0; i < n; i++) assert_true((unsigned char)out[i] >= 0x20); /* no raw control characters */
    int code;
    char *back = decode_text(out + 1, n - 2, &code);
    if (code != PROTO_OK) fail_msg("escaped %s: %s (%s)", out, proto_err_name(code), errbuf);
    assert_int_equal(strlen(back), len);
    assert_memory_equal(back, s, len);
    free(back);
}

static void test_json_string(void **state) {
    (void)state;
    char out[64];
    assert_int_equal(proto_json_string(out, sizeof out, "", 0), 2);
    assert_string_equal(out, "\"\"");
    const char *esc = "\"a\\\"b\\\\c\\nd\\re\\tf\\u0001g\\u001f\"";
    assert_int_equal(proto_json_string(out, sizeof out, "a\"b\\c\nd\re\tf\x01g\x1f", 14), strlen(esc));
    assert_string_equal(out, esc);
    assert_int_equal(proto_json_string(out, sizeof out, "\xc3\xa9/\x7f", 4), 6);
    assert_string_equal(out, "\"\xc3\xa9/\x7f\"");
    /* bytes that are not UTF-8 become '?' (a lone continuation byte, a
     * truncated sequence, an overlong '/', a surrogate), valid ones stay */
    assert_int_equal(proto_json_string(out, sizeof out,
                                       "a\x80"
                                       "b\xc3",
                                       4),
                     6);
    assert_string_equal(out, "\"a?b?\"");
    assert_int_equal(proto_json_string(out, sizeof out, "\xc0\xaf\xed\xa0\x80\xf0\x9f\x98\x80", 9), 11);
    assert_string_equal(out, "\"?????\xf0\x9f\x98\x80\"");
    /* the body-only form writes the same bytes without the quotes */
    char body[64];
    assert_int_equal(proto_json_escape(body, "q\"\xff\n", 4), 6);
    assert_memory_equal(body, "q\\\"?\\n", 6);
    /* len is honoured: bytes after it are not read */
    assert_int_equal(proto_json_string(out, sizeof out, "abcdef", 3), 5);
    assert_string_equal(out, "\"abc\"");

    /* a small cap: never writes past it, returns the length needed */
    const char *src = "quote\" back\\ nl\n ctl\x02 end";
    size_t need = proto_json_string(NULL, 0, src, strlen(src));
    char full[128];
    assert_int_equal(proto_json_string(full, sizeof full, src, strlen(src)), need);
    for (size_t cap = 0; cap <= need + 1; cap++) {
        char buf[128];
        memset(buf, '#', sizeof buf);
        assert_int_equal(proto_json_string(buf, cap, src, strlen(src)), need);
        for (size_t i = cap; i < sizeof buf; i++) assert_int_equal(buf[i], '#');
        assert_memory_equal(buf, full, cap < need ? cap : need);
        if (cap > need) assert_int_equal(buf[need], 0);
    }

    roundtrip("", 0);
    roundtrip("plain", 5);
    /* every byte 0x01..0x7f */
    char all[128];
    for (int i = 1; i < 128; i++) all[i - 1] = (char)i;
    roundtrip(all, 127);
    /* random valid UTF-8 strings (no NUL: the parser refuses \u0000) */
    for (int iter = 0; iter < 3000; iter++) {
        char s[600];
        size_t n = 0, want = rnd_below(100);
        for (size_t k = 0; k < want; k++) {
            unsigned cp;
            switch (rnd_below(5)) {
            case 0: cp = 1 + rnd_below(0x1f); break;
            case 1: cp = 0x20 + rnd_below(0x60); break;
            case 2: cp = 0x80 + rnd_below(0x780); break;
            case 3:
                cp = 0x800 + rnd_below(0xF800);
                if (cp >= 0xD800 && cp <= 0xDFFF) cp -= 0x800;
                break;
            default: cp = 0x10000 + rnd_below(0x100000); break;
            }
            if (cp < 0x80) s[n++] = (char)cp;
            else if (cp < 0x800) {
                s[n++] = (char)(0xC0 | (cp >> 6));
                s[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                s[n++] = (char)(0xE0 | (cp >> 12));
                s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                s[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                s[n++] = (char)(0xF0 | (cp >> 18));
                s[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                s[n++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        roundtrip(s, n);
    }
}

/* ------------------------------------------------------------ mutations */

static void test_mutations(void **state) {
    (void)state;
    static const char interesting[] = "{}[]\",:\\0123456789eE.-+ntfu \r\n\t\x80\xc3\xed\xf0\xff";
    int outcomes[PROTO_E_COUNT] = {0};
    size_t nlines = sizeof valid_lines / sizeof *valid_lines;
    for (int iter = 0; iter < 20000; iter++) {
        const char *src = valid_lines[rnd_below((unsigned)nlines)];
        size_t len = strlen(src);
        char tmp[1024];
        memcpy(tmp, src, len);
        int nmut = 1 + (int)rnd_below(4);
        for (int k = 0; k < nmut && len > 0; k++) {
            size_t at = rnd_below((unsigned)len);
            switch (rnd_below(6)) {
            case 0: tmp[at] = (char)rnd(); break;
            case 1: tmp[at] = interesting[rnd_below(sizeof interesting - 1)]; break;
            case 2: tmp[at] ^= (char)(1 << rnd_below(8)); break;
            case 3: /* delete a byte */
                memmove(tmp + at, tmp + at + 1, len - at - 1);
                len--;
                break;
            case 4: /* insert a byte */
                if (len + 1 < sizeof tmp) {
                    memmove(tmp + at + 1, tmp + at, len - at);
                    tmp[at] = interesting[rnd_below(sizeof interesting - 1)];
                    len++;
                }
                break;
            default: len = at; break; /* truncate */
            }
        }
        /* an exact-size heap copy, so ASan sees any read past the end */
        char *line = malloc(len ? len : 1);
        assert_non_null(line);
        memcpy(line, tmp, len);
        struct proto_msg m = {0};
        errbuf[0] = 'Z';
        int rc = proto_parse(line, len, &m, errbuf, sizeof errbuf);
        assert_true(rc >= PROTO_OK && rc <= PROTO_E_BAD_PROTOCOL);
        assert_true(memchr(errbuf, 0, sizeof errbuf) != NULL);
        if (rc == PROTO_OK) check_msg_invariants(&m);
        else assert_true(errbuf[0] != 0);
        outcomes[rc]++;
        /* the message can be reused after free */
        proto_msg_free(&m);
        free(line);
    }
    /* the loop reached both sides */
    assert_true(outcomes[PROTO_OK] > 100);
    assert_true(outcomes[PROTO_E_BAD_JSON] > 1000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_all_fields),
        cmocka_unit_test(test_step_all_fields),
        cmocka_unit_test(test_event_and_end),
        cmocka_unit_test(test_unknown_fields_and_crlf),
        cmocka_unit_test(test_number_fixed_literals),
        cmocka_unit_test(test_number_random_literals),
        cmocka_unit_test(test_number_syntax_errors),
        cmocka_unit_test(test_string_escapes),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_line_too_long),
        cmocka_unit_test(test_bad_type),
        cmocka_unit_test(test_missing_field),
        cmocka_unit_test(test_bad_field),
        cmocka_unit_test(test_bad_field_names),
        cmocka_unit_test(test_bad_field_metrics),
        cmocka_unit_test(test_bad_field_events),
        cmocka_unit_test(test_bad_shape_and_protocol),
        cmocka_unit_test(test_seq_reported_on_error),
        cmocka_unit_test(test_err_buffer),
        cmocka_unit_test(test_guard_page),
        cmocka_unit_test(test_json_string),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
