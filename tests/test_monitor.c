/* test_monitor.c: the trainer's reading of the daemon's alert lines
 * (trainer/monitor.h). Only FIRING transitions are acted on. After a
 * rollback to step C, a FIRING the daemon evaluated on a step sent before
 * the rollback (its step_time before the mark) whose condition began after
 * C is about abandoned steps and is passed over; one that began at or
 * before C is kept (the daemon keeps it firing and will not send it again),
 * and so is any FIRING on a step sent after the rollback. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "monitor.h"

/* An alert line as entropyd writes it; step_time < 0: none. The stamp goes
 * through the protocol's %.6f, as the trainer sends it. */
static const char *line(char *buf, size_t cap, const char *transition, long start, double step_time) {
    char at[64] = "";
    if (step_time >= 0) snprintf(at, sizeof at, ",\"step_time\":%.6f", step_time);
    snprintf(buf, cap,
             "{\"type\":\"alert\",\"transition\":\"%s\",\"rule\":\"entropy_collapse\",\"severity\":\"critical\","
             "\"start_step\":%ld,\"step\":%ld%s,\"alert\":{\"status\":\"firing\"}}",
             transition, start, start + 20, at);
    return buf;
}

static void test_firing_only(void **state) {
    (void)state;
    char b[512];
    monitor_alert al;
    memset(&al, 0, sizeof al);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, 1000.5), NULL, &al), 1);
    assert_string_equal(al.rule, "entropy_collapse");
    assert_int_equal(al.start_step, 28);
    assert_int_equal(al.step, 48);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "update", 28, 1000.5), NULL, &al), 0);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "resolved", 28, 1000.5), NULL, &al), 0);
    assert_int_equal(monitor_alert_parse("{\"type\":\"alert\",\"transition\":\"firing\"", NULL, &al), 0);
    assert_int_equal(monitor_alert_parse("{\"type\":\"alert\",\"transition\":\"firing\",\"rule\":1}", NULL, &al), 0);
}

static void test_after_rollback(void **state) {
    (void)state;
    char b[512];
    monitor_alert al;
    /* the last step before the rollback was stamped T; the next is stamped
     * T + 2 us at the earliest; the run went back to step 20 */
    const double T = 1796055489.7678954;
    monitor_rewind rw = monitor_rewind_after(T, 20);
    /* began at 28 > 20, evaluated on a step sent before: abandoned */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, T), &rw, &al), 0);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, T - 0.5), &rw, &al), 0);
    /* the same on the first step sent after the rollback: the new branch */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, T + 2e-6), &rw, &al), 1);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, T + 3.0), &rw, &al), 1);
    /* began at or before 20: about steps the run kept, acted on */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 20, T - 0.5), &rw, &al), 1);
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 12, T), &rw, &al), 1);
    /* no step_time (a daemon that does not send it, or a clock-driven rule): kept */
    assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, -1), &rw, &al), 1);
    /* the boundary holds wherever T falls within its microsecond */
    for (int i = 0; i < 1000; i++) {
        double t = 1796055489.0 + i * 0.0001234567;
        monitor_rewind r2 = monitor_rewind_after(t, 20);
        assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, t), &r2, &al), 0);
        assert_int_equal(monitor_alert_parse(line(b, sizeof b, "firing", 28, t + 2e-6), &r2, &al), 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_firing_only),
        cmocka_unit_test(test_after_rollback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
