/* rollup.c: pooling values into rollup cells, and the coding of a row of
 * cells (rollup.h; the layout in schema/storage.md, "Rollups"). Not the
 * SQL: store.c writes the rows, query_series.c reads them.
 *
 * Why this coding. A row's cells are one block's summary of every value of
 * a frame (144 of a 12x12 head metric); its neighbours in time are
 * separate rows, read alone (a series starts anywhere), so a row is coded
 * on its own. Measured on a real sigmatrain stream the cells' mantissas
 * are noise from block to block (a delta from the previous block's cell
 * saved < 8%, zstd on byte planes of the fields less than bit-packing), so
 * what pays is removing what is not noise: the bits that every cell of the
 * row shares (frame of reference), the low zero bits of the f64 sum (an
 * exact sum of 64 float32 values has ~30 significant bits of its 53), the
 * count (almost always the frame count), and the sum's and the max's
 * closeness to count * min and to min. Each field is then packed at the
 * width of its widest cell: a reader of one cell reads its bits directly,
 * without decoding the row. */
#include "rollup.h"

#include <math.h>
#include <string.h>

/* header: byte offsets */
enum {
    H_FORMAT = 0,
    H_FLAGS = 1,
    H_W = 2,      /* 4 widths: min, max, sum, count */
    H_T = 6,      /* 3 shifts: min, max, sum */
    H_QE = 9,     /* i16: the fixed-point sum's exponent */
    H_REF = 11,   /* u32 min, u32 max, u64 sum references */
};
#define FLAG_MAX_ABS 1u   /* max coded alone, not as its distance from min */
#define FLAG_SUM_FIXED 2u /* sum as an integer times 2^qe, not by its float bits */
#define FLAG_EMPTY 4u     /* every cell of count 0 is (NaN, NaN, +0) and is not coded */
#define FLAG_ALL 7u

enum { F_MIN, F_MAX, F_SUM, F_CNT, F_COUNT };

static const struct rollup_cell empty_cell = {NAN, NAN, 0.0, 0};

void rollup_reset(struct rollup_cell *a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) a[i] = empty_cell;
}

void rollup_merge(struct rollup_cell *e, const struct rollup_cell *x) {
    if (!x->count) return;
    if (!e->count || x->mn < e->mn) e->mn = x->mn;
    if (!e->count || x->mx > e->mx) e->mx = x->mx;
    e->sum += x->sum;
    e->count += x->count;
}

void rollup_add(struct rollup_cell *e, float v) {
    if (!isfinite(v)) return;
    struct rollup_cell x = {v, v, v, 1};
    rollup_merge(e, &x);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t f64_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double f64_of(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* Float bits as unsigned integers in the floats' order (-inf lowest):
 * nearby floats of one sign are nearby integers. */
static uint32_t ord32(uint32_t u) { return u >> 31 ? ~u : u | 0x80000000u; }
static uint32_t unord32(uint32_t o) { return o >> 31 ? o & 0x7fffffffu : ~o; }
static uint64_t ord64(uint64_t u) { return u >> 63 ? ~u : u | (UINT64_C(1) << 63); }
static uint64_t unord64(uint64_t o) { return o >> 63 ? o & ~(UINT64_C(1) << 63) : ~o; }

static unsigned bit_width(uint64_t v) { return v ? 64u - (unsigned)__builtin_clzll(v) : 0u; }

/* The sum's prediction: count * min, exact in a double (a 24-bit
 * mantissa times a count below 2^32), 0 when there is no finite min. */
static double sum_pred(const struct rollup_cell *x) {
    return x->count && isfinite(x->mn) ? (double)x->count * (double)x->mn : 0.0;
}

/* The prediction in units of 2^qe, rounded down (0 when out of range). */
static int64_t fixed_pred(const struct rollup_cell *x, int qe) {
    double s = ldexp(sum_pred(x), -qe);
    return fabs(s) < 0x1p62 ? (int64_t)floor(s) : 0;
}

/* A finite double's bits as m * 2^e0 (m with its implicit bit). */
static void f64_parts(uint64_t u, uint64_t *m, int *e0) {
    unsigned e = (unsigned)(u >> 52) & 0x7ffu;
    *m = u & ((UINT64_C(1) << 52) - 1);
    if (e) {
        *m |= UINT64_C(1) << 52;
        *e0 = (int)e - 1075;
    } else {
        *e0 = -1074;
    }
}

/* The sum as an integer K with sum = K * 2^qe (the cell is eligible). */
static int64_t fixed_k(uint64_t u, int qe) {
    uint64_t m;
    int e0;
    f64_parts(u, &m, &e0);
    if (!m) return 0;
    int s = e0 - qe;
    int64_t k = (int64_t)(s >= 0 ? m << s : m >> -s);
    return u >> 63 ? -k : k;
}

/* The coder's state for one row. */
struct plan {
    const struct rollup_cell *a;
    uint32_t n, nframes;
    unsigned flags;
    int qe;
    uint64_t ref[F_COUNT];
    unsigned w[F_COUNT], t[F_COUNT];
};

/* Whether field f of cell i is left out of the coding (an empty cell's
 * min, max and sum: its count says it is empty). */
static int skipped(const struct plan *p, int f, uint32_t i) {
    return f != F_CNT && (p->flags & FLAG_EMPTY) && !p->a[i].count;
}

/* Field f of cell i as an unsigned integer (signed quantities offset by
 * half their range, so that the integers keep their order). */
static uint64_t field(const struct plan *p, int f, uint32_t i) {
    const struct rollup_cell *x = &p->a[i];
    switch (f) {
    case F_MIN: return ord32(f32_bits(x->mn));
    case F_MAX:
        if (p->flags & FLAG_MAX_ABS) return ord32(f32_bits(x->mx));
        return (uint32_t)(ord32(f32_bits(x->mx)) - ord32(f32_bits(x->mn))) ^ 0x80000000u;
    case F_SUM:
        if (p->flags & FLAG_SUM_FIXED)
            return (uint64_t)(fixed_k(f64_bits(x->sum), p->qe) - fixed_pred(x, p->qe)) ^ (UINT64_C(1) << 63);
        return (ord64(f64_bits(x->sum)) - ord64(f64_bits(sum_pred(x)))) ^ (UINT64_C(1) << 63);
    default: return (uint32_t)(p->nframes - x->count);
    }
}

/* Frame of reference of field f: the smallest value (0 for the count),
 * the zero low bits every difference from it shares, and the width of
 * the largest. */
static void plan_field(struct plan *p, int f) {
    uint64_t ref = f == F_CNT ? 0 : UINT64_MAX, any = 0, top = 0;
    for (uint32_t i = 0; f != F_CNT && i < p->n; i++)
        if (!skipped(p, f, i) && field(p, f, i) < ref) ref = field(p, f, i);
    int seen = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        if (skipped(p, f, i)) continue;
        uint64_t d = field(p, f, i) - ref;
        any |= d;
        if (d > top) top = d;
        seen = 1;
    }
    p->ref[f] = seen ? ref : 0;
    p->t[f] = any && f != F_CNT ? (unsigned)__builtin_ctzll(any) : 0;
    p->w[f] = bit_width(top >> p->t[f]);
}

/* Whether every sum is a finite double other than -0 whose bits fit an
 * integer times 2^qe below 2^62; sets p->qe. */
static int fixed_ok(struct plan *p) {
    int lo = INT32_MAX, hi = INT32_MIN;
    for (uint32_t i = 0; i < p->n; i++) {
        if (skipped(p, F_SUM, i)) continue;
        uint64_t u = f64_bits(p->a[i].sum), m;
        int e0;
        if (((u >> 52) & 0x7ffu) == 0x7ffu || u == UINT64_C(1) << 63) return 0;
        f64_parts(u, &m, &e0);
        if (!m) continue;
        int l = e0 + __builtin_ctzll(m), h = e0 + 63 - __builtin_clzll(m);
        if (l < lo) lo = l;
        if (h > hi) hi = h;
    }
    p->qe = lo == INT32_MAX ? 0 : lo;
    return hi == INT32_MIN || hi - p->qe < 62;
}

/* Chooses between the two codings of a field by their width. */
static void plan_choose(struct plan *p, int f, unsigned flag, int possible) {
    plan_field(p, f);
    if (!possible) return;
    struct plan alt = *p;
    alt.flags |= flag;
    plan_field(&alt, f);
    if (alt.w[f] < p->w[f]) *p = alt;
}

/* Bits written least significant first, 8 bytes at a time. */
struct bitw {
    unsigned char *out;
    uint64_t acc;
    unsigned n;
};

static void bitw_put(struct bitw *b, uint64_t v, unsigned w) {
    if (!w) return;
    b->acc |= v << b->n;
    if (b->n + w < 64) {
        b->n += w;
        return;
    }
    memcpy(b->out, &b->acc, 8); /* little-endian, as every blob of the store */
    b->out += 8;
    unsigned used = 64 - b->n;
    b->acc = used < 64 ? v >> used : 0;
    b->n = b->n + w - 64;
}

static void bitw_end(struct bitw *b) { memcpy(b->out, &b->acc, (b->n + 7) / 8); }

static size_t encode_raw(const struct rollup_cell *a, uint32_t n, unsigned char *out) {
    for (uint32_t i = 0; i < n; i++) {
        unsigned char *e = out + (size_t)i * ROLLUP_RAW_BYTES;
        memcpy(e, &a[i].mn, 4);
        memcpy(e + 4, &a[i].mx, 4);
        memcpy(e + 8, &a[i].sum, 8);
        memcpy(e + 16, &a[i].count, 4);
    }
    return (size_t)n * ROLLUP_RAW_BYTES;
}

size_t rollup_encode(const struct rollup_cell *a, uint32_t n, uint32_t nframes, unsigned char *out) {
    struct plan p = {.a = a, .n = n, .nframes = nframes};
    int empty = 0, canonical = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (a[i].count) continue;
        empty = 1;
        canonical &= f32_bits(a[i].mn) == f32_bits(NAN) && f32_bits(a[i].mx) == f32_bits(NAN) &&
                     f64_bits(a[i].sum) == 0;
    }
    if (empty && canonical) p.flags |= FLAG_EMPTY;
    plan_field(&p, F_MIN);
    plan_choose(&p, F_MAX, FLAG_MAX_ABS, 1);
    plan_choose(&p, F_SUM, FLAG_SUM_FIXED, fixed_ok(&p)); /* qe is written either way, read in fixed only */
    plan_field(&p, F_CNT);
    uint64_t bits = 0;
    for (int f = 0; f < F_COUNT; f++) bits += (uint64_t)n * p.w[f];
    uint64_t len = ROLLUP_HEAD_BYTES + (bits + 7) / 8;
    if (len >= (uint64_t)n * ROLLUP_RAW_BYTES) return encode_raw(a, n, out);

    out[H_FORMAT] = ROLLUP_FORMAT_CODED;
    out[H_FLAGS] = (unsigned char)p.flags;
    for (int f = 0; f < F_COUNT; f++) out[H_W + f] = (unsigned char)p.w[f];
    for (int f = 0; f < F_CNT; f++) out[H_T + f] = (unsigned char)p.t[f];
    int16_t qe = (int16_t)p.qe;
    memcpy(out + H_QE, &qe, 2);
    uint32_t r32 = (uint32_t)p.ref[F_MIN];
    memcpy(out + H_REF, &r32, 4);
    r32 = (uint32_t)p.ref[F_MAX];
    memcpy(out + H_REF + 4, &r32, 4);
    memcpy(out + H_REF + 8, &p.ref[F_SUM], 8);
    struct bitw b = {.out = out + ROLLUP_HEAD_BYTES};
    for (int f = 0; f < F_COUNT; f++)
        for (uint32_t i = 0; i < n; i++)
            bitw_put(&b, skipped(&p, f, i) ? 0 : (field(&p, f, i) - p.ref[f]) >> p.t[f], p.w[f]);
    bitw_end(&b);
    return (size_t)len;
}

/* w (<= 64) bits at bit offset off of the len bytes at d, which hold them. */
static uint64_t bits_get(const unsigned char *d, size_t len, uint64_t off, unsigned w) {
    if (!w) return 0;
    size_t at = (size_t)(off >> 3);
    unsigned sh = (unsigned)(off & 7);
    uint64_t lo = 0;
    memcpy(&lo, d + at, at + 8 <= len ? 8 : len - at);
    uint64_t v = lo >> sh;
    if (sh + w > 64) v |= (uint64_t)d[at + 8] << (64 - sh);
    return w == 64 ? v : v & ((UINT64_C(1) << w) - 1);
}

static int decode_raw(const unsigned char *row, uint32_t nframes, uint32_t c0, uint32_t c1, struct rollup_cell *out) {
    for (uint32_t i = c0; i < c1; i++) {
        const unsigned char *e = row + (size_t)i * ROLLUP_RAW_BYTES;
        memcpy(&out[i].mn, e, 4);
        memcpy(&out[i].mx, e + 4, 4);
        memcpy(&out[i].sum, e + 8, 8);
        memcpy(&out[i].count, e + 16, 4);
        if (out[i].count > nframes) return -1;
    }
    return 0;
}

int rollup_decode(const unsigned char *row, size_t len, uint32_t n, uint32_t nframes, uint32_t c0, uint32_t c1,
                  struct rollup_cell *out) {
    if (c0 > c1 || c1 > n) return -1;
    if (len == (size_t)n * ROLLUP_RAW_BYTES) return decode_raw(row, nframes, c0, c1, out);
    if (len < ROLLUP_HEAD_BYTES || row[H_FORMAT] != ROLLUP_FORMAT_CODED || (row[H_FLAGS] & ~FLAG_ALL)) return -1;
    struct plan p = {.n = n, .nframes = nframes, .flags = row[H_FLAGS]};
    uint64_t bits = 0, base[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        p.w[f] = row[H_W + f];
        p.t[f] = f < F_CNT ? row[H_T + f] : 0;
        if (p.t[f] > 63 || p.w[f] + p.t[f] > (f == F_SUM ? 64u : 32u)) return -1;
        base[f] = bits;
        bits += (uint64_t)n * p.w[f];
    }
    if (len != ROLLUP_HEAD_BYTES + (bits + 7) / 8) return -1;
    int16_t qe;
    uint32_t r32;
    memcpy(&qe, row + H_QE, 2);
    p.qe = qe;
    memcpy(&r32, row + H_REF, 4);
    p.ref[F_MIN] = r32;
    memcpy(&r32, row + H_REF + 4, 4);
    p.ref[F_MAX] = r32;
    memcpy(&p.ref[F_SUM], row + H_REF + 8, 8);
    const unsigned char *d = row + ROLLUP_HEAD_BYTES;
    size_t dlen = len - ROLLUP_HEAD_BYTES;
#define GET(f, i) (p.ref[f] + (bits_get(d, dlen, base[f] + (uint64_t)(i) * p.w[f], p.w[f]) << p.t[f]))
    for (uint32_t i = c0; i < c1; i++) {
        struct rollup_cell *x = &out[i];
        x->count = nframes - (uint32_t)GET(F_CNT, i);
        if (x->count > nframes) return -1;
        if ((p.flags & FLAG_EMPTY) && !x->count) {
            *x = empty_cell;
            continue;
        }
        uint32_t omn = (uint32_t)GET(F_MIN, i), mx = (uint32_t)GET(F_MAX, i);
        x->mn = f32_of(unord32(omn));
        x->mx = f32_of(unord32(p.flags & FLAG_MAX_ABS ? mx : omn + (mx ^ 0x80000000u)));
        uint64_t s = GET(F_SUM, i) ^ (UINT64_C(1) << 63);
        if (p.flags & FLAG_SUM_FIXED) x->sum = ldexp((double)((int64_t)s + fixed_pred(x, p.qe)), p.qe);
        else x->sum = f64_of(unord64(s + ord64(f64_bits(sum_pred(x)))));
    }
#undef GET
    return 0;
}
