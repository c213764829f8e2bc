/* test_monitor.c: the trainer's reading of the daemon's alert lines
 * (trainer/monitor.h, monitor_alert_parse). Only FIRING transitions are
 * acted on; after a rollback, a FIRING the daemon evaluated on a step sent
 * before it (its step_time earlier than the rollback) is a verdict on the
 * abandoned branch and is passed over, while one on a later step is kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "monitor.h"

static const char *line(char *buf, size_t cap, const char *transition, double step_time) {
    char at[64] = "";
    if (step_time > 0) snprintf(at, sizeof at, ",\"step_time\":%.6f", step_time);
    snprintf(buf, cap,
             "{\"type\":\"alert\",\"transition\":\"%s\",\"rule\":\"entropy_collapse\",\"severity\":\"critical\","
             "\"start_step\":28,\"step\":48%s,\"alert\":{\"status\":\"firing\"}}",
             transition, at);
    return buf;
}

static void test_firing_only(void **state) {
    (void)state;
    char b[512];
    monitor_alert al;
    memset(&al, 0, sizeof al);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 1000.5), 0, &al), 1);
    assert_string_equal(al.rule, "entropy_collapse");
    assert_int_equal(al.start_step, 28);
    assert_int_equal(al.step, 48);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "update", 1000.5), 0, &al), 0);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "resolved", 1000.5), 0, &al), 0);
    assert_int_equal(monitor_alert_parse("{\"type\":\"alert\",\"transition\":\"firing\"", 0, &al), 0);
    assert_int_equal(monitor_alert_parse("{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":1}", 0, &al), 0);
}

static void test_stale_after_rollback(void **state) {
    (void)state;
    char b[512];
    monitor_alert al;
    double rewound_at = 2000.0;
    /* evaluated on a step stamped before the rollback: abandoned branch */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 1999.999999), rewound_at, &al), 0);
    /* on a step stamped after it: the new branch */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 2000.000001), rewound_at, &al), 1);
    /* no step_time (a daemon that does not send it, or a clock-driven rule): kept */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 0), rewound_at, &al), 1);
    /* no rollback yet: every FIRING counts */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 5.0), 0, &al), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_firing_only),
        cmocka_unit_test(test_stale_after_rollback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
