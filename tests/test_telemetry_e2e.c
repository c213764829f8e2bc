/* test_telemetry_e2e.c -- the telemetry client against the real entropyd.
 *
 * Starts $ENTROPYD (set by scripts/run-tests.sh; default build/entropyd) on a
 * temporary directory, streams steps while the daemon is killed with SIGKILL
 * and restarted twice, and checks in its SQLite database that every step is
 * stored exactly once with the values sent (NaN included); then a run that
 * spooled with no daemon at all is uploaded by a later start. Skipped when
 * the daemon binary is missing. The fake-daemon unit tests live in
 * test_telemetry.c; this file checks that both sides agree on protocol v1.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "fixture_frames.h"
#include "telemetry.h"

enum { L = 4, H = 3 };

/* msleep, rmtree, entropyd_path, entropyd_start: tests/fixture.h. */

typedef struct env {
    char dir[64], data[96], sock[128], addr[160], spool[96], db[128];
    pid_t pid;
    int starts;
} env;

static void env_init(env *e) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/ttel-e2e-XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    snprintf(e->data, sizeof e->data, "%s/data", e->dir);
    snprintf(e->sock, sizeof e->sock, "%s/entropyd.sock", e->data);
    snprintf(e->addr, sizeof e->addr, "unix:%s", e->sock);
    snprintf(e->spool, sizeof e->spool, "%s/spool", e->dir);
    snprintf(e->db, sizeof e->db, "%s/entropyd.db", e->data);
}

/* Starts the daemon (a log file per start) and waits for its socket. */
static void daemon_start(env *e) {
    char log[128], err[2400];
    snprintf(log, sizeof log, "%s/daemon-%d.log", e->dir, e->starts++);
    e->pid = entropyd_start(e->data, e->sock, log, err, sizeof err);
    if (e->pid < 0) {
        e->pid = 0;
        fail_msg("%s", err);
    }
}

static void daemon_kill(env *e, int sig) {
    if (e->pid <= 0) return;
    kill(e->pid, sig);
    waitpid(e->pid, NULL, 0);
    e->pid = 0;
}

static void env_free(env *e) {
    daemon_kill(e, SIGKILL);
    rmtree(e->dir);
}

static telemetry *client(env *e, const char *run) {
    telemetry_config c;
    telemetry_config_init(&c);
    c.address = e->addr;
    c.run = run;
    c.layers = L;
    c.heads = H;
    c.seq_len = 32;
    c.spool_dir = e->spool;
    c.queue_slots = 1024;
    c.backoff_min_ms = 10;
    c.backoff_max_ms = 200;
    c.meta_json = "{\"test\":\"telemetry_e2e\"}";
    char err[256];
    telemetry *t = telemetry_create(&c, err, sizeof err);
    if (!t) fail_msg("telemetry_create: %s", err);
    return t;
}

/* Head values of a step: k/(step+1), with a NaN at k == 5. */
static void head_values(int step, float *v) {
    for (int k = 0; k < L * H; k++) v[k] = (float)k / (float)(step + 1);
    v[5] = NAN;
}

static void put(telemetry *t, int step) {
    float hv[L * H], lv[L] = {1, 2, 3, (float)step};
    head_values(step, hv);
    telemetry_step *s = telemetry_step_begin(t, step, telemetry_now());
    assert_non_null(s);
    assert_int_equal(telemetry_step_scalar(s, "loss", 3.0 - step * 1e-3), TELEMETRY_OK);
    assert_int_equal(telemetry_step_layer(s, "rank_ratio", lv), TELEMETRY_OK);
    assert_int_equal(telemetry_step_heads(s, "entropy", hv), TELEMETRY_OK);
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
}

static long long q1(sqlite3 *db, const char *sql, const char *run) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
    long long v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    return v;
}

/* Every step 0..n-1 stored once, seqs 1..n, and the head values of a few
 * steps exactly as sent. */
static void check_db(env *e, const char *run, int n, const char *status) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(e->db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    shadow_frames(db);
    sqlite3_busy_timeout(db, 5000);
    const char *rid = "(SELECT id FROM runs WHERE name = ?1)";
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE run_id = %s", rid);
    assert_int_equal(q1(db, sql, run), n);
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT seq) FROM steps WHERE run_id = %s", rid);
    assert_int_equal(q1(db, sql, run), n);
    snprintf(sql, sizeof sql, "SELECT max(step) FROM steps WHERE run_id = %s", rid);
    assert_int_equal(q1(db, sql, run), n - 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE run_id = %s AND seq != step + 1", rid);
    assert_int_equal(q1(db, sql, run), 0);
    if (status) {
        sqlite3_stmt *st;
        sqlite3_prepare_v2(db, "SELECT status FROM runs WHERE name = ?1", -1, &st, NULL);
        sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(st, 0), status);
        sqlite3_finalize(st);
    }
    int probe[] = {0, n / 3, n - 1};
    for (int i = 0; i < 3; i++) {
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(db,
                                            "SELECT f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
                                            "JOIN runs r ON r.id = m.run_id "
                                            "WHERE r.name = ?1 AND m.name = 'entropy' AND f.step = ?2",
                                            -1, &st, NULL),
                         SQLITE_OK);
        sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, probe[i]);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_bytes(st, 0), L * H * 4);
        const unsigned char *b = sqlite3_column_blob(st, 0);
        float want[L * H];
        head_values(probe[i], want);
        for (int k = 0; k < L * H; k++) {
            float got;
            memcpy(&got, b + 4 * k, 4); /* little-endian host */
            if (k == 5) assert_true(isnan(got));
            else assert_true(got == want[k]);
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
}

static int have_daemon(void) { return access(entropyd_path(), X_OK) == 0; }

/* The daemon is SIGKILLed twice while steps stream; after each restart the
 * client resumes from the daemon's last_seq. */
static void test_daemon_killed_twice(void **state) {
    if (!have_daemon()) {
        print_message("skipped: no %s\n", entropyd_path());
        skip();
    }
    env e;
    env_init(&e);
    daemon_start(&e);
    telemetry *t = client(&e, "e2e-kill");
    enum { N = 1200 };
    for (int i = 0; i < N; i++) {
        put(t, i);
        if (i == 300 || i == 800) daemon_kill(&e, SIGKILL);
        if (i == 500 || i == 950) daemon_start(&e);
        msleep(2); /* not a wait: paces the steps, so the daemon is down for some of them */
    }
    assert_int_equal(telemetry_destroy(t, "finished", 20000), TELEMETRY_OK);
    check_db(&e, "e2e-kill", N, "finished");
    daemon_kill(&e, SIGTERM);
    env_free(&e);
}

/* No daemon at all while the run trains; the next client process (same run,
 * same spool) finds the daemon up and uploads everything. */
static void test_spool_uploaded_by_next_process(void **state) {
    if (!have_daemon()) {
        print_message("skipped: no %s\n", entropyd_path());
        skip();
    }
    env e;
    env_init(&e);
    telemetry *a = client(&e, "e2e-spool");
    for (int i = 0; i < 300; i++) put(a, i);
    assert_int_equal(telemetry_destroy(a, NULL, 300), TELEMETRY_ETIMEDOUT);
    daemon_start(&e);
    telemetry *b = client(&e, "e2e-spool");
    for (int i = 300; i < 400; i++) put(b, i);
    assert_int_equal(telemetry_destroy(b, "finished", 20000), TELEMETRY_OK);
    check_db(&e, "e2e-spool", 400, "finished");
    daemon_kill(&e, SIGTERM);
    env_free(&e);
}

/* The run's verdict (run_summary), kept by the daemon's alerter. */
static int verdict_is(env *e, const char *run, const char *want) {
    sqlite3 *db;
    int ok = 0;
    if (sqlite3_open_v2(e->db, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return 0;
    }
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT s.verdict FROM run_summary s JOIN runs r ON r.id = s.run_id "
                           "WHERE r.name = ?1",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
        ok = sqlite3_step(st) == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(st, 0), want);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return ok;
}

/* What docs/client.md's C example sends: `entropy` alone, no
 * entropy_norm. Attention that is one-hot (entropy 0 in every head) from
 * step 10 on: the daemon derives entropy_norm, entropy_collapse fires and,
 * once the run has ended, the verdict is `collapsed`. The same run's first
 * ten steps at uniform attention (entropy at its causal maximum) keep it
 * healthy until then. */
static void test_entropy_alone_gets_collapse_detection(void **state) {
    if (!have_daemon()) {
        print_message("skipped: no %s\n", entropyd_path());
        skip();
    }
    env e;
    env_init(&e);
    daemon_start(&e);
    telemetry *t = client(&e, "e2e-onehot");
    assert_int_equal(telemetry_wait_welcome(t, 10000, NULL, 0), TELEMETRY_OK);
    double uniform = 0; /* mean over the 32 causal rows of log(i + 1) */
    for (int i = 0; i < 32; i++) uniform += log(i + 1.0) / 32;
    int fired = 0;
    for (int step = 0; step < 60; step++) {
        float ent[L * H];
        for (int k = 0; k < L * H; k++) ent[k] = step < 10 ? (float)uniform : 0.0f;
        telemetry_step *s = telemetry_step_begin(t, step, telemetry_now());
        assert_non_null(s);
        assert_int_equal(telemetry_step_scalar(s, "loss", 2.0), TELEMETRY_OK);
        assert_int_equal(telemetry_step_heads(s, "entropy", ent), TELEMETRY_OK);
        assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
    }
    assert_int_equal(telemetry_flush(t, 20000), TELEMETRY_OK);
    for (int i = 0; i < 2000 && !fired; i++) { /* the alert comes back to the trainer */
        telemetry_msg m;
        while (telemetry_poll(t, &m)) {
            if (!strcmp(m.type, "alert") && strstr(m.line, "\"entropy_collapse\"")) fired = 1;
            telemetry_msg_free(&m);
        }
        if (!fired) msleep(5);
    }
    assert_true(fired);
    assert_int_equal(telemetry_finish(t, "finished", 20000, NULL), TELEMETRY_OK);
    int collapsed = 0;
    for (int i = 0; i < 2000 && !(collapsed = verdict_is(&e, "e2e-onehot", "collapsed")); i++) msleep(5);
    assert_true(collapsed);
    /* stored beside what was sent: 1 at uniform attention, 0 one-hot */
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(e.db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    shadow_frames(db);
    sqlite3_busy_timeout(db, 5000);
    for (int step = 0; step < 60; step += 59) {
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(db,
                                            "SELECT f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
                                            "JOIN runs r ON r.id = m.run_id "
                                            "WHERE r.name = 'e2e-onehot' AND m.name = 'entropy_norm' AND f.step = ?1",
                                            -1, &st, NULL),
                         SQLITE_OK);
        sqlite3_bind_int(st, 1, step);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_bytes(st, 0), L * H * 4);
        float v;
        memcpy(&v, sqlite3_column_blob(st, 0), 4);
        assert_true(fabsf(v - (step == 0 ? 1.0f : 0.0f)) < 1e-6f);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    daemon_kill(&e, SIGTERM);
    env_free(&e);
}

/* A run name reused with another shape while the first run streams: the
 * second client is refused at once with the daemon's message (not after
 * superseding the first), and the first run goes on and loses nothing. */
static void test_reused_name_other_shape_is_refused(void **state) {
    if (!have_daemon()) {
        print_message("skipped: no %s\n", entropyd_path());
        skip();
    }
    env e;
    env_init(&e);
    daemon_start(&e);
    telemetry *a = client(&e, "e2e-shape");
    assert_int_equal(telemetry_wait_welcome(a, 10000, NULL, 0), TELEMETRY_OK);
    for (int i = 0; i < 50; i++) put(a, i);
    assert_int_equal(telemetry_flush(a, 20000), TELEMETRY_OK);
    telemetry_config c;
    telemetry_config_init(&c);
    c.address = e.addr;
    c.run = "e2e-shape";
    c.layers = L + 1;
    c.heads = H;
    c.seq_len = 32;
    char spool_b[160], err[512];
    snprintf(spool_b, sizeof spool_b, "%s/spool-b", e.dir); /* a's spool directory holds a's lock */
    c.spool_dir = spool_b;
    telemetry *b = telemetry_create(&c, err, sizeof err);
    assert_non_null(b);
    assert_int_equal(telemetry_wait_welcome(b, 10000, err, sizeof err), TELEMETRY_EREFUSED);
    assert_non_null(strstr(err, "shape_mismatch"));
    assert_non_null(strstr(err, "has 4 layers x 3 heads, not 5 x 3"));
    telemetry_event(b, "info", "never stored");
    double t0 = telemetry_now();
    assert_int_equal(telemetry_flush(b, 10000), TELEMETRY_EREFUSED); /* at once, not after 10 s */
    assert_int_equal(telemetry_finish(b, "finished", 10000, NULL), TELEMETRY_EREFUSED);
    assert_true(telemetry_now() - t0 < 5);
    for (int i = 50; i < 100; i++) put(a, i);
    assert_int_equal(telemetry_finish(a, "finished", 20000, NULL), TELEMETRY_OK);
    check_db(&e, "e2e-shape", 100, "finished");
    daemon_kill(&e, SIGTERM);
    env_free(&e);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_killed_twice),
        cmocka_unit_test(test_spool_uploaded_by_next_process),
        cmocka_unit_test(test_entropy_alone_gets_collapse_detection),
        cmocka_unit_test(test_reused_name_other_shape_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
