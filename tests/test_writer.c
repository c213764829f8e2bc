/* test_writer.c: unit tests of the writer thread (daemon/writer.c) on a real
 * store in a temporary directory.
 *
 * Items are submitted as ingest would submit them; the replies are taken
 * from the writer after its eventfd fires, the commit hook records what each
 * commit held, and the database is read back through a second, read-only
 * connection. Checked: welcome (with last_seq on resume), exactly one ack
 * per run per commit carrying that commit's highest seq, error replies
 * (kind conflict, shape mismatch), the hook seeing every item once and in
 * order, the queue bound (writer_full, control items still taken), a full
 * disk (no acks, nothing lost, recovery when space returns) and
 * writer_destroy committing everything.
 *
 * writer.c and writer_wal.c are included here rather than linked so that
 * the backoff between attempts (WRITER_BACKOFF_HOOK) can be stood in for, and
 * the checkpointer's rule (checkpoint_due) called: the stand-in runs on the
 * writer thread between two attempts, the one moment the test may touch the
 * writer's store (to raise the page cap), and shortens the backoff. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

static double test_backoff(double ms);
#define WRITER_BACKOFF_HOOK(ms) test_backoff(ms)
#define UNIT_TESTING 1
#include "../daemon/writer.c"
#include "../daemon/writer_wal.c"

#include <math.h>
#include <poll.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/eventfd.h>

#include "fixture_store.h"

/* ------------------------------------------------------------ environment */

struct rec { /* one item as the commit hook saw it */
    int kind;
    uint64_t conn;
    int64_t run_id, seq;
    size_t commit;
};

struct runseq {
    int64_t run_id, seq;
};

static struct {
    struct tmp_db db; /* the writer's store, on a new database (tests/fixture_store.h) */
    int efd;
    struct writer *w;
    pthread_t main_thread;
    /* written by the commit hook (writer thread) under mu */
    pthread_mutex_t mu;
    struct rec recs[20000];
    size_t nrecs, commits;
    struct runseq expect_acks[20000]; /* per commit, per run: the highest seq */
    size_t nexpect;
    int hook_on_main;
    int gate_closed, in_gate; /* the hook waits while gate_closed (to let a queue build up) */
    pthread_cond_t gate_cv;
    /* replies taken so far (main thread only) */
    struct writer_reply replies[20000];
    size_t nreplies;
} E;

static atomic_int raise_cap; /* set by the test; the backoff stand-in acts on it */
static atomic_int backoffs;

static double test_backoff(double ms) {
    atomic_fetch_add(&backoffs, 1);
    if (atomic_exchange(&raise_cap, 0)) {
        if (store_set_max_pages(E.db.st, 0)) fprintf(stderr, "raising the cap: %s\n", store_errmsg(E.db.st));
    }
    return ms / 10 + 1; /* a tenth of the real backoff keeps the test short */
}

static void on_commit(void *ctx, const struct writer_item *items, double commit_ms) {
    (void)ctx, (void)commit_ms;
    pthread_mutex_lock(&E.mu);
    if (pthread_equal(pthread_self(), E.main_thread)) E.hook_on_main = 1;
    size_t first = E.nexpect;
    for (const struct writer_item *it = items; it; it = it->next) {
        if (E.nrecs < sizeof E.recs / sizeof *E.recs)
            E.recs[E.nrecs++] = (struct rec){it->kind, it->conn, it->run_id, it->seq, E.commits};
        if (it->seq <= 0 || it->kind == WRITER_HELLO || it->kind == WRITER_STALE || it->kind == WRITER_DELETE) continue;
        size_t k = first;
        while (k < E.nexpect && E.expect_acks[k].run_id != it->run_id) k++;
        if (k == E.nexpect) E.expect_acks[E.nexpect++] = (struct runseq){it->run_id, it->seq};
        else if (it->seq > E.expect_acks[k].seq) E.expect_acks[k].seq = it->seq;
    }
    E.commits++;
    while (E.gate_closed) {
        E.in_gate = 1;
        pthread_cond_wait(&E.gate_cv, &E.mu);
    }
    pthread_mutex_unlock(&E.mu);
}

static struct writer *start_writer(size_t max_bytes) {
    struct writer_config cfg = {0};
    cfg.max_bytes = max_bytes;
    cfg.on_commit = on_commit;
    char err[256];
    struct writer *w = writer_create(E.db.st, E.efd, &cfg, err, sizeof err);
    if (!w) fail_msg("writer_create: %s", err);
    return w;
}

static int setup(void **state) {
    (void)state;
    memset(&E, 0, sizeof E);
    pthread_mutex_init(&E.mu, NULL);
    pthread_cond_init(&E.gate_cv, NULL);
    E.main_thread = pthread_self();
    atomic_store(&raise_cap, 0);
    atomic_store(&backoffs, 0);
    if (tmp_db_open(&E.db, "/tmp/twriter-XXXXXX") != 0) return -1;
    E.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return E.efd < 0 ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    writer_destroy(E.w);
    tmp_db_close(&E.db);
    close(E.efd);
    pthread_mutex_destroy(&E.mu);
    pthread_cond_destroy(&E.gate_cv);
    return 0;
}

/* ------------------------------------------------------------ items */

#define L 2
#define H 3

static float val(int64_t seq, uint32_t i) { return (float)(seq * 100 + i) + 0.5f; }

/* msg_add: tests/fixture_store.h. */

static struct writer_item *item(int kind, uint64_t conn, int64_t run_id, int64_t seq) {
    struct writer_item *it = calloc(1, sizeof *it);
    assert_non_null(it);
    it->kind = kind;
    it->conn = conn;
    it->run_id = run_id;
    it->seq = seq;
    it->time = 1700000000 + (double)seq;
    it->msg.seq = seq;
    it->msg.has_seq = seq > 0;
    return it;
}

static struct writer_item *hello(uint64_t conn, const char *run, int64_t layers, int64_t heads) {
    struct writer_item *it = item(WRITER_HELLO, conn, 0, 0);
    it->msg.type = PROTO_HELLO;
    snprintf(it->msg.run, sizeof it->msg.run, "%s", run);
    it->msg.protocol = 1;
    it->msg.layers = layers;
    it->msg.heads = heads;
    it->msg.seq_len = 32;
    return it;
}

/* A step of the 2x3 model (step = seq - 1): scalar loss and head metric ent. */
static struct writer_item *step(uint64_t conn, int64_t run_id, int64_t seq) {
    struct writer_item *it = item(WRITER_STEP, conn, run_id, seq);
    it->msg.type = PROTO_STEP;
    it->msg.step = seq - 1;
    float v[L * H];
    v[0] = val(seq, 0);
    msg_add(&it->msg, "loss", PROTO_SCALAR, 1, 1, v);
    for (uint32_t i = 0; i < L * H; i++) v[i] = val(seq, i);
    msg_add(&it->msg, "ent", PROTO_HEAD, L, H, v);
    return it;
}

static struct writer_item *event(uint64_t conn, int64_t run_id, int64_t seq, const char *text) {
    struct writer_item *it = item(WRITER_EVENT, conn, run_id, seq);
    it->msg.type = PROTO_EVENT;
    it->msg.level = PROTO_WARN;
    it->msg.text = strdup(text);
    return it;
}

static struct writer_item *end(uint64_t conn, int64_t run_id, int64_t seq, int status) {
    struct writer_item *it = item(WRITER_END, conn, run_id, seq);
    it->msg.type = PROTO_END;
    it->msg.status = status;
    return it;
}

static void submit(struct writer_item *it) {
    if (writer_submit(E.w, it) != 0) fail_msg("writer_submit refused an item of kind %d", it->kind);
}

/* ------------------------------------------------------------ replies */

/* Waits up to ms for the eventfd, then takes whatever replies there are. */
static void pump(int ms) {
    struct pollfd p = {.fd = E.efd, .events = POLLIN};
    if (poll(&p, 1, ms) > 0) {
        uint64_t n;
        ssize_t r = read(E.efd, &n, sizeof n);
        (void)r;
    }
    for (struct writer_reply *r = writer_take_replies(E.w); r;) {
        struct writer_reply *next = r->next;
        assert_true(E.nreplies < sizeof E.replies / sizeof *E.replies);
        E.replies[E.nreplies] = *r;
        E.replies[E.nreplies].payload = NULL;
        E.replies[E.nreplies++].next = NULL;
        free(r->payload);
        free(r);
        r = next;
    }
}

static const struct writer_reply *find_reply(int kind, uint64_t conn, int64_t run_id, int64_t seq) {
    for (size_t i = 0; i < E.nreplies; i++) {
        const struct writer_reply *r = &E.replies[i];
        if (r->kind != kind) continue;
        if (kind == WRITER_R_ACK ? (r->run_id == run_id && r->seq >= seq) : r->conn == conn) return r;
    }
    return NULL;
}

/* Takes replies until cond holds; fails after ms milliseconds. */
#define WAIT_FOR(cond, ms) WAIT_UNTIL(cond, ms, pump(5))

static const struct writer_reply *welcome(uint64_t conn) {
    const struct writer_reply *r = NULL;
    WAIT_FOR((r = find_reply(WRITER_R_WELCOME, conn, 0, 0)) || find_reply(WRITER_R_ERROR, conn, 0, 0), 5000);
    if (!r)
        fail_msg("hello of conn %llu answered with an error: %s", (unsigned long long)conn,
                 find_reply(WRITER_R_ERROR, conn, 0, 0)->message);
    return r;
}

/* Checks that the acks received so far are exactly one per run per commit,
 * with the highest seq of that commit, in commit order. */
static void check_acks(void) {
    pthread_mutex_lock(&E.mu);
    size_t k = 0;
    for (size_t i = 0; i < E.nreplies; i++) {
        const struct writer_reply *r = &E.replies[i];
        if (r->kind != WRITER_R_ACK) continue;
        assert_int_equal(r->conn, 0);
        if (k >= E.nexpect)
            fail_msg("ack %zu (run %lld seq %lld) not matched by a commit", k, (long long)r->run_id, (long long)r->seq);
        if (r->run_id != E.expect_acks[k].run_id || r->seq != E.expect_acks[k].seq)
            fail_msg("ack %zu: run %lld seq %lld; the commit held run %lld up to seq %lld", k, (long long)r->run_id,
                     (long long)r->seq, (long long)E.expect_acks[k].run_id, (long long)E.expect_acks[k].seq);
        k++;
    }
    assert_int_equal(k, E.nexpect);
    pthread_mutex_unlock(&E.mu);
}

/* ------------------------------------------------------------ reading the database */

/* ro_open, qi: tests/fixture_store.h. */

/* Every frame of metric `name` of the run holds the values of its seq. */
static void check_frames(int64_t run_id, const char *name, int64_t nsteps, uint32_t n) {
    sqlite3 *db = ro_open(E.db.path);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
                                        "WHERE m.run_id = ?1 AND m.name = ?2 ORDER BY f.step",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC);
    int64_t want = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        int64_t stp = sqlite3_column_int64(s, 0);
        assert_int_equal(stp, want);
        assert_int_equal(sqlite3_column_bytes(s, 1), (int)(n * 4));
        const unsigned char *d = sqlite3_column_blob(s, 1);
        for (uint32_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, d + 4 * i, 4);
            if (x != val(stp + 1, i))
                fail_msg("%s step %lld [%u]: %g, want %g", name, (long long)stp, i, (double)x, (double)val(stp + 1, i));
        }
        want++;
    }
    assert_int_equal(want, nsteps);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* ------------------------------------------------------------ tests */

static void test_hello_steps_event_end(void **state) {
    (void)state;
    E.w = start_writer(0);
    submit(hello(7, "alpha", L, H));
    const struct writer_reply *wr = welcome(7);
    int64_t run = wr->run_id;
    assert_true(run > 0);
    assert_int_equal(wr->seq, 0); /* last_seq of a new run */
    assert_int_equal(wr->layers, L);
    assert_int_equal(wr->heads, H);
    assert_int_equal(wr->seq_len, 32);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE name = 'alpha' AND status = 'live'"),
                     1); /* committed before the welcome */

    for (int64_t seq = 1; seq <= 300; seq++) submit(step(7, run, seq));
    submit(event(7, run, 301, "lr spike"));
    submit(end(7, run, 302, PROTO_FINISHED));
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, 302), 5000);
    /* the ack came after the commit: everything up to it is in the database */
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), 302);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 300);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE id = %lld AND status = 'finished'", (long long)run),
                     1);
    assert_int_equal(
        qi(E.db.path,
           "SELECT count(*) FROM events WHERE run_id = %lld AND seq = 301 AND text = 'lr spike' AND level = 'warn'",
           (long long)run),
        1);
    check_frames(run, "loss", 300, 1);
    check_frames(run, "ent", 300, L * H);
    /* acks only grow, and match the commits one for one */
    int64_t last = 0;
    for (size_t i = 0; i < E.nreplies; i++)
        if (E.replies[i].kind == WRITER_R_ACK) {
            assert_true(E.replies[i].seq > last);
            last = E.replies[i].seq;
        }
    assert_int_equal(last, 302);
    check_acks();
    for (size_t i = 0; i < E.nreplies; i++) assert_int_not_equal(E.replies[i].kind, WRITER_R_ERROR);

    /* resume: the same run, last_seq 302 */
    submit(hello(8, "alpha", L, H));
    wr = welcome(8);
    assert_int_equal(wr->run_id, run);
    assert_int_equal(wr->seq, 302);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE name = 'alpha' AND status = 'live'"), 1);
    /* stale: no ack, status changes */
    struct writer_item *it = item(WRITER_STALE, 8, run, 0);
    submit(it);
    WAIT_FOR(qi(E.db.path, "SELECT count(*) FROM runs WHERE id = %lld AND status = 'stale'", (long long)run) == 1,
             5000);
    pump(50);
    check_acks();

    struct writer_stats ws;
    writer_get_stats(E.w, &ws);
    assert_true(ws.commits >= 1);
    assert_int_equal(ws.items, 302 + 3);
    assert_int_equal(ws.values, 300 * (1 + L * H));
    assert_int_equal(ws.failing, 0);
    assert_int_equal(ws.db_errors, 0);
    assert_int_equal(ws.queue_bytes, 0);
}

static void test_hook_order_and_coalescing(void **state) {
    (void)state;
    E.w = start_writer(0);
    submit(hello(1, "r1", L, H));
    submit(hello(2, "r2", L, H));
    int64_t r1 = welcome(1)->run_id, r2 = welcome(2)->run_id;
    assert_true(r1 != r2);
    /* interleaved runs, submitted in bursts so that commits hold many items */
    int64_t s1 = 0, s2 = 0;
    struct rec want[4000];
    size_t nwant = 0;
    pthread_mutex_lock(&E.mu);
    size_t base = E.nrecs;
    pthread_mutex_unlock(&E.mu);
    for (int burst = 0; burst < 20; burst++) {
        for (int i = 0; i < 100; i++) {
            int which = (i * 7 + burst) % 3 != 0;
            int64_t run = which ? r1 : r2, seq = which ? ++s1 : ++s2;
            struct writer_item *it = i % 37 == 36 ? event(which ? 1 : 2, run, seq, "e") : step(which ? 1 : 2, run, seq);
            want[nwant++] = (struct rec){it->kind, it->conn, run, seq, 0};
            submit(it);
        }
        if (burst % 5 == 4) usleep(20000); /* not a wait: lets some commits fall between bursts */
    }
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, r1, s1) && find_reply(WRITER_R_ACK, 0, r2, s2), 10000);
    pump(20);
    pthread_mutex_lock(&E.mu);
    assert_int_equal(E.nrecs - base, nwant);
    for (size_t i = 0; i < nwant; i++) {
        const struct rec *g = &E.recs[base + i];
        if (g->kind != want[i].kind || g->conn != want[i].conn || g->run_id != want[i].run_id || g->seq != want[i].seq)
            fail_msg(
                "hook item %zu: kind %d conn %llu run %lld seq %lld; submitted kind %d conn %llu run %lld seq %lld", i,
                g->kind, (unsigned long long)g->conn, (long long)g->run_id, (long long)g->seq, want[i].kind,
                (unsigned long long)want[i].conn, (long long)want[i].run_id, (long long)want[i].seq);
        if (i && g->commit < E.recs[base + i - 1].commit) fail_msg("commits out of order");
    }
    int many = 0; /* some commit held more than one item of a run (so coalescing was exercised) */
    for (size_t i = 1; i < nwant; i++)
        if (E.recs[base + i].commit == E.recs[base + i - 1].commit) many = 1;
    assert_int_equal(E.hook_on_main, 0);
    pthread_mutex_unlock(&E.mu);
    assert_true(many);
    check_acks();
    /* fewer acks than items: they coalesce */
    size_t nacks = 0;
    for (size_t i = 0; i < E.nreplies; i++) nacks += E.replies[i].kind == WRITER_R_ACK;
    assert_true(nacks < nwant);
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)r1), s1);
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)r2), s2);
}

static void test_error_replies(void **state) {
    (void)state;
    E.w = start_writer(0);
    submit(hello(3, "errs", L, H));
    int64_t run = welcome(3)->run_id;
    submit(step(3, run, 1));
    /* seq 2: loss as a head metric (kind conflict), plus a new scalar that is stored */
    struct writer_item *it = item(WRITER_STEP, 3, run, 2);
    it->msg.type = PROTO_STEP;
    it->msg.step = 1;
    float v[L * H] = {1, 2, 3, 4, 5, 6}, one = 42;
    msg_add(&it->msg, "fresh", PROTO_SCALAR, 1, 1, &one);
    msg_add(&it->msg, "loss", PROTO_HEAD, L, H, v);
    submit(it);
    submit(step(3, run, 3));
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, 3), 5000);
    const struct writer_reply *er = find_reply(WRITER_R_ERROR, 3, 0, 0);
    assert_non_null(er);
    assert_int_equal(er->code, PROTO_E_KIND_CONFLICT);
    assert_int_equal(er->seq, 2);
    if (!strstr(er->message, "loss")) fail_msg("message does not name the metric: %s", er->message);
    assert_int_equal(
        qi(E.db.path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'fresh'"), 1);
    assert_int_equal(
        qi(E.db.path, "SELECT count(*) FROM frames f JOIN metrics m ON m.id = f.metric_id WHERE m.name = 'loss'"), 2);
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), 3);
    check_acks();

    /* a hello with another shape: an error to that connection, no welcome, nothing changed */
    submit(hello(4, "errs", L + 1, H));
    WAIT_FOR(find_reply(WRITER_R_ERROR, 4, 0, 0), 5000);
    er = find_reply(WRITER_R_ERROR, 4, 0, 0);
    assert_int_equal(er->code, PROTO_E_SHAPE_MISMATCH);
    assert_null(find_reply(WRITER_R_WELCOME, 4, 0, 0));
    if (!strstr(er->message, "2 layers x 3 heads")) fail_msg("message: %s", er->message);
    assert_int_equal(qi(E.db.path, "SELECT layers FROM runs WHERE id = %lld", (long long)run), L);
    /* the rest of that batch is not disturbed */
    submit(hello(5, "errs", L, H + 1));
    submit(step(3, run, 4));
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, 4), 5000);
    assert_non_null(find_reply(WRITER_R_ERROR, 5, 0, 0));
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 4);
    check_acks();
}

/* Waits until the writer reports the database failing. */
static void wait_failing(void) {
    struct writer_stats ws;
    double until = now_mono_ms() + 5000;
    do {
        writer_get_stats(E.w, &ws);
        if (ws.failing && atomic_load(&backoffs) >= 2) return;
        usleep(2000);
    } while (now_mono_ms() < until);
    fail_msg("the writer never reported a failing database");
}

static void test_full_disk_and_queue_bound(void **state) {
    (void)state;
    enum { BL = 64, BH = 128 }; /* 32 KiB a frame, over a page: the cap is reached at once */
    struct store_run_info info;
    assert_int_equal(store_begin(E.db.st), 0);
    assert_int_equal(store_run_open(E.db.st, "big", BL, BH, 16, NULL, 1, &info), 0);
    assert_int_equal(store_commit(E.db.st), 0);
    int64_t run = info.id;
    assert_int_equal(store_set_max_pages(E.db.st, store_db_bytes(E.db.st) / 16384), 0);
    const size_t max_bytes = 512 * 1024;
    E.w = start_writer(max_bytes);
    static float v[BL * BH];
    int64_t seq = 0;
    int refused = 0;
    struct writer_item *kept = NULL;
    /* submit until the queue bound refuses */
    for (int i = 0; i < 1000 && !refused; i++) {
        struct writer_item *it = item(WRITER_STEP, 9, run, seq + 1);
        it->msg.type = PROTO_STEP;
        it->msg.step = seq;
        for (int k = 0; k < BL * BH; k++) v[k] = (float)((seq + 1) * 10000 + k);
        msg_add(&it->msg, "att", PROTO_HEAD, BL, BH, v);
        if (writer_submit(E.w, it) == 0) seq++;
        else {
            refused = 1;
            kept = it; /* the caller keeps a refused item */
        }
        if (i == 0) wait_failing();
    }
    assert_true(refused);
    assert_true(writer_full(E.w));
    /* a data item is refused again while full */
    assert_int_equal(writer_submit(E.w, kept), -1);
    /* control items are still taken: an end for this run, a hello for another */
    submit(end(9, run, seq + 1, PROTO_FINISHED));
    submit(hello(10, "other", L, H));
    /* nothing acked or welcomed, nothing committed, while the disk is full */
    pump(300);
    assert_null(find_reply(WRITER_R_ACK, 0, run, 1));
    assert_null(find_reply(WRITER_R_WELCOME, 10, 0, 0));
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), 0);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps"), 0);
    struct writer_stats ws;
    writer_get_stats(E.w, &ws);
    assert_int_equal(ws.failing, 1);
    assert_true(ws.retries >= 1);
    assert_true(ws.db_errors >= 1);
    assert_true(ws.queue_bytes >= max_bytes);
    assert_int_equal(ws.commits, 0);

    /* space returns: everything is committed, acked once per commit, in order */
    atomic_store(&raise_cap, 1);
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, seq + 1), 10000);
    WAIT_FOR(find_reply(WRITER_R_WELCOME, 10, 0, 0), 5000);
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)run), seq + 1);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), seq);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE id = %lld AND status = 'finished'", (long long)run),
                     1);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE name = 'other'"), 1);
    /* every value of every step */
    sqlite3 *db = ro_open(E.db.path);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT step, data FROM frames ORDER BY step", -1, &s, NULL), SQLITE_OK);
    int64_t n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        int64_t st = sqlite3_column_int64(s, 0);
        assert_int_equal(st, n);
        assert_int_equal(sqlite3_column_bytes(s, 1), BL * BH * 4);
        const unsigned char *d = sqlite3_column_blob(s, 1);
        for (int k = 0; k < BL * BH; k++) {
            float x;
            memcpy(&x, d + 4 * k, 4);
            if (x != (float)((st + 1) * 10000 + k)) fail_msg("step %lld value %d: %g", (long long)st, k, (double)x);
        }
        n++;
    }
    assert_int_equal(n, seq);
    sqlite3_finalize(s);
    sqlite3_close(db);
    check_acks();
    /* no ack went out before the recovery, no error replies at all */
    for (size_t i = 0; i < E.nreplies; i++) assert_int_not_equal(E.replies[i].kind, WRITER_R_ERROR);
    writer_get_stats(E.w, &ws);
    assert_int_equal(ws.failing, 0);
    assert_int_equal(ws.queue_bytes, 0);
    assert_false(writer_full(E.w));
    /* and the refused item goes in now (as a later step) */
    kept->seq = kept->msg.seq = seq + 2;
    kept->msg.step = seq;
    assert_int_equal(writer_submit(E.w, kept), 0);
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, seq + 2), 5000);
    check_acks();
}

/* Closes the gate in the commit hook and waits until the writer sits in it. */
static void hold_in_hook(void) {
    pthread_mutex_lock(&E.mu);
    E.gate_closed = 1;
    E.in_gate = 0;
    pthread_mutex_unlock(&E.mu);
}

static void wait_in_hook(void) {
    double until = now_mono_ms() + 5000;
    for (;;) {
        pthread_mutex_lock(&E.mu);
        int in = E.in_gate;
        pthread_mutex_unlock(&E.mu);
        if (in) return;
        if (now_mono_ms() > until) fail_msg("the commit hook was not reached");
        usleep(1000);
    }
}

static void release_hook(void) {
    pthread_mutex_lock(&E.mu);
    E.gate_closed = 0;
    pthread_cond_broadcast(&E.gate_cv);
    pthread_mutex_unlock(&E.mu);
}

/* A batch whose first items succeed and whose last one hits the full disk
 * is applied again on every retry: the counters must count it once, when it
 * is committed. */
static void test_retry_counts_once(void **state) {
    (void)state;
    enum { BL = 64, BH = 128 };
    struct store_run_info small, big;
    assert_int_equal(store_begin(E.db.st), 0);
    assert_int_equal(store_run_open(E.db.st, "small", L, H, 16, NULL, 1, &small), 0);
    assert_int_equal(store_run_open(E.db.st, "big", BL, BH, 16, NULL, 1, &big), 0);
    assert_int_equal(store_commit(E.db.st), 0);
    assert_int_equal(store_set_max_pages(E.db.st, store_db_bytes(E.db.st) / 16384), 0);
    E.w = start_writer(0);
    /* a first commit (no new pages needed), held in the hook while the batch queues up */
    hold_in_hook();
    submit(item(WRITER_STALE, 1, small.id, 0));
    wait_in_hook();
    for (int64_t seq = 1; seq <= 10; seq++) submit(step(1, small.id, seq));
    struct writer_item *it = item(WRITER_STEP, 2, big.id, 1);
    it->msg.type = PROTO_STEP;
    static float v[BL * BH];
    for (int k = 0; k < BL * BH; k++) v[k] = (float)k;
    msg_add(&it->msg, "att", PROTO_HEAD, BL, BH, v);
    submit(it);
    release_hook();
    wait_failing();
    WAIT_UNTIL(atomic_load(&backoffs) >= 4, 10000, usleep(1000)); /* several attempts at the same batch */
    pump(100);
    assert_null(find_reply(WRITER_R_ACK, 0, small.id, 1)); /* the small steps wait with the big one */
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps"), 0);
    atomic_store(&raise_cap, 1);
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, big.id, 1) && find_reply(WRITER_R_ACK, 0, small.id, 10), 10000);
    check_acks();
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps"), 11);
    struct writer_stats ws;
    writer_get_stats(E.w, &ws);
    assert_true(ws.retries >= 3);
    assert_int_equal(ws.items, 1 + 10 + 1);
    assert_int_equal(ws.commits, 2);
    /* values committed: 10 small steps of 1 + 6, one big step of 8192 */
    assert_int_equal(ws.values, 10 * (1 + L * H) + BL * BH);
}

static void test_destroy_commits_everything(void **state) {
    (void)state;
    struct store_run_info info;
    assert_int_equal(store_begin(E.db.st), 0);
    assert_int_equal(store_run_open(E.db.st, "last", L, H, 16, NULL, 1, &info), 0);
    assert_int_equal(store_commit(E.db.st), 0);
    E.w = start_writer(0);
    /* hold the writer in the commit hook of seq 1 while 5000 more items queue up */
    hold_in_hook();
    submit(step(11, info.id, 1));
    wait_in_hook();
    for (int64_t seq = 2; seq <= 5000; seq++) submit(step(11, info.id, seq));
    submit(end(11, info.id, 5001, PROTO_ABORTED));
    release_hook();
    writer_destroy(E.w);
    E.w = NULL;
    assert_int_equal(qi(E.db.path, "SELECT last_seq FROM runs WHERE id = %lld", (long long)info.id), 5001);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)info.id), 5000);
    assert_int_equal(
        qi(E.db.path, "SELECT count(*) FROM runs WHERE id = %lld AND status = 'aborted'", (long long)info.id), 1);
    check_frames(info.id, "ent", 5000, L * H);
    /* the hook saw every item once; no commit held more than WRITER_MAX_BATCH */
    pthread_mutex_lock(&E.mu);
    assert_int_equal(E.nrecs, 5001);
    assert_true(E.commits >= 2);
    size_t in_commit = 0;
    for (size_t i = 0; i < E.nrecs; i++) {
        assert_int_equal(E.recs[i].seq, (int64_t)i + 1);
        in_commit = i && E.recs[i].commit == E.recs[i - 1].commit ? in_commit + 1 : 1;
        if (in_commit > WRITER_MAX_BATCH)
            fail_msg("commit %zu holds more than %d items", E.recs[i].commit, WRITER_MAX_BATCH);
    }
    pthread_mutex_unlock(&E.mu);
    /* a writer destroyed with nothing submitted, and a NULL one */
    E.w = start_writer(0);
    writer_destroy(E.w);
    E.w = NULL;
    writer_destroy(NULL);
}

/* A step that fails for a reason of its own (here a trigger refuses its
 * frame, after its steps row was written) in the middle of a batch: steps
 * go without a savepoint, so the batch is applied again under savepoints;
 * the failing step is undone alone and answered, the others are stored
 * once and acked. */
static void test_failing_step_undone_alone(void **state) {
    (void)state;
    struct store_run_info info;
    assert_int_equal(store_begin(E.db.st), 0);
    assert_int_equal(store_run_open(E.db.st, "faulty", L, H, 16, NULL, 1, &info), 0);
    assert_int_equal(store_commit(E.db.st), 0);
    char *msg = NULL;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(E.db.path, &db), SQLITE_OK);
    if (sqlite3_exec(db,
                     "CREATE TRIGGER refuse BEFORE INSERT ON frames WHEN NEW.step = 2 "
                     "BEGIN SELECT RAISE(ABORT, 'injected fault'); END",
                     NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("trigger: %s", msg);
    sqlite3_close(db);
    E.w = start_writer(0);
    hold_in_hook(); /* the five steps queue up behind a first commit: one batch */
    submit(item(WRITER_STALE, 7, info.id, 0));
    wait_in_hook();
    for (int64_t seq = 1; seq <= 5; seq++) submit(step(7, info.id, seq));
    release_hook();
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, info.id, 5), 5000);
    const struct writer_reply *er = find_reply(WRITER_R_ERROR, 7, 0, 0);
    assert_non_null(er);
    assert_int_equal(er->code, PROTO_E_INTERNAL);
    assert_int_equal(er->seq, 3);
    check_acks();
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)info.id), 4);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld AND step = 2", (long long)info.id),
                     0);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM frames WHERE step = 2"), 0);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM frames"), 4 * 2);
    pthread_mutex_lock(&E.mu);
    assert_int_equal(E.commits, 2); /* the stale item's, then the batch once */
    size_t applied = 0;
    for (size_t i = 0; i < E.nrecs; i++) applied += E.recs[i].kind == WRITER_STEP;
    pthread_mutex_unlock(&E.mu);
    assert_int_equal(applied, 5); /* the hook sees the refused step too (applied 0) */
    struct writer_stats ws;
    writer_get_stats(E.w, &ws);
    assert_int_equal(ws.db_errors, 1);
    assert_int_equal(ws.retries, 0);
    assert_int_equal(atomic_load(&backoffs), 0); /* the replay does not back off */
    assert_int_equal(E.w->guarded, 0);           /* and the next batch goes unguarded again */
}

/* Group commit: a step whose client said ack_delay_ms waits in the open
 * transaction for the next one (one commit for both); without it, each
 * step commits as soon as the queue runs dry. */
static int queue_dry(void) {
    pthread_mutex_lock(&E.w->mu);
    int dry = E.w->head == NULL;
    pthread_mutex_unlock(&E.w->mu);
    return dry;
}

static void test_group_commit(void **state) {
    (void)state;
    struct store_run_info info;
    assert_int_equal(store_begin(E.db.st), 0);
    assert_int_equal(store_run_open(E.db.st, "grouped", L, H, 16, NULL, 1, &info), 0);
    assert_int_equal(store_commit(E.db.st), 0);
    E.w = start_writer(0);
    /* without ack_delay_ms: the first step is committed alone before the second comes */
    submit(step(8, info.id, 1));
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, info.id, 1), 5000);
    submit(step(8, info.id, 2));
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, info.id, 2), 5000);
    /* with it: the second step joins the first one's transaction. (A
     * machine so loaded that WRITER_LINGER_MS passes between the two
     * submits commits them apart: tried again, a few times.) */
    int64_t seq = 2;
    int joined = 0;
    for (int attempt = 0; attempt < 5 && !joined; attempt++) {
        struct writer_item *a = step(8, info.id, ++seq), *b = step(8, info.id, ++seq);
        a->linger_ms = b->linger_ms = 1000; /* capped at WRITER_LINGER_MS */
        pthread_mutex_lock(&E.mu);
        size_t commits_before = E.commits;
        pthread_mutex_unlock(&E.mu);
        double t0 = now_mono_ms();
        submit(a);
        WAIT_FOR(queue_dry(), 5000); /* taken: applied, its transaction open */
        pthread_mutex_lock(&E.mu);
        int early = E.commits != commits_before;
        pthread_mutex_unlock(&E.mu);
        submit(b);
        WAIT_FOR(find_reply(WRITER_R_ACK, 0, info.id, seq), 5000);
        double ms = now_mono_ms() - t0;
        pthread_mutex_lock(&E.mu);
        joined = !early && E.nrecs >= 2 && E.recs[E.nrecs - 1].commit == E.recs[E.nrecs - 2].commit;
        pthread_mutex_unlock(&E.mu);
        if (joined) assert_true(ms < WRITER_LINGER_MS + 1000); /* the linger is bounded */
    }
    assert_true(joined);
    pthread_mutex_lock(&E.mu);
    assert_true(E.recs[0].commit != E.recs[1].commit);
    pthread_mutex_unlock(&E.mu);
    check_acks();
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)info.id), seq);
}

/* The precommit hook: called inside each batch's transaction just before
 * its commit, so what it writes is in the database when the batch's ack
 * goes out; and once more, in a transaction of its own, when the writer
 * stops. Quiet submits wait for writer_wake. */
static struct {
    int64_t run;
    int calls, outside_txn, failed;
    int64_t since; /* what it writes: the verdict's since_step */
} PC;

static int precommit_hook(void *ctx) {
    (void)ctx;
    PC.calls++;
    if (!store_in_transaction(E.db.st)) PC.outside_txn++;
    if (PC.run && store_run_verdict(E.db.st, PC.run, "collapsing", PC.since, "[[0,1]]", "entropy_collapse", NULL))
        PC.failed++;
    return 0;
}

static void test_precommit_rides_in_the_batch(void **state) {
    (void)state;
    memset(&PC, 0, sizeof PC);
    E.w = start_writer(0);
    writer_set_precommit(E.w, precommit_hook, NULL);
    submit(hello(3, "pre", L, H));
    int64_t run = welcome(3)->run_id;
    PC.run = run; /* (the writer is idle: it reads PC only inside a batch) */
    PC.since = 41;
    /* quiet submits: nothing happens until the wake */
    for (int64_t seq = 1; seq <= 3; seq++)
        if (writer_submit_quiet(E.w, step(3, run, seq))) fail_msg("writer_submit_quiet refused a step");
    writer_wake(E.w);
    WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, 3), 5000);
    /* the ack came after the commit, and the hook's write committed with it */
    assert_int_equal(qi(E.db.path, "SELECT since_step FROM run_summary WHERE run_id = %lld", (long long)run), 41);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 3);
    int calls = PC.calls;
    assert_true(calls >= 2); /* the hello's batch and the steps' */
    PC.since = 77;
    writer_destroy(E.w); /* the last call, in a transaction of its own */
    E.w = NULL;
    assert_int_equal(PC.calls, calls + 1);
    assert_int_equal(PC.outside_txn, 0);
    assert_int_equal(PC.failed, 0);
    assert_int_equal(qi(E.db.path, "SELECT since_step FROM run_summary WHERE run_id = %lld", (long long)run), 77);
}

/* A DELETE decided while the run was stale, reaching the writer after a
 * trainer's hello made it live again: the writer keeps the run. */
static void test_delete_rechecks_liveness(void **state) {
    (void)state;
    E.w = start_writer(0);
    submit(hello(5, "resumed", L, H));
    int64_t run = welcome(5)->run_id;
    submit(step(5, run, 1));
    struct writer_item *del = item(WRITER_DELETE, 0, run, 0);
    submit(del);
    writer_destroy(E.w);
    E.w = NULL;
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE id = %lld", (long long)run), 1);
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)run), 1);
    /* once it is no longer live, the same DELETE goes through */
    E.w = start_writer(0);
    submit(end(5, run, 2, PROTO_FINISHED));
    submit(item(WRITER_DELETE, 0, run, 0));
    writer_destroy(E.w);
    E.w = NULL;
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM runs WHERE id = %lld", (long long)run), 0);
}

/* A step of a wide run (WL x WH heads, one head metric): 16 KiB frames of
 * noise (which the blocks cannot shrink), so that a few hundred steps,
 * committed a few at a time, pass WRITER_WAL_RESTART. */
#define WL 64
#define WH 64
static struct writer_item *wide_step(uint64_t conn, int64_t run_id, int64_t seq) {
    static float v[WL * WH];
    struct writer_item *it = item(WRITER_STEP, conn, run_id, seq);
    it->msg.type = PROTO_STEP;
    it->msg.step = seq - 1;
    static uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < WL * WH; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = (float)(x >> 40) / 16777216.0f;
    }
    msg_add(&it->msg, "ent", PROTO_HEAD, WL, WH, v);
    return it;
}

static uint64_t busy_checkpoints(void) {
    struct writer_stats ws;
    writer_get_stats(E.w, &ws);
    return ws.checkpoints_busy;
}

/* A reader that keeps the checkpointer's RESTART busy holds background
 * work (here a purge) back while the WAL is past WRITER_WAL_RESTART, and
 * once it is gone the purge goes through with nothing else committed. */
static void test_busy_reader_holds_background_work(void **state) {
    (void)state;
    E.w = start_writer(0);
    submit(hello(7, "wide", WL, WH));
    int64_t run = welcome(7)->run_id;
    sqlite3 *rd = ro_open(E.db.path); /* a reader on the old log */
    assert_int_equal(sqlite3_exec(rd, "BEGIN; SELECT count(*) FROM runs;", NULL, NULL, NULL), SQLITE_OK);
    int64_t n = 256;
    for (int64_t seq = 1; seq <= n; seq++) {
        submit(wide_step(7, run, seq));
        if (seq % 16 == 0) WAIT_FOR(find_reply(WRITER_R_ACK, 0, run, seq), 30000);
    }
    submit(end(7, run, n + 1, PROTO_FINISHED));
    WAIT_UNTIL(busy_checkpoints() >= 1, 30000, pump(10));
    submit(item(WRITER_DELETE, 0, run, 0));
    WAIT_UNTIL(qi(E.db.path, "SELECT count(*) FROM runs") == 0, 10000, pump(10));
    /* while the reader stays, the purge waits for the restart */
    assert_true(qi(E.db.path, "SELECT count(*) FROM purge") > 0);
    assert_int_equal(sqlite3_exec(rd, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(rd);
    /* no commit but the purge's own from here on */
    WAIT_UNTIL(qi(E.db.path, "SELECT count(*) FROM purge") == 0, 20000, pump(10));
    assert_int_equal(qi(E.db.path, "SELECT count(*) FROM block_chunks"), 0);
}

/* The checkpointer's rule: a restart that has not succeeded is due again
 * WRITER_CK_RETRY_MS after the last attempt though the WAL did not grow.
 * Nothing else would start it (background work waits for it and commits
 * nothing): a RESTART that lost to the writer's own checkpoint left an
 * idle daemon's purge waiting for good, with a 153 MiB WAL. */
static void test_checkpoint_retry_due(void **state) {
    (void)state;
    struct writer *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->wal_used = w->wal_checked = WRITER_WAL_RESTART;
    w->ck_last_ms = now_mono_ms();
    assert_false(checkpoint_due(w));
    w->ck_last_ms -= WRITER_CK_RETRY_MS;
    assert_true(checkpoint_due(w));
    w->wal_reset_ok = 1; /* restarted: nothing is due until the WAL grows */
    assert_false(checkpoint_due(w));
    w->wal_used += WRITER_WAL_PASSIVE;
    assert_true(checkpoint_due(w));
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_precommit_rides_in_the_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_rechecks_liveness, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_steps_event_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hook_order_and_coalescing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk_and_queue_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_counts_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_commits_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_step_undone_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_reader_holds_background_work, setup, teardown),
        cmocka_unit_test(test_checkpoint_retry_due),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
