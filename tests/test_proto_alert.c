/* test_proto_alert.c: unit tests of the alert line (proto.h): the writer
 * gives the bytes the daemon's cJSON-built line gave (integers, stamps of
 * 15 and 17 digits, escaped names), a step_time reads back bit for bit,
 * proto_parse_alert and proto_parse_reply read back every field, lines
 * lacking a required field are refused, and proto_alert_max bounds the
 * longest line (each buffer is allocated at exactly that size). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

/* The line as the daemon's alerter built it before proto_write_alert. */
static char *cjson_line(const struct proto_alert_view *v) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "alert");
    cJSON_AddStringToObject(o, "transition", v->transition);
    cJSON_AddStringToObject(o, "rule", v->rule);
    cJSON_AddStringToObject(o, "severity", v->severity);
    cJSON_AddNumberToObject(o, "start_step", (double)v->start_step);
    cJSON_AddNumberToObject(o, "step", (double)v->step);
    if (isfinite(v->step_time)) cJSON_AddNumberToObject(o, "step_time", v->step_time);
    cJSON_AddRawToObject(o, "alert", v->alert);
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return line;
}

/* proto_write_alert into a buffer of exactly proto_alert_max bytes. */
static char *write_line(const struct proto_alert_view *v) {
    size_t max = proto_alert_max(v);
    char *out = malloc(max);
    assert_non_null(out);
    size_t n = proto_write_alert(out, v);
    assert_true(n + 1 <= max);
    assert_int_equal(strlen(out), n);
    return out;
}

/* The step_time cJSON wrote in line, or NAN when there is none. */
static double stamp_of(const char *line) {
    const char *p = strstr(line, "\"step_time\":");
    return p ? strtod(p + 12, NULL) : NAN;
}

static const char *ALERT_OBJ = "{\"labels\":{\"alertname\":\"entropy_collapse\",\"run\":\"r1\"},\"status\":\"firing\","
                               "\"cells\":[{\"layer\":0,\"head\":1,\"value\":0.03}]}";

static void test_same_bytes_as_cjson(void **state) {
    (void)state;
    const char *rules[] = {"entropy_collapse",   "loss_nonfinite", "quote\"back\\slash",
                           "new\nline\ttab\rcr", "ctl\x01\x1f",    "utf8 \xc3\xa9\xe2\x82\xac"};
    const int64_t steps[] = {0, 1, 100, 2147483647, 2147483648ll, 123456789012ll, -5};
    const double stamps[] = {NAN, 0, 1764500000, 1764500000.5, 1764500000.123456, 0.1, 1e-7, -3.25, 2147483648.0};
    int lines = 0;
    for (size_t r = 0; r < sizeof rules / sizeof *rules; r++)
        for (size_t s = 0; s < sizeof steps / sizeof *steps; s++)
            for (size_t t = 0; t < sizeof stamps / sizeof *stamps; t++) {
                struct proto_alert_view v = {.transition = t % 3 == 0   ? "firing"
                                                           : t % 3 == 1 ? "update"
                                                                        : "resolved",
                                             .rule = rules[r],
                                             .severity = s % 2 ? "critical" : "warn\"ing",
                                             .start_step = steps[s] / 2,
                                             .step = steps[s],
                                             .step_time = stamps[t],
                                             .alert = ALERT_OBJ};
                char *want = cjson_line(&v), *got = write_line(&v);
                if (strcmp(want, got)) fail_msg("cJSON:  %s\nproto:  %s", want, got);
                free(want);
                free(got);
                lines++;
            }
    assert_int_equal(lines, 6 * 7 * 9);
}

/* Random stamps: the same bytes as cJSON wherever cJSON's stamp reads back
 * as the stamp; where it does not (cJSON takes 15 digits within an epsilon)
 * ours does, and the lines differ in the stamp alone. */
static void test_stamps_read_back_exactly(void **state) {
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int inexact = 0;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double d = i % 2 ? 1.7e9 + (double)(x >> 11) / (double)(1ull << 53) * 1e8 /* Unix times with fractions */
                         : ldexp((double)(x >> 11), (int)(x % 80) - 90);
        struct proto_alert_view v = {.transition = "firing",
                                     .rule = "entropy_collapse",
                                     .severity = "critical",
                                     .start_step = i,
                                     .step = i + 3,
                                     .step_time = d,
                                     .alert = "{}"};
        char *want = cjson_line(&v), *got = write_line(&v);
        assert_true(stamp_of(got) == d);
        if (strcmp(want, got)) {
            assert_true(stamp_of(want) != d);
            inexact++;
            char *a = strstr(want, ",\"alert\":"), *b = strstr(got, ",\"alert\":");
            assert_string_equal(a, b);
            assert_memory_equal(want, got, (size_t)(strstr(want, "\"step_time\"") - want));
        }
        free(want);
        free(got);
    }
    print_message("stamps cJSON wrote inexactly (ours exact): %d of 20000\n", inexact);
}

static void test_roundtrip(void **state) {
    (void)state;
    struct proto_alert_view v = {.transition = "resolved",
                                 .rule = "collapse_risk \"short\"",
                                 .severity = "critical",
                                 .start_step = 80,
                                 .step = 123456789012ll,
                                 .step_time = 1764500000.1234567,
                                 .alert = ALERT_OBJ};
    char *line = write_line(&v);
    struct proto_alert a;
    assert_int_equal(proto_parse_alert(line, strlen(line), &a), 0);
    assert_string_equal(a.transition, "resolved");
    assert_string_equal(a.rule, "collapse_risk \"short\"");
    assert_string_equal(a.severity, "critical");
    assert_int_equal(a.start_step, 80);
    assert_int_equal(a.step, 123456789012ll);
    assert_true(a.has_step_time && a.step_time == v.step_time);
    struct proto_reply r;
    assert_int_equal(proto_parse_reply(line, strlen(line), &r), 0);
    assert_int_equal(r.type, PROTO_R_ALERT);
    assert_memory_equal(&r.alert, &a, sizeof a);
    free(line);
    /* no step_time: omitted, and read as absent */
    v.step_time = NAN;
    line = write_line(&v);
    assert_null(strstr(line, "step_time"));
    assert_int_equal(proto_parse_alert(line, strlen(line), &a), 0);
    assert_false(a.has_step_time);
    free(line);
}

static void test_refused(void **state) {
    (void)state;
    const char *bad[] = {
        "{\"type\":\"alert\",\"rule\":\"r\",\"start_step\":1,\"step\":2}",                /* transition */
        "{\"type\":\"alert\",\"transition\":\"firing\",\"start_step\":1,\"step\":2}",     /* rule */
        "{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":\"r\",\"step\":2}",       /* start_step */
        "{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":\"r\",\"start_step\":1}", /* step */
        "{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":\"r\",\"start_step\":\"1\",\"step\":2}", /* a string */
        "{\"type\":\"alert\",\"transition\":1,\"rule\":\"r\",\"start_step\":1,\"step\":2}",
        "{\"type\":\"ack\",\"transition\":\"firing\",\"rule\":\"r\",\"start_step\":1,\"step\":2}",
        "{\"transition\":\"firing\",\"rule\":\"r\",\"start_step\":1,\"step\":2}",
        "[\"alert\"]",
        "{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":\"r\",\"start_step\":1,\"step\":2", /* cut */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct proto_alert a;
        if (proto_parse_alert(bad[i], strlen(bad[i]), &a) == 0) fail_msg("accepted %s", bad[i]);
        assert_string_equal(a.rule, "");
    }
    /* the same refusals through proto_parse_reply: a type it knows, lacking a field */
    struct proto_reply r;
    assert_int_equal(proto_parse_reply(bad[1], strlen(bad[1]), &r), -1);
    assert_int_equal(r.type, PROTO_R_UNKNOWN);
    assert_string_equal(r.type_name, "alert");
    /* the length given is the end: the same line one byte short is cut */
    const char *ok = "{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":\"r\",\"start_step\":1,\"step\":2}";
    struct proto_alert a;
    assert_int_equal(proto_parse_alert(ok, strlen(ok), &a), 0);
    assert_int_equal(proto_parse_alert(ok, strlen(ok) - 1, &a), -1);
}

/* The longest strings (every byte a control character: 6 bytes escaped),
 * and names longer than the parser's arrays, which it truncates. */
static void test_bound_and_truncation(void **state) {
    (void)state;
    char rule[301], sev[201];
    memset(rule, 0x01, sizeof rule - 1);
    rule[sizeof rule - 1] = 0;
    memset(sev, 0x02, sizeof sev - 1);
    sev[sizeof sev - 1] = 0;
    struct proto_alert_view v = {.transition = "firing",
                                 .rule = rule,
                                 .severity = sev,
                                 .start_step = -9000000000000000000ll,
                                 .step = 9000000000000000000ll,
                                 .step_time = -1.2345678901234567e-300,
                                 .alert = "{}"};
    char *line = write_line(&v);
    struct proto_alert a;
    assert_int_equal(proto_parse_alert(line, strlen(line), &a), 0);
    assert_int_equal(strlen(a.rule), PROTO_MAX_RULE);
    assert_int_equal(strlen(a.severity), sizeof a.severity - 1);
    assert_true(a.step_time == v.step_time);
    free(line);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bytes_as_cjson),
        cmocka_unit_test(test_stamps_read_back_exactly),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_bound_and_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
