/* test_rollup.c: the rollup cells and the coding of their rows
 * (daemon/rollup.h), and the series query over coded rows. The coding
 * must give back the very bits of every field (NaN payloads, -0,
 * infinities, subnormals, counts below the frame count, rows of random
 * bits), read rows of the raw format written before it, refuse corrupt
 * rows, and cost well under the raw 20 bytes a value on values like a
 * trainer's; the series query must answer, bucket by bucket, what the raw
 * values give, and the very same text over coded rows as over the same
 * rows in the raw format. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_store.h"
#include "query.h"
#include "rollup.h"
#include "strbuf.h"

/* ------------------------------------------------------------ helpers */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A uniform double in [0, 1). */
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }

static float f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double f64(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static struct rollup_cell cell(float mn, float mx, double sum, uint32_t count) {
    struct rollup_cell c = {mn, mx, sum, count};
    return c;
}

/* Fails unless a and b hold the same bits in every field. */
static void assert_same(const struct rollup_cell *a, const struct rollup_cell *b, uint32_t i) {
    if (memcmp(&a->mn, &b->mn, 4) || memcmp(&a->mx, &b->mx, 4) || memcmp(&a->sum, &b->sum, 8) || a->count != b->count)
        fail_msg("cell %u: decoded min %a max %a sum %a count %u, encoded min %a max %a sum %a count %u", i,
                 (double)b->mn, (double)b->mx, b->sum, b->count, (double)a->mn, (double)a->mx, a->sum, a->count);
}

/* Encodes the row of n cells of a block of nframes frames, checks that
 * it decodes to the same bits, whole and in a part (the cells outside
 * the part untouched), and returns its length. */
static size_t round_trip(const struct rollup_cell *a, uint32_t n, uint32_t nframes) {
    unsigned char *row = malloc(ROLLUP_MAX_BYTES(n));
    struct rollup_cell *out = malloc(n * sizeof *out);
    assert_non_null(row);
    assert_non_null(out);
    size_t len = rollup_encode(a, n, nframes, row);
    assert_true(len <= ROLLUP_MAX_BYTES(n));
    assert_int_equal(rollup_decode(row, len, n, nframes, 0, n, out), 0);
    for (uint32_t i = 0; i < n; i++) assert_same(&a[i], &out[i], i);
    uint32_t c0 = (uint32_t)(rnd() % n), c1 = c0 + 1 + (uint32_t)(rnd() % (n - c0));
    memset(out, 0xa5, n * sizeof *out);
    assert_int_equal(rollup_decode(row, len, n, nframes, c0, c1, out), 0);
    for (uint32_t i = 0; i < n; i++) {
        if (i >= c0 && i < c1) {
            assert_same(&a[i], &out[i], i);
        } else {
            unsigned char guard[sizeof *out];
            memset(guard, 0xa5, sizeof guard);
            assert_memory_equal(&out[i], guard, sizeof guard);
        }
    }
    free(row);
    free(out);
    return len;
}

/* Pools nframes frames of n values, value(i, f) each, into a (n cells). */
static void pool(struct rollup_cell *a, uint32_t n, uint32_t nframes, float (*value)(uint32_t, uint32_t)) {
    rollup_reset(a, n);
    for (uint32_t f = 0; f < nframes; f++)
        for (uint32_t i = 0; i < n; i++) rollup_add(&a[i], value(i, f));
}

/* ------------------------------------------------------------ the coding */

static void test_odd_values_round_trip(void **state) {
    (void)state;
    struct rollup_cell a[32];
    uint32_t n = 0;
    rollup_reset(a, 32);
    /* pooled: NaN and infinities are not counted, -0 is */
    float vals[] = {f32(0x7fc12345u), 1.5f, -0.0f, INFINITY, 0.0f, -INFINITY, f32(0xffc00001u), -2.25f};
    for (size_t k = 0; k < sizeof vals / sizeof *vals; k++) rollup_add(&a[n], vals[k]);
    assert_int_equal(a[n].count, 4);
    n++;
    a[n++] = cell(-0.0f, 0.0f, -0.0, 3);
    a[n++] = cell(-0.0f, -0.0f, 0.0, 64);
    a[n++] = cell(INFINITY, -INFINITY, f64(0x7ff8000000abcdefu), 5);  /* not what pooling makes: still kept */
    a[n++] = cell(f32(0x7fc0beefu), f32(0xffc00001u), -INFINITY, 7); /* NaN payloads with a count */
    a[n++] = cell(f32(1), f32(0x007fffffu), f64(3), 64);             /* subnormals, a subnormal sum */
    a[n++] = cell(-f32(0x00000003u), f32(0x00400000u), -f64(0x000fffffffffffffu), 2);
    a[n++] = cell(-FLT_MAX, FLT_MAX, 1e300, 64);
    a[n++] = cell(FLT_MIN, FLT_MIN, (double)FLT_MIN * 10, 10);       /* a count below the frame count */
    a[n++] = cell(1.0f, 2.0f, 90.0, 60);
    a[n++] = cell(NAN, NAN, 0.0, 0);                                 /* empty, as rollup_reset leaves it */
    a[n++] = cell(1.0f, 1.0f, 1.0, 0);                               /* empty yet not like it: kept as it is */
    a[n++] = cell(-1e-30f, 1e30f, 123.456, 64);
    a[n++] = cell(3.0f, 3.0f, 192.0, 64);
    round_trip(a, n, 64);
    /* without the odd empty cell the empty ones are left out of the coding */
    a[11] = a[10];
    round_trip(a, n, 64);
    /* each alone, and an empty row */
    for (uint32_t i = 0; i < n; i++) round_trip(&a[i], 1, 64);
    rollup_reset(a, 32);
    round_trip(a, 32, 64);
    round_trip(a, 32, 0);
}

static void test_random_bits_round_trip(void **state) {
    (void)state;
    struct rollup_cell a[300];
    for (int row = 0; row < 2000; row++) {
        uint32_t n = 1 + (uint32_t)(rnd() % 300);
        uint32_t nframes = (uint32_t)(rnd() % 4 == 0 ? rnd() % 262145 : 64);
        int style = (int)(rnd() % 4);
        float base = (float)(unif() * 10 - 5);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t r = rnd();
            uint32_t count = nframes ? (uint32_t)(rnd() % 3 ? nframes : rnd() % (nframes + 1)) : 0;
            if (style == 0 || r % 11 == 0) { /* any bits at all */
                a[i] = cell(f32((uint32_t)rnd()), f32((uint32_t)rnd()), f64(rnd()), count);
            } else if (r % 7 == 0) {
                a[i] = cell(NAN, NAN, 0.0, 0);
            } else { /* near each other, like a trainer's */
                float mn = base * (float)(1 + unif() * (style == 1 ? 1e-3 : 1));
                float mx = mn + fabsf(mn) * (float)unif() * 0.01f;
                double mean = (double)mn + ((double)mx - (double)mn) * unif();
                a[i] = cell(mn, mx, style == 3 ? (double)(float)(mean * count) : mean * count, count);
            }
        }
        round_trip(a, n, nframes);
    }
}

/* Values like a trainer's probes: each value near its own level, moving
 * by noise from step to step; a few values NaN at some steps; two heads
 * always NaN (dead). */
static float probe_value(uint32_t i, uint32_t f) {
    if (i == 7 || i == 100) return NAN;
    if (i % 13 == 0 && f % 9 == 0) return NAN;
    double level = 0.01 + 3.0 * (double)((i * 2654435761u) % 1000) / 1000;
    return (float)(level * (1 + 1e-3 * (unif() - 0.5)));
}

/* Values that change sign (a cosine similarity near 0). */
static float signed_value(uint32_t i, uint32_t f) {
    (void)i;
    (void)f;
    return (float)((unif() - 0.5) * 0.02);
}

static void test_real_like_rows_cost_less(void **state) {
    (void)state;
    enum { N = 144 };
    struct rollup_cell a[N], up[N];
    unsigned char row[ROLLUP_MAX_BYTES(N)];
    pool(a, N, 64, probe_value);
    size_t len = round_trip(a, N, 64);
    print_message("probe-like row: %zu bytes for %d values (raw %d)\n", len, N, N * ROLLUP_RAW_BYTES);
    assert_true(len < 12 * N);
    assert_int_equal(rollup_encode(a, N, 64, row), len);
    assert_int_equal(row[0], ROLLUP_FORMAT_CODED);
    /* a level-2 row: 8 blocks pooled */
    rollup_reset(up, N);
    for (int b = 0; b < 8; b++) {
        pool(a, N, 64, probe_value);
        for (uint32_t i = 0; i < N; i++) rollup_merge(&up[i], &a[i]);
    }
    len = round_trip(up, N, 512);
    print_message("probe-like level-2 row: %zu bytes\n", len);
    assert_true(len < 14 * N);
    /* values of both signs: the sum coded as an integer times 2^qe */
    pool(a, N, 64, signed_value);
    len = round_trip(a, N, 64);
    print_message("signed row: %zu bytes\n", len);
    assert_true(len < 15 * N);
}

/* A row's total is what pooling its cells one by one gives; it is added
 * to a running sum only where that gives the same double. */
static void test_row_totals(void **state) {
    (void)state;
    enum { N = 144 };
    struct rollup_cell a[N];
    unsigned char row[ROLLUP_MAX_BYTES(N)];
    struct rollup_total t;
    pool(a, N, 64, probe_value);
    size_t len = rollup_encode(a, N, 64, row);
    assert_int_equal(rollup_total(row, len, N, 64, &t), 1);
    float mn = 0, mx = 0;
    double seq = 0.25; /* a running sum before the row, as a bucket has */
    uint64_t count = 0;
    for (uint32_t i = 0; i < N; i++) {
        if (!a[i].count) continue;
        if (!count || a[i].mn < mn) mn = a[i].mn;
        if (!count || a[i].mx > mx) mx = a[i].mx;
        seq += a[i].sum;
        count += a[i].count;
    }
    assert_true(t.mn == mn && t.mx == mx);
    assert_int_equal(t.count, count);
    double sum = 0.25;
    assert_int_equal(rollup_total_add(&t, &sum), 1);
    assert_memory_equal(&sum, &seq, sizeof sum);
    /* a running sum finer than the row's sums: not shown to be the same */
    sum = 0x1p-60;
    assert_int_equal(rollup_total_add(&t, &sum), 0);
    assert_true(sum == 0x1p-60);
    sum = 0x1p60;
    assert_int_equal(rollup_total_add(&t, &sum), 0);
    /* no total where a sum is not a multiple of the others' quantum in range,
     * nor in a small row, nor in a raw row */
    a[5].sum = 1e-30;
    len = rollup_encode(a, N, 64, row);
    assert_int_equal(rollup_total(row, len, N, 64, &t), 0);
    pool(a, 8, 64, probe_value);
    len = rollup_encode(a, 8, 64, row);
    assert_int_equal(rollup_total(row, len, 8, 64, &t), 0);
    memset(row, 0, 20 * N);
    assert_int_equal(rollup_total(row, 20 * N, N, 64, &t), 0);
    /* a total that claims more than the block holds is corrupt */
    pool(a, N, 64, probe_value);
    len = rollup_encode(a, N, 64, row);
    assert_int_equal(rollup_total(row, len, N, 60, &t), -1);
}

/* A row of the raw format (every row before the coding) reads as ever;
 * the coder writes it only where coding is not smaller, and a coded row
 * never has its size. */
static void test_raw_rows_read(void **state) {
    (void)state;
    struct rollup_cell a[8], out[8];
    unsigned char raw[8 * ROLLUP_RAW_BYTES], row[ROLLUP_MAX_BYTES(8)];
    for (int trial = 0; trial < 500; trial++) {
        uint32_t n = 1 + (uint32_t)(rnd() % 8);
        for (uint32_t i = 0; i < n; i++) {
            a[i] = cell(f32((uint32_t)rnd()), f32((uint32_t)rnd()), f64(rnd()), (uint32_t)(rnd() % 65));
            if (trial % 2) a[i] = cell(1.0f + (float)i, 2.0f + (float)i, 100.0 + i, 64);
            memcpy(raw + i * 20, &a[i].mn, 4);
            memcpy(raw + i * 20 + 4, &a[i].mx, 4);
            memcpy(raw + i * 20 + 8, &a[i].sum, 8);
            memcpy(raw + i * 20 + 16, &a[i].count, 4);
        }
        assert_int_equal(rollup_decode(raw, n * 20, n, 64, 0, n, out), 0);
        for (uint32_t i = 0; i < n; i++) assert_same(&a[i], &out[i], i);
        size_t len = rollup_encode(a, n, 64, row);
        if (len == n * 20u) assert_memory_equal(row, raw, len);
        else assert_int_equal(row[0], ROLLUP_FORMAT_CODED);
    }
}

static void test_corrupt_rows_refused(void **state) {
    (void)state;
    enum { N = 50 };
    struct rollup_cell a[N], out[N];
    unsigned char row[ROLLUP_MAX_BYTES(N) + 8], bad[ROLLUP_MAX_BYTES(N) + 8];
    pool(a, N, 64, probe_value);
    size_t len = rollup_encode(a, N, 64, row);
    assert_int_equal(row[0], ROLLUP_FORMAT_CODED);
    assert_int_equal(rollup_decode(row, len, N, 64, 0, N, out), 0);
    assert_int_equal(rollup_decode(row, len - 1, N, 64, 0, N, out), -1);
    memcpy(bad, row, len);
    bad[len] = 0;
    assert_int_equal(rollup_decode(bad, len + 1, N, 64, 0, N, out), -1);
    assert_int_equal(rollup_decode(row, len, N + 1, 64, 0, N, out), -1);     /* another shape */
    assert_int_equal(rollup_decode(row, len, N, 64, 0, N + 1, out), -1);     /* cells out of range */
    assert_int_equal(rollup_decode(row, len, N, 64, 3, 2, out), -1);
    assert_int_equal(rollup_decode(row, 3, N, 64, 0, N, out), -1);
    assert_int_equal(rollup_decode(row, 0, N, 64, 0, N, out), -1);
    for (size_t at = 0; at < 9; at++) { /* the format, flags, widths and shifts */
        memcpy(bad, row, len);
        bad[at] = at == 0 ? 2 : at == 1 ? 0x80 : 65;
        assert_int_equal(rollup_decode(bad, len, N, 64, 0, N, out), -1);
    }
    /* a count above the block's frames (here: fewer frames than coded) */
    a[3].count = 0;
    a[4].count = 10;
    len = rollup_encode(a, N, 64, row);
    assert_int_equal(rollup_decode(row, len, N, 64, 0, N, out), 0);
    assert_int_equal(rollup_decode(row, len, N, 60, 0, N, out), -1);
    unsigned char raw[ROLLUP_RAW_BYTES] = {0};
    uint32_t big = 65;
    memcpy(raw + 16, &big, 4);
    assert_int_equal(rollup_decode(raw, sizeof raw, 1, 64, 0, 1, out), -1);
    assert_int_equal(rollup_decode(raw, sizeof raw, 1, 65, 0, 1, out), 0);
}

/* ------------------------------------------------------------ the series query */

/* The metric of the series tests: 4 x 5 (one chunk of at least
 * ROLLUP_TOTAL_MIN values: rows have totals) and 12 x 12 (three chunks,
 * rollup.h: a total's row of its own), at most SN_MAX values. */
enum { SN_MAX = 144 };
static uint32_t SL, SH, SN;

/* The value of cell i at step s: cells whose every sum is exact in a
 * double (values in +-[0.5, 4), subnormals, small integers and zeros of
 * both signs), so that any order of summing gives the same mean; NaN and
 * infinities in some; cell 4 always NaN. */
static float series_value(uint32_t i, int64_t s) {
    uint64_t h = (uint64_t)s * 2654435761u + i * 40503u;
    h ^= h >> 15;
    h *= 0x2545f4914f6cdd1du;
    h ^= h >> 29;
    switch (i) {
    case 1: /* subnormal early on (rows of those blocks have no total), then like the rest */
        if (s < 10000) return f32((uint32_t)(h % (1u << 20)));
        return 1.0f + (float)(h % 1024) / 1024;
    case 2: return h % 23 == 0 ? NAN : h % 29 == 0 ? INFINITY : h % 31 == 0 ? -INFINITY : 0.5f + (float)(h % 1000) / 700;
    case 3: return h % 3 == 0 ? -0.0f : h % 3 == 1 ? 0.0f : (float)(h % 50) - 25;
    case 4: return NAN;
    default: {
        float v = (0.5f + (float)(h % 100000) / 100000 * 3.4f) * (float)(1 + 1e-3 * sin((double)s * 0.001));
        return h % 2 ? -v : v;
    }
    }
}

static int series_has(int64_t s) { return s < 20000 || s % 97 == 0; }

#define SERIES_LAST 600000

/* The expected arrays of cell i's series over the buckets [step[b], end[b]],
 * formatted as query_series formats them. */
static void expect_cell(struct strbuf *out, uint32_t i, const cJSON *step, const cJSON *end) {
    struct strbuf mn = {0}, mx = {0}, mean = {0}, count = {0}, nonfinite = {0};
    int nb = cJSON_GetArraySize(step);
    for (int b = 0; b < nb; b++) {
        int64_t lo = (int64_t)cJSON_GetArrayItem(step, b)->valuedouble, hi = (int64_t)cJSON_GetArrayItem(end, b)->valuedouble;
        float a = 0, z = 0;
        double sum = 0;
        int64_t c = 0, bad = 0;
        for (int64_t s = lo; s <= hi && s <= SERIES_LAST; s++) {
            if (!series_has(s)) continue;
            float v = series_value(i, s);
            if (!isfinite(v)) {
                bad++;
                continue;
            }
            if (!c || v < a) a = v;
            if (!c || v > z) z = v;
            sum += v;
            c++;
        }
        const char *sep = b ? "," : "";
        strbuf_puts(&mn, sep);
        strbuf_puts(&mx, sep);
        strbuf_puts(&mean, sep);
        strbuf_puts(&count, sep);
        strbuf_puts(&nonfinite, sep);
        if (c) {
            strbuf_f32(&mn, a);
            strbuf_f32(&mx, z);
            strbuf_f64(&mean, sum / (double)c);
        } else {
            strbuf_puts(&mn, "null");
            strbuf_puts(&mx, "null");
            strbuf_puts(&mean, "null");
        }
        strbuf_i64(&count, c);
        strbuf_i64(&nonfinite, bad);
    }
    strbuf_printf(out, "\"min\":[%s],\"max\":[%s],\"mean\":[%s],\"count\":[%s],\"nonfinite\":[%s]",
                  mn.p ? mn.p : "", mx.p ? mx.p : "", mean.p ? mean.p : "", count.p ? count.p : "",
                  nonfinite.p ? nonfinite.p : "");
    free(mn.p);
    free(mx.p);
    free(mean.p);
    free(count.p);
    free(nonfinite.p);
}

struct window {
    int has_from, has_to;
    int64_t from, to, points;
};

static const struct window windows[] = {
    {0, 0, 0, 0, 1000}, {0, 0, 0, 0, 37}, {0, 0, 0, 0, 1},       {1, 1, 12345, 400000, 100},
    {1, 1, 100, 5000, 1000}, {1, 1, 19990, 20100, 1000}, {1, 1, 262144, 524287, 3}, {1, 0, 70000, 0, 64},
};
#define NWINDOWS (sizeof windows / sizeof *windows)

/* The answer of query_series to window w, split and cell selection as
 * given; a malloc'ed string. */
static char *series(struct query *q, int64_t run, const struct window *w, int split, int64_t layer, int64_t head) {
    struct query_series_req req = {.run_id = run, .metric = "ent", .layer = layer, .head = head,
                                   .has_from = w->has_from, .has_to = w->has_to, .from = w->from, .to = w->to,
                                   .points = w->points, .split = split};
    struct strbuf sb = {0};
    char err[256];
    if (query_series(q, &req, &sb, err, sizeof err) != QUERY_OK) fail_msg("series: %s", err);
    assert_false(sb.failed);
    return sb.p;
}

/* Rewrites every rollup row of the database in the raw format, and empties
 * every total's row (a metric of several chunks), so that a series pools
 * the cells of every block. */
static void rows_to_raw(const char *path) {
    sqlite3 *db;
    sqlite3_stmt *s, *u;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT r.metric_id, level, block, chunk, nframes, data, m.kind FROM rollups r "
                                            "JOIN metrics m ON m.id = r.metric_id", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "UPDATE rollups SET data = ?5 WHERE metric_id = ?1 AND level = ?2 AND block = ?3 "
                                        "AND chunk = ?4", -1, &u, NULL), SQLITE_OK);
    int coded = 0, totals = 0, missing = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        uint32_t n = sqlite3_column_int(s, 6) == PROTO_HEAD ? SN : sqlite3_column_int(s, 6) == PROTO_LAYER ? SL : 1;
        uint32_t chunk = (uint32_t)sqlite3_column_int(s, 3);
        uint32_t rn = ROLLUP_CHUNK_LEN(n, chunk); /* the row's values */
        uint32_t nf = (uint32_t)sqlite3_column_int64(s, 4);
        struct rollup_cell c[SN_MAX];
        unsigned char raw[SN_MAX * ROLLUP_RAW_BYTES];
        size_t len = (size_t)sqlite3_column_bytes(s, 5);
        coded += len != rn * 20u;
        struct rollup_total tot;
        int has = rollup_total(sqlite3_column_blob(s, 5), len, rn, nf, &tot);
        assert_true(has >= 0);
        if (n == SN && ROLLUP_CHUNKS(n) == 1) {
            totals += has;
            missing += !has;
        }
        assert_int_equal(rollup_decode(sqlite3_column_blob(s, 5), len, rn, nf, 0, rn, c), 0);
        for (uint32_t i = 0; i < rn; i++) {
            memcpy(raw + i * 20, &c[i].mn, 4);
            memcpy(raw + i * 20 + 4, &c[i].mx, 4);
            memcpy(raw + i * 20 + 8, &c[i].sum, 8);
            memcpy(raw + i * 20 + 16, &c[i].count, 4);
        }
        for (int k = 0; k < 4; k++) sqlite3_bind_int64(u, k + 1, sqlite3_column_int64(s, k));
        sqlite3_bind_blob(u, 5, raw, (int)(rn * 20), SQLITE_TRANSIENT);
        assert_int_equal(sqlite3_step(u), SQLITE_DONE);
        sqlite3_reset(u);
    }
    sqlite3_finalize(s);
    sqlite3_finalize(u);
    if (ROLLUP_CHUNKS(SN) > 1) {
        /* the totals' rows: some with a total, some without (cell 1) */
        assert_int_equal(sqlite3_prepare_v2(db, "SELECT nframes, data FROM rollup_totals", -1, &s, NULL), SQLITE_OK);
        while (sqlite3_step(s) == SQLITE_ROW) {
            struct rollup_total tot;
            int has = rollup_total_decode(sqlite3_column_blob(s, 1), (size_t)sqlite3_column_bytes(s, 1), SN,
                                          (uint32_t)sqlite3_column_int64(s, 0), &tot);
            assert_true(has >= 0);
            totals += has;
            missing += !has;
        }
        sqlite3_finalize(s);
        assert_int_equal(sqlite3_exec(db, "UPDATE rollup_totals SET data = x''", NULL, NULL, NULL), SQLITE_OK);
    }
    assert_true(coded > 0);
    assert_true(totals > 0);  /* the series took both paths */
    assert_true(missing > 0);
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

/* Cells whose series the wide metric's test checks against the values (all
 * of them cost too long): the special ones, and both sides of each chunk's
 * edge. */
static int checked_cell(uint32_t i) {
    return SN <= ROLLUP_CHUNK_CELLS || i < 8 || (i % ROLLUP_CHUNK_CELLS) < 2 || (i % ROLLUP_CHUNK_CELLS) > 61 ||
           i == SN - 1;
}

/* Series of an L x H metric over many windows, exact against the values,
 * and the same text from rows in the raw format (and, for a metric of
 * several chunks, from its cells where its totals are taken away). */
static void series_exact(uint32_t layers, uint32_t heads) {
    SL = layers, SH = heads, SN = layers * heads;
    assert_true(SN <= SN_MAX);
    struct tmp_db f;
    assert_int_equal(tmp_db_open(&f, "/tmp/trollup-XXXXXX"), 0);
    struct store_run_info info;
    assert_int_equal(store_begin(f.st), 0);
    assert_int_equal(store_run_open(f.st, "r", SL, SH, 64, NULL, 1000.0, &info), 0);
    int64_t seq = 0, n = 0;
    for (int64_t s = 0; s <= SERIES_LAST; s++) {
        if (!series_has(s)) continue;
        float v[SN_MAX];
        for (uint32_t i = 0; i < SN; i++) v[i] = series_value(i, s);
        struct proto_msg m;
        memset(&m, 0, sizeof m);
        m.type = PROTO_STEP;
        m.step = s;
        msg_add(&m, "ent", PROTO_HEAD, SL, SH, v);
        if (store_step(f.st, info.id, ++seq, &m, 1e9 + (double)s, NULL, 0))
            fail_msg("store_step %lld: %s", (long long)s, store_errmsg(f.st));
        proto_msg_free(&m);
        if (++n % 2000 == 0) assert_int_equal(store_commit(f.st) || store_begin(f.st), 0);
    }
    assert_int_equal(store_commit(f.st), 0);
    assert_true(qi(f.path, "SELECT count(*) FROM rollups WHERE level = 5") >= 2);

    char err[256];
    struct query_pool *p = query_pool_open(f.path, 1, err, sizeof err);
    if (!p) fail_msg("%s", err);
    struct query *q = query_acquire(p, err, sizeof err);
    assert_non_null(q);
    enum { NQ = 5 };
    char *before[NWINDOWS][NQ];
    uint32_t one_l = SL - 1, one_h = SH / 2; /* a head of the last chunk */
    for (size_t w = 0; w < NWINDOWS; w++) {
        /* one series per cell, each what the raw values give */
        char *out = series(q, info.id, &windows[w], QUERY_SPLIT_HEAD, -1, -1);
        cJSON *j = cJSON_Parse(out);
        assert_non_null(j);
        const cJSON *step = cJSON_GetObjectItem(j, "step"), *end = cJSON_GetObjectItem(j, "end");
        assert_true(cJSON_GetArraySize(step) > 0);
        for (uint32_t i = 0; i < SN; i++) {
            if (!checked_cell(i)) continue;
            struct strbuf want = {0};
            expect_cell(&want, i, step, end);
            if (!strstr(out, want.p)) fail_msg("window %zu cell %u: want %s in %s", w, i, want.p, out);
            free(want.p);
        }
        cJSON_Delete(j);
        before[w][0] = out;
        before[w][1] = series(q, info.id, &windows[w], QUERY_SPLIT_NONE, -1, -1);
        before[w][2] = series(q, info.id, &windows[w], QUERY_SPLIT_LAYER, -1, -1);
        before[w][3] = series(q, info.id, &windows[w], QUERY_SPLIT_NONE, 5 % SL, -1); /* across two chunks at 12 x 12 */
        before[w][4] = series(q, info.id, &windows[w], QUERY_SPLIT_NONE, one_l, one_h);
        /* a head asked alone is what its values give */
        struct strbuf want = {0};
        j = cJSON_Parse(before[w][4]);
        expect_cell(&want, one_l * SH + one_h, cJSON_GetObjectItem(j, "step"), cJSON_GetObjectItem(j, "end"));
        if (!strstr(before[w][4], want.p)) fail_msg("window %zu head alone: want %s in %s", w, want.p, before[w][4]);
        free(want.p);
        cJSON_Delete(j);
    }
    query_release(p, q);
    query_pool_close(p);

    /* the same rows in the raw format answer the very same text */
    rows_to_raw(f.path);
    p = query_pool_open(f.path, 1, err, sizeof err);
    if (!p) fail_msg("%s", err);
    q = query_acquire(p, err, sizeof err);
    assert_non_null(q);
    for (size_t w = 0; w < NWINDOWS; w++) {
        char *after[NQ] = {series(q, info.id, &windows[w], QUERY_SPLIT_HEAD, -1, -1),
                           series(q, info.id, &windows[w], QUERY_SPLIT_NONE, -1, -1),
                           series(q, info.id, &windows[w], QUERY_SPLIT_LAYER, -1, -1),
                           series(q, info.id, &windows[w], QUERY_SPLIT_NONE, 5 % SL, -1),
                           series(q, info.id, &windows[w], QUERY_SPLIT_NONE, one_l, one_h)};
        for (int k = 0; k < NQ; k++) {
            assert_string_equal(before[w][k], after[k]);
            free(before[w][k]);
            free(after[k]);
        }
    }
    query_release(p, q);
    query_pool_close(p);
    tmp_db_close(&f);
}

static void test_series_exact_over_coded_rows(void **state) {
    (void)state;
    series_exact(4, 5);
}

/* 12 x 12: the rows of three chunks, a layer across two of them (layer 5,
 * cells 60-71), and the totals' rows of the whole metric's series. */
static void test_series_exact_over_chunk_rows(void **state) {
    (void)state;
    series_exact(12, 12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_odd_values_round_trip),
        cmocka_unit_test(test_random_bits_round_trip),
        cmocka_unit_test(test_real_like_rows_cost_less),
        cmocka_unit_test(test_row_totals),
        cmocka_unit_test(test_raw_rows_read),
        cmocka_unit_test(test_corrupt_rows_refused),
        cmocka_unit_test(test_series_exact_over_coded_rows),
        cmocka_unit_test(test_series_exact_over_chunk_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
