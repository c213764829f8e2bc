/* test_telemetry_frozen.c: a trainer whose daemon is frozen loses nothing.
 *
 * Starts $ENTROPYD (default build/entropyd) on a temporary directory and
 * runs a simulated trainer: each step spins for FROZEN_WORK_US of "compute"
 * (default 1000 µs), then reports a 12 x 12 model's step through
 * telemetry/telemetry.h (8 head metrics, 2 layer metrics, 4 scalars, ~12 KB
 * of JSON). Three phases of FROZEN_STEPS steps each (default 1500): daemon
 * running, daemon stopped with SIGSTOP (its socket buffer fills, the client
 * spools), daemon running again. Checked: no step is dropped from the ring
 * or the spool, the frozen daemon acknowledged nothing new (the phase did
 * exercise the spool), and after SIGCONT every step is acked and stored
 * exactly once. What it costs the trainer in time is a benchmark, not a
 * test: bench/telemetry_frozen.sh. Skipped when the daemon binary is
 * missing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture_telemetry.h"

#define L 12
#define H 12
#define NHEAD 8
#define NLAYER 2

/* env_long, entropyd_path, entropyd_start, rmtree: tests/fixture.h. */

/* Runs n steps from *step, each after work_us of spinning; returns the
 * steps dropped (ring or spool) meanwhile. */
static uint64_t run_phase(telemetry *t, int64_t *step, long n, long work_us) {
    static float heads[H * L], layer[L];
    static const char *hnames[NHEAD] = {"entropy",  "entropy_norm",  "max_attn", "max_logit",
                                        "sigma_qk", "entropy_bound", "rank",     "sink"};
    telemetry_stats s0, s1;
    telemetry_get_stats(t, &s0);
    for (long i = 0; i < n; i++) {
        double t0 = now_mono_ms();
        volatile double x = 0; /* the step's compute */
        while ((now_mono_ms() - t0) * 1e3 < work_us) x += 1;
        for (int k = 0; k < L * H; k++) heads[k] = (float)((*step * 7 + k) % 101) / 10.0f;
        for (int k = 0; k < L; k++) layer[k] = 0.5f + k * 0.01f;
        telemetry_step *s = telemetry_step_begin(t, *step, 0);
        assert_non_null(s);
        telemetry_step_scalar(s, "loss", 3.0 - *step * 1e-4);
        telemetry_step_scalar(s, "lr", 1e-3);
        telemetry_step_scalar(s, "grad_norm", 0.5);
        telemetry_step_scalar(s, "tok_s", 12345);
        telemetry_step_layer(s, "rank_ratio", layer);
        telemetry_step_layer(s, "sigma", layer);
        for (int m = 0; m < NHEAD; m++) telemetry_step_heads(s, hnames[m], heads);
        assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
        (*step)++;
    }
    telemetry_get_stats(t, &s1);
    return (s1.dropped_queue - s0.dropped_queue) + (s1.dropped_spool - s0.dropped_spool);
}

static void test_frozen_daemon_loses_nothing(void **state) {
    if (access(entropyd_path(), X_OK) != 0) skip();
    long steps = env_long("FROZEN_STEPS", 1500), work = env_long("FROZEN_WORK_US", 1000);
    char err[2400];
    struct daemon_client dc;
    if (daemon_client_start(&dc, "/tmp/test_frozen.XXXXXX", "frozen", L, H, err, sizeof err) != 0) fail_msg("%s", err);
    telemetry *t = dc.t;
    pid_t pid = dc.pid;
    int64_t step = 0;
    assert_int_equal(run_phase(t, &step, 200, work), 0); /* connect, fault in */
    assert_int_equal(run_phase(t, &step, steps, work), 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_int_equal(run_phase(t, &step, steps, work), 0);
    telemetry_stats st;
    telemetry_get_stats(t, &st);
    uint64_t acked_frozen = st.acked;
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(run_phase(t, &step, steps, work), 0);
    assert_int_equal(telemetry_flush(t, 60000), 0);
    telemetry_get_stats(t, &st);
    assert_int_equal(st.acked, st.next_seq - 1);
    assert_int_equal(telemetry_destroy(t, "finished", 10000), TELEMETRY_OK);
    /* while frozen the daemon acked nothing new: the phase did exercise the spool */
    assert_true(acked_frozen < (uint64_t)(200 + 2 * steps));
    /* every step stored once */
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    sqlite3 *h;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open_v2(dc.db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(
        sqlite3_prepare_v2(h, "SELECT count(*), count(DISTINCT step), min(step), max(step) FROM steps", -1, &s, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(s, 0), step);
    assert_int_equal(sqlite3_column_int64(s, 1), step);
    assert_int_equal(sqlite3_column_int64(s, 2), 0);
    assert_int_equal(sqlite3_column_int64(s, 3), step - 1);
    sqlite3_finalize(s);
    sqlite3_close(h);
    assert_int_equal(rmtree(dc.dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_frozen_daemon_loses_nothing)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
