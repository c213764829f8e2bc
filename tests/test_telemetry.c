/* test_telemetry.c -- the protocol v1 client against a fake daemon.
 *
 * The fake daemon is a thread with a listening socket (Unix, or TCP on port
 * 0) that speaks enough of protocol v1: answers hello with welcome (a chosen
 * last_seq), stores data lines by seq like entropyd (duplicates and gaps are
 * counted and answered with errors, never stored), acks, and can refuse,
 * close mid-stream, forget uncommitted lines, stall, or inject lines. It
 * reads every line with the daemon's parser (proto_parse) and answers with
 * the daemon's writers; each test checks bad_json == 0 (nothing refused).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "proto.h"
#include "telemetry.h"
#include "telemetry_int.h" /* asleep: whether a paced sender sleeps */

/* ---------------------------------------------------------------- helpers */

/* msleep, rmtree, WAIT_UNTIL: tests/fixture.h. */

/* Polls cond every 2 ms for at most ms milliseconds. */
#define WAIT_FOR(cond, ms) WAIT_UNTIL(cond, ms, msleep(2))

typedef struct env {
    char dir[64];
    char sock[128];
    char addr[160];
    char spool[128];
} env;

static void env_init(env *e) {
    snprintf(e->dir, sizeof e->dir, "/tmp/ttel-XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    snprintf(e->sock, sizeof e->sock, "%s/d.sock", e->dir);
    snprintf(e->addr, sizeof e->addr, "unix:%s", e->sock);
    snprintf(e->spool, sizeof e->spool, "%s/spool", e->dir);
}

static void env_free(env *e) { rmtree(e->dir); }

static int count_segments(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "seg-", 4)) n++;
    closedir(d);
    return n;
}

static telemetry_stats stats(telemetry *t) {
    telemetry_stats s;
    telemetry_get_stats(t, &s);
    return s;
}

/* ---------------------------------------------------------------- fake daemon */

enum { F_NORMAL, F_STALL, F_REFUSE };

typedef struct fake {
    char path[128];
    int tcp, port;
    int lfd;
    pthread_t th;
    pthread_mutex_t mu;
    atomic_int stop;
    atomic_int mode;
    /* behaviour, under mu */
    int ack;             /* send acks */
    long long last;      /* highest stored seq */
    int close_after;     /* close the connection after this many data lines (once) */
    long long forget_to; /* on that close, forget stored lines above this (-1: keep) */
    int keep_open;       /* forget without closing: later lines become gaps */
    const char *inject[4];
    int n_inject;
    /* records, under mu */
    char **lines;
    int nlines, linecap;
    long long *stored;
    int nstored, storecap;
    int duplicates, gaps, bad_json, hellos, connections;
    long long first_data_seq[16]; /* first data seq of each connection */
} fake;

static void fake_record(fake *f, const char *line, size_t n) {
    if (f->nlines == f->linecap) {
        f->linecap = f->linecap ? 2 * f->linecap : 64;
        f->lines = realloc(f->lines, (size_t)f->linecap * sizeof *f->lines);
    }
    f->lines[f->nlines++] = strndup(line, n);
}

static void fake_store(fake *f, long long seq) {
    if (f->nstored == f->storecap) {
        f->storecap = f->storecap ? 2 * f->storecap : 256;
        f->stored = realloc(f->stored, (size_t)f->storecap * sizeof *f->stored);
    }
    f->stored[f->nstored++] = seq;
}

static void fake_send(int fd, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    buf[n++] = '\n';
    if (send(fd, buf, (size_t)n, MSG_NOSIGNAL) < 0) { /* the client went away */
    }
}

static void fake_reply(int fd, const char *line, size_t n) {
    if (send(fd, line, n, MSG_NOSIGNAL) < 0) { /* the client went away */
    }
}

/* Handles one line; returns 1 to close the connection. The line is read by
 * the daemon's own parser (proto_parse): what it refuses counts as bad_json
 * and is answered with its error, as entropyd would. */
static int fake_line(fake *f, int fd, int conn, int *data_lines, int *welcomed, const char *line, size_t n) {
    pthread_mutex_lock(&f->mu);
    fake_record(f, line, n);
    struct proto_msg msg;
    memset(&msg, 0, sizeof msg);
    char err[256], out[1024];
    int close_it = 0, rc = proto_parse(line, n, &msg, err, sizeof err);
    if (rc != PROTO_OK) {
        f->bad_json++;
        fake_reply(fd, out, proto_write_error(out, sizeof out, rc, err, msg.has_seq, msg.seq));
        goto out;
    }
    if (msg.type == PROTO_HELLO) {
        f->hellos++;
        fake_reply(fd, out, proto_write_welcome(out, sizeof out, 1, (uint64_t)f->last));
        for (int i = 0; i < f->n_inject; i++) fake_send(fd, "%s", f->inject[i]);
        *welcomed = 1;
        goto out;
    }
    long long seq = msg.seq;
    if (conn < 16 && f->first_data_seq[conn] == 0) f->first_data_seq[conn] = seq;
    if (seq <= f->last) {
        f->duplicates++;
        fake_reply(fd, out, proto_write_error(out, sizeof out, PROTO_E_DUPLICATE, "dup", 1, seq));
    } else if (seq > f->last + 1) {
        f->gaps++;
        fake_reply(fd, out, proto_write_error(out, sizeof out, PROTO_E_SEQ_GAP, "gap", 1, seq));
    } else {
        f->last = seq;
        fake_store(f, seq);
    }
    if (f->close_after && ++*data_lines >= f->close_after) {
        f->close_after = 0;
        if (f->forget_to >= 0) {
            while (f->nstored && f->stored[f->nstored - 1] > f->forget_to) f->nstored--;
            f->last = f->forget_to;
            f->forget_to = -1;
        }
        f->ack = 1;
        close_it = !f->keep_open;
    }
out:
    proto_msg_free(&msg);
    pthread_mutex_unlock(&f->mu);
    return close_it;
}

static void fake_serve(fake *f, int fd, int conn) {
    char *buf = malloc(8 << 20);
    size_t len = 0;
    int data_lines = 0, welcomed = 0;
    long long acked = -1;
    while (!atomic_load(&f->stop)) {
        if (welcomed && atomic_load(&f->mode) == F_STALL) {
            msleep(5); /* not a wait: a stalled daemon reads nothing */
            continue;
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10) <= 0) continue;
        ssize_t r = recv(fd, buf + len, (8 << 20) - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
        size_t start = 0;
        int close_it = 0;
        for (size_t i = 0; i < len && !close_it; i++) {
            if (buf[i] != '\n') continue;
            close_it = fake_line(f, fd, conn, &data_lines, &welcomed, buf + start, i - start);
            start = i + 1;
            if (welcomed && atomic_load(&f->mode) == F_STALL) break;
        }
        if (close_it) break;
        memmove(buf, buf + start, len - start);
        len -= start;
        pthread_mutex_lock(&f->mu);
        if (f->ack && welcomed && f->last != acked) {
            acked = f->last;
            char out[64];
            fake_reply(fd, out, proto_write_ack(out, sizeof out, (uint64_t)acked));
        }
        pthread_mutex_unlock(&f->mu);
    }
    free(buf);
    close(fd);
}

static void *fake_main(void *arg) {
    fake *f = arg;
    int conn = 0;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {f->lfd, POLLIN, 0};
        if (poll(&p, 1, 10) <= 0) continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0) continue;
        pthread_mutex_lock(&f->mu);
        f->connections++;
        pthread_mutex_unlock(&f->mu);
        if (atomic_load(&f->mode) == F_REFUSE) {
            close(fd);
            continue;
        }
        fake_serve(f, fd, conn++);
    }
    return NULL;
}

/* Starts a fake daemon on path (Unix) or, with path NULL, on 127.0.0.1:0. */
static fake *fake_start(const char *path, long long last, int ack) {
    fake *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    f->last = last;
    f->ack = ack;
    f->forget_to = -1;
    if (path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(f->path, sizeof f->path, "%s", path);
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        unlink(path);
        f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
        assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    } else {
        struct sockaddr_in sa = {.sin_family = AF_INET};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        f->tcp = 1;
        f->lfd = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
        socklen_t sl = sizeof sa;
        getsockname(f->lfd, (struct sockaddr *)&sa, &sl);
        f->port = ntohs(sa.sin_port);
    }
    assert_int_equal(listen(f->lfd, 16), 0);
    pthread_create(&f->th, NULL, fake_main, f);
    return f;
}

static void fake_stop(fake *f) {
    if (!f) return;
    atomic_store(&f->stop, 1);
    pthread_join(f->th, NULL);
    close(f->lfd);
    if (!f->tcp) unlink(f->path);
    for (int i = 0; i < f->nlines; i++) free(f->lines[i]);
    free(f->lines);
    free(f->stored);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static int fake_get(fake *f, const int *field) {
    pthread_mutex_lock(&f->mu);
    int v = *field;
    pthread_mutex_unlock(&f->mu);
    return v;
}

/* The stored seqs are exactly 1..n (or first..first+n-1), once each, in order. */
static void assert_stored_exactly(fake *f, long long first, int n) {
    pthread_mutex_lock(&f->mu);
    int got = f->nstored;
    int ok = got == n;
    for (int i = 0; ok && i < n; i++) ok = f->stored[i] == first + i;
    int bad = f->bad_json;
    pthread_mutex_unlock(&f->mu);
    if (!ok) fail_msg("stored %d seqs, expected %lld..%lld in order", got, first, first + n - 1);
    assert_int_equal(bad, 0);
}

/* The data line with this seq, parsed (caller deletes), or NULL. */
static cJSON *fake_find(fake *f, long long seq) {
    cJSON *found = NULL;
    pthread_mutex_lock(&f->mu);
    for (int i = f->nlines - 1; i >= 0 && !found; i--) {
        cJSON *j = cJSON_Parse(f->lines[i]);
        cJSON *sq = cJSON_GetObjectItem(j, "seq");
        if (cJSON_IsNumber(sq) && (long long)sq->valuedouble == seq) found = j;
        else cJSON_Delete(j);
    }
    pthread_mutex_unlock(&f->mu);
    return found;
}

static void base_config(telemetry_config *c, const env *e, const char *run, int L, int H) {
    telemetry_config_init(c);
    c->address = e->addr;
    c->run = run;
    c->layers = L;
    c->heads = H;
    c->seq_len = 16;
    c->spool_dir = e->spool;
    c->backoff_min_ms = 5;
    c->backoff_max_ms = 50;
}

static telemetry *create_ok(const telemetry_config *c) {
    char err[256] = "";
    telemetry *t = telemetry_create(c, err, sizeof err);
    if (!t) fail_msg("telemetry_create: %s", err);
    return t;
}

/* One step with a scalar, a layer vector and a head matrix, values from i. */
static void put_step(telemetry *t, int64_t step, int L, int H) {
    float lv[64], hv[4096];
    for (int l = 0; l < L; l++) lv[l] = (float)step + 0.25f * (float)l;
    for (int k = 0; k < L * H; k++) hv[k] = 1.0f / (float)(k + 1) + (float)step;
    telemetry_step *s = telemetry_step_begin(t, step, 1764500000.25 + (double)step);
    assert_non_null(s);
    assert_int_equal(telemetry_step_scalar(s, "loss", 2.5 + (double)step), TELEMETRY_OK);
    assert_int_equal(telemetry_step_layer(s, "rank_ratio", lv), TELEMETRY_OK);
    assert_int_equal(telemetry_step_heads(s, "entropy", hv), TELEMETRY_OK);
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
}

/* ---------------------------------------------------------------- tests */

static void test_format_float(void **state) {
    char b[32];
    struct {
        float v;
        const char *s;
    } cases[] = {
        {0.0f, "0"},
        {0.5f, "0.5"},
        {1.0f, "1"},
        {-2.5f, "-2.5"},
        {0.1f, "0.1"},
        {0.001f, "0.001"},
        {100.0f, "100"},
        {1e10f, "10000000000"},
        {1.5e-7f, "1.5e-7"},
        {123456.789f, "123456.79"},
        {16777216.0f, "16777216"},
        {3e-5f, "0.00003"},
        {1e-6f, "1e-6"},
        {NAN, "null"},
        {INFINITY, "null"},
        {-INFINITY, "null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = telemetry_format_float(b, cases[i].v);
        b[n] = 0;
        assert_string_equal(b, cases[i].s);
    }
    /* Round trip over random bit patterns, extremes and subnormals included;
     * every output must be a complete JSON number of at most 9 digits. */
    uint32_t x = 12345;
    for (int i = 0; i < 300000; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        uint32_t bits = i < 100 ? (uint32_t)i : x;
        float v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v)) continue;
        int n = telemetry_format_float(b, v);
        b[n] = 0;
        char *end;
        float back = strtof(b, &end);
        if (*end || back != v) fail_msg("%.9g formatted as %s reads back as %.9g", (double)v, b, (double)back);
        int digits = 0, leading = 1;
        for (char *p = b; *p && *p != 'e'; p++) {
            if (*p >= '1' && *p <= '9') leading = 0;
            if (*p >= '0' && *p <= '9' && !leading) digits++;
        }
        if (digits > 9 && !strchr(b, 'e')) {
            /* plain notation of a large integer-valued float: fine if exact */
            assert_true(fabsf(v) >= 1e9f);
        }
        assert_true(b[0] == '-' || (b[0] >= '0' && b[0] <= '9'));
        assert_false(n >= 2 && b[0] == '0' && b[1] >= '0' && b[1] <= '9'); /* no leading zeros */
    }
}

/* telemetry_step_log: a whole step in one call sends what the per-metric
 * calls send (NaN as null, no time when negative); a bad name, too many
 * metrics or a negative step enqueue nothing. */
static void test_step_log_one_call(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    telemetry_config c;
    base_config(&c, &e, "one-call", 2, 3);
    c.max_head_metrics = 2;
    telemetry *t = create_ok(&c);
    const char *sn[] = {"loss", "lr"}, *ln[] = {"rank_ratio"}, *hn[] = {"entropy", "max_logit"};
    double sv[] = {2.5, 1e-3};
    float lv[2] = {0.25f, 0.5f}, hv[12];
    for (int k = 0; k < 12; k++) hv[k] = (float)k + 0.5f;
    hv[7] = NAN;
    assert_int_equal(telemetry_step_log(t, 7, 1764500000.5, 2, sn, sv, 1, ln, lv, 2, hn, hv), TELEMETRY_OK);
    const char *bad[] = {"ok", "bad name"};
    assert_int_equal(telemetry_step_log(t, 8, 0, 2, bad, sv, 0, NULL, NULL, 0, NULL, NULL), TELEMETRY_EINVAL);
    const char *three[] = {"a", "b", "c"};
    float h3[18] = {0};
    assert_int_equal(telemetry_step_log(t, 8, 0, 0, NULL, NULL, 0, NULL, NULL, 3, three, h3), TELEMETRY_EINVAL);
    assert_int_equal(telemetry_step_log(t, -1, 0, 0, NULL, NULL, 0, NULL, NULL, 0, NULL, NULL), TELEMETRY_EINVAL);
    assert_int_equal(telemetry_step_log(t, 9, -1, 0, NULL, NULL, 0, NULL, NULL, 0, NULL, NULL), TELEMETRY_OK);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    assert_int_equal(stats(t).enqueued, 2);
    cJSON *j = fake_find(f, 1);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, 7);
    assert_true(cJSON_GetObjectItem(j, "time")->valuedouble == 1764500000.5);
    cJSON *sc = cJSON_GetObjectItem(j, "scalars");
    assert_true(cJSON_GetObjectItem(sc, "loss")->valuedouble == 2.5);
    assert_true((float)cJSON_GetObjectItem(sc, "lr")->valuedouble == 1e-3f);
    cJSON *rr = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "layers"), "rank_ratio");
    assert_true(cJSON_GetArrayItem(rr, 1)->valuedouble == 0.5);
    cJSON *ml = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "heads"), "max_logit");
    assert_true(cJSON_GetArrayItem(cJSON_GetArrayItem(ml, 1), 2)->valuedouble == 11.5);
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(ml, 0), 1))); /* hv[7]: NaN */
    cJSON_Delete(j);
    j = fake_find(f, 2);
    assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, 9);
    assert_null(cJSON_GetObjectItem(j, "time"));
    cJSON_Delete(j);
    assert_int_equal(telemetry_destroy(t, NULL, 0), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

static void test_hello_and_every_line(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    telemetry_config c;
    base_config(&c, &e, "hello-run", 2, 3);
    c.meta_json = "{\n \"model\": \"gpt\", \"lr\": 0.001, \"nested\": {\"a\": [1, 2]}\n}";
    c.token = "s3cr\"et";
    telemetry *t = create_ok(&c);
    assert_string_equal(telemetry_run_name(t), "hello-run");
    for (int i = 0; i < 5; i++) put_step(t, i, 2, 3);
    assert_int_equal(telemetry_event(t, "warn", "a \"q\"\n\xc3\xa9\xff end"), TELEMETRY_OK);
    assert_int_equal(telemetry_destroy(t, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 7);

    pthread_mutex_lock(&f->mu);
    cJSON *h = cJSON_Parse(f->lines[0]);
    pthread_mutex_unlock(&f->mu);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(h, "type")), "hello");
    assert_int_equal(cJSON_GetObjectItem(h, "protocol")->valueint, 1);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(h, "run")), "hello-run");
    assert_int_equal(cJSON_GetObjectItem(h, "layers")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(h, "heads")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(h, "seq_len")->valueint, 16);
    cJSON *meta = cJSON_GetObjectItem(h, "meta");
    assert_true(cJSON_IsObject(meta));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(meta, "model")), "gpt");
    assert_true(cJSON_GetObjectItem(meta, "lr")->valuedouble == 0.001);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(h, "token")), "s3cr\"et");
    cJSON_Delete(h);

    for (int i = 0; i < 5; i++) {
        cJSON *j = fake_find(f, i + 1);
        assert_non_null(j);
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "type")), "step");
        assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, i);
        assert_true(cJSON_GetObjectItem(j, "time")->valuedouble == 1764500000.25 + i);
        assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "scalars"), "loss")->valuedouble ==
                    (double)(float)(2.5 + i));
        cJSON *rr = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "layers"), "rank_ratio");
        assert_int_equal(cJSON_GetArraySize(rr), 2);
        assert_true((float)cJSON_GetArrayItem(rr, 1)->valuedouble == (float)i + 0.25f);
        cJSON *en = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "heads"), "entropy");
        assert_int_equal(cJSON_GetArraySize(en), 2);
        for (int l = 0; l < 2; l++) {
            cJSON *row = cJSON_GetArrayItem(en, l);
            assert_int_equal(cJSON_GetArraySize(row), 3);
            for (int hh = 0; hh < 3; hh++)
                assert_true((float)cJSON_GetArrayItem(row, hh)->valuedouble ==
                            1.0f / (float)(l * 3 + hh + 1) + (float)i);
        }
        cJSON_Delete(j);
    }
    cJSON *ev = fake_find(f, 6);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ev, "type")), "event");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ev, "level")), "warn");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ev, "text")), "a \"q\"\n\xc3\xa9? end");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(ev, "time")));
    cJSON_Delete(ev);
    cJSON *end = fake_find(f, 7);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(end, "type")), "end");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(end, "status")), "finished");
    cJSON_Delete(end);
    fake_stop(f);
    env_free(&e);
}

/* Paced (send_interval_ms): once connected and caught up the sender sleeps
 * a whole interval, so steps enqueued meanwhile wait in the spool; a flush
 * wakes it at once, and everything arrives exactly once. */
static void test_paced_sender_waits_for_its_interval(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    telemetry_config c;
    base_config(&c, &e, "paced-run", 2, 3);
    c.send_interval_ms = 20000;
    telemetry *t = create_ok(&c);
    put_step(t, 1, 2, 3);
    /* a flush sends the first step at once, whenever it was enqueued */
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    assert_int_equal(stats(t).sent, 1);
    /* once the sender sleeps again, these wait for its next wake-up, 20 s
     * away */
    WAIT_FOR(atomic_load(&t->asleep), 5000);
    for (int i = 2; i <= 4; i++) put_step(t, i, 2, 3);
    double t0 = now_mono_ms();
    while (now_mono_ms() - t0 < 300) {
        assert_int_equal(stats(t).sent, 1);
        msleep(10); /* not a wait: 300 ms in which nothing may be sent */
    }
    /* they wait in the ring, not yet in the spool: the sender drains the
     * ring at its wake-up too */
    assert_int_equal(stats(t).spooled, 1);
    assert_int_equal(telemetry_flush(t, 10000), TELEMETRY_OK);
    assert_true(now_mono_ms() - t0 < 10000); /* woken by the flush, not by its interval */
    assert_int_equal(telemetry_destroy(t, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 5);
    fake_stop(f);
    env_free(&e);
}

/* A paced sender asleep for a long interval is woken once the ring is half
 * full: a producer faster than the interval loses nothing. */
static void test_paced_sender_woken_by_half_full_ring(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    telemetry_config c;
    base_config(&c, &e, "kick-run", 2, 3);
    c.send_interval_ms = 20000;
    c.queue_slots = 32;
    telemetry *t = create_ok(&c);
    put_step(t, 0, 2, 3);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    WAIT_FOR(atomic_load(&t->asleep), 5000);
    /* 200 steps, 2 ms apart: the ring holds 32, so a sender that slept
     * through them would drop most of them */
    for (int i = 1; i <= 200; i++) {
        put_step(t, i, 2, 3);
        msleep(2); /* not a wait: paces the steps */
    }
    assert_int_equal(stats(t).dropped_queue, 0);
    assert_int_equal(telemetry_destroy(t, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 202);
    fake_stop(f);
    env_free(&e);
}

static void test_nan_becomes_null(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    telemetry_config c;
    base_config(&c, &e, "nan-run", 2, 2);
    telemetry *t = create_ok(&c);
    telemetry_step *s = telemetry_step_begin(t, 7, -1);
    assert_int_equal(telemetry_step_scalar(s, "loss", NAN), TELEMETRY_OK);
    assert_int_equal(telemetry_step_scalar(s, "lr", 1e-3), TELEMETRY_OK);
    float lv[2] = {1.0f, NAN}, hv[4] = {INFINITY, -INFINITY, 2.0f, -0.0f};
    assert_int_equal(telemetry_step_layer(s, "cos_sim", lv), TELEMETRY_OK);
    assert_int_equal(telemetry_step_heads(s, "max_logit", hv), TELEMETRY_OK);
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
    /* The zero-copy variant writes straight into the slot. */
    s = telemetry_step_begin(t, 8, -1);
    float *b = telemetry_step_heads_buf(s, "sigma_qk");
    assert_non_null(b);
    b[0] = 0.5f;
    b[1] = NAN;
    b[2] = 3.0f;
    b[3] = 4.0f;
    float *lb = telemetry_step_layer_buf(s, "gamma");
    assert_non_null(lb);
    lb[0] = 7.0f;
    lb[1] = 8.0f;
    assert_null(telemetry_step_layer_buf(s, "bad name"));
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    cJSON *k = fake_find(f, 2);
    cJSON *sq = cJSON_GetObjectItem(cJSON_GetObjectItem(k, "heads"), "sigma_qk");
    assert_true(cJSON_GetArrayItem(cJSON_GetArrayItem(sq, 0), 0)->valuedouble == 0.5);
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(sq, 0), 1)));
    assert_true(cJSON_GetArrayItem(cJSON_GetArrayItem(sq, 1), 1)->valuedouble == 4.0);
    cJSON *gm = cJSON_GetObjectItem(cJSON_GetObjectItem(k, "layers"), "gamma");
    assert_int_equal(cJSON_GetArraySize(gm), 2);
    assert_true(cJSON_GetArrayItem(gm, 1)->valuedouble == 8.0);
    cJSON_Delete(k);
    cJSON *j = fake_find(f, 1);
    assert_non_null(j);
    assert_null(cJSON_GetObjectItem(j, "time")); /* negative time: the daemon stamps it */
    cJSON *sc = cJSON_GetObjectItem(j, "scalars");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(sc, "loss")));
    assert_true((float)cJSON_GetObjectItem(sc, "lr")->valuedouble == 1e-3f);
    cJSON *cs = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "layers"), "cos_sim");
    assert_true(cJSON_GetArrayItem(cs, 0)->valuedouble == 1.0);
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cs, 1)));
    cJSON *ml = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "heads"), "max_logit");
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(ml, 0), 0)));
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(ml, 0), 1)));
    assert_true(cJSON_GetArrayItem(cJSON_GetArrayItem(ml, 1), 0)->valuedouble == 2.0);
    assert_true(cJSON_IsNumber(cJSON_GetArrayItem(cJSON_GetArrayItem(ml, 1), 1)));
    cJSON_Delete(j);
    assert_int_equal(telemetry_destroy(t, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 3);
    fake_stop(f);
    env_free(&e);
}

/* The daemon closes after 6 lines and forgets 4..6 (never committed): the
 * reconnected client must resend from the welcome's last_seq + 1. */
static void test_resend_from_last_seq(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 0);
    pthread_mutex_lock(&f->mu);
    f->close_after = 6;
    f->forget_to = 3;
    pthread_mutex_unlock(&f->mu);
    telemetry_config c;
    base_config(&c, &e, "resend-run", 3, 2);
    telemetry *t = create_ok(&c);
    for (int i = 0; i < 10; i++) put_step(t, i, 3, 2);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    telemetry_stats s = stats(t);
    assert_int_equal(s.acked, 10);
    assert_true(s.reconnects >= 1);
    assert_true(s.sent >= 13); /* 6 + 7 resent */
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->first_data_seq[0], 1);
    assert_int_equal(f->first_data_seq[1], 4);
    assert_int_equal(f->duplicates, 0);
    assert_int_equal(f->gaps, 0);
    pthread_mutex_unlock(&f->mu);
    assert_stored_exactly(f, 1, 10);
    for (int i = 0; i < 10; i++) { /* each seq carries its own step */
        cJSON *j = fake_find(f, i + 1);
        assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, i);
        cJSON_Delete(j);
    }
    assert_int_equal(telemetry_destroy(t, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* The daemon forgets lines without closing: what follows is answered with
 * seq_gap; the client reconnects at once and resends from the welcome. */
static void test_seq_gap_resends(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 0);
    pthread_mutex_lock(&f->mu);
    f->close_after = 5;
    f->forget_to = 2;
    f->keep_open = 1;
    pthread_mutex_unlock(&f->mu);
    telemetry_config c;
    base_config(&c, &e, "gap-run", 2, 1);
    telemetry *t = create_ok(&c);
    for (int i = 0; i < 12; i++) {
        put_step(t, i, 2, 1);
        msleep(1); /* not a wait: paces the steps */
    }
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 12);
    assert_true(fake_get(f, &f->gaps) >= 1);
    assert_true(stats(t).reconnects >= 1);
    assert_true(stats(t).errors >= 1);
    assert_int_equal(telemetry_destroy(t, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* No daemon: everything spools; a daemon that appears later receives it
 * exactly once, in order, and the acks trim the spool. */
static void test_spool_upload_and_trim(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    base_config(&c, &e, "spool-run", 12, 12);
    c.spool_max_bytes = 64 * 1024; /* segments of 8 KiB: a few steps each */
    telemetry *t = create_ok(&c);
    for (int i = 0; i < 30; i++) put_step(t, i, 12, 12);
    WAIT_FOR(stats(t).spooled == 30, 5000);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/spool-run", e.spool);
    int segs = count_segments(dir);
    telemetry_stats s = stats(t);
    assert_true(segs >= 4);
    assert_true(s.connect_failures >= 1);
    assert_int_equal(s.sent, 0);
    assert_int_equal(s.dropped_spool, 0);
    assert_true(s.spool_bytes > 30 * 1000);

    fake *f = fake_start(e.sock, 0, 1);
    WAIT_FOR(stats(t).acked == 30, 5000);
    assert_stored_exactly(f, 1, 30);
    /* Trimmed down to the newest segment. */
    WAIT_FOR(count_segments(dir) == 1, 2000);
    assert_true(stats(t).spool_bytes <= 8192);
    assert_int_equal(fake_get(f, &f->duplicates), 0);
    /* Live messages after the upload continue the numbering. */
    put_step(t, 30, 12, 12);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 31);
    assert_int_equal(telemetry_destroy(t, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 32);
    fake_stop(f);
    env_free(&e);
}

/* A full spool drops with a count (never blocks), numbering stays gapless,
 * and the loss is reported as an event once there is room. */
static void test_spool_full_drops(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    base_config(&c, &e, "full-run", 12, 12);
    c.spool_max_bytes = 16 * 1024;
    c.queue_slots = 128;
    telemetry *t = create_ok(&c);
    for (int i = 0; i < 40; i++) put_step(t, i, 12, 12);
    WAIT_FOR(stats(t).spooled + stats(t).dropped_spool >= 40, 5000);
    print_message("spooled %llu dropped %llu\n", (unsigned long long)stats(t).spooled,
                  (unsigned long long)stats(t).dropped_spool);
    telemetry_stats s = stats(t);
    assert_true(s.dropped_spool > 0);
    assert_true(s.spooled >= 5);
    assert_true(s.spool_bytes <= 16 * 1024);
    assert_int_equal(s.next_seq, s.spooled + 1);
    assert_int_equal(s.dropped_queue, 0);
    int kept = (int)s.spooled;

    fake *f = fake_start(e.sock, 0, 1);
    WAIT_FOR(stats(t).acked == (uint64_t)kept, 5000);
    assert_stored_exactly(f, 1, kept);
    put_step(t, 40, 12, 12); /* preceded by the loss report */
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    uint64_t last = stats(t).next_seq - 1;
    assert_true(last >= (uint64_t)kept + 2);
    assert_stored_exactly(f, 1, (int)last);
    cJSON *st = fake_find(f, (long long)last);
    assert_int_equal(cJSON_GetObjectItem(st, "step")->valueint, 40);
    cJSON_Delete(st);
    cJSON *ev = fake_find(f, (long long)last - 1);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ev, "type")), "event");
    char want[64];
    snprintf(want, sizeof want, "dropped %llu messages", (unsigned long long)s.dropped_spool);
    assert_non_null(strstr(cJSON_GetStringValue(cJSON_GetObjectItem(ev, "text")), want));
    cJSON_Delete(ev);
    assert_int_equal(telemetry_destroy(t, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* Spool writes that fail (here: RLIMIT_FSIZE, as a full disk would) drop the
 * messages with a count, cut the torn tail, and take their seqs back: what
 * the daemon finally receives is gapless and every line is whole. */
static void test_spool_write_failure(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    base_config(&c, &e, "efbig-run", 12, 12);
    c.spool_max_bytes = 64 << 20; /* segments of 8 MiB: the file limit bites first */
    c.queue_slots = 256;
    telemetry *t = create_ok(&c);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 48 * 1024;
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    for (int i = 0; i < 60; i++) {
        put_step(t, i, 12, 12);
        if (i % 4 == 0) msleep(2); /* several write batches */
    }
    WAIT_FOR(stats(t).spooled + stats(t).dropped_spool >= 60, 5000);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    telemetry_stats s = stats(t);
    assert_true(s.dropped_spool > 0);
    assert_true(s.spooled > 0);
    assert_int_equal(s.next_seq, s.spooled + 1);
    assert_true(s.spool_bytes <= 48 * 1024);

    fake *f = fake_start(e.sock, 0, 1);
    put_step(t, 60, 12, 12);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    uint64_t last = stats(t).next_seq - 1;
    assert_stored_exactly(f, 1, (int)last);
    cJSON *j = fake_find(f, (long long)last);
    assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, 60);
    cJSON_Delete(j);
    assert_int_equal(telemetry_destroy(t, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* A daemon that welcomes and then never reads: the socket fills, the
 * producer never waits, the spool takes everything, destroy's wait is bounded. */
static void test_stalled_daemon_never_blocks(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    atomic_store(&f->mode, F_STALL);
    enum { L = 12, H = 12, N = 1500 };
    telemetry_config c;
    base_config(&c, &e, "stall-run", L, H);
    c.queue_slots = 64;
    telemetry *t = create_ok(&c);
    WAIT_FOR(stats(t).connected, 5000);
    static float hv[8][L * H];
    float lv[L];
    for (int k = 0; k < L * H; k++)
        for (int m = 0; m < 8; m++) hv[m][k] = (float)k * 0.37f + (float)m;
    for (int l = 0; l < L; l++) lv[l] = 0.5f + (float)l;
    static const char *hn[8] = {"entropy",       "entropy_norm", "max_logit", "sigma_qk",
                                "entropy_bound", "eig_mean",     "eig_var",   "extra"};
    uint64_t worst = 0;
    double t0 = now_mono_ms();
    int accepted = 0;
    for (int i = 0; i < N; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        telemetry_step *s = telemetry_step_begin(t, i, -1);
        if (s) {
            telemetry_step_scalar(s, "loss", 1.0);
            telemetry_step_layer(s, "rank_ratio", lv);
            for (int m = 0; m < 8; m++) telemetry_step_heads(s, hn[m], hv[m]);
            telemetry_step_commit(t, s);
            accepted++;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        uint64_t ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)(b.tv_nsec - a.tv_nsec);
        if (ns > worst) worst = ns;
        if (i % 8 == 0) msleep(1); /* a little breathing room, like a real step */
    }
    double elapsed = now_mono_ms() - t0;
    print_message("stalled daemon: %d steps in %.0f ms, worst enqueue %llu us\n", N, elapsed,
                  (unsigned long long)worst / 1000);
    /* Each call copies ~40 KiB: a blocked call would take the welcome timeout. */
    assert_true(worst < 50u * 1000000u);
    telemetry_stats s = stats(t);
    assert_int_equal(s.enqueued + s.dropped_queue, N);
    assert_int_equal(s.enqueued, (uint64_t)accepted);
    /* (plus a loss report when the ring overflowed) */
    WAIT_FOR(stats(t).spooled >= (uint64_t)accepted, 10000);
    s = stats(t);
    assert_true(s.sent < s.spooled); /* the socket filled up */
    assert_int_equal(s.acked, 0);
    double d0 = now_mono_ms();
    assert_int_equal(telemetry_destroy(t, "finished", 200), TELEMETRY_ETIMEDOUT);
    assert_true(now_mono_ms() - d0 < 2000);
    assert_int_equal(fake_get(f, &f->bad_json), 0);
    fake_stop(f);
    env_free(&e);
}

/* A new process (a new client) with the same run and spool directory picks
 * up the unsent spool and continues the numbering; a torn last line (crash
 * mid-write) is cut; a second live client on the same spool is refused. */
static void test_restart_continues_seq(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    base_config(&c, &e, "restart-run", 2, 2);
    telemetry *a = create_ok(&c);
    char err[256] = "";
    assert_null(telemetry_create(&c, err, sizeof err));
    assert_non_null(strstr(err, "in use"));
    for (int i = 0; i < 30; i++) put_step(a, i, 2, 2);
    WAIT_FOR(stats(a).spooled == 30, 5000);
    assert_int_equal(telemetry_destroy(a, NULL, 0), TELEMETRY_ETIMEDOUT);

    char seg[256];
    snprintf(seg, sizeof seg, "%s/restart-run/seg-%020d.log", e.spool, 1);
    FILE *fp = fopen(seg, "a");
    assert_non_null(fp);
    fputs("{\"seq\":31,\"type\":\"st", fp);
    fclose(fp);

    telemetry *b = create_ok(&c);
    assert_int_equal(stats(b).next_seq, 31);
    for (int i = 30; i < 50; i++) put_step(b, i, 2, 2);
    WAIT_FOR(stats(b).spooled == 20, 5000);
    fake *f = fake_start(e.sock, 0, 1);
    assert_int_equal(telemetry_destroy(b, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 51);
    for (int i = 0; i < 50; i++) {
        cJSON *j = fake_find(f, i + 1);
        assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, i);
        cJSON_Delete(j);
    }
    assert_int_equal(fake_get(f, &f->hellos), 1);
    fake_stop(f);
    env_free(&e);
}

/* A daemon that already holds more of the run than the spool knows: the
 * client continues after its last_seq and says so in the inbox. */
static void test_daemon_ahead_resets_seq(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 100, 1);
    telemetry_config c;
    base_config(&c, &e, "ahead-run", 1, 1);
    telemetry *t = create_ok(&c);
    for (int i = 0; i < 3; i++) put_step(t, i, 1, 1);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 101, 3);
    telemetry_msg m;
    int saw_reset = 0;
    while (telemetry_poll(t, &m)) {
        if (!strcmp(m.type, "client") && strstr(m.line, "seq_reset")) saw_reset = 1;
        telemetry_msg_free(&m);
    }
    assert_true(saw_reset);
    assert_int_equal(telemetry_destroy(t, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* Over TCP: welcome, error and an unknown (alert) line reach the inbox in
 * order; errors are counted; acks are not delivered. */
static void test_inbox_over_tcp(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(NULL, 0, 1);
    pthread_mutex_lock(&f->mu);
    f->inject[0] = "{\"type\":\"error\",\"code\":\"bad_field\",\"message\":\"x\",\"seq\":1}";
    f->inject[1] = "{\"type\":\"alert\",\"rule\":\"collapse\",\"layer\":1}";
    f->n_inject = 2;
    pthread_mutex_unlock(&f->mu);
    telemetry_config c;
    base_config(&c, &e, "tcp-run", 1, 2);
    char addr[64];
    snprintf(addr, sizeof addr, "tcp:127.0.0.1:%d", f->port);
    c.address = addr;
    telemetry *t = create_ok(&c);
    put_step(t, 0, 1, 2);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    WAIT_FOR(stats(t).errors == 1, 2000);
    const char *want[] = {"welcome", "error", "alert"};
    for (int i = 0; i < 3; i++) {
        telemetry_msg m;
        assert_int_equal(telemetry_poll(t, &m), 1);
        assert_string_equal(m.type, want[i]);
        assert_non_null(m.line);
        assert_null(strchr(m.line, '\n'));
        telemetry_msg_free(&m);
    }
    telemetry_msg m;
    assert_int_equal(telemetry_poll(t, &m), 0);
    assert_int_equal(telemetry_destroy(t, "finished", 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 2);
    fake_stop(f);
    env_free(&e);
}

/* A daemon that accepts and closes at once: backoff, no crash, no block,
 * and the spool keeps everything. */
static void test_refusing_daemon(void **state) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    atomic_store(&f->mode, F_REFUSE);
    telemetry_config c;
    base_config(&c, &e, "refuse-run", 1, 1);
    telemetry *t = create_ok(&c);
    for (int i = 0; i < 5; i++) put_step(t, i, 1, 1);
    WAIT_FOR(fake_get(f, &f->connections) >= 3, 5000);
    WAIT_FOR(stats(t).spooled == 5, 2000);
    assert_int_equal(stats(t).connects, 0);
    atomic_store(&f->mode, F_NORMAL);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 5);
    assert_int_equal(telemetry_destroy(t, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* A step whose line would pass its run's line limit (4 MiB + 128 bytes a
 * cell, proto_line_max: 4.5 MiB for 64 x 64) is dropped and counted (the
 * daemon would refuse it), not sent; smaller steps go on. */
static void test_oversize_step_dropped(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    base_config(&c, &e, "big-run", 64, 64);
    c.address = NULL;
    c.queue_slots = 2;
    c.max_head_metrics = 200; /* x 4096 values of ~11 bytes: ~9 MB */
    c.max_layer_metrics = 1;
    c.max_scalars = 1;
    telemetry *t = create_ok(&c);
    float *hv = malloc(64 * 64 * sizeof *hv);
    for (int k = 0; k < 64 * 64; k++) hv[k] = 1.0f / (float)(k + 3);
    telemetry_step *s = telemetry_step_begin(t, 0, -1);
    for (int m = 0; m < 200; m++) {
        char name[16];
        snprintf(name, sizeof name, "h%d", m);
        assert_int_equal(telemetry_step_heads(s, name, hv), TELEMETRY_OK);
    }
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
    s = telemetry_step_begin(t, 1, -1);
    WAIT_FOR((s = s ? s : telemetry_step_begin(t, 1, -1)) != NULL, 2000);
    assert_int_equal(telemetry_step_scalar(s, "loss", 1.0), TELEMETRY_OK);
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
    assert_int_equal(telemetry_flush(t, 5000), TELEMETRY_OK);
    telemetry_stats st = stats(t);
    assert_int_equal(st.dropped_oversize, 1);
    assert_true(st.spooled == 1 || st.spooled == 2); /* the step, maybe a loss report */
    assert_int_equal(st.next_seq, st.spooled + 1);
    free(hv);
    c.max_scalars = 257;
    char err[128];
    c.run = "other";
    assert_null(telemetry_create(&c, err, sizeof err));
    assert_int_equal(telemetry_destroy(t, NULL, 0), TELEMETRY_OK);
    env_free(&e);
}

/* Keeps the sender busy for at least min_ms and n steps, each put after
 * the previous one was spooled: the sender's loop, which also makes the
 * connection attempts, demonstrably ran through many backoff periods (the
 * config's backoff is 1 ms). Returns the number of steps put. */
static int sender_cycles(telemetry *t, int64_t first, int n, double min_ms) {
    double end = now_mono_ms() + min_ms;
    int i = 0;
    for (; i < n || now_mono_ms() < end; i++) {
        uint64_t before = stats(t).spooled;
        put_step(t, first + i, 1, 1);
        WAIT_FOR(stats(t).spooled > before, 5000);
    }
    return i;
}

/* A client told `code` right after its welcome, then kept busy through many
 * backoff periods: how many connections the fake saw. */
static int connections_after_error(const char *code, const char *run) {
    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    char line[160];
    snprintf(line, sizeof line, "{\"type\":\"error\",\"code\":\"%s\",\"message\":\"x\"}", code);
    pthread_mutex_lock(&f->mu);
    f->inject[0] = line;
    f->n_inject = 1;
    pthread_mutex_unlock(&f->mu);
    telemetry_config c;
    base_config(&c, &e, run, 1, 1);
    c.backoff_min_ms = c.backoff_max_ms = 1;
    telemetry *t = create_ok(&c);
    WAIT_FOR(stats(t).errors >= 1, 5000);
    sender_cycles(t, 0, 20, 600); /* attempts are >= 250 ms apart (CONNECT_SPACING_MS) */
    int conns = fake_get(f, &f->connections);
    telemetry_destroy(t, NULL, 0);
    fake_stop(f);
    env_free(&e);
    return conns;
}

/* Another client took the run over: this one stops reconnecting (fighting
 * would only bounce the run between them) and keeps spooling. The control:
 * after seq_gap, the same procedure does see the client come back, so the
 * window is long enough to catch a reconnect. */
static void test_superseded_stops_reconnecting(void **state) {
    assert_true(connections_after_error("seq_gap", "gap-control") >= 2);
    assert_int_equal(connections_after_error("superseded", "super-probe"), 1);

    env e;
    env_init(&e);
    fake *f = fake_start(e.sock, 0, 1);
    pthread_mutex_lock(&f->mu);
    f->inject[0] = "{\"type\":\"error\",\"code\":\"superseded\",\"message\":\"taken over\"}";
    f->n_inject = 1;
    pthread_mutex_unlock(&f->mu);
    telemetry_config c;
    base_config(&c, &e, "super-run", 1, 1);
    telemetry *t = create_ok(&c);
    WAIT_FOR(stats(t).errors == 1, 5000);
    sender_cycles(t, 0, 3, 0);
    assert_int_equal(fake_get(f, &f->connections), 1);
    telemetry_stats s = stats(t);
    assert_int_equal(s.connected, 0);
    assert_true(s.spooled >= 3);
    telemetry_msg m;
    int seen = 0;
    while (telemetry_poll(t, &m)) {
        seen += !strcmp(m.type, "error") && strstr(m.line, "superseded") != NULL;
        telemetry_msg_free(&m);
    }
    assert_int_equal(seen, 1);
    assert_int_equal(telemetry_destroy(t, NULL, 0), TELEMETRY_ETIMEDOUT);
    fake_stop(f);
    env_free(&e);
}

static void test_api_errors(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    char err[256];
    base_config(&c, &e, "a b", 2, 2);
    err[0] = 0;
    assert_null(telemetry_create(&c, err, sizeof err));
    assert_non_null(strstr(err, "run name"));
    base_config(&c, &e, "ok", 2, 2);
    c.address = "http://x";
    assert_null(telemetry_create(&c, err, sizeof err));
    /* tcp: addresses go through common/net.h's parser; port 0 is not one to connect to */
    const char *bad_tcp[] = {"tcp:localhost", "tcp::80", "tcp:h:0", "tcp:h:65536", "tcp:h:8x"};
    for (size_t i = 0; i < sizeof bad_tcp / sizeof bad_tcp[0]; i++) {
        c.address = bad_tcp[i];
        err[0] = 0;
        assert_null(telemetry_create(&c, err, sizeof err));
        assert_non_null(strstr(err, "expected unix:PATH or tcp:HOST:PORT"));
    }
    base_config(&c, &e, "ok", 0, 2);
    assert_null(telemetry_create(&c, err, sizeof err));
    base_config(&c, &e, "ok", 2, 2);
    c.meta_json = "[1]";
    assert_null(telemetry_create(&c, err, sizeof err));
    assert_null(telemetry_create(&(telemetry_config){.layers = 1}, NULL, 0));

    /* Generated run name, spool-only mode. */
    base_config(&c, &e, NULL, 2, 2);
    c.address = NULL;
    c.max_scalars = 2;
    telemetry *t = create_ok(&c);
    const char *rn = telemetry_run_name(t);
    assert_true(!strncmp(rn, "run-", 4) && strlen(rn) > 10);
    for (const char *p = rn; *p; p++) assert_true(strchr("abcdefghijklmnopqrstuvwxyz0123456789-", *p));
    telemetry_step *s = telemetry_step_begin(t, 0, -1);
    assert_int_equal(telemetry_step_scalar(s, "bad name", 1), TELEMETRY_EINVAL);
    assert_int_equal(telemetry_step_scalar(s, "", 1), TELEMETRY_EINVAL);
    char longname[80];
    memset(longname, 'x', 65);
    longname[65] = 0;
    assert_int_equal(telemetry_step_scalar(s, longname, 1), TELEMETRY_EINVAL);
    longname[64] = 0;
    assert_int_equal(telemetry_step_scalar(s, longname, 1), TELEMETRY_OK);
    assert_int_equal(telemetry_step_scalar(s, "b", 1), TELEMETRY_OK);
    assert_int_equal(telemetry_step_scalar(s, "c", 1), TELEMETRY_EFULL);
    assert_int_equal(telemetry_step_commit(t, NULL), TELEMETRY_EINVAL);
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_OK);
    assert_int_equal(telemetry_step_commit(t, s), TELEMETRY_EINVAL); /* already published */
    assert_null(telemetry_step_begin(t, -1, 0));
    assert_int_equal(telemetry_event(t, "loud", "x"), TELEMETRY_EINVAL);
    assert_int_equal(telemetry_destroy(t, "done", 0), TELEMETRY_EINVAL);
    assert_int_equal(telemetry_flush(t, 2000), TELEMETRY_OK);
    telemetry_stats st = stats(t);
    assert_int_equal(st.spooled, 1);
    assert_int_equal(st.next_seq, 2);
    assert_int_equal(telemetry_destroy(t, "finished", 2000), TELEMETRY_OK);
    assert_int_equal(telemetry_destroy(NULL, NULL, 0), TELEMETRY_OK);
    env_free(&e);
}

/* A damaged record in a middle segment of a multi-segment spool: the next
 * client names it (inbox "spool_damage"), sends a warn event in its seq and
 * every intact record after it, all in one connection, with no gap the
 * daemon would refuse. */
static void test_damaged_segment_record_skipped(void **state) {
    env e;
    env_init(&e);
    telemetry_config c;
    base_config(&c, &e, "damaged-run", 12, 12);
    c.address = NULL;
    c.spool_max_bytes = 64 * 1024; /* segments of 8 KiB: a few steps each */
    telemetry *a = create_ok(&c);
    for (int i = 0; i < 30; i++) put_step(a, i, 12, 12);
    assert_int_equal(telemetry_destroy(a, NULL, 5000), TELEMETRY_OK);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/damaged-run", e.spool);
    assert_true(count_segments(dir) >= 3);
    /* the second segment's first record: a digit changed (its checksum fails) */
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort), k = 0;
    char seg[512] = "";
    unsigned long long first = 0;
    for (int i = 0; i < n; i++) {
        if (!strncmp(names[i]->d_name, "seg-", 4) && ++k == 2) {
            snprintf(seg, sizeof seg, "%s/%s", dir, names[i]->d_name);
            first = strtoull(names[i]->d_name + 4, NULL, 10);
        }
        free(names[i]);
    }
    free(names);
    FILE *fp = fopen(seg, "r+");
    assert_non_null(fp);
    char buf[256];
    size_t got = fread(buf, 1, sizeof buf, fp);
    char *dig = memchr(buf + 17 + 20, '1', got - 37); /* past the version line and the frame */
    assert_non_null(dig);
    fseek(fp, dig - buf, SEEK_SET);
    fputc('2', fp);
    fclose(fp);

    fake *f = fake_start(e.sock, 0, 1);
    c.address = e.addr;
    telemetry *b = create_ok(&c);
    assert_int_equal(telemetry_flush(b, 5000), TELEMETRY_OK);
    assert_stored_exactly(f, 1, 30);
    cJSON *j = fake_find(f, (long long)first);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "type")), "event");
    assert_non_null(strstr(cJSON_GetStringValue(cJSON_GetObjectItem(j, "text")), "bad checksum"));
    cJSON_Delete(j);
    j = fake_find(f, (long long)first + 1);
    assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, (int)first); /* steps count from 0 */
    cJSON_Delete(j);
    assert_int_equal(fake_get(f, &f->gaps), 0);
    assert_int_equal(fake_get(f, &f->connections), 1);
    telemetry_msg m;
    int notes = 0;
    while (telemetry_poll(b, &m)) {
        notes += !strcmp(m.type, "client") && strstr(m.line, "spool_damage") && strstr(m.line, "bad checksum");
        telemetry_msg_free(&m);
    }
    assert_int_equal(notes, 1);
    assert_int_equal(telemetry_destroy(b, NULL, 1000), TELEMETRY_OK);
    fake_stop(f);
    env_free(&e);
}

/* Whatever the daemon does (closing every connection at once, answering
 * seq_gap after every welcome), attempts stay >= CONNECT_SPACING_MS (250
 * ms) apart, even with a configured backoff of 1 ms. */
static void test_reconnects_bounded(void **state) {
    for (int mode = 0; mode < 2; mode++) {
        env e;
        env_init(&e);
        fake *f = fake_start(e.sock, 0, 1);
        if (mode == 0) atomic_store(&f->mode, F_REFUSE);
        pthread_mutex_lock(&f->mu);
        f->inject[0] = "{\"type\":\"error\",\"code\":\"seq_gap\",\"message\":\"x\"}";
        f->n_inject = mode;
        pthread_mutex_unlock(&f->mu);
        telemetry_config c;
        base_config(&c, &e, "storm-run", 1, 1);
        c.backoff_min_ms = c.backoff_max_ms = 1;
        double t0 = now_mono_ms();
        telemetry *t = create_ok(&c);
        sender_cycles(t, 0, 5, 1000);
        int conns = fake_get(f, &f->connections);
        double ms = now_mono_ms() - t0;
        print_message("mode %d: %d connections in %.0f ms\n", mode, conns, ms);
        assert_true(conns >= 2);
        assert_true(conns <= 1 + (int)(ms / 250));
        telemetry_destroy(t, NULL, 0);
        fake_stop(f);
        env_free(&e);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_float),
        cmocka_unit_test(test_step_log_one_call),
        cmocka_unit_test(test_hello_and_every_line),
        cmocka_unit_test(test_paced_sender_waits_for_its_interval),
        cmocka_unit_test(test_paced_sender_woken_by_half_full_ring),
        cmocka_unit_test(test_nan_becomes_null),
        cmocka_unit_test(test_resend_from_last_seq),
        cmocka_unit_test(test_seq_gap_resends),
        cmocka_unit_test(test_spool_upload_and_trim),
        cmocka_unit_test(test_spool_full_drops),
        cmocka_unit_test(test_spool_write_failure),
        cmocka_unit_test(test_stalled_daemon_never_blocks),
        cmocka_unit_test(test_restart_continues_seq),
        cmocka_unit_test(test_daemon_ahead_resets_seq),
        cmocka_unit_test(test_inbox_over_tcp),
        cmocka_unit_test(test_refusing_daemon),
        cmocka_unit_test(test_oversize_step_dropped),
        cmocka_unit_test(test_superseded_stops_reconnecting),
        cmocka_unit_test(test_api_errors),
        cmocka_unit_test(test_damaged_segment_record_skipped),
        cmocka_unit_test(test_reconnects_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
