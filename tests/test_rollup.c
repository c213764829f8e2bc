/* test_rollup.c: the rollup cells and the coding of their rows
 * (daemon/rollup.h), and the series query over coded rows. The coding
 * must give back the very bits of every field (NaN payloads, -0,
 * infinities, subnormals, counts below the frame count, rows of random
 * bits), read rows of the raw format written before it, refuse corrupt
 * rows, and cost well under the raw 20 bytes a value on values like a
 * trainer's; the series query must answer, bucket by bucket, what the raw
 * values give, and the very same text over coded rows as over the same
 * rows in the raw format; and so over any step numbering (sparse, gaps up
 * to 2^53, clusters, rollbacks: a property test against a brute force). */
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
    a[n++] = cell(INFINITY, -INFINITY, f64(0x7ff8000000abcdefu), 5); /* not what pooling makes: still kept */
    a[n++] = cell(f32(0x7fc0beefu), f32(0xffc00001u), -INFINITY, 7); /* NaN payloads with a count */
    a[n++] = cell(f32(1), f32(0x007fffffu), f64(3), 64);             /* subnormals, a subnormal sum */
    a[n++] = cell(-f32(0x00000003u), f32(0x00400000u), -f64(0x000fffffffffffffu), 2);
    a[n++] = cell(-FLT_MAX, FLT_MAX, 1e300, 64);
    a[n++] = cell(FLT_MIN, FLT_MIN, (double)FLT_MIN * 10, 10); /* a count below the frame count */
    a[n++] = cell(1.0f, 2.0f, 90.0, 60);
    a[n++] = cell(NAN, NAN, 0.0, 0);   /* empty, as rollup_reset leaves it */
    a[n++] = cell(1.0f, 1.0f, 1.0, 0); /* empty yet not like it: kept as it is */
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
    assert_int_equal(rollup_decode(row, len, N + 1, 64, 0, N, out), -1); /* another shape */
    assert_int_equal(rollup_decode(row, len, N, 64, 0, N + 1, out), -1); /* cells out of range */
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
    case 2:
        return h % 23 == 0 ? NAN : h % 29 == 0 ? INFINITY : h % 31 == 0 ? -INFINITY : 0.5f + (float)(h % 1000) / 700;
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
        int64_t lo = (int64_t)cJSON_GetArrayItem(step, b)->valuedouble,
                hi = (int64_t)cJSON_GetArrayItem(end, b)->valuedouble;
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
    strbuf_printf(out, "\"min\":[%s],\"max\":[%s],\"mean\":[%s],\"count\":[%s],\"nonfinite\":[%s]", mn.p ? mn.p : "",
                  mx.p ? mx.p : "", mean.p ? mean.p : "", count.p ? count.p : "", nonfinite.p ? nonfinite.p : "");
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
    {0, 0, 0, 0, 1000},      {0, 0, 0, 0, 37},           {0, 0, 0, 0, 1},           {1, 1, 12345, 400000, 100},
    {1, 1, 100, 5000, 1000}, {1, 1, 19990, 20100, 1000}, {1, 1, 262144, 524287, 3}, {1, 0, 70000, 0, 64},
};
#define NWINDOWS (sizeof windows / sizeof *windows)

/* The answer of query_series to window w, split and cell selection as
 * given; a malloc'ed string. */
static char *series(struct query *q, int64_t run, const struct window *w, int split, int64_t layer, int64_t head) {
    struct query_series_req req = {.run_id = run,
                                   .metric = "ent",
                                   .layer = layer,
                                   .head = head,
                                   .has_from = w->has_from,
                                   .has_to = w->has_to,
                                   .from = w->from,
                                   .to = w->to,
                                   .points = w->points,
                                   .split = split};
    struct strbuf sb = {0};
    char err[256];
    if (query_series(q, &req, &sb, NULL, err, sizeof err) != QUERY_OK) fail_msg("series: %s", err);
    assert_false(sb.failed);
    return sb.p;
}

/* Rewrites every rollup row of the database in the raw format, and empties
 * every total's row (a metric of several chunks), so that a series pools
 * the cells of every block. The rows lose their checksums (crc NULL), as
 * raw rows were written before migration 11. */
static void rows_to_raw(const char *path) {
    sqlite3 *db;
    sqlite3_stmt *s, *u;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT r.metric_id, level, block, chunk, nframes, data, m.kind FROM rollups r "
                                        "JOIN metrics m ON m.id = r.metric_id",
                                        -1, &s, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(
                         db,
                         "UPDATE rollups SET data = ?5, crc = NULL WHERE metric_id = ?1 AND level = ?2 AND block = ?3 "
                         "AND chunk = ?4",
                         -1, &u, NULL),
                     SQLITE_OK);
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
        assert_int_equal(sqlite3_exec(db, "UPDATE rollup_totals SET data = x'', crc = NULL", NULL, NULL, NULL),
                         SQLITE_OK);
    }
    assert_true(coded > 0);
    assert_true(totals > 0); /* the series took both paths */
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

/* ------------------------------------------------------------ series over any step numbering */

/* A property test: runs over step sets a trainer may send (one step every
 * 1,000; {1, 10^6}; gaps up to 2^53; dense clusters far apart; rollbacks
 * and repeated steps), each series of many windows, `points`, cell
 * selections and splits compared, bucket by bucket, with a brute force
 * over the values sent. The values are multiples of 1/8 below 2^10 (or
 * NaN): every sum of them is exact in a double, whatever the order, so
 * the mean is compared as exactly as min, max and the counts. */

#define AS_MAX_STEPS 1600
#define AS_TOP (INT64_C(1) << 53) /* the protocol's largest step */

/* What the cases went through, so that the test keeps testing it: steps
 * sent again (rollbacks), and steps past 2^32 (their blocks stay raw
 * frames, fblock_rows.h). */
static int64_t as_rollbacks, as_beyond32;

/* The values the run holds: after a rollback to S, no step >= S of before. */
struct as_run {
    uint32_t L, H, n; /* the head metric "ent" is L x H = n */
    int64_t nsteps;
    int64_t step[AS_MAX_STEPS];
    float loss[AS_MAX_STEPS];
    float *ent; /* n values per step */
};

/* Cell value from a hash of h: a multiple of 1/8 in (-2^10, 2^10), or NaN
 * one time in 16. */
static float as_value(uint64_t h) {
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15u;
    h ^= h >> 29;
    if (h % 16 == 0) return NAN;
    return (float)((int64_t)(h >> 8) % 8192 - 4096) / 8;
}

/* Sends step s (seq `seq`) to the store and to the reference. */
static void as_send(struct tmp_db *f, int64_t run, struct as_run *r, int64_t seq, int64_t s) {
    as_rollbacks += r->nsteps && r->step[r->nsteps - 1] >= s;
    as_beyond32 += s >> 32 != 0;
    while (r->nsteps && r->step[r->nsteps - 1] >= s) r->nsteps--; /* the rollback, in the reference */
    assert_true(r->nsteps < AS_MAX_STEPS);
    int64_t k = r->nsteps++;
    r->step[k] = s;
    r->loss[k] = as_value((uint64_t)seq * 7919u);
    float *v = r->ent + (size_t)k * r->n;
    for (uint32_t i = 0; i < r->n; i++) v[i] = as_value((uint64_t)seq * 1000003u + i + 1);
    struct proto_msg m;
    memset(&m, 0, sizeof m);
    m.type = PROTO_STEP;
    m.step = s;
    msg_add(&m, "loss", PROTO_SCALAR, 1, 1, &r->loss[k]);
    msg_add(&m, "ent", PROTO_HEAD, r->L, r->H, v);
    if (store_step(f->st, run, seq, &m, 1e9 + (double)seq, NULL, 0))
        fail_msg("store_step %lld: %s", (long long)s, store_errmsg(f->st));
    proto_msg_free(&m);
}

/* A gap of 1 to 2^bits, log-uniform. */
static int64_t as_gap(int bits) {
    int b = (int)(rnd() % (uint64_t)(bits + 1));
    return 1 + (int64_t)(rnd() % (UINT64_C(1) << b));
}

/* The step set of case c (the bar's first, then random ones): at most
 * AS_MAX_STEPS steps into out, their number returned. Steps need not grow:
 * one at or below the last is a rollback. */
static int64_t as_steps(int c, int64_t *out) {
    int64_t n = 0, s = 0;
    switch (c) {
    case 0:
        for (; n < 1000; n++) out[n] = n * 1000;
        return n; /* a step logged every 1,000 */
    case 1: out[0] = 1, out[1] = 1000000; return 2;
    case 2: out[0] = 1, out[1] = 262208; return 2; /* 262208 = 4 level-5 blocks + 64 */
    case 3: out[0] = 0, out[1] = AS_TOP - 1, out[2] = AS_TOP; return 3;
    case 4: /* one step a level-5 block, the last one at a block's end (no level has rolled it up yet) */
        for (; n < 300; n++) out[n] = 5 + n * 262144;
        out[n++] = 300 * INT64_C(262144) - 1;
        return n;
    default: break;
    }
    int mode = c % 3, bits = 8 + (int)(rnd() % 38); /* gaps up to 2^8 .. 2^45 */
    int64_t want = 2 + (int64_t)(rnd() % (AS_MAX_STEPS / 2));
    s = (int64_t)(rnd() % 1000);
    while (n < want) {
        if (mode == 1 && rnd() % 3) s += 1 + (int64_t)(rnd() % 3); /* clusters of close steps, far apart */
        else s += as_gap(bits);
        if (mode == 2 && n > 2 && rnd() % 16 == 0) s = out[rnd() % (uint64_t)n]; /* a rollback, or a step again */
        if (s > AS_TOP) break;
        out[n++] = s;
    }
    /* half the sets end at the last step of a block of some level: that
     * block is complete, yet not rolled up until a step past it comes */
    int64_t size = ROLLUP_LEVEL_SIZE(1 + (int)(rnd() % ROLLUP_LEVELS)), end = (s / size + 1) * size - 1;
    if (rnd() % 2 && n < AS_MAX_STEPS / 2 + 2 && end <= AS_TOP) out[n++] = end;
    return n;
}

/* The pool of one bucket of the reference: cells [c0, c1) of the head
 * metric (or the loss, c0 = c1 = 0) at steps [lo, hi]. */
struct as_pool {
    float mn, mx;
    double sum;
    int64_t count, nonfinite, frames;
};

static struct as_pool as_pool(const struct as_run *r, int scalar, uint32_t c0, uint32_t c1, int64_t lo, int64_t hi) {
    struct as_pool p = {0};
    /* the first step >= lo: the steps ascend */
    int64_t a = 0, b = r->nsteps;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (r->step[m] < lo) a = m + 1;
        else b = m;
    }
    for (int64_t k = a; k < r->nsteps && r->step[k] <= hi; k++) {
        p.frames++;
        for (uint32_t i = scalar ? 0 : c0; i < (scalar ? 1 : c1); i++) {
            float v = scalar ? r->loss[k] : r->ent[(size_t)k * r->n + i];
            if (!isfinite(v)) {
                p.nonfinite++;
                continue;
            }
            if (!p.count || v < p.mn) p.mn = v;
            if (!p.count || v > p.mx) p.mx = v;
            p.sum += v;
            p.count++;
        }
    }
    return p;
}

/* The double query_series prints for a mean (12 digits), read back. */
static double as_printed(double x) {
    struct strbuf b = {0};
    strbuf_f64(&b, x);
    double v = strtod(b.p, NULL);
    free(b.p);
    return v;
}

/* Fails unless stat `what` of the answer's series o at bucket b is p's. */
static void as_check_stat(const cJSON *o, int b, const struct as_pool *p, const char *what, const char *ctx) {
    const cJSON *a = cJSON_GetObjectItem(o, what), *x = a ? cJSON_GetArrayItem(a, b) : NULL;
    if (!x) fail_msg("%s: no %s[%d]", ctx, what, b);
    int null = cJSON_IsNull(x);
    double got = x->valuedouble, want;
    if (!strcmp(what, "count") || !strcmp(what, "nonfinite")) {
        want = (double)(what[0] == 'c' ? p->count : p->nonfinite);
        if (null || got != want) fail_msg("%s: %s[%d] %g, want %g", ctx, what, b, got, want);
        return;
    }
    if (!p->count) {
        if (!null) fail_msg("%s: %s[%d] %g, want null (no finite value)", ctx, what, b, got);
        return;
    }
    if (what[1] == 'e') want = as_printed(p->sum / (double)p->count);
    else want = what[1] == 'i' ? p->mn : p->mx;
    if (null || (what[1] == 'e' ? got != want : (float)got != (float)want))
        fail_msg("%s: %s[%d] %.17g, want %.17g", ctx, what, b, got, want);
}

struct as_req {
    int64_t from, to, points; /* from > to: the whole run */
    int scalar, split, agg;
    int64_t layer, head;
};

/* Asks query_series for rq and checks every bucket and series of the
 * answer against the reference. */
static void as_check(struct query *q, int64_t run, const struct as_run *r, const struct as_req *rq, const char *name) {
    int whole = rq->from > rq->to;
    struct query_series_req req = {.run_id = run,
                                   .metric = rq->scalar ? "loss" : "ent",
                                   .layer = rq->layer,
                                   .head = rq->head,
                                   .has_from = !whole,
                                   .has_to = !whole,
                                   .from = rq->from,
                                   .to = rq->to,
                                   .points = rq->points,
                                   .agg = rq->agg,
                                   .split = rq->split};
    char ctx[256], err[256];
    snprintf(ctx, sizeof ctx,
             "%s (%lld steps %lld..%lld) %s from %lld to %lld points %lld layer %lld head %lld split %d", name,
             (long long)r->nsteps, (long long)r->step[0], (long long)r->step[r->nsteps - 1], req.metric,
             whole ? -1LL : (long long)rq->from, whole ? -1LL : (long long)rq->to, (long long)rq->points,
             (long long)rq->layer, (long long)rq->head, rq->split);
    struct strbuf sb = {0};
    if (query_series(q, &req, &sb, NULL, err, sizeof err) != QUERY_OK) fail_msg("%s: %s", ctx, err);
    assert_false(sb.failed);
    cJSON *j = cJSON_Parse(sb.p);
    assert_non_null(j);
    const cJSON *st = cJSON_GetObjectItem(j, "step"), *en = cJSON_GetObjectItem(j, "end");
    int64_t first = r->step[0], last = r->step[r->nsteps - 1];
    int64_t lo = whole || rq->from < first ? first : rq->from, hi = whole || rq->to > last ? last : rq->to;
    int nb = cJSON_GetArraySize(st);
    int64_t width = (int64_t)cJSON_GetObjectItem(j, "width")->valuedouble, seen = 0, prev = lo - 1;
    if (nb > rq->points || nb != cJSON_GetArraySize(en)) fail_msg("%s: %d buckets", ctx, nb);
    /* the groups of cells: one (every selected cell), or one per layer or head */
    uint32_t L = rq->scalar ? 1 : r->L, H = rq->scalar ? 1 : r->H;
    uint32_t l0 = rq->layer >= 0 ? (uint32_t)rq->layer : 0, l1 = rq->layer >= 0 ? l0 + 1 : L;
    uint32_t h0 = rq->head >= 0 ? (uint32_t)rq->head : 0, h1 = rq->head >= 0 ? h0 + 1 : H;
    const cJSON *list = cJSON_GetObjectItem(j, "series");
    uint32_t ng = rq->split == QUERY_SPLIT_HEAD ? (l1 - l0) * (h1 - h0) : rq->split == QUERY_SPLIT_LAYER ? l1 - l0 : 1;
    if (rq->split && (uint32_t)cJSON_GetArraySize(list) != ng)
        fail_msg("%s: %d series, want %u", ctx, cJSON_GetArraySize(list), ng);
    for (int b = 0; b < nb; b++) {
        int64_t s0 = (int64_t)cJSON_GetArrayItem(st, b)->valuedouble,
                s1 = (int64_t)cJSON_GetArrayItem(en, b)->valuedouble;
        if (s0 <= prev || s1 < s0 || s1 > hi || s1 - s0 >= width)
            fail_msg("%s: bucket %d is %lld..%lld", ctx, b, (long long)s0, (long long)s1);
        prev = s1;
        for (uint32_t g = 0; g < ng; g++) {
            const cJSON *o = rq->split ? cJSON_GetArrayItem(list, (int)g) : j;
            /* the cells of group g, pooled layer by layer (a head metric's
             * cells of one layer are contiguous) */
            struct as_pool p = {0};
            uint32_t gl0 =
                rq->split == QUERY_SPLIT_NONE ? l0 : l0 + (rq->split == QUERY_SPLIT_HEAD ? g / (h1 - h0) : g);
            uint32_t gl1 = rq->split == QUERY_SPLIT_NONE ? l1 : gl0 + 1;
            uint32_t gh0 = rq->split == QUERY_SPLIT_HEAD ? h0 + g % (h1 - h0) : h0;
            uint32_t gh1 = rq->split == QUERY_SPLIT_HEAD ? gh0 + 1 : h1;
            for (uint32_t l = gl0; l < gl1; l++) {
                struct as_pool x = as_pool(r, rq->scalar, l * r->H + gh0, l * r->H + gh1, s0, s1);
                if (x.count && (!p.count || x.mn < p.mn)) p.mn = x.mn;
                if (x.count && (!p.count || x.mx > p.mx)) p.mx = x.mx;
                p.sum += x.sum;
                p.count += x.count;
                p.nonfinite += x.nonfinite;
                p.frames = x.frames;
            }
            if (!p.frames)
                fail_msg("%s: bucket %d (%lld..%lld) listed without a frame", ctx, b, (long long)s0, (long long)s1);
            if (!g) seen += p.frames;
            char gctx[300];
            snprintf(gctx, sizeof gctx, "%s series %u bucket %lld..%lld", ctx, g, (long long)s0, (long long)s1);
            as_check_stat(o, b, &p, "min", gctx);
            as_check_stat(o, b, &p, "max", gctx);
            as_check_stat(o, b, &p, "mean", gctx);
            as_check_stat(o, b, &p, "count", gctx);
            as_check_stat(o, b, &p, "nonfinite", gctx);
            if (cJSON_GetObjectItem(o, "value"))
                as_check_stat(o, b, &p,
                              rq->agg == QUERY_AGG_MIN   ? "min"
                              : rq->agg == QUERY_AGG_MAX ? "max"
                                                         : "mean",
                              gctx);
        }
    }
    /* no frame of the range left out of the buckets */
    struct as_pool all = as_pool(r, 1, 0, 0, lo, hi);
    if (seen != all.frames)
        fail_msg("%s: the buckets hold %lld frames, the range %lld", ctx, (long long)seen, (long long)all.frames);
    cJSON_Delete(j);
    free(sb.p);
}

/* A step near the run's: one of them, or a random one around them. */
static int64_t as_near(const struct as_run *r) {
    int64_t s = r->step[rnd() % (uint64_t)r->nsteps];
    switch (rnd() % 4) {
    case 0: return s;
    case 1: return s > 0 ? s - 1 - (int64_t)(rnd() % (uint64_t)(s < 600 ? s : 600)) : 0;
    case 2: return s + (int64_t)(rnd() % 600) < AS_TOP ? s + (int64_t)(rnd() % 600) : AS_TOP;
    default: return r->step[0] + (int64_t)(unif() * (double)(r->step[r->nsteps - 1] - r->step[0]));
    }
}

static void test_series_any_step_numbering(void **state) {
    (void)state;
    static int64_t steps[AS_MAX_STEPS];
    static struct as_run r;
    enum { CASES = 14 };
    static const int64_t whole_points[] = {1, 3, 64, 1000, 100000};
    rng = 0x5eed0001u;
    for (int c = 0; c < CASES; c++) {
        struct tmp_db f;
        assert_int_equal(tmp_db_open(&f, "/tmp/trollup-XXXXXX"), 0);
        r.L = c % 2 ? 12 : 4, r.H = c % 2 ? 12 : 5, r.n = r.L * r.H; /* three chunks and a total's row, or one */
        r.nsteps = 0;
        r.ent = malloc(sizeof(float) * AS_MAX_STEPS * r.n);
        assert_non_null(r.ent);
        struct store_run_info info;
        char name[16];
        snprintf(name, sizeof name, "case%d", c);
        assert_int_equal(store_begin(f.st), 0);
        assert_int_equal(store_run_open(f.st, name, r.L, r.H, 64, NULL, 1000.0, &info), 0);
        int64_t ns = as_steps(c, steps);
        for (int64_t k = 0; k < ns; k++) as_send(&f, info.id, &r, k + 1, steps[k]);
        assert_int_equal(store_commit(f.st), 0);

        char err[256];
        struct query_pool *p = query_pool_open(f.path, 1, err, sizeof err);
        if (!p) fail_msg("%s", err);
        struct query *q = query_acquire(p, err, sizeof err);
        assert_non_null(q);
        for (int w = 0; w < 5 + 8; w++) {
            struct as_req rq = {.from = 1, .to = 0, .layer = -1, .head = -1};
            if (w < 5) {
                rq.points = whole_points[w];
            } else {
                int64_t a = as_near(&r), b = as_near(&r);
                rq.from = a < b ? a : b, rq.to = a < b ? b : a;
                rq.points = 1 + (int64_t)(rnd() % (rnd() % 2 ? 40 : 3000));
            }
            uint32_t l = (uint32_t)(rnd() % r.L), h = (uint32_t)(rnd() % r.H);
            rq.agg = (int)(rnd() % 3);
            const struct as_req sel[] = {
                {.scalar = 1, .layer = -1, .head = -1},                /* the loss */
                {.layer = -1, .head = -1},                             /* every value (the total's rows) */
                {.layer = l, .head = h},                               /* one head */
                {.layer = l, .head = -1, .split = QUERY_SPLIT_HEAD},   /* each head of a layer */
                {.layer = -1, .head = -1, .split = QUERY_SPLIT_LAYER}, /* each layer */
            };
            for (size_t k = 0; k < sizeof sel / sizeof *sel; k++) {
                struct as_req x = sel[k];
                x.from = rq.from, x.to = rq.to, x.points = rq.points, x.agg = rq.agg;
                if (x.split && x.points > 4096) x.points = 4096; /* QUERY_MAX_SERIES_BUCKETS */
                as_check(q, info.id, &r, &x, name);
            }
        }
        query_release(p, q);
        query_pool_close(p);
        free(r.ent);
        tmp_db_close(&f);
    }
    assert_true(as_rollbacks >= 10);
    assert_true(as_beyond32 >= 100);
}

/* The one rollup row a series must find: a chunk row of a block whose
 * total's row it read (empty: pool the cells). Steps 0..63 and 1000 of a
 * 12 x 12 metric: the whole series at points=1 reads level 2's block 0 by
 * its total's row. Emptied, the cells answer the same; without chunk 0's
 * row, the database is corrupt, named. */
static void test_series_missing_chunk_row_reported(void **state) {
    (void)state;
    static struct as_run r;
    struct tmp_db f;
    assert_int_equal(tmp_db_open(&f, "/tmp/trollup-XXXXXX"), 0);
    r.L = 12, r.H = 12, r.n = 144, r.nsteps = 0;
    r.ent = malloc(sizeof(float) * AS_MAX_STEPS * r.n);
    assert_non_null(r.ent);
    struct store_run_info info;
    assert_int_equal(store_begin(f.st), 0);
    assert_int_equal(store_run_open(f.st, "r", r.L, r.H, 64, NULL, 1000.0, &info), 0);
    for (int64_t s = 0; s < 64; s++) as_send(&f, info.id, &r, s + 1, s);
    as_send(&f, info.id, &r, 65, 1000);
    assert_int_equal(store_commit(f.st), 0);
    int64_t ent = qi(f.path, "SELECT id FROM metrics WHERE name = 'ent'");
    char sql[200], err[256];
    snprintf(sql, sizeof sql,
             "UPDATE rollup_totals SET data = x'', crc = NULL WHERE metric_id = %lld AND level = 2 AND block = 0",
             (long long)ent);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f.path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_changes(db), 1);
    struct query_pool *p = query_pool_open(f.path, 1, err, sizeof err);
    if (!p) fail_msg("%s", err);
    struct query *q = query_acquire(p, err, sizeof err);
    assert_non_null(q);
    struct as_req rq = {.from = 1, .to = 0, .points = 1, .layer = -1, .head = -1};
    as_check(q, info.id, &r, &rq, "emptied total");
    snprintf(sql, sizeof sql, "DELETE FROM rollups WHERE metric_id = %lld AND level = 2 AND block = 0 AND chunk = 0",
             (long long)ent);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_changes(db), 1);
    struct query_series_req req = {.run_id = info.id, .metric = "ent", .layer = -1, .head = -1, .points = 1};
    struct strbuf sb = {0};
    assert_int_equal(query_series(q, &req, &sb, NULL, err, sizeof err), QUERY_ERR);
    if (!strstr(err, "run 1, metric \"ent\": steps 0..511: the level-2 rollup of block 0 has a total's row but no row "
                     "of chunk 0"))
        fail_msg("%s", err);
    free(sb.p);
    sqlite3_close(db);
    query_release(p, q);
    query_pool_close(p);
    free(r.ent);
    tmp_db_close(&f);
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
        cmocka_unit_test(test_series_any_step_numbering),
        cmocka_unit_test(test_series_missing_chunk_row_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
