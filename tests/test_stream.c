/* test_stream.c: the SSE ring (daemon/stream.c) without HTTP: ids, resume
 * after Last-Event-ID, reset when the ring no longer holds the next event,
 * run filters, reads through small buffers, keep-alive, shutdown, and the
 * step event built from a committed item. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stream.h"

/* Reads everything a client has now (it must have something) into out. */
static void drain(struct stream_client *c, char *out, size_t cap) {
    size_t n = 0;
    ssize_t r = stream_client_read(c, out, cap - 1);
    assert_true(r > 0);
    n = (size_t)r;
    out[n] = 0;
}

static struct stream *mk(size_t events, size_t bytes) {
    char err[128];
    struct stream_config cfg = {.max_events = events, .max_bytes = bytes, .keepalive_ms = 50};
    struct stream *s = stream_create(&cfg, err, sizeof err);
    assert_non_null(s);
    return s;
}

static void publish(struct stream *s, int64_t run, int k) {
    char j[64];
    int n = snprintf(j, sizeof j, "{\"k\":%d}", k);
    assert_int_equal(stream_publish(s, "step", run, j, (size_t)n), 0);
}

/* The id of the event whose data is {"k":k} in text. */
static void id_of(const char *text, int k, char *id, size_t cap) {
    char needle[64];
    snprintf(needle, sizeof needle, "data: {\"k\":%d}", k);
    const char *d = strstr(text, needle);
    assert_non_null(d);
    const char *p = d;
    while (p > text && strncmp(p, "id: ", 4) != 0) p--;
    assert_true(strncmp(p, "id: ", 4) == 0);
    size_t n = strcspn(p + 4, "\n");
    snprintf(id, cap, "%.*s", (int)n, p + 4);
}

static void test_resume_and_reset(void **state) {
    (void)state;
    struct stream *s = mk(4, 0);
    char buf[4096], id1[64], id4[64];
    struct stream_client *c0 = stream_client_open(s, 0, NULL);
    drain(c0, buf, sizeof buf);
    assert_non_null(strstr(buf, "retry: "));
    for (int k = 1; k <= 3; k++) publish(s, 7, k);
    drain(c0, buf, sizeof buf);
    assert_non_null(strstr(buf, "event: step\ndata: {\"k\":3}\n\n"));
    id_of(buf, 1, id1, sizeof id1);

    /* resume after event 1: events 2 and 3, in order, nothing else */
    struct stream_client *c = stream_client_open(s, 0, id1);
    drain(c, buf, sizeof buf); /* the greeting */
    assert_null(strstr(buf, "reset"));
    drain(c, buf, sizeof buf);
    char *a = strstr(buf, "{\"k\":2}"), *b = strstr(buf, "{\"k\":3}");
    assert_true(a && b && a < b);
    assert_null(strstr(buf, "{\"k\":1}"));
    stream_client_close(c);

    /* four more: the ring (4 events) now holds 4..7 */
    for (int k = 4; k <= 7; k++) publish(s, 7, k);
    drain(c0, buf, sizeof buf);
    id_of(buf, 4, id4, sizeof id4);
    c = stream_client_open(s, 0, id1);
    drain(c, buf, sizeof buf);
    assert_non_null(strstr(buf, "event: reset"));
    publish(s, 7, 8);
    drain(c, buf, sizeof buf);
    assert_non_null(strstr(buf, "{\"k\":8}")); /* live from the reset on */
    assert_null(strstr(buf, "{\"k\":5}"));
    stream_client_close(c);
    /* resuming after 4 still works: 5 is the oldest held */
    c = stream_client_open(s, 0, id4);
    drain(c, buf, sizeof buf);
    assert_null(strstr(buf, "reset"));
    drain(c, buf, sizeof buf);
    assert_non_null(strstr(buf, "{\"k\":5}"));
    assert_non_null(strstr(buf, "{\"k\":8}"));
    stream_client_close(c);
    /* a foreign or unreadable id resets */
    const char *bad[] = {"1-1", "x", "99999999999999-"};
    for (int i = 0; i < 3; i++) {
        c = stream_client_open(s, 0, bad[i]);
        drain(c, buf, sizeof buf);
        assert_non_null(strstr(buf, "event: reset"));
        stream_client_close(c);
    }
    struct stream_stats st;
    stream_get_stats(s, &st);
    assert_int_equal(st.published, 8);
    assert_int_equal(st.ring_events, 4);
    assert_int_equal(st.resets, 4);
    assert_int_equal(st.clients, 1);
    stream_client_close(c0);
    stream_destroy(s);
}

static void test_filter_small_reads_keepalive(void **state) {
    (void)state;
    struct stream *s = mk(0, 0);
    char buf[4096];
    struct stream_client *c = stream_client_open(s, 2, NULL);
    drain(c, buf, sizeof buf);
    publish(s, 1, 1);
    publish(s, 2, 2);
    publish(s, 1, 3);
    /* read through a 7-byte buffer: the pieces make up exactly one event */
    char acc[512] = "";
    size_t n = 0;
    while (!strstr(acc, "\n\n")) {
        ssize_t r = stream_client_read(c, acc + n, 7);
        assert_true(r > 0 && r <= 7);
        n += (size_t)r;
        acc[n] = 0;
    }
    assert_non_null(strstr(acc, "data: {\"k\":2}\n\n"));
    assert_null(strstr(acc, "\"k\":1"));
    /* nothing more for run 2: a keep-alive comment after ~50 ms */
    drain(c, buf, sizeof buf);
    assert_string_equal(buf, ": keep-alive\n\n");
    stream_shutdown(s);
    assert_int_equal(stream_client_read(c, buf, sizeof buf), -1);
    stream_client_close(c);
    stream_destroy(s);
}

static void test_byte_bound(void **state) {
    (void)state;
    struct stream *s = mk(1000, 300); /* each event is ~50 bytes */
    for (int k = 0; k < 100; k++) publish(s, 1, k);
    struct stream_stats st;
    stream_get_stats(s, &st);
    assert_true(st.ring_bytes <= 300);
    assert_true(st.ring_events >= 4 && st.ring_events <= 6);
    stream_destroy(s);
}

static void test_step_event(void **state) {
    (void)state;
    struct stream *s = mk(0, 0);
    char buf[8192];
    struct stream_client *c = stream_client_open(s, 0, NULL);
    drain(c, buf, sizeof buf);
    float v[] = {2.5f, 0.5f, 0.25f, 1, 2, 3, NAN, NAN, 4};
    struct proto_metric m[3] = {
        {.name = "loss", .kind = PROTO_SCALAR, .rows = 1, .cols = 1, .offset = 0},
        {.name = "rank", .kind = PROTO_LAYER, .rows = 2, .cols = 1, .offset = 1},
        {.name = "entropy", .kind = PROTO_HEAD, .rows = 2, .cols = 3, .offset = 3},
    };
    struct writer_item it = {.kind = WRITER_STEP, .run_id = 3, .seq = 9, .time = 100.5, .applied = 1};
    it.msg = (struct proto_msg){.type = PROTO_STEP, .step = 42, .nmetrics = 3, .metrics = m, .nvalues = 9, .values = v};
    struct writer_item end = {.kind = WRITER_END, .run_id = 3, .seq = 10, .applied = 1};
    end.msg.status = PROTO_FINISHED;
    /* an item the store rejected is not announced */
    struct writer_item rej = {.kind = WRITER_STEP, .run_id = 3, .seq = 11, .time = 101, .applied = 0};
    rej.msg =
        (struct proto_msg){.type = PROTO_STEP, .step = 77, .nmetrics = 3, .metrics = m, .nvalues = 9, .values = v};
    it.next = &end;
    end.next = &rej;
    stream_on_commit(s, &it);
    drain(c, buf, sizeof buf);
    assert_non_null(strstr(buf, "event: step\ndata: {\"run\":3,\"step\":42,\"time\":100.5,\"ct\":"));
    assert_non_null(strstr(buf, "\"scalars\":{\"loss\":2.5},\"layers\":{\"rank\":[0.5,0.25]}"));
    /* per layer over the finite heads: layer 0 {1,2,3}, layer 1 {4} */
    assert_non_null(strstr(buf, "\"entropy\":{\"min\":[1,4],\"mean\":[2,4]}}\n\n"));
    assert_non_null(strstr(buf, "event: run\ndata: {\"run\":3,\"status\":\"finished\"}"));
    assert_null(strstr(buf, "\"step\":77"));
    stream_client_close(c);
    stream_destroy(s);
}

/* Reads until the client has nothing more now (short keep-alive: 50 ms). */
static size_t drain_all(struct stream_client *c, char *out, size_t cap) {
    size_t n = 0;
    for (;;) {
        ssize_t r = stream_client_read(c, out + n, cap - 1 - n);
        assert_true(r > 0);
        if (strncmp(out + n, ": keep-alive", 12) == 0) break;
        n += (size_t)r;
    }
    out[n] = 0;
    return n;
}

/* Ticks: the first two steps go out at once (the tick's burst; the rows
 * events' is three, so a third step is added before them), the next two fold into one tick/layers/cells set, published when the run ends
 * (the intervals here are an hour); a subscribed client gets
 * them and no step events, and only the cells it asked for; a default
 * client gets the step events and no summaries. */
static void test_ticks(void **state) {
    (void)state;
    char err[128];
    struct stream_config cfg = {.keepalive_ms = 50, .tick_ms = 3600000, .rows_ms = 3600000};
    struct stream *s = stream_create(&cfg, err, sizeof err);
    assert_non_null(s);
    static char buf[16384];
    struct stream_client *plain = stream_client_open(s, 0, NULL), *sub = stream_client_open(s, 3, NULL);
    const char *cells[] = {"entropy"};
    struct stream_sub want = {.ticks = 1, .layers = 1, .ncells = 1, .cells = {cells[0]}};
    assert_int_equal(stream_client_subscribe(sub, &want), 0);
    char longname[PROTO_MAX_NAME + 8];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    struct stream_sub bad = {.ticks = 1, .ncells = 1, .cells = {longname}};
    assert_int_equal(stream_client_subscribe(plain, &bad), -1);
    drain(plain, buf, sizeof buf);
    drain(sub, buf, sizeof buf);
    float v1[] = {2.5f, 0.5f, 0.25f, 1, 2, 3, NAN, NAN, 4, 7, 7, 7, 7, 7, 7};
    float v2[] = {1.5f, 0.7f, 0.75f, 3, 2, 1, 5, NAN, 8, 7, 7, 7, 7, 7, 7};
    struct proto_metric m[4] = {
        {.name = "loss", .kind = PROTO_SCALAR, .rows = 1, .cols = 1, .offset = 0},
        {.name = "rank", .kind = PROTO_LAYER, .rows = 2, .cols = 1, .offset = 1},
        {.name = "entropy", .kind = PROTO_HEAD, .rows = 2, .cols = 3, .offset = 3},
        {.name = "other", .kind = PROTO_HEAD, .rows = 2, .cols = 3, .offset = 9},
    };
    /* the burst: STREAM_BURST commits of a step, each published at once */
    struct writer_item warm[STREAM_BURST];
    for (int k = 0; k < STREAM_BURST; k++) {
        warm[k] = (struct writer_item){.kind = WRITER_STEP, .run_id = 3, .time = 90 + k, .applied = 1};
        warm[k].msg = (struct proto_msg){
            .type = PROTO_STEP, .step = 1 + k, .nmetrics = 4, .metrics = m, .nvalues = 15, .values = v2};
    }
    struct writer_item a = {.kind = WRITER_STEP, .run_id = 3, .time = 100.5, .applied = 1};
    a.msg =
        (struct proto_msg){.type = PROTO_STEP, .step = 10, .nmetrics = 4, .metrics = m, .nvalues = 15, .values = v1};
    struct writer_item b = a;
    b.time = 101.5;
    b.msg.step = 11;
    b.msg.values = v2;
    struct writer_item end = {.kind = WRITER_END, .run_id = 3, .applied = 1};
    end.msg.status = PROTO_FINISHED;
    for (int k = 0; k < STREAM_BURST; k++) stream_on_commit(s, &warm[k]);
    drain_all(sub, buf, sizeof buf);
    for (int k = 0; k < STREAM_BURST; k++) {
        char want[128];
        snprintf(want, sizeof want, "event: tick\ndata: {\"run\":3,\"step\":%d,\"from\":%d,\"n\":1,", 1 + k, 1 + k);
        assert_non_null(strstr(buf, want));
        snprintf(want, sizeof want, "event: layers\ndata: {\"run\":3,\"step\":%d,\"from\":%d,", 1 + k, 1 + k);
        assert_non_null(strstr(buf, want));
    }
    drain_all(plain, buf, sizeof buf);
    a.next = &b;
    b.next = &end;
    stream_on_commit(s, &a);
    drain_all(sub, buf, sizeof buf);
    assert_null(strstr(buf, "event: step"));
    assert_non_null(strstr(buf, "event: tick\ndata: {\"run\":3,\"step\":11,\"from\":10,\"n\":2,\"time\":101.5,"));
    assert_non_null(strstr(buf, "\"scalars\":{\"loss\":[1.5,2,2.5,1.5]}}"));
    /* rank: mean per layer; entropy per layer over heads and both steps:
     * layer 0 {1,2,3,3,2,1}, layer 1 {4,5,8} */
    assert_non_null(strstr(buf,
                           "event: layers\ndata: {\"run\":3,\"step\":11,\"from\":10,\"layers\":{\"rank\":[0.6,0.5]},"
                           "\"heads\":{\"entropy\":{\"min\":[1,4],\"mean\":[2,5.667],\"max\":[3,8]}"));
    /* cells: the last step's values, shaped as a frame; only the metric asked for */
    assert_non_null(strstr(buf, "event: cells\ndata: {\"run\":3,\"metric\":\"entropy\",\"kind\":\"head\",\"step\":11,"
                                "\"layers\":2,\"heads\":3,\"values\":[[3,2,1],[5,null,8]]}"));
    assert_null(strstr(buf, "\"metric\":\"other\""));
    /* the tick comes before the run's end */
    assert_true(strstr(buf, "event: tick") < strstr(buf, "event: run"));
    drain_all(plain, buf, sizeof buf);
    assert_non_null(strstr(buf, "event: step"));
    assert_null(strstr(buf, "event: tick"));
    assert_null(strstr(buf, "event: cells"));
    assert_non_null(strstr(buf, "event: run"));
    stream_client_close(plain);
    stream_client_close(sub);
    stream_destroy(s);
}

/* Held steps go out with the writer's tick once a token is back:
 * STREAM_BURST + 1 commits of a step, the last held, then published by
 * stream_on_tick after the interval. */
static void test_tick_due(void **state) {
    (void)state;
    char err[128];
    struct stream_config cfg = {.keepalive_ms = 50, .tick_ms = 50, .rows_ms = 50};
    struct stream *s = stream_create(&cfg, err, sizeof err);
    static char buf[16384];
    struct stream_client *sub = stream_client_open(s, 0, NULL);
    struct stream_sub sb = {.ticks = 1};
    assert_int_equal(stream_client_subscribe(sub, &sb), 0);
    drain(sub, buf, sizeof buf);
    float v[] = {2.5f};
    struct proto_metric m[1] = {{.name = "loss", .kind = PROTO_SCALAR, .rows = 1, .cols = 1, .offset = 0}};
    enum { N = STREAM_BURST + 1 };
    struct writer_item it[N];
    for (int i = 0; i < N; i++) {
        it[i] = (struct writer_item){.kind = WRITER_STEP, .run_id = 5, .time = 1, .applied = 1};
        it[i].msg = (struct proto_msg){
            .type = PROTO_STEP, .step = i + 1, .nmetrics = 1, .metrics = m, .nvalues = 1, .values = v};
    }
    for (int i = 0; i < N; i++) stream_on_commit(s, &it[i]);
    drain_all(sub, buf, sizeof buf);
    char want[96];
    snprintf(want, sizeof want, "\"step\":%d,\"from\":%d,\"n\":1,", N - 1, N - 1);
    assert_non_null(strstr(buf, want));
    snprintf(want, sizeof want, "\"step\":%d,", N);
    assert_null(strstr(buf, want));
    stream_on_tick(s, 0); /* too early: no token yet */
    /* not a wait: the time that earns the next token */
    struct timespec d = {0, 120000000};
    nanosleep(&d, NULL);
    stream_on_tick(s, 0);
    drain_all(sub, buf, sizeof buf);
    snprintf(want, sizeof want, "event: tick\ndata: {\"run\":5,\"step\":%d,\"from\":%d,\"n\":1,", N, N);
    assert_non_null(strstr(buf, want));
    assert_null(strstr(buf, "event: layers")); /* not subscribed */
    stream_client_close(sub);
    stream_destroy(s); /* frees the run's accumulator (still live) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_and_reset),
        cmocka_unit_test(test_filter_small_reads_keepalive),
        cmocka_unit_test(test_byte_bound),
        cmocka_unit_test(test_step_event),
        cmocka_unit_test(test_ticks),
        cmocka_unit_test(test_tick_due),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
