/* test_faults.c: fault injection into the daemon's ingest path.
 *
 * The daemon's modules run in this process as main.c wires them (store,
 * writer, ingest loop on a Unix socket, alert monitor, SSE ring; no HTTP),
 * and the test thread is a trainer speaking protocol v1 over the real
 * socket: it resends from the welcome's last_seq whenever a reply is
 * missing or an error says it must (the telemetry client's behaviour).
 *
 * 1. Allocation failures, SQLite's way: this file defines malloc, calloc
 *    and realloc (glibc lets a program replace them; each forwards to the
 *    next definition through dlsym(RTLD_NEXT), so this also works under
 *    ASan) and makes the Nth allocation made by a daemon thread (ingest,
 *    writer, notifier; never the test thread) return NULL, once. For N = 1,
 *    2, 3 ... until a whole trainer session (hello, 4 steps, an event, end)
 *    no longer reaches N allocations, the session must complete, and the
 *    run must hold each step exactly once with the values sent.
 *    A welcome must never go missing (the trainer would wait for it); a
 *    missing ack is allowed (the next welcome says the same).
 *    FAULTS_MAX_N bounds N (0: no bound), FAULTS_STRIDE tests every k-th N.
 *
 * 2. SQLite failing: a VFS shim, registered as the default before the store
 *    opens, makes writes fail with SQLITE_IOERR_WRITE, then SQLITE_FULL, and
 *    takes the WAL write lock away (SQLITE_BUSY for 11 s: more than twice the
 *    store's 5 s busy timeout, so a writer whose first BEGIN comes late in
 *    the phase -- a loaded machine, an alert stored on its thread -- still
 *    times out inside it) while a trainer streams steps. Each phase
 *    must show up as writer retries; afterwards every step sent is acked
 *    and stored once, and PRAGMA integrity_check is "ok".
 *
 * Not covered here: the HTTP side (query.c, http.c) and the daemon binary
 * itself (see tests/stress.py, which kills and freezes the real one). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "fixture_frames.h"
#include "ingest.h"
#include "alerter.h"
#include "store.h"
#include "stream.h"
#include "writer.h"

/* ------------------------------------------------------- malloc stand-in */

static _Thread_local int fi_exempt; /* the test's own threads */
static atomic_long fi_countdown;    /* > 0: armed; the allocation that takes it to 0 fails */
static atomic_long fi_seen;         /* allocations counted while armed */
static atomic_int fi_fired;

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);

/* dlsym may allocate before the real functions are known: a small arena. */
static _Alignas(16) char boot[8192];
static size_t boot_used;
static int booting;

static void *boot_alloc(size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (boot_used + n > sizeof boot) return NULL;
    void *p = boot + boot_used;
    boot_used += n;
    return p;
}

static void fi_init(void) {
    if (real_malloc || booting) return;
    booting = 1;
    real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    booting = 0;
}

static int fi_fail(void) {
    if (fi_exempt || atomic_load_explicit(&fi_countdown, memory_order_relaxed) <= 0) return 0;
    atomic_fetch_add(&fi_seen, 1);
    if (atomic_fetch_sub(&fi_countdown, 1) == 1) {
        atomic_store(&fi_fired, 1);
        return 1;
    }
    return 0;
}

void *malloc(size_t n) {
    fi_init();
    if (!real_malloc) return boot_alloc(n);
    if (fi_fail()) return NULL;
    return real_malloc(n);
}

void *calloc(size_t a, size_t b) {
    fi_init();
    if (!real_calloc) return boot_alloc(a * b); /* static: already zero */
    if (fi_fail()) return NULL;
    return real_calloc(a, b);
}

void *realloc(void *p, size_t n) {
    fi_init();
    if (!real_realloc) return NULL;
    if (n && fi_fail()) return NULL;
    return real_realloc(p, n);
}

void free(void *p) {
    if ((char *)p >= boot && (char *)p < boot + sizeof boot) return;
    fi_init();
    if (real_free) real_free(p);
}

static void fi_arm(long n) {
    atomic_store(&fi_fired, 0);
    atomic_store(&fi_seen, 0);
    atomic_store(&fi_countdown, n);
}

static void fi_disarm(void) { atomic_store(&fi_countdown, 0); }

/* ------------------------------------------------------------ VFS shim */

static atomic_int vfs_write_err; /* SQLITE_IOERR_WRITE, SQLITE_FULL or 0 */
static atomic_int vfs_busy;      /* 1: the WAL write lock cannot be had */
static atomic_long vfs_injected;

struct shim_file {
    sqlite3_file base;
    sqlite3_file *real; /* follows this struct in the same allocation */
};

static sqlite3_vfs *real_vfs;

#define REAL(f) (((struct shim_file *)(f))->real)

static int shim_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int shim_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) {
    return REAL(f)->pMethods->xRead(REAL(f), b, n, o);
}
static int shim_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
    int e = atomic_load(&vfs_write_err);
    if (e) {
        atomic_fetch_add(&vfs_injected, 1);
        return e;
    }
    return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int shim_truncate(sqlite3_file *f, sqlite3_int64 s) {
    int e = atomic_load(&vfs_write_err);
    if (e) return e == SQLITE_FULL ? SQLITE_FULL : SQLITE_IOERR_TRUNCATE;
    return REAL(f)->pMethods->xTruncate(REAL(f), s);
}
static int shim_sync(sqlite3_file *f, int fl) {
    if (atomic_load(&vfs_write_err)) return SQLITE_IOERR_FSYNC;
    return REAL(f)->pMethods->xSync(REAL(f), fl);
}
static int shim_size(sqlite3_file *f, sqlite3_int64 *s) { return REAL(f)->pMethods->xFileSize(REAL(f), s); }
static int shim_lock(sqlite3_file *f, int l) {
    if (atomic_load(&vfs_busy) && l > SQLITE_LOCK_SHARED) return SQLITE_BUSY;
    return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int shim_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int shim_check(sqlite3_file *f, int *o) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), o); }
static int shim_fcntl(sqlite3_file *f, int op, void *a) { return REAL(f)->pMethods->xFileControl(REAL(f), op, a); }
static int shim_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int shim_devchar(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int shim_shmmap(sqlite3_file *f, int pg, int sz, int ext, void volatile **pp) {
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, pp);
}
/* WAL mode takes its write lock here: shm slot 0, exclusive. */
static int shim_shmlock(sqlite3_file *f, int off, int n, int fl) {
    if (atomic_load(&vfs_busy) && off == 0 && (fl & SQLITE_SHM_LOCK) && (fl & SQLITE_SHM_EXCLUSIVE)) {
        atomic_fetch_add(&vfs_injected, 1);
        return SQLITE_BUSY;
    }
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, fl);
}
static void shim_shmbarrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int shim_shmunmap(sqlite3_file *f, int del) { return REAL(f)->pMethods->xShmUnmap(REAL(f), del); }
static int shim_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp) {
    return REAL(f)->pMethods->xFetch(REAL(f), o, n, pp);
}
static int shim_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) {
    return REAL(f)->pMethods->xUnfetch(REAL(f), o, p);
}

static const sqlite3_io_methods shim_io = {3,
                                           shim_close,
                                           shim_read,
                                           shim_write,
                                           shim_truncate,
                                           shim_sync,
                                           shim_size,
                                           shim_lock,
                                           shim_unlock,
                                           shim_check,
                                           shim_fcntl,
                                           shim_sector,
                                           shim_devchar,
                                           shim_shmmap,
                                           shim_shmlock,
                                           shim_shmbarrier,
                                           shim_shmunmap,
                                           shim_fetch,
                                           shim_unfetch};

static int shim_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
    struct shim_file *s = (struct shim_file *)f;
    s->real = (sqlite3_file *)(s + 1);
    s->base.pMethods = NULL;
    int rc = real_vfs->xOpen(real_vfs, name, s->real, flags, out);
    if (rc == SQLITE_OK && s->real->pMethods) s->base.pMethods = &shim_io;
    return rc;
}
static int shim_delete(sqlite3_vfs *v, const char *n, int d) { return real_vfs->xDelete(real_vfs, n, d); }
static int shim_access(sqlite3_vfs *v, const char *n, int fl, int *o) { return real_vfs->xAccess(real_vfs, n, fl, o); }
static int shim_fullpath(sqlite3_vfs *v, const char *n, int k, char *o) {
    return real_vfs->xFullPathname(real_vfs, n, k, o);
}
static void *shim_dlopen(sqlite3_vfs *v, const char *n) { return real_vfs->xDlOpen(real_vfs, n); }
static void shim_dlerror(sqlite3_vfs *v, int k, char *o) { real_vfs->xDlError(real_vfs, k, o); }
static void (*shim_dlsym(sqlite3_vfs *v, void *h, const char *s))(void) { return real_vfs->xDlSym(real_vfs, h, s); }
static void shim_dlclose(sqlite3_vfs *v, void *h) { real_vfs->xDlClose(real_vfs, h); }
static int shim_random(sqlite3_vfs *v, int n, char *o) { return real_vfs->xRandomness(real_vfs, n, o); }
static int shim_sleep(sqlite3_vfs *v, int us) { return real_vfs->xSleep(real_vfs, us); }
static int shim_time(sqlite3_vfs *v, double *o) { return real_vfs->xCurrentTime(real_vfs, o); }
static int shim_lasterr(sqlite3_vfs *v, int n, char *o) { return real_vfs->xGetLastError(real_vfs, n, o); }
static int shim_time64(sqlite3_vfs *v, sqlite3_int64 *o) { return real_vfs->xCurrentTimeInt64(real_vfs, o); }

static sqlite3_vfs shim_vfs;

static void shim_register(void) {
    if (real_vfs) return;
    real_vfs = sqlite3_vfs_find(NULL);
    assert_non_null(real_vfs);
    shim_vfs = (sqlite3_vfs){.iVersion = 2,
                             .szOsFile = (int)sizeof(struct shim_file) + real_vfs->szOsFile,
                             .mxPathname = real_vfs->mxPathname,
                             .zName = "faultshim",
                             .xOpen = shim_open,
                             .xDelete = shim_delete,
                             .xAccess = shim_access,
                             .xFullPathname = shim_fullpath,
                             .xDlOpen = shim_dlopen,
                             .xDlError = shim_dlerror,
                             .xDlSym = shim_dlsym,
                             .xDlClose = shim_dlclose,
                             .xRandomness = shim_random,
                             .xSleep = shim_sleep,
                             .xCurrentTime = shim_time,
                             .xGetLastError = shim_lasterr,
                             .xCurrentTimeInt64 = shim_time64};
    assert_int_equal(sqlite3_vfs_register(&shim_vfs, 1), SQLITE_OK);
}

/* --------------------------------------------------------- the daemon */

struct hooks {
    struct stream *stream;
    struct alerter *alerter;
};

static void on_commit(void *ctx, const struct writer_item *items, double ms) {
    struct hooks *hk = ctx;
    stream_on_commit(hk->stream, items);
    alerter_on_commit(hk->alerter, items);
}

static void on_tick(void *ctx, double now) {
    struct hooks *hk = ctx;
    alerter_on_tick(hk->alerter, now);
}

static struct daemon {
    char dir[64], db[128], sock[128];
    struct store *st;
    struct writer *w;
    struct ingest *ing;
    struct stream *stream;
    struct alerter *mon;
    struct hooks hooks;
    int efd;
    pthread_t thread;
    int run_rc;
} D;

static void *ingest_thread(void *arg) {
    D.run_rc = ingest_run(D.ing, 5000);
    return NULL;
}

static void daemon_start(void) {
    char err[512];
    memset(&D, 0, sizeof D);
    snprintf(D.dir, sizeof D.dir, "/tmp/test_faults.XXXXXX");
    assert_non_null(mkdtemp(D.dir));
    snprintf(D.db, sizeof D.db, "%s/entropyd.db", D.dir);
    snprintf(D.sock, sizeof D.sock, "%s/entropyd.sock", D.dir);
    D.st = store_open(D.db, err, sizeof err);
    if (!D.st) fail_msg("store_open: %s", err);
    D.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert_true(D.efd >= 0);
    struct stream_config scfg = {.max_events = 1024};
    D.stream = stream_create(&scfg, err, sizeof err);
    assert_non_null(D.stream);
    struct alerter_config mcfg = {.store = D.st, .stream = D.stream};
    D.mon = alerter_create(&mcfg, err, sizeof err);
    if (!D.mon) fail_msg("alerter_create: %s", err);
    D.hooks = (struct hooks){D.stream, D.mon};
    struct writer_config wcfg = {.on_commit = on_commit, .on_tick = on_tick, .ctx = &D.hooks};
    D.w = writer_create(D.st, D.efd, &wcfg, err, sizeof err);
    assert_non_null(D.w);
    alerter_set_writer(D.mon, D.w);
    struct ingest_config icfg = {.socket_path = D.sock};
    D.ing = ingest_create(&icfg, D.w, D.efd, err, sizeof err);
    if (!D.ing) fail_msg("ingest_create: %s", err);
    assert_int_equal(pthread_create(&D.thread, NULL, ingest_thread, NULL), 0);
}

static void daemon_stop(void) {
    ingest_stop(D.ing);
    pthread_join(D.thread, NULL);
    assert_int_equal(D.run_rc, 0);
    ingest_destroy(D.ing);
    writer_destroy(D.w);
    alerter_destroy(D.mon, 1000);
    stream_destroy(D.stream);
    store_close(D.st);
    close(D.efd);
    assert_int_equal(rmtree(D.dir), 0);
}

/* ------------------------------------------------------------ a trainer */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static float value_of(int64_t step, int l, int h) { return (float)((step * 7 + l * 3 + h) % 101) / 10.0f; }

/* The line of message seq of a session of n messages: steps (step = 10*seq),
 * then an event, then end. */
static int session_line(char *out, size_t cap, int64_t seq, int64_t n) {
    if (seq == n)
        return snprintf(out, cap, "{\"type\":\"end\",\"seq\":%lld,\"status\":\"finished\"}\n", (long long)seq);
    if (seq == n - 1)
        return snprintf(out, cap, "{\"type\":\"event\",\"seq\":%lld,\"level\":\"warn\",\"text\":\"event %lld\"}\n",
                        (long long)seq, (long long)seq);
    int64_t step = seq * 10;
    int k = snprintf(out, cap,
                     "{\"type\":\"step\",\"seq\":%lld,\"step\":%lld,\"scalars\":{\"loss\":%.3f},"
                     "\"layers\":{\"rank_ratio\":[0.5,0.25]},\"heads\":{\"entropy_norm\":[",
                     (long long)seq, (long long)step, 3.0 - seq * 0.01);
    for (int l = 0; l < 2; l++) {
        k += snprintf(out + k, cap - (size_t)k, "%s[", l ? "," : "");
        for (int h = 0; h < 3; h++) k += snprintf(out + k, cap - (size_t)k, "%s%g", h ? "," : "", value_of(step, l, h));
        k += snprintf(out + k, cap - (size_t)k, "]");
    }
    return k + snprintf(out + k, cap - (size_t)k, "]}}\n");
}

struct conn {
    int fd;
    char buf[65536];
    size_t len;
};

static int conn_open(struct conn *c, const char *path) {
    c->len = 0;
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (c->fd >= 0) close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

static void conn_close(struct conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Next line from the daemon into line (NUL-terminated), waiting at most
 * ms. 1 a line, 0 timeout, -1 closed. */
static int conn_line(struct conn *c, char *line, size_t cap, int ms) {
    double end = now_s() + ms / 1e3;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl) {
            size_t n = (size_t)(nl - c->buf);
            snprintf(line, cap, "%.*s", (int)n, c->buf);
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            return 1;
        }
        int left = (int)((end - now_s()) * 1e3);
        if (left <= 0) return 0;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) continue;
        if (c->len == sizeof c->buf) c->len = 0; /* a line this long is not ours to read */
        ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (r <= 0) return -1;
        c->len += (size_t)r;
    }
}

static int64_t field_i64(const char *line, const char *key) {
    const char *p = strstr(line, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

struct session_stats {
    int reconnects, internal_errors, timeouts, welcome_timeouts;
};

/* Runs a whole session of n messages for run, as a careful trainer:
 * hello, send everything after last_seq, wait for the acks; on a missing
 * reply (ms), an error other than duplicate, or a closed connection,
 * reconnect and resend. Returns 0 once seq n is acked, -1 past deadline_s. */
static int session(const char *sock, const char *run, int64_t n, int ms, double deadline_s, struct session_stats *ss) {
    char line[70000], out[4096];
    double deadline = now_s() + deadline_s;
    struct conn c = {.fd = -1};
    while (now_s() < deadline) {
        conn_close(&c);
        if (conn_open(&c, sock)) {
            ss->reconnects++;
            usleep(20000); /* not a wait: a reconnecting trainer's pause */
            continue;
        }
        int k = snprintf(out, sizeof out,
                         "{\"type\":\"hello\",\"protocol\":1,\"run\":\"%s\",\"layers\":2,\"heads\":3,\"seq_len\":8}\n",
                         run);
        if (send_all(c.fd, out, (size_t)k)) goto again;
        int64_t last = -1;
        for (;;) {
            int r = conn_line(&c, line, sizeof line, ms);
            if (r <= 0) {
                ss->timeouts += r == 0;
                ss->welcome_timeouts += r == 0;
                goto again;
            }
            if (strstr(line, "\"welcome\"")) {
                last = field_i64(line, "\"last_seq\":");
                break;
            }
            if (strstr(line, "\"error\"")) {
                ss->internal_errors += strstr(line, "\"internal\"") != NULL;
                goto again;
            }
        }
        if (last >= n) {
            conn_close(&c);
            return 0;
        }
        for (int64_t s = last + 1; s <= n; s++) {
            k = session_line(out, sizeof out, s, n);
            if (send_all(c.fd, out, (size_t)k)) goto again;
        }
        for (;;) {
            int r = conn_line(&c, line, sizeof line, ms);
            if (r <= 0) {
                ss->timeouts += r == 0;
                goto again;
            }
            if (strstr(line, "\"ack\"") && field_i64(line, "\"seq\":") >= n) {
                conn_close(&c);
                return 0;
            }
            if (strstr(line, "\"error\"") && !strstr(line, "\"duplicate\"") && !strstr(line, "\"kind_conflict\"")) {
                ss->internal_errors += strstr(line, "\"internal\"") != NULL;
                goto again;
            }
        }
    again:
        ss->reconnects++;
    }
    conn_close(&c);
    return -1;
}

/* ------------------------------------------------------------ checks */

/* Checks through a connection of its own that run holds the session of n
 * messages exactly: steps 10, 20, ... once each with their seq, each
 * metric's frame per step with the values sent, one event. */
static void check_session(const char *db, const char *run, int64_t n) {
    sqlite3 *h;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    shadow_frames(h);
    sqlite3_busy_timeout(h, 5000);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT id, last_seq FROM runs WHERE name = ?", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_text(s, 1, run, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    int64_t id = sqlite3_column_int64(s, 0);
    assert_int_equal(sqlite3_column_int64(s, 1), n);
    sqlite3_finalize(s);
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT step, seq FROM steps WHERE run_id = ? ORDER BY step", -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, id);
    int64_t i = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        i++;
        if (sqlite3_column_int64(s, 0) != i * 10 || sqlite3_column_int64(s, 1) != i)
            fail_msg("run %s: row %lld is step %lld seq %lld", run, (long long)i, (long long)sqlite3_column_int64(s, 0),
                     (long long)sqlite3_column_int64(s, 1));
    }
    sqlite3_finalize(s);
    if (i != n - 2) fail_msg("run %s: %lld steps stored, %lld sent", run, (long long)i, (long long)(n - 2));
    assert_int_equal(sqlite3_prepare_v2(h,
                                        "SELECT f.step, f.data FROM frames f JOIN metrics m ON m.id = f.metric_id "
                                        "WHERE m.run_id = ? AND m.name = 'entropy_norm' ORDER BY f.step",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, id);
    i = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        i++;
        int64_t step = sqlite3_column_int64(s, 0);
        assert_int_equal(step, i * 10);
        assert_int_equal(sqlite3_column_bytes(s, 1), 6 * 4);
        const float *v = sqlite3_column_blob(s, 1);
        for (int l = 0; l < 2; l++)
            for (int hh = 0; hh < 3; hh++) {
                float want = value_of(step, l, hh), got;
                memcpy(&got, &v[l * 3 + hh], 4);
                if (fabsf(got - want) > 1e-6f) fail_msg("run %s step %lld: %g != %g", run, (long long)step, got, want);
            }
    }
    sqlite3_finalize(s);
    assert_int_equal(i, n - 2);
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT count(*) FROM events WHERE run_id = ? AND seq = ?", -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, n - 1);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(s, 0), 1);
    sqlite3_finalize(s);
    sqlite3_close(h);
}

static void check_integrity(const char *db) {
    sqlite3 *h;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    shadow_frames(h);
    sqlite3_busy_timeout(h, 5000);
    assert_int_equal(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(h);
}

/* env_long: tests/fixture.h. */

/* ------------------------------------------------------------ tests */

static void test_every_allocation_fails_once(void **state) {
    fi_exempt = 1;
    daemon_start();
    const int64_t n = 6; /* hello, 4 steps, event, end */
    long max_n = env_long("FAULTS_MAX_N", 0), stride = env_long("FAULTS_STRIDE", 1);
    struct session_stats ss = {0};
    char run[64];
    /* a session with nothing failing first: the daemon is warm, as in service */
    assert_int_equal(session(D.sock, "warmup", n, 2000, 20, &ss), 0);
    long reached = 0, fired = 0, slow = 0;
    double t0 = now_s();
    for (long i = 1; max_n == 0 || i <= max_n; i += stride) {
        snprintf(run, sizeof run, "fault-%ld", i);
        fi_arm(i);
        double ts = now_s();
        int rc = session(D.sock, run, n, 300, 60, &ss);
        fi_disarm();
        if (rc) fail_msg("allocation %ld failing: the session did not complete within 60 s", i);
        if (now_s() - ts > 1.0) slow++;
        check_session(D.db, run, n);
        if (!atomic_load(&fi_fired)) break; /* the session no longer reaches allocation i */
        fired++;
        reached = i;
    }
    /* still serving, nothing leaks into later runs */
    assert_int_equal(session(D.sock, "after", n, 2000, 20, &ss), 0);
    check_session(D.db, "after", n);
    check_integrity(D.db);
    daemon_stop();
    printf("allocation failures: %ld injected (allocations 1..%ld of a session, stride %ld), every session "
           "complete and stored exactly once; %d reconnects, %d internal errors, %d reply timeouts (%d waiting for "
           "a welcome), %ld sessions over 1 s; %.1f s\n",
           fired, reached, stride, ss.reconnects, ss.internal_errors, ss.timeouts, ss.welcome_timeouts, slow,
           now_s() - t0);
    assert_true(fired > 50); /* the test reached the daemon's allocations at all */
    /* a lost ack is made good by the next welcome; a lost welcome would
     * leave the trainer waiting for it (until its own timeout) */
    assert_int_equal(ss.welcome_timeouts, 0);
}

/* A trainer streaming steps of one run while the database fails. */
struct streamer {
    const char *sock;
    atomic_int stop;
    _Atomic int64_t sent, acked;
    struct session_stats ss;
};

static void *streamer_main(void *arg) {
    fi_exempt = 1;
    struct streamer *t = arg;
    char line[70000], out[4096];
    struct conn c = {.fd = -1};
    const int64_t total = 1 << 30; /* never sends end */
    while (!atomic_load(&t->stop) || t->acked < t->sent) {
        conn_close(&c);
        if (conn_open(&c, t->sock)) {
            usleep(20000); /* not a wait: a reconnecting trainer's pause */
            continue;
        }
        int k =
            snprintf(out, sizeof out,
                     "{\"type\":\"hello\",\"protocol\":1,\"run\":\"stream\",\"layers\":2,\"heads\":3,\"seq_len\":8}\n");
        if (send_all(c.fd, out, (size_t)k)) goto again;
        for (;;) {
            int r = conn_line(&c, line, sizeof line, 15000);
            if (r <= 0) goto again;
            if (strstr(line, "\"welcome\"")) {
                t->acked = field_i64(line, "\"last_seq\":");
                break;
            }
        }
        int64_t seq = t->acked;
        while (!atomic_load(&t->stop) || t->acked < t->sent) {
            if (!atomic_load(&t->stop) && seq < t->acked + 500) {
                k = session_line(out, sizeof out, ++seq, total);
                if (send_all(c.fd, out, (size_t)k)) goto again;
                if (seq > t->sent) t->sent = seq;
            }
            int r = conn_line(&c, line, sizeof line, atomic_load(&t->stop) ? 15000 : 2);
            if (r < 0) goto again;
            if (r == 0) {
                if (atomic_load(&t->stop) && t->acked < t->sent) goto again;
                continue;
            }
            if (strstr(line, "\"ack\"")) t->acked = field_i64(line, "\"seq\":");
            else if (strstr(line, "\"error\"") && !strstr(line, "\"duplicate\"")) goto again;
        }
        break;
    again:
        t->ss.reconnects++;
    }
    conn_close(&c);
    return NULL;
}

static void test_sqlite_errors(void **state) {
    fi_exempt = 1;
    shim_register();
    daemon_start();
    struct streamer t = {.sock = D.sock};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, streamer_main, &t), 0);
    /* each phase must find steps flowing: the streamer welcomed and acked */
    WAIT_UNTIL(atomic_load(&t.acked) > 0, 30000, usleep(10000));
    struct {
        const char *name;
        int write_err, busy;
        int ms;
    } phases[] = {{"SQLITE_IOERR_WRITE", SQLITE_IOERR_WRITE, 0, 600},
                  {"SQLITE_FULL", SQLITE_FULL, 0, 600},
                  {"SQLITE_BUSY", 0, 1, (int)env_long("FAULTS_BUSY_MS", 11000)}};
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        struct writer_stats before, after;
        writer_get_stats(D.w, &before);
        int64_t acked_before = t.acked;
        atomic_store(&vfs_write_err, phases[i].write_err);
        atomic_store(&vfs_busy, phases[i].busy);
        usleep((useconds_t)phases[i].ms * 1000); /* not a wait: how long the fault lasts */
        atomic_store(&vfs_write_err, 0);
        atomic_store(&vfs_busy, 0);
        /* wait for what was sent during the phase to commit */
        int64_t sent = t.sent;
        double end = now_s() + 30;
        while (now_s() < end && t.acked < sent) usleep(10000);
        writer_get_stats(D.w, &after);
        printf("%-20s %5d ms: writer retries %llu, db errors %llu, acked %lld -> %lld\n", phases[i].name, phases[i].ms,
               (unsigned long long)(after.retries - before.retries),
               (unsigned long long)(after.db_errors - before.db_errors), (long long)acked_before, (long long)t.acked);
        if (after.retries == before.retries) fail_msg("%s never reached the writer", phases[i].name);
        assert_true(t.acked >= sent && sent > acked_before);
    }
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    assert_int_equal(t.acked, t.sent);
    printf("injected %ld VFS errors; %lld steps sent and acked, %d reconnects\n", (long)atomic_load(&vfs_injected),
           (long long)t.sent, t.ss.reconnects);
    /* every step sent is stored once, in order, nothing more */
    sqlite3 *h;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open_v2(D.db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    shadow_frames(h);
    assert_int_equal(
        sqlite3_prepare_v2(h,
                           "SELECT count(*), count(DISTINCT seq), min(seq), max(seq), sum(step = seq * 10) "
                           "FROM steps WHERE run_id = (SELECT id FROM runs WHERE name = 'stream')",
                           -1, &s, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    for (int c = 0; c < 5; c++) {
        int64_t want = c == 2 ? 1 : t.sent;
        if (sqlite3_column_int64(s, c) != want)
            fail_msg("steps column %d: %lld, want %lld", c, (long long)sqlite3_column_int64(s, c), (long long)want);
    }
    sqlite3_finalize(s);
    sqlite3_close(h);
    check_integrity(D.db);
    daemon_stop();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
        cmocka_unit_test(test_sqlite_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
