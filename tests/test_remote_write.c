/* test_remote_write.c: unit tests of daemon/remote_write.c without a
 * network or a database. A fake receiver (put in place of the HTTP POST)
 * decodes every request with a protobuf reader written here from the wire
 * format's definition, so the encoder is checked against an independent
 * reading: labels, sample values (bit for bit) and timestamps. Then the
 * refusal path: a receiver that refuses any request holding a "bad" step
 * gets every other sample exactly once, and the bad ones are counted; and
 * the cursor file round-trips and is dropped for another URL. The real
 * Prometheus is tests/e2e_remote_write.py's. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct remote_write;
static int fake_post(struct remote_write *rw, char *msg, size_t msglen);
#define RW_POST fake_post
#define UNIT_TESTING 1
#include "../daemon/remote_write.c"

/* What the fake receiver took: (series label text, ts, value bits). */
#define MAXS 20000
static struct got {
    char labels[200];
    int64_t ts;
    uint64_t bits;
} got[MAXS];
static size_t ngot, nposts;
static int64_t bad_ts[8];
static int nbad;
static int count_only; /* decode, count, keep nothing */
static int fail_first; /* answer this many requests like a receiver that is down */
static size_t req_samples, max_req_samples;

static uint64_t rd_varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int sh = 0; *p < end && sh < 64; sh += 7) {
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) return v;
    }
    fail_msg("truncated varint");
    return 0;
}

/* One Sample message into ts / bits. */
static void rd_sample(const unsigned char *p, const unsigned char *end, int64_t *ts, uint64_t *bits) {
    while (p < end) {
        uint64_t tag = rd_varint(&p, end);
        if (tag == 0x09) {
            assert_true(end - p >= 8);
            *bits = 0;
            for (int i = 0; i < 8; i++) *bits |= (uint64_t)p[i] << (8 * i);
            p += 8;
        } else if (tag == 0x10) {
            *ts = (int64_t)rd_varint(&p, end);
        } else {
            fail_msg("unknown Sample tag %llu", (unsigned long long)tag);
        }
    }
}

/* One Label: appends name=value, to text (which also checks the order). */
static void rd_label(const unsigned char *p, const unsigned char *end, char *text, size_t cap, char *prev) {
    char name[64] = "", value[160] = "";
    while (p < end) {
        uint64_t tag = rd_varint(&p, end), n = rd_varint(&p, end);
        assert_true((uint64_t)(end - p) >= n);
        char *dst = tag == 0x0a ? name : tag == 0x12 ? value : NULL;
        size_t dcap = tag == 0x0a ? sizeof name : sizeof value;
        if (!dst) fail_msg("unknown Label tag");
        assert_true(n < dcap);
        memcpy(dst, p, n);
        dst[n] = 0;
        p += n;
    }
    assert_true(strcmp(prev, name) < 0); /* sorted, no repeats */
    snprintf(prev, 64, "%s", name);
    size_t len = strlen(text);
    int w = snprintf(text + len, cap - len, "%s%s=%s", len ? "," : "", name, value);
    assert_true(w > 0 && (size_t)w < cap - len);
}

/* Decodes a WriteRequest into got[]; returns 1 when it holds a bad ts. */
static int rd_request(const unsigned char *p, const unsigned char *end, size_t *first) {
    int bad = 0;
    *first = ngot;
    while (p < end) {
        assert_int_equal(rd_varint(&p, end), 0x0a);
        uint64_t n = rd_varint(&p, end);
        const unsigned char *se = p + n;
        assert_true(se <= end);
        char labels[200] = "", prev[64] = "";
        while (p < se) {
            uint64_t tag = rd_varint(&p, se), m = rd_varint(&p, se);
            assert_true((uint64_t)(se - p) >= m);
            if (tag == 0x0a) {
                rd_label(p, p + m, labels, sizeof labels, prev);
            } else {
                assert_int_equal(tag, 0x12);
                struct got one, *g = count_only ? &one : &got[ngot];
                assert_true(count_only || ngot < MAXS);
                ngot += !count_only;
                req_samples++;
                snprintf(g->labels, sizeof g->labels, "%s", labels);
                rd_sample(p, p + m, &g->ts, &g->bits);
                for (int i = 0; i < nbad; i++) bad |= g->ts == bad_ts[i];
            }
            p += m;
        }
    }
    return bad;
}

/* The fake receiver: snappy-decodes, decodes, and refuses (like
 * Prometheus, the whole request) when any sample is at a bad ts. */
static int fake_post(struct remote_write *rw, char *msg, size_t msglen) {
    nposts++;
    if (fail_first > 0) {
        fail_first--;
        snprintf(msg, msglen, "HTTP 404: not found");
        return -1;
    }
    size_t need = snappy_max_compressed_length(rw->pb.len), zlen = need, ulen = 0;
    char *z = malloc(need);
    assert_non_null(z);
    assert_int_equal(snappy_compress(rw->pb.p, rw->pb.len, z, &zlen), SNAPPY_OK);
    assert_int_equal(snappy_uncompressed_length(z, zlen, &ulen), SNAPPY_OK);
    char *u = malloc(ulen ? ulen : 1);
    assert_int_equal(snappy_uncompress(z, zlen, u, &ulen), SNAPPY_OK);
    size_t first;
    req_samples = 0;
    int bad = rd_request((const unsigned char *)u, (const unsigned char *)u + ulen, &first);
    free(z);
    free(u);
    if (req_samples > max_req_samples) max_req_samples = req_samples;
    if (bad) {
        ngot = first; /* refused: nothing of it is kept */
        snprintf(msg, msglen, "HTTP 400: out of bounds");
        return RW_REJECTED;
    }
    return RW_SENT;
}

static struct remote_write *fake_rw(void) {
    struct remote_write *rw = calloc(1, sizeof *rw);
    pthread_mutex_init(&rw->mu, NULL);
    pthread_cond_init(&rw->cv, NULL);
    pthread_mutex_init(&rw->gauge_mu, NULL);
    rw->url = strdup("http://test/api/v1/write");
    rw->log_at = -1e18;
    ngot = nposts = max_req_samples = 0;
    nbad = count_only = fail_first = 0;
    return rw;
}

/* A run of 2 layers x 3 heads: loss, a layer metric, a head metric, at
 * nsteps steps (10, 20, ...), every value distinct, one NaN; the head
 * metric has no frame at the second step. */
static void fill_batch(struct rw_batch *bt, struct rw_cursor *c, size_t nsteps) {
    static struct rw_metric m[3] = {{1, "loss", 0, 1, 0}, {2, "rank.ratio", 1, 2, 1}, {3, "entropy_norm", 2, 6, 3}};
    memset(bt, 0, sizeof *bt);
    bt->cur = c;
    snprintf(bt->run, sizeof bt->run, "run-1");
    bt->heads = 3;
    bt->metrics = malloc(sizeof m);
    memcpy(bt->metrics, m, sizeof m);
    bt->nmetrics = 3;
    bt->cells = 9;
    bt->k = bt->nsteps = nsteps;
    bt->step = malloc(nsteps * sizeof *bt->step);
    bt->ts = malloc(nsteps * sizeof *bt->ts);
    bt->vals = malloc(9 * nsteps * sizeof *bt->vals);
    bt->present = calloc(3 * nsteps, 1);
    for (size_t t = 0; t < nsteps; t++) {
        bt->step[t] = 10 * (int64_t)(t + 1);
        bt->ts[t] = 1764500000000 + (int64_t)t * 7;
        for (size_t s = 0; s < 9; s++) bt->vals[s * nsteps + t] = 0.1f * (float)(s + 1) + (float)t;
        for (size_t mm = 0; mm < 3; mm++) bt->present[mm * nsteps + t] = !(mm == 2 && t == 1);
    }
    bt->vals[0] = NAN;
}

static const struct got *find(const char *labels, int64_t ts) {
    for (size_t i = 0; i < ngot; i++)
        if (got[i].ts == ts && strcmp(got[i].labels, labels) == 0) return &got[i];
    return NULL;
}

static uint64_t bits_of(double d) {
    uint64_t b;
    memcpy(&b, &d, 8);
    return b;
}

static void test_encoding(void **state) {
    (void)state;
    struct remote_write *rw = fake_rw();
    struct rw_cursor c = {.run_id = 1};
    struct rw_batch bt;
    fill_batch(&bt, &c, 3);
    assert_int_equal(send_batch(rw, &bt), RW_SENT);
    assert_int_equal(nposts, 1);
    assert_int_equal(ngot, 3 * 10 - 6); /* 10 series x 3 steps, the head metric's 6 missing at step 20 */
    const struct got *g = find("__name__=entropyd_head,head=2,layer=1,metric=entropy_norm,run=run-1", 1764500000014);
    assert_non_null(g);
    assert_int_equal(g->bits, bits_of((double)(0.1f * 9.0f + 2.0f)));
    assert_null(find("__name__=entropyd_head,head=0,layer=0,metric=entropy_norm,run=run-1", 1764500000007));
    g = find("__name__=entropyd_layer,layer=1,metric=rank.ratio,run=run-1", 1764500000000);
    assert_non_null(g);
    assert_int_equal(g->bits, bits_of((double)(0.1f * 3.0f)));
    g = find("__name__=entropyd_scalar,metric=loss,run=run-1", 1764500000000);
    assert_non_null(g);
    double d;
    memcpy(&d, &g->bits, 8);
    assert_true(isnan(d));
    g = find("__name__=entropyd_run_last_step,run=run-1", 1764500000007);
    assert_non_null(g);
    assert_int_equal(g->bits, bits_of(20.0));
    assert_int_equal(atomic_load(&rw->sent), ngot);
    batch_free(&bt);
    remote_write_destroy(rw); /* never started: frees what fake_rw made */
}

/* Refused requests split by steps: every good step arrives once, the bad
 * ones are counted, in O(bad x log steps) requests. */
static void test_refusals_split(void **state) {
    (void)state;
    struct remote_write *rw = fake_rw();
    struct rw_cursor c = {.run_id = 1};
    struct rw_batch bt;
    size_t n = 64;
    fill_batch(&bt, &c, n);
    bad_ts[nbad++] = bt.ts[5];
    bad_ts[nbad++] = bt.ts[40];
    assert_int_equal(send_batch(rw, &bt), RW_SENT);
    size_t per_step = 10;
    assert_int_equal(atomic_load(&rw->rejected), 2 * per_step);
    assert_int_equal(ngot, n * per_step - 6 - 2 * per_step);
    assert_int_equal(atomic_load(&rw->sent), ngot);
    for (size_t t = 0; t < n; t++) {
        const struct got *g = find("__name__=entropyd_run_last_step,run=run-1", bt.ts[t]);
        if (t == 5 || t == 40) assert_null(g);
        else assert_non_null(g);
    }
    for (size_t i = 0; i < ngot; i++)
        for (size_t j = i + 1; j < ngot; j++)
            if (got[i].ts == got[j].ts && strcmp(got[i].labels, got[j].labels) == 0) fail_msg("sample twice");
    assert_true(nposts <= 1 + 2 * 2 * 6 + 2);
    batch_free(&bt);
    remote_write_destroy(rw); /* never started: frees what fake_rw made */
}

/* A receiver that fails (down, 5xx, 404) gets the same request again,
 * with backoff, until it takes it: nothing skipped, nothing twice. */
static void test_failures_retried(void **state) {
    (void)state;
    struct remote_write *rw = fake_rw();
    struct rw_cursor c = {.run_id = 1};
    struct rw_batch bt;
    fill_batch(&bt, &c, 4);
    fail_first = 3;
    double t0 = now_mono_ms();
    assert_int_equal(send_batch(rw, &bt), RW_SENT);
    double waited = now_mono_ms() - t0;
    assert_int_equal(atomic_load(&rw->failures), 3);
    assert_int_equal(nposts, 4);
    assert_int_equal(atomic_load(&rw->rejected), 0);
    assert_int_equal(ngot, 4 * 10 - 6);
    assert_true(waited >= 100 + 200 + 400 - 5); /* 100 ms, doubling */
    assert_int_equal(atomic_load(&rw->failing), 0);
    batch_free(&bt);
    remote_write_destroy(rw); /* never started: frees what fake_rw made */
}

/* One step holding more values than a request may: sent in requests of
 * at most REMOTE_WRITE_MAX_SAMPLES samples, split by series, all of them. */
static void test_requests_bounded(void **state) {
    (void)state;
    struct remote_write *rw = fake_rw();
    struct rw_cursor c = {.run_id = 1};
    struct rw_batch bt;
    fill_batch(&bt, &c, 1);
    bt.heads = 1000;
    bt.metrics[2].n = 100 * 1000; /* 100 layers x 1,000 heads */
    bt.cells = 3 + bt.metrics[2].n;
    free(bt.vals);
    bt.vals = calloc(bt.cells, sizeof *bt.vals);
    count_only = 1;
    assert_int_equal(send_batch(rw, &bt), RW_SENT);
    assert_int_equal(atomic_load(&rw->sent), bt.cells + 1);
    assert_int_equal(nposts, (bt.cells + 1 + REMOTE_WRITE_MAX_SAMPLES - 1) / REMOTE_WRITE_MAX_SAMPLES);
    assert_int_equal(max_req_samples, REMOTE_WRITE_MAX_SAMPLES);
    batch_free(&bt);
    remote_write_destroy(rw); /* never started: frees what fake_rw made */
}

static void test_cursor_file(void **state) {
    (void)state;
    char dir[] = "/tmp/test_rw_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct remote_write *rw = fake_rw();
    char path[300];
    snprintf(path, sizeof path, "%s/db.remote-write", dir);
    rw->cursor_path = strdup(path);
    struct rw_cursor *c = cursor_get(rw, 7);
    c->step = 100, c->ts = 123456, c->branch = 3;
    cursor_get(rw, 2)->step = 5;
    assert_int_equal(cursor_save(rw), 0);
    rw->ncur = 0;
    cursor_load(rw);
    assert_int_equal(rw->ncur, 2);
    assert_int_equal(rw->cur[0].run_id, 2);
    assert_int_equal(rw->cur[1].step, 100);
    assert_int_equal(rw->cur[1].ts, 123456);
    assert_int_equal(rw->cur[1].branch, 3);
    /* another receiver: starts over */
    free(rw->url);
    rw->url = strdup("http://other/api/v1/write");
    rw->ncur = 0;
    cursor_load(rw);
    assert_int_equal(rw->ncur, 0);
    rw->ncur = 0;
    cursor_load(rw); /* rewritten for the new URL at once */
    assert_int_equal(rw->ncur, 0);
    unlink(path);
    rmdir(dir);
    remote_write_destroy(rw); /* never started: frees what fake_rw made */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoding),         cmocka_unit_test(test_refusals_split),
        cmocka_unit_test(test_failures_retried), cmocka_unit_test(test_requests_bounded),
        cmocka_unit_test(test_cursor_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
